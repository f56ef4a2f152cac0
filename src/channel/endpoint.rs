//! What each end of a channel holds — its view of the region, the slots' memory, the two
//! counters and the tracker of its GPU operations — and what both ends do with it: address a
//! slot, signal a counter and track the write, and hand itself to a [`Drain`] to be taken
//! apart (`drain.rs`).

use std::mem::ManuallyDrop;
use std::time::Duration;

use bytemuck::Pod;

use super::drain::{Drain, Look, Role};
use super::inflight::InFlight;
use super::readiness::Readiness;
use super::ring::{Geometry, Ring, RingState};
use crate::buffer::Side;
use crate::driver::sys;
use crate::error::{Error, ObjectState, Result};
use crate::shm::ShmRegion;
use crate::signal::GpuSignal;

/// A counter write [`Endpoint::signal`] enqueued, not yet tracked: publish what it stands for
/// on [`ring`](Self::ring) (the host's word to the peer: an item sent, or released), then
/// [`record`](Self::record) the event that tracks the write. Dropped unrecorded, it records:
/// the write is enqueued whatever the publish did, and teardown must wait for it.
#[must_use = "publish on its ring, then record it"]
pub(crate) struct Signalled<'e, T: Pod> {
    end: &'e mut Endpoint<T>,
    stream: sys::CUstream,
    recorded: bool,
}

impl<T: Pod> Signalled<'_, T> {
    /// The ring to publish on.
    pub(crate) fn ring(&self) -> Ring<'_> {
        self.end.ring()
    }

    /// Record the event that tracks the write (after the publish: a driver call, off the
    /// peer's path). An `Err` has marked the end untracked (its teardown then leaks instead of
    /// freeing under GPU work).
    pub(crate) fn record(mut self) -> Result<()> {
        self.recorded = true;
        self.end.record(self.stream)
    }
}

impl<T: Pod> Drop for Signalled<'_, T> {
    fn drop(&mut self) {
        if !self.recorded {
            // Drop cannot report; a failed record marked the end untracked.
            let _ = self.end.record(self.stream);
        }
    }
}

/// How long an end's GPU operations are waited for (by `close`; after a drop, by later collects)
/// before its memory is leaked rather than freed under them, and how long closing the producer
/// waits for the consumer to unmap, by default: see `set_drop_timeout`.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// One end of a channel.
pub(crate) struct Endpoint<T: Pod> {
    pub(crate) role: Role,
    /// Taken by the [`Drain`] at teardown, like the three below.
    pub(crate) region: ManuallyDrop<ShmRegion<RingState>>,
    pub(crate) geometry: Geometry,
    /// Elements from one slot's start to the next.
    pub(crate) stride: u64,
    /// Our owner word in the region (the producer's, or consumer 0's).
    pub(crate) held: u64,
    pub(crate) data: ManuallyDrop<Side<T>>,
    /// Written by the producer's streams, waited on by the consumer's.
    pub(crate) sent: ManuallyDrop<GpuSignal>,
    /// Written by the consumers' streams, waited on by the producer's: the producer's holds
    /// one per consumer entry (by entry), a consumer's only its own entry's.
    pub(crate) released: ManuallyDrop<Vec<GpuSignal>>,
    /// The consumer entry this end is (0 for the producer).
    pub(crate) entry: usize,
    inflight: InFlight,
    /// The stream (its `cuStreamGetId`, if known) and value of our last counter write.
    last_signal: Option<(Option<u64>, u64)>,
    /// Set when an operation may be on a stream untracked: teardown then leaks the memory.
    untracked: bool,
    /// Set once `teardown` has run (the four `ManuallyDrop`s are then gone).
    torn_down: bool,
    /// Set when a `close` began: the end sends or receives nothing more (a close that did not
    /// finish hands the end back, whole, for another `close` or a drop).
    pub(crate) closing: bool,
    pub(crate) drain_timeout: Duration,
    /// This end's bell and its peer's pidfd, once it listens (`listening.rs`): then a `try_`
    /// call that finds nothing arms it.
    pub(crate) readiness: Option<Readiness>,
}

impl<T: Pod> Endpoint<T> {
    pub(crate) fn new(
        role: Role,
        region: ShmRegion<RingState>,
        geometry: Geometry,
        stride: u64,
        held: u64,
        entry: usize,
        (data, sent, released): (Side<T>, GpuSignal, Vec<GpuSignal>),
    ) -> Self {
        Self {
            role,
            inflight: InFlight::new(data.context()),
            last_signal: None,
            region: ManuallyDrop::new(region),
            geometry,
            stride,
            held,
            data: ManuallyDrop::new(data),
            sent: ManuallyDrop::new(sent),
            released: ManuallyDrop::new(released),
            entry,
            untracked: false,
            torn_down: false,
            closing: false,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            readiness: None,
        }
    }

    pub(crate) fn ring(&self) -> Ring<'_> {
        Ring::of(&self.region, self.geometry).at_entry(self.entry)
    }

    /// Producer: enqueue on `stream` a GPU wait for every attached consumer to have released
    /// item `value` (entry 0 alone in a one-consumer channel, attached or not).
    ///
    /// # Safety
    ///
    /// As [`GpuSignal::wait`]: the caller records an event on `stream` after it, so that
    /// teardown waits for it before the counters are closed.
    pub(crate) unsafe fn wait_released(&self, stream: sys::CUstream, value: u64) -> Result<()> {
        // SAFETY: the caller's live stream, borrowed for this call.
        let raw = unsafe { crate::stream::RawStream::from_raw(stream) };
        if !self.geometry.is_broadcast() {
            // SAFETY: forwarded to the caller.
            return unsafe { self.released[0].wait(&raw, value) };
        }
        for i in self.ring().held_entries() {
            if let Some(counter) = self.released.get(i) {
                // SAFETY: forwarded to the caller.
                unsafe { counter.wait(&raw, value)? };
            }
        }
        Ok(())
    }

    /// Producer of a broadcast channel: force the release counters of the `detached` entries
    /// (their consumers died) to what was sent, so that our streams' waits on them pass; a
    /// later consumer of the entry starts at or above it.
    pub(crate) fn force_detached(&self, detached: &[usize]) {
        let sent = self.ring().sent();
        for &i in detached {
            if let Some(counter) = self.released.get(i) {
                // An error (the counter already at or past it) leaves nothing to force.
                let _ = counter.signal_host(sent);
            }
        }
    }

    /// The device address of the slot that item `k` (from 1) uses.
    pub(crate) fn slot_ptr(&self, k: u64) -> u64 {
        let index = self.geometry.slot_of(k) as u64;
        self.data.as_raw_ptr() + index * self.stride * std::mem::size_of::<T>() as u64
    }

    /// Record an event after the channel's operations on `stream`, in our context; on
    /// failure, remember that work may be untracked (teardown then leaks instead of freeing).
    pub(crate) fn record(&mut self, stream: sys::CUstream) -> Result<()> {
        let result = self
            .data
            .context()
            .enter()
            .and_then(|_g| self.inflight.record(stream));
        if result.is_err() {
            self.untracked = true;
        }
        result
    }

    /// Enqueue "our counter = `value`" on `stream` (`cuStreamWriteValue64`, after a fence that
    /// makes the stream's earlier work visible to every process); the caller then publishes on
    /// the returned [`Signalled`]'s ring (the host's word to the peer: an item sent, or
    /// released) and records the event that tracks the write — in that order, so that the
    /// record (a driver call, ~1 µs, ~11–16 µs in a process that was idle a few ms, measured on
    /// an H200) is off the peer's path. The counter is `sent` for the producer, `released` for
    /// the consumer.
    ///
    /// The counter must only grow on the GPU, whatever streams the user passes: the peer reads
    /// "counter ≥ k" as "items up to k are done", so a write of `k + 1` on a fast stream must
    /// not land before the write of `k` on a slow one (the peer would read item `k` before it
    /// was written, or overwrite a slot still being read). A write on the stream that carried
    /// the previous write is ordered after it by the stream; on any other stream the write is
    /// preceded, in the same batch (`cuStreamBatchMemOp`), by a GPU wait for the counter to
    /// reach the previous value. Streams are compared by `cuStreamGetId`, which a new stream
    /// never shares with a destroyed one (a handle's address may be reused); without it, every
    /// write waits.
    ///
    /// `Err`: the write failed; nothing was enqueued (publish nothing). `Ok`: the write is
    /// enqueued.
    pub(crate) fn signal(&mut self, stream: sys::CUstream, value: u64) -> Result<Signalled<'_, T>> {
        let counter = match self.role {
            Role::Producer => self.sent.as_raw_ptr(),
            Role::Consumer => match self.released.first() {
                Some(counter) => counter.as_raw_ptr(),
                None => {
                    return Err(Error::Corrupt {
                        what: "IPC channel end",
                        defect: crate::error::StateDefect::Missing {
                            what: "the consumer's release counter",
                        },
                    });
                }
            },
        };
        let guard = self.data.context().enter()?;
        let id = crate::driver::stream::id(stream);
        // After the previous write if that was on another stream (or one we cannot name):
        // the counter must never go backwards.
        let after = match self.last_signal {
            Some((last_id, last)) if id.is_none() || id != last_id => Some(last),
            _ => None,
        };
        // SAFETY: an 8-byte aligned word of a signal this end holds mapped; `stream` is live
        // (borrowed by the caller's slot or item); the event this function records below
        // (after the publish) lets teardown wait for the operations before the counter is
        // unmapped or freed (a failed record marks the end untracked: teardown then leaks the
        // counter).
        unsafe { GpuSignal::write_word_after(stream, counter, value, after) }?;
        self.last_signal = Some((id, value));
        drop(guard); // `record` enters the context itself
        Ok(Signalled {
            end: self,
            stream,
            recorded: false,
        })
    }

    /// Take the end apart: a [`Drain`] of everything it holds (once; `None` after).
    fn take_drain(&mut self) -> Option<Drain<T>> {
        if self.torn_down {
            return None;
        }
        self.torn_down = true;
        // SAFETY: (all four `take`s) guarded by `torn_down`, set above: taken once, and no
        // method uses the fields after teardown (the owning end is being closed or dropped).
        let (region, data, sent, released) = unsafe {
            (
                ManuallyDrop::take(&mut self.region),
                ManuallyDrop::take(&mut self.data),
                ManuallyDrop::take(&mut self.sent),
                ManuallyDrop::take(&mut self.released),
            )
        };
        let inflight = std::mem::replace(&mut self.inflight, InFlight::new(data.context()));
        let now = std::time::Instant::now();
        let drain = Drain {
            role: self.role,
            entry: self.entry,
            region,
            geometry: self.geometry,
            held: self.held,
            parts: (data, sent, released),
            inflight,
            untracked: self.untracked,
            forced: false,
            next_check: now,
            started: now,
            timeout: self.drain_timeout,
        };
        Some(drain.start())
    }

    /// Refuse `call` once a close has begun (the end sends or receives nothing more).
    pub(crate) fn check_open(&self, call: &'static str) -> Result<()> {
        if self.closing {
            return Err(Error::InvalidState {
                call,
                state: ObjectState::Closing,
            });
        }
        Ok(())
    }

    /// `close`: wait up to `timeout`, in place (an end handed back on an error is whole), for
    /// the end's GPU operations — forcing the counter our streams wait on once the other end
    /// is gone — and then, for the producer, for every consumer to unmap the memory and the
    /// counters, which it then frees; the consumer closes its end in the region once its GPU
    /// work is done (see [`Drain`] for why then). What is left (the consumer's unmapping, the
    /// region) goes when the end drops, at once. Each step is safe to repeat.
    pub(crate) fn close_within(&mut self, timeout: Duration) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.closing = true;
        if self.role == Role::Producer {
            self.ring().close_producer(self.held);
        }
        let deadline = crate::poll::Deadline::after(timeout);
        let mut backoff =
            crate::poll::Backoff::new(timeout, Duration::from_micros(5), Duration::from_millis(1));
        let mut look = Look::new();
        loop {
            let ring = Ring::of(&self.region, self.geometry).at_entry(self.entry);
            if look.drained(
                &mut self.inflight,
                ring,
                self.role,
                &self.sent,
                &self.released,
            ) {
                break;
            }
            if let Err(waited) = backoff.pause() {
                return Err(Error::Timeout {
                    what: "IPC channel close (its GPU operations; nothing freed or leaked yet)",
                    waited,
                    waiting_for: None,
                });
            }
        }
        if self.untracked {
            return Err(Error::Timeout {
                what: "IPC channel close (an operation went on an untracked stream: the memory \
                       is leaked when the end drops, not freed)",
                waited: backoff.waited(),
                waiting_for: None,
            });
        }
        match self.role {
            Role::Consumer => {
                // The bell first: a consumer attaching to this entry the moment it is free
                // (a broadcast channel reuses entries) binds the same bell name.
                self.readiness = None;
                self.ring().close_consumer(self.held);
            }
            Role::Producer => {
                self.data.close_in_place(deadline.remaining())?;
                self.sent.close_in_place(deadline.remaining())?;
                for counter in self.released.iter_mut() {
                    counter.close_in_place(deadline.remaining())?;
                }
            }
        }
        Ok(())
    }
}

impl<T: Pod> Drop for Endpoint<T> {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        if !self.region.is_home() {
            // Inherited by a forked child: the parent's (see `process::Home`). Only our view of
            // the region goes; the memory, counters and tracker are left untouched.
            self.torn_down = true;
            // SAFETY: not taken (`torn_down` was clear), dropped once, never used after.
            unsafe { ManuallyDrop::drop(&mut self.region) };
            return;
        }
        // The bell first, before the drain gives the entry back (see `close_within`).
        self.readiness = None;
        // Never waits: finished now if the GPU work is done, else by a later collect.
        if let Some(drain) = self.take_drain() {
            drain.finish_or_defer();
        }
    }
}
