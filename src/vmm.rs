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
//! - **Imported in chunks** ([`VmmMemory::import_chunks`]): the memory of another allocator that
//!   maps several physical allocations side by side in one range (PyTorch's expandable
//!   segments: one 20 MiB or 2 MiB allocation per chunk, see [`foreign`](crate::foreign)); each
//!   descriptor is imported and checked as above and mapped at its offset in one reserved range,
//!   so the importer sees the same contiguous bytes the exporter does.
//!
//! Either role tears down in the same order: `cuMemUnmap`, `cuMemAddressFree`, `cuMemRelease`.
//! The physical memory is freed by the driver only when every process has released its handle
//! and unmapped it, which is what makes an exporter's drop safe without waiting for importers:
//! their mappings keep the memory alive.

use std::ffi::c_uint;
use std::os::fd::{AsFd, OwnedFd};

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::{ArgumentDefect, Error, HandleDefect, Result, StateDefect};

/// Physical allocations mapped side by side in one range of one context (one allocation, but
/// for [`import_chunks`](VmmMemory::import_chunks); see the module docs).
pub(crate) struct VmmMemory {
    ctx: GpuContext,
    /// The ordinal, in this process, of the device that holds the memory.
    holder: u32,
    /// Each allocation and its bytes, in address order from `ptr` on; never empty.
    chunks: Vec<(sys::CUmemGenericAllocationHandle, usize)>,
    ptr: sys::CUdeviceptr,
    /// Bytes mapped: the sum of the chunks'.
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

/// Allocation handles imported so far, released on drop unless taken (an import that fails
/// half-way leaves none behind).
struct Imported(Vec<(sys::CUmemGenericAllocationHandle, usize)>);

impl Drop for Imported {
    fn drop(&mut self) {
        for &(handle, _) in &self.0 {
            // SAFETY: imported by `import_chunks`, not mapped (a failed map undid itself),
            // released once: `import_chunks` takes the list on success.
            let _ = unsafe { driver::vmm::release(handle) };
        }
    }
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
    map_chunks(ctx, &[(handle, size)], size, alignment, access)
}

/// [`map`] for allocations side by side: reserve `total` bytes (the chunks' sum), map each
/// chunk at its offset and give `ctx`'s device `access` to each; on failure nothing stays
/// reserved or mapped (the handles are the caller's). A context is current.
fn map_chunks(
    ctx: &GpuContext,
    chunks: &[(sys::CUmemGenericAllocationHandle, usize)],
    total: usize,
    alignment: usize,
    access: Access,
) -> Result<sys::CUdeviceptr> {
    let ptr = driver::vmm::address_reserve(total, alignment)?;
    let desc = access.for_device(ctx.device());
    let mut mapped: Vec<(sys::CUdeviceptr, usize)> = Vec::with_capacity(chunks.len());
    let mut at = ptr;
    let mut result = Ok(());
    for &(handle, size) in chunks {
        // SAFETY: `at..at+size` lies in the range reserved above (the sizes add up to
        // `total`), nothing mapped there yet; `handle` is a live allocation handle whose size
        // the driver checks against `size` (too large is an error code).
        result = unsafe { driver::vmm::map(at, size, handle) };
        if result.is_err() {
            break;
        }
        mapped.push((at, size));
        // SAFETY: the range is ours, mapped just above.
        result = unsafe { driver::vmm::set_access(at, size, &desc) };
        if result.is_err() {
            break;
        }
        at += size as u64;
    }
    if let Err(e) = result {
        for &(at, size) in &mapped {
            // SAFETY: mapped above, unmapped once, never handed out.
            let _ = unsafe { driver::vmm::unmap(at, size) };
        }
        // SAFETY: reserved above, freed once, nothing mapped in it any more.
        let _ = unsafe { driver::vmm::address_free(ptr, total) };
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
                chunks: vec![(handle, size)],
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
        Self::import_chunks(ctx, vec![(fd, size)], holder, access)
    }

    /// [`import`](Self::import) for several allocations mapped side by side: each
    /// `(descriptor, bytes)` in turn, from the start of one reserved range (module docs). Every
    /// descriptor is closed before this returns, whatever happens; on failure nothing stays
    /// imported, mapped or reserved.
    pub(crate) fn import_chunks(
        ctx: &GpuContext,
        chunks: Vec<(OwnedFd, usize)>,
        holder: u32,
        access: Access,
    ) -> Result<Self> {
        let _g = ctx.enter()?;
        let expected = driver::device::get(holder)?;
        let mut imported = Imported(Vec::with_capacity(chunks.len()));
        let mut gran = 0;
        for (fd, size) in chunks {
            let handle = driver::vmm::import_fd(fd.as_fd())?;
            // The driver holds its own reference now.
            drop(fd);
            imported.0.push((handle, size));
            let prop = driver::vmm::properties(handle)?;
            if prop.kind != sys::CU_MEM_ALLOCATION_TYPE_PINNED
                || prop.location.kind != sys::CU_MEM_LOCATION_TYPE_DEVICE
                || prop.location.id != expected
            {
                return Err(Error::corrupt_handle(HandleDefect::Memory {
                    detail: format!(
                        "the descriptor's memory (allocation type {}, location type {} id {}) is \
                         not pinned memory on device {expected}, where the handle says it is",
                        prop.kind, prop.location.kind, prop.location.id
                    ),
                }));
            }
            gran = granularity(&prop)?;
            if size == 0 || !size.is_multiple_of(gran) {
                return Err(Error::corrupt_handle(HandleDefect::Layout {
                    detail: format!(
                        "the handle maps {size} bytes, not a multiple of the allocation \
                         granularity {gran}"
                    ),
                }));
            }
        }
        let total = imported
            .0
            .iter()
            .try_fold(0usize, |sum, &(_, size)| sum.checked_add(size))
            .filter(|&t| t > 0 && t <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::corrupt_handle(HandleDefect::Layout {
                    detail: "the chunks' sizes add up to no mappable range".into(),
                })
            })?;
        let ptr = map_chunks(ctx, &imported.0, total, gran, access)?;
        Ok(Self {
            ctx: ctx.clone(),
            holder,
            chunks: std::mem::take(&mut imported.0),
            ptr,
            size: total,
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
        let desc = self.access.for_device(device);
        let mut at = self.ptr;
        for &(_, size) in &self.chunks {
            // SAFETY: our range, each chunk mapped from creation/import until drop (`&self`
            // keeps it); adding a device's access leaves every other device's as it was.
            unsafe { driver::vmm::set_access(at, size, &desc) }?;
            at += size as u64;
        }
        granted.push(device);
        Ok(())
    }

    /// A new descriptor for this allocation (`cuMemExportToShareableHandle`); the receiver
    /// imports it with [`import`](Self::import). Only memory this process created (one
    /// chunk) is exported again.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd> {
        let [(handle, _)] = self.chunks[..] else {
            // Only imports have several chunks, and an import is not exported again.
            return Err(Error::InvalidState {
                call: "VmmMemory::export_fd",
                state: crate::error::ObjectState::Imported,
            });
        };
        let _g = self.ctx.enter()?;
        // SAFETY: a live allocation of ours, created with the POSIX-fd handle type requested.
        unsafe { driver::vmm::export_fd(handle) }
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
            let mut at = self.ptr;
            for &(_, size) in &self.chunks {
                // SAFETY: mapped by create/import in this context, unmapped once, here.
                // No view is left (each holds this memory); work queued on it was its
                // callers' to finish (the calls that queue work are unsafe for that reason).
                let _ = unsafe { driver::vmm::unmap(at, size) };
                at += size as u64;
            }
            // SAFETY: reserved by create/import, freed once, after its mappings are gone.
            let _ = unsafe { driver::vmm::address_free(self.ptr, self.size) };
            for &(handle, _) in &self.chunks {
                // SAFETY: created or imported once, released once; the driver frees the
                // memory when no process maps or holds it any more.
                let _ = unsafe { driver::vmm::release(handle) };
            }
        }
    }
}
