//! The bells of a channel's *listeners*: ends that wait for the other side on a descriptor a
//! reactor polls (`AsFd`, an async runtime, a [`WaitSet`](crate::wait::WaitSet)) rather than
//! on the ring's futex.
//!
//! A listener binds its bell — a Unix datagram socket at
//! `/dev/shm/cuda-ipc-bell.<channel>.<end>` (`p` for the producer, `c<i>` for consumer entry
//! `i`): the mount the channel's region lives on, so any process that can map the channel can
//! reach it, across network and pid namespaces — then arms its bit in the ring's doorbell
//! (`ring/doorbell.rs`) and waits for its descriptor. The side that rings the doorbell takes
//! the armed bits and tells each bell one byte; the listener drains its bell and checks the
//! ring again (the shared memory stays the only source of truth: a byte says only "look").
//!
//! # When a side dies
//!
//! - A ringer `SIGKILL`ed between its ring and its tell: the listener is not told, but its
//!   descriptor set also holds the ringer's pidfd, which the death makes readable; it then
//!   finds the item (or the slot) in the ring and the death in its owner word.
//! - A listener `SIGKILL`ed while armed: its bit stays until the next ring takes it; the tell
//!   to its bell is refused (`ECONNREFUSED`, nobody holds the socket) and ignored. Its socket
//!   file stays in `/dev/shm` until the next bind at that name, or any process's first bell or
//!   first channel, finds it refusing connections and removes it.
//! - A listener that times out (its future dropped, its wait set's deadline passed) leaves its
//!   bit armed: the next ring takes it and tells a bell that may already be drained or gone —
//!   a spurious wake at most, never a lost one.
//! - An end that closes or drops removes its bell **before** it gives its entry back: a
//!   broadcast channel hands a left entry to the next consumer that attaches, which binds the
//!   same name at once (the other order let it find the name still held: `AddressInUse`; the
//!   replay test is `tests/readiness.rs`). A child forked without `exec` that drops its copy
//!   of an end removes nothing (its parent still listens there).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::os;

/// The listeners a ring took from a ring's doorbell (bit `i`: listener `i`): each must be
/// told, else it waits for a later ring.
#[must_use = "tell each listener, or it waits for a later ring"]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Listeners(pub(crate) u32);

impl Listeners {
    /// The listeners' numbers, lowest first.
    pub(crate) fn bits(self) -> impl Iterator<Item = usize> {
        (0..8).filter(move |i| self.0 & (1 << i) != 0)
    }
}

/// The prefix of every bell's name in `/dev/shm`.
pub(crate) const BELLS: &str = "cuda-ipc-bell.";

/// Which end of a channel a bell wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The producer (told when a consumer releases, attaches or closes).
    Producer,
    /// Consumer entry `i` (told when the producer publishes or closes).
    Consumer(usize),
}

/// Where the bell of `end` of the channel whose region is named `channel` lives.
fn path(channel: &str, end: End) -> PathBuf {
    let channel = channel
        .strip_prefix(crate::shm::CHANNELS)
        .unwrap_or(channel);
    let end = match end {
        End::Producer => "p".to_owned(),
        End::Consumer(i) => format!("c{i}"),
    };
    PathBuf::from(format!("{}/{BELLS}{channel}.{end}", os::SHM_DIR))
}

/// A bound bell: readable once told, until [`drain`](Self::drain)ed. Its socket file is
/// removed on drop (if it is still this bell's, and only by the process that bound it: a child
/// forked without `exec` that drops its copy leaves its parent's bell alone).
#[derive(Debug)]
pub(crate) struct Bell {
    fd: OwnedFd,
    path: PathBuf,
    id: (u64, u64),
    home: crate::process::Home,
}

impl Bell {
    /// Bind the bell of `end` of `channel`. A file left at its name by a bell nobody holds
    /// (a killed listener's) is removed first; the first bell of a process also sweeps every
    /// such file of its user.
    ///
    /// # Errors
    ///
    /// [`Error::AddressInUse`] if a live bell holds the name (another process holds this
    /// end); [`Error::Os`] for a failed `socket`, `bind` or `chmod`.
    pub(crate) fn bind(channel: &str, end: End) -> Result<Self> {
        sweep_once();
        let path = path(channel, end);
        let name = || path.display().to_string();
        let bound = match os::datagram::bind(&path) {
            Err(rustix::io::Errno::ADDRINUSE) if os::datagram::is_stale(&path) => {
                let _ = std::fs::remove_file(&path);
                os::datagram::bind(&path)
            }
            other => other,
        };
        match bound {
            Ok((fd, id)) => Ok(Self {
                fd,
                path,
                id,
                home: crate::process::Home::here(),
            }),
            Err(rustix::io::Errno::ADDRINUSE) => Err(Error::AddressInUse { name: name() }),
            Err(e) => Err(Error::from_os("bind", &name(), e)),
        }
    }

    /// Tell this bell (from this process: see [`tell_consumers`]).
    pub(crate) fn tell(&self) {
        let _ = os::datagram::tell(&self.path);
    }

    /// Read every tell waiting; returns how many there were.
    pub(crate) fn drain(&self) -> usize {
        os::datagram::drain(self.fd.as_fd())
    }
}

impl AsFd for Bell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        if self.home.is_here() {
            let _ = os::socket::unlink_if_same(&self.path, self.id);
        }
    }
}

/// Tell the consumers of `channel` that `listeners` (bit `i`: consumer entry `i`) name.
pub(crate) fn tell_consumers(channel: &str, listeners: Listeners) {
    for i in listeners.bits() {
        let _ = os::datagram::tell(&path(channel, End::Consumer(i)));
    }
}

/// Tell the producer of `channel`, if `listeners` names it.
pub(crate) fn tell_producer(channel: &str, listeners: Listeners) {
    if listeners != Listeners::default() {
        let _ = os::datagram::tell(&path(channel, End::Producer));
    }
}

/// Remove, once per process, every bell file in `/dev/shm` of this user that nobody holds:
/// before a process's first bell, and when it creates its first channel (as stale channel
/// regions are reclaimed).
pub(crate) fn sweep_once() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        for name in os::shm_names().unwrap_or_default() {
            let ours = name.starts_with(BELLS)
                && os::shm_lstat(&name).is_ok_and(|f| f.uid == os::euid() && f.is_socket());
            let path = std::path::Path::new(os::SHM_DIR).join(&name);
            if ours && os::datagram::is_stale(&path) {
                let _ = std::fs::remove_file(path);
            }
        }
    });
}

/// A channel name no other test uses, for the tests of bells and readiness.
#[cfg(test)]
pub(crate) fn test_channel(what: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{}test-{what}-{}-{n}",
        crate::shm::CHANNELS,
        std::process::id()
    )
}

#[cfg(test)]
mod tests;
