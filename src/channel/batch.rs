//! Several items per GPU signal: [`IpcSender::acquire_batch`] → [`SendBatch`] and
//! [`IpcReceiver::recv_batch`] → [`ReceivedBatch`].
//!
//! Each item of the one-at-a-time API costs a GPU wait and a GPU write on each side, and
//! between two small copies on a stream every such operation costs the copy engine a drain and
//! a restart (about 5 µs on an H200: `BENCHMARKS.md`, "GPU channel"). A batch takes several
//! consecutive items on one stream with one wait, and hands them on with one write: the
//! counters mean "items up to k", so one write of the batch's last item covers every item of
//! it. The shared-memory ring still moves one item at a time (the same protocol and kill
//! points as single items), and batches mix freely with single items on either side.

use std::marker::PhantomData;
use std::time::Duration;

use bytemuck::Pod;

use super::ring::Geometry;
use super::{IpcReceiver, IpcSender, wait_limit};
use crate::driver::sys;
use crate::error::{ArgumentDefect, Error, PeerRole, Result};
use crate::stream::AsStream;

/// Consecutive slots the producer holds, between [`IpcSender::acquire_batch`] and
/// [`send`](Self::send). Dropping it without sending keeps the slots: the next acquire returns
/// them again.
pub struct SendBatch<'a, T: Pod> {
    tx: &'a mut IpcSender<T>,
    stream: sys::CUstream,
    count: u64,
    /// A GPU wait was enqueued on `stream` and not yet covered by a recorded event.
    waited: bool,
    _stream: PhantomData<&'a ()>,
}

/// One slot of a [`SendBatch`]: where to write item [`seq`](Self::seq).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSlot {
    /// The slot's device address (`capacity` elements, aligned for the element type).
    pub ptr: u64,
    /// Elements the slot can hold.
    pub capacity: usize,
    /// The item's number (items count from 1).
    pub seq: u64,
    /// The slot's index in the ring.
    pub index: usize,
}

/// Consecutive items the consumer holds, between [`IpcReceiver::recv_batch`] and
/// [`release`](Self::release) (or drop, which releases them on the receiving stream).
pub struct ReceivedBatch<'a, T: Pod> {
    rx: &'a mut IpcReceiver<T>,
    stream: sys::CUstream,
    first: u64,
    lens: Vec<usize>,
    headers: Vec<Vec<u8>>,
    done: bool,
    _stream: PhantomData<&'a ()>,
}

/// One item of a [`ReceivedBatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchItem {
    /// The item's device address (`len` elements).
    pub ptr: u64,
    /// Elements the producer sent in this item.
    pub len: usize,
    /// The item's number (items count from 1).
    pub seq: u64,
    /// The slot's index in the ring.
    pub index: usize,
}

fn check_count(call: &'static str, count: usize, slots: u64) -> Result<u64> {
    let n = count as u64;
    ArgumentDefect::check_range(call, "batch items (1 to the ring's slots)", n, 1, slots)?;
    Ok(n)
}

impl<T: Pod> IpcSender<T> {
    /// Wait on the host (at most `timeout`) until the next `count` slots are free, and enqueue
    /// one GPU wait on `stream` for the consumer's release of the last of them
    /// (`cuStreamWaitValue64`). Write the slots with kernels or copies on `stream`, then
    /// [`send`](SendBatch::send) them together.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `count` is 1 to [`slots`](Self::slots); otherwise as
    /// [`acquire`](Self::acquire).
    #[doc(alias = "cuStreamWaitValue64")]
    pub fn acquire_batch<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        count: usize,
        timeout: Duration,
    ) -> Result<SendBatch<'a, T>> {
        let slots = self.end.geometry.slots;
        let count = check_count("IpcSender::acquire_batch", count, slots)?;
        self.end.check_open("IpcSender::acquire_batch")?;
        let last = self.next + count - 1;
        // Item `last` may be written once `last − slots` is released, and releases come in
        // order: so may every item before it.
        self.acquire_host(last, timeout)?;
        let waited = last > slots;
        if waited {
            // SAFETY: the counter stays mapped until this wait has completed: a `record` on
            // this stream follows (at `send`, or when the batch is dropped), and the sender's
            // teardown (close, or a collect after its drop) waits for every recorded event before it
            // frees the counter.
            unsafe {
                self.end
                    .wait_released(stream.as_cu_stream(), last - slots)?
            };
        }
        Ok(SendBatch {
            stream: stream.as_cu_stream(),
            tx: self,
            count,
            waited,
            _stream: PhantomData,
        })
    }
}

impl<T: Pod> SendBatch<'_, T> {
    /// Slots in the batch.
    #[must_use]
    pub fn len(&self) -> usize {
        // ≤ the ring's slots (checked at acquire), which fit in usize.
        self.count as usize
    }

    /// Always false: a batch holds at least one slot.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The batch's slots, in item order.
    pub fn slots(&self) -> impl Iterator<Item = BatchSlot> + '_ {
        let end = &self.tx.end;
        (self.tx.next..self.tx.next + self.count).map(move |seq| BatchSlot {
            ptr: end.slot_ptr(seq),
            capacity: end.geometry.capacity as usize,
            seq,
            index: end.geometry.slot_of(seq),
        })
    }

    /// Send the first `lens[i]` elements of slot `i`, every slot of the batch: enqueue one
    /// "`sent` = the last item" on the acquiring stream (after the stream's earlier work and a
    /// memory fence), then publish each item to the consumer. Returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `lens` has one length per slot, each within the
    /// capacity (the slots are kept: send again); [`Error::Cuda`] naming
    /// `cuStreamWriteValue64` or `cuStreamBatchMemOp`; [`Error::Corrupt`] when the shared
    /// state is inconsistent. An error means no item of the batch was published (send again,
    /// or drop the batch); once published, `send` returns `Ok` — a tracking event that could
    /// not be recorded after that is reported by the sender's `close`.
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn send(self, lens: &[usize]) -> Result<()> {
        self.send_items(lens, None)
    }

    /// As [`send`](Self::send), with one header per item (up to
    /// [`HEADER_BYTES`](crate::channel::HEADER_BYTES) bytes each; see
    /// [`SendSlot::send_with_header`](crate::channel::SendSlot::send_with_header)).
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send); [`Error::InvalidArgument`] also unless `headers` has one
    /// header per item, each within the bound (checked before anything is enqueued).
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn send_with_headers(self, lens: &[usize], headers: &[&[u8]]) -> Result<()> {
        self.send_items(lens, Some(headers))
    }

    fn send_items(mut self, lens: &[usize], headers: Option<&[&[u8]]>) -> Result<()> {
        let mismatch = |what, found: usize| Error::InvalidArgument {
            call: "SendBatch::send",
            defect: ArgumentDefect::LengthMismatch {
                what,
                expected: self.count,
                found: found as u64,
            },
        };
        if lens.len() as u64 != self.count {
            return Err(mismatch("item lengths (one per batch item)", lens.len()));
        }
        if let Some(h) = headers
            && h.len() as u64 != self.count
        {
            return Err(mismatch("item headers (one per batch item)", h.len()));
        }
        let headers = headers.unwrap_or(&[]);
        let geometry = &self.tx.end.geometry;
        for &len in lens {
            geometry.check_item_len("SendBatch::send", len)?;
        }
        for header in headers {
            Geometry::check_header("SendBatch::send_with_headers", header)?;
        }
        let items = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| (len as u64, headers.get(i).copied().unwrap_or(&[])));
        self.tx
            .publish_items(self.stream, &mut self.waited, self.count, items)
    }
}

impl<T: Pod> Drop for SendBatch<'_, T> {
    fn drop(&mut self) {
        if self.waited {
            self.tx.cover_unsent(self.stream);
        }
    }
}

impl<T: Pod> std::fmt::Debug for SendBatch<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("first", &self.tx.next)
            .field("len", &self.count)
            .finish_non_exhaustive()
    }
}

impl<T: Pod> IpcReceiver<T> {
    /// Wait on the host (at most `timeout`) until at least one item is published, take it and
    /// every further item already published, up to `max`, and enqueue one GPU wait on `stream`
    /// for the last of them (`cuStreamWaitValue64`): work enqueued after it on `stream` sees
    /// every item of the batch written. Read them on `stream`, then
    /// [`release`](ReceivedBatch::release) them together.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `max` is 1 to [`slots`](Self::slots); otherwise as
    /// [`recv`](Self::recv) (a closed or dead producer is reported only when no item is left).
    #[doc(alias = "cuStreamWaitValue64")]
    pub fn recv_batch<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        max: usize,
        timeout: Duration,
    ) -> Result<ReceivedBatch<'a, T>> {
        let slots = self.end.geometry.slots;
        let max = check_count("IpcReceiver::recv_batch", max, slots)?;
        self.end.check_open("IpcReceiver::recv_batch")?;
        let ring = self.ring();
        let mut lens = vec![ring.recv(self.received, wait_limit(timeout))?];
        while (lens.len() as u64) < max {
            match ring.try_recv(self.received + lens.len() as u64) {
                Ok(Some(len)) => lens.push(len),
                // Nothing more yet, or the producer closed or died after what we have: the
                // next call reports it.
                Ok(None)
                | Err(
                    Error::ChannelClosed { .. }
                    | Error::PeerGone {
                        role: PeerRole::Exporter,
                        ..
                    },
                ) => break,
                Err(e) => return Err(e),
            }
        }
        let first = self.received + 1;
        let last = self.received + lens.len() as u64;
        let headers = (first..=last)
            .map(|k| ring.header(k))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: the counter stays mapped until this wait has completed: the batch's release
        // (explicit or in its drop) records an event on this stream after it, and the
        // receiver's teardown (close, or a collect after its drop) waits for recorded events
        // before unmapping.
        unsafe { self.end.sent.wait(stream, last)? };
        self.received = last;
        Ok(ReceivedBatch {
            stream: stream.as_cu_stream(),
            rx: self,
            first,
            // Each ≤ capacity (checked by the ring), which fits in usize (the allocation does).
            lens: lens.into_iter().map(|l| l as usize).collect(),
            headers,
            done: false,
            _stream: PhantomData,
        })
    }
}

impl<T: Pod> ReceivedBatch<'_, T> {
    /// Items in the batch.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Always false: a batch holds at least one item.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The batch's items, in order.
    pub fn items(&self) -> impl Iterator<Item = BatchItem> + '_ {
        let end = &self.rx.end;
        (self.first..)
            .zip(&self.lens)
            .map(move |(seq, &len)| BatchItem {
                ptr: end.slot_ptr(seq),
                len,
                seq,
                index: end.geometry.slot_of(seq),
            })
    }

    /// The header of the batch's `i`-th item (0-based; see
    /// [`Received::header`](crate::channel::Received::header)): `None` past the batch's end.
    #[must_use]
    pub fn header(&self, i: usize) -> Option<&[u8]> {
        self.headers.get(i).map(Vec::as_slice)
    }

    /// Hand every item of the batch back to the producer: enqueue one "`released` = the last
    /// item" on the receiving stream, after the reads enqueued there, then publish the
    /// releases. Returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuStreamWriteValue64`, `cuStreamBatchMemOp` or `cuEventRecord`;
    /// [`Error::Corrupt`].
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        self.release_all()
    }

    fn release_all(&mut self) -> Result<()> {
        let first = self.first;
        let last = first + self.lens.len() as u64 - 1;
        let written = self.rx.end.signal(self.stream, last)?;
        let published = (first..=last).try_for_each(|k| written.ring().release(k));
        let recorded = written.record();
        published.and(recorded)
    }
}

impl<T: Pod> Drop for ReceivedBatch<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            // Drop cannot report; `release` does.
            let _ = self.release_all();
        }
    }
}

impl<T: Pod> std::fmt::Debug for ReceivedBatch<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceivedBatch")
            .field("first", &self.first)
            .field("lens", &self.lens)
            .finish_non_exhaustive()
    }
}
