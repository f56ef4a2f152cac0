//! What each end of a channel holds — its view of the region, the slots' memory, the two
//! counters and the tracker of its GPU operations — and what both ends do with it: address a
//! slot, signal a counter and track the write, and tear down without freeing under pending
//! GPU work.

use std::mem::ManuallyDrop;
use std::time::Duration;

use bytemuck::Pod;

use super::inflight::InFlight;
use super::ring::{Geometry, Ring, RingState};
use crate::buffer::BufferCore;
use crate::driver::{self, sys};
use crate::error::{Error, Result};
use crate::shm::ShmRegion;
use crate::signal::GpuSignal;

/// How long dropping or closing an end waits for the channel's GPU operations (and closing the
/// producer, for the consumer to unmap) by default: see `set_drop_timeout`.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Which end: it decides how the end closes and which counter it may force at teardown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Producer,
    Consumer,
}

/// One end of a channel.
pub(crate) struct Endpoint<T: Pod> {
    pub(crate) role: Role,
    pub(crate) region: ShmRegion<RingState>,
    pub(crate) geometry: Geometry,
    /// Elements from one slot's start to the next.
    pub(crate) stride: u64,
    /// Our owner word in the region (the producer's, or consumer 0's).
    pub(crate) held: u64,
    pub(crate) data: ManuallyDrop<BufferCore<T>>,
    /// Written by the producer's streams, waited on by the consumer's.
    pub(crate) sent: ManuallyDrop<GpuSignal>,
    /// Written by the consumer's streams, waited on by the producer's.
    pub(crate) released: ManuallyDrop<GpuSignal>,
    inflight: InFlight,
    /// The stream (its `cuStreamGetId`, if known) and value of our last counter write.
    last_signal: Option<(Option<u64>, u64)>,
    /// Set when an operation may be on a stream untracked: teardown then leaks the memory.
    untracked: bool,
    /// Set once `teardown` has run (the three `ManuallyDrop`s are then gone).
    torn_down: bool,
    pub(crate) drain_timeout: Duration,
}

impl<T: Pod> Endpoint<T> {
    pub(crate) fn new(
        role: Role,
        region: ShmRegion<RingState>,
        geometry: Geometry,
        stride: u64,
        held: u64,
        (data, sent, released): (BufferCore<T>, GpuSignal, GpuSignal),
    ) -> Self {
        Self {
            role,
            inflight: InFlight::new(data.context()),
            last_signal: None,
            region,
            geometry,
            stride,
            held,
            data: ManuallyDrop::new(data),
            sent: ManuallyDrop::new(sent),
            released: ManuallyDrop::new(released),
            untracked: false,
            torn_down: false,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    pub(crate) fn ring(&self) -> Ring<'_> {
        Ring::new(self.region.get(), self.geometry)
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
    /// makes the stream's earlier work visible to every process) and record the tracking event
    /// after it, in one entry of the context. The counter is `sent` for the producer,
    /// `released` for the consumer.
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
    /// `Err`: the write failed, nothing was enqueued. `Ok(recorded)`: the write is enqueued;
    /// `recorded` is the record's result (a failure marks the end untracked).
    pub(crate) fn signal(&mut self, stream: sys::CUstream, value: u64) -> Result<Result<()>> {
        let counter = match self.role {
            Role::Producer => self.sent.as_raw_ptr(),
            Role::Consumer => self.released.as_raw_ptr(),
        };
        let _g = self.data.context().enter()?;
        let id = crate::driver::stream::id(stream);
        let write = sys::CUstreamMemOpValue64 {
            operation: sys::CU_STREAM_MEM_OP_WRITE_VALUE_64,
            address: counter,
            value,
            flags: sys::CU_STREAM_WRITE_VALUE_DEFAULT,
            alias: 0,
            pad: 0,
        };
        match self.last_signal {
            Some((last_id, last)) if id.is_none() || id != last_id => {
                let mut ops = [
                    sys::CUstreamMemOpValue64 {
                        operation: sys::CU_STREAM_MEM_OP_WAIT_VALUE_64,
                        value: last,
                        flags: sys::CU_STREAM_WAIT_VALUE_GEQ,
                        ..write
                    },
                    write,
                ];
                // SAFETY: two operations on an 8-byte aligned word of a signal this end holds
                // mapped; `stream` is live (borrowed by the caller's slot or item); the event
                // recorded right after lets teardown wait for both before the counter is
                // unmapped or freed.
                unsafe { driver::stream::batch_mem_op(stream, &mut ops) }?;
            }
            _ => {
                // SAFETY: as above, one write; on the stream of the previous write (or the
                // first write), which orders it after that one.
                unsafe { driver::stream::write_value64(stream, counter, value, write.flags) }?;
            }
        }
        self.last_signal = Some((id, value));
        let recorded = self.inflight.record(stream);
        if recorded.is_err() {
            self.untracked = true;
        }
        Ok(recorded)
    }

    /// Whether the other end is gone so that our streams' waits on its counter will never be
    /// satisfied: a consumer that died or closed (the producer's waits are for releases it
    /// will never enqueue), or a producer that died (a closed producer's writes are still
    /// coming: forcing its counter would let our streams read unwritten items).
    fn peer_gone(role: Role, ring: &Ring<'_>) -> bool {
        match role {
            Role::Producer => ring.consumer_status().is_err(),
            Role::Consumer => ring.producer_dead(),
        }
    }

    /// Close our end in the region and wait (at most the drop timeout) for our GPU operations —
    /// forcing the counter our streams wait on once the other end is gone — then close the
    /// memory and counters, or leak them if GPU work may still touch them. The producer's
    /// memory is freed once the consumer has unmapped it: `peer_wait` is how long to wait for
    /// that here (zero from drop: the free is then deferred, see `ledger/deferred.rs`). Runs once;
    /// later calls return `Ok`.
    ///
    /// The producer closes first and then drains: a consumer keeps receiving what was
    /// published, and its GPU waits are met by the producer's pending writes. The consumer
    /// drains first and then closes: a producer that finds the consumer closed may force the
    /// release counter (its own streams' waits pass at once), which is only harmless once the
    /// consumer's GPU reads of released slots are done.
    pub(crate) fn teardown(&mut self, peer_wait: Duration) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let ring = Ring::new(self.region.get(), self.geometry);
        let waited_on = match self.role {
            Role::Producer => {
                ring.close_producer(self.held);
                &self.released
            }
            Role::Consumer => &self.sent,
        };
        let (role, mut forced) = (self.role, false);
        let drained = self.inflight.drain(
            self.drain_timeout,
            || {
                if !forced && Self::peer_gone(role, &ring) {
                    forced = waited_on.signal_host(GpuSignal::MAX_VALUE).is_ok();
                }
            },
            || false,
        );
        if role == Role::Consumer {
            ring.close_consumer(self.held);
        }
        // SAFETY: (all three `take`s) guarded by `torn_down`, set above: taken once, and no
        // method uses the fields after teardown (the owning end is being closed or dropped).
        let parts = unsafe {
            (
                ManuallyDrop::take(&mut self.data),
                ManuallyDrop::take(&mut self.sent),
                ManuallyDrop::take(&mut self.released),
            )
        };
        if !drained || self.untracked {
            // GPU work may still touch the memory: leak it rather than free it under that work.
            std::mem::forget(parts);
            return Err(Error::Timeout {
                what: match self.role {
                    Role::Producer => "IPC channel's GPU operations (memory leaked, not freed)",
                    Role::Consumer => "IPC channel's GPU operations (mappings leaked, not closed)",
                },
                waited: self.drain_timeout,
            });
        }
        let (data, sent, released) = parts;
        let deadline = crate::poll::Deadline::after(peer_wait);
        let left = || deadline.remaining();
        let results = [
            data.close(left()),
            sent.close(left()),
            released.close(left()),
        ];
        results.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }
}

impl<T: Pod> Drop for Endpoint<T> {
    fn drop(&mut self) {
        if !self.region.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // Drop cannot report: `close` on the owning end returns what went wrong; here a
        // failure leaks at worst.
        let _ = self.teardown(Duration::ZERO);
    }
}
