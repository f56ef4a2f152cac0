//! Listeners: channel ends that wait on a descriptor (a reactor, an async task, a
//! `WaitSet`) rather than the futex. The ring's half of it: arming an end against a ticket
//! (`try_recv_or_arm`; `try_acquire_or_arm`, which names the entry the producer waits for).
//!
//! An end that waits on a descriptor (a `Listening` end: a reactor, an async task, a
//! `WaitSet`) does not sleep on the doorbell's futex; it *arms* its bit in the doorbell's word
//! (`ring/doorbell.rs`) against a ticket read before its last check, and the side that rings
//! takes the armed bits in the same read-modify-write and tells each listener's bell
//! (`channel/bell.rs`) one byte. The listener's descriptor is its bell and the pidfd of the
//! peer it waits for (`channel/readiness.rs`). The ring's shared words stay the only truth: a
//! tell says "look", and every look re-reads them.
//!
//! | Where it stops... | What the other side sees |
//! |-------------------|--------------------------|
//! | a listener, between its check and its arm (preempted) | the arm fails if a ring came since its ticket (it checks again); else the next ring takes the bit |
//! | a listener, `SIGKILL`ed while armed | its bit stays until the next ring takes it; the tell is refused (`ECONNREFUSED`, nobody holds the bell) and ignored; its bell's file is removed by the next bind at that name or any process's first bell |
//! | a listener that stopped waiting (a cancelled future, a `WaitSet` timeout) | its bit stays armed: the next ring tells a bell nobody drains until its next check; a spurious wake at most |
//! | a ringer, after its publish or release, before its tell (preempted) | the listener wakes when the tell comes |
//! | a ringer, `SIGKILL`ed between its ring and its tell | the listener is not told, but the ringer's exit makes its pidfd readable: it wakes, re-reads the words, and finds the item (or slot) and then the death (replayed in `tests/readiness.rs`) |
//! | a ringer that forks | the child's ring tells the same bells (a spurious wake at most) |
//!
//! A timed-out or cancelled listener leaves only its armed bit behind; the next call drains
//! its bell and checks the words again before it arms anew, so no item, slot or message is
//! lost or held.

use super::*;

impl Ring<'_> {
    /// Producer: [`try_acquire`](Self::try_acquire), and when the slot is not free, arm the
    /// producer as the listener of the doorbell of the entry that holds it (bit 0), so that
    /// the entry's next release, attach or close tells the producer's bell: `None` when the
    /// slot is free, else the entry armed on. The arm is made against a ticket of that
    /// doorbell read before the last check, so a release between the check and the arm fails
    /// the arm and the check runs again: no free slot is missed.
    pub(crate) fn try_acquire_or_arm(&self, k: u64) -> Result<Option<usize>> {
        let mut holder = self.slot_holder(k)?;
        loop {
            let Some(i) = holder else {
                return Ok(None);
            };
            let bell = &self.state.consumer[i].released_bell;
            let ticket = bell.ticket();
            holder = self.slot_holder(k)?;
            if holder == Some(i) && bell.arm(1, ticket) {
                return Ok(Some(i));
            }
        }
    }

    /// Producer: the entry whose consumer holds item `k`'s slot, if any (the check of
    /// [`try_acquire`](Self::try_acquire), naming who blocks it).
    fn slot_holder(&self, k: u64) -> Result<Option<usize>> {
        if !self.geometry.is_broadcast() && self.entry().owner.load().state == OwnerState::Left {
            return self.consumer_status().map(|()| Some(0));
        }
        self.slot_free(k).map(|(free, i)| (!free).then_some(i))
    }

    /// Consumer: [`try_recv`](Self::try_recv), and when nothing is there, arm this entry as a
    /// listener of the doorbell of items sent (its bit), so that the producer's next publish
    /// or close tells this entry's bell (`Ok(None)`: armed, wait for the bell). The arm is made
    /// against a ticket read before the check, so a publish between the check and the arm
    /// fails the arm and the check runs again: no item is missed.
    pub(crate) fn try_recv_or_arm(&self, received: u64) -> Result<Option<u64>> {
        loop {
            let ticket = self.state.sent_bell.ticket();
            if let Some(len) = self.try_recv(received)? {
                return Ok(Some(len));
            }
            if self.state.sent_bell.arm(1 << self.index, ticket) {
                return Ok(None);
            }
        }
    }
}
