//! Owned slots in shared memory: a slot's state and its owner's identity in **one** atomic
//! word, so that nobody can ever see a slot taken without also seeing who took it.
//!
//! Lease slots (`ledger/lease.rs`) and barrier participant slots ([`crate::barrier`]) are
//! claimed by one process and judged by others ("is its owner still alive?"). When the state
//! and the owner were separate words, a claimer preempted (or `SIGKILL`ed) between its
//! compare-exchange and its pid store left a slot that said "taken" but named nobody, or named
//! the *previous* owner: a reaper then freed a slot that a live process was about to use. Here
//! the claim is one compare-exchange from `0` to `state | pid | start time`, so every observer
//! sees either a free slot or a slot with its owner, and a reaper's compare-exchange against the
//! exact word it judged fails if the owner changed in between (no ABA: a dead process's pid and
//! start time do not come back together).
//!
//! Layout of the word: `state:2 | pid:22 | start:40`. Linux pids are below 2^22
//! (`PID_MAX_LIMIT`); the start time is in clock ticks since boot (40 bits last 348 years at
//! 100 Hz). The owner's pidfs inode, which tells a pid reused within one tick apart, is a
//! second word (`pid:22 | inode:42`) written after the claim and trusted once the state has
//! moved past [`OwnerState::Claiming`] and only if it names the same pid, so that a stray
//! write by a claimer that lost its slot cannot lend its inode to the next owner.

use crate::process::ProcessIdentity;
use crate::sync::{AtomicU64, Ordering};

const STATE_SHIFT: u32 = 62;
const PID_SHIFT: u32 = 40;
const PID_BITS: u32 = 22;
const START_MASK: u64 = (1 << PID_SHIFT) - 1;
const PID_MASK: u64 = (1 << PID_BITS) - 1;
const INO_BITS: u32 = 42;
const INO_MASK: u64 = (1 << INO_BITS) - 1;

/// What an owned slot is doing; `Free` is the all-zero word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerState {
    /// Nobody owns the slot.
    Free,
    /// Taken; the owner has not yet written its pidfs inode.
    Claiming,
    /// Taken and complete (a lease held, a barrier participant active).
    Held,
    /// The owner gave the slot up for good but stays named (a barrier participant that left).
    Left,
}

impl OwnerState {
    fn bits(self) -> u64 {
        match self {
            Self::Free => 0,
            Self::Claiming => 1,
            Self::Held => 2,
            Self::Left => 3,
        }
    }
}

/// One slot word, decoded. `word` is the raw value it was decoded from, for compare-exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) word: u64,
    pub(crate) state: OwnerState,
    pub(crate) pid: u32,
    pub(crate) start: u64,
}

impl Owner {
    pub(crate) fn decode(word: u64) -> Self {
        let state = match word >> STATE_SHIFT {
            0 => OwnerState::Free,
            1 => OwnerState::Claiming,
            2 => OwnerState::Held,
            _ => OwnerState::Left,
        };
        Self {
            word,
            state,
            pid: ((word >> PID_SHIFT) & PID_MASK) as u32,
            start: word & START_MASK,
        }
    }

    /// The word for `state` owned by `id`. A pid of 0 (or one too wide for the field) cannot be
    /// encoded: the caller treats `None` as "cannot own a slot".
    pub(crate) fn encode(state: OwnerState, id: &ProcessIdentity) -> Option<u64> {
        let pid = u64::from(id.pid());
        if state == OwnerState::Free || pid == 0 || pid > PID_MASK {
            return None;
        }
        Some((state.bits() << STATE_SHIFT) | (pid << PID_SHIFT) | (id.start_time() & START_MASK))
    }

    /// The same owner in another state.
    pub(crate) fn with_state(&self, state: OwnerState) -> u64 {
        (self.word & !(3 << STATE_SHIFT)) | (state.bits() << STATE_SHIFT)
    }

    /// The owner's identity; `ino_word` is the slot's inode word, used only when the state
    /// says it was written and it names this owner's pid.
    pub(crate) fn identity(&self, ino_word: u64) -> ProcessIdentity {
        let id = ProcessIdentity::from_parts(self.pid, self.start);
        let written = matches!(self.state, OwnerState::Held | OwnerState::Left);
        if written && ino_word >> INO_BITS == u64::from(self.pid) {
            id.with_pidfs_ino(ino_word & INO_MASK)
        } else {
            id
        }
    }
}

/// The inode word for `me`: `pid:22 | inode:42`, or 0 (unknown) for an inode too wide.
fn ino_word(me: &ProcessIdentity) -> u64 {
    let ino = me.pidfs_ino();
    if ino > INO_MASK {
        return 0;
    }
    (u64::from(me.pid()) << INO_BITS) | ino
}

/// A slot word and its owner's pidfs inode, as laid out in shared memory (16 bytes).
#[repr(C)]
pub(crate) struct OwnedSlot {
    owner: AtomicU64,
    pidfs_ino: AtomicU64,
}

impl OwnedSlot {
    /// A free slot (for state built outside shared memory, which starts zeroed anyway).
    pub(crate) fn new() -> Self {
        Self {
            owner: AtomicU64::new(0),
            pidfs_ino: AtomicU64::new(0),
        }
    }

    /// The current owner word.
    pub(crate) fn load(&self) -> Owner {
        Owner::decode(self.owner.load(Ordering::SeqCst))
    }

    /// The owner's identity as recorded: its word and (where written) its pidfs inode. The
    /// inode is read after the word; if the slot changed hands in between, the caller's
    /// compare-exchange or re-read against `Owner::word` catches it.
    pub(crate) fn load_identity(&self) -> (Owner, ProcessIdentity) {
        let owner = self.load();
        let ino = self.pidfs_ino.load(Ordering::Acquire);
        (owner, owner.identity(ino))
    }

    /// Claim a free slot for `me` in one step (`0 → Claiming(me)`); on success, record the
    /// pidfs inode and move to `Held`. Returns the held word, or `None` if the slot was taken.
    ///
    /// Between the two steps the slot reads `Claiming` with `me` named, so an observer that
    /// finds `me` dead there (killed mid-claim) may reap it.
    #[cfg(all(test, not(cuda_ipc_loom)))]
    pub(crate) fn claim(&self, me: &ProcessIdentity) -> Option<u64> {
        self.claim_pausing(me, || {})
    }

    /// `claim`, calling `pause` between the two steps (while the slot reads
    /// `Claiming`): the stress test stalls or kills itself there. `claim` passes a no-op.
    pub(crate) fn claim_pausing(&self, me: &ProcessIdentity, pause: impl FnOnce()) -> Option<u64> {
        self.claim_from(0, me, pause) // a free slot is the word 0
    }

    /// Replace the exact word `dead` (a dead owner's, judged by the caller; or 0, free) with
    /// `Claiming(me)` in one compare-exchange, call `pause`, then record the pidfs inode and
    /// move to `Held`.
    pub(crate) fn claim_from(
        &self,
        dead: u64,
        me: &ProcessIdentity,
        pause: impl FnOnce(),
    ) -> Option<u64> {
        let claiming = Owner::encode(OwnerState::Claiming, me)?;
        self.owner
            .compare_exchange(dead, claiming, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        pause();
        self.finish_claim(claiming, me)
    }

    /// [`claim_from`](Self::claim_from) whose step while `Claiming` may refuse: when `step`
    /// returns false the word goes back to `dead` (nobody but us can have changed it: only a
    /// reaper that judged us dead would) and `None` is returned.
    pub(crate) fn claim_from_unless(
        &self,
        dead: u64,
        me: &ProcessIdentity,
        step: impl FnOnce() -> bool,
    ) -> Option<u64> {
        let claiming = Owner::encode(OwnerState::Claiming, me)?;
        self.owner
            .compare_exchange(dead, claiming, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        if !step() {
            let _ =
                self.owner
                    .compare_exchange(claiming, dead, Ordering::SeqCst, Ordering::Relaxed);
            return None;
        }
        self.finish_claim(claiming, me)
    }

    fn finish_claim(&self, claiming: u64, me: &ProcessIdentity) -> Option<u64> {
        self.pidfs_ino.store(ino_word(me), Ordering::Release);
        let held = Owner::decode(claiming).with_state(OwnerState::Held);
        // Only a reaper that judged us dead could have changed the word: then we own nothing.
        self.owner
            .compare_exchange(claiming, held, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        Some(held)
    }

    /// Move our own word `from` to `state` (or to free); false if it was no longer ours.
    pub(crate) fn transition(&self, from: u64, state: OwnerState) -> bool {
        let to = match state {
            OwnerState::Free => 0,
            _ => Owner::decode(from).with_state(state),
        };
        self.owner
            .compare_exchange(from, to, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    /// Reap: free the slot if it still holds exactly `dead` (judged dead by the caller).
    pub(crate) fn reap(&self, dead: u64) -> bool {
        self.owner
            .compare_exchange(dead, 0, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    /// Test hook: take the slot for `me` and stop at `Claiming`, as a claimer preempted or
    /// killed right after its compare-exchange.
    #[cfg(test)]
    pub(crate) fn claim_and_stall(&self, me: &ProcessIdentity) -> Option<u64> {
        let claiming = Owner::encode(OwnerState::Claiming, me)?;
        self.owner
            .compare_exchange(0, claiming, Ordering::SeqCst, Ordering::Relaxed)
            .ok()
            .map(|_| claiming)
    }

    /// Test hook: finish a claim stalled by [`claim_and_stall`](Self::claim_and_stall).
    #[cfg(all(test, not(cuda_ipc_loom)))]
    pub(crate) fn resume_claim(&self, claiming: u64, me: &ProcessIdentity) -> Option<u64> {
        self.finish_claim(claiming, me)
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_free_is_zero() {
        let id = ProcessIdentity::from_parts(4_194_303, (1 << 40) - 1);
        for state in [OwnerState::Claiming, OwnerState::Held, OwnerState::Left] {
            let w = Owner::encode(state, &id).unwrap();
            let o = Owner::decode(w);
            assert_eq!(
                (o.state, o.pid, o.start),
                (state, id.pid(), id.start_time())
            );
        }
        assert_eq!(Owner::decode(0).state, OwnerState::Free);
        assert!(Owner::encode(OwnerState::Held, &ProcessIdentity::from_parts(0, 5)).is_none());
        assert!(
            Owner::encode(OwnerState::Held, &ProcessIdentity::from_parts(1 << 22, 5)).is_none()
        );
        assert!(Owner::encode(OwnerState::Free, &id).is_none());
    }

    #[test]
    fn a_claim_names_its_owner_in_the_same_step() {
        let slot = OwnedSlot::new();
        let me = ProcessIdentity::current();
        let claiming = slot.claim_and_stall(&me).unwrap();
        let (o, id) = slot.load_identity();
        assert_eq!(o.word, claiming);
        assert_eq!(o.state, OwnerState::Claiming);
        assert!(id.is_same_process(&me));
        assert!(slot.claim(&me).is_none(), "taken");
        let held = slot.resume_claim(claiming, &me).unwrap();
        assert_eq!(slot.load().state, OwnerState::Held);
        assert_eq!(slot.load_identity().1, me);
        assert!(slot.transition(held, OwnerState::Free));
        assert_eq!(slot.load().word, 0);
    }

    #[test]
    fn an_inode_written_for_another_pid_is_ignored() {
        let slot = OwnedSlot::new();
        let a = ProcessIdentity::from_parts(100, 7).with_pidfs_ino(11);
        let b = ProcessIdentity::from_parts(200, 7).with_pidfs_ino(22);
        slot.claim(&b).unwrap();
        slot.pidfs_ino.store(ino_word(&a), Ordering::Relaxed); // a stray late write by `a`
        let (_, id) = slot.load_identity();
        assert_eq!((id.pid(), id.pidfs_ino()), (200, 0));
    }

    #[test]
    fn a_reaped_claim_cannot_finish() {
        let slot = OwnedSlot::new();
        let me = ProcessIdentity::current();
        let claiming = slot.claim_and_stall(&me).unwrap();
        assert!(slot.reap(claiming));
        let other = ProcessIdentity::from_parts(me.pid() ^ 1, 3);
        let theirs = slot.claim(&other).unwrap();
        assert!(slot.resume_claim(claiming, &me).is_none());
        assert_eq!(slot.load().word, theirs);
        assert!(!slot.reap(claiming), "a stale judgement reaps nothing");
    }
}
