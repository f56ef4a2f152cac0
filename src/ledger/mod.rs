//! The ledger: who holds an export, and when its memory may be freed — in one place.
//!
//! Every export of this crate (a buffer or signal through the per-process export registry, an
//! arena's buffers, a pool's allocations) is freed by the same rule: **retire, then free only
//! once no importer holds it**. The parts, each in the file named after it:
//!
//! | File | What it holds | Shared with peers? |
//! |------|---------------|--------------------|
//! | [`table`] | the block table: per export a generation (odd: live) and a 64-bit mask of holding importers; the enter/leave/retire protocol, its loom model and replay tests | yes (`cuda-ipc-arena.<token>`) |
//! | [`lease`] | the lease table: one slot per importing process, claimed before mapping, reaped once its owner is proven dead; a slot number is the importer's bit in the block table | yes (`cuda-ipc-lease.<token>`) |
//! | [`book`] | the owner's books: free byte ranges and block indexes, generations, quarantined blocks | no (the owner's lock) |
//! | `mod.rs` ([`Ledger`]) | a block table, a lease table and the books behind one lock: the owner side of the registry and of every arena | — |
//! | [`registry`] | this process's export registry (one ledger for every exported buffer and signal) and the importer's hold on an export | — |
//! | [`deferred`] | frees of exports dropped while held, and the quarantines of other owners (pools) registered with it, collected together | — |
//! | [`cache`] | the one process-wide cache of imports (buffers, arenas, pools, exporters' ledgers) | — |
//! | [`holdings`] | the importer side: its bit in an exporter's block table and the blocks it holds, with each kind's record (used by the registry's imports, arenas and pools) | no (the importer's lock) |
//!
//! The owned-slot word a lease slot is made of (state and owner identity in one atomic word)
//! is `owned_slot.rs`, shared with the barrier's participant slots; whether a holder is alive
//! is decided only by `process.rs`.
//!
//! # The way a call goes
//!
//! - **Export** (owner): [`Ledger::alloc`] publishes a block with a new odd generation; the
//!   handle names the table, the block and the generation.
//! - **Open** (importer): a lease slot in the exporter's lease table (once per exporter, through
//!   [`cache`]), then *enter* the block ([`table`], through the importer's [`holdings`], which
//!   count its views of each block); only then is memory mapped.
//! - **Close** (importer): at the last view of a block, unmap, then *leave* (clear the bit); the
//!   lease goes with the last hold.
//! - **Drop** (owner): [`Ledger::free`] retires the block; with no bit set the memory is freed
//!   at once, otherwise [`deferred`] keeps it until a collect finds the bits cleared — by their
//!   importers, or by [`reap_dead_importers`] for importers proven dead.
//!
//! Arenas book byte ranges ([`Ledger::create`]); pools and the export registry book block
//! indexes only ([`Ledger::create_indexed`]: the driver placed their memory). A pool keeps, beside
//! its ledger, the pointers of its quarantined allocations, freed once the ledger gives their
//! blocks back, and registers that quarantine with [`deferred`].
//!
//! The stress test (`tests/arena_stress.rs`, through `arena::__testing::Owner`) drives
//! [`Ledger`] with processes killed at random.

pub(crate) mod book;
pub(crate) mod cache;
pub(crate) mod deferred;
pub(crate) mod holdings;
pub(crate) mod lease;
pub(crate) mod registry;
pub(crate) mod table;

use parking_lot::Mutex;

use crate::error::Result;
use crate::process::ProcessIdentity;
use crate::shm::ShmRegion;
use book::{Book, Full, Placed};
use lease::ExportLeases;
use table::{BlockTable, MAX_ARENA_BUFFERS};

/// When a reclaim also reaps importers proven dead (a scan of the lease table that asks the
/// kernel about each holder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reap {
    Never,
    /// When quarantined blocks remain held after the first pass.
    IfHeld,
    Always,
}

/// A block table, its lease table and the books (see the module docs).
pub(crate) struct Ledger {
    pub(crate) token: [u8; 16],
    pub(crate) table: ShmRegion<BlockTable>,
    pub(crate) leases: ExportLeases,
    book: Mutex<Book>,
    max_buffers: usize,
}

impl Ledger {
    /// Create the tables of `token`: `capacity` bytes placed in [`ALIGN`](book::ALIGN)
    /// units, at most `max_buffers` blocks live or quarantined.
    pub(crate) fn create(token: &[u8; 16], capacity: u64, max_buffers: usize) -> Result<Self> {
        let max_buffers = max_buffers.clamp(1, MAX_ARENA_BUFFERS);
        let table = BlockTable::create(token, capacity)?;
        Ok(Self {
            token: *token,
            table,
            leases: ExportLeases::create(token)?,
            book: Mutex::new(Book::new(capacity, max_buffers)),
            max_buffers,
        })
    }

    /// Create the tables of `token` with books of block indexes only ([`Book::indexes`]), for
    /// exports whose memory the driver placed: a pool's allocations, the export registry's
    /// buffers and signals. At most `max_buffers` blocks live or quarantined; the block table
    /// says capacity 0.
    pub(crate) fn create_indexed(token: &[u8; 16], max_buffers: usize) -> Result<Self> {
        let max_buffers = max_buffers.clamp(1, MAX_ARENA_BUFFERS);
        let table = BlockTable::create(token, 0)?;
        Ok(Self {
            token: *token,
            table,
            leases: ExportLeases::create(token)?,
            book: Mutex::new(Book::indexes(max_buffers)),
            max_buffers,
        })
    }

    /// Place and publish `bytes`, reclaiming (and reaping importers proven dead, if that is
    /// not enough) when short.
    ///
    /// # Errors
    ///
    /// What the books hold when nothing can be placed (for [`Error::ArenaFull`](crate::Error::ArenaFull)).
    pub(crate) fn alloc(&self, bytes: u64) -> std::result::Result<Placed, Full> {
        let mut book = self.book.lock();
        match book.alloc(&self.table.blocks, bytes) {
            Ok(p) => Ok(p),
            Err(_) => {
                self.reclaim(&mut book, false);
                book.alloc(&self.table.blocks, bytes)
            }
        }
    }

    /// At most this many blocks are live or quarantined at once.
    pub(crate) fn max_buffers(&self) -> usize {
        self.max_buffers
    }

    /// Retire `placed`: its handles are stale from now on; its block comes back at once if no
    /// importer holds it, else it is quarantined. Returns whether it was quarantined.
    pub(crate) fn free(&self, placed: Placed) -> bool {
        let mut book = self.book.lock();
        book.free(&self.table.blocks, placed);
        book.is_quarantined(&placed)
    }

    /// Give back quarantined blocks whose holders are gone, reaping every importer proven
    /// dead; returns the bytes still quarantined.
    pub(crate) fn collect(&self) -> u64 {
        let mut book = self.book.lock();
        self.reclaim(&mut book, true);
        book.quarantined_bytes()
    }

    /// Give back quarantined blocks whose holders are gone, reaping the importers proven dead
    /// as `reap` says; returns how many blocks stay quarantined.
    pub(crate) fn reclaim_with(&self, reap: Reap) -> usize {
        let mut book = self.book.lock();
        let held = if book.has_quarantine() {
            book.reclaim(&self.table.blocks, 0)
        } else {
            0
        };
        let reap = match reap {
            Reap::Never => false,
            Reap::IfHeld => held != 0,
            Reap::Always => true,
        };
        if reap
            && reap_dead_importers(&self.table, &self.leases, self.max_buffers)
            && book.has_quarantine()
        {
            book.reclaim(&self.table.blocks, 0);
        }
        book.quarantined()
    }

    /// Whether every block is live or quarantined (the next allocation must reclaim first).
    pub(crate) fn is_full(&self) -> bool {
        self.book.lock().buffers() >= self.max_buffers
    }

    /// Whether `placed` is still retired and held by an importer (false once its block came
    /// back, which needs every holder gone).
    pub(crate) fn is_quarantined(&self, placed: &Placed) -> bool {
        self.book.lock().is_quarantined(placed)
    }

    /// Bytes free now.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.book.lock().free_bytes()
    }

    /// The pids of the live processes holding block `index` now.
    pub(crate) fn holders_of(&self, index: u32) -> Vec<u32> {
        let mask = self.table.block(index).map_or(0, |b| b.holders());
        self.leases
            .table()
            .holders_in(mask, &|id: &ProcessIdentity| id.is_alive())
    }

    /// A process holding block `index` that is proven dead (it died with the export mapped).
    /// Read-only.
    pub(crate) fn dead_holder_of(&self, index: u32) -> Option<u32> {
        let mask = self.table.block(index).map_or(0, |b| b.holders());
        self.leases.table().dead_holder_in(mask)
    }

    /// Give back quarantined blocks whose holders are gone. If some remain, or with `reap`,
    /// reap the importers proven dead and try again.
    fn reclaim(&self, book: &mut Book, reap: bool) {
        let held = if book.has_quarantine() {
            book.reclaim(&self.table.blocks, 0)
        } else {
            0
        };
        if (held != 0 || reap)
            && reap_dead_importers(&self.table, &self.leases, self.max_buffers)
            && book.has_quarantine()
        {
            book.reclaim(&self.table.blocks, 0);
        }
    }
}

/// Reap the importers proven dead: take their lease slots (so that no importer can take one
/// over meanwhile, see `lease::Slots::claim_or_take_over`), clear their bits in every block
/// (they may hold bits of live blocks too), then free the slots, so that a new importer taking
/// a slot starts with no bits. Returns whether any was reaped. Shared by [`Ledger`] (the export
/// registry and arenas) and pools.
pub(crate) fn reap_dead_importers(
    table: &BlockTable,
    leases: &ExportLeases,
    max_buffers: usize,
) -> bool {
    // Every lease slot has a bit in a block's 64-bit holder mask.
    const _: () = assert!(lease::MAX_IMPORTERS <= 64);
    let taken: Vec<(usize, u64)> = leases.take_dead_slots();
    if taken.is_empty() {
        return false;
    }
    let mask = taken.iter().fold(0u64, |m, &(i, _)| m | (1 << i));
    for block in &table.blocks[..max_buffers.min(MAX_ARENA_BUFFERS)] {
        if block.holders() & mask != 0 {
            block.clear_dead(mask);
        }
    }
    for (i, held) in taken {
        leases.release_taken(i, held);
    }
    true
}
