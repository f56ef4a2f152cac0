//! Contexts: a device's primary context (retain, release) and this thread's current context
//! (get, set, push, pop), and peer access between contexts.

use std::ptr;

use super::{answer, check, sys};
use crate::error::Result;

/// Retain `dev`'s primary context (`cuDevicePrimaryCtxRetain`), creating it on the first retain
/// in this process. Give it back with [`primary_release`].
pub(crate) fn primary_retain(dev: sys::CUdevice) -> Result<sys::CUcontext> {
    // SAFETY: writes one CUcontext; an invalid device is an error code.
    answer("cuDevicePrimaryCtxRetain", ptr::null_mut(), |ctx| unsafe {
        sys::cuDevicePrimaryCtxRetain(ctx, dev)
    })
}

/// Give back one retain of `dev`'s primary context (`cuDevicePrimaryCtxRelease`); the last
/// one destroys it.
///
/// # Safety
///
/// The caller took the retain with [`primary_retain`] and gives it back once: a release
/// without a retain would destroy a context that others still use.
pub(crate) unsafe fn primary_release(dev: sys::CUdevice) -> Result<()> {
    // SAFETY: one retain of ours given back (the caller's duty).
    check("cuDevicePrimaryCtxRelease", unsafe {
        sys::cuDevicePrimaryCtxRelease_v2(dev)
    })
}

/// The context current on this thread, if any (`cuCtxGetCurrent`; an error counts as none).
pub(crate) fn current() -> Option<sys::CUcontext> {
    let mut ctx = ptr::null_mut();
    // SAFETY: writes one CUcontext (null when none is current).
    let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    (rc == sys::CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

/// Make `ctx` current on this thread, replacing the top of its context stack
/// (`cuCtxSetCurrent`).
///
/// # Safety
///
/// `ctx` is a live context and stays so while it is current on this thread.
pub(crate) unsafe fn set_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: a live context (the caller's duty).
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// Push `ctx` on this thread's context stack (`cuCtxPushCurrent`).
///
/// # Safety
///
/// `ctx` is a live context; the caller pops it again ([`pop`]) on this thread, with nothing
/// of its own left pushed above it.
pub(crate) unsafe fn push(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: a live context, popped by the caller (the caller's duty).
    check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })
}

/// Pop the context on top of this thread's stack (`cuCtxPopCurrent`).
///
/// # Safety
///
/// The caller pushed that context ([`push`]) on this thread.
pub(crate) unsafe fn pop() -> Result<()> {
    let mut popped = ptr::null_mut();
    // SAFETY: pops what the caller pushed; writes one CUcontext.
    check("cuCtxPopCurrent", unsafe {
        sys::cuCtxPopCurrent_v2(&mut popped)
    })
}

/// The device of the current context (`cuCtxGetDevice`).
#[cfg(any(feature = "cust", feature = "cudarc"))]
pub(crate) fn current_device() -> Result<sys::CUdevice> {
    // SAFETY: writes one CUdevice; without a current context, an error code.
    answer("cuCtxGetDevice", 0, |dev| unsafe {
        sys::cuCtxGetDevice(dev)
    })
}

/// Block until every stream of the current context has finished the work queued on it so
/// far (`cuCtxSynchronize`).
pub(crate) fn synchronize() -> Result<()> {
    // SAFETY: no arguments; without a current context, an error code.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// Let the current context access memory of `peer`'s device (`cuCtxEnablePeerAccess`);
/// already enabled is success.
///
/// # Safety
///
/// `peer` is a live context.
pub(crate) unsafe fn enable_peer_access(peer: sys::CUcontext) -> Result<()> {
    // SAFETY: a live context (the caller's duty); flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer, 0) } {
        sys::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        rc => check("cuCtxEnablePeerAccess", rc),
    }
}
