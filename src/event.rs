//! [`IpcEvent`]: a CUDA event that other processes can open, record and wait on.
//!
//! # When the other side dies
//!
//! An event is the driver's object: this crate adds no shared state beside it, so the only
//! protocol is the exporter's liveness, checked by [`open`](ImportedEvent::open) and by
//! [`synchronize`](GpuEvent::synchronize). Where the other process can be preempted or
//! `SIGKILL`ed, and what this side then sees:
//!
//! | The other side dies...                            | This side sees                       |
//! |---------------------------------------------------|--------------------------------------|
//! | exporter, before the importer opens               | `open`: `PeerGone` (exporter), before the driver sees the handle |
//! | exporter, between the liveness check and `cuIpcOpenEventHandle` | the driver's answer: an error naming `cuIpcOpenEventHandle`, or an event that never completes again (then as the next row) |
//! | exporter, after recording, before the work ends   | `synchronize`: `PeerGone` (exporter) within about 10 ms (its context and queued work are torn down), or `Ok` if the driver marks the event complete as it tears the context down — the test accepts both, and neither proves the work finished |
//! | exporter, after the work ended                    | `synchronize`: `Ok` if its query comes first, else `PeerGone` (exporter). A death is not re-checked against a last query on purpose: the event alone cannot tell work that ended from a context torn down, and an error is safer than an `Ok` for work that never ran |
//! | exporter, while an importer's stream waits on it (`wait_on`) | nothing on the host: the GPU cannot notice a dead recorder; bound it by synchronising with a deadline, as for [`GpuSignal::wait`](crate::GpuSignal::wait) |
//! | importer, at any point                            | nothing: an exported event keeps no per-importer state, and destroying it is always allowed |
//!
//! Where the table says `synchronize`, an [`EventWatch`](crate::wait::EventWatch)'s `check` and
//! [`synchronize_async`](GpuEvent::synchronize_async) see the same: they make the same look
//! (`cuEventQuery`, then the exporter's liveness every 10 ms), paced by a timer instead of a
//! sleeping thread; a watch dropped at any point leaves nothing in the event.
//!
//! Covered by tests: a dead exporter at `open` and during `synchronize` and
//! `synchronize_async` (tests/event.rs, GPU); the others follow from the table's reasoning and
//! are not replayed.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::envelope::GENERATION;
use crate::error::{Error, Result};
use crate::handle::{Admitted, Envelope, KIND_EVENT};
use crate::poll::Backoff;
use crate::process::ProcessIdentity;
use crate::stream::AsStream;

/// How often a host wait checks that an opened event's exporter is alive.
pub(crate) const LIVENESS_CHECK: Duration = Duration::from_millis(10);

/// A handle of an [`IpcEvent`], opened with
/// [`ImportedEvent::open`](crate::ImportedEvent::open).
pub type IpcEventHandle = crate::handle::Handle<IpcEvent>;

/// An interprocess CUDA event (`cuEventCreate` with `CU_EVENT_INTERPROCESS |
/// CU_EVENT_DISABLE_TIMING`) created by this process, exported with [`handle`](Self::handle)
/// and opened in another process as an [`ImportedEvent`]. Both dereference to [`GpuEvent`],
/// which records, waits and synchronises.
///
/// Unlike cust's `Stream::wait_event`, which consumes its event,
/// [`wait_on`](GpuEvent::wait_on) borrows: a stream can be made to wait on the same event any
/// number of times, as simpleIPC's loop does. [`synchronize`](GpuEvent::synchronize) takes a
/// deadline and, for an opened event, notices a dead exporter instead of blocking forever.
///
/// The event holds its context and destroys itself there on drop. Note that the driver keeps
/// `cuda.shm.*` files in `/dev/shm` for interprocess events until the context is released.
///
/// `IpcEvent` is `Send` and `Sync`, as are `ImportedEvent` and `GpuEvent`.
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::{GpuContext, IpcEvent};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = GpuContext::new(0)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// let done = IpcEvent::new(&ctx)?;
/// done.record(&stream)?;
/// let handle = done.handle()?; // another process: ImportedEvent::open(&its_ctx, &handle)?
/// done.synchronize(std::time::Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
pub struct IpcEvent {
    event: GpuEvent,
}

crate::slice::deref_to!(IpcEvent => event: GpuEvent, with Debug);

/// Another process's [`IpcEvent`], opened in this process (`cuIpcOpenEventHandle`): record it,
/// make streams wait on it and synchronise with it as the exporter does (it dereferences to
/// [`GpuEvent`]); [`synchronize`](GpuEvent::synchronize) also notices the exporter's death. It
/// cannot be exported again.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext, ImportedEvent, IpcEventHandle};
/// use cuda_ipc::shm::ShmCell;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let cell: &ShmCell<IpcEventHandle> = unimplemented!();
/// let ctx = GpuContext::new(0)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// let written = ImportedEvent::open(&ctx, &cell.load())?;
/// written.wait_on(&stream)?; // the exporter's last record, before our next work
/// written.synchronize(Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
///
/// It cannot be exported again (this does not compile):
///
/// ```compile_fail,E0599
/// use cuda_ipc::{GpuContext, ImportedEvent, IpcEventHandle};
///
/// fn reexport(ctx: &GpuContext, handle: &IpcEventHandle) -> cuda_ipc::Result<IpcEventHandle> {
///     ImportedEvent::open(ctx, handle)?.handle() // error: no method named `handle`
/// }
/// ```
pub struct ImportedEvent {
    event: GpuEvent,
    exporter: ProcessIdentity,
}

crate::slice::deref_to!(ImportedEvent => event: GpuEvent, with Debug);

/// The operations of an interprocess event, exported ([`IpcEvent`]) or opened
/// ([`ImportedEvent`]): both dereference to it.
pub struct GpuEvent {
    ctx: GpuContext,
    raw: sys::CUevent,
    generation: u64,
    /// For an opened event: the exporter, watched by `synchronize`.
    exporter: Option<ProcessIdentity>,
}

// SAFETY: a CUevent handle may be used from any thread (the driver synchronises); the event is
// destroyed once, in Drop.
unsafe impl Send for GpuEvent {}
// SAFETY: as above; every method only passes the handle to thread-safe driver calls.
unsafe impl Sync for GpuEvent {}

impl IpcEvent {
    /// Create an interprocess event in `ctx`.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventCreate`.
    #[doc(alias = "cuEventCreate")]
    pub fn new(ctx: &GpuContext) -> Result<Self> {
        let _g = ctx.enter()?;
        let raw = driver::event::create(sys::CU_EVENT_INTERPROCESS | sys::CU_EVENT_DISABLE_TIMING)?;
        Ok(Self {
            event: GpuEvent {
                ctx: ctx.clone(),
                raw,
                generation: GENERATION.fetch_add(1, Ordering::Relaxed),
                exporter: None,
            },
        })
    }

    /// Export (`cuIpcGetEventHandle` in a checksummed envelope that also names the event's
    /// device, [`Handle::device_uuid`](crate::Handle::device_uuid)).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuIpcGetEventHandle` or `cuDeviceGetUuid`.
    #[doc(alias = "cuIpcGetEventHandle")]
    pub fn handle(&self) -> Result<IpcEventHandle> {
        let event = &self.event;
        let cuda = {
            let _g = event.ctx.enter()?;
            // SAFETY: an interprocess event of this context, live while `self` is.
            unsafe { driver::ipc::get_event_handle(event.raw) }?
        };
        let env = Envelope {
            device_uuid: event.ctx.uuid(),
            ..Envelope::exported(KIND_EVENT, event.generation, event.ctx.ordinal(), cuda)
        };
        Ok(IpcEventHandle::from_envelope(env.seal()))
    }
}

impl ImportedEvent {
    /// Open an event exported by another process, in `ctx`.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`], [`Error::SameProcess`], [`Error::PeerGone`] (the exporter)
    /// (checked before the driver sees the handle), then [`Error::Cuda`] naming
    /// `cuIpcOpenEventHandle`.
    #[doc(alias = "cuIpcOpenEventHandle")]
    pub fn open(ctx: &GpuContext, handle: &IpcEventHandle) -> Result<Self> {
        let Admitted {
            exporter,
            trace: _open,
            ..
        } = handle.admit(ctx, false)?;
        let env = &handle.env;
        let _g = ctx.enter()?;
        let raw = driver::ipc::open_event_handle(env.cuda)?;
        Ok(Self {
            event: GpuEvent {
                ctx: ctx.clone(),
                raw,
                generation: env.generation,
                exporter: Some(exporter),
            },
            exporter,
        })
    }

    /// The exporting process.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.exporter
    }
}

impl GpuEvent {
    /// Record the event on `stream` (`cuEventRecord`).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventRecord`.
    #[doc(alias = "cuEventRecord")]
    pub fn record(&self, stream: &(impl AsStream + ?Sized)) -> Result<()> {
        let _g = self.ctx.enter()?;
        // SAFETY: a live event of this context, and a live stream (borrowed).
        unsafe { driver::event::record(self.raw, stream.as_cu_stream()) }
    }

    /// Make `stream` wait for the event's most recent record (`cuStreamWaitEvent`). The event
    /// is borrowed, so this can be repeated.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuStreamWaitEvent`.
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait_on(&self, stream: &(impl AsStream + ?Sized)) -> Result<()> {
        let _g = self.ctx.enter()?;
        // SAFETY: a live event and a live stream (borrowed).
        unsafe { driver::stream::wait_event(stream.as_cu_stream(), self.raw) }
    }

    /// Whether the work before the last record has completed (`cuEventQuery`).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventQuery` for anything but success or "not ready".
    #[doc(alias = "cuEventQuery")]
    pub fn query(&self) -> Result<bool> {
        let _g = self.ctx.enter()?;
        // SAFETY: a live event.
        unsafe { driver::event::query(self.raw) }
    }

    /// Wait until the event completes, at most `timeout`. Polls `cuEventQuery` with a short
    /// back-off (so the wait is bounded, unlike `cuEventSynchronize`) and, for an opened event,
    /// checks every 10 ms that the exporter is alive.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], [`Error::PeerGone`] (the exporter), or [`Error::Cuda`] naming
    /// `cuEventQuery`.
    #[doc(alias = "cuEventQuery")]
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        let mut wait = Backoff::new(timeout, Duration::from_micros(1), Duration::from_millis(1))
            .spinning_below(Duration::from_micros(50));
        let mut next_check = Instant::now() + LIVENESS_CHECK;
        let waiting = crate::trace::Waiting::start("IPC event synchronize");
        waiting.end(loop {
            match self.look(&mut next_check) {
                Ok(Some(_)) => break Ok(()),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            if let Err(waited) = wait.pause() {
                break Err(Error::Timeout {
                    what: "IPC event synchronize",
                    waited,
                    waiting_for: None,
                });
            }
        })
    }

    /// One look of a host wait: `Some` if the work before the last record has completed;
    /// else `None`, having checked an opened event's exporter if `next_check` has come (and
    /// set the next one, [`LIVENESS_CHECK`] later).
    pub(crate) fn look(&self, next_check: &mut Instant) -> Result<Option<()>> {
        if self.query()? {
            return Ok(Some(()));
        }
        if let Some(exporter) = self.exporter
            && Instant::now() >= *next_check
        {
            *next_check = Instant::now() + LIVENESS_CHECK;
            if !crate::process::is_alive_cached(&exporter) {
                return Err(Error::exporter_gone(exporter.pid()));
            }
        }
        Ok(None)
    }

    /// The context the event lives in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The device UUID of the event's context (what its handle carries).
    #[doc(alias = "cuDeviceGetUuid")]
    #[must_use]
    pub fn device_uuid(&self) -> [u8; 16] {
        self.ctx.uuid()
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        if let Ok(_g) = self.ctx.enter() {
            // SAFETY: destroyed once, in its own context. Drop cannot report a failure.
            let _ = unsafe { driver::event::destroy(self.raw) };
        }
    }
}

impl std::fmt::Debug for GpuEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEvent")
            .field("device", &self.ctx.ordinal())
            .field("exporter", &self.exporter.map(|e| e.pid()))
            .finish_non_exhaustive()
    }
}

impl crate::handle::sealed::Sealed for IpcEvent {}
impl crate::handle::HandleKind for IpcEvent {
    const NAME: &'static str = "IpcEventHandle";
    const CODE: u16 = crate::handle::KIND_EVENT;
    const HOLDS_MEMORY: bool = false;
    type Element = crate::handle::sealed::Untyped;
}
