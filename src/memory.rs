//! The memory beneath buffers, arenas and pools, with none of their bookkeeping: the export
//! generations every exporter draws from, the size rule of every allocation, and what the
//! driver says of memory this process maps (its bytes, its device) — the checks that hold a
//! peer's word to the driver's.

use std::sync::atomic::AtomicU64;

use crate::context::GpuContext;
use crate::device;
use crate::driver::{self, sys};
use crate::error::{ArgumentDefect, Error, HandleDefect, Result, StateDefect};

/// Export generations of this process, one per exported buffer or event.
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The bytes of an allocation of `len` `T`s, for `call` (which allocates): more than 0 and at
/// most `isize::MAX`, else [`ArgumentDefect::AllocationSize`].
pub(crate) fn allocation_bytes<T>(call: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b > 0 && b <= isize::MAX as usize)
        .ok_or(Error::InvalidArgument {
            call,
            defect: ArgumentDefect::AllocationSize {
                len: len as u64,
                elem_size: std::mem::size_of::<T>() as u64,
            },
        })
}

/// Map a legacy handle's memory in `ctx` (`cuIpcOpenMemHandle`) and hold it to `check`, given
/// the address and the bytes the driver mapped from it (`cuPointerGetAttributes`); returns
/// both. On an error nothing stays mapped.
pub(crate) fn map_legacy(
    ctx: &GpuContext,
    handle: [u8; 64],
    check: impl FnOnce(sys::CUdeviceptr, usize) -> Result<()>,
) -> Result<(sys::CUdeviceptr, usize)> {
    let _g = ctx.enter()?;
    let ptr = driver::ipc::open_mem_handle(handle)?;
    let mapped = mapped_bytes(ptr).and_then(|mapped| check(ptr, mapped).map(|()| mapped));
    if mapped.is_err() {
        // SAFETY: opened just above in this context, closed once, never handed out.
        let _ = unsafe { driver::ipc::close_mem_handle(ptr) };
    }
    Ok((ptr, mapped?))
}

/// The check of an envelope's `wanted` bytes — the peer's word — against the `mapped` bytes
/// the driver reports.
pub(crate) fn check_wanted(wanted: usize, mapped: usize) -> Result<()> {
    if wanted <= mapped {
        return Ok(());
    }
    Err(Error::corrupt_handle(HandleDefect::Memory {
        detail: format!(
            "the handle describes {wanted} bytes, but the memory it maps is {mapped} bytes \
             (cuPointerGetAttributes)"
        ),
    }))
}

/// Bytes of the allocation mapped at `ptr` from `ptr` on (`cuPointerGetAttributes`), in the
/// current context.
pub(crate) fn mapped_bytes(ptr: sys::CUdeviceptr) -> Result<usize> {
    let (base, size) = driver::mem::address_range(ptr)?;
    let offset = usize::try_from(ptr.wrapping_sub(base)).unwrap_or(usize::MAX);
    if ptr < base || offset > size {
        return Err(Error::Corrupt {
            what: "IPC mapping",
            defect: StateDefect::DriverAnswer {
                call: "cuPointerGetAttributes",
                value: i64::try_from(base).unwrap_or(i64::MAX),
            },
        });
    }
    Ok(size - offset)
}

/// Refuse a mapping the driver could only fail (or hang) on: the memory's device must be
/// visible and, if it is not the context's own device, reachable by peer access.
/// The device holding the memory mapped at `ptr` (`cuPointerGetAttribute`) is `ctx`'s, or one
/// `ctx` can reach as a peer. `ctx` is current.
pub(crate) fn check_memory_device(ctx: &GpuContext, ptr: sys::CUdeviceptr) -> Result<()> {
    let ordinal = driver::mem::device_ordinal_of(ptr)?;
    let Ok(ordinal) = u32::try_from(ordinal) else {
        return Err(Error::Corrupt {
            what: "IPC mapping",
            defect: StateDefect::DriverAnswer {
                call: "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)",
                value: ordinal.into(),
            },
        });
    };
    device::check_peer(ctx.ordinal(), ordinal)
}
