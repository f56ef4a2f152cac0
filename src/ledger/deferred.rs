//! Deferred frees: exported `cuMemAlloc` buffers dropped while other processes still map them.
//!
//! Dropping an exported [`IpcBuffer`](crate::IpcBuffer) (or [`IpcSignal`](crate::IpcSignal))
//! never waits for its importers. It retires the export's block in this process's export
//! registry (`registry.rs`) — from then on every open of its handle is refused with
//! [`Error::StaleHandle`](crate::Error::StaleHandle) — and reads the block's holders. With none
//! left (after reaping importers proven dead) the memory is freed at once. Otherwise the
//! allocation (its context, device address and record) joins this process's list of deferred
//! frees, and the first later collect that finds the block's holders gone frees it. Collects
//! run at every later allocation and export of an `IpcBuffer` or `IpcSignal` of this process
//! (only when something is pending: one atomic load otherwise), and whenever
//! [`collect_deferred`] is called.
//!
//! What this guarantees:
//!
//! - **No device use-after-free**: memory is freed only once its retired block has no holder.
//!   An importer clears its bit only after unmapping, and one that sets its bit after the
//!   retire sees the retired generation and backs off before mapping (the arena protocol,
//!   `ledger/table.rs`), so a block without holders means nobody maps the memory and nobody
//!   can start to.
//! - **Nothing held past its importers**: once the last importer unmaps (or dies), the next
//!   collect frees the memory. A process that allocates or exports again frees its deferred
//!   buffers on the way; one that does neither calls [`collect_deferred`].
//! - **Drop does not block**: a swap and a load on the block, and, only when it is held, one
//!   scan of the 64-slot lease table for importers proven dead.
//!
//! Where the other side stops: an importer killed while holding a view is proven dead by the
//! next collect and reaped (the driver unmapped its memory with its process); an importer
//! preempted mid-enter either set its bit before the retire (a holder: the free waits) or sees
//! the retired generation and backs off. If this process exits with frees pending, the driver
//! frees the memory with the context, and an `atexit` hook removes the registry's names from
//! `/dev/shm`; if it is killed, its last importer removes them, or the next process's sweep
//! does ([`reclaim_stale_regions`](crate::shm::reclaim_stale_regions)).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::context::GpuContext;
use crate::driver::sys;
use crate::error::Result;
use crate::ledger::registry::{self, Record};
use crate::trace;

/// An allocation whose importers had not all unmapped it when its owner dropped it.
struct Deferred {
    ctx: GpuContext,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    /// Retired: its block says who still holds it.
    record: Record,
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
    /// Buffers still mapped by a live importer (with [`HandleType::Pool`](crate::HandleType::Pool)
    /// buffers dropped while an importer holds them).
    pub pending: usize,
    /// Their bytes.
    pub pending_bytes: usize,
    /// Channel ends ([`IpcSender`](crate::channel::IpcSender),
    /// [`IpcReceiver`](crate::channel::IpcReceiver)) dropped while the channel's GPU operations
    /// were still running, still waiting for them: closed by a later collect once those complete
    /// (or leaked once their drop timeout passes, as `close` would).
    pub draining: usize,
}

/// Free the exported allocation `ptr` of `bytes` bytes in `ctx` now if no importer maps it
/// (or it was never exported: no record), else put it on the list (retiring its record
/// either way: new opens are refused).
///
/// # Errors
///
/// [`Error::Cuda`](crate::Error::Cuda) naming `cuMemFree` when freeing now failed.
pub(crate) fn free_or_defer(
    ctx: &GpuContext,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    record: Option<Record>,
) -> Result<()> {
    // No record: the buffer was never exported with a handle, so no importer can map it.
    let Some(mut record) = record else {
        return free(ctx, ptr);
    };
    if record.retire() {
        // Held: reap importers proven dead (their mappings died with them) and look again.
        registry::collect();
    }
    if !record.is_held() {
        return free(ctx, ptr);
    }
    trace::event!("free deferred: importers hold the buffer", bytes, importers = ?record.importers());
    let mut list = LIST.lock();
    list.push(Deferred {
        ctx: ctx.clone(),
        ptr,
        bytes,
        record,
    });
    PENDING.store(list.len(), Ordering::Relaxed);
    Ok(())
}

fn free(ctx: &GpuContext, ptr: sys::CUdeviceptr) -> Result<()> {
    let _g = ctx.enter()?;
    // SAFETY: `ptr` was allocated by cuMemAlloc in `ctx` and is freed once: by its buffer, or
    // here after being moved off the list; its record is retired and no importer holds it.
    unsafe { crate::driver::mem::free(ptr) }
}

/// Work another owner deferred, collected with the deferred frees: the quarantine of the pools
/// that [`HandleType::Pool`](crate::HandleType::Pool) buffers come from, and channel ends
/// dropped while their GPU operations ran. Each registers ([`register_pending`]) when it first
/// defers something, so that this module calls into no owner.
pub(crate) struct Pending {
    /// Whether something may wait (one atomic load: the allocation paths' fast check).
    pub(crate) pending: fn() -> bool,
    /// Finish what can be finished now (reaping importers proven dead); report what is left.
    pub(crate) collect: fn() -> DeferredFrees,
}

/// The most owners that can register (two exist: the shared pools and the channel drains).
const MAX_REGISTERED: usize = 4;

/// The registered owners, in the order they registered; a null slot ends the list. Read with
/// one load per slot, no lock and no allocation: [`collect_if_pending`] runs at every
/// allocation and export.
static REGISTERED: [AtomicPtr<Pending>; MAX_REGISTERED] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_REGISTERED];

/// Collect `pending` with the deferred frees from now on (once however often called).
pub(crate) fn register_pending(pending: &'static Pending) {
    let wanted = std::ptr::from_ref(pending).cast_mut();
    for slot in &REGISTERED {
        // Claim the first free slot, unless `pending` holds one already (slots fill in order
        // and are never emptied, so it is found before the first free one).
        match slot.compare_exchange(
            std::ptr::null_mut(),
            wanted,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return,
            Err(held) if held == wanted => return,
            Err(_) => {}
        }
    }
    // Every slot taken by another owner: a new owner kind was added without raising the
    // bound; its deferred work is still finished by its own next allocation.
    debug_assert!(false, "raise MAX_REGISTERED");
}

/// The registered owners, in order; none is called under a lock (a collect takes its owner's
/// locks, under which an owner may register).
fn registered() -> impl Iterator<Item = &'static Pending> {
    REGISTERED.iter().map_while(|slot| {
        let p = slot.load(Ordering::Acquire);
        // SAFETY: every non-null pointer stored came from a `&'static Pending`
        // (`register_pending`), and is never changed or freed afterwards.
        (!p.is_null()).then(|| unsafe { &*p })
    })
}

/// Collect if anything is pending (called when this process allocates or exports).
pub(crate) fn collect_if_pending() {
    if PENDING.load(Ordering::Relaxed) != 0 {
        collect_deferred();
    }
    for owner in registered() {
        if (owner.pending)() {
            (owner.collect)();
        }
    }
}

/// Free every deferred buffer that no importer maps any more (see
/// [deferred frees](crate::IpcBuffer#dropping-an-exported-buffer)): reap importers proven
/// dead, then `cuMemFree` each buffer whose importers are all gone. The same for dropped
/// [`HandleType::Pool`](crate::HandleType::Pool) buffers (their pool also frees them at its
/// next allocation); a pool with no buffer left is destroyed once nothing of it is left.
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
    registry::collect();
    let mut report = sweep(&mut list, |d| free(&d.ctx, d.ptr));
    PENDING.store(list.len(), Ordering::Relaxed);
    drop(list);
    for owner in registered() {
        let theirs = (owner.collect)();
        report.freed += theirs.freed;
        report.failed += theirs.failed;
        report.pending += theirs.pending;
        report.pending_bytes = report.pending_bytes.saturating_add(theirs.pending_bytes);
        report.draining += theirs.draining;
    }
    report
}

/// One entry's hold state and size, for [`sweep`].
trait Entry {
    fn is_held(&self) -> bool;
    fn bytes(&self) -> usize;
}

impl Entry for Deferred {
    fn is_held(&self) -> bool {
        self.record.is_held()
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `free` (and drop) the entries that no importer holds any more (after a collect), keep the
/// others.
fn sweep<E: Entry>(list: &mut Vec<E>, free: impl Fn(&E) -> Result<()>) -> DeferredFrees {
    let mut report = DeferredFrees::default();
    list.retain(|d| {
        if d.is_held() {
            report.pending += 1;
            report.pending_bytes = report.pending_bytes.saturating_add(d.bytes());
            return true;
        }
        let freed = free(d).is_ok();
        if freed {
            report.freed += 1;
        } else {
            report.failed += 1;
        }
        trace::event!("deferred free done", bytes = d.bytes(), freed);
        false
    });
    report
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::process::ProcessIdentity;

    struct Fake(Record, usize);

    impl Entry for Fake {
        fn is_held(&self) -> bool {
            self.0.is_held()
        }
        fn bytes(&self) -> usize {
            self.1
        }
    }

    #[allow(clippy::unwrap_used)] // test helper: failing loudly is the point
    fn retired() -> (Record, [u8; 16], u64) {
        let r = Record::publish(1, crate::ledger::label::Label::FOR_TESTS).unwrap();
        let (t, g) = (r.token(), r.generation());
        (r, t, g)
    }

    #[test]
    fn an_entry_is_freed_by_the_first_sweep_after_its_last_hold_goes() {
        let (mut held, token, generation) = retired();
        let (mut free, _, _) = retired();
        let hold = registry::enter(&token, generation, ProcessIdentity::current()).unwrap();
        assert!(held.retire());
        assert!(!free.retire());
        let mut list = vec![Fake(held, 4096), Fake(free, 512)];
        let freed = Cell::new(0);
        let count = |_: &Fake| {
            freed.set(freed.get() + 1);
            Ok(())
        };
        registry::collect();
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending, r.pending_bytes), (1, 1, 4096));
        assert_eq!(freed.get(), 1);
        // Retired: no new open of the held entry, and sweeping again changes nothing.
        assert!(matches!(
            registry::enter(&token, generation, ProcessIdentity::current()),
            Err(crate::Error::StaleHandle { .. })
        ));
        registry::collect();
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending), (0, 1));
        drop(hold);
        registry::collect();
        let r = sweep(&mut list, count);
        assert_eq!((r.freed, r.pending, r.pending_bytes), (1, 0, 0));
        assert!(list.is_empty());
        assert_eq!(freed.get(), 2);
    }

    #[test]
    fn a_failed_free_is_counted_and_not_retried() {
        let (mut r, _, _) = retired();
        r.retire();
        let mut list = vec![Fake(r, 8)];
        let r = sweep(&mut list, |_| {
            Err(crate::Error::InvalidArgument {
                call: "test",
                defect: crate::error::ArgumentDefect::NotPrimaryContext,
            })
        });
        assert_eq!((r.freed, r.failed, r.pending), (0, 1, 0));
        assert!(list.is_empty());
    }
}
