//! The arena protocol's owner side without memory: a block table, a lease table (one slot per
//! importing process) and the books, behind one lock. The export registry
//! ([`crate::registry`]) keeps every exported buffer of a process in one; the stress test
//! (`tests/arena_stress.rs`, through [`super::__testing::Owner`]) drives the same code with
//! processes that are killed at random.

use parking_lot::Mutex;

use super::book::{Book, Placed};
use super::table::{ArenaTable, MAX_ARENA_BUFFERS};
use crate::error::Result;
use crate::lease::ExportLeases;
use crate::process::ProcessIdentity;
use crate::shm::ShmRegion;

/// A block table, its lease table and the books (see the module docs).
pub(crate) struct Ledger {
    pub(crate) token: [u8; 16],
    pub(crate) table: ShmRegion<ArenaTable>,
    pub(crate) leases: ExportLeases,
    book: Mutex<Book>,
    max_buffers: usize,
}

impl Ledger {
    /// Create the tables of `token`: `capacity` bytes placed in [`ALIGN`](super::book::ALIGN)
    /// units, at most `max_buffers` blocks live or quarantined.
    pub(crate) fn create(token: &[u8; 16], capacity: u64, max_buffers: usize) -> Result<Self> {
        let max_buffers = max_buffers.clamp(1, MAX_ARENA_BUFFERS);
        let table = ArenaTable::create(token, capacity)?;
        Ok(Self {
            token: *token,
            table,
            leases: ExportLeases::create(token)?,
            book: Mutex::new(Book::new(capacity, max_buffers)),
            max_buffers,
        })
    }

    /// Place and publish `bytes`, reclaiming (and reaping importers proven dead, if that is
    /// not enough) when short; `None` when nothing can be placed.
    pub(crate) fn alloc(&self, bytes: u64) -> Option<Placed> {
        let mut book = self.book.lock();
        match book.alloc(&self.table.blocks, bytes) {
            Ok(p) => Some(p),
            Err(_) => {
                self.reclaim(&mut book, false);
                book.alloc(&self.table.blocks, bytes).ok()
            }
        }
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

    fn reclaim(&self, book: &mut Book, reap: bool) {
        super::reclaim(book, &self.table, &self.leases, self.max_buffers, reap);
    }
}
