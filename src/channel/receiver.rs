//! [`IpcReceiver`]: the consuming side of a GPU channel, and [`Received`], one item being read.

use super::*;
use crate::error::PeerRole;

/// The consuming side of a GPU channel, opened from the producer's [`IpcChannelHandle`].
///
/// `IpcReceiver<T>` is `Send`, not `Sync`: one thread at a time drives it (move it between
/// threads; to share it, put it behind a lock).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let handle: IpcChannelHandle<f32> = bytemuck::Zeroable::zeroed();
/// let ctx = GpuContext::new(1)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// let mut rx = IpcReceiver::<f32>::open(&ctx, &handle)?;
/// loop {
///     let item = match rx.recv(&stream, Duration::from_secs(5)) {
///         Ok(item) => item,
///         Err(cuda_ipc::Error::ChannelClosed { .. }) => break, // everything received
///         Err(e) => return Err(e.into()),
///     };
///     // ... enqueue kernels on `stream` that read item.len() floats at item.as_raw_ptr() ...
///     item.release()?; // the producer may reuse the slot once those kernels are done
/// }
/// # Ok(()) }
/// ```
pub struct IpcReceiver<T: Pod> {
    pub(super) end: Endpoint<T>,
    /// Items received so far (the next is `received + 1`).
    pub(super) received: u64,
}

/// An item the consumer holds, between [`IpcReceiver::recv`] and [`release`](Self::release).
/// Dropping it releases it on the receiving stream, as `release` does.
pub struct Received<'a, T: Pod> {
    pub(super) rx: &'a mut IpcReceiver<T>,
    pub(super) stream: sys::CUstream,
    pub(super) len: usize,
    pub(super) header: Vec<u8>,
    pub(super) done: bool,
    pub(super) _stream: PhantomData<&'a ()>,
}

impl<T: Pod> IpcReceiver<T> {
    /// Open a channel created by another process, in `ctx`, and attach as its consumer. The handle,
    /// the region and every GPU handle in it are validated; then the slots' memory and the counters
    /// are mapped (as [`ImportedBuffer::open`](crate::ImportedBuffer::open) and
    /// [`ImportedSignal::open`](crate::ImportedSignal::open): by peer access when the producer's
    /// device is another), and the region's name is unlinked. An open that finds the producer
    /// gone removes the region's name too (once its creator is found dead: nobody can attach
    /// to it any more), as the next process to create a channel would.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for a malformed handle; [`Error::TypeMismatch`] for another element
    /// type; [`Error::SameProcess`]; [`Error::PeerGone`] (the exporter) when the producer is gone;
    /// [`Error::NotFound`] when the region no longer exists (the producer closed, or a consumer
    /// attached and unlinked it); [`Error::Corrupt`] when the region does not match the handle;
    /// [`Error::ChannelInUse`] when another consumer attached first; the errors of
    /// [`ImportedBuffer::open`](crate::ImportedBuffer::open) and
    /// [`ImportedSignal::open`](crate::ImportedSignal::open).
    #[doc(alias = "cuIpcOpenMemHandle")]
    pub fn open(ctx: &GpuContext, handle: &IpcChannelHandle<T>) -> Result<Self> {
        Self::attach(ctx, handle).inspect_err(|e| {
            if matches!(
                e,
                Error::PeerGone {
                    role: PeerRole::Exporter,
                    ..
                }
            ) {
                handle.reclaim_region();
            }
        })
    }

    /// [`open`](Self::open) but for removing a dead producer's region.
    fn attach(ctx: &GpuContext, handle: &IpcChannelHandle<T>) -> Result<Self> {
        let Admission {
            geometry,
            stride,
            name,
            producer,
        } = handle.admit()?;
        let env = &handle.env;
        let (size, align, tag) = (env.elem_size, env.elem_align, env.type_tag);
        let me = ProcessIdentity::current();
        let ring = ShmOptions::new(name).open::<RingState>()?;
        let s = ring.get();
        if !ring.creator().is_same_process(&producer) {
            return Err(ring_mismatch("creator"));
        }
        s.check_layout(geometry, stride, (size, align, tag))?;
        let by_producer = |pid: u32, what: &'static str| {
            if pid == producer.pid() {
                Ok(())
            } else {
                Err(ring_mismatch(what))
            }
        };
        let data_env = s.data.load();
        by_producer(data_env.exporter_pid, "memory's exporter")?;
        let data = Side::Importer(ImportedBuffer::<T>::open_handle(
            ctx,
            &IpcMemHandle::<T>::from_envelope(data_env),
            None,
        )?);
        if data.len() as u64 != stride * geometry.slots {
            return Err(Error::LengthMismatch {
                expected: (stride * geometry.slots) as usize,
                found: data.len() as u64,
            });
        }
        let sent_env = s.sent_signal.load();
        by_producer(sent_env.exporter_pid, "send counter's exporter")?;
        let sent = GpuSignal::open(ctx, &IpcSignalHandle::from_envelope(sent_env))?;
        let open_counter = |index: usize| {
            let env = s.consumer[index].released_signal.load();
            by_producer(env.exporter_pid, "release counter's exporter")?;
            GpuSignal::open(ctx, &IpcSignalHandle::from_envelope(env))
        };
        let (entry, held, received, released) = if geometry.is_broadcast() {
            // Any free entry; its counter opened before the claim, set to where we start
            // while the entry still reads `Claiming` (see `Ring::attach_any_with`). The name
            // stays: other consumers attach later (the producer's drop removes it).
            let (attached, released) = Ring::of(&ring, geometry).attach_any_with(
                &me,
                open_counter,
                |counter, start| {
                    if start == 0 {
                        Ok(()) // a new counter reads 0 already
                    } else {
                        counter.signal_host(start)
                    }
                },
            )?;
            (attached.index, attached.held, attached.start, released)
        } else {
            let released = open_counter(0)?;
            let held = Ring::of(&ring, geometry).attach(&me, || {})?;
            // Attached: nobody else needs the name, and a name left behind would outlive a
            // kill.
            let _ = ring.unlink_shared();
            (0, held, 0, released)
        };
        Ok(Self {
            end: Endpoint::new(
                Role::Consumer,
                ring,
                geometry,
                stride,
                held,
                entry,
                (data, sent, vec![released]),
            ),
            received,
        })
    }

    pub(super) fn ring(&self) -> Ring<'_> {
        self.end.ring()
    }

    /// Wait on the host (at most `timeout`) until the producer has sent the next item, then
    /// enqueue on `stream` a wait for the producer's GPU writes of it
    /// (`cuStreamWaitValue64`): work enqueued next on `stream` sees the item. Returns a view
    /// of the item; [`release`](Received::release) it when its work is enqueued.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::ChannelClosed`] once the producer dropped its sender and
    /// every item it sent was received; [`Error::PeerGone`] (the exporter) when it died;
    /// [`Error::Corrupt`] when the shared state is inconsistent (e.g. a length above the
    /// capacity); [`Error::Cuda`] naming `cuStreamWaitValue64`.
    #[doc(alias = "cuStreamWaitValue64")]
    pub fn recv<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        timeout: Duration,
    ) -> Result<Received<'a, T>> {
        self.end.check_open("IpcReceiver::recv")?;
        let len = self.ring().recv(self.received, wait_limit(timeout))?;
        self.take_item(stream, len)
    }

    /// As [`recv`](Self::recv), without waiting: `Ok(None)` when no item is there yet (a
    /// [`Listening`] receiver is then armed: its descriptor turns readable
    /// when the producer sends, closes or dies).
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv), without [`Error::Timeout`].
    pub fn try_recv<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<Option<Received<'a, T>>> {
        self.end.check_open("IpcReceiver::try_recv")?;
        match self.end.try_recv_armed(self.received)? {
            Some(len) => self.take_item(stream, len).map(Some),
            None => Ok(None),
        }
    }

    pub(super) fn take_item<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        len: u64,
    ) -> Result<Received<'a, T>> {
        let k = self.received + 1;
        let header = self.ring().header(k)?;
        // SAFETY: the counter stays mapped until this wait has completed: the item's release
        // (explicit or in its drop) records an event on this stream after it, and the
        // receiver's teardown (close, or a collect after its drop) waits for recorded events
        // before unmapping.
        unsafe { self.end.sent.wait(stream, k)? };
        self.received = k;
        Ok(Received {
            stream: stream.as_cu_stream(),
            rx: self,
            // ≤ capacity (checked by the ring), which fits in usize (the allocation does).
            len: len as usize,
            header,
            done: false,
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

    /// Items received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The context the channel is mapped in (streams must belong to it).
    pub fn context(&self) -> &GpuContext {
        self.end.data.context()
    }

    /// The producing process.
    pub fn producer(&self) -> Option<ProcessIdentity> {
        self.end.data.exporter()
    }

    /// After a drop, how long the channel's GPU operations are waited for (by later collects)
    /// before the mappings are leaked rather than unmapped under them (default 5 s). Dropping
    /// never waits: the receiver closes (and unmaps) once its GPU operations are done — at once
    /// if they are, else at a later allocation or export of this process,
    /// [`collect_deferred`](crate::collect_deferred), or exit. [`close`](Self::close) takes its
    /// own timeout.
    pub fn set_drop_timeout(&mut self, timeout: Duration) {
        self.end.drain_timeout = timeout;
    }

    /// Enqueue "`released` = item `k`" on `stream`, publish it, record it (after the publish:
    /// off the producer's path).
    fn release_item(&mut self, stream: sys::CUstream, k: u64) -> Result<()> {
        let written = self.end.signal(stream, k)?;
        let published = written.ring().release(k);
        let recorded = written.record();
        published.and(recorded)
    }

    /// Close the receiver: the producer's next acquire reports [`Error::ChannelClosed`] (a
    /// broadcast producer stops waiting for this consumer). Waits up to `timeout` for the
    /// channel's GPU operations on this side, closes the receiver in the channel, unmaps, and
    /// reports what drop would hide. A close that does not finish hands the receiver back,
    /// closing (it receives nothing more), for another `close` or a drop.
    ///
    /// # Errors
    ///
    /// In a [`CloseError`] holding the receiver: [`Error::Timeout`] when the channel's GPU
    /// operations did not complete in time.
    pub fn close(self, timeout: Duration) -> std::result::Result<(), CloseError<Self>> {
        let mut rx = self;
        match rx.end.close_within(timeout) {
            Ok(()) => Ok(()),
            Err(error) => Err(CloseError::new(error, rx)),
        }
    }
}

impl<T: Pod> std::fmt::Debug for IpcReceiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcReceiver")
            .field("type", &std::any::type_name::<T>())
            .field("slots", &self.end.geometry.slots)
            .field("capacity", &self.end.geometry.capacity)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl<T: Pod> Received<'_, T> {
    /// The item's device address (`len()` elements of `T`), for kernels and copies enqueued
    /// on the receiving stream.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.rx.end.slot_ptr(self.rx.received)
    }

    /// Elements of `T` the producer sent in this item.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the item is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The header the producer sent with the item ([`SendSlot::send_with_header`]; empty
    /// after a plain [`send`](SendSlot::send)): a copy taken when the item was received, at
    /// most [`HEADER_BYTES`] bytes. Bytes from the other process: parse them as untrusted.
    #[must_use]
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// The slot's index in the ring.
    #[must_use]
    pub fn index(&self) -> usize {
        self.rx.end.geometry.slot_of(self.rx.received)
    }

    /// The item's number (items count from 1).
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.rx.received
    }

    /// Copy the item to the host: enqueue the copy on the receiving stream
    /// (`cuMemcpyDtoHAsync`, so it comes after the producer's writes) and wait for it, at most
    /// `timeout`, checking every 10 ms that the producer is alive (a producer killed before
    /// its GPU wrote the item leaves the stream blocked).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::PeerGone`] (the exporter) when the producer died with the item
    /// unwritten; [`Error::Cuda`] naming the failed call. On these errors the copy may still
    /// be pending, so its host buffer is leaked rather than freed under it.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn to_vec(&self, timeout: Duration) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        if self.len == 0 {
            return Ok(out);
        }
        let data = &self.rx.end.data;
        let _g = data.context().enter()?;
        // SAFETY: `out` holds `len` elements, the item's range is inside the mapping, and the
        // stream is live (borrowed by the item); `out` is returned only once the copy is done
        // and leaked otherwise (below).
        unsafe {
            crate::driver::mem::copy_dtoh_async(
                out.as_mut_ptr().cast(),
                self.as_raw_ptr(),
                std::mem::size_of_val(out.as_slice()),
                self.stream,
            )
        }?;
        let mut done = InFlight::new(data.context());
        let producer = data.exporter();
        let gone = std::cell::Cell::new(None);
        let finished = done.record(self.stream).is_ok()
            && done.drain(
                wait_limit(timeout),
                || {
                    if let Some(p) = producer.filter(|p| !p.is_alive()) {
                        gone.set(Some(p.pid()));
                    }
                },
                || gone.get().is_some(),
            );
        if finished {
            return Ok(out);
        }
        // The copy may still be queued: its destination must outlive it.
        std::mem::forget(out);
        Err(match gone.get() {
            Some(pid) => Error::exporter_gone(pid),
            None => Error::Timeout {
                what: "copy of a received IPC channel item to the host",
                waited: timeout,
                waiting_for: None,
            },
        })
    }

    /// Hand the slot back once the work enqueued on the receiving stream so far is done:
    /// enqueue "`released` = this item" there (`cuStreamWriteValue64`), then tell the
    /// producer. Returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuStreamWriteValue64` or `cuEventRecord`; [`Error::Corrupt`].
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        let (stream, k) = (self.stream, self.rx.received);
        self.rx.release_item(stream, k)
    }
}

impl<T: Pod> Drop for Received<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            let (stream, k) = (self.stream, self.rx.received);
            // Drop cannot report; `release` does.
            let _ = self.rx.release_item(stream, k);
        }
    }
}

impl<T: Pod> std::fmt::Debug for Received<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("seq", &self.seq())
            .field("index", &self.index())
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
