//! Tracking the GPU work a channel enqueued on its users' streams, so that the channel's memory
//! is never unmapped or freed while a stream may still wait on it or write it.
//!
//! After each batch of stream operations on a user's stream (a wait and a signal), the channel
//! records an event of its own on that stream. Events complete in stream order, so once every
//! recorded event has completed, no operation the channel enqueued is pending, whatever became
//! of the streams (an event recorded on a stream survives the stream's destruction). Completed
//! events are recycled from the front of the queue at every record, so the queue holds only the
//! work still in flight.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::Result;

/// Events recorded after the channel's operations, oldest first, and spare ones.
pub(crate) struct InFlight {
    ctx: GpuContext,
    pending: VecDeque<sys::CUevent>,
    spare: Vec<sys::CUevent>,
}

// SAFETY: the events are owned by this tracker alone; CUDA event handles may be used from any
// thread (each call pushes the tracker's context).
unsafe impl Send for InFlight {}

/// Whether an event has completed; an error (a context lost to a fault) also counts as done,
/// since nothing will ever run in that context again.
fn is_done(event: sys::CUevent) -> bool {
    // SAFETY: a live event created by this tracker.
    unsafe { driver::event::query(event) }.unwrap_or(true)
}

impl InFlight {
    pub(crate) fn new(ctx: &GpuContext) -> Self {
        Self {
            ctx: ctx.clone(),
            pending: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Recycle the completed events at the front (the caller has entered the context).
    fn reap(&mut self) {
        while let Some(&front) = self.pending.front() {
            if !is_done(front) {
                break;
            }
            self.pending.pop_front();
            self.spare.push(front);
        }
    }

    /// Record an event on `stream` after what was enqueued there so far (`cuEventRecord`).
    /// The caller has entered the context. Completed events are recycled only when no spare
    /// one is left (one `cuEventQuery` per recycling, not per record).
    pub(crate) fn record(&mut self, stream: sys::CUstream) -> Result<()> {
        if self.spare.is_empty() {
            self.reap();
        }
        let event = match self.spare.pop() {
            Some(e) => e,
            None => {
                // In the current context: the channel's.
                driver::event::create(sys::CU_EVENT_DISABLE_TIMING)?
            }
        };
        // SAFETY: a live event of this context; `stream` is a live stream of the caller's
        // (borrowed by the caller for the duration of this call).
        if let Err(e) = unsafe { driver::event::record(event, stream) } {
            self.spare.push(event);
            return Err(e);
        }
        self.pending.push_back(event);
        Ok(())
    }

    /// Whether every recorded operation has completed.
    pub(crate) fn is_idle(&mut self) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let Ok(_g) = self.ctx.enter() else {
            return true;
        };
        self.reap();
        self.pending.is_empty()
    }

    /// Wait until every recorded operation has completed, at most `timeout`, calling
    /// `check` every 10 ms (it may unblock the streams, e.g. after finding a peer dead) and
    /// giving up early once `stop` says so. Returns whether everything completed.
    pub(crate) fn drain(
        &mut self,
        timeout: Duration,
        mut check: impl FnMut(),
        mut stop: impl FnMut() -> bool,
    ) -> bool {
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        let mut next_check = start;
        loop {
            if self.is_idle() {
                return true;
            }
            let now = Instant::now();
            if now >= next_check {
                check();
                next_check = now + super::ring::LIVENESS_CHECK;
            }
            if now - start >= timeout || stop() {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(_g) = self.ctx.enter() {
            for e in self.pending.drain(..).chain(self.spare.drain(..)) {
                // SAFETY: created by this tracker, destroyed once. Destroying an event that a
                // stream has yet to reach is allowed (the driver releases it when reached).
                // Drop cannot report a failure.
                let _ = unsafe { driver::event::destroy(e) };
            }
        }
    }
}
