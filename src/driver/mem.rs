//! Device memory: allocation, free, copies, memsets, what the driver knows about a pointer,
//! and page-locked host memory.

use std::ffi::{c_int, c_void};

use super::{answer, check, sys};
use crate::error::{Error, Result, StateDefect};

/// Allocate `bytes` of device memory in the current context (`cuMemAlloc`).
pub(crate) fn alloc(bytes: usize) -> Result<sys::CUdeviceptr> {
    // SAFETY: writes one device pointer; a zero size or no current context is an error code.
    answer("cuMemAlloc", 0, |ptr| unsafe {
        sys::cuMemAlloc_v2(ptr, bytes)
    })
}

forward! {
    /// Free memory from [`alloc`] or from a pool (`cuMemFree`), in its context (current).
    ///
    /// # Safety
    ///
    /// `ptr` is an allocation of the current context that the caller owns and frees once, with
    /// no view of it left and no queued work that uses it.
    fn free(ptr: sys::CUdeviceptr) => cuMemFree_v2 as "cuMemFree";
}

/// The allocation `ptr` lies in: its base and size (`cuPointerGetAttributes` with
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` and `_RANGE_SIZE`: the answer of
/// `cuMemGetAddressRange` in half its time, ~50 against ~95 ns on an H200 host).
/// `cuPointerGetAttributes` answers a pointer the driver does not know with zeros and success;
/// that zero size is an error here, as `cuMemGetAddressRange` makes it one.
pub(crate) fn address_range(ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize)> {
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    let mut which = [
        sys::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 2] = [
        (&raw mut base).cast::<c_void>(),
        (&raw mut size).cast::<c_void>(),
    ];
    // SAFETY: two attributes, each written to the slot of its type (a CUdeviceptr, a size_t);
    // any pointer value is accepted.
    check("cuPointerGetAttributes", unsafe {
        sys::cuPointerGetAttributes(2, which.as_mut_ptr(), data.as_mut_ptr(), ptr)
    })?;
    if size == 0 {
        return Err(Error::Corrupt {
            what: "device pointer",
            defect: StateDefect::DriverAnswer {
                call: "cuPointerGetAttributes(CU_POINTER_ATTRIBUTE_RANGE_SIZE)",
                value: 0,
            },
        });
    }
    Ok((base, size))
}

/// The ordinal of the device holding the memory at `ptr` (`cuPointerGetAttribute`,
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
pub(crate) fn device_ordinal_of(ptr: sys::CUdeviceptr) -> Result<c_int> {
    let mut ordinal: c_int = -1;
    // SAFETY: writes one int, the size of the attribute asked; any pointer value is accepted.
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute(
            (&raw mut ordinal).cast(),
            sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    })?;
    Ok(ordinal)
}

/// One attribute of the memory at `ptr` whose value fits 64 bits — a flag, a bit mask, a size
/// or an address (`cuPointerGetAttribute`; the driver writes the attribute's own width into
/// a zeroed `u64`, which reads the same on this little-endian target).
pub(crate) fn attribute(ptr: sys::CUdeviceptr, attribute: c_int) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: writes at most 8 bytes (every attribute this is called with is a bool, an int,
    // a size_t or a pointer) into a `u64`; any pointer value is accepted.
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute((&raw mut value).cast(), attribute, ptr)
    })?;
    Ok(value)
}

forward! {
    /// Copy `bytes` from host `src` to device `dst` (`cuMemcpyHtoD`).
    ///
    /// # Safety
    ///
    /// `src` is readable for `bytes` bytes; `dst..dst + bytes` is device memory the caller may
    /// write.
    fn copy_htod(dst: sys::CUdeviceptr, src: *const c_void, bytes: usize) => cuMemcpyHtoD_v2 as "cuMemcpyHtoD";
}

forward! {
    /// Copy `bytes` from device `src` to host `dst` (`cuMemcpyDtoH`).
    ///
    /// # Safety
    ///
    /// `dst` is writable for `bytes` bytes, and any bytes are valid there; `src..src + bytes` is
    /// device memory.
    fn copy_dtoh(dst: *mut c_void, src: sys::CUdeviceptr, bytes: usize) => cuMemcpyDtoH_v2 as "cuMemcpyDtoH";
}

forward! {
    /// Enqueue a copy of `bytes` from host `src` to device `dst` on `stream`
    /// (`cuMemcpyHtoDAsync`).
    ///
    /// # Safety
    ///
    /// As [`copy_htod`], for as long as the copy runs; `stream` is a live stream of the current
    /// context (or a default-stream handle).
    fn copy_htod_async(dst: sys::CUdeviceptr, src: *const c_void, bytes: usize, stream: sys::CUstream) => cuMemcpyHtoDAsync_v2 as "cuMemcpyHtoDAsync";
}

forward! {
    /// Enqueue a copy of `bytes` from device `src` to host `dst` on `stream`
    /// (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    ///
    /// As [`copy_dtoh`], for as long as the copy runs (and nothing else touches `dst`);
    /// `stream` is a live stream of the current context (or a default-stream handle).
    fn copy_dtoh_async(dst: *mut c_void, src: sys::CUdeviceptr, bytes: usize, stream: sys::CUstream) => cuMemcpyDtoHAsync_v2 as "cuMemcpyDtoHAsync";
}

forward! {
    /// Enqueue a device-to-device copy of `bytes` on `stream` (`cuMemcpyDtoDAsync`).
    ///
    /// # Safety
    ///
    /// Both ranges are device memory, `dst` the caller's to write, for as long as the copy
    /// runs; `stream` is a live stream of the current context (or a default-stream handle).
    fn copy_dtod_async(dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize, stream: sys::CUstream) => cuMemcpyDtoDAsync_v2 as "cuMemcpyDtoDAsync";
}

forward! {
    /// Set `bytes` bytes at `dst` to `value` (`cuMemsetD8`, on the legacy default stream: it may
    /// return before the device is done).
    ///
    /// # Safety
    ///
    /// `dst..dst + bytes` is device memory the caller may write.
    fn set_bytes(dst: sys::CUdeviceptr, value: u8, bytes: usize) => cuMemsetD8_v2 as "cuMemsetD8";
}

forward! {
    /// Enqueue setting `bytes` bytes at `dst` to `value` on `stream` (`cuMemsetD8Async`).
    ///
    /// # Safety
    ///
    /// As [`set_bytes`], for as long as the memset runs; `stream` is a live stream of the
    /// current context (or a default-stream handle).
    fn set_bytes_async(dst: sys::CUdeviceptr, value: u8, bytes: usize, stream: sys::CUstream) => cuMemsetD8Async as "cuMemsetD8Async";
}

/// Allocate `bytes` of page-locked host memory in the current context (`cuMemAllocHost`).
pub(crate) fn alloc_host(bytes: usize) -> Result<*mut c_void> {
    // SAFETY: writes one host pointer.
    answer("cuMemAllocHost", std::ptr::null_mut(), |p| unsafe {
        sys::cuMemAllocHost_v2(p, bytes)
    })
}

forward! {
    /// Free memory from [`alloc_host`] (`cuMemFreeHost`).
    ///
    /// # Safety
    ///
    /// `p` came from [`alloc_host`], is freed once, and no copy into or out of it is queued.
    fn free_host(p: *mut c_void) => cuMemFreeHost as "cuMemFreeHost";
}
