//! The memory beneath buffers, arenas and pools, with none of their bookkeeping: the size rule
//! of every allocation, and what the
//! driver says of memory this process maps (its bytes, its device) — the checks that hold a
//! peer's word to the driver's.

use std::ops::Range;

use crate::context::GpuContext;
use crate::device;
use crate::driver::{self, sys};
use crate::error::{ArgumentDefect, Error, HandleDefect, Result, StateDefect};

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

/// What the opener of a legacy handle expects of the memory it maps, held to what the driver
/// reports before the mapping is handed out (and, for a raw handle, before a cached mapping is
/// shared).
#[derive(Clone, Debug)]
pub(crate) enum Expected {
    /// An envelope's byte count (its memory's device was checked at admission).
    Bytes(usize),
    /// A raw handle's byte range; the memory's device is asked of the driver, as nothing else
    /// names it.
    Range(Range<u64>),
}

impl Expected {
    /// Refuse a mapping of `mapped` bytes that does not hold what is expected.
    pub(crate) fn check(&self, mapped: usize) -> Result<()> {
        match self {
            Self::Bytes(wanted) => check_claim(
                format_args!("the handle describes {wanted} bytes"),
                *wanted as u64,
                mapped as u64,
            ),
            Self::Range(range) => check_claim(
                format_args!("bytes {}..{} of the allocation", range.start, range.end),
                range.end,
                mapped as u64,
            ),
        }
    }
}

/// Map a legacy handle's memory in `ctx` (`cuIpcOpenMemHandle`) and hold it to `expected`,
/// given the bytes the driver mapped from it (`cuPointerGetAttributes`); returns the address
/// and those bytes. On an error nothing stays mapped.
pub(crate) fn map_legacy(
    ctx: &GpuContext,
    handle: [u8; 64],
    expected: Expected,
) -> Result<(sys::CUdeviceptr, usize)> {
    let _g = ctx.enter()?;
    let ptr = driver::ipc::open_mem_handle(handle)?;
    let mapped = mapped_bytes(ptr).and_then(|mapped| {
        expected.check(mapped)?;
        if let Expected::Range(_) = expected {
            check_memory_device(ctx, ptr)?;
        }
        Ok(mapped)
    });
    if mapped.is_err() {
        // SAFETY: opened just above in this context, closed once, never handed out.
        let _ = unsafe { driver::ipc::close_mem_handle(ptr) };
    }
    Ok((ptr, mapped?))
}

/// Refuse a peer's word — `claim`, naming `claimed` bytes from the start of memory this process
/// mapped or imported — that the allocation's `size` from there, as the driver reports it
/// (`cuPointerGetAttributes`), does not hold.
pub(crate) fn check_claim(claim: std::fmt::Arguments<'_>, claimed: u64, size: u64) -> Result<()> {
    if claimed <= size {
        return Ok(());
    }
    Err(Error::corrupt_handle(HandleDefect::Memory {
        detail: format!("{claim}, but the allocation holds {size} bytes (cuPointerGetAttributes)"),
    }))
}

/// Bytes of the allocation mapped at `ptr` from `ptr` on, refused by [`check_claim`] if they
/// do not hold a peer's `claim` of `claimed` bytes; in the current context.
pub(crate) fn claimed_bytes(
    ptr: sys::CUdeviceptr,
    claim: std::fmt::Arguments<'_>,
    claimed: u64,
) -> Result<u64> {
    let size = mapped_bytes(ptr)? as u64;
    check_claim(claim, claimed, size)?;
    Ok(size)
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

/// Refuse a mapping the driver could only fail (or hang) on: the device holding the memory
/// mapped at `ptr` is `ctx`'s, or one `ctx` can reach as a peer. `ctx` is current.
fn check_memory_device(ctx: &GpuContext, ptr: sys::CUdeviceptr) -> Result<()> {
    device::check_peer(ctx.ordinal(), memory_device(ptr, "IPC mapping")?)
}

/// The ordinal of the device holding the memory at `ptr` (`cuPointerGetAttribute`), for
/// `what` the memory is (named if the driver's answer is out of range).
pub(crate) fn memory_device(ptr: sys::CUdeviceptr, what: &'static str) -> Result<u32> {
    let ordinal = driver::mem::device_ordinal_of(ptr)?;
    u32::try_from(ordinal).map_err(|_| Error::Corrupt {
        what,
        defect: StateDefect::DriverAnswer {
            call: "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)",
            value: ordinal.into(),
        },
    })
}

/// The legacy handle of the allocation at `base` (`cuIpcGetMemHandle`), remembered as this
/// process's own: opening it here is refused before the driver is asked
/// ([`is_own_legacy`]).
///
/// # Safety
///
/// `base` is the start of a live `cuMemAlloc` allocation of the current context.
pub(crate) unsafe fn legacy_handle(base: sys::CUdeviceptr) -> Result<[u8; 64]> {
    // SAFETY: the caller's contract; the call writes 64 bytes.
    let handle = unsafe { driver::ipc::get_mem_handle(base) }?;
    remember_own(handle);
    Ok(handle)
}

/// Whether this process exported `handle` (through a buffer's handles, its raw export, or a
/// foreign-memory export).
pub(crate) fn is_own_legacy(handle: &[u8; 64]) -> bool {
    OWN_EXPORTS
        .lock()
        .as_ref()
        .is_some_and(|own| own.set.contains(handle))
}

/// The legacy handles this process exported, so that opening one of them here is refused
/// before the driver is asked. Bounded: the oldest go first.
static OWN_EXPORTS: parking_lot::Mutex<Option<OwnExports>> = parking_lot::const_mutex(None);
const MAX_OWN_EXPORTS: usize = 16_384;

/// The handles this process exported, the oldest forgotten first past [`MAX_OWN_EXPORTS`]
/// (their opens are then refused by the driver instead). A hash set, so that an export costs
/// the same with 10,000 buffers exported as with one (a B-tree of 64-byte keys cost 0.3–0.7 µs
/// more per export at 10,000).
struct OwnExports {
    set: std::collections::HashSet<[u8; 64]>,
    order: std::collections::VecDeque<[u8; 64]>,
}

/// Record a handle this process exported.
fn remember_own(handle: [u8; 64]) {
    let mut own = OWN_EXPORTS.lock();
    let own = own.get_or_insert_with(|| OwnExports {
        set: std::collections::HashSet::new(),
        order: std::collections::VecDeque::new(),
    });
    if !own.set.insert(handle) {
        return;
    }
    own.order.push_back(handle);
    if own.order.len() > MAX_OWN_EXPORTS
        && let Some(oldest) = own.order.pop_front()
    {
        own.set.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_the_allocation_does_not_hold_is_refused_naming_both_sizes() {
        assert!(Expected::Bytes(64).check(64).is_ok());
        assert!(Expected::Range(8..64).check(64).is_ok());
        for refused in [
            Expected::Bytes(65).check(64),
            Expected::Range(8..65).check(64),
        ] {
            let Err(Error::CorruptHandle {
                defect: HandleDefect::Memory { detail },
                ..
            }) = refused
            else {
                panic!("not refused as corrupt memory: {refused:?}");
            };
            assert!(
                detail.contains("65") && detail.contains("holds 64 bytes"),
                "{detail}"
            );
        }
    }

    #[test]
    fn own_exports_are_remembered_and_the_oldest_forgotten_past_the_bound() {
        let h = |i: u32| {
            let mut b = [0x0f; 64];
            b[..4].copy_from_slice(&i.to_le_bytes());
            b[60..].copy_from_slice(&std::process::id().to_le_bytes());
            b
        };
        remember_own(h(u32::MAX));
        assert!(is_own_legacy(&h(u32::MAX)));
        remember_own(h(u32::MAX)); // again: still one entry
        for i in 0..MAX_OWN_EXPORTS as u32 {
            remember_own(h(i));
        }
        assert!(
            !is_own_legacy(&h(u32::MAX)),
            "the oldest is forgotten past the bound"
        );
        assert!(
            is_own_legacy(&h(MAX_OWN_EXPORTS as u32 - 1)),
            "the newest is remembered"
        );
    }
}
