//! Bounded waiting: one poll-and-back-off loop for every wait of the crate that has a deadline
//! (an event's host synchronize, a signal's host wait, an export's close waiting for its
//! importers, a region's open waiting for its creator), and its twin on a descriptor
//! ([`Pacer`]) for the watches a reactor or a [`WaitSet`](crate::wait::WaitSet) waits on.
//!
//! Each caller checks its own condition (and its peers' liveness), then calls
//! [`Backoff::pause`], which either reports that the deadline has passed or waits a little:
//! pauses start short, double each time up to a cap, and are never longer than the time left,
//! so a wait returns at its deadline, not a pause later. Pauses below a caller-chosen length
//! spin instead of sleeping (a sleep's granularity would otherwise set the latency of short
//! waits).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::os;

/// The moment a bounded wait ends, or never: a timeout too large for an [`Instant`]
/// (`Duration::MAX`, say) waits without end instead of panicking as `Instant::now() + timeout`
/// would. Every wait of the crate that takes a caller's timeout builds its end with this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self::since(Instant::now(), timeout)
    }

    /// `timeout` from `start`.
    pub(crate) fn since(start: Instant, timeout: Duration) -> Self {
        Self(start.checked_add(timeout))
    }

    /// Time left (zero once passed; `Duration::MAX` for a wait without end).
    pub(crate) fn remaining(&self) -> Duration {
        self.0.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }
}

/// A deadline and the pause schedule of one wait (see the module docs).
#[derive(Debug)]
pub(crate) struct Backoff {
    start: Instant,
    timeout: Duration,
    pause: Duration,
    max: Duration,
    spin_below: Duration,
}

impl Backoff {
    /// A wait of at most `timeout` from now, pausing `first`, then twice as long each time up
    /// to `max`.
    pub(crate) fn new(timeout: Duration, first: Duration, max: Duration) -> Self {
        Self::since(Instant::now(), timeout, first, max)
    }

    /// A wait of at most `timeout` from now for importers to let go of an export (their
    /// views to drop, or their deaths to be proven): 100 µs, doubling up to 20 ms.
    pub(crate) fn for_importers(timeout: Duration) -> Self {
        Self::new(
            timeout,
            Duration::from_micros(100),
            Duration::from_millis(20),
        )
    }

    /// A wait, within `timeout` from `start`, for a region's creator to finish making it (its
    /// size, then its header): 20 µs, doubling up to 10 ms.
    pub(crate) fn for_creator(start: Instant, timeout: Duration) -> Self {
        Self::since(
            start,
            timeout,
            Duration::from_micros(20),
            Duration::from_millis(10),
        )
    }

    /// Pause until `unheld()` says no importer holds an export any more; past the time,
    /// [`Error::LeasesOutstanding`] naming `holders()` and the
    /// time waited.
    pub(crate) fn until_unheld(
        mut self,
        mut unheld: impl FnMut() -> bool,
        holders: impl FnOnce() -> Vec<u32>,
    ) -> crate::error::Result<()> {
        let waiting = crate::trace::Waiting::start("importers to let go of an export");
        waiting.end(loop {
            if unheld() {
                break Ok(());
            }
            if let Err(waited) = self.pause() {
                break Err(crate::error::Error::LeasesOutstanding {
                    pids: holders(),
                    waited,
                });
            }
        })
    }

    /// As [`new`](Self::new), for a wait whose time started at `start` (a deadline shared by
    /// several steps).
    pub(crate) fn since(start: Instant, timeout: Duration, first: Duration, max: Duration) -> Self {
        Self {
            start,
            timeout,
            pause: first,
            max,
            spin_below: Duration::ZERO,
        }
    }

    /// Spin (with a CPU hint) rather than sleep for pauses shorter than `d`.
    pub(crate) fn spinning_below(mut self, d: Duration) -> Self {
        self.spin_below = d;
        self
    }

    /// Time since the wait started.
    pub(crate) fn waited(&self) -> Duration {
        self.start.elapsed()
    }

    /// Pause once; `Err(waited)` instead, without pausing, once the deadline has passed.
    pub(crate) fn pause(&mut self) -> Result<(), Duration> {
        let waited = self.start.elapsed();
        if waited >= self.timeout {
            return Err(waited);
        }
        let pause = self.pause.min(self.timeout - waited);
        if pause < self.spin_below {
            let until = Instant::now() + pause;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(pause);
        }
        self.pause = (self.pause * 2).min(self.max);
        Ok(())
    }
}

/// The back-off schedule of a wait on something that tells nobody when it changes (a GPU
/// word, an event's completion), as a timer descriptor: readable when it is time to look
/// again. Readable at once when made; each [`later`](Self::later) (a look that found nothing)
/// makes it readable after the current pause, which doubles up to a cap. No thread and no
/// CPU between looks; a dropped pacer leaves nothing behind.
#[derive(Debug)]
pub(crate) struct Pacer {
    timer: OwnedFd,
    pause: Duration,
    max: Duration,
    what: &'static str,
}

impl Pacer {
    /// A pacer for the wait `what`, readable at once, then pausing `first`, doubling up to
    /// `max`.
    ///
    /// # Errors
    ///
    /// [`Error::Os`] naming `timerfd_create` or `timerfd_settime`.
    pub(crate) fn new(what: &'static str, first: Duration, max: Duration) -> Result<Self> {
        let timer = os::timer::timer().map_err(|e| Error::from_os("timerfd_create", what, e))?;
        os::timer::set_after(timer.as_fd(), Duration::ZERO)
            .map_err(|e| Error::from_os("timerfd_settime", what, e))?;
        Ok(Self {
            timer,
            pause: first,
            max,
            what,
        })
    }

    /// After a look that found nothing: unreadable until the current pause has passed, and
    /// the next pause twice as long (up to the cap).
    ///
    /// # Errors
    ///
    /// [`Error::Os`] naming `timerfd_settime`.
    pub(crate) fn later(&mut self) -> Result<()> {
        os::timer::drain(self.timer.as_fd());
        os::timer::set_after(self.timer.as_fd(), self.pause)
            .map_err(|e| Error::from_os("timerfd_settime", self.what, e))?;
        self.pause = (self.pause * 2).min(self.max);
        Ok(())
    }
}

impl AsFd for Pacer {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.timer.as_fd()
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn returns_at_the_deadline_not_a_pause_later() {
        let mut b = Backoff::new(ms(30), ms(1), ms(10_000));
        let start = Instant::now();
        let mut pauses = 0;
        let waited = loop {
            match b.pause() {
                Ok(()) => pauses += 1,
                Err(waited) => break waited,
            }
        };
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // 1 + 2 + 4 + 8 ms, then the 16 ms pause is cut to what is left: five pauses, fewer
        // when sleeps overrun (a loaded machine), never more than six.
        assert!(
            start.elapsed() < Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );
        assert!((1..=6).contains(&pauses), "{pauses} pauses");
    }

    #[test]
    fn a_zero_timeout_never_pauses() {
        let mut b = Backoff::new(Duration::ZERO, ms(1000), ms(1000));
        assert!(b.pause().is_err());
    }

    #[test]
    fn short_pauses_spin() {
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_micros(1),
            Duration::from_micros(8),
        )
        .spinning_below(Duration::from_micros(50));
        let start = Instant::now();
        for _ in 0..100 {
            b.pause().unwrap();
        }
        // 100 pauses of at most 8 µs each; sleeping would take far longer on most kernels.
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        assert!(b.waited() < Duration::from_secs(1));
    }

    #[test]
    fn a_pacer_is_ready_at_once_then_after_each_pause() {
        let readable = |p: &Pacer, within: Duration| {
            let end = Deadline::after(within);
            crate::os::socket::wait(p.as_fd(), rustix::event::PollFlags::IN, end).unwrap()
        };
        let mut p = Pacer::new("test", ms(20), ms(40)).unwrap();
        assert!(readable(&p, Duration::ZERO), "ready at once");
        p.later().unwrap();
        assert!(!readable(&p, ms(5)), "not before its first pause");
        assert!(readable(&p, ms(2000)), "after it");
        let t = Instant::now();
        p.later().unwrap(); // 40 ms
        assert!(readable(&p, ms(2000)));
        assert!(
            t.elapsed() >= ms(39),
            "the pause doubled: {:?}",
            t.elapsed()
        );
        let t = Instant::now();
        p.later().unwrap(); // still 40 ms: the cap
        assert!(readable(&p, ms(2000)));
        assert!(t.elapsed() < ms(1000));
    }
}
