//! The export registry: who maps each [`IpcBuffer`](crate::IpcBuffer) and
//! [`IpcSignal`](crate::IpcSignal) this process exports, in two `/dev/shm` files per process
//! however many it exports.
//!
//! # Layout
//!
//! At its first export a process creates one ledger ([`Ledger`]: the arena protocol without
//! memory): a block table `cuda-ipc-arena.<token>` with one block per export, live or waiting
//! for importers, and a lease table `cuda-ipc-lease.<token>` with one slot per importing
//! process. An export's handle names the process's table (the first 12 bytes of its token),
//! its block (the last 4) and its generation. At most [`MAX_EXPORTS`] exports are live or
//! waiting at a time, and at most 64 processes import from one process at a time.
//!
//! # Protocol
//!
//! The arena's, in `ledger/table.rs`, with an export in place of an arena buffer:
//!
//! - **Export** (the first `handle` or `export_fd` of a buffer): publish a block with a new odd
//!   generation.
//! - **Open** (importer): take a lease slot in the exporter's lease table — once per exporter
//!   process, kept while this process holds any of its exports — then *enter* the block (set
//!   our bit, then check the generation with a read-modify-write; a mismatch clears the bit:
//!   [`Error::StaleHandle`]). Only then map the memory.
//! - **Unmap** (importer): the last mapping of the export in this process is closed, then the
//!   bit is cleared (*leave*).
//! - **Drop or close** (exporter): *retire* the block (swap in the even generation; every
//!   later open is stale), then read the bits. None: the memory is freed at once and the block
//!   may be reused. Some: the block is quarantined and the free deferred (`deferred.rs`) until a
//!   collect finds the bits cleared — by their importers, or by the exporter for importers
//!   proven dead (their bits in every block, then their lease slots).
//!
//! Enter's check and retire's swap are read-modify-writes of one word: either the importer sees
//! the retired generation and backs off before mapping, or the exporter sees the importer's bit
//! and keeps the memory. A block is reused only with no bit set, so a stale handle never opens
//! the export that replaced it.
//!
//! # What each side sees when the other stops
//!
//! | The other side is preempted or `SIGKILL`ed... | This side sees |
//! |------------------------------------------------|----------------|
//! | importer, during its lease claim | as in `lease.rs`: a holder while it lives; reaped once dead |
//! | importer, after setting its bit, before checking the generation | exporter: a holder (the free waits); once the importer is dead, its bit is cleared by a collect |
//! | importer, mapping or holding the export | exporter: a holder until the importer leaves or is proven dead (its mappings died with it) |
//! | importer, after unmapping, before leaving | exporter: a holder until the bit clears or the importer is reaped; memory freed late, never early |
//! | exporter, between retire and reading the bits | importer: opens are stale from the swap on; mappings already made stay valid |
//! | exporter, killed at any point | importer: opens say the exporter is gone (checked before the tables); the driver frees the memory with the exporter's context; the last importer to leave removes both names |
//!
//! # Proofs
//!
//! The two-party core (enter against retire, reuse, death mid-enter) is the arena's: its loom
//! model and replay tests in `ledger/table.rs`, and `tests/arena_stress.rs`, whose owner is the
//! same [`Ledger`] this registry uses, under random kills with a shadow record. The registry's
//! own steps (one lease per exporter process shared by every import from it, per-block counts
//! across mappings, handles naming blocks that were reused) have replay tests below, and
//! `tests/registry_stress.rs` runs exports, drops, deferred frees and importer processes
//! killed at random through this module, against a shadow record (an injected bug — a retired
//! export reported free while held — is caught within the 8 s run).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, HandleDefect, Result};
use crate::ledger::book::Placed;
use crate::ledger::cache::{Dying, Entry, ImportCache, TableCache};
use crate::ledger::holdings::{Holding, Holdings};
use crate::ledger::label::Label;
use crate::ledger::owner::Ledger;
use crate::ledger::table::{BlockTable, MAX_BLOCKS};
use crate::process::ProcessIdentity;

/// The most exports a process has live, or dropped while importers still map them, at a time.
pub(crate) const MAX_EXPORTS: usize = MAX_BLOCKS;

/// This process's ledger, created at its first export.
static LEDGER: Mutex<Option<Arc<Ledger>>> = parking_lot::const_mutex(None);

fn ledger() -> Result<Arc<Ledger>> {
    let mut slot = LEDGER.lock();
    if let Some(ledger) = &*slot {
        return Ok(ledger.clone());
    }
    let mut token = [0u8; 16];
    token[..8].copy_from_slice(&crate::os::random_u64()?.to_le_bytes());
    token[8..12].copy_from_slice(&crate::os::random_u64()?.to_le_bytes()[..4]);
    let ledger = Arc::new(Ledger::create_indexed(&token, MAX_EXPORTS)?);
    *slot = Some(ledger.clone());
    drop(slot);
    unlink_at_exit();
    Ok(ledger)
}

/// Once per process: have `exit` remove the ledger's two names (importers keep their
/// mappings; an exporter that exits is gone for new opens anyway). Not run when the process
/// is killed: then its last importer, or the next process's sweep, removes them.
fn unlink_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments whose body cannot
        // panic (a `try_lock` and unlink system calls whose errors are ignored), so it never
        // unwinds across the C boundary, and it does not call `exit`. A failed registration
        // only leaves the names to the sweep.
        let _ = unsafe { crate::os::at_exit(unlink_ledger) };
    });
}

extern "C" fn unlink_ledger() {
    // `try_lock`: an exit from inside an export must not deadlock (the names then stay).
    if let Some(slot) = LEDGER.try_lock()
        && let Some(ledger) = &*slot
        && ledger.is_home()
    {
        ledger.unlink_names();
    }
}

#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
/// The `/dev/shm` names of this process's export registry (none before its first export).
pub(crate) fn names() -> Vec<String> {
    LEDGER.lock().as_ref().map_or_else(Vec::new, |l| l.names())
}

/// Give back the blocks of retired exports whose importers are gone, reaping importers
/// proven dead (called before checking [`Record::is_held`]).
pub(crate) fn collect() {
    let ledger = LEDGER.lock().clone();
    if let Some(ledger) = ledger {
        ledger.collect();
    }
}

/// An export's block, held by the exported buffer (and by its deferred free).
pub(crate) struct Record {
    ledger: Arc<Ledger>,
    placed: Placed,
    label: Label,
    retired: bool,
}

impl Record {
    /// Publish a block for a new export of `bytes` bytes, labelled `label`.
    ///
    /// # Errors
    ///
    /// [`Error::TooManyBuffers`] when [`MAX_EXPORTS`] are live or waiting for importers (after
    /// reclaiming); a shared-memory error creating the ledger at the first export.
    pub(crate) fn publish(bytes: u64, label: Label) -> Result<Self> {
        let ledger = ledger()?;
        let placed = ledger
            .alloc(bytes.max(1), label) // books of indexes place no bytes: the size is told
            .map_err(|_| Error::TooManyBuffers { max: MAX_EXPORTS })?;
        Ok(Self {
            ledger,
            placed,
            label,
            retired: false,
        })
    }

    /// Relabel the live export, if `label` is new (a buffer marked read-only after its first
    /// handle).
    pub(crate) fn relabel(&mut self, label: Label) {
        if !self.retired && label != self.label {
            self.label = label;
            self.ledger.relabel(&self.placed, label);
        }
    }

    /// The token a handle carries: the ledger's, with the block index in its last 4 bytes.
    pub(crate) fn token(&self) -> [u8; 16] {
        let mut token = self.ledger.token();
        token[12..].copy_from_slice(&self.placed.index.to_le_bytes());
        token
    }

    /// The generation a handle carries.
    pub(crate) fn generation(&self) -> u64 {
        self.placed.generation
    }

    /// Retire the export (every later open is stale; doing it again changes nothing) and say
    /// whether an importer still holds it.
    pub(crate) fn retire(&mut self) -> bool {
        if self.retired {
            return self.is_held();
        }
        self.retired = true;
        self.ledger.free(self.placed)
    }

    /// Whether a live (or not yet reaped) importer holds the export; always true before it is
    /// retired. Read the state after a [`collect`].
    pub(crate) fn is_held(&self) -> bool {
        !self.retired || self.ledger.is_quarantined(&self.placed)
    }

    /// The pids of live processes that map the export (empty once it was retired and given
    /// back: the block may describe another export by then).
    pub(crate) fn importers(&self) -> Vec<u32> {
        if self.is_held() {
            self.ledger.holders_of(self.placed.index)
        } else {
            Vec::new()
        }
    }

    /// A process that died with the export mapped, if any. Read-only.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        if self.is_held() {
            self.ledger.dead_holder_of(self.placed.index)
        } else {
            None
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if !self.ledger.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // A record dropped without a retire (a buffer's drop always retires first) is retired
        // here: its block comes back once no importer holds it.
        self.retire();
    }
}

/// One exporter's ledger as this process maps it: our lease slot (our bit) and, per block we
/// hold, its generation and how many of our mappings use it.
struct ImportedLedger {
    token: [u8; 16],
    /// The exporter's block table, our bit in it, and the blocks we hold.
    holdings: Holdings<()>,
    exporter: ProcessIdentity,
}

/// The exporters' ledgers this process maps, by token (shared by every import from one
/// exporter; dropped with the last). A ledger being dropped releases its lease meanwhile; a new
/// import from the exporter takes a lease of its own beside it.
static IMPORTED: ImportCache<[u8; 16], ImportedLedger> = ImportCache::new(Dying::Coexist);

/// Block tables of exporters this process imported from (see [`TableCache`]): an entry goes
/// when its exporter is found dead (with the last import from it) or, past the bound, oldest
/// first.
static TABLES: TableCache<BlockTable> = TableCache::new();

/// An import's hold on its export's block: while it lives, the exporter does not free the
/// memory. Drop it after unmapping.
pub(crate) struct Hold {
    ledger: Arc<ImportedLedger>,
    index: u32,
    generation: u64,
}

/// The ledger token and block index a handle's token names.
fn split(token: &[u8; 16]) -> Result<([u8; 16], u32)> {
    let mut ledger = *token;
    ledger[12..].fill(0);
    let mut index = [0u8; 4];
    index.copy_from_slice(&token[12..]);
    let index = u32::from_le_bytes(index);
    if index as usize >= MAX_EXPORTS {
        return Err(Error::corrupt_handle(HandleDefect::Names {
            detail: format!("export block {index} out of range (at most {MAX_EXPORTS})"),
        }));
    }
    Ok((ledger, index))
}

/// Enter the block a handle names (`token`, `generation`) for `exporter`'s export: the lease
/// and bit of this process in the exporter's ledger, then the block's generation checked.
///
/// # Errors
///
/// [`Error::CorruptHandle`] for a block out of range or an even generation;
/// [`Error::StaleHandle`] when the export was dropped (or the ledger is gone);
/// [`Error::TooManyImporters`]; shared-memory errors opening the ledger.
pub(crate) fn enter(token: &[u8; 16], generation: u64, exporter: ProcessIdentity) -> Result<Hold> {
    enter_pausing(token, generation, exporter, || {})
}

/// [`enter`], calling `pause` between setting our bit and checking the generation (the
/// replay tests retire the export there).
fn enter_pausing(
    token: &[u8; 16],
    generation: u64,
    exporter: ProcessIdentity,
    pause: impl FnOnce(),
) -> Result<Hold> {
    let (ledger_token, index) = split(token)?;
    if !crate::ledger::table::names_a_live_export(generation) {
        return Err(Error::corrupt_handle(HandleDefect::Names {
            detail: format!("generation {generation} is not a live export's (odd)"),
        }));
    }
    let ledger = imported(&ledger_token, generation, exporter)?;
    ledger.enter(index, generation, pause)
}

/// The exporter's ledger, mapped (once per process) with our lease in it.
fn imported(
    token: &[u8; 16],
    generation: u64,
    exporter: ProcessIdentity,
) -> Result<Arc<ImportedLedger>> {
    // Two threads importing from one exporter share one lease (the cache's creation lock).
    let vacancy = match IMPORTED.entry(token) {
        Entry::Live(hit) => return Ok(hit),
        Entry::Vacant(vacancy) => vacancy,
    };
    let table = match TABLES.cached(token) {
        Some(table) => table,
        None => TABLES.keep(token, BlockTable::open(token, 0, generation)?),
    };
    // With every slot taken, take over a dead importer's, clearing its bits first: no call of
    // an idle exporter is needed to reap.
    let holdings = Holdings::open(token, generation, table)?;
    let table = &holdings.table;
    // The ledger must be the exporter's own: a handle naming one process and another's ledger
    // would hold the wrong process's memory.
    if !table.creator().is_same_process(&exporter) {
        return Err(Error::corrupt_handle(HandleDefect::Names {
            detail: format!(
                "the handle names process {} but an export registry of process {}",
                exporter.pid(),
                table.creator().pid()
            ),
        }));
    }
    Ok(vacancy.fill(Arc::new(ImportedLedger {
        token: *token,
        holdings,
        exporter,
    })))
}

impl ImportedLedger {
    fn enter(self: &Arc<Self>, index: u32, generation: u64, pause: impl FnOnce()) -> Result<Hold> {
        // Nothing to map here and nothing kept: the buffer or signal maps its memory after.
        match self.holdings.enter(index, generation, pause)? {
            Holding::Held(view) => view.count(),
            Holding::Entered(first) => first.fill(()),
        }
        Ok(Hold {
            ledger: self.clone(),
            index,
            generation,
        })
    }
}

impl Drop for ImportedLedger {
    fn drop(&mut self) {
        if !self.holdings.table.is_home() {
            self.holdings.leave_lease_to_parent();
            IMPORTED.forget(&self.token);
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // The exporter died without removing its names, and nobody else imports from it: the
        // last importer removes them (the lease table's when our lease drops; the block
        // table's here). Tokens are random and never reused, and opens of a dead exporter's
        // handles are refused before the tables are looked at.
        let exporter_dead = !crate::process::is_alive_cached(&self.exporter);
        let others = self.holdings.lease().is_some_and(|l| {
            !l.table()
                .holders_in(!self.holdings.bit, &|_: &ProcessIdentity| true)
                .is_empty()
        });
        self.holdings.release_lease();
        if exporter_dead && !others {
            let _ = self.holdings.table.unlink_shared();
            TABLES.forget(&self.token);
        }
        IMPORTED.forget(&self.token);
    }
}

impl Hold {
    /// Whether the export is still live (false once its exporter dropped it: the mapping stays
    /// valid, but new opens are refused).
    pub(crate) fn is_live(&self) -> bool {
        self.ledger
            .holdings
            .table
            .block(self.index)
            .is_some_and(|b| b.is_live(self.generation))
    }

    /// The generation the handle named.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Another process that died holding this export, if any. Read-only.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        let holdings = &self.ledger.holdings;
        let mask = holdings.table.block(self.index).map_or(0, |b| b.holders()) & !holdings.bit;
        self.ledger.holdings.lease()?.table().dead_holder_in(mask)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.ledger.holdings.table.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // The buffer or signal unmapped before its hold drops: the bit may go.
        self.ledger.holdings.leave(self.index, |()| true);
    }
}

/// The registry without a GPU, for the multi-process stress test (`tests/registry_stress.rs`):
/// an exporter's records and an importer's holds, with no memory behind them. Not part of the
/// API.
#[doc(hidden)]
#[allow(missing_debug_implementations)] // test hooks, not API
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __testing {
    use super::*;

    /// An export's record in this process's registry.
    pub struct Export(Record);

    impl Export {
        /// Publish a block, as a buffer's first export does.
        ///
        /// # Errors
        ///
        /// As [`IpcBuffer::handle`](crate::IpcBuffer::handle) for the registry.
        pub fn publish() -> Result<Self> {
            Record::publish(1, Label::FOR_TESTS).map(Self)
        }

        /// The token a handle would carry.
        #[must_use]
        pub fn token(&self) -> [u8; 16] {
            self.0.token()
        }

        /// The generation a handle would carry.
        #[must_use]
        pub fn generation(&self) -> u64 {
            self.0.generation()
        }

        /// Retire it (as a drop does); whether an importer still holds it.
        pub fn retire(&mut self) -> bool {
            self.0.retire()
        }

        /// Whether an importer holds it (read after [`collect`]).
        #[must_use]
        pub fn is_held(&self) -> bool {
            self.0.is_held()
        }
    }

    /// The `/dev/shm` names of this process's export registry (its block table and lease
    /// table), empty before its first export: tests that check nothing is left in `/dev/shm`
    /// leave these out (they live until the process exits).
    #[must_use]
    pub fn names() -> Vec<String> {
        super::names()
    }

    /// What a deferred-free sweep does first: give back blocks whose holders are gone,
    /// reaping importers proven dead.
    pub fn collect() {
        super::collect();
    }

    /// An importer's hold on an export (leaves the block on drop).
    pub struct Held(Hold);

    impl Held {
        /// Whether the export is still live.
        #[must_use]
        pub fn is_live(&self) -> bool {
            self.0.is_live()
        }
    }

    /// Enter the export a handle names, as an open does before mapping, calling `pause`
    /// between setting the bit and checking the generation.
    ///
    /// # Errors
    ///
    /// As an open's registry step: [`Error::StaleHandle`], [`Error::TooManyImporters`], ...
    pub fn enter_pausing(
        token: &[u8; 16],
        generation: u64,
        exporter: ProcessIdentity,
        pause: impl FnOnce(),
    ) -> Result<Held> {
        super::enter_pausing(token, generation, exporter, pause).map(Held)
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    //! Replay tests of the registry's own steps, in one process that exports and imports
    //! (as an exporter opening its own POSIX-fd handle does). The enter/retire core has its
    //! own in `ledger/table.rs`.
    use super::*;

    fn me() -> ProcessIdentity {
        ProcessIdentity::current()
    }

    fn stale(r: Result<Hold>) -> bool {
        matches!(r, Err(Error::StaleHandle { .. }))
    }

    #[test]
    fn a_handle_of_a_reused_block_is_stale_and_the_new_export_opens() {
        let mut old = Record::publish(1, Label::FOR_TESTS).unwrap();
        let (token, generation) = (old.token(), old.generation());
        assert!(
            !old.retire(),
            "nobody held it: the block comes back at once"
        );
        // Blocks are reused last-freed first: the next export in this thread most likely
        // takes the same block (other tests may take it first; then it is another block).
        let new = Record::publish(1, Label::FOR_TESTS).unwrap();
        assert!(
            stale(enter(&token, generation, me())),
            "the old handle must not open"
        );
        if new.token() == token {
            assert_eq!(new.generation(), generation + 2);
        }
        let hold = enter(&new.token(), new.generation(), me()).unwrap();
        assert!(hold.is_live());
        assert_eq!(new.importers(), vec![std::process::id()]);
    }

    #[test]
    fn the_exporter_waits_until_every_mapping_of_an_export_has_left() {
        let mut record = Record::publish(1, Label::FOR_TESTS).unwrap();
        let (token, generation) = (record.token(), record.generation());
        let a = enter(&token, generation, me()).unwrap();
        let b = enter(&token, generation, me()).unwrap(); // a second mapping (another context)
        assert!(record.retire(), "held: the free must wait");
        assert!(!a.is_live() && !b.is_live());
        assert!(
            stale(enter(&token, generation, me())),
            "retired: new opens refused"
        );
        drop(a);
        collect();
        assert!(record.is_held(), "one mapping is left: still held");
        drop(b);
        collect();
        assert!(!record.is_held(), "the last mapping left: free");
        assert!(record.importers().is_empty());
    }

    /// Replay: an importer sets its bit and is preempted before checking the generation;
    /// the exporter retires right then. The exporter sees a holder (the free waits); the
    /// importer sees the retired generation and backs off without mapping; the next collect
    /// finds the block free.
    #[test]
    fn an_enter_stalled_across_the_retire_defers_the_free_then_backs_off() {
        let mut record = Record::publish(1, Label::FOR_TESTS).unwrap();
        let (token, generation) = (record.token(), record.generation());
        let mut held_at_retire = None;
        let got = enter_pausing(&token, generation, me(), || {
            held_at_retire = Some(record.retire());
        });
        assert_eq!(
            held_at_retire,
            Some(true),
            "the half-done enter is a holder"
        );
        assert!(stale(got), "the enter must back off once retired");
        collect();
        assert!(!record.is_held(), "the backed-off importer cleared its bit");
    }

    #[test]
    fn one_lease_serves_every_import_from_one_exporter() {
        let records: Vec<Record> = (0..3)
            .map(|_| Record::publish(1, Label::FOR_TESTS).unwrap())
            .collect();
        let holds: Vec<Hold> = records
            .iter()
            .map(|r| enter(&r.token(), r.generation(), me()).unwrap())
            .collect();
        let bits: Vec<u64> = holds.iter().map(|h| h.ledger.holdings.bit).collect();
        assert!(
            bits.iter().all(|&b| b == bits[0]),
            "one bit for the process"
        );
        assert!(
            holds
                .iter()
                .all(|h| Arc::ptr_eq(&h.ledger, &holds[0].ledger))
        );
        for r in &records {
            assert_eq!(r.importers(), vec![std::process::id()]);
        }
    }

    #[test]
    fn forged_blocks_and_generations_are_refused_before_the_tables() {
        let record = Record::publish(1, Label::FOR_TESTS).unwrap();
        let mut token = record.token();
        token[12..].copy_from_slice(&(MAX_EXPORTS as u32).to_le_bytes());
        assert!(matches!(
            enter(&token, record.generation(), me()),
            Err(Error::CorruptHandle { .. })
        ));
        assert!(matches!(
            enter(&record.token(), record.generation() + 1, me()),
            Err(Error::CorruptHandle { .. })
        ));
        // A live block under another odd generation: stale, not opened.
        assert!(stale(enter(&record.token(), record.generation() + 2, me())));
    }

    #[test]
    fn a_ledger_that_is_not_there_is_stale() {
        let mut token = [0x5a; 16];
        token[12..].fill(0);
        assert!(stale(enter(&token, 1, me())));
    }
}
