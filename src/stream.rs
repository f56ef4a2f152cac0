//! [`AsStream`]: the streams this crate enqueues work on — cust's, cudarc's, or a raw
//! `CUstream` — without tying the API to one CUDA crate.

use std::sync::Arc;

use crate::driver::sys;

/// A CUDA stream that this crate's asynchronous methods can enqueue work on.
///
/// Implemented for cust's `Stream` (feature `cust`), cudarc's `CudaStream`
/// (feature `cudarc`), a raw handle wrapped in [`RawStream`], and references and `Arc`s of
/// any of them, so a call site passes what it has: `&stream` for a cust stream, `&stream` for
/// cudarc's `Arc<CudaStream>`.
///
/// The stream must belong to the context of the object the work is for (the driver refuses
/// a stream of another context with `CUDA_ERROR_INVALID_HANDLE` or
/// `CUDA_ERROR_INVALID_CONTEXT`).
///
/// # Safety
///
/// [`as_cu_stream`](Self::as_cu_stream) must return a stream handle that stays valid (created
/// and not destroyed) while `self` is borrowed, or null for the legacy default stream of the
/// current context.
///
/// # Examples
///
/// ```no_run
/// # #[cfg(feature = "cust")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use cuda_ipc::{AsStream, GpuContext, IpcBuffer};
/// use cust::stream::{Stream, StreamFlags};
///
/// let ctx = GpuContext::new(0)?;
/// let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
/// let buf = IpcBuffer::<u8>::zeroed(&ctx, 4096)?;
/// // SAFETY: the stream is synchronised before `buf` drops.
/// unsafe { buf.memset_bytes_async(0xff, &stream)? };
/// stream.synchronize()?;
/// # Ok(()) }
/// # #[cfg(not(feature = "cust"))]
/// # fn main() {}
/// ```
pub unsafe trait AsStream {
    /// The raw `CUstream` handle.
    fn as_cu_stream(&self) -> sys::CUstream;
}

// SAFETY: forwards to `S`, whose handle stays valid while `S` (borrowed through `self`) is.
unsafe impl<S: AsStream + ?Sized> AsStream for &S {
    fn as_cu_stream(&self) -> sys::CUstream {
        (**self).as_cu_stream()
    }
}

// SAFETY: forwards to `S`, kept alive by the `Arc` borrowed through `self`.
unsafe impl<S: AsStream + ?Sized> AsStream for Arc<S> {
    fn as_cu_stream(&self) -> sys::CUstream {
        (**self).as_cu_stream()
    }
}

/// A raw `CUstream` handle from elsewhere (another CUDA library, C code), or the legacy
/// default stream.
///
/// # Examples
///
/// ```
/// use cuda_ipc::{AsStream, RawStream};
///
/// assert!(RawStream::LEGACY.as_cu_stream().is_null());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RawStream(sys::CUstream);

// SAFETY: a CUstream handle may be used from any thread (the driver API is thread-safe); the
// value is an opaque handle, never dereferenced here.
unsafe impl Send for RawStream {}
// SAFETY: as for `Send`: shared use only passes the handle to the driver.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// The legacy default stream (`NULL`) of whatever context is current when work is
    /// enqueued: it synchronises with every blocking stream of that context.
    pub const LEGACY: Self = Self(std::ptr::null_mut());

    /// Wrap a raw handle.
    ///
    /// # Safety
    ///
    /// `stream` must be a stream handle (or null) that stays valid — not destroyed — for as
    /// long as the `RawStream` or any copy of it is used.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::RawStream;
    ///
    /// // SAFETY: null is the legacy stream, always valid.
    /// let legacy = unsafe { RawStream::from_raw(std::ptr::null_mut()) };
    /// # let _ = legacy;
    /// ```
    pub const unsafe fn from_raw(stream: sys::CUstream) -> Self {
        Self(stream)
    }
}

// SAFETY: the handle's validity is what `from_raw`'s caller vouched for.
unsafe impl AsStream for RawStream {
    fn as_cu_stream(&self) -> sys::CUstream {
        self.0
    }
}
