//! Streams: create, destroy, synchronize, wait for events, and 64-bit stream memory
//! operations.

use std::ffi::c_uint;
use std::ptr;

use super::{answer, check, sys};
use crate::error::Result;

/// A new stream in the current context that does not synchronise with the legacy default
/// stream (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`). Destroy it with [`destroy`].
pub(crate) fn create_non_blocking() -> Result<sys::CUstream> {
    // SAFETY: writes one stream handle; fails cleanly without a current context.
    answer("cuStreamCreate", ptr::null_mut(), |stream| unsafe {
        sys::cuStreamCreate(stream, sys::CU_STREAM_NON_BLOCKING)
    })
}

forward! {
    /// Destroy a stream from [`create_non_blocking`] (`cuStreamDestroy`); work queued on it
    /// still runs.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context, destroyed once and not used after.
    fn destroy(stream: sys::CUstream) => cuStreamDestroy_v2 as "cuStreamDestroy";
}

forward! {
    /// Block until the work queued on `stream` has completed (`cuStreamSynchronize`; a null
    /// stream is the current context's legacy default stream).
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context, or null with a context current.
    fn synchronize(stream: sys::CUstream) => cuStreamSynchronize as "cuStreamSynchronize";
}

/// Make `stream` wait for `event`'s last record (`cuStreamWaitEvent`).
///
/// # Safety
///
/// `stream` and `event` are live (the stream of the current context, or a default-stream
/// handle).
pub(crate) unsafe fn wait_event(stream: sys::CUstream, event: sys::CUevent) -> Result<()> {
    // SAFETY: the caller's duty; flags must be 0.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(stream, event, 0)
    })
}

forward! {
    /// Enqueue "write `value` to the 8-byte word at `addr`" on `stream` (`cuStreamWriteValue64`).
    ///
    /// # Safety
    ///
    /// `addr` is an 8-byte aligned device word the caller may write, mapped until the write has
    /// run; `stream` is live (of the current context, or a default-stream handle).
    fn write_value64(stream: sys::CUstream, addr: sys::CUdeviceptr, value: u64, flags: c_uint) => cuStreamWriteValue64_v2 as "cuStreamWriteValue64";
}

forward! {
    /// Enqueue "wait until the 8-byte word at `addr` satisfies `flags` against `value`" on
    /// `stream` (`cuStreamWaitValue64`).
    ///
    /// # Safety
    ///
    /// As [`write_value64`], the word read rather than written.
    fn wait_value64(stream: sys::CUstream, addr: sys::CUdeviceptr, value: u64, flags: c_uint) => cuStreamWaitValue64_v2 as "cuStreamWaitValue64";
}

/// Enqueue `ops` on `stream` as one batch (`cuStreamBatchMemOp`).
///
/// # Safety
///
/// Every address in `ops` is as [`write_value64`] requires for its operation; `stream` is
/// live.
pub(crate) unsafe fn batch_mem_op(
    stream: sys::CUstream,
    ops: &mut [sys::CUstreamMemOpValue64],
) -> Result<()> {
    let count = c_uint::try_from(ops.len()).unwrap_or(c_uint::MAX);
    // SAFETY: `ops` holds `count` operations (the driver reads them during the call); the
    // addresses are the caller's duty.
    check("cuStreamBatchMemOp", unsafe {
        sys::cuStreamBatchMemOp_v2(stream, count, ops.as_mut_ptr(), 0)
    })
}

/// The stream's process-unique id (`cuStreamGetId`), or `None` where the driver cannot say
/// (older than CUDA 12.0, or the call failed): callers then assume a different stream. Unlike
/// the handle, the id of a destroyed stream is never given to a new one.
pub(crate) fn id(stream: sys::CUstream) -> Option<u64> {
    let mut id = 0u64;
    // SAFETY: writes one integer; `stream` is a live stream of the current context (or one of
    // the default-stream handles), as every caller's borrow guarantees.
    let rc = unsafe { sys::cuStreamGetId(stream, &mut id) };
    (rc == sys::CUDA_SUCCESS).then_some(id)
}
