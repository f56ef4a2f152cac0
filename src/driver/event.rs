//! Events: create, record, query, synchronize, destroy.

use std::ffi::c_uint;
use std::ptr;

use super::{answer, check, sys};
use crate::error::Result;

/// A new event in the current context with `flags` (`cuEventCreate`).
pub(crate) fn create(flags: c_uint) -> Result<sys::CUevent> {
    // SAFETY: writes one event handle; without a current context, an error code.
    answer("cuEventCreate", ptr::null_mut(), |event| unsafe {
        sys::cuEventCreate(event, flags)
    })
}

forward! {
    /// Destroy an event (`cuEventDestroy`), in its context (current). Destroying an event a
    /// stream has yet to reach is allowed: the driver releases it when reached.
    ///
    /// # Safety
    ///
    /// `event` is a live event of the current context, destroyed once and not used after.
    fn destroy(event: sys::CUevent) => cuEventDestroy_v2 as "cuEventDestroy";
}

forward! {
    /// Record `event` on `stream` (`cuEventRecord`).
    ///
    /// # Safety
    ///
    /// `event` is a live event and `stream` a live stream (or a default-stream handle), both of
    /// the current context.
    fn record(event: sys::CUevent, stream: sys::CUstream) => cuEventRecord as "cuEventRecord";
}

/// Whether the work before `event`'s last record has completed (`cuEventQuery`).
///
/// # Safety
///
/// `event` is a live event.
pub(crate) unsafe fn query(event: sys::CUevent) -> Result<bool> {
    // SAFETY: the caller's duty.
    match unsafe { sys::cuEventQuery(event) } {
        sys::CUDA_SUCCESS => Ok(true),
        sys::CUDA_ERROR_NOT_READY => Ok(false),
        rc => check("cuEventQuery", rc).map(|()| false),
    }
}

forward! {
    /// Block until the work before `event`'s last record has completed (`cuEventSynchronize`).
    ///
    /// # Safety
    ///
    /// `event` is a live event.
    fn synchronize(event: sys::CUevent) => cuEventSynchronize as "cuEventSynchronize";
}
