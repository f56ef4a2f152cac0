//! The arena's protocol without a GPU, for the multi-process stress test
//! (`tests/arena_stress.rs`): the owner's books, block table and lease table, and an importer's
//! lease and block entries, with no memory behind them. Not part of the API.

use super::book::{Book, Placed};
use super::label::Label;
use super::lease::Lease;
use super::owner::Ledger;
use super::table::Enter;
use super::table::{BlockTable, MAX_BLOCKS};
use crate::error::Result;
use crate::shm::ShmRegion;

/// An arena owner without memory: the `Ledger` (`ledger/mod.rs`) that the export registry
/// uses, so the stress test drives that code.
pub struct Owner {
    ledger: Ledger,
}

/// One allocation: (block index, generation, byte offset, bytes).
pub type Placement = (u32, u64, u64, u64);

impl Owner {
    /// Create the tables of arena `token`, `capacity` bytes, up to `max_buffers` buffers.
    ///
    /// # Errors
    ///
    /// As the tables' creation.
    pub fn create(token: &[u8; 16], capacity: u64, max_buffers: usize) -> Result<Self> {
        Ok(Self {
            ledger: Ledger::create(token, capacity, max_buffers)?,
        })
    }

    /// Allocate `bytes`, reclaiming (and reaping the dead) when short, as `IpcArena::alloc`.
    pub fn alloc(&mut self, bytes: u64) -> Option<Placement> {
        let placed = self.ledger.alloc(bytes, Label::FOR_TESTS).ok()?;
        Some((placed.index, placed.generation, placed.offset, placed.bytes))
    }

    /// Free an allocation, as dropping an `ArenaBuffer`.
    pub fn free(&mut self, (index, generation, offset, bytes): Placement) {
        self.ledger.free(Placed {
            index,
            generation,
            offset,
            bytes,
        });
    }

    /// `IpcArena::collect`: the bytes still quarantined.
    pub fn collect(&mut self) -> u64 {
        self.ledger.collect()
    }

    /// Bytes free now.
    pub fn free_bytes(&self) -> u64 {
        self.ledger.free_bytes()
    }
}

/// The owner's books and a block table in this process's memory (no shared memory, no
/// leases), for the fuzz target: honest operations and hostile writes in any order.
pub struct Books {
    book: Book,
    blocks: Vec<crate::ledger::table::Block>,
}

impl Books {
    /// Books for `capacity` bytes and up to `max_buffers` buffers.
    #[must_use]
    pub fn new(capacity: u64, max_buffers: usize) -> Self {
        let book = Book::new(capacity, max_buffers);
        let blocks = (0..max_buffers.clamp(1, MAX_BLOCKS))
            .map(|_| crate::ledger::table::Block::new())
            .collect();
        Self { book, blocks }
    }

    /// Allocate `bytes`, reclaiming released ranges when short (as `IpcArena::alloc`).
    pub fn alloc(&mut self, bytes: u64) -> Option<Placement> {
        let placed = match self.book.alloc(&self.blocks, bytes, Label::FOR_TESTS) {
            Ok(p) => p,
            Err(_) => {
                self.book.reclaim(&self.blocks, 0);
                self.book
                    .alloc(&self.blocks, bytes, Label::FOR_TESTS)
                    .ok()?
            }
        };
        Some((placed.index, placed.generation, placed.offset, placed.bytes))
    }

    /// Free an allocation (as dropping an `ArenaBuffer`).
    pub fn free(&mut self, (index, generation, offset, bytes): Placement) {
        let placed = Placed {
            index,
            generation,
            offset,
            bytes,
        };
        self.book.free(&self.blocks, placed);
    }

    /// Give back released ranges, clearing the bits of the importers in `dead` first.
    pub fn reclaim(&mut self, dead: u64) {
        self.book.reclaim(&self.blocks, dead);
    }

    /// An importer with bit `bit` enters block `index` of `generation`.
    #[must_use]
    pub fn enter(&self, bit: u64, index: u32, generation: u64) -> bool {
        self.blocks
            .get(index as usize)
            .is_some_and(|b| b.enter(bit, generation) == Enter::Held)
    }

    /// The importer with bit `bit` leaves block `index`.
    pub fn leave(&self, bit: u64, index: u32) {
        if let Some(b) = self.blocks.get(index as usize) {
            b.leave(bit);
        }
    }

    /// Overwrite word `word` of the block table (4 words per block) with `value`.
    pub fn scribble(&self, word: usize, value: u64) {
        let n = self.blocks.len();
        self.blocks[(word / 4) % n].scribble(word, value);
    }

    /// Bytes free now.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.book.free_bytes()
    }

    /// Bytes of freed buffers still viewed.
    #[must_use]
    pub fn quarantined_bytes(&self) -> u64 {
        self.book.quarantined_bytes()
    }
}

/// An importer: a lease (its bit) and per-block entries, without views' reference counts.
pub struct Importer {
    table: ShmRegion<BlockTable>,
    lease: Lease,
}

impl Importer {
    /// Import arena `token` of `capacity` bytes (take a lease, open the block table).
    ///
    /// # Errors
    ///
    /// As `ImportedArena::open_fd` for the tables.
    pub fn open(token: &[u8; 16], capacity: u64) -> Result<Self> {
        let table = BlockTable::open(token, capacity, 0)?;
        let lease = Lease::acquire_clearing(token, 0, &table)?;
        Ok(Self { table, lease })
    }

    /// The importer's bit index (its lease slot).
    #[must_use]
    pub fn slot(&self) -> usize {
        self.lease.slot()
    }

    /// Enter block `index` of generation `generation`, calling `pause` between setting the
    /// bit and reading the state; on success the published (offset, bytes).
    pub fn enter_pausing(
        &self,
        index: u32,
        generation: u64,
        pause: impl FnOnce(),
    ) -> Option<(u64, u64)> {
        let block = self.table.block(index)?;
        let bit = 1u64 << self.lease.slot();
        match block.enter_pausing(bit, generation, pause) {
            Enter::Held => Some(block.range()),
            Enter::Stale => None,
        }
    }

    /// Leave block `index` (the last view is gone).
    pub fn leave(&self, index: u32) {
        if let Some(block) = self.table.block(index) {
            block.leave(1u64 << self.lease.slot());
        }
    }
}
