//! [`GpuContext`]: a device's primary CUDA context, reference-counted, that every GPU resource
//! of this crate holds so that it can make it current for its own teardown.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::driver::{self, sys};
#[cfg(any(feature = "cust", feature = "cudarc"))]
use crate::error::ArgumentDefect;
use crate::error::Result;
// Without the interop features only the docs name `Error`.
#[cfg(any(doc, feature = "cust", feature = "cudarc"))]
use crate::error::Error;

struct Inner {
    raw: sys::CUcontext,
    device: sys::CUdevice,
    ordinal: u32,
    /// The device's UUID, asked once (every export carries it).
    uuid: [u8; 16],
    /// The process that retained it: a forked child never enters or releases it.
    home: crate::process::Home,
}

// SAFETY: a CUcontext handle may be used (made current, pushed, popped) from any thread; the
// driver serialises access internally. `Inner` owns one retain of the primary context.
unsafe impl Send for Inner {}
// SAFETY: as above; `Inner` is immutable after construction.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.home.is_here() {
            return; // a forked child's copy: the retain is the parent's
        }
        // SAFETY: gives back the one retain taken in `GpuContext::new` (or `from_primary`);
        // drop cannot report an error, and the only failure (an invalid device) cannot happen
        // for a device we retained on.
        let _ = unsafe { driver::ctx::primary_release(self.device) };
    }
}

/// The primary CUDA context of one device (`cuDevicePrimaryCtxRetain`), shared by every
/// buffer and event created or opened on it.
///
/// This is the same context cust's `Context::new` and cudarc's `CudaContext::new` retain, so
/// their streams, modules and kernel launches made while it is current work with this crate's
/// buffers and events. Cloning is cheap (an `Arc`); the last clone releases the retain.
///
/// `GpuContext` is `Send` and `Sync`. CUDA contexts are current *per thread*: every method of
/// this crate makes the right context current for the duration of its driver calls and then
/// restores the previous one, so callers need not.
///
/// The last clone releases the context, and the driver destroys it if nobody else holds it
/// (creating one again takes hundreds of milliseconds).
/// [`retain_until_exit`](Self::retain_until_exit) keeps it for the rest of the process, as
/// NVIDIA's runtime does: `examples/simple_ipc.rs` does so in every process (the driver's
/// teardown at exit is faster than releasing contexts one by one). With cudarc, get it with
/// `GpuContext::from_cudarc(&cuda_context)` and pass cudarc's streams as they are
/// (`examples/cudarc_interop.rs`).
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::GpuContext;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?; // also made current on this thread, as cust does
/// let (free, total) = ctx.mem_info()?;
/// println!("device {}: {free} of {total} bytes free", ctx.ordinal());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct GpuContext {
    inner: Arc<Inner>,
}

impl GpuContext {
    /// Retain device `ordinal`'s primary context and make it current on this thread.
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`] when the driver has no usable GPU; [`Error::InvalidArgument`]
    /// naming `cuDeviceGet` for an ordinal beyond the driver's `int`; [`Error::Cuda`] naming
    /// `cuDeviceGet` (`CUDA_ERROR_INVALID_DEVICE` for an ordinal with no device),
    /// `cuDevicePrimaryCtxRetain` or `cuCtxSetCurrent` otherwise.
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn new(ordinal: u32) -> Result<Self> {
        let device = driver::device::get_initialized(ordinal)?;
        let uuid = driver::device::uuid(device)?;
        let raw = driver::ctx::primary_retain(device)?;
        let ctx = Self {
            inner: Arc::new(Inner {
                raw,
                device,
                ordinal,
                uuid,
                home: crate::process::Home::here(),
            }),
        };
        ctx.make_current()?;
        Ok(ctx)
    }

    /// The primary context `raw` is, as a `GpuContext`; refused if `raw` is another context.
    ///
    /// # Safety
    ///
    /// `raw` must be a live context for the duration of the call.
    #[cfg(any(feature = "cust", feature = "cudarc"))]
    pub(crate) unsafe fn from_primary(raw: sys::CUcontext, call: &'static str) -> Result<Self> {
        driver::init()?;
        // SAFETY: `raw` is live (the caller's duty); pushed here and popped right after.
        unsafe { driver::ctx::push(raw) }?;
        let device = driver::ctx::current_device();
        // SAFETY: pops what was pushed just above, on this thread.
        let _ = unsafe { driver::ctx::pop() };
        let device = device?;
        // A device handle that is no ordinal cannot be a primary context's.
        let not_primary = Error::InvalidArgument {
            call,
            defect: ArgumentDefect::NotPrimaryContext,
        };
        let Ok(ordinal) = u32::try_from(device) else {
            return Err(not_primary);
        };
        let ours = Self::new(ordinal)?;
        if ours.inner.raw != raw {
            return Err(not_primary);
        }
        Ok(ours)
    }

    /// Make this context current on the calling thread (`cuCtxSetCurrent`), as cust expects
    /// before creating streams or loading modules.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuCtxSetCurrent`.
    #[doc(alias = "cuCtxSetCurrent")]
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained by `self`; a thread's current context is the
        // caller's to manage, as with cust's and cudarc's `set_current`.
        unsafe { driver::ctx::set_current(self.inner.raw) }
    }

    /// Make this context current for the guard's lifetime, restoring the caller's on drop.
    /// When it already is current (the common case: [`GpuContext::new`] makes it so) nothing
    /// is pushed, and the guard pops nothing: one `cuCtxGetCurrent` instead of a push and a pop.
    pub(crate) fn enter(&self) -> Result<CtxGuard> {
        if !self.inner.home.is_here() {
            return Err(crate::error::Error::InvalidState {
                call: "GpuContext::enter",
                state: crate::error::ObjectState::Inherited {
                    made_in: self.inner.home.pid(),
                },
            });
        }
        if driver::ctx::current() == Some(self.inner.raw) {
            return Ok(CtxGuard {
                pushed: false,
                _not_send: std::marker::PhantomData,
            });
        }
        // SAFETY: the context is retained by `self`, and the guard
        // pops exactly what it pushed, on this thread (it is not `Send`).
        unsafe { driver::ctx::push(self.inner.raw) }?;
        Ok(CtxGuard {
            pushed: true,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Whether this is the process that retained the context (false in a forked child).
    pub(crate) fn is_home(&self) -> bool {
        self.inner.home.is_here()
    }

    /// The device ordinal.
    #[must_use]
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// The driver's device handle.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.inner.device
    }

    /// The device's UUID (`cuDeviceGetUuid`, asked when the context was made).
    pub(crate) fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

    /// Keep this device's primary context until the process exits, as NVIDIA's runtime does
    /// with the contexts it creates: one more retain (`cuDevicePrimaryCtxRetain`) that is never
    /// given back, so the context outlives every `GpuContext` of it. A later
    /// [`GpuContext::new`] on the device finds it alive (creating a context takes hundreds of
    /// milliseconds on large GPUs), and the driver tears it down when the process ends — on
    /// H200s faster than releasing it with the last `GpuContext` does (two contexts: about
    /// 190 against 270 ms; `examples/simple_ipc.rs` uses this, BENCHMARKS.md has the
    /// measurements). Calling it again for the same device changes nothing.
    ///
    /// Nothing else is kept: buffers, events, streams and the rest still free what they hold
    /// when dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuDevicePrimaryCtxRetain`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::GpuContext;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// GpuContext::new(0)?.retain_until_exit()?;
    /// // Dropped, yet the context lives on: this finds it instead of creating it again.
    /// let ctx = GpuContext::new(0)?;
    /// # let _ = ctx;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn retain_until_exit(&self) -> Result<()> {
        static KEPT: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
        let mut kept = KEPT.lock();
        if !kept.contains(&self.inner.ordinal) {
            // The same primary context as ours: a device has one, and ours keeps it alive.
            driver::ctx::primary_retain(self.inner.device)?;
            kept.insert(self.inner.ordinal);
        }
        Ok(())
    }

    /// The raw `CUcontext`.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUcontext {
        self.inner.raw
    }

    /// Free and total memory on this context's device (`cuMemGetInfo`).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemGetInfo`.
    #[doc(alias = "cuMemGetInfo")]
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let _g = self.enter()?;
        driver::mem_info()
    }

    /// Block until every stream of this context — this crate's, PyTorch's, cust's, cudarc's,
    /// the legacy default stream — has finished the work queued on it before the call
    /// (`cuCtxSynchronize`). Work queued by other threads while it waits is not waited for.
    ///
    /// This is how to know that no kernel or copy still touches a buffer before dropping it
    /// when the work went on streams the caller cannot name (see
    /// [asynchronous work](crate::GpuSlice#asynchronous-work)). It has no time-out: a stream
    /// waiting on the GPU for a value nobody writes keeps it waiting.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuCtxSynchronize` — a queued kernel's fault (e.g.
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`) is reported here, and leaves the context unusable;
    /// [`Error::InvalidState`] in a forked child (the context is its parent's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::GpuContext;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// // ... kernels launched on any stream of the context ...
    /// ctx.synchronize()?; // every one of them has finished
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuCtxSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        let _g = self.enter()?;
        driver::ctx::synchronize()
    }

    /// Let this context access memory of `peer`'s device (`cuCtxEnablePeerAccess`); already
    /// enabled is success.
    ///
    /// This reaches `cuMemAlloc` memory of `peer` (legacy [`IpcBuffer`](crate::IpcBuffer)s),
    /// not virtual or pool memory — POSIX-fd buffers, arenas, pools, their imports — nor legacy
    /// imports: give a device access to those with their `grant_access` methods
    /// ([`IpcBuffer::grant_access`](crate::IpcBuffer::grant_access) and the like).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuCtxEnablePeerAccess` (e.g. `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`).
    #[doc(alias = "cuCtxEnablePeerAccess")]
    pub fn enable_peer_access(&self, peer: &GpuContext) -> Result<()> {
        if self.inner.raw == peer.inner.raw {
            return Ok(());
        }
        let _g = self.enter()?;
        // SAFETY: `peer` retains its context.
        unsafe { driver::ctx::enable_peer_access(peer.inner.raw) }
    }
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("ordinal", &self.inner.ordinal)
            .finish_non_exhaustive()
    }
}

/// Pops the context pushed by [`GpuContext::enter`], if it pushed one. Not `Send`: the context
/// stack is per thread.
pub(crate) struct CtxGuard {
    pushed: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if !self.pushed {
            return;
        }
        // SAFETY: pops the context this guard pushed; the thread's stack is otherwise untouched
        // between push and pop by this crate. Failure cannot be acted on in drop.
        let _ = unsafe { driver::ctx::pop() };
    }
}
