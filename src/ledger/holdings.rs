//! The importer side of the ledger: one process's holds on one exporter's blocks — the
//! exporter's block table, this process's bit in it (its lease slot), and, per block it holds,
//! the generation it entered, how many views hold it, and what the kind of export keeps for it
//! (an arena's published range, a pool's imported pointer, nothing for a buffer or signal of
//! the export registry) — and the lease slot that bit is, taken in the same step
//! ([`Holdings::open`]) and released last. Used once by each: `registry.rs` (buffers and
//! signals), `arena.rs`, `pool.rs`; a kind that maps memory drops its holdings after
//! unmapping.
//!
//! Kill points (the exporter's side is `table.rs`'s protocol): this process can die holding
//! blocks at any point; its bits stay set until the exporter (or a later importer taking its
//! lease slot over) proves it dead and clears them. A view's first open sets the bit before it
//! checks the generation, so an exporter that retires the block meanwhile sees the bit and
//! waits; the last view unmaps before it clears the bit.

use std::sync::Arc;

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use crate::error::{Error, HandleDefect, Result};
use crate::ledger::lease::Lease;
use crate::ledger::table::{Block, BlockMap, BlockTable, Enter};
use crate::shm::ShmRegion;

/// One block this process holds.
struct Held<E> {
    /// The generation the first view entered; the exporter cannot reuse the block while our
    /// bit is set, so every later view must name the same one.
    generation: u64,
    views: u32,
    kept: E,
}

/// What [`Holdings::enter`] found.
pub(crate) enum Holding<'h, E> {
    /// A block this process holds already.
    Held(HeldBlock<'h, E>),
    /// A block entered now, to be mapped.
    Entered(EnteredBlock<'h, E>),
}

/// A block this process holds already, under the holdings' lock: check what its first view
/// kept, then [`count`](Self::count) the new view (dropped uncounted, nothing changes).
pub(crate) struct HeldBlock<'h, E> {
    entry: MappedMutexGuard<'h, Held<E>>,
}

impl<E> HeldBlock<'_, E> {
    /// What the block's first view kept.
    pub(crate) fn kept(&self) -> &E {
        &self.entry.kept
    }

    /// Count one more view of the block.
    pub(crate) fn count(mut self) {
        self.entry.views += 1;
    }
}

/// A block entered now (our bit set, its generation checked), under the holdings' lock: map
/// it, then [`fill`](Self::fill) the entry with what to keep. Dropped unfilled (the mapping
/// failed), it clears our bit again.
pub(crate) struct EnteredBlock<'h, E> {
    held: MutexGuard<'h, BlockMap<Held<E>>>,
    index: u32,
    generation: u64,
    block: &'h Block,
    bit: u64,
    filled: bool,
}

impl<E> EnteredBlock<'_, E> {
    /// The block entered.
    pub(crate) fn block(&self) -> &Block {
        self.block
    }

    /// Hold the block with its first view, keeping `kept` (what the last view unmaps).
    pub(crate) fn fill(mut self, kept: E) {
        self.filled = true;
        let generation = self.generation;
        self.held.insert(
            self.index,
            Held {
                generation,
                views: 1,
                kept,
            },
        );
    }
}

impl<E> Drop for EnteredBlock<'_, E> {
    fn drop(&mut self) {
        if !self.filled {
            self.block.leave(self.bit);
        }
    }
}

/// An importer's holds on one exporter's blocks (see the module docs).
pub(crate) struct Holdings<E> {
    pub(crate) table: Arc<ShmRegion<BlockTable>>,
    /// This process's bit in every block's holder mask: `1 << lease slot`.
    pub(crate) bit: u64,
    held: Mutex<BlockMap<Held<E>>>,
    /// Our slot in the exporter's lease table, whose number is `bit`'s; released after the
    /// holds (field order is drop order). `None` once released, and in unit tests.
    lease: Option<Lease>,
}

impl<E> Holdings<E> {
    /// What every importer of an export does, once per export: a slot in the exporter's lease
    /// table (with every slot taken, one whose holder is proven dead, its bits in `table`
    /// cleared first), and that slot's bit in `table`, the export's block table.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] when the export is gone or closing; [`Error::TooManyImporters`];
    /// shared-memory errors opening the lease table.
    pub(crate) fn open(
        token: &[u8; 16],
        generation: u64,
        table: Arc<ShmRegion<BlockTable>>,
    ) -> Result<Self> {
        let lease = Lease::acquire_clearing(token, generation, &table)?;
        let mut holdings = Self::new(table, 1u64 << lease.slot());
        holdings.lease = Some(lease);
        Ok(holdings)
    }

    /// [`open`](Self::open) with the export's block table opened here (an arena's of
    /// `capacity` bytes, a pool's with 0).
    ///
    /// # Errors
    ///
    /// As [`BlockTable::open`], then as [`open`](Self::open).
    pub(crate) fn open_with_table(
        token: &[u8; 16],
        capacity: u64,
        generation: u64,
    ) -> Result<Self> {
        let table = BlockTable::open(token, capacity, generation)?;
        Self::open(token, generation, Arc::new(table))
    }

    /// Holdings with bit `bit` and no lease (the lease's own tests, and [`open`](Self::open)).
    pub(crate) fn new(table: Arc<ShmRegion<BlockTable>>, bit: u64) -> Self {
        Self {
            table,
            bit,
            held: Mutex::new(BlockMap::default()),
            lease: None,
        }
    }

    /// Whether the exporter has begun closing the export (no new opens).
    pub(crate) fn is_closing(&self) -> bool {
        self.table.closing.load(crate::sync::Ordering::Acquire) != 0
    }

    /// Whether this process opened these holdings (false in a child forked without `exec`).
    pub(crate) fn is_home(&self) -> bool {
        self.table.is_home()
    }

    /// The lease slot our bit is, until [`release_lease`](Self::release_lease).
    pub(crate) fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Release our lease slot now (once every hold is gone).
    pub(crate) fn release_lease(&mut self) {
        drop(self.lease.take());
    }

    /// Keep our lease slot for ever: in a child forked without `exec`, the slot is the
    /// parent's.
    pub(crate) fn leave_lease_to_parent(&mut self) {
        std::mem::forget(self.lease.take());
    }

    /// The block `index` of the table, or a corrupt handle (the index is a peer's word).
    pub(crate) fn block(&self, index: u32) -> Result<&Block> {
        self.table.block(index).ok_or_else(|| {
            Error::corrupt_handle(HandleDefect::Names {
                detail: format!("block {index} out of range"),
            })
        })
    }

    /// Take one more view of block `index` at `generation`: [`Holding::Held`] for a block held
    /// already (the same generation, still live), whose kind checks what its first view kept
    /// before it [`counts`](HeldBlock::count) the view; [`Holding::Entered`] for one entered now
    /// — our bit set, `pause` (a test hook), then the generation checked — which the kind maps
    /// and [`fill`](EnteredBlock::fill)s with what to keep (dropped unfilled, our bit is
    /// cleared again). Both hold this process's lock on its holdings until they go, so that two
    /// threads never map one block twice.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] for another generation or a retired block; a corrupt handle for a
    /// block out of range.
    pub(crate) fn enter(
        &self,
        index: u32,
        generation: u64,
        pause: impl FnOnce(),
    ) -> Result<Holding<'_, E>> {
        let stale = Error::StaleHandle { generation };
        let block = self.block(index)?;
        let held = match MutexGuard::try_map(self.held.lock(), |held| held.get_mut(&index)) {
            Ok(entry) if entry.generation != generation || !block.is_live(generation) => {
                return Err(stale);
            }
            Ok(entry) => return Ok(Holding::Held(HeldBlock { entry })),
            Err(held) => held,
        };
        if block.enter_pausing(self.bit, generation, pause) == Enter::Stale {
            return Err(stale);
        }
        Ok(Holding::Entered(EnteredBlock {
            held,
            index,
            generation,
            block,
            bit: self.bit,
            filled: false,
        }))
    }

    /// Let go of one view of block `index`. At the last, `last` unmaps what was kept and says
    /// whether it did; only then is our bit cleared (memory still mapped keeps the bit, so the
    /// exporter never frees under it: a leak, never a use-after-free).
    pub(crate) fn leave(&self, index: u32, last: impl FnOnce(E) -> bool) {
        let mut held = self.held.lock();
        let Some(entry) = held.get_mut(&index) else {
            return;
        };
        entry.views -= 1;
        if entry.views > 0 {
            return;
        }
        let Some(entry) = held.remove(&index) else {
            return;
        };
        let unmapped = last(entry.kept);
        crate::trace::event!(
            "import closed: its last view let go",
            block = index,
            generation = entry.generation,
            unmapped
        );
        if unmapped && let Some(block) = self.table.block(index) {
            block.leave(self.bit);
        }
    }

    /// Whether the export we hold at block `index` is still live (false once its exporter
    /// retired it, or when we hold nothing there).
    pub(crate) fn is_live(&self, index: u32) -> bool {
        let held = self.held.lock();
        match (held.get(&index), self.table.block(index)) {
            (Some(entry), Some(block)) => block.is_live(entry.generation),
            _ => false,
        }
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use super::*;

    #[allow(clippy::unwrap_used)] // a test helper: failing loudly is the point
    fn holdings(tag: u8) -> Holdings<u32> {
        let mut token = [tag; 16];
        token[..8].copy_from_slice(&crate::os::random_u64().unwrap().to_le_bytes());
        let table = BlockTable::create(&token, 0).unwrap();
        table.blocks[3].publish(1, 0, 64, crate::ledger::label::Label::FOR_TESTS);
        Holdings::new(Arc::new(table), 1 << 5)
    }

    /// Block 3 at generation 1, entered now (nothing held it).
    #[allow(clippy::panic)] // a test helper: failing loudly is the point
    fn entered(h: &Holdings<u32>) -> EnteredBlock<'_, u32> {
        match h.enter(3, 1, || {}) {
            Ok(Holding::Entered(first)) => first,
            _ => panic!("a first view enters"),
        }
    }

    /// Block 3 at generation 1, held already.
    #[allow(clippy::panic)] // a test helper: failing loudly is the point
    fn held(h: &Holdings<u32>) -> HeldBlock<'_, u32> {
        match h.enter(3, 1, || {}) {
            Ok(Holding::Held(view)) => view,
            _ => panic!("a later view finds the first"),
        }
    }

    /// Views of one block share one entry: the bit is set by the first and cleared by the last;
    /// a handle of another generation is stale, and so is a second view once the block is
    /// retired, though the held entry stays until its views go.
    #[test]
    fn views_share_one_entry_and_the_bit_goes_with_the_last() {
        let h = holdings(1);
        let block = h.block(3).unwrap();
        let first = entered(&h);
        assert_eq!(first.block().holders(), 1 << 5);
        first.fill(7);
        let again = held(&h);
        assert_eq!(*again.kept(), 7, "a second view sees what the first kept");
        again.count();
        let other = h.enter(3, 3, || {});
        assert!(matches!(other, Err(Error::StaleHandle { .. })));
        h.leave(3, |_| panic!("not the last view"));
        assert_eq!(block.holders(), 1 << 5);
        assert!(h.is_live(3));
        block.retire(1);
        assert!(!h.is_live(3));
        let late = h.enter(3, 1, || {});
        assert!(matches!(late, Err(Error::StaleHandle { .. })), "retired");
        let mut unmapped = None;
        h.leave(3, |kept| {
            unmapped = Some(kept);
            true
        });
        assert_eq!((unmapped, block.holders()), (Some(7), 0));
    }

    /// A first open that fails to map clears the bit again; a last view that could not unmap
    /// keeps it (the exporter then never frees under the mapping); an index out of range is a
    /// corrupt handle.
    #[test]
    fn a_failed_map_clears_the_bit_and_a_failed_unmap_keeps_it() {
        let h = holdings(2);
        let block = h.block(3).unwrap();
        drop(entered(&h)); // the mapping failed
        assert_eq!(block.holders(), 0, "the bit was cleared again");
        entered(&h).fill(9);
        drop(held(&h)); // its kind refused what was kept: not a view
        h.leave(3, |_| false);
        assert_eq!(block.holders(), 1 << 5, "still mapped: the bit stays");
        assert!(!h.is_live(3), "no entry is left");
        let out = h.enter(u32::MAX, 1, || {});
        assert!(matches!(out, Err(Error::CorruptHandle { .. })));
    }
}
