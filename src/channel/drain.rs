//! Taking a channel end apart without freeing under pending GPU work, and without waiting in
//! `Drop`.
//!
//! An end's memory (the slots, the two counters) may be closed only once every operation the
//! channel enqueued on its users' streams has completed ([`InFlight`]). [`Drain`] is an end
//! being taken apart: closed in the region (the producer at once, so the consumer receives
//! what was published and then `ChannelClosed`; the consumer only once its GPU work is done,
//! see [`Drain::finish`]), waiting for that work, and forcing the counter its streams wait on
//! once the other end is gone (their waits would never be met).
//!
//! - `close` on an end waits in place (`Endpoint::close_within`, with this module's
//!   [`Look`]), up to the caller's timeout, taking nothing apart: an end it hands back on an
//!   error is whole. What is left after it (the consumer's unmapping, the region) goes with the
//!   end's drop, through a [`Drain`] whose work is already done.
//! - **Dropping an end never waits** ([`Drain::finish_or_defer`]): finished at once when the
//!   work is already done (the usual case: the user synchronised), else put on this process's
//!   list of draining ends, which every later collect looks at once — at an allocation or export
//!   (as deferred buffer frees are, see `ledger/deferred.rs`), at
//!   [`collect_deferred`](crate::collect_deferred), and at exit (an `atexit` hook that gives each
//!   end the rest of its drain timeout, so that a consumer that drops its receiver and returns
//!   from `main` still closes cleanly rather than looking dead to the producer). An end whose
//!   drain timeout passes is leaked, as `close` would leak it.
//!
//! Where the other side stops: a peer killed while our streams wait on its counter is found
//! dead by a later look and its counter forced, so our streams run on and the end finishes;
//! a forked child's copy of the list is the parent's and is dropped untouched (see
//! `process::Home`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytemuck::Pod;
use parking_lot::Mutex;

use super::inflight::InFlight;
use super::ring::{Geometry, LIVENESS_CHECK, Ring, RingState};
use crate::buffer::Side;
use crate::error::{Error, Result};
use crate::ledger::{DeferredFrees, Pending, register_pending};
use crate::shm::ShmRegion;
use crate::signal::GpuSignal;

/// Which end (below [`Endpoint`](super::endpoint::Endpoint) and its [`Drain`]): it decides how the end closes and which counter it may force at teardown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Producer,
    Consumer,
}

/// An end being taken apart (see the module docs). Built from the end's fields by
/// `Endpoint::take_drain`, then [`start`](Self::start)ed.
pub(crate) struct Drain<T: Pod> {
    pub(super) role: Role,
    /// The consumer entry (0 for the producer).
    pub(super) entry: usize,
    pub(super) region: ShmRegion<RingState>,
    pub(super) geometry: Geometry,
    pub(super) held: u64,
    /// The slots' memory, `sent` and the release counters (every entry's for the producer,
    /// its own for a consumer).
    pub(super) parts: (Side<T>, GpuSignal, Vec<GpuSignal>),
    pub(super) inflight: InFlight,
    /// An operation may be on a stream untracked: the parts are leaked, whatever the events say.
    pub(super) untracked: bool,
    /// Whether the counter our streams wait on was forced (the other end is gone).
    pub(super) forced: bool,
    /// When the other end's liveness is looked at next.
    pub(super) next_check: Instant,
    pub(super) started: Instant,
    pub(super) timeout: Duration,
}

impl<T: Pod> Drain<T> {
    /// Start taking an end apart: the producer closes its end in the region now (the consumer
    /// receives what was published, then `ChannelClosed`; its GPU waits are met by our pending
    /// writes).
    pub(crate) fn start(self) -> Self {
        if self.role == Role::Producer {
            self.ring().close_producer(self.held);
        }
        self
    }

    fn ring(&self) -> Ring<'_> {
        Ring::of(&self.region, self.geometry).at_entry(self.entry)
    }

    /// One look, never waiting: whether every GPU operation of the end has completed (see
    /// [`Look::drained`]).
    fn drained(&mut self) -> bool {
        let ring = Ring::of(&self.region, self.geometry).at_entry(self.entry);
        let mut look = Look {
            forced: self.forced,
            next_check: self.next_check,
        };
        let done = look.drained(
            &mut self.inflight,
            ring,
            self.role,
            &self.parts.1,
            &self.parts.2,
        );
        (self.forced, self.next_check) = (look.forced, look.next_check);
        done
    }

    fn timed_out(&self) -> bool {
        self.started.elapsed() >= self.timeout
    }

    /// `Drop`'s path: finish now if the GPU operations are done, else leave the end to later
    /// collects (see the module docs).
    pub(crate) fn finish_or_defer(mut self) {
        if self.drained() {
            let _ = self.finish(true, Duration::ZERO); // Drop cannot report; `close` does
        } else {
            defer(Box::new(Some(self)));
        }
    }

    /// The consumer closes its end in the region only now, after its GPU work: a producer that
    /// finds the consumer closed may force the release counter (its own streams' waits pass at
    /// once), which is harmless only once the consumer's GPU reads of released slots are done.
    /// Then the memory and counters are closed — or leaked, when GPU work may still touch them
    /// (`drained` false, or untracked).
    fn finish(self, drained: bool, peer_wait: Duration) -> Result<()> {
        if self.role == Role::Consumer {
            self.ring().close_consumer(self.held);
        }
        let Self {
            role,
            parts,
            untracked,
            timeout,
            ..
        } = self;
        if !drained || untracked {
            // GPU work may still touch the memory: leak it rather than free it under that work.
            std::mem::forget(parts);
            return Err(Error::Timeout {
                what: match role {
                    Role::Producer => "IPC channel's GPU operations (memory leaked, not freed)",
                    Role::Consumer => "IPC channel's GPU operations (mappings leaked, not closed)",
                },
                waited: timeout,
                waiting_for: None,
            });
        }
        let (data, sent, released) = parts;
        let deadline = crate::poll::Deadline::after(peer_wait);
        let left = || deadline.remaining();
        let mut results = vec![data.close(left()), sent.close(left())];
        results.extend(released.into_iter().map(|counter| counter.close(left())));
        results.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }
}

/// The liveness side of waiting for an end's GPU operations, shared by a [`Drain`] and by
/// `close` (which waits in place, so that an end it hands back is whole).
pub(crate) struct Look {
    /// The counter our streams wait on was forced (the other end is gone).
    pub(crate) forced: bool,
    /// When the other end's liveness is looked at next.
    pub(crate) next_check: Instant,
}

impl Look {
    pub(crate) fn new() -> Self {
        Self {
            forced: false,
            next_check: Instant::now(),
        }
    }

    /// One look, never waiting: whether every GPU operation of the end (`inflight`) has
    /// completed. At most every [`LIVENESS_CHECK`], forces the counter our streams wait on once
    /// the other end is gone (`sent` for a consumer; for a producer, its consumers' `released`
    /// counters, by entry), so that those waits pass and the work completes.
    pub(crate) fn drained(
        &mut self,
        inflight: &mut InFlight,
        ring: Ring<'_>,
        role: Role,
        sent: &GpuSignal,
        released: &[GpuSignal],
    ) -> bool {
        if inflight.is_idle() {
            return true;
        }
        let now = Instant::now();
        if !self.forced && now >= self.next_check {
            self.next_check = now + LIVENESS_CHECK;
            if role == Role::Producer && ring.geometry.is_broadcast() {
                // Consumers come and go: force the counters of those found dead (to what was
                // sent: a later consumer of the entry starts there), and look again later.
                let mut dead = Vec::new();
                ring.reap_dead_consumers(|i| dead.push(i));
                let sent_now = ring.sent();
                for i in dead {
                    if let Some(counter) = released.get(i) {
                        let _ = counter.signal_host(sent_now);
                    }
                }
            } else if peer_gone(&ring, role) {
                let waited_on = match role {
                    Role::Producer => released.first(),
                    Role::Consumer => Some(sent),
                };
                self.forced =
                    waited_on.is_some_and(|c| c.signal_host(GpuSignal::MAX_VALUE).is_ok());
            }
        }
        false
    }
}

/// Whether the other end is gone so that our streams' waits on its counter will never be met:
/// a consumer that died or closed (the producer's waits are for releases it will never
/// enqueue), or a producer that died (a closed producer's writes are still coming: forcing its
/// counter would let our streams read unwritten items).
fn peer_gone(ring: &Ring<'_>, role: Role) -> bool {
    match role {
        Role::Producer => ring.consumer_status().is_err(),
        Role::Consumer => ring.producer_dead(),
    }
}

/// A draining end of any element type, on the list.
trait Draining: Send {
    /// One look: finish the end if its work is done or its timeout passed; whether it is gone.
    fn step(&mut self) -> bool;
}

impl<T: Pod> Draining for Option<Drain<T>> {
    fn step(&mut self) -> bool {
        let Some(drain) = self else {
            return true;
        };
        if !drain.region.is_home() {
            // A forked child's copy of the parent's end: touch nothing.
            std::mem::forget(self.take());
            return true;
        }
        let drained = drain.drained();
        if drained || drain.timed_out() {
            if let Some(d) = self.take() {
                let _ = d.finish(drained, Duration::ZERO);
            }
            return true;
        }
        false
    }
}

/// Ends dropped while their GPU operations ran.
static DRAINING: Mutex<Vec<Box<dyn Draining>>> = parking_lot::const_mutex(Vec::new());
/// `DRAINING.len()`, readable without the lock (the collects' fast check).
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The draining ends, collected with the deferred frees.
static DRAINS: Pending = Pending {
    pending: || COUNT.load(Ordering::Relaxed) != 0,
    collect: collect_drains,
};

fn defer(end: Box<dyn Draining>) {
    register_pending(&DRAINS);
    drain_at_exit();
    let mut list = DRAINING.lock();
    list.push(end);
    COUNT.store(list.len(), Ordering::Relaxed);
}

/// Look at every draining end once; finish those done (or out of time).
fn collect_drains() -> DeferredFrees {
    // Stepped outside the lock (a finish closes buffers and signals); ends dropped meanwhile
    // join the list and are looked at next time.
    let mut ends = std::mem::take(&mut *DRAINING.lock());
    ends.retain_mut(|end| !end.step());
    let report = DeferredFrees {
        draining: ends.len(),
        ..DeferredFrees::default()
    };
    let mut list = DRAINING.lock();
    list.append(&mut ends);
    COUNT.store(list.len(), Ordering::Relaxed);
    report
}

/// Once per process: at `exit`, give every draining end the rest of its drain timeout.
fn drain_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments whose body cannot
        // panic (a `try_lock`, event queries, closes whose errors are ignored), so it never
        // unwinds across the C boundary, and it does not call `exit`. A failed registration
        // only leaves the ends to the driver's teardown at exit.
        let _ = unsafe { crate::os::at_exit(drain_now) };
    });
}

extern "C" fn drain_now() {
    // `try_lock`: an exit from inside a collect must not deadlock (the ends are then left to
    // the driver's teardown, as a killed process's are).
    let Some(mut list) = DRAINING.try_lock() else {
        return;
    };
    let mut ends = std::mem::take(&mut *list);
    drop(list); // a finish must be free to take it
    // Each end finishes by its own timeout at the latest, so this loop ends.
    loop {
        ends.retain_mut(|end| !end.step());
        if ends.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
