//! A channel end's readiness as one descriptor a reactor polls: a set (`epoll`) of the end's
//! bell (`bell.rs`: the other side tells it when it rings a doorbell this end armed) and the
//! pidfd of the peer it waits for (readable when that process exits), so that both "look
//! again" and "the peer died" wake it, with no thread and no timer.
//!
//! The descriptor only says *look*: the ring in shared memory says what there is. A reader
//! of the descriptor drains the bell, then checks the ring again (arming again if it still
//! waits); a wake with nothing to find is harmless.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::bell::{Bell, End};
use super::ring::Ring;
use crate::error::{Error, Result};
use crate::os;
use crate::process::ProcessIdentity;

/// One end's bell and the pidfd of the peer it waits for, in one pollable set.
#[derive(Debug)]
pub(crate) struct Readiness {
    set: OwnedFd,
    bell: Bell,
    /// The peer watched, and its pidfd (`None`: none could be opened; the peer is then
    /// judged by its identity at each check, as the blocking waits judge it).
    peer: Option<(ProcessIdentity, Option<OwnedFd>)>,
}

impl Readiness {
    /// The readiness of `end` of the channel whose region is named `channel`: its bell bound
    /// and told once (so readable until the first `try_` call drains it), no peer watched
    /// yet.
    ///
    /// # Errors
    ///
    /// As [`Bell::bind`]; [`Error::Os`] for a failed `epoll_create1` or `epoll_ctl`.
    pub(crate) fn new(channel: &str, end: End) -> Result<Self> {
        let bell = Bell::bind(channel, end)?;
        let os_err = |call, e| Error::from_os(call, channel, e);
        let set = os::epoll::set().map_err(|e| os_err("epoll_create1", e))?;
        os::epoll::add(set.as_fd(), bell.as_fd(), 0).map_err(|e| os_err("epoll_ctl", e))?;
        // Readable to begin with: a first wait returns at once, and the `try_` call after it
        // arms the end (nothing is armed yet, so nothing else would wake it).
        bell.tell();
        Ok(Self {
            set,
            bell,
            peer: None,
        })
    }

    /// Watch `peer` (the process this end waits for): its exit makes the set readable.
    /// Watching the one watched already only asks its pidfd. Returns `false` if `peer` is dead
    /// already (its pid gone, or another process's): no exit will wake the set then, and the
    /// caller reports the death instead of waiting.
    pub(crate) fn watch(&mut self, peer: &ProcessIdentity) -> bool {
        if let Some((watched, pidfd)) = &self.peer
            && watched.is_same_process(peer)
        {
            // Alive while its pidfd has not turned readable (one poll, no /proc read).
            return match pidfd {
                Some(fd) => !os::pidfd_exited(fd),
                None => peer.is_alive(),
            };
        }
        if let Some((_, Some(old))) = self.peer.take() {
            os::epoll::remove(self.set.as_fd(), old.as_fd());
        }
        let pidfd = os::pidfd_open(peer.pid())
            .filter(|fd| os::epoll::add(self.set.as_fd(), fd.as_fd(), 0).is_ok());
        self.peer = Some((*peer, pidfd));
        // Checked after the pidfd is open: alive now, so the pidfd is that process's (a pid
        // reused before the open reads as dead here), and its exit from now on wakes the set.
        peer.is_alive()
    }

    /// Make the descriptor readable now (a tell to this end's own bell): for a first wait, or
    /// a check the caller must make again without the other side acting.
    pub(crate) fn wake(&self) {
        self.bell.tell();
    }

    /// Take every tell waiting on the bell (before the caller checks the ring again).
    pub(crate) fn drain(&self) {
        self.bell.drain();
    }
}

impl AsFd for Readiness {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.set.as_fd()
    }
}

/// Consumer: the length of item `received + 1` if it was published. If not and the end
/// listens (`readiness`), it is armed — and the producer watched — before `None` is
/// returned; a dead producer with nothing left to receive is
/// [`Error::PeerGone`] at once (no exit would wake the descriptor).
pub(crate) fn try_recv_armed(
    ring: &Ring<'_>,
    readiness: Option<&mut Readiness>,
    received: u64,
) -> Result<Option<u64>> {
    let Some(r) = readiness else {
        return ring.try_recv(received);
    };
    r.drain();
    // The watch's answer is the liveness check: no second one on the way to `None`.
    let producer_alive = ring.producer_identity().map(|p| r.watch(&p));
    match ring.try_recv_or_arm(received)? {
        None if producer_alive == Some(false) => ring.producer_status(received).map(|()| None),
        found => Ok(found),
    }
}

/// Producer: whether item `k`'s slot is free. If not and the end listens (`readiness`), it is
/// armed on the doorbell of the consumer that holds the slot — and that consumer watched —
/// before `false` is returned. A dead consumer wakes no descriptor: in a one-consumer channel
/// its error comes at once; in a broadcast channel the descriptor is made readable and the
/// caller detaches it.
pub(crate) fn try_acquire_armed(
    ring: &Ring<'_>,
    readiness: Option<&mut Readiness>,
    k: u64,
) -> Result<bool> {
    let Some(r) = readiness else {
        return ring.try_acquire(k);
    };
    r.drain();
    let Some(i) = ring.try_acquire_or_arm(k)? else {
        return Ok(true);
    };
    if let Some(consumer) = ring.consumer_identity(i)
        && !r.watch(&consumer)
    {
        ring.consumer_status()?;
        r.wake();
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
