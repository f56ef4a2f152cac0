//! A futex word that one process rings and another sleeps on — or, armed as a *listener*, waits
//! for on a descriptor a reactor polls, told by the ringer (`channel/bell.rs`).

use std::time::Duration;

use crate::channel::bell::Listeners;
use crate::sync::{AtomicU32, Ordering};

/// A futex word and a count of sleepers, so that the waking side makes a system call only
/// when somebody sleeps — and, in the word's low byte, the *listeners* armed: waiters that wait
/// on a descriptor a reactor polls, not on the futex, told by the caller of the ring that
/// finds them armed (`channel/bell.rs`).
///
/// The word is a count of rings (its upper 24 bits) and one bit per listener (its low 8: a
/// consumer entry, for `sent`; the producer, bit 0, for an entry's `released`). Arming and
/// ringing are read-modify-writes of that one word, so their order is the word's own: a
/// listener arms only if no ring came since its ticket (else it checks again), and a ring
/// takes every bit armed before it. A listener killed while armed leaves its bit for a later
/// ring to take; telling a dead listener fails quietly.
#[repr(C)]
pub(crate) struct Doorbell {
    pub(crate) word: AtomicU32,
    sleepers: AtomicU32,
}

/// The listener bits of a [`Doorbell`]'s word.
const LISTENING: u32 = 0xff;
/// One ring, in a [`Doorbell`]'s word.
const ONE_RING: u32 = 1 << 8;

impl Doorbell {
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self {
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Ring after a store the other side waits for (the Dekker pair with [`sleep`](Self::sleep):
    /// both sides use SeqCst, so either the sleeper sees the new word or the ringer sees the
    /// sleeper). Returns the listeners armed before it, now disarmed: the caller tells them.
    pub(crate) fn ring(&self) -> Listeners {
        let before = self.word.fetch_add(ONE_RING, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            crate::sync::futex_wake_all(&self.word);
        }
        let armed = before & LISTENING;
        if armed != 0 {
            // Only these: a listener that armed after the add armed for the next ring.
            self.word.fetch_and(!armed, Ordering::SeqCst);
        }
        Listeners(armed)
    }

    /// The word to sleep on (and to arm after), read before the caller's last check of its
    /// condition.
    pub(crate) fn ticket(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }

    /// How many threads sleep on the bell now (for the inspector).
    pub(crate) fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }

    /// Sleep while the word still reads `ticket`, at most `timeout` (a listener arming or
    /// disarmed meanwhile changes the word too: the caller then checks again).
    pub(crate) fn sleep(&self, ticket: u32, timeout: Duration) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        crate::sync::futex_wait(&self.word, ticket, timeout);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Arm listener `listener` (its bit) for the next ring, `ticket` having been read before
    /// the caller's last check of its condition: `true` if no ring came since (wait for the
    /// listener's descriptor: the next ring takes the bit and tells it), `false` if one did
    /// (check again).
    pub(crate) fn arm(&self, listener: u32, ticket: u32) -> bool {
        self.word
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                (word >> 8 == ticket >> 8).then_some(word | (listener & LISTENING))
            })
            .is_ok()
    }
}
