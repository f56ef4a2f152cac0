//! Virtual-memory allocations shared as POSIX file descriptors: the memory behind
//! [`HandleType::PosixFd`](crate::HandleType::PosixFd) buffers.
//!
//! One [`VmmMemory`] is one physical allocation mapped at a virtual range of one context, in
//! either role:
//!
//! - **Created** ([`VmmMemory::create`]): `cuMemCreate` (pinned to the context's device,
//!   requesting the POSIX-fd handle type; size rounded up to the minimum granularity), then
//!   `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess` (read-write for the context's
//!   device). [`VmmMemory::export_fd`] hands out a new descriptor per call
//!   (`cuMemExportToShareableHandle`).
//! - **Imported** ([`VmmMemory::import`]): `cuMemImportFromShareableHandle` on a received
//!   descriptor (closed right after: the driver holds its own reference), the allocation's
//!   properties checked (`cuMemGetAllocationPropertiesFromHandle`: pinned device memory on the
//!   device the envelope names), then reserve + map + access as above, for the importing
//!   context's device.
//!
//! A mapping is accessible to the devices it was granted to, not to every device of the
//! process: peer access (`cuCtxEnablePeerAccess`) does not reach virtual memory. Other devices
//! get the mapping's access with [`VmmMemory::grant`] (`cuMemSetAccess`), for as long as the
//! mapping exists.
//!
//! An import may be mapped **read-only** ([`Access::ReadOnly`]: `CU_MEM_ACCESS_FLAGS_PROT_READ`
//! for every device it is granted to). The GPU enforces it (measured on an H200, driver
//! 580.159.04): kernel reads return the data; a kernel write through the mapping faults
//! (`CUDA_ERROR_ILLEGAL_ADDRESS`, in the writing process only, whose context is then lost);
//! `cuMemsetD*` and `cuMemcpyHtoD` into it fail `CUDA_ERROR_INVALID_VALUE`; the data stays
//! intact for every other mapping.
//!
//! Either role tears down in the same order: `cuMemUnmap`, `cuMemAddressFree`, `cuMemRelease`.
//! The physical memory is freed by the driver only when every process has released its handle
//! and unmapped it, which is what makes an exporter's drop safe without waiting for importers:
//! their mappings keep the memory alive.

use std::ffi::c_uint;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::{ArgumentDefect, Error, HandleDefect, Result, StateDefect};

/// One physical allocation mapped in one context (see the module docs).
pub(crate) struct VmmMemory {
    ctx: GpuContext,
    /// The ordinal, in this process, of the device that holds the memory.
    holder: u32,
    handle: sys::CUmemGenericAllocationHandle,
    ptr: sys::CUdeviceptr,
    size: usize,
    /// How every device granted the mapping may access it.
    access: Access,
    /// Devices given access to the mapping after `ctx`'s own (see `grant`).
    granted: parking_lot::Mutex<Vec<sys::CUdevice>>,
}

// SAFETY: the fields are a context (Send + Sync), a driver handle and an address: plain values
// the driver accepts from any thread; teardown happens once, in Drop.
unsafe impl Send for VmmMemory {}
// SAFETY: as above; the one method that changes anything through `&self` (`grant`) does it
// under its lock, and the driver's access change is thread-safe.
unsafe impl Sync for VmmMemory {}

/// A location on device `dev`, for allocation, pool and access properties.
pub(crate) fn on_device(dev: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        kind: sys::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    }
}

/// Read-write access for device `dev`, for `cuMemSetAccess` and `cuMemPoolSetAccess`.
pub(crate) fn read_write(dev: sys::CUdevice) -> sys::CUmemAccessDesc {
    Access::ReadWrite.for_device(dev)
}

/// How a mapping may be accessed by the devices it is granted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Access {
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
    ReadWrite,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READ`: writes through the mapping fail or fault (module docs).
    ReadOnly,
}

impl Access {
    /// The access descriptor of device `dev`.
    pub(crate) fn for_device(self, dev: sys::CUdevice) -> sys::CUmemAccessDesc {
        sys::CUmemAccessDesc {
            location: on_device(dev),
            flags: match self {
                Self::ReadWrite => sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                Self::ReadOnly => sys::CU_MEM_ACCESS_FLAGS_PROT_READ,
            },
        }
    }
}

/// Properties of pinned memory on device `dev` exportable as `handle_type`
/// (`CU_MEM_HANDLE_TYPE_*`).
pub(crate) fn pinned_prop(dev: sys::CUdevice, handle_type: c_uint) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        kind: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: handle_type,
        location: on_device(dev),
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// The properties of a stream-ordered pool of pinned memory on `dev` whose allocations can be
/// exported as POSIX file descriptors (`cuMemPoolCreate`).
pub(crate) fn pool_props(dev: sys::CUdevice) -> sys::CUmemPoolProps {
    sys::CUmemPoolProps {
        alloc_type: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        handle_types: sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: on_device(dev),
        win32_security_attributes: std::ptr::null_mut(),
        max_size: 0,
        usage: 0,
        reserved: [0; 54],
    }
}

/// The minimum granularity of allocations described by `prop` (a context is current).
pub(crate) fn granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
    let g = driver::vmm::granularity(prop)?;
    if g == 0 || !g.is_power_of_two() {
        return Err(Error::Corrupt {
            what: "allocation granularity",
            defect: StateDefect::DriverAnswer {
                call: "cuMemGetAllocationGranularity",
                value: i64::try_from(g).unwrap_or(i64::MAX),
            },
        });
    }
    Ok(g)
}

/// Whether `ordinal`'s device can create virtual-memory allocations exportable as POSIX file
/// descriptors (the two device attributes; [`probe`](crate::probe::probe()) also tries one).
pub(crate) fn supports_posix_fd(dev: sys::CUdevice) -> Result<bool> {
    Ok(crate::driver::device::attribute(
        dev,
        sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    )? != 0
        && crate::driver::device::attribute(
            dev,
            sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        )? != 0)
}

/// Reserve `size` bytes of address space, map `handle` there and give `ctx`'s device
/// `access`; on failure nothing stays reserved or mapped (the handle is the caller's).
/// A context is current.
fn map(
    ctx: &GpuContext,
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
    alignment: usize,
    access: Access,
) -> Result<sys::CUdeviceptr> {
    let ptr = driver::vmm::address_reserve(size, alignment)?;
    // SAFETY: `ptr..ptr+size` was just reserved, nothing mapped in it; `handle` is a live
    // allocation handle whose size the driver checks against `size` (too large is an error
    // code).
    let mapped = unsafe { driver::vmm::map(ptr, size, handle) };
    let accessible = mapped.and_then(|()| {
        // SAFETY: the range is ours, mapped just above.
        let rc = unsafe { driver::vmm::set_access(ptr, size, &access.for_device(ctx.device())) };
        if rc.is_err() {
            // SAFETY: mapped above, unmapped once, never handed out.
            let _ = unsafe { driver::vmm::unmap(ptr, size) };
        }
        rc
    });
    if let Err(e) = accessible {
        // SAFETY: reserved above, freed once, nothing mapped in it any more.
        let _ = unsafe { driver::vmm::address_free(ptr, size) };
        return Err(e);
    }
    Ok(ptr)
}

impl VmmMemory {
    /// Allocate at least `bytes` on `ctx`'s device, exportable as a file descriptor, and map
    /// it read-write for that device.
    pub(crate) fn create(ctx: &GpuContext, bytes: usize) -> Result<Self> {
        let _g = ctx.enter()?;
        let prop = pinned_prop(ctx.device(), sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        let gran = granularity(&prop)?;
        let size = bytes
            .checked_next_multiple_of(gran)
            .filter(|&s| s <= isize::MAX as usize)
            .ok_or(Error::InvalidArgument {
                call: "IpcBuffer::new_with",
                defect: ArgumentDefect::AllocationSize {
                    len: bytes as u64,
                    elem_size: 1,
                },
            })?;
        let handle = driver::vmm::create(size, &prop)?;
        match map(ctx, handle, size, gran, Access::ReadWrite) {
            Ok(ptr) => Ok(Self {
                ctx: ctx.clone(),
                holder: ctx.ordinal(),
                handle,
                ptr,
                size,
                access: Access::ReadWrite,
                granted: parking_lot::Mutex::new(Vec::new()),
            }),
            Err(e) => {
                // SAFETY: created above, never mapped (map undid itself), released once.
                let _ = unsafe { driver::vmm::release(handle) };
                Err(e)
            }
        }
    }

    /// Import the allocation behind `fd` (received from its exporter), check that it is
    /// pinned memory on device `holder` (this process's ordinal of the device the envelope
    /// names), and map its first `size` bytes for `ctx`'s device with `access`. `fd` is
    /// closed before this returns, whatever happens.
    pub(crate) fn import(
        ctx: &GpuContext,
        fd: OwnedFd,
        size: usize,
        holder: u32,
        access: Access,
    ) -> Result<Self> {
        let _g = ctx.enter()?;
        let expected = driver::device::get(holder)?;
        let handle = driver::vmm::import_fd(fd.as_fd())?;
        // The driver holds its own reference now.
        drop(fd);
        let release = |e: Error| {
            // SAFETY: imported above, not mapped, released once.
            let _ = unsafe { driver::vmm::release(handle) };
            e
        };
        let prop = driver::vmm::properties(handle).map_err(release)?;
        if prop.kind != sys::CU_MEM_ALLOCATION_TYPE_PINNED
            || prop.location.kind != sys::CU_MEM_LOCATION_TYPE_DEVICE
            || prop.location.id != expected
        {
            return Err(release(Error::corrupt_handle(HandleDefect::Memory {
                detail: format!(
                    "the descriptor's memory (allocation type {}, location type {} id {}) is not \
                     pinned memory on device {expected}, where the handle says it is",
                    prop.kind, prop.location.kind, prop.location.id
                ),
            })));
        }
        let gran = granularity(&prop).map_err(release)?;
        if size == 0 || !size.is_multiple_of(gran) {
            return Err(release(Error::corrupt_handle(HandleDefect::Layout {
                detail: format!(
                    "the handle maps {size} bytes, not a multiple of the allocation \
                     granularity {gran}"
                ),
            })));
        }
        let ptr = map(ctx, handle, size, gran, access).map_err(release)?;
        Ok(Self {
            ctx: ctx.clone(),
            holder,
            handle,
            ptr,
            size,
            access,
            granted: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// Give `ctx`'s device the mapping's access (read-write, or read-only for a read-only
    /// import) to the whole mapping (`cuMemSetAccess`), if it
    /// has none yet: the device this memory was mapped for has it from the start, a device
    /// that cannot reach the memory's device is refused ([`Error::DeviceNotReachable`]), and a
    /// device granted once is not asked for again.
    pub(crate) fn grant(&self, ctx: &GpuContext) -> Result<()> {
        let device = ctx.device();
        if device == self.ctx.device() {
            return Ok(());
        }
        let mut granted = self.granted.lock();
        if granted.contains(&device) {
            return Ok(());
        }
        crate::device::check_peer(ctx.ordinal(), self.holder)?;
        let _g = self.ctx.enter()?;
        // SAFETY: our range, mapped from creation/import until drop (`&self` keeps it);
        // adding a device's access leaves every other device's as it was.
        unsafe { driver::vmm::set_access(self.ptr, self.size, &self.access.for_device(device)) }?;
        granted.push(device);
        Ok(())
    }

    /// A new descriptor for this allocation (`cuMemExportToShareableHandle`); the receiver
    /// imports it with [`import`](Self::import).
    pub(crate) fn export_fd(&self) -> Result<OwnedFd> {
        let _g = self.ctx.enter()?;
        // SAFETY: a live allocation of ours, created with the POSIX-fd handle type requested.
        let fd = unsafe { driver::vmm::export_fd(self.handle) }?;
        if fd < 0 {
            return Err(Error::Corrupt {
                what: "exported descriptor",
                defect: StateDefect::DriverAnswer {
                    call: "cuMemExportToShareableHandle",
                    value: fd.into(),
                },
            });
        }
        // SAFETY: the driver opened this descriptor for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The mapped address.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Bytes mapped (a multiple of the granularity).
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

impl Drop for VmmMemory {
    fn drop(&mut self) {
        // Drop cannot report failures; each step runs even if an earlier one failed, so a
        // failing unmap leaks at most the address range, never touches memory of others.
        if let Ok(_g) = self.ctx.enter() {
            // SAFETY: mapped by create/import in this context, unmapped once, here.
            // No view is left (each holds this memory); work queued on it was its callers' to
            // finish (the calls that queue work are unsafe for that reason).
            let _ = unsafe { driver::vmm::unmap(self.ptr, self.size) };
            // SAFETY: reserved by create/import, freed once, after its mapping is gone.
            let _ = unsafe { driver::vmm::address_free(self.ptr, self.size) };
            // SAFETY: created or imported once, released once; the driver frees the memory
            // when no process maps or holds it any more.
            let _ = unsafe { driver::vmm::release(self.handle) };
        }
    }
}
