//! Stream-ordered memory pools: create, destroy, share as a file descriptor, grant access,
//! allocate and free on a stream, and export and import single allocations.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;

use super::{answer, check, sys};
use crate::error::Result;

/// A new pool as `props` describes (`cuMemPoolCreate`). Destroy it with [`destroy`].
pub(crate) fn create(props: &sys::CUmemPoolProps) -> Result<sys::CUmemoryPool> {
    // SAFETY: reads `props`, writes one pool handle.
    answer("cuMemPoolCreate", ptr::null_mut(), |pool| unsafe {
        sys::cuMemPoolCreate(pool, props)
    })
}

forward! {
    /// Destroy a pool (`cuMemPoolDestroy`); the driver defers the release while allocations from
    /// it are outstanding.
    ///
    /// # Safety
    ///
    /// `pool` is a live pool (created or imported by the caller), destroyed once, not used after.
    fn destroy(pool: sys::CUmemoryPool) => cuMemPoolDestroy as "cuMemPoolDestroy";
}

/// Share a pool as a POSIX file descriptor (`cuMemPoolExportToShareableHandle`), owned by the
/// caller (a negative one is an error: [`owned_fd`](super::owned_fd)).
///
/// # Safety
///
/// `pool` is a live pool created with the POSIX-fd handle type.
pub(crate) unsafe fn export_fd(pool: sys::CUmemoryPool) -> Result<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: writes one int (the POSIX-fd shareable type); the pool is the caller's duty.
    check("cuMemPoolExportToShareableHandle", unsafe {
        sys::cuMemPoolExportToShareableHandle(
            (&raw mut fd).cast(),
            pool,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    // SAFETY: the driver opened this descriptor for us just now.
    unsafe { super::owned_fd("cuMemPoolExportToShareableHandle", fd) }
}

/// Import a pool shared as a POSIX file descriptor (`cuMemPoolImportFromShareableHandle`);
/// the caller may close `fd` after. Destroy it with [`destroy`].
pub(crate) fn import_fd(fd: BorrowedFd<'_>) -> Result<sys::CUmemoryPool> {
    // SAFETY: for a POSIX fd the shareable handle is the descriptor's number, passed as a
    // pointer-sized value and never dereferenced; `fd` is open for the call. A descriptor
    // that is not a pool is an error code.
    answer(
        "cuMemPoolImportFromShareableHandle",
        ptr::null_mut(),
        |pool| unsafe {
            sys::cuMemPoolImportFromShareableHandle(
                pool,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
    )
}

/// Grant `desc`'s access to a pool's memory (`cuMemPoolSetAccess`).
///
/// # Safety
///
/// `pool` is a live pool.
pub(crate) unsafe fn set_access(
    pool: sys::CUmemoryPool,
    desc: &sys::CUmemAccessDesc,
) -> Result<()> {
    // SAFETY: reads one access descriptor; the pool is the caller's duty.
    check("cuMemPoolSetAccess", unsafe {
        sys::cuMemPoolSetAccess(pool, desc, 1)
    })
}

/// The access `location` has to a pool's memory (`cuMemPoolGetAccess`): one of the
/// `CU_MEM_ACCESS_FLAGS_PROT_*` values.
///
/// # Safety
///
/// `pool` is a live pool.
pub(crate) unsafe fn access(pool: sys::CUmemoryPool, location: &sys::CUmemLocation) -> Result<u32> {
    let mut flags = 0;
    let mut location = *location;
    // SAFETY: writes one flags word; reads the location (the driver's prototype is not
    // `const`, hence the copy); the pool is the caller's duty.
    check("cuMemPoolGetAccess", unsafe {
        sys::cuMemPoolGetAccess(&mut flags, pool, &mut location)
    })?;
    Ok(flags)
}

/// Enqueue an allocation of `bytes` from `pool` on `stream` (`cuMemAllocFromPoolAsync`).
///
/// # Safety
///
/// `pool` is a live pool and `stream` a live stream of the current context (or a
/// default-stream handle).
pub(crate) unsafe fn alloc_async(
    bytes: usize,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
) -> Result<sys::CUdeviceptr> {
    // SAFETY: writes one device pointer; pool and stream are the caller's duty.
    answer("cuMemAllocFromPoolAsync", 0, |ptr| unsafe {
        sys::cuMemAllocFromPoolAsync(ptr, bytes, pool, stream)
    })
}

forward! {
    /// Enqueue freeing a pool allocation on `stream` (`cuMemFreeAsync`).
    ///
    /// # Safety
    ///
    /// As [`super::mem::free`] for `ptr`, ordered after the work on `stream`; `stream` is live.
    fn free_async(ptr: sys::CUdeviceptr, stream: sys::CUstream) => cuMemFreeAsync as "cuMemFreeAsync";
}

/// The data that names one allocation of an exportable pool to its importers
/// (`cuMemPoolExportPointer`).
///
/// # Safety
///
/// `ptr` is a live allocation of ours from a pool created with a shareable handle type, its
/// allocation complete.
pub(crate) unsafe fn export_pointer(ptr: sys::CUdeviceptr) -> Result<[u8; 64]> {
    let h = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: writes 64 bytes; the allocation is the caller's duty.
    answer("cuMemPoolExportPointer", h, |h| unsafe {
        sys::cuMemPoolExportPointer(h, ptr)
    })
    .map(|h| h.reserved)
}

/// Open an allocation of an imported pool by its export data (`cuMemPoolImportPointer`).
/// Free it with [`super::mem::free`] before the owner frees it.
///
/// # Safety
///
/// `pool` is a live pool imported with [`import_fd`].
pub(crate) unsafe fn import_pointer(
    pool: sys::CUmemoryPool,
    data: [u8; 64],
) -> Result<sys::CUdeviceptr> {
    let mut ptr = 0;
    let mut data = sys::CUmemPoolPtrExportData { reserved: data };
    // SAFETY: writes one device pointer; the driver validates the 64 bytes against the pool
    // (forged ones are an error code); the pool is the caller's duty.
    check("cuMemPoolImportPointer", unsafe {
        sys::cuMemPoolImportPointer(&mut ptr, pool, &mut data)
    })?;
    Ok(ptr)
}
