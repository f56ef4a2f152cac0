//! [`IpcSignal`]: a 64-bit counter in device memory that GPU streams of several processes write
//! and wait on with stream memory operations, so a hand-off between processes needs no host.
//!
//! # When a party stops
//!
//! The counter is an [`IpcBuffer`] (leases, stale-handle checks). A writer killed before its write
//! leaves GPU-side waits for that value blocked for good (the GPU cannot notice);
//! [`IpcSignal::wait_host`](crate::GpuSignal::wait_host) notices a dead exporter or lease holder
//! within 10 ms and remembers it (as do a [`SignalWatch`](crate::wait::SignalWatch)'s looks and
//! [`wait_host_async`](crate::GpuSignal::wait_host_async), which read the counter on the same
//! back-off), after which GPU-side waits are refused;
//! [`IpcSignal::signal_host`](crate::GpuSignal::signal_host) releases this process's parked
//! streams. A signal that fails leaves its value unused (retry with it). Tested in
//! `tests/signal.rs` (dead exporter, dead importer, blocked streams).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::buffer::{ImportedBuffer, IpcBuffer, Side};
use crate::context::GpuContext;
use crate::device;
use crate::driver::{self, sys};
use crate::error::{ArgumentDefect, Capability, CloseError, Error, PeerRole, Result, StateDefect};
use crate::poll::Backoff;
use crate::process::ProcessIdentity;
use crate::stream::AsStream;

/// How often a host wait checks that the signal's other processes are alive.
pub(crate) const LIVENESS_CHECK: Duration = Duration::from_millis(10);

/// `lost` encodings: which kind of party was found dead, in the high word; its pid below.
const LOST_EXPORTER: u64 = 1 << 32;
const LOST_PEER: u64 = 2 << 32;

/// A handle of an [`IpcSignal`], opened with
/// [`ImportedSignal::open`](crate::ImportedSignal::open).
pub type IpcSignalHandle = crate::handle::Handle<IpcSignal>;

/// A monotonically increasing 64-bit counter in device memory, shared between processes, that
/// GPU streams write ([`signal`](GpuSignal::signal), `cuStreamWriteValue64`) and wait on
/// ([`wait`](GpuSignal::wait), `cuStreamWaitValue64` with "greater or equal") without the host.
///
/// One process creates it with [`new`](Self::new) and exports a typed
/// [`IpcSignalHandle`] with [`handle`](Self::handle); others open it as an [`ImportedSignal`]
/// (the same envelope checks, leases and import cache as an
/// [`ImportedBuffer`], whose IPC mapping it is: across two GPUs it is
/// reached by peer access). The counter starts at 0. Both dereference to [`GpuSignal`], which
/// has the operations.
///
/// # Semantics
///
/// - `signal(stream, v)` enqueues "write `v`" on `stream`: when the stream reaches that point,
///   after a memory fence that makes the stream's earlier writes (kernels, copies) visible
///   system-wide, the counter becomes `v`. Values passed to one `IpcSignal` must increase
///   (checked; a signal is a counter, not a flag), and every writer of a signal must agree on
///   the sequence: writing a smaller value than another process already wrote is a protocol
///   error this crate cannot see across processes.
/// - `wait(stream, v)` enqueues "wait until counter ≥ `v`": later work on `stream` starts only
///   after it. Unlike an event, the waiter names the value it needs, so it can enqueue waits
///   for hand-offs that have not been signalled yet.
/// - Values are `0..=`[`MAX_VALUE`](GpuSignal::MAX_VALUE) (2^63 − 1): CUDA compares as
///   `(int64_t)(counter − v) >= 0`, which is plain `≥` in that range.
/// - The host can [`value`](GpuSignal::value) the counter, [`wait_host`](GpuSignal::wait_host) with
///   a deadline (noticing a dead exporter or importer instead of hanging), and
///   [`signal_host`](GpuSignal::signal_host). Host reads and writes go through a non-blocking
///   stream of the signal's own, so they never queue behind the caller's streams (a blocked stream
///   would stall the legacy default stream that synchronous copies use).
///
/// # `IpcSignal` or [`IpcEvent`](crate::IpcEvent)?
///
/// [`IpcEvent`](crate::IpcEvent) is simpleIPC's way and has the driver's event semantics: a
/// stream waits for the *latest* record, so the waiting process must learn (through the host)
/// that the record happened before it enqueues its wait. `IpcSignal` has counter semantics: the
/// waiter must know which value to wait for, and in exchange it can enqueue waits ahead and
/// the GPUs hand off by themselves. Measured on H200s (driver 580, `BENCHMARKS.md`), a
/// producer → consumer → producer round trip that only hands off:
///
/// | | two processes on one GPU | one process per GPU, two GPUs over NVLink |
/// |-|--------------------------|-------------------------------------------|
/// | `IpcEvent` | 285 µs | 13.2 µs |
/// | `IpcSignal` | **13.6 µs** | 17.0 µs |
///
/// So: on a shared GPU, `IpcSignal` is 21× quicker; across GPUs, events are as quick and keep
/// CUDA's semantics. Once both processes also run kernels or copies on one GPU, the GPU
/// time-slices their contexts (without MPS) and a round trip costs about 310 µs whichever is
/// used.
///
/// Stream memory operations are invisible to CUDA's own dependency tracking, and a wait that
/// is never satisfied blocks its stream for good: a GPU-side wait on a signal whose writer died
/// never returns. Pair it with [`wait_host`](GpuSignal::wait_host) or a barrier, and unblock
/// streams with [`signal_host`](GpuSignal::signal_host) when giving up.
///
/// # Blocking streams
///
/// cust's `Stream::new` drops `StreamFlags::NON_BLOCKING`, so cust streams synchronise with the
/// legacy default stream. While such a stream is parked in [`wait`](GpuSignal::wait), every
/// synchronous call of this process that uses the legacy stream
/// ([`IpcBuffer::copy_to_host`](crate::GpuSlice::copy_to_host),
/// [`IpcBuffer::copy_from_host`](crate::GpuSlice::copy_from_host),
/// [`IpcBuffer::memset_bytes`](crate::GpuSlice::memset_bytes), ...) blocks until the wait is
/// satisfied. [`IpcSignal::new`] and [`IpcBuffer::zeroed`](crate::IpcBuffer::zeroed) use private
/// non-blocking streams and are not affected, nor are the signal's own host calls
/// ([`value`](GpuSignal::value), [`wait_host`](GpuSignal::wait_host),
/// [`signal_host`](GpuSignal::signal_host)).
///
/// Requires 64-bit stream memory operations on the device
/// ([`can_use_stream_mem_ops`](crate::device::can_use_stream_mem_ops)) and a driver that has the
/// CUDA 11.7 `_v2` entry points (R515 or newer; every Hopper driver is).
///
/// `IpcSignal` is `Send` and `Sync`, as is `ImportedSignal`.
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::{GpuContext, ImportedSignal, IpcSignal};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Producer: export a signal (put the handle in a ShmCell for the consumer).
/// let ctx = GpuContext::new(0)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// let ready = IpcSignal::new(&ctx)?;
/// let handle = ready.handle()?;
/// // ... enqueue the work that fills a shared buffer for hand-off 1, then:
/// // SAFETY: `ready` outlives the write: the host waits for it below, before `ready` drops.
/// unsafe { ready.signal(&stream, 1)? };
/// ready.wait_host(1, Duration::from_secs(5))?; // the write has landed
///
/// // Consumer, in another process: its stream waits for hand-off 1 on the GPU.
/// let ready = ImportedSignal::open(&ctx, &handle)?;
/// // SAFETY: the stream is synchronised (with the CUDA crate that made it) before `ready`
/// // drops.
/// unsafe { ready.wait(&stream, 1)? };
/// // ... enqueue work that reads the buffer, synchronise the stream ...
/// // Or wait on the host, with a deadline:
/// ready.wait_host(1, Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
///
/// Enqueueing a write or a wait is `unsafe` (the stream may run it after the signal is gone);
/// safe code cannot do it:
///
/// ```compile_fail,E0133
/// use cuda_ipc::{AsStream, IpcSignal};
///
/// fn signal_then_drop(ready: IpcSignal, stream: &(impl AsStream + ?Sized)) {
///     ready.signal(stream, 1).ok(); // error: call to unsafe function
///     drop(ready); // would unmap or free the counter while the write may still be queued
/// }
/// ```
pub struct IpcSignal {
    signal: GpuSignal,
}

crate::slice::deref_to!(IpcSignal => signal: GpuSignal, with Debug);

impl IpcSignal {
    /// Create a signal in `ctx`, its counter at 0, ready to export.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the device cannot use 64-bit stream memory operations;
    /// [`Error::Cuda`] naming `cuMemAlloc`, `cuStreamCreate`, `cuMemAllocHost`,
    /// `cuMemcpyHtoDAsync` or `cuStreamSynchronize`.
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn new(ctx: &GpuContext) -> Result<Self> {
        GpuSignal::new(ctx).map(|signal| Self { signal })
    }

    /// Export: the typed handle another process opens (`cuIpcGetMemHandle` of the counter, in
    /// an envelope of kind "signal").
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuIpcGetMemHandle`; as
    /// [`IpcBuffer::handle`](crate::IpcBuffer::handle) for the export registry;
    /// [`Error::InvalidState`] ([`ObjectState::Closing`](crate::error::ObjectState::Closing))
    /// for a signal a [`close`](Self::close) released (see there).
    pub fn handle(&self) -> Result<IpcSignalHandle> {
        self.signal.handle()
    }

    /// The pids of live processes that have the signal open (dead ones are reaped).
    pub fn importers(&self) -> Vec<u32> {
        self.signal.importers()
    }

    /// Close the signal and report what drop would hide, as
    /// [`IpcBuffer::close`](crate::IpcBuffer::close): wait up to `timeout` for its importers to
    /// close it, then free its counter. Dropping never waits: the counter's free is then
    /// deferred while importers map it.
    ///
    /// # Errors
    ///
    /// [`Error::LeasesOutstanding`] when importers remained (the signal comes back in the
    /// error, closing), [`Error::Cuda`] naming `cuMemFree` when the driver refused the free
    /// (the signal comes back released: its counter is no longer its own to share, so
    /// [`handle`](Self::handle) is [`Error::InvalidState`], and dropping it leaks the counter).
    #[doc(alias = "cuMemFree")]
    pub fn close(self, timeout: Duration) -> Result<(), CloseError<Self>> {
        let mut signal = self.signal;
        match signal.counter.close_in_place(timeout) {
            Ok(()) => Ok(()),
            Err(error) => Err(CloseError::new(error, Self { signal })),
        }
    }
}

/// Another process's [`IpcSignal`], opened in this process: the same counter, with the same
/// operations (it dereferences to [`GpuSignal`]); it cannot be exported again. Its host waits
/// also notice the exporter's death.
///
/// `ImportedSignal` is `Send` and `Sync`.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext, ImportedSignal, IpcSignalHandle};
/// use cuda_ipc::shm::ShmCell;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// # let cell: &ShmCell<IpcSignalHandle> = unimplemented!();
/// let ctx = GpuContext::new(0)?;
/// let ready = ImportedSignal::open(&ctx, &cell.load())?;
/// ready.wait_host(1, Duration::from_secs(5))?; // the exporter's hand-off 1
/// # Ok(()) }
/// ```
///
/// It cannot be exported again (this does not compile):
///
/// ```compile_fail,E0624
/// use cuda_ipc::{GpuContext, ImportedSignal, IpcSignalHandle};
///
/// fn reexport(ctx: &GpuContext, handle: &IpcSignalHandle) -> cuda_ipc::Result<IpcSignalHandle> {
///     ImportedSignal::open(ctx, handle)?.handle() // error: `handle` is private
/// }
/// ```
pub struct ImportedSignal {
    signal: GpuSignal,
    exporter: ProcessIdentity,
}

crate::slice::deref_to!(ImportedSignal => signal: GpuSignal, with Debug);

impl ImportedSignal {
    /// Open a signal exported by another process, in `ctx` (its counter is mapped with
    /// `cuIpcOpenMemHandle`, by peer access when it lives on another device).
    ///
    /// # Errors
    ///
    /// Checked before the driver sees the handle: [`Error::CorruptHandle`] (also for a memory
    /// or event handle), [`Error::SameProcess`], [`Error::PeerGone`] (the exporter),
    /// [`Error::DeviceNotReachable`], [`Error::StaleHandle`] (the signal was dropped, even if
    /// new memory now sits at its address), [`Error::TooManyImporters`],
    /// [`Error::Unsupported`]. Then [`Error::Cuda`] naming the failed call.
    #[doc(alias = "cuIpcOpenMemHandle")]
    pub fn open(ctx: &GpuContext, handle: &IpcSignalHandle) -> Result<Self> {
        let signal = GpuSignal::open(ctx, handle)?;
        // An envelope always names its exporter; the mapping keeps what it named.
        let exporter = signal.exporter().ok_or(Error::Corrupt {
            what: "IPC signal",
            defect: StateDefect::Missing {
                what: "the opened counter's exporter",
            },
        })?;
        Ok(Self { signal, exporter })
    }

    /// The exporting process.
    pub fn exporter(&self) -> ProcessIdentity {
        self.exporter
    }
}

/// The operations of a signal, exported ([`IpcSignal`]) or opened ([`ImportedSignal`]): both
/// dereference to it. GPU streams write the counter ([`signal`](Self::signal),
/// `cuStreamWriteValue64`) and wait on it ([`wait`](Self::wait), `cuStreamWaitValue64`); the
/// host reads it, writes it and waits on it with a deadline. See [`IpcSignal`] for the
/// semantics, what a dead party does to waits, and when to prefer an event.
///
/// `GpuSignal` is `Send` and `Sync`.
///
/// # Examples
///
/// Code that waits takes a `&GpuSignal`, whether this process exported the signal or opened it:
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext, GpuSignal, IpcSignal};
///
/// fn wait_for_step(signal: &GpuSignal, step: u64) -> cuda_ipc::Result<u64> {
///     // On the host, with a deadline: a dead peer ends the wait with `PeerGone`.
///     signal.wait_host(step, Duration::from_secs(5))
/// }
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let signal = IpcSignal::new(&ctx)?; // share `signal.handle()?` with the other process
/// let reached = wait_for_step(&signal, 1)?; // the peer's stream signals 1 when done
/// println!("the counter reads {reached}");
/// # Ok(()) }
/// ```
pub struct GpuSignal {
    counter: Side<u64>,
    host: Mutex<HostPort>,
    /// The largest value this handle has signalled (0: none yet).
    last_signalled: Mutex<u64>,
    /// A dead party once seen (`LOST_*` | pid), 0 while none is known.
    lost: AtomicU64,
}

/// The signal's own non-blocking stream and a page-locked word, for host reads and writes.
struct HostPort {
    ctx: GpuContext,
    stream: sys::CUstream,
    word: *mut u64,
}

// SAFETY: the stream and the page-locked word belong to this port alone; the driver handles may
// be used from any thread, and the word is only touched under the signal's mutex.
unsafe impl Send for HostPort {}

impl HostPort {
    fn new(ctx: &GpuContext) -> Result<Self> {
        let _g = ctx.enter()?;
        let stream = driver::stream::create_non_blocking()?;
        let word = match driver::mem::alloc_host(8) {
            Ok(word) => word,
            Err(e) => {
                // SAFETY: created above, destroyed once; nothing was enqueued on it.
                let _ = unsafe { driver::stream::destroy(stream) };
                return Err(e);
            }
        };
        Ok(Self {
            ctx: ctx.clone(),
            stream,
            word: word.cast(),
        })
    }

    /// Copy the counter at `ptr` to the host and return it (`cuMemcpyDtoHAsync` on the port's
    /// stream, then `cuStreamSynchronize`).
    fn read(&self, ptr: sys::CUdeviceptr) -> Result<u64> {
        let _g = self.ctx.enter()?;
        // SAFETY: the word is 8 page-locked bytes owned by this port, and the device range is
        // the signal's 8-byte counter, mapped while the signal lives.
        unsafe { driver::mem::copy_dtoh_async(self.word.cast(), ptr, 8, self.stream) }?;
        // SAFETY: a live stream of this port.
        unsafe { driver::stream::synchronize(self.stream) }?;
        // SAFETY: the copy into the word has completed (synchronised above); the mutex keeps
        // other threads away; volatile because the device wrote it.
        Ok(unsafe { self.word.read_volatile() })
    }

    /// Write `value` into the counter at `ptr` from the host (`cuMemcpyHtoDAsync`, then
    /// `cuStreamSynchronize`).
    fn write(&self, ptr: sys::CUdeviceptr, value: u64) -> Result<()> {
        let _g = self.ctx.enter()?;
        // SAFETY: no copy is in flight on the port's stream (each call synchronises), and the
        // mutex keeps other threads away.
        unsafe { self.word.write_volatile(value) };
        // SAFETY: as in `read`, in the other direction.
        unsafe { driver::mem::copy_htod_async(ptr, self.word.cast(), 8, self.stream) }?;
        // SAFETY: a live stream of this port.
        unsafe { driver::stream::synchronize(self.stream) }
    }
}

impl Drop for HostPort {
    fn drop(&mut self) {
        if let Ok(_g) = self.ctx.enter() {
            // SAFETY: created in `new` in this context, released once; every copy on the stream
            // was synchronised by the call that enqueued it. Drop cannot report a failure.
            unsafe {
                let _ = driver::stream::destroy(self.stream);
                let _ = driver::mem::free_host(self.word.cast());
            }
        }
    }
}

/// Refuse a device without 64-bit stream memory operations, naming the attribute.
fn require_stream_mem_ops(ctx: &GpuContext) -> Result<()> {
    if device::stream_mem_ops_64(ctx.device())? {
        Ok(())
    } else {
        Err(Error::Unsupported {
            device: ctx.ordinal(),
            what: "use 64-bit stream memory operations (IpcSignal)",
            missing: Capability::StreamMemOps64,
        })
    }
}

/// Refuse a value outside `0..=MAX_VALUE`.
pub(crate) fn check_value(call: &'static str, value: u64) -> Result<()> {
    ArgumentDefect::check_range(call, "signal value", value, 0, GpuSignal::MAX_VALUE)
}

/// Signal `value` through `write` and record it as the highest signalled through `last`,
/// refusing a value outside the range or not above the last. The value is recorded only once
/// `write` succeeded, so a failed signal can be retried with the same value; the lock keeps
/// concurrent signals of one handle in order (check, write, record as one step).
fn advance(
    last: &Mutex<u64>,
    call: &'static str,
    value: u64,
    write: impl FnOnce() -> Result<()>,
) -> Result<()> {
    check_value(call, value)?;
    let mut last = last.lock();
    if value <= *last {
        return Err(Error::InvalidArgument {
            call,
            defect: ArgumentDefect::NotIncreasing { value, last: *last },
        });
    }
    write()?;
    *last = value;
    Ok(())
}

/// Whether a counter reading `counter` satisfies "≥ `value`" as the GPU decides it for
/// `cuStreamWaitValue64(GEQ)`: `(int64_t)(counter − value) >= 0`. The same as plain `≥` for
/// values up to [`GpuSignal::MAX_VALUE`], and what a peer kernel writing a larger value makes
/// the GPU see.
fn reached(counter: u64, value: u64) -> bool {
    counter.wrapping_sub(value) as i64 >= 0
}

impl GpuSignal {
    /// Enqueue on `stream` a write of `value` to the counter word at `counter`, after a wait
    /// until it is ≥ `after` if given (both as one `cuStreamBatchMemOp`): how a channel's end
    /// moves its counter forward from a stream other than the previous write's. Every stream
    /// memory operation of the crate, write or wait, is enqueued in this file.
    ///
    /// # Safety
    ///
    /// `counter` is an 8-byte aligned device word of the current context that the caller may
    /// write, mapped until the operations have run; `stream` is live.
    pub(crate) unsafe fn write_word_after(
        stream: sys::CUstream,
        counter: u64,
        value: u64,
        after: Option<u64>,
    ) -> Result<()> {
        let write = sys::CUstreamMemOpValue64 {
            operation: sys::CU_STREAM_MEM_OP_WRITE_VALUE_64,
            address: counter,
            value,
            flags: sys::CU_STREAM_WRITE_VALUE_DEFAULT,
            alias: 0,
            pad: 0,
        };
        let Some(last) = after else {
            // SAFETY: one write on the caller's word and stream (the caller's duty).
            return unsafe { driver::stream::write_value64(stream, counter, value, write.flags) };
        };
        let mut ops = [
            sys::CUstreamMemOpValue64 {
                operation: sys::CU_STREAM_MEM_OP_WAIT_VALUE_64,
                value: last,
                flags: sys::CU_STREAM_WAIT_VALUE_GEQ,
                ..write
            },
            write,
        ];
        // SAFETY: a wait and a write on the caller's word and stream (the caller's duty).
        unsafe { driver::stream::batch_mem_op(stream, &mut ops) }
    }

    /// The largest value a signal can carry, 2^63 − 1: CUDA's "greater or equal" compares the
    /// difference as a signed 64-bit number, which is plain `≥` only below 2^63.
    pub const MAX_VALUE: u64 = i64::MAX as u64;

    /// The work of [`IpcSignal::new`].
    pub(crate) fn new(ctx: &GpuContext) -> Result<Self> {
        require_stream_mem_ops(ctx)?;
        let signal = Self::with_counter(Side::Owner(IpcBuffer::<u64>::new(ctx, 1)?))?;
        // Zero through the signal's own stream: on the device when `new` returns (a peer that
        // opens the handle next must never see the allocation's old contents), and not
        // queued behind the caller's blocked streams.
        signal.host.lock().write(signal.counter.as_raw_ptr(), 0)?;
        Ok(signal)
    }

    fn with_counter(counter: Side<u64>) -> Result<Self> {
        let host = HostPort::new(counter.context())?;
        Ok(Self {
            counter,
            host: Mutex::new(host),
            last_signalled: Mutex::new(0),
            lost: AtomicU64::new(0),
        })
    }

    /// The work of [`IpcSignal::handle`].
    pub(crate) fn handle(&self) -> Result<IpcSignalHandle> {
        self.counter.export_handle("IpcSignal::handle", None)
    }

    /// The work of [`ImportedSignal::open`].
    pub(crate) fn open(ctx: &GpuContext, handle: &IpcSignalHandle) -> Result<Self> {
        handle.check_structure()?;
        require_stream_mem_ops(ctx)?;
        let counter = Side::Importer(ImportedBuffer::<u64>::open_handle(ctx, handle, None)?);
        Self::with_counter(counter)
    }

    /// Enqueue on `stream`: "set the counter to `value`", after a memory fence that makes the
    /// stream's earlier work visible to every process (`cuStreamWriteValue64`, default flags).
    /// Returns at once; the host is not involved when the stream gets there.
    ///
    /// `stream` must belong to this signal's context. A value is used up only when the
    /// driver accepted the write: after an error, the same value can be signalled again.
    ///
    /// Increasing values are checked in the order they are *enqueued*; the GPU runs writes on
    /// different streams in any order, so signalling `k` on one stream and `k + 1` on another can
    /// leave the counter at `k + 1` before the first stream's work is done, and then step it back
    /// to `k`. Signal a sequence on one stream, or make the next stream wait for the previous value
    /// first ([`wait`](Self::wait)) — what [`IpcSender`](crate::channel::IpcSender) and
    /// [`IpcReceiver`](crate::channel::IpcReceiver) do for their counters.
    ///
    /// # Safety
    ///
    /// The write runs later, on the device: the signal must stay alive until it has executed
    /// on `stream` (synchronise the stream before dropping the signal). Dropping an opened
    /// signal unmaps its counter and dropping the exported one frees it, without waiting for
    /// queued work, which would then write to memory that is no longer the counter (see
    /// [`IpcBuffer`'s asynchronous work](crate::IpcBuffer#asynchronous-work)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a value above [`MAX_VALUE`](Self::MAX_VALUE) or not above
    /// the last one this handle signalled; [`Error::Cuda`] naming `cuStreamWriteValue64`.
    #[doc(alias = "cuStreamWriteValue64")]
    pub unsafe fn signal(&self, stream: &(impl AsStream + ?Sized), value: u64) -> Result<()> {
        advance(&self.last_signalled, "IpcSignal::signal", value, || {
            let _g = self.counter.context().enter()?;
            // SAFETY: the counter is an 8-byte aligned device word, mapped now; that it stays
            // mapped until the stream runs the write is the caller's duty (forwarded).
            unsafe {
                driver::stream::write_value64(
                    stream.as_cu_stream(),
                    self.counter.as_raw_ptr(),
                    value,
                    sys::CU_STREAM_WRITE_VALUE_DEFAULT,
                )
            }
        })
    }

    /// Enqueue on `stream`: "wait until the counter is ≥ `value`" (`cuStreamWaitValue64`,
    /// `CU_STREAM_WAIT_VALUE_GEQ`). Work enqueued after it starts only once the counter gets
    /// there. Returns at once.
    ///
    /// The GPU cannot notice a dead writer: if nobody ever signals `value`, the stream stays
    /// blocked (see the type's docs for what to do about it).
    ///
    /// # Safety
    ///
    /// The wait runs on the device until the counter gets there: the signal must stay alive
    /// until it has completed on `stream`, as for [`signal`](Self::signal). A stream parked
    /// on a counter that was unmapped or freed reads whatever memory is there next; and
    /// freeing an exported counter (`cuMemFree`) waits for the device, so dropping it while a
    /// stream of this process waits on a value nobody will write blocks the drop for good.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a value above [`MAX_VALUE`](Self::MAX_VALUE);
    /// [`Error::PeerGone`] (the exporter) or [`Error::PeerGone`] (an importer) when a host-side
    /// check of this handle has already seen a party of the signal die; [`Error::Cuda`] naming
    /// `cuStreamWaitValue64`.
    #[doc(alias = "cuStreamWaitValue64")]
    pub unsafe fn wait(&self, stream: &(impl AsStream + ?Sized), value: u64) -> Result<()> {
        check_value("IpcSignal::wait", value)?;
        self.known_loss()?;
        let _g = self.counter.context().enter()?;
        // SAFETY: as in `signal` (the counter's lifetime until the wait completes is the
        // caller's duty); the wait only reads the counter.
        unsafe {
            driver::stream::wait_value64(
                stream.as_cu_stream(),
                self.counter.as_raw_ptr(),
                value,
                sys::CU_STREAM_WAIT_VALUE_GEQ,
            )
        }
    }

    /// The counter's current value, read by the host (a copy on the signal's own non-blocking
    /// stream, so it does not queue behind the caller's streams).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemcpyDtoHAsync` or `cuStreamSynchronize`.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn value(&self) -> Result<u64> {
        self.host.lock().read(self.counter.as_raw_ptr())
    }

    /// Set the counter to `value` from the host, now (a copy on the signal's own stream). Also
    /// the way to release GPU streams blocked in [`wait`](Self::wait) when giving up on a dead
    /// peer: signal a value at or above everything they wait for.
    ///
    /// # Errors
    ///
    /// As [`signal`](Self::signal), with [`Error::Cuda`] naming `cuMemcpyHtoDAsync` or
    /// `cuStreamSynchronize`.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn signal_host(&self, value: u64) -> Result<()> {
        advance(
            &self.last_signalled,
            "IpcSignal::signal_host",
            value,
            || self.host.lock().write(self.counter.as_raw_ptr(), value),
        )
    }

    /// Block the calling thread until the counter is ≥ `value`, at most `timeout`, and return
    /// the value read. Polls [`value`](Self::value) with a back-off from a few µs to 1 ms and,
    /// every 10 ms, checks that the signal's exporter (for an opened signal) and every
    /// process that has it open are alive.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::PeerGone`] (the exporter) when the exporter died,
    /// [`Error::PeerGone`] (an importer) when a process that had the signal open died without
    /// closing it (either is remembered: later waits fail at once); [`Error::InvalidArgument`] for
    /// a value above [`MAX_VALUE`](Self::MAX_VALUE); [`Error::Cuda`] from the reads.
    pub fn wait_host(&self, value: u64, timeout: Duration) -> Result<u64> {
        check_value("IpcSignal::wait_host", value)?;
        let waiting = crate::trace::Waiting::start("IPC signal wait (on the host)");
        let mut wait = Backoff::new(timeout, Duration::from_micros(2), Duration::from_millis(1));
        let mut next_check = Instant::now();
        waiting.end(loop {
            match self.look(value, &mut next_check) {
                Ok(Some(now_value)) => break Ok(now_value),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            if let Err(waited) = wait.pause() {
                break Err(Error::Timeout {
                    what: "IPC signal wait",
                    waited,
                    waiting_for: None,
                });
            }
        })
    }

    /// One look of a host wait for `value`: the value read if the counter reached it; else
    /// `None`, having checked the parties' liveness if `next_check` has come (and set the
    /// next one).
    pub(crate) fn look(&self, value: u64, next_check: &mut Instant) -> Result<Option<u64>> {
        let now_value = match self.value() {
            Ok(v) => v,
            // A read that fails because a party died is reported as that death.
            Err(e) => {
                self.check_parties()?;
                return Err(e);
            }
        };
        if reached(now_value, value) {
            return Ok(Some(now_value));
        }
        if Instant::now() >= *next_check {
            self.check_parties()?;
            *next_check = Instant::now() + LIVENESS_CHECK;
        }
        Ok(None)
    }

    /// The error for a party already seen dead, if any.
    fn known_loss(&self) -> Result<()> {
        let lost = self.lost.load(Ordering::Acquire);
        let pid = (lost & u64::from(u32::MAX)) as u32;
        match lost & !u64::from(u32::MAX) {
            0 => Ok(()),
            LOST_EXPORTER => Err(Error::exporter_gone(pid)),
            _ => Err(Error::peer_gone(pid, PeerRole::Importer("signal"))),
        }
    }

    /// Check that the exporter (for an opened signal) and every lease holder are alive;
    /// remember the first one found dead.
    fn check_parties(&self) -> Result<()> {
        self.known_loss()?;
        if let Some(exporter) = self.counter.exporter()
            && !crate::process::is_alive_cached(&exporter)
        {
            self.lost
                .store(LOST_EXPORTER | u64::from(exporter.pid()), Ordering::Release);
        } else if let Some(pid) = self.counter.dead_importer() {
            self.lost
                .store(LOST_PEER | u64::from(pid), Ordering::Release);
        }
        self.known_loss()
    }

    /// The exporting process, for an opened signal.
    pub(crate) fn exporter(&self) -> Option<ProcessIdentity> {
        self.counter.exporter()
    }

    /// The work of [`IpcSignal::importers`].
    pub(crate) fn importers(&self) -> Vec<u32> {
        self.counter.importers()
    }

    /// The context the counter is mapped in (streams passed to [`signal`](Self::signal) and
    /// [`wait`](Self::wait) must belong to it).
    pub fn context(&self) -> &GpuContext {
        self.counter.context()
    }

    /// The counter's device address (8 bytes, 8-aligned), for kernels that read it or write it
    /// themselves (with system-scope atomics and fences).
    pub fn as_raw_ptr(&self) -> u64 {
        self.counter.as_raw_ptr()
    }

    /// Wait for importers up to `timeout`, then free the counter (an opened signal's is
    /// unmapped when it drops), keeping the signal for a caller that hands it back.
    pub(crate) fn close_in_place(&mut self, timeout: Duration) -> Result<()> {
        self.counter.close_in_place(timeout)
    }

    /// Wait for importers up to `timeout`, then free (or unmap) the counter; on an error the
    /// signal drops (its free deferred).
    pub(crate) fn close(self, timeout: Duration) -> Result<()> {
        self.counter.close(timeout)
    }
}

impl std::fmt::Debug for GpuSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSignal")
            .field("device", &self.context().ordinal())
            .field("imported", &self.counter.is_imported())
            .field("last_signalled", &*self.last_signalled.lock())
            .finish_non_exhaustive()
    }
}

impl crate::handle::sealed::Sealed for IpcSignal {}
impl crate::handle::HandleKind for IpcSignal {
    const NAME: &'static str = "IpcSignalHandle";
    const CODE: u16 = crate::handle::KIND_SIGNAL;
    type Element = u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_above_the_signed_range_are_refused() {
        assert!(check_value("t", 0).is_ok());
        assert!(check_value("t", GpuSignal::MAX_VALUE).is_ok());
        let e = check_value("t", GpuSignal::MAX_VALUE + 1).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    call: "t",
                    defect: ArgumentDefect::OutOfRange {
                        what: "signal value",
                        max: GpuSignal::MAX_VALUE,
                        ..
                    }
                }
            ),
            "{e}"
        );
        assert!(check_value("t", u64::MAX).is_err());
    }

    #[test]
    fn signalled_values_must_increase() {
        let last = Mutex::new(0);
        let ok = || Ok(());
        assert!(
            advance(&last, "t", 0, ok).is_err(),
            "0 is where the counter starts"
        );
        advance(&last, "t", 1, ok).unwrap();
        advance(&last, "t", 5, ok).unwrap();
        let e = advance(&last, "t", 5, ok).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    defect: ArgumentDefect::NotIncreasing { value: 5, last: 5 },
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("must increase: 5 after 5"), "{e}");
        assert!(advance(&last, "t", 3, ok).is_err());
        assert!(advance(&last, "t", GpuSignal::MAX_VALUE + 1, ok).is_err());
        assert_eq!(*last.lock(), 5);
        advance(&last, "t", GpuSignal::MAX_VALUE, ok).unwrap();
    }

    /// A regression test: the value was once used up before the driver call, so a
    /// signal that failed could not be retried with the same value.
    #[test]
    fn a_failed_signal_can_be_retried_with_the_same_value() {
        let last = Mutex::new(0);
        let fail = || {
            Err(Error::Cuda {
                call: "cuStreamWriteValue64",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into(),
            })
        };
        assert!(matches!(
            advance(&last, "t", 1, fail),
            Err(Error::Cuda { .. })
        ));
        assert_eq!(*last.lock(), 0);
        advance(&last, "t", 1, || Ok(())).unwrap();
        assert_eq!(*last.lock(), 1);
    }

    /// What a `close` hands back when the driver refused its free: a signal whose counter was
    /// released. The refusal cannot be caused on purpose, so the counter is released here as
    /// the close releases it: the signal exports nothing more (before, its handle published a
    /// fresh export record for a counter it no longer owned).
    #[test]
    #[ignore = "requires a CUDA device"]
    fn a_released_signal_exports_nothing_more() {
        let ctx =
            crate::GpuContext::new(0).expect("a CUDA device (this test runs on a GPU machine)");
        let mut signal = IpcSignal::new(&ctx).unwrap();
        signal.handle().unwrap(); // exported once, as a signal handed back would be
        let Side::Owner(counter) = &mut signal.signal.counter else {
            unreachable!("a new signal owns its counter")
        };
        counter.release().unwrap();
        assert!(
            matches!(
                signal.handle(),
                Err(Error::InvalidState {
                    call: "IpcSignal::handle",
                    state: crate::error::ObjectState::Closing,
                })
            ),
            "a released signal's handle"
        );
        drop(signal); // its drop finds nothing left to free
    }

    /// A regression test: the host wait once compared unsigned where the GPU compares the signed
    /// difference; a peer kernel writing 2^63 or more made the two disagree (once the
    /// host saw 2^63 + 5 ≥ 1 while every GPU-side wait for 1 stayed blocked).
    #[test]
    fn the_host_wait_decides_as_the_gpu_does() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(GpuSignal::MAX_VALUE, 0));
        // (int64_t)(2^63 + 4) < 0: a GPU-side wait for 1 does not pass, though 2^63 + 5 ≥ 1.
        assert!(!reached((1 << 63) + 5, 1));
        assert!(!reached(1 << 63, 0));
        assert!(!reached(u64::MAX, 0));
    }
}
