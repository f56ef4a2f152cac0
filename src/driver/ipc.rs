//! Legacy IPC handles: export and open device memory and events across processes.

use std::ptr;

use super::{answer, sys};
use crate::error::Result;

/// The legacy IPC handle of a `cuMemAlloc` allocation (`cuIpcGetMemHandle`).
///
/// # Safety
///
/// `ptr` is a live `cuMemAlloc` allocation of the current context (pool and virtual-memory
/// allocations are refused by the driver with an error code, but the pointer must still be
/// one the caller owns).
pub(crate) unsafe fn get_mem_handle(ptr: sys::CUdeviceptr) -> Result<[u8; 64]> {
    let h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: writes 64 bytes; the pointer is the caller's duty.
    answer("cuIpcGetMemHandle", h, |h| unsafe {
        sys::cuIpcGetMemHandle(h, ptr)
    })
    .map(|h| h.reserved)
}

/// Map another process's memory by its legacy handle in the current context
/// (`cuIpcOpenMemHandle`, with lazy peer access). Close it with [`close_mem_handle`].
pub(crate) fn open_mem_handle(handle: [u8; 64]) -> Result<sys::CUdeviceptr> {
    // SAFETY: writes one device pointer; the handle bytes are passed by value and the driver
    // validates them (a forged handle is an error code, not UB).
    answer("cuIpcOpenMemHandle", 0, |ptr| unsafe {
        sys::cuIpcOpenMemHandle_v2(
            ptr,
            sys::CUipcHandle { reserved: handle },
            sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
        )
    })
}

forward! {
    /// Unmap memory opened with [`open_mem_handle`] (`cuIpcCloseMemHandle`), in its context
    /// (current).
    ///
    /// # Safety
    ///
    /// `ptr` came from [`open_mem_handle`] in the current context and is closed once, with no
    /// view of it left and no queued work that uses it.
    fn close_mem_handle(ptr: sys::CUdeviceptr) => cuIpcCloseMemHandle as "cuIpcCloseMemHandle";
}

/// The IPC handle of an interprocess event (`cuIpcGetEventHandle`).
///
/// # Safety
///
/// `event` is a live event of the current context, created with `CU_EVENT_INTERPROCESS`.
pub(crate) unsafe fn get_event_handle(event: sys::CUevent) -> Result<[u8; 64]> {
    let h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: writes 64 bytes; the event is the caller's duty.
    answer("cuIpcGetEventHandle", h, |h| unsafe {
        sys::cuIpcGetEventHandle(h, event)
    })
    .map(|h| h.reserved)
}

/// Open another process's event by its IPC handle in the current context
/// (`cuIpcOpenEventHandle`). Destroy it with [`super::event::destroy`].
pub(crate) fn open_event_handle(handle: [u8; 64]) -> Result<sys::CUevent> {
    // SAFETY: writes one event handle; the driver validates the handle bytes.
    answer("cuIpcOpenEventHandle", ptr::null_mut(), |event| unsafe {
        sys::cuIpcOpenEventHandle(event, sys::CUipcHandle { reserved: handle })
    })
}
