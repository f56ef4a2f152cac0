//! Descriptor sets (`epoll`): one descriptor that is readable while any of those added to it
//! is, which a reactor polls in their place (a channel end's bell and its peer's pidfd).

use rustix::event::epoll;
use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::io::Errno;

/// An empty set (close-on-exec).
pub(crate) fn set() -> Result<OwnedFd, Errno> {
    epoll::create(epoll::CreateFlags::CLOEXEC)
}

/// Remove `fd` from `set` (one that was never added, or is closed, is no error).
pub(crate) fn remove(set: BorrowedFd<'_>, fd: BorrowedFd<'_>) {
    let _ = epoll::delete(set, fd);
}

/// Add `fd` to `set`, watched for being readable (level-triggered) and reported with `key` by
/// [`wait`].
pub(crate) fn add(set: BorrowedFd<'_>, fd: BorrowedFd<'_>, key: u64) -> Result<(), Errno> {
    epoll::add(
        set,
        fd,
        epoll::EventData::new_u64(key),
        epoll::EventFlags::IN,
    )
}

/// Wait until a descriptor of `set` is readable (or hung up), at most `timeout` (`None`: for
/// ever); the keys of those ready (empty at the timeout). Interrupted waits resume.
pub(crate) fn wait(
    set: BorrowedFd<'_>,
    timeout: Option<std::time::Duration>,
) -> Result<Vec<u64>, Errno> {
    let deadline = timeout.map(crate::poll::Deadline::after);
    let mut events = Vec::with_capacity(64);
    loop {
        let left = deadline.map(|d| super::timespec(d.remaining()));
        events.clear();
        match epoll::wait(
            set,
            rustix::buffer::spare_capacity(&mut events),
            left.as_ref(),
        ) {
            Ok(_) => return Ok(events.iter().map(|e| e.data.u64()).collect()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Watch `fd` in `set` for being readable *once* (`EPOLLONESHOT`), reported with `key`; a
/// descriptor added before is re-armed (`EPOLL_CTL_MOD`). A descriptor readable already is
/// reported at once.
#[cfg(feature = "async")]
pub(crate) fn watch_once(set: BorrowedFd<'_>, fd: BorrowedFd<'_>, key: u64) -> Result<(), Errno> {
    let flags = epoll::EventFlags::IN | epoll::EventFlags::ONESHOT;
    let data = epoll::EventData::new_u64(key);
    match epoll::modify(set, fd, data, flags) {
        Err(Errno::NOENT) => epoll::add(set, fd, data, flags),
        other => other,
    }
}

/// Whether `fd` is readable (or hung up) now, without waiting.
#[cfg(feature = "async")]
pub(crate) fn readable_now(fd: BorrowedFd<'_>) -> bool {
    let now = crate::poll::Deadline::after(std::time::Duration::ZERO);
    super::socket::wait(fd, rustix::event::PollFlags::IN, now).unwrap_or(false)
}
