//! Timer descriptors (`timerfd`, `CLOCK_MONOTONIC`): readable once their time has come, so that
//! a reactor or a descriptor set can wait for "look again" beside everything else.

use std::time::Duration;

use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::io::Errno;
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, timerfd_create, timerfd_settime,
};

/// A disarmed timer (non-blocking, close-on-exec).
pub(crate) fn timer() -> Result<OwnedFd, Errno> {
    timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )
}

/// Make `timer` readable `after` from now, once (any earlier setting replaced); a zero `after`
/// makes it readable at once (the kernel reads a zero time as "disarm", so 1 ns is set).
pub(crate) fn set_after(timer: BorrowedFd<'_>, after: Duration) -> Result<(), Errno> {
    let value = super::timespec(after.max(Duration::from_nanos(1)));
    let zero = super::timespec(Duration::ZERO);
    let spec = Itimerspec {
        it_interval: zero,
        it_value: value,
    };
    timerfd_settime(timer, TimerfdTimerFlags::empty(), &spec).map(|_| ())
}

/// Take the expiry count (the timer is unreadable until its next expiry); an unexpired timer
/// is no error.
pub(crate) fn drain(timer: BorrowedFd<'_>) {
    let mut count = [0u8; 8];
    let _ = rustix::io::read(timer, &mut count);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fd::AsFd;

    #[test]
    fn a_timer_is_readable_after_its_time_and_unreadable_once_drained() {
        let t = timer().unwrap();
        let readable = |fd| {
            let now = crate::poll::Deadline::after(Duration::ZERO);
            super::super::socket::wait(fd, rustix::event::PollFlags::IN, now).unwrap()
        };
        assert!(!readable(t.as_fd()), "disarmed");
        set_after(t.as_fd(), Duration::ZERO).unwrap();
        let soon = crate::poll::Deadline::after(Duration::from_secs(5));
        assert!(super::super::socket::wait(t.as_fd(), rustix::event::PollFlags::IN, soon).unwrap());
        drain(t.as_fd());
        assert!(!readable(t.as_fd()), "drained");
        set_after(t.as_fd(), Duration::from_secs(60)).unwrap();
        assert!(!readable(t.as_fd()), "a minute away");
    }
}
