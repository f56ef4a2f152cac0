//! Deferred frees: exported `cuMemAlloc` buffers dropped while other processes still map them.
//!
//! Dropping an exported [`IpcBuffer`](crate::IpcBuffer) (or [`IpcSignal`](crate::IpcSignal))
//! never waits for its importers. It marks the export's lease table *closing* — from then on
//! every open of its handle is refused with [`Error::StaleHandle`](crate::Error::StaleHandle) —
//! and scans the table once, reaping the slots of importers proven dead. With no holder left
//! the memory is freed at once. Otherwise the allocation (its context, device address and lease
//! table) joins this process's list of deferred frees, and the first later scan that finds no
//! holder frees it. Scans run at every later allocation and export of an `IpcBuffer` or
//! `IpcSignal` of this process (only when something is pending: one atomic load otherwise), and
//! whenever [`collect_deferred`] is called.
//!
//! What this guarantees:
//!
//! - **No device use-after-free**: memory is freed only after a scan of the closing table found
//!   no live holder. An importer releases its lease only after unmapping, and a claim made
//!   after *closing* was set backs off before mapping (the lease protocol in `lease.rs`), so a
//!   scan that finds nobody means nobody maps the memory and nobody can start to.
//! - **Nothing held past its importers**: once the last importer unmaps (or dies), the next
//!   scan frees the memory. A process that allocates or exports again frees its deferred
//!   buffers on the way; one that does neither calls [`collect_deferred`].
//! - **Drop does not block**: one scan of a 64-slot table (a liveness check per holder).
//!
//! Where the other side stops: an importer killed while holding a view is proven dead by the
//! next scan and reaped (the driver unmapped its memory with its process); an importer
//! preempted mid-claim either completes its claim before the table closed (a holder: the free
//! waits) or sees *closing* and backs off. If this process exits with frees pending, the driver
//! frees the memory with the context, and an `atexit` hook removes their lease tables' names
//! from `/dev/shm`; if it is killed, the last importer to release removes each name, or the
//! next process's sweep does
//! ([`reclaim_stale_lease_tables`](crate::reclaim_stale_lease_tables)).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::context::GpuContext;
use crate::driver::{check, sys};
use crate::error::Result;
use crate::lease::ExportLeases;

/// An allocation whose importers had not all unmapped it when its owner dropped it.
struct Deferred {
    ctx: GpuContext,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    leases: Arc<ExportLeases>,
}

static LIST: Mutex<Vec<Deferred>> = Mutex::new(Vec::new());
/// `LIST.len()`, readable without the lock (the allocation and export paths' fast check).
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// What [`collect_deferred`] did, and what is left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeferredFrees {
    /// Buffers freed by this call.
    pub freed: usize,
    /// Buffers whose `cuMemFree` failed (their memory stays with the context; they are not
    /// tried again).
    pub failed: usize,
    /// Buffers still mapped by a live importer.
    pub pending: usize,
    /// Their bytes.
    pub pending_bytes: usize,
}

/// Free the exported allocation `ptr` of `bytes` bytes in `ctx` now if no importer maps it
/// (or it was never exported: no table), else put it on the list (closing its lease table
/// either way: new opens are refused).
///
/// # Errors
///
/// [`Error::Cuda`](crate::Error::Cuda) naming `cuMemFree` when freeing now failed.
pub(crate) fn free_or_defer(
    ctx: &GpuContext,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    leases: Option<Arc<ExportLeases>>,
) -> Result<()> {
    // No table: the buffer was never exported with a handle, so no importer can map it.
    let Some(leases) = leases.filter(|l| !l.close_and_scan().is_empty()) else {
        return free(ctx, ptr);
    };
    let mut list = LIST.lock();
    list.push(Deferred {
        ctx: ctx.clone(),
        ptr,
        bytes,
        leases,
    });
    PENDING.store(list.len(), Ordering::Relaxed);
    drop(list);
    unlink_tables_at_exit();
    Ok(())
}

/// Once per process, on the first deferral: have `exit` unlink the lease tables of frees
/// still pending (the driver frees their memory with the process; their names would
/// otherwise stay in `/dev/shm` until another process's sweep). Only names are removed — no
/// driver call at exit —, and an open of a closing export is refused whether its table is
/// there or not. Not run when the process is killed (then the sweep or the last importer
/// removes them).
fn unlink_tables_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments whose body cannot
        // panic (a `try_lock` and unlink system calls whose errors are ignored), so it never
        // unwinds across the C boundary, and it does not call `exit`. A failed registration
        // only leaves the names to the sweep.
        let _ = unsafe { libc::atexit(unlink_pending_tables) };
    });
}

extern "C" fn unlink_pending_tables() {
    // `try_lock`: an exit from inside a sweep must not deadlock (the names then stay).
    if let Some(list) = LIST.try_lock() {
        for d in list.iter() {
            d.leases.unlink_name();
        }
    }
}

fn free(ctx: &GpuContext, ptr: sys::CUdeviceptr) -> Result<()> {
    let _g = ctx.enter()?;
    // SAFETY: `ptr` was allocated by cuMemAlloc in `ctx` and is freed once: by its buffer, or
    // here after being moved off the list; its lease table is closing and had no holder.
    check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
}

/// Collect if anything is pending (called when this process allocates or exports).
pub(crate) fn collect_if_pending() {
    if PENDING.load(Ordering::Relaxed) != 0 {
        collect_deferred();
    }
}

/// Free every deferred buffer that no importer maps any more (see
/// [deferred frees](crate::IpcBuffer#dropping-an-exported-buffer)): scan each one's lease
/// table, reaping importers proven dead, and `cuMemFree` those with no holder left.
///
/// Allocating or exporting an [`IpcBuffer`](crate::IpcBuffer) or
/// [`IpcSignal`](crate::IpcSignal) does this too, when something is pending; call it where a
/// process stops allocating but should still give memory back once its importers let go.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = cuda_ipc::GpuContext::new(0)?;
/// let buf = cuda_ipc::IpcBuffer::<u8>::zeroed(&ctx, 1 << 20)?;
/// let handle = buf.handle()?;
/// // ... another process opens `handle` ...
/// drop(buf); // returns at once; freed now, or once that process unmaps
/// let left = cuda_ipc::collect_deferred();
/// println!("{} freed, {} bytes still mapped elsewhere", left.freed, left.pending_bytes);
/// # Ok(()) }
/// ```
#[doc(alias = "cuMemFree")]
pub fn collect_deferred() -> DeferredFrees {
    let mut list = LIST.lock();
    let report = sweep(&mut list, |d| free(&d.ctx, d.ptr));
    PENDING.store(list.len(), Ordering::Relaxed);
    report
}

/// One entry's lease table and size, for [`sweep`].
trait Entry {
    fn leases(&self) -> &ExportLeases;
    fn bytes(&self) -> usize;
}

impl Entry for Deferred {
    fn leases(&self) -> &ExportLeases {
        &self.leases
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Scan every entry's closing lease table; `free` (and drop, unlinking the table) those that
/// no live importer holds, keep the others.
fn sweep<E: Entry>(list: &mut Vec<E>, free: impl Fn(&E) -> Result<()>) -> DeferredFrees {
    let mut report = DeferredFrees::default();
    list.retain(|d| {
        if !d.leases().close_and_scan().is_empty() {
            report.pending += 1;
            report.pending_bytes += d.bytes();
            return true;
        }
        match free(d) {
            Ok(()) => report.freed += 1,
            Err(_) => report.failed += 1,
        }
        false
    });
    report
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::lease::Lease;

    struct Fake(ExportLeases, usize);

    impl Entry for Fake {
        fn leases(&self) -> &ExportLeases {
            &self.0
        }
        fn bytes(&self) -> usize {
            self.1
        }
    }

    fn token(n: u8) -> [u8; 16] {
        let mut t = [n; 16];
        t[..8].copy_from_slice(&std::process::id().to_le_bytes().repeat(2));
        t
    }

    #[test]
    fn an_entry_is_freed_by_the_first_sweep_after_its_last_lease_goes() {
        let (held, free) = (token(0xd1), token(0xd2));
        let mut list = vec![
            Fake(ExportLeases::create(&held).unwrap(), 4096),
            Fake(ExportLeases::create(&free).unwrap(), 512),
        ];
        let lease = Lease::acquire(&held, 1).unwrap();
        let freed = Cell::new(0);
        let count = |_: &Fake| {
            freed.set(freed.get() + 1);
            Ok(())
        };
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending, r.pending_bytes), (1, 1, 4096));
        assert_eq!(freed.get(), 1);
        // Closing: no new lease on the held entry, and sweeping again changes nothing.
        assert!(matches!(
            Lease::acquire(&held, 1),
            Err(crate::Error::StaleHandle { .. })
        ));
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending), (0, 1));
        drop(lease);
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending, r.pending_bytes), (1, 0, 0));
        assert!(list.is_empty());
        assert_eq!(freed.get(), 2);
    }

    /// Replay: an importer's claim is preempted after its slot reads *claiming* (the first
    /// window), and the owner drops the buffer right then. The drop's scan sees the claimer
    /// as a holder and defers; the claim resumes, finds the table closing and backs off
    /// (stale) without mapping; the next sweep frees.
    #[test]
    fn a_claim_stalled_across_the_drop_defers_the_free_then_backs_off() {
        let t = token(0xd4);
        let mut list = vec![Fake(ExportLeases::create(&t).unwrap(), 64)];
        let freed = Cell::new(0);
        let count = |_: &Fake| {
            freed.set(freed.get() + 1);
            Ok(())
        };
        let mut at_drop = None;
        let mut windows = 0;
        let claim = Lease::acquire_pausing(&t, 1, || {
            windows += 1;
            if windows == 1 {
                at_drop = Some(sweep(&mut list, count));
            }
        });
        let at_drop = at_drop.expect("the claim paused");
        assert_eq!(
            (at_drop.freed, at_drop.pending),
            (0, 1),
            "a claimer is a holder"
        );
        assert!(
            matches!(claim, Err(crate::Error::StaleHandle { .. })),
            "the claim must back off once the table is closing"
        );
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending), (1, 0));
        assert_eq!(freed.get(), 1);
    }

    /// Replay: the owner drops while an importer maps (deferred); the importer releases, and
    /// being the last holder of a closing table it removes the table's name (the owner may
    /// exit before its next sweep); the owner's sweep still frees, and its drop of the table
    /// after the name is gone is harmless.
    #[test]
    fn the_last_importer_of_a_closing_export_removes_its_table_name() {
        let t = token(0xd5);
        let path = std::path::Path::new("/dev/shm").join(crate::lease::__testing::table_name(&t));
        let mut list = vec![Fake(ExportLeases::create(&t).unwrap(), 64)];
        let lease = Lease::acquire(&t, 1).unwrap();
        assert_eq!(sweep(&mut list, |_| Ok(())).pending, 1);
        assert!(path.exists());
        drop(lease);
        assert!(
            !path.exists(),
            "the last importer of a closing table unlinks it"
        );
        let r = sweep(&mut list, |_| Ok(()));
        assert_eq!((r.freed, r.pending), (1, 0));
        assert!(list.is_empty());
    }

    #[test]
    fn a_failed_free_is_counted_and_not_retried() {
        let t = token(0xd3);
        let mut list = vec![Fake(ExportLeases::create(&t).unwrap(), 8)];
        let r = sweep(&mut list, |_| {
            Err(crate::Error::InvalidArgument {
                call: "test",
                reason: "fails".into(),
            })
        });
        assert_eq!((r.freed, r.failed, r.pending), (0, 1, 0));
        assert!(list.is_empty());
    }
}
