//! Leases: which processes import from an exporter.
//!
//! A lease table is a [`ShmRegion`] named after a random token (`cuda-ipc-lease.<token>`) with one
//! slot per importing process: one table per exporting process for all its buffers and signals
//! (beside the export registry's block table, `registry.rs`), and one per
//! [`IpcArena`](crate::arena::IpcArena) and per [`IpcPool`](crate::pool::IpcPool). An importer
//! claims a slot before it maps anything and frees it when it is done with the exporter; its slot
//! number is its bit in the block table, where it marks each export it maps (the arena protocol,
//! `ledger/table.rs`). The exporter reaps the slots of importers proven dead.
//!
//! The table can also be *closed* (an arena's or pool's owner does it when dropped): claims
//! after that fail, and a scan that finds no holder proves nobody maps anything and nobody can
//! start to.
//!
//! # Protocol
//!
//! A slot is one [`OwnedSlot`]: its state and its owner's pid and start time change together
//! in one compare-exchange, so nobody ever sees a slot taken without its owner.
//!
//! - **Claim** (importer): `0 → Claiming(me)` (compare-exchange), write the pidfs inode,
//!   `Claiming(me) → Held(me)`, then read *closing*; if set, release and report
//!   [`Error::StaleHandle`]. Only after that does the importer map the memory.
//! - **Release** (importer, after unmapping): `Held(me) → 0`, compare-exchange against its own
//!   word, so it can never free a slot that has changed hands.
//! - **Close** (exporter): set *closing*, then scan: a slot whose owner is alive is a holder; a
//!   slot whose owner is proven dead is reaped with a compare-exchange against the exact word
//!   judged. The memory is freed only after a scan finds no holder.
//! - Setting *closing* and the claimer's check of it after its claim are both
//!   read-modify-writes of the one word, so either the exporter's scan sees a claim, or the
//!   claimer sees *closing* and backs off before mapping.
//! - Reaping a slot under *closing* frees it at once (nobody can be about to use it);
//!   [`ExportLeases::holders`] outside a close only reads. Outside a close, a proven-dead
//!   holder's slot is **taken, never freed directly**: the owner of an export registry, arena
//!   or pool takes it (`dead word → Claiming(owner)`, compare-exchange against the exact word
//!   judged), clears its bits in the block table, and gives it back
//!   ([`ExportLeases::take_dead_slots`]); an importer that finds every slot taken takes one
//!   over the same way, clears its bits, and holds it ([`Slots::claim_or_take_over`]). Of two
//!   processes racing for one dead word one compare-exchange wins, and only the winner touches
//!   that slot's bits, so no process ever clears a bit that a live holder set. Reaping thus
//!   needs no call of an idle exporter: dead importers never lock the 65th one out.
//!
//! # What each side sees when the other stops
//!
//! | The other side is preempted or `SIGKILL`ed... | This side sees |
//! |------------------------------------------------|----------------|
//! | importer, before its claim's compare-exchange | nothing: the slot is free |
//! | importer, between the compare-exchange and `Held` | `Claiming(pid)`: a live holder while it runs; once it is dead, the exporter's close reaps it |
//! | importer, after `Held`, before or after mapping | a holder; once dead, reaped by the close (its mapping died with it) |
//! | importer, after unmapping, before release | a holder until it releases or dies: close waits, then reaps |
//! | importer taking over a dead slot, after its compare-exchange (bits partly cleared) | `Claiming(pid)`: a live holder while it runs; once dead, the next reaper or claimer takes the slot and clears the bits again (clearing a dead holder's bits twice is harmless) |
//! | owner taking a dead slot, before it gives it back | `Held(owner)`: a claimer skips it (the owner is alive); the owner's own close counts it until it is given back |
//! | exporter, after *closing*, before freeing | importers' new claims fail (`StaleHandle`); the last importer to release unlinks the table's name (the exporter keeps its mapping) |
//! | exporter, killed at any point | its memory is freed by the driver with its context; importers see `PeerGone` (exporter) on later opens and waits |
//!
//! Tested by: a loom model of close against two claimers, one of which dies mid-claim
//! (`loom_tests`); replay tests of the interleavings above (`tests` below, each written against
//! the defect it pins); and `tests/lease_stress.rs`, where processes claim, release and are
//! `SIGKILL`ed at random while an exporter polls and closes, checked against a shadow record.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ledger::cache::TableCache;
use crate::ledger::token::{token_name, token_words};
use crate::owned_slot::{OwnedSlot, OwnerState};
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
use crate::poll::Backoff;
use crate::process::ProcessIdentity;
use crate::shm::{ShmOptions, ShmRegion};
use crate::shm_safe::ShmSafe;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The most importing processes one export tracks.
pub(crate) const MAX_IMPORTERS: usize = 64;

#[repr(C)]
pub(crate) struct LeaseTable {
    token: [AtomicU64; 2],
    closing: AtomicU32,
    exporter_pid: AtomicU32,
    exporter_start: AtomicU64,
    slots: [OwnedSlot; MAX_IMPORTERS],
}

// SAFETY: repr(C), all fields integer atomics (valid for any bits, accessed atomically).
// Under `--cfg cuda_ipc_loom` (model checks only, where no region is ever mapped) the atomics are
// loom's; see `shm_safe.rs`.
unsafe impl ShmSafe for LeaseTable {
    fn type_tag() -> u64 {
        u64::from_le_bytes(*b"leases02")
    }
}

/// What a lease table says, read word by word: whether its exporter is closing it, the
/// exporter, and every slot not free, by index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseCensus {
    pub(crate) closing: bool,
    pub(crate) exporter: ProcessIdentity,
    pub(crate) slots: Vec<(u32, OwnerState, ProcessIdentity)>,
}

fn region_name(token: &[u8; 16]) -> String {
    token_name(crate::shm::LEASE_TABLES, token)
}

/// The outcome of a claim.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Slot `0`, held with word `1`.
    Granted(usize, u64),
    /// The exporter is closing: no lease (and the slot, if one was taken, is free again).
    Closing,
    /// Every slot is taken.
    Full,
}

/// The lease protocol over a *closing* flag and a set of slots: the table in shared memory
/// uses it, and so does the loom model (with a few slots on the heap).
pub(crate) struct Slots<'a> {
    pub(crate) closing: &'a AtomicU32,
    pub(crate) slots: &'a [OwnedSlot],
}

impl<'a> Slots<'a> {
    /// Claim a slot for `me` (see the module docs).
    #[cfg(test)]
    pub(crate) fn claim(&self, me: &ProcessIdentity) -> Claim {
        self.claim_pausing(me, || {})
    }

    /// `claim`, calling `pause` at its two windows: after the slot reads
    /// `Claiming` and after it reads `Held`, before the *closing* check. The stress test
    /// stalls or kills itself there; `claim` passes a no-op.
    #[cfg(test)]
    pub(crate) fn claim_pausing(&self, me: &ProcessIdentity, pause: impl FnMut()) -> Claim {
        self.claim_or_take_over(me, &|_: &ProcessIdentity| true, &mut |_| {}, pause)
    }

    /// Claim a free slot for `me`; with none free, **take over** the slot of a holder that
    /// `alive` proves dead: `dead word → Claiming(me)` in one compare-exchange against the exact
    /// word judged, then `take_over(slot)` while the slot reads `Claiming(me)` (an arena or
    /// registry importer clears the dead holder's bits there, so it starts with none), then
    /// `Held` and the *closing* check as for a free slot. `pause` runs at the claim's two
    /// windows (after the slot reads `Claiming`, and after `Held` before the *closing* check).
    ///
    /// Safe against the exporter's reaping because the exporter, too, takes a dead slot before
    /// it clears its bits ([`ExportLeases::take_dead_slots`]): of two processes racing for one
    /// dead word, one compare-exchange wins, and only the winner clears that slot's bits —
    /// never after another process made the slot its own and set a bit.
    pub(crate) fn claim_or_take_over(
        &self,
        me: &ProcessIdentity,
        alive: &dyn Fn(&ProcessIdentity) -> bool,
        take_over: &mut dyn FnMut(usize),
        mut pause: impl FnMut(),
    ) -> Claim {
        if self.closing.load(Ordering::SeqCst) != 0 {
            return Claim::Closing;
        }
        let mut granted = None;
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(held) = slot.claim_pausing(me, &mut pause) {
                granted = Some((i, slot, held));
                break;
            }
        }
        if granted.is_none() {
            granted = self.slots.iter().enumerate().find_map(|(i, slot)| {
                let (owner, id) = slot.load_identity();
                if owner.state == OwnerState::Free || alive(&id) {
                    return None;
                }
                let held = slot.claim_from(owner.word, me, || {
                    take_over(i);
                    pause();
                })?;
                Some((i, slot, held))
            });
        }
        let Some((i, slot, held)) = granted else {
            return Claim::Full;
        };
        pause();
        // Against `begin_close`: both sides read-modify-write `closing`, so one of the two
        // comes second and reads from the other: if ours comes second we see *closing*; if the
        // exporter's does, it acquires our claim and its scan sees our slot. (A plain SeqCst
        // load here is also correct, but the RMW makes the argument hold under
        // acquire/release alone, which loom checks exactly.)
        if self.closing.fetch_or(0, Ordering::SeqCst) != 0 {
            slot.transition(held, OwnerState::Free);
            return Claim::Closing;
        }
        Claim::Granted(i, held)
    }

    /// Take, for `me`, every slot held by a process `alive` proves dead (compare-exchange
    /// against the exact word judged, as a claimer taking a dead slot over does): the slots
    /// taken and our words in them. The caller clears their bits, then
    /// [`release`](Self::release)s them.
    pub(crate) fn take_dead(
        &self,
        me: &ProcessIdentity,
        alive: &dyn Fn(&ProcessIdentity) -> bool,
    ) -> Vec<(usize, u64)> {
        self.dead_slots(alive)
            .into_iter()
            .filter_map(|(i, word)| Some((i, self.slots.get(i)?.claim_from(word, me, || {})?)))
            .collect()
    }

    /// Give slot `i` back, if it still holds our word `held`.
    pub(crate) fn release(&self, i: usize, held: u64) {
        if let Some(slot) = self.slots.get(i) {
            slot.transition(held, OwnerState::Free);
        }
    }

    /// Refuse every later claim (a read-modify-write: see `claim_pausing`).
    pub(crate) fn begin_close(&self) {
        self.closing.swap(1, Ordering::SeqCst);
    }

    /// The pids of live holders. With `reap` (only under *closing*: then nobody can be about
    /// to use a slot it is taking), slots of proven-dead holders are freed.
    pub(crate) fn holders(&self, alive: &dyn Fn(&ProcessIdentity) -> bool, reap: bool) -> Vec<u32> {
        let reap = reap && self.closing.load(Ordering::SeqCst) != 0;
        let mut live = Vec::new();
        for slot in self.slots {
            // A reap that loses its compare-exchange means the slot changed hands: judge anew.
            // Three tries; a slot still changing after that counts as held (the close waits).
            let mut held_by = None;
            for _ in 0..3 {
                let (owner, id) = slot.load_identity();
                if owner.state == OwnerState::Free {
                    held_by = None;
                    break;
                }
                held_by = Some(owner.pid);
                if alive(&id) {
                    break;
                }
                if !reap {
                    held_by = None;
                    break;
                }
                if slot.reap(owner.word) {
                    held_by = None;
                    break;
                }
            }
            live.extend(held_by);
        }
        live
    }

    /// The slots held by processes proven dead, with the exact word judged (for
    /// [`Slots::take_dead`]). Read-only.
    pub(crate) fn dead_slots(&self, alive: &dyn Fn(&ProcessIdentity) -> bool) -> Vec<(usize, u64)> {
        let mut dead = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let (owner, id) = slot.load_identity();
            if owner.state != OwnerState::Free && !alive(&id) {
                dead.push((i, owner.word));
            }
        }
        dead
    }

    /// The slots of `mask` (bit `i`: slot `i`).
    fn in_mask(&self, mask: u64) -> impl Iterator<Item = &'a OwnedSlot> + use<'a> {
        self.slots
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i < 64 && mask & (1 << i) != 0)
            .map(|(_, slot)| slot)
    }

    /// A process other than `me` in the slots of `mask` (bit `i`: slot `i`) that is dead. The
    /// slot is re-read after the judgement: a holder that released and exited in between is
    /// not reported.
    pub(crate) fn dead_holder(
        &self,
        mask: u64,
        me: u32,
        alive: &dyn Fn(&ProcessIdentity) -> bool,
    ) -> Option<u32> {
        self.in_mask(mask).find_map(|slot| {
            let (owner, id) = slot.load_identity();
            let dead = owner.state != OwnerState::Free && owner.pid != me && !alive(&id);
            (dead && slot.load().word == owner.word).then_some(owner.pid)
        })
    }
}

impl LeaseTable {
    /// A table in memory, for the inspector's tests: exporter `exporter`, slot `i` held by
    /// `holder` for each `(i, holder)` of `held`.
    #[cfg(all(test, not(cuda_ipc_loom)))]
    pub(crate) fn for_tests(
        exporter: &ProcessIdentity,
        held: &[(usize, ProcessIdentity)],
    ) -> Option<Box<Self>> {
        let t = crate::shm::zeroed::<Self>()?;
        t.exporter_pid.store(exporter.pid(), Ordering::Relaxed);
        t.exporter_start
            .store(exporter.start_time(), Ordering::Relaxed);
        for (i, holder) in held {
            t.slots.get(*i)?.claim(holder)?;
        }
        Some(t)
    }

    /// What the table says, read word by word (the inspector reads a private copy).
    pub(crate) fn census(&self) -> LeaseCensus {
        LeaseCensus {
            closing: self.closing.load(Ordering::Relaxed) != 0,
            exporter: ProcessIdentity::from_parts(
                self.exporter_pid.load(Ordering::Relaxed),
                self.exporter_start.load(Ordering::Relaxed),
            ),
            slots: (0u32..)
                .zip(&self.slots)
                .map(|(i, slot)| {
                    let (owner, id) = slot.load_identity();
                    (i, owner.state, id)
                })
                .filter(|(_, state, _)| *state != OwnerState::Free)
                .collect(),
        }
    }

    fn slots(&self) -> Slots<'_> {
        Slots {
            closing: &self.closing,
            slots: &self.slots,
        }
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst) != 0
    }

    /// The pids of the processes in the slots of `mask` (bit `i`: slot `i`) that `alive`
    /// judges alive. Read-only.
    pub(crate) fn holders_in(
        &self,
        mask: u64,
        alive: &dyn Fn(&ProcessIdentity) -> bool,
    ) -> Vec<u32> {
        self.slots()
            .in_mask(mask)
            .filter_map(|slot| {
                let (owner, id) = slot.load_identity();
                (owner.state != OwnerState::Free && alive(&id)).then_some(owner.pid)
            })
            .collect()
    }

    /// A process other than this one in the slots of `mask` that is dead (it died holding
    /// what the mask stands for). Read-only.
    pub(crate) fn dead_holder_in(&self, mask: u64) -> Option<u32> {
        self.slots()
            .dead_holder(mask, std::process::id(), &crate::process::is_alive_cached)
    }

    fn exporter(&self) -> ProcessIdentity {
        ProcessIdentity::from_parts(
            self.exporter_pid.load(Ordering::Relaxed),
            self.exporter_start.load(Ordering::Relaxed),
        )
    }
}

/// The exporter's side: owns (and unlinks) the lease table.
pub(crate) struct ExportLeases {
    region: ShmRegion<LeaseTable>,
}

impl ExportLeases {
    pub(crate) fn create(token: &[u8; 16]) -> Result<Self> {
        crate::shm::reclaim_stale_once(crate::shm::LEASE_TABLES);
        crate::shm::reclaim_stale_once(crate::shm::BLOCK_TABLES);
        let me = ProcessIdentity::current();
        let words = token_words(token);
        let region = ShmOptions::new(region_name(token)).create_with(|t: &LeaseTable| {
            t.token[0].store(words[0], Ordering::Relaxed);
            t.token[1].store(words[1], Ordering::Relaxed);
            t.exporter_pid.store(me.pid(), Ordering::Relaxed);
            t.exporter_start.store(me.start_time(), Ordering::Relaxed);
            Ok(())
        })?;
        Ok(Self { region })
    }

    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// The table's `/dev/shm` name.
    pub(crate) fn name(&self) -> &str {
        self.region.name()
    }

    /// The table itself.
    pub(crate) fn table(&self) -> &LeaseTable {
        &self.region
    }

    /// Remove the table's name from `/dev/shm` now (the mapping stays; drop's unlink then
    /// finds nothing to do). Errors are ignored: the sweep removes what is left.
    pub(crate) fn unlink_name(&self) {
        let _ = self.region.unlink_shared();
    }

    /// Mark the table closing; from now on no new lease is granted.
    pub(crate) fn begin_close(&self) {
        self.region.slots().begin_close();
    }

    /// The live holders (read-only: nothing is reaped outside a close).
    pub(crate) fn holders(&self) -> Vec<u32> {
        self.region
            .slots()
            .holders(&|id: &ProcessIdentity| id.is_alive(), false)
    }

    /// Take every slot held by an importer proven dead, for this process (see
    /// [`Slots::take_dead`]): the reap outside a close. An export registry, arena or pool
    /// lives long, and each importer that dies would otherwise keep its slot until it is
    /// dropped. The caller clears the taken slots' bits in its block table and then
    /// [`release_taken`](Self::release_taken)s them, so a new holder starts clean; an importer
    /// that finds every slot taken does the same for one dead slot itself
    /// ([`Slots::claim_or_take_over`]), so reaping needs no call from an idle exporter.
    pub(crate) fn take_dead_slots(&self) -> Vec<(usize, u64)> {
        self.region
            .slots()
            .take_dead(&ProcessIdentity::current(), &|id: &ProcessIdentity| {
                id.is_alive()
            })
    }

    /// Give back a slot taken by [`take_dead_slots`](Self::take_dead_slots).
    pub(crate) fn release_taken(&self, i: usize, held: u64) {
        self.region.slots().release(i, held);
    }

    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// Mark the table closing (from now on no new lease is granted) and scan it once, reaping
    /// the slots of holders proven dead: the live holders left. Empty means the memory may be
    /// freed: nobody maps it and nobody can start to.
    pub(crate) fn close_and_scan(&self) -> Vec<u32> {
        self.begin_close();
        self.region
            .slots()
            .holders(&|id: &ProcessIdentity| id.is_alive(), true)
    }

    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// [`close_and_scan`](Self::close_and_scan) until no holder is left or `timeout` has
    /// passed; the holders left and the time waited.
    pub(crate) fn close_and_wait(&self, timeout: Duration) -> (Vec<u32>, Duration) {
        let mut wait = Backoff::for_importers(timeout);
        loop {
            let holders = self.close_and_scan();
            if holders.is_empty() {
                return (holders, wait.waited());
            }
            if let Err(waited) = wait.pause() {
                return (holders, waited);
            }
        }
    }
}

/// An importer's lease; frees its slot on drop.
pub(crate) struct Lease {
    token: [u8; 16],
    table: Arc<ShmRegion<LeaseTable>>,
    slot: usize,
    /// Our slot word, released by compare-exchange against it.
    held: u64,
}

/// Lease tables this process has mapped (see [`TableCache`]); one whose exporter closed it
/// says so with its *closing* flag, and is opened again (a new table under the same name
/// is refused by its token) or forgotten.
static TABLES: TableCache<LeaseTable> = TableCache::new();

/// The lease table of export `token`, mapped: `None` when it is gone, not ready or names
/// another export (the export is stale).
///
/// # Errors
///
/// Shared-memory errors other than a missing or unready table.
fn open_table(token: &[u8; 16]) -> Option<Result<ShmRegion<LeaseTable>>> {
    let region = match ShmOptions::new(region_name(token))
        .open_timeout(Duration::from_millis(200))
        .open::<LeaseTable>()
    {
        Ok(r) => r,
        Err(Error::NotFound { .. } | Error::NotReady { .. }) => return None,
        Err(e) => return Some(Err(e)),
    };
    let words = token_words(token);
    (region.token[0].load(Ordering::Relaxed) == words[0]
        && region.token[1].load(Ordering::Relaxed) == words[1])
        .then_some(Ok(region))
}

impl Lease {
    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// Claim a lease on the export named by `token`.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if the table is gone, names another export, or is closing;
    /// [`Error::TooManyImporters`]; region open errors otherwise.
    pub(crate) fn acquire(token: &[u8; 16], generation: u64) -> Result<Self> {
        Self::acquire_pausing(token, generation, &mut |_| {}, || {})
    }

    /// `acquire` (the test hooks') for a table with block bits: with every slot taken, take
    /// over one whose holder is proven dead, calling `take_over(slot)` to clear that slot's
    /// bits before holding it ([`Slots::claim_or_take_over`]).
    pub(crate) fn acquire_taking_over(
        token: &[u8; 16],
        generation: u64,
        take_over: &mut dyn FnMut(usize),
    ) -> Result<Self> {
        Self::acquire_pausing(token, generation, take_over, || {})
    }

    /// What every importer of an export with a block table (`table`: arenas, pools, the registry)
    /// does: [`acquire_taking_over`](Self::acquire_taking_over), clearing a taken slot's bits in
    /// `table`
    /// ([`BlockTable::clear_slot_bits`](crate::ledger::table::BlockTable::clear_slot_bits)).
    pub(crate) fn acquire_clearing(
        token: &[u8; 16],
        generation: u64,
        table: &crate::ledger::table::BlockTable,
    ) -> Result<Self> {
        Self::acquire_taking_over(token, generation, &mut |slot| table.clear_slot_bits(slot))
    }

    /// [`acquire_taking_over`](Self::acquire_taking_over) with the claim's
    /// pauses (for the stress test).
    pub(crate) fn acquire_pausing(
        token: &[u8; 16],
        generation: u64,
        take_over: &mut dyn FnMut(usize),
        pause: impl FnMut(),
    ) -> Result<Self> {
        let stale = || Error::StaleHandle { generation };
        let table = match TABLES.cached(token) {
            Some(table) if !table.is_closing() => table,
            _ => TABLES.keep(token, open_table(token).ok_or_else(stale)??),
        };
        let me = ProcessIdentity::current();
        let alive = |id: &ProcessIdentity| crate::process::is_alive_cached(id);
        match table
            .slots()
            .claim_or_take_over(&me, &alive, take_over, pause)
        {
            Claim::Granted(slot, held) => Ok(Self {
                token: *token,
                table,
                slot,
                held,
            }),
            Claim::Closing => {
                TABLES.forget(token);
                Err(stale())
            }
            Claim::Full => Err(Error::TooManyImporters { max: MAX_IMPORTERS }),
        }
    }

    /// The slot this lease holds (an arena importer's bit in the block table).
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// The table this lease is held in.
    pub(crate) fn table(&self) -> &LeaseTable {
        &self.table
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.table.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        self.table.slots().release(self.slot, self.held);
        // The exporter died without unlinking its table, or closed it while we held a lease
        // (its free deferred, see `ledger/deferred.rs`; it may exit before its next sweep): the last
        // importer removes the name (and stops caching the table). Names are random tokens
        // never reused, and an open of a closing export is refused anyway: unlinked, it is
        // refused as stale the same. The exporter keeps its mapping of the table.
        if (self.table.is_closing() || !crate::process::is_alive_cached(&self.table.exporter()))
            && self
                .table
                .slots
                .iter()
                .all(|s| s.load().state == OwnerState::Free)
        {
            TABLES.forget(&self.token);
            let _ = self.table.unlink_shared();
        }
    }
}

/// The lease protocol without a GPU, for the multi-process stress test
/// (`tests/lease_stress.rs`). Not part of the API.
#[doc(hidden)]
#[allow(missing_debug_implementations)] // test hooks, not API
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __testing;

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;

#[cfg(all(test, cuda_ipc_loom))]
mod loom_tests;
