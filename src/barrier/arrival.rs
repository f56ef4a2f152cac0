//! A barrier wait as a descriptor ([`BarrierArrival`], for a
//! [`WaitSet`](crate::wait::WaitSet) or any reactor) and as a future
//! ([`ProcessBarrier::wait_async`], feature `async`).
//!
//! The completing arrival wakes sleepers on a futex, which no reactor can poll, so an
//! arrival *looks* at the state word — an atomic load, the same checks as one round of the
//! blocking wait — on a back-off of 10 µs doubling to 1 ms paced by a timer descriptor, and
//! every [`LIVENESS_TICK`] checks the other participants as the blocking wait does. Between
//! looks it costs no thread and no CPU; the price is a wake-up up to 1 ms after the completion
//! (a blocking wait on a thread wakes within microseconds). [`ProcessBarrier::wait_async`]
//! first spins as the blocking wait does (cooperatively, with no descriptor yet), so a
//! generation that completes within the spin costs no timer.
//!
//! An arrival is counted when made. Dropped before its generation completed (a cancelled
//! future), it withdraws itself with the same compare-exchange as a timed-out blocking wait:
//! the barrier stays usable and the next wait counts afresh; one that lost that race to the
//! completion has passed the barrier (its generation completed with it), like a blocking wait
//! that times out as the generation completes.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::{BarrierWaitResult, LIVENESS_TICK, ProcessBarrier, count_of, generation_of, poisoned};
use crate::error::Result;
use crate::poll::Pacer;
use crate::sync::Ordering;

/// The first pause between two looks, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_micros(10);
/// The longest pause between two looks.
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// One participant's arrival at a barrier, waiting for the others, as a descriptor that turns
/// readable when it is time to [`check`](Self::check) again: made by
/// [`ProcessBarrier::arrive`], attached to a [`WaitSet`](crate::wait::WaitSet) (or any
/// reactor: it is `AsFd`).
///
/// The wait looks at the shared state on a back-off (10 µs doubling to 1 ms), not told by
/// the completing arrival, whose futex wake no reactor can poll: it costs no thread and no CPU
/// between looks, and wakes up to 1 ms after the completion. A dead or departed participant
/// is noticed within [`LIVENESS_TICK`](ProcessBarrier::LIVENESS_TICK), as by the blocking wait.
///
/// Dropped before its generation completed, the arrival is withdrawn (as a timed-out
/// [`wait_timeout`](ProcessBarrier::wait_timeout) withdraws it): the barrier stays usable.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
/// use cuda_ipc::wait::WaitSet;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let state = BarrierState::new(2)?;
/// let (a, b) = (ProcessBarrier::join(&state)?, ProcessBarrier::join(&state)?);
/// let mut arrival = a.arrive()?;
/// let mut set = WaitSet::new()?;
/// let key = set.attach(&arrival)?;
/// std::thread::scope(|s| {
///     s.spawn(|| b.wait()); // the other participant
///     loop {
///         if set.wait(Some(Duration::from_secs(5)))?.contains(&key) {
///             if let Some(done) = arrival.check()? {
///                 println!("generation {} complete", done.generation());
///                 return Ok(());
///             }
///         }
///     }
/// })
/// # }
/// ```
#[derive(Debug)]
pub struct BarrierArrival<'b, 'a> {
    counted: Counted<'b, 'a>,
    pacer: Pacer,
}

/// An arrival counted in a generation, not yet paced: what both an arrival and an awaited
/// wait's spin look at. Dropped before its generation completed, it withdraws itself.
#[derive(Debug)]
struct Counted<'b, 'a> {
    barrier: &'b ProcessBarrier<'a>,
    generation: u32,
    /// The result once the generation completed (then nothing is withdrawn on drop).
    ended: Option<BarrierWaitResult>,
    next_check: Instant,
    start: Instant,
}

impl<'a> ProcessBarrier<'a> {
    /// Arrive at the barrier without waiting: this participant is counted in the current
    /// generation, and the returned arrival's descriptor says when to
    /// [`check`](BarrierArrival::check) whether every participant has arrived.
    ///
    /// # Errors
    ///
    /// As [`wait_timeout`](Self::wait_timeout), without
    /// [`Error::Timeout`](crate::Error::Timeout) (an arrival has no deadline: attach one to
    /// the [`WaitSet`](crate::wait::WaitSet)); [`Error::Os`](crate::Error::Os) if no timer
    /// descriptor can be made.
    pub fn arrive(&self) -> Result<BarrierArrival<'_, 'a>> {
        self.check_home("ProcessBarrier::arrive")?;
        // The timer first: once counted, the arrival must not fail.
        let pacer = Pacer::new("barrier arrival", FIRST_PAUSE, MAX_PAUSE)?;
        Ok(BarrierArrival {
            counted: self.count_in()?,
            pacer,
        })
    }

    /// Count this participant in the current generation (completing it if it is the last).
    fn count_in(&self) -> Result<Counted<'_, 'a>> {
        let start = Instant::now();
        let (generation, arrived) = self
            .arrive_counted()
            .map_err(|e| e.into_error(Duration::ZERO))?;
        let ended = (arrived == u64::from(self.parties))
            .then(|| self.try_complete(generation))
            .flatten();
        Ok(Counted {
            barrier: self,
            generation,
            ended,
            next_check: start + LIVENESS_TICK,
            start,
        })
    }

    /// Wait for every participant to arrive, as [`wait`](Self::wait) does, but the task, not
    /// a thread, waits (feature `async`; any runtime): it looks again at once for the spin's
    /// length ([`set_spin`](Self::set_spin); cooperatively, other tasks running between its
    /// looks), then as a [`BarrierArrival`] does. No time limit of its own: compose one with
    /// the runtime's (`tokio::time::timeout`).
    ///
    /// **Cancel-safe:** dropped before it returns, its arrival is withdrawn (as a timed-out
    /// wait's is) and the barrier stays usable.
    ///
    /// # Errors
    ///
    /// As [`arrive`](Self::arrive) and [`BarrierArrival::check`];
    /// [`Error::Os`](crate::Error::Os) if the reactor cannot start or watch the timer.
    #[cfg(feature = "async")]
    pub async fn wait_async(&self) -> Result<BarrierWaitResult> {
        let waiting =
            crate::trace::Waiting::start("barrier: every participant to arrive (awaited)");
        waiting.end(self.wait_async_untraced().await)
    }

    /// [`wait_async`](Self::wait_async) without its trace.
    #[cfg(feature = "async")]
    async fn wait_async_untraced(&self) -> Result<BarrierWaitResult> {
        self.check_home("ProcessBarrier::wait_async")?;
        let mut counted = self.count_in()?;
        // As the blocking wait spins before it sleeps: look again at once for the spin's
        // length (cooperatively: other tasks run between the looks), with no descriptor yet.
        let spin = crate::reactor::Spin::new(self.spin);
        while spin.on() {
            if let Some(done) = counted.look()? {
                return Ok(done);
            }
            crate::reactor::yield_now().await;
        }
        // A timer that cannot be made drops `counted`, which withdraws it.
        let pacer = Pacer::new("barrier wait", FIRST_PAUSE, MAX_PAUSE)?;
        let mut arrival = BarrierArrival { counted, pacer };
        loop {
            if let Some(done) = arrival.check()? {
                return Ok(done);
            }
            crate::reactor::Readable::new(arrival.as_fd()).await?;
        }
    }
}

impl BarrierArrival<'_, '_> {
    /// Look once: the generation's result if every participant has arrived (the same result
    /// again at each later call); else `None`, and the descriptor turns readable again after
    /// the next pause.
    ///
    /// # Errors
    ///
    /// [`Error::PeerGone`](crate::Error::PeerGone) (a barrier participant) when a participant
    /// died or left (the barrier is poisoned); [`Error::Poisoned`](crate::Error::Poisoned);
    /// [`Error::Corrupt`](crate::Error::Corrupt) for impossible shared values;
    /// [`Error::Os`](crate::Error::Os) naming `timerfd_settime`. A poisoned barrier stays
    /// poisoned: a later call reports the same error.
    pub fn check(&mut self) -> Result<Option<BarrierWaitResult>> {
        let found = self.counted.look()?;
        if found.is_none() {
            self.pacer.later()?;
        }
        Ok(found)
    }

    /// The generation this arrival is counted in.
    #[must_use]
    pub fn generation(&self) -> u32 {
        self.counted.generation
    }
}

impl Counted<'_, '_> {
    /// One round of the blocking wait's checks, without waiting: the generation's result
    /// (kept, and given again by every later look) or `None`.
    fn look(&mut self) -> Result<Option<BarrierWaitResult>> {
        if self.ended.is_none() {
            self.ended = self.look_once()?;
        }
        Ok(self.ended)
    }

    fn look_once(&mut self) -> Result<Option<BarrierWaitResult>> {
        let (b, generation) = (self.barrier, self.generation);
        let s = b.state.state.0.load(Ordering::Acquire);
        if generation_of(s) != generation {
            return Ok(Some(b.completed(generation)));
        }
        if poisoned(s) {
            return Err(b.state.poison_error());
        }
        // A withdrawal raced a completion: whoever sees the full count completes.
        if count_of(s) == u64::from(b.parties)
            && let Some(done) = b.try_complete(generation)
        {
            return Ok(Some(done));
        }
        if Instant::now() >= self.next_check {
            self.next_check = Instant::now() + LIVENESS_TICK;
            if let Some(end) = b.end_if_peer_gone(generation) {
                return end
                    .map(Some)
                    .map_err(|e| e.into_error(self.start.elapsed()));
            }
        }
        Ok(None)
    }
}

impl AsFd for BarrierArrival<'_, '_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.pacer.as_fd()
    }
}

impl Drop for Counted<'_, '_> {
    fn drop(&mut self) {
        if self.ended.is_none() {
            // Withdrawn, or the generation completed with us: either leaves the barrier
            // usable (a poisoned one stays poisoned: nothing is withdrawn from it).
            let _ = self.barrier.withdraw(self.generation);
        }
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;
