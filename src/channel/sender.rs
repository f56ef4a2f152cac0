//! [`IpcSender`]: the producing side of a GPU channel, and [`SendSlot`], one slot being filled.

use super::*;

/// The producing side of a GPU channel: owns the slots' memory, the `sent` and `released`
/// counters and the channel's region. Created with [`new`](Self::new); the consumer opens
/// [`handle`](Self::handle) with [`IpcReceiver::open`].
///
/// # How it works
///
/// The producer creates the channel: one device allocation of `slots × capacity` elements of `T`
/// (each slot 256-byte aligned where `T` allows), two [`IpcSignal`](crate::IpcSignal) counters on
/// its device (`sent`, written by the producer's streams; `released`, written by the consumer's),
/// and a small shared-memory region for what the hosts need (item lengths, how far each side got,
/// who the parties are). The consumer opens all of it through one [`IpcChannelHandle<T>`].
///
/// For item `k` (numbered from 1, in slot `(k − 1) mod slots`):
///
/// | producer | consumer |
/// | -------- | -------- |
/// | [`acquire`](IpcSender::acquire): wait on the host until the consumer has *enqueued* its release of item `k − slots`; enqueue "wait until `released ≥ k − slots`" on the stream | |
/// | write the slot with kernels or copies on that stream | |
/// | [`send`](SendSlot::send)`(len)`: enqueue "`sent = k`", publish `k` and `len` | [`recv`](IpcReceiver::recv): wait on the host until `k` is published; enqueue "wait until `sent ≥ k`" |
/// | | read the slot on that stream |
/// | | [`release`](Received::release): enqueue "`released = k`", publish it |
///
/// The hosts only ever wait for each other's *enqueueing*, which runs ahead of the GPUs; the
/// GPUs wait for each other's work. A full ring is back-pressure: `acquire` waits (or
/// [`try_acquire`](IpcSender::try_acquire) says so). The protocol, with each point where a
/// side can be killed and what the other then sees, is written down in the source, in
/// `src/channel/ring.rs`.
///
/// # Streams
///
/// Each item may go through a different stream, on either side. The counters still only grow
/// on the GPU in item order: a signal on a stream other than the previous signal's is
/// preceded (in the same `cuStreamBatchMemOp`) by a GPU wait for the previous value, so an
/// item sent on a fast stream never lets the consumer past an earlier item still being
/// written on a slow one, and a release on a fast stream never frees a slot still being read
/// on a slow one. Signals on the stream of the previous signal need no wait (streams are
/// compared by `cuStreamGetId`, which a new stream never shares with a destroyed one).
///
/// # Batches
///
/// Each item costs one GPU wait and one GPU write on each side; between small copies on a
/// stream, each of those costs the copy engine a drain and a restart (~5 µs on an H200), so
/// 1 MiB items stream at under half the native copy rate one at a time.
/// [`acquire_batch`](IpcSender::acquire_batch) → [`SendBatch`] and
/// [`recv_batch`](IpcReceiver::recv_batch) → [`ReceivedBatch`] take several consecutive slots
/// on one stream with one wait and hand them on with one write (the counters mean "items up to
/// k"): in groups of 8, 1 MiB items stream at 0.86 of a native peer copy across two H200s and
/// 0.76–0.84 of a native copy on one. The ring still moves one item at a time, so batches and
/// single items mix freely on either side. The price: a batch's GPU work starts once *every*
/// item of it is ready.
///
/// # When a side dies or closes
///
/// Every host wait has a deadline and checks the other side every 10 ms: a dead producer is
/// [`Error::PeerGone`] (the exporter), a dead consumer [`Error::PeerGone`] (an importer), a dropped
/// one [`Error::ChannelClosed`] (after the consumer received everything sent). Dropping either side
/// first waits (bounded, 5 s) for the channel's operations on the user's streams to complete —
/// releasing them with [`IpcSignal::signal_host`](crate::GpuSignal::signal_host) if the other side
/// is dead, so nothing stays blocked — and only then unmaps or frees the memory; if they do not
/// complete it leaks the memory rather than free it under pending GPU work. The consumer unlinks
/// the shared-memory name as soon as it attaches, and both sides' leases are reclaimed as for any
/// [`IpcBuffer`](crate::IpcBuffer) (dropping the sender while the consumer still maps the memory
/// defers its free until the consumer unmaps, as for an `IpcBuffer`), so nothing is left in
/// `/dev/shm` after either side is `SIGKILL`ed once the consumer has attached. A producer killed
/// before that — or a broadcast producer, whose region keeps its name for later consumers — leaves
/// its region until the next process that creates a channel removes the regions of dead producers
/// (once, before its first), or [`reclaim_stale`](crate::shm::reclaim_stale) does.
///
/// # Kill points
///
/// Producer, item `k`: (P1) wait until the slot is free; (P2) enqueue the GPU wait for the
/// consumer's release of `k − slots`; (P3) the user's writes; (P4) enqueue the GPU signal
/// `sent = k`; (P5) store the length; (P6) publish `sent = k`.
/// - Killed before P6: the consumer never sees item `k`. Its wait checks the producer every
///   10 ms and reports [`Error::PeerGone`] (the exporter).
/// - Killed after P6, before its GPU ran P3–P4: the consumer may receive item `k` and enqueue its
///   GPU wait, which then never passes; its next call reports `PeerGone` (exporter), and dropping
///   the receiver releases its streams (work on that item sees undefined contents).
/// - Closed (dropped): the owner word goes `Held → Left` after the last publish; a consumer
///   that finds `Left` re-reads `sent` and receives every item published before reporting
///   [`Error::ChannelClosed`].
///
/// Consumer, item `k`: (C1) wait until `sent ≥ k`; (C2) read and check the length; (C3)
/// enqueue the GPU wait `sent ≥ k`; (C4) the user's reads; (C5) enqueue the GPU signal
/// `released = k`; (C6) publish `released = k`.
/// - Killed mid-attach (`Claiming`), or before C6: the producer, waiting for the slot, checks
///   the consumer every 10 ms and reports [`Error::PeerGone`] (an importer).
/// - Killed after C6, before its GPU ran C5: the producer's GPU wait for that release never passes;
///   its next wait reports `PeerGone` (importer), and dropping the sender releases its streams.
/// - Closed: once its GPU operations have completed (bounded by the drop timeout; after a
///   drop, seen by a later collect or at exit), `Held → Left`; the producer's next acquire
///   reports `ChannelClosed`.
///
/// `IpcSender<T>` is `Send`, not `Sync`: one thread at a time drives it (move it between
/// threads; to share it, put it behind a lock).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::channel::{IpcChannelHandle, IpcSender};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = GpuContext::new(0)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// // 4 slots of up to 1 Mi floats each.
/// let mut tx = IpcSender::<f32>::new(&ctx, 4, 1 << 20)?;
/// let handle: IpcChannelHandle<f32> = tx.handle(); // give it to the consumer
/// for _ in 0..100 {
///     let slot = tx.acquire(&stream, Duration::from_secs(5))?;
///     // ... enqueue kernels on `stream` that write slot.as_raw_ptr() ...
///     slot.send(1 << 20)?; // ordered after those kernels, on the GPU
/// }
/// # let _ = handle;
/// # Ok(()) }
/// ```
#[doc(alias = "IpcChannel")]
pub struct IpcSender<T: Pod> {
    pub(super) end: Endpoint<T>,
    /// The next item to send (from 1).
    pub(super) next: u64,
    pub(super) handle: IpcChannelHandle<T>,
}

/// A slot the producer holds, between [`IpcSender::acquire`] and [`send`](Self::send).
/// Dropping it without sending keeps the slot: the next `acquire` returns it again.
pub struct SendSlot<'a, T: Pod> {
    pub(super) tx: &'a mut IpcSender<T>,
    pub(super) stream: sys::CUstream,
    /// A GPU wait was enqueued on `stream` and not yet covered by a recorded event.
    pub(super) waited: bool,
    pub(super) _stream: PhantomData<&'a ()>,
}

impl<T: Pod> IpcSender<T> {
    /// Create a channel of `slots` slots (1 to 64) of `capacity` elements of `T` each, in `ctx`:
    /// the slots' memory (`cuMemAlloc`), the two counters
    /// ([`IpcSignal::new`](crate::IpcSignal::new)) and the shared-memory region, all exported for
    /// [`handle`](Self::handle).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or more than 64 slots, a zero capacity or a size that
    /// overflows; [`Error::Unsupported`] when the device cannot use 64-bit stream memory
    /// operations; [`Error::Cuda`] naming the failing allocation or export; a shared-memory
    /// error creating the region.
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn new(ctx: &GpuContext, slots: usize, capacity: usize) -> Result<Self> {
        Self::with_consumers("IpcSender::new", ctx, slots, capacity, CONSUMERS as usize)
    }

    /// A broadcast channel: every item reaches every consumer attached when it is sent, up to
    /// `consumers` of them at a time (2 to 8). Consumers attach with [`IpcReceiver::open`] at
    /// any time and start at the next item; a slot is written again only once every attached
    /// consumer released it; a consumer that closes is no longer waited for, and one that dies
    /// is detached by the producer's next wait that it holds up (its release counter forced, so
    /// that the producer's streams go on). With nobody attached, items are sent for nobody.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::InvalidArgument`] for fewer than 2 or more than 8
    /// consumers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::GpuContext;
    /// use cuda_ipc::channel::IpcSender;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let tx = IpcSender::<f32>::broadcast(&ctx, 4, 1 << 20, 3)?; // up to 3 consumers
    /// let handle = tx.handle(); // every consumer opens the same handle
    /// # let _ = handle;
    /// # Ok(()) }
    /// ```
    pub fn broadcast(
        ctx: &GpuContext,
        slots: usize,
        capacity: usize,
        consumers: usize,
    ) -> Result<Self> {
        let call = "IpcSender::broadcast";
        ArgumentDefect::check_range(
            call,
            "consumers",
            consumers as u64,
            2,
            ring::CONSUMER_ENTRIES as u64,
        )?;
        Self::with_consumers(call, ctx, slots, capacity, consumers)
    }

    fn with_consumers(
        call: &'static str,
        ctx: &GpuContext,
        slots: usize,
        capacity: usize,
        consumers: usize,
    ) -> Result<Self> {
        let invalid = |defect| Error::InvalidArgument { call, defect };
        ArgumentDefect::check_range(call, "slots", slots as u64, 1, MAX_SLOTS as u64)?;
        let geometry = Geometry {
            slots: slots as u64,
            capacity: capacity as u64,
            consumers: consumers as u64,
        };
        let size = std::mem::size_of::<T>() as u64;
        let too_big = || {
            invalid(ArgumentDefect::AllocationSize {
                len: geometry.slots.saturating_mul(geometry.capacity),
                elem_size: size,
            })
        };
        let stride = layout(geometry, size).ok_or_else(too_big)?;
        let total = usize::try_from(stride * geometry.slots).map_err(|_| too_big())?;
        let data = Side::Owner(crate::IpcBuffer::<T>::new(ctx, total)?);
        let sent = GpuSignal::new(ctx)?;
        let released = (0..consumers)
            .map(|_| GpuSignal::new(ctx))
            .collect::<Result<Vec<_>>>()?;
        let (data_env, sent_env) = (
            data.export_handle::<crate::IpcBuffer<T>>(
                call,
                Some(crate::ledger::ExportKind::Channel),
            )?
            .env,
            sent.handle()?.env,
        );
        let released_envs = released
            .iter()
            .map(|r| r.handle().map(|h| h.env))
            .collect::<Result<Vec<_>>>()?;
        let me = ProcessIdentity::current();
        let (ring, held) =
            RingState::create::<T>(geometry, stride, &me, (data_env, sent_env, &released_envs))?;
        let env = ChannelEnvelope::describe::<T>(geometry, stride, &me, ring.name())?;
        Ok(Self {
            end: Endpoint::new(
                Role::Producer,
                ring,
                geometry,
                stride,
                held,
                0,
                (data, sent, released),
            ),
            next: 1,
            handle: IpcChannelHandle {
                env,
                _elem: PhantomData,
            },
        })
    }

    fn ring(&self) -> Ring<'_> {
        self.end.ring()
    }

    /// The handle a consumer opens with [`IpcReceiver::open`].
    pub fn handle(&self) -> IpcChannelHandle<T> {
        self.handle
    }

    /// Wait on the host (at most `timeout`) until the slot for the next item is free on the
    /// host side — the consumer has *enqueued* its release of the item that used it last —
    /// then enqueue on `stream` a wait for that release on the GPU, so work enqueued next on
    /// `stream` starts only after the consumer's GPU work on the slot is done.
    ///
    /// Write the slot with work on `stream` (or on streams `stream` waits for), then
    /// [`send`](SendSlot::send). The stream must belong to the channel's context.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the ring stays full; [`Error::ChannelClosed`] when the consumer
    /// dropped its receiver; [`Error::PeerGone`] (an importer) when it died; [`Error::Corrupt`]
    /// when the shared state is inconsistent; [`Error::Cuda`] naming `cuStreamWaitValue64`.
    #[doc(alias = "cuStreamWaitValue64")]
    pub fn acquire<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        timeout: Duration,
    ) -> Result<SendSlot<'a, T>> {
        self.end.check_open("IpcSender::acquire")?;
        self.acquire_host(self.next, timeout)?;
        self.take_slot(stream)
    }

    /// The host half of an acquire of item `k`: wait for the slot; in a broadcast channel,
    /// consumers found dead meanwhile are detached and their release counters forced.
    pub(crate) fn acquire_host(&mut self, k: u64, timeout: Duration) -> Result<()> {
        let mut detached = Vec::new();
        let got = self
            .ring()
            .acquire_detaching(k, wait_limit(timeout), |i| detached.push(i));
        self.end.force_detached(&detached);
        got
    }

    /// The consumers attached now (a one-consumer channel: its consumer, once attached).
    #[must_use]
    pub fn consumers(&self) -> Vec<ProcessIdentity> {
        self.ring()
            .attached()
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    }

    /// As [`acquire`](Self::acquire), without waiting: `Ok(None)` when the ring is full (a
    /// [`Listening`] sender is then armed: its descriptor turns readable
    /// when the consumer holding the slot releases, closes or dies).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), without [`Error::Timeout`].
    pub fn try_acquire<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<Option<SendSlot<'a, T>>> {
        self.end.check_open("IpcSender::try_acquire")?;
        if !self.try_acquire_host()? {
            return Ok(None);
        }
        self.take_slot(stream).map(Some)
    }

    /// The host half of a try-acquire of the next item: whether its slot is free (a listening
    /// sender armed if not); in a broadcast channel, dead consumers that hold it are detached
    /// and it is checked again.
    pub(super) fn try_acquire_host(&mut self) -> Result<bool> {
        if self.end.try_acquire_armed(self.next)? {
            return Ok(true);
        }
        if !self.end.geometry.is_broadcast() {
            return Ok(false);
        }
        // Full: a dead consumer may be what holds it (a poller never waits, so detach here).
        let mut detached = Vec::new();
        self.ring().reap_dead_consumers(|i| detached.push(i));
        self.end.force_detached(&detached);
        Ok(!detached.is_empty() && self.end.try_acquire_armed(self.next)?)
    }

    /// A slot or batch dropped unsent after its GPU wait for a release was enqueued on
    /// `stream`: the slots stay with the producer; record the wait, so that teardown waits for
    /// it (a failure marks the sender untracked, so its drop leaks rather than frees).
    pub(super) fn cover_unsent(&mut self, stream: sys::CUstream) {
        let _ = self.end.record(stream);
    }

    /// Send the `count` items from `next` on `stream` (each a length and a header): enqueue
    /// the GPU write of `sent`, publish the items, record the write; `next` moves past them
    /// once published. `waited` (the slot's or batch's GPU wait for a release, not yet covered
    /// by a record) is cleared once the write is enqueued: its record covers the wait.
    pub(super) fn publish_items<'h>(
        &mut self,
        stream: sys::CUstream,
        waited: &mut bool,
        count: u64,
        items: impl IntoIterator<Item = (u64, &'h [u8])> + Clone,
    ) -> Result<()> {
        let first = self.next;
        let last = first + count - 1;
        let written = self.end.signal(stream, last)?;
        *waited = false;
        let published = written.ring().publish_from(first, count, items);
        // Published: the items are the consumer's now. A tracking event that could not be
        // recorded made the sender untracked (its `close` reports it; its drop leaks the slots
        // rather than free them under GPU work); returning it here would tell the caller to
        // send again items already delivered.
        let _ = written.record();
        published?;
        self.next = last + 1;
        Ok(())
    }

    pub(super) fn take_slot<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<SendSlot<'a, T>> {
        let k = self.next;
        let slots = self.end.geometry.slots;
        let waited = k > slots;
        if waited {
            // SAFETY: the counter stays mapped until this wait has completed: a `record` on
            // this stream follows (at `send`, or when the slot is dropped), and the sender's
            // teardown (close, or a collect after its drop) waits for every recorded event before it
            // frees the counter.
            unsafe { self.end.wait_released(stream.as_cu_stream(), k - slots)? };
        }
        Ok(SendSlot {
            stream: stream.as_cu_stream(),
            tx: self,
            waited,
            _stream: PhantomData,
        })
    }

    /// Slots in the ring.
    pub fn slots(&self) -> usize {
        self.end.geometry.slots as usize
    }

    /// Elements of `T` one slot holds.
    pub fn capacity(&self) -> usize {
        self.end.geometry.capacity as usize
    }

    /// Items sent so far.
    pub fn sent(&self) -> u64 {
        self.next - 1
    }

    /// The context the channel lives in (streams must belong to it).
    pub fn context(&self) -> &GpuContext {
        self.end.data.context()
    }

    /// The consumer, once one has attached (a one-consumer channel; for a broadcast channel
    /// the first entry's, whoever holds it: see [`consumers`](Self::consumers)).
    pub fn consumer(&self) -> Option<ProcessIdentity> {
        let (owner, id) = self.end.region.get().consumer[0].owner.load_identity();
        (owner.state != crate::owned_slot::OwnerState::Free).then_some(id)
    }

    /// After a drop, how long the channel's GPU operations are waited for (by later collects)
    /// before the memory is leaked rather than freed under them (default 5 s). Dropping never
    /// waits: the sender is closed at once, and its memory freed once its GPU operations are
    /// done and the consumer unmapped it (at a later allocation or export of this process,
    /// [`collect_deferred`](crate::collect_deferred), or exit). [`close`](Self::close) takes
    /// its own timeout.
    pub fn set_drop_timeout(&mut self, timeout: Duration) {
        self.end.drain_timeout = timeout;
    }

    /// Close the channel: the consumer receives what was sent, then [`Error::ChannelClosed`].
    /// Waits up to `timeout` for the channel's GPU operations, then, in what is left of it,
    /// for every consumer to unmap the memory and counters, frees them, and reports what drop
    /// would hide. Nothing is freed or leaked while the wait goes on: a close that does not
    /// finish hands the sender back, closing (it sends nothing more), for another `close` or a
    /// drop (which never waits: see [`set_drop_timeout`](Self::set_drop_timeout)).
    ///
    /// # Errors
    ///
    /// In a [`CloseError`] holding the sender: [`Error::Timeout`] when the channel's GPU
    /// operations did not complete in time; [`Error::LeasesOutstanding`] when a consumer kept
    /// the memory or a counter mapped; [`Error::Cuda`] from the frees.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::GpuContext;
    /// use cuda_ipc::channel::IpcSender;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let tx = IpcSender::<f32>::new(&ctx, 4, 1024)?;
    /// // ... send items ...
    /// if let Err(e) = tx.close(Duration::from_secs(1)) {
    ///     eprintln!("{}; trying once more", e.error());
    ///     e.into_inner().close(Duration::from_secs(10))?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn close(self, timeout: Duration) -> std::result::Result<(), CloseError<Self>> {
        let mut tx = self;
        match tx.end.close_within(timeout) {
            Ok(()) => Ok(()), // what is left goes with the drop, at once
            Err(error) => Err(CloseError::new(error, tx)),
        }
    }
}

impl<T: Pod> std::fmt::Debug for IpcSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcSender")
            .field("type", &std::any::type_name::<T>())
            .field("slots", &self.end.geometry.slots)
            .field("capacity", &self.end.geometry.capacity)
            .field("sent", &self.sent())
            .finish_non_exhaustive()
    }
}

impl<T: Pod> SendSlot<'_, T> {
    /// The slot's device address (`capacity()` elements of `T`, aligned for `T`), for kernels
    /// and copies enqueued on the acquiring stream.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.tx.end.slot_ptr(self.tx.next)
    }

    /// Elements of `T` the slot can hold.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.tx.end.geometry.capacity as usize
    }

    /// The slot's index in the ring.
    #[must_use]
    pub fn index(&self) -> usize {
        self.tx.end.geometry.slot_of(self.tx.next)
    }

    /// The number of the item this slot will carry (items count from 1).
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.tx.next
    }

    /// Send the first `len` elements of the slot: enqueue "`sent` = this item" on the
    /// acquiring stream (`cuStreamWriteValue64`, after the stream's earlier work and a memory
    /// fence), then tell the consumer. Returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `len` exceeds the capacity (the slot is kept: send
    /// again); [`Error::Cuda`] naming `cuStreamWriteValue64`; [`Error::Corrupt`] when the
    /// shared state is inconsistent. An error means the item was not published (send again,
    /// or drop the slot); once published, `send` returns `Ok` — a tracking event that could
    /// not be recorded after that is reported by the sender's `close`.
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn send(self, len: usize) -> Result<()> {
        self.send_with_header(len, &[])
    }

    /// As [`send`](Self::send), with up to [`HEADER_BYTES`] bytes the consumer reads on the
    /// host ([`Received::header`]): what the item holds (a bucket's tensor names, shapes and
    /// offsets; a frame's sequence and format), so no second channel is needed. The bytes are
    /// copied into the channel's shared memory before the item is published, and copied out
    /// by the consumer when it receives it; the slot's GPU memory is not touched.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send); [`Error::InvalidArgument`] also when `header` is longer than
    /// [`HEADER_BYTES`] (checked first: nothing is enqueued, the slot is kept).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn main() -> cuda_ipc::Result<()> {
    /// # let ctx = cuda_ipc::GpuContext::new(0)?;
    /// # let stream = cuda_ipc::RawStream::LEGACY;
    /// let mut tx = cuda_ipc::channel::IpcSender::<u8>::new(&ctx, 4, 1 << 20)?;
    /// let slot = tx.acquire(&stream, Duration::from_secs(5))?;
    /// // ... enqueue the writes of 4,096 bytes at slot.as_raw_ptr() on `stream` ...
    /// slot.send_with_header(4096, b"frame 17, rgba8 32x32")?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn send_with_header(mut self, len: usize, header: &[u8]) -> Result<()> {
        self.tx.end.geometry.check_item_len("SendSlot::send", len)?;
        Geometry::check_header("SendSlot::send_with_header", header)?;
        self.tx
            .publish_items(self.stream, &mut self.waited, 1, [(len as u64, header)])
    }
}

impl<T: Pod> Drop for SendSlot<'_, T> {
    fn drop(&mut self) {
        if self.waited {
            self.tx.cover_unsent(self.stream);
        }
    }
}

impl<T: Pod> std::fmt::Debug for SendSlot<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendSlot")
            .field("seq", &self.seq())
            .field("index", &self.index())
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}
