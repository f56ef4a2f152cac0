//! Virtual memory management: physical allocations (create, release, export, import,
//! properties), address ranges (reserve, free) and mappings (map, unmap, access).

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{answer, check, sys};
use crate::error::Result;

/// The allocation granularity for `prop` (`cuMemGetAllocationGranularity`, minimum).
pub(crate) fn granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
    // SAFETY: reads `prop`, writes one size.
    answer("cuMemGetAllocationGranularity", 0, |g| unsafe {
        sys::cuMemGetAllocationGranularity(g, prop, sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    })
}

/// A physical allocation of `size` bytes as `prop` describes (`cuMemCreate`). Give it back
/// with [`release`].
pub(crate) fn create(
    size: usize,
    prop: &sys::CUmemAllocationProp,
) -> Result<sys::CUmemGenericAllocationHandle> {
    // SAFETY: reads `prop`, writes one allocation handle; a bad size is an error code.
    answer("cuMemCreate", 0, |handle| unsafe {
        sys::cuMemCreate(handle, size, prop, 0)
    })
}

forward! {
    /// Give back an allocation handle (`cuMemRelease`); the memory goes once nothing maps or
    /// holds it.
    ///
    /// # Safety
    ///
    /// `handle` came from [`create`] or [`import_fd`] and is released once, not used after.
    fn release(handle: sys::CUmemGenericAllocationHandle) => cuMemRelease as "cuMemRelease";
}

/// Reserve `size` bytes of device address space aligned to `alignment`
/// (`cuMemAddressReserve`). Give it back with [`address_free`].
pub(crate) fn address_reserve(size: usize, alignment: usize) -> Result<sys::CUdeviceptr> {
    // SAFETY: writes one address; any size and alignment are accepted or refused by code.
    answer("cuMemAddressReserve", 0, |ptr| unsafe {
        sys::cuMemAddressReserve(ptr, size, alignment, 0, 0)
    })
}

forward! {
    /// Give back an address range (`cuMemAddressFree`).
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` came from [`address_reserve`], holds no mapping any more, and is freed
    /// once.
    fn address_free(ptr: sys::CUdeviceptr, size: usize) => cuMemAddressFree as "cuMemAddressFree";
}

/// Map `handle`'s first `size` bytes at `ptr` (`cuMemMap`).
///
/// # Safety
///
/// `ptr..ptr + size` is a range of ours from [`address_reserve`] with nothing mapped in it;
/// `handle` is a live allocation handle (one too small for `size` is an error code).
pub(crate) unsafe fn map(
    ptr: sys::CUdeviceptr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: the caller's duty.
    check("cuMemMap", unsafe {
        sys::cuMemMap(ptr, size, 0, handle, 0)
    })
}

forward! {
    /// Unmap `ptr..ptr + size` (`cuMemUnmap`).
    ///
    /// # Safety
    ///
    /// The range was mapped by [`map`], is unmapped once, and no view of it is left and no
    /// queued work uses it.
    fn unmap(ptr: sys::CUdeviceptr, size: usize) => cuMemUnmap as "cuMemUnmap";
}

/// Grant `desc`'s access to the mapped range `ptr..ptr + size` (`cuMemSetAccess`).
///
/// # Safety
///
/// The range is mapped ([`map`]) and ours.
pub(crate) unsafe fn set_access(
    ptr: sys::CUdeviceptr,
    size: usize,
    desc: &sys::CUmemAccessDesc,
) -> Result<()> {
    // SAFETY: reads one access descriptor; the range is the caller's duty.
    check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(ptr, size, desc, 1)
    })
}

/// Export an allocation as a POSIX file descriptor (`cuMemExportToShareableHandle`), owned
/// by the caller (a negative one is an error: [`owned_fd`](super::owned_fd)).
///
/// # Safety
///
/// `handle` is a live allocation handle created with the POSIX-fd handle type requested.
pub(crate) unsafe fn export_fd(handle: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: writes one int, the POSIX-fd shareable type; the handle is the caller's duty.
    unsafe {
        export_shareable(
            (&raw mut fd).cast(),
            handle,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }?;
    // SAFETY: the driver opened this descriptor for us just now.
    unsafe { super::owned_fd("cuMemExportToShareableHandle", fd) }
}

/// Export an allocation as `handle_type` into `shareable` (`cuMemExportToShareableHandle`).
///
/// # Safety
///
/// `handle` is a live allocation handle created with `handle_type` requested, and
/// `shareable` points to writable storage of that type's size (an `int` for a POSIX fd, 64
/// bytes for a fabric handle).
pub(crate) unsafe fn export_shareable(
    shareable: *mut c_void,
    handle: sys::CUmemGenericAllocationHandle,
    handle_type: c_uint,
) -> Result<()> {
    // SAFETY: the caller's duty.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(shareable, handle, handle_type, 0)
    })
}

/// Import the allocation behind a POSIX file descriptor (`cuMemImportFromShareableHandle`).
/// The driver takes its own reference: the caller may close `fd` after. Give the handle back
/// with [`release`].
pub(crate) fn import_fd(fd: BorrowedFd<'_>) -> Result<sys::CUmemGenericAllocationHandle> {
    // SAFETY: writes one allocation handle; for a POSIX fd the shareable handle is the
    // descriptor's number, passed as a pointer-sized value and never dereferenced; `fd` is
    // open for the whole call. A descriptor that is not a CUDA allocation is an error code.
    answer("cuMemImportFromShareableHandle", 0, |handle| unsafe {
        sys::cuMemImportFromShareableHandle(
            handle,
            fd.as_raw_fd() as usize as *mut c_void,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })
}

/// The allocation handle of the memory mapped at `ptr`, any address of a `cuMemMap` mapping
/// (`cuMemRetainAllocationHandle`): a new reference, given back with [`release`].
pub(crate) fn retain(ptr: sys::CUdeviceptr) -> Result<sys::CUmemGenericAllocationHandle> {
    // SAFETY: writes one allocation handle; the address is passed as a value and never
    // dereferenced by us (an address that is not mapped virtual memory is an error code).
    answer("cuMemRetainAllocationHandle", 0, |handle| unsafe {
        sys::cuMemRetainAllocationHandle(handle, ptr as usize as *mut c_void)
    })
}

/// What an allocation handle is (`cuMemGetAllocationPropertiesFromHandle`).
pub(crate) fn properties(
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<sys::CUmemAllocationProp> {
    let mut prop = sys::CUmemAllocationProp {
        kind: 0,
        requested_handle_types: 0,
        location: sys::CUmemLocation { kind: 0, id: 0 },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    };
    // SAFETY: writes one property struct; an unknown handle is an error code.
    check("cuMemGetAllocationPropertiesFromHandle", unsafe {
        sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, handle)
    })?;
    Ok(prop)
}
