//! The owner's side of the ledger: [`Ledger`], a block table, a lease table and the books
//! behind one lock (the module docs of `ledger` say how a call goes).

use parking_lot::Mutex;

use super::book::{Book, Full, Placed};
use super::label::Label;
use super::lease::{self, ExportLeases};
use super::table::{BlockTable, MAX_BLOCKS};
use crate::error::Result;
use crate::process::ProcessIdentity;
use crate::shm::ShmRegion;
use crate::trace;

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
    token: [u8; 16],
    table: ShmRegion<BlockTable>,
    leases: ExportLeases,
    book: Mutex<Book>,
    max_buffers: usize,
}

impl Ledger {
    /// Create the tables of `token`: `capacity` bytes placed in [`ALIGN`](super::book::ALIGN)
    /// units, at most `max_buffers` blocks live or quarantined.
    pub(crate) fn create(token: &[u8; 16], capacity: u64, max_buffers: usize) -> Result<Self> {
        let max_buffers = max_buffers.clamp(1, MAX_BLOCKS);
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
        let max_buffers = max_buffers.clamp(1, MAX_BLOCKS);
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
    /// What the books hold when nothing can be placed (for
    /// [`Error::ArenaFull`](crate::Error::ArenaFull)).
    pub(crate) fn alloc(&self, bytes: u64, label: Label) -> std::result::Result<Placed, Full> {
        let mut book = self.book.lock();
        let placed = match book.alloc(&self.table.blocks, bytes, label) {
            Ok(p) => Ok(p),
            Err(_) => {
                self.reclaim(&mut book, false);
                book.alloc(&self.table.blocks, bytes, label)
            }
        };
        #[cfg(feature = "tracing")]
        match &placed {
            Ok(p) => trace::event!(
                "export published",
                kind = %label.kind,
                device = %label.device_name(),
                read_only = label.read_only,
                bytes,
                block = p.index,
                generation = p.generation
            ),
            Err(full) => trace::event!(
                "export refused: the table is full",
                kind = %label.kind,
                bytes,
                buffers = full.buffers
            ),
        }
        placed
    }

    /// Relabel `placed`'s block while it is live (an export marked read-only after its first
    /// handle); a block no longer `placed`'s is left alone.
    pub(crate) fn relabel(&self, placed: &Placed, label: Label) {
        let Some(block) = self.table.blocks.get(placed.index as usize) else {
            return;
        };
        if block.is_live(placed.generation) {
            block.relabel(label);
        }
    }

    /// The token that names the tables (and, in handles, this export).
    pub(crate) fn token(&self) -> [u8; 16] {
        self.token
    }

    /// Whether this process created the tables (false in a child forked without `exec`,
    /// which must leave them to its parent: see `process::Home`).
    pub(crate) fn is_home(&self) -> bool {
        self.table.is_home()
    }

    /// Refuse every new import from now on (the owner is going): the block table says
    /// *closing* to importers that hold it, the lease table grants no new lease.
    pub(crate) fn begin_close(&self) {
        self.table.closing.store(1, crate::sync::Ordering::Release);
        self.leases.begin_close();
    }

    /// Remove the tables' names (the owner's last act; mappings stay valid).
    pub(crate) fn unlink_names(&self) {
        let _ = self.table.unlink_shared();
        self.leases.unlink_name();
    }

    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// The `/dev/shm` names of the tables.
    pub(crate) fn names(&self) -> Vec<String> {
        vec![
            self.table.name().to_string(),
            self.leases.name().to_string(),
        ]
    }

    /// The pids of the live processes holding a lease now.
    pub(crate) fn holders(&self) -> Vec<u32> {
        self.leases.holders()
    }

    /// Whether a process (another, or an import in this one) holds `placed`'s block now.
    pub(crate) fn is_viewed(&self, placed: &Placed) -> bool {
        self.table
            .block(placed.index)
            .is_some_and(|b| b.holders() != 0)
    }

    /// Retire `placed` without giving its block back: new opens of its handles are stale
    /// from now on; [`free`](Self::free) gives it back later.
    pub(crate) fn retire(&self, placed: &Placed) {
        if let Some(block) = self.table.block(placed.index) {
            block.retire(placed.generation);
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
        let held = book.is_quarantined(&placed);
        trace::event!(
            "export retired",
            block = placed.index,
            generation = placed.generation,
            bytes = placed.bytes,
            held
        );
        held
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
    for block in &table.blocks[..max_buffers.min(MAX_BLOCKS)] {
        if block.holders() & mask != 0 {
            block.clear_dead(mask);
        }
    }
    for (i, held) in taken {
        trace::event!(
            "dead importer reaped",
            slot = i,
            pid = crate::owned_slot::Owner::decode(held).pid
        );
        leases.release_taken(i, held);
    }
    true
}
