//! [`IpcSender`] and [`IpcReceiver`]: a bounded, zero-copy queue of GPU buffers between two
//! processes, ordered on the GPU by stream memory operations (no host synchronisation).
//!
//! The protocol and what each side sees when the other dies are documented on [`IpcSender`];
//! the shared-memory half, with every kill point, in `channel/ring.rs`.
//!
//! # The way a call goes
//!
//! The files of the module, each named after what it holds: `sender.rs` ([`IpcSender`],
//! [`SendSlot`]), `receiver.rs` ([`IpcReceiver`], [`Received`]), `ring.rs` (the host protocol in
//! shared memory: owner words, `sent`/`released`, lengths; its loom model and replay tests in
//! `ring/`),
//! `endpoint.rs` (what an end holds: its view of the region, the slots, the two counters; the
//! GPU write of a counter), `inflight.rs` (the events that track the channel's GPU work),
//! `drain.rs` (taking an end apart: `close` waits, a drop defers), `batch.rs` (many items per
//! call), and for ends that wait on a descriptor: `listening.rs` ([`Listening`], the `async`
//! waits), `readiness.rs` (an end's descriptor: its bell and its peer's pidfd), `bell.rs` (the
//! sockets a ringing side tells).
//!
//! An item: `IpcSender::acquire` waits for the slot on the host (`ring.rs`) and enqueues the
//! GPU wait for its release (`signal.rs`); `SendSlot::send` enqueues the GPU write of `sent`
//! (`endpoint.rs`), publishes on the host (`ring.rs`), then records the tracking event
//! (`endpoint.rs`, `inflight.rs`: after the publish, off the consumer's path).
//! `IpcReceiver::recv` waits on the host (`ring.rs`) and enqueues the GPU wait for `sent`
//! (`signal.rs`); `Received::release` enqueues the GPU write of `released` (`endpoint.rs`),
//! publishes (`ring.rs`) and records. Each step goes down from `sender.rs` or `receiver.rs` to
//! one of those and back; none calls up: `Endpoint::signal` enqueues the GPU write and hands
//! back the write, on whose ring the caller publishes before it records it.
//!
//! Counted file by file, an item's send (`acquire` then `send`, once the ring has come round
//! so that the acquire waits for a release) passes 20 files: 6 that decide — `sender.rs`,
//! `ring.rs`, `endpoint.rs`, `signal.rs`, `inflight.rs`, and `process.rs` when a wait lasts
//! long enough to ask whether the consumer lives — and 14 leaves: the slots' address
//! (`buffer.rs`, `slice.rs`), the region (`shm.rs`), the futex (`sync.rs`, `os/linux.rs`), the
//! caller's stream (`stream.rs`), a context's `enter` (`context.rs`, `driver/ctx.rs`), the
//! stream operations and events (`driver/stream.rs`, `driver/event.rs`), the driver call's
//! plumbing (`driver/mod.rs`, `driver/sys.rs`, `driver/loader.rs`) and `error.rs`. An item's
//! receive and release pass the same 20, with `receiver.rs` for `sender.rs`.
//!
//! # A GPU channel between processes
//!
//! `IpcSender<T>` / `IpcReceiver<T>` are a bounded queue of GPU buffers between a producer and a
//! consumer process: one allocation of `slots × capacity` elements, two `IpcSignal` counters and
//! a small shared-memory region, opened through one `IpcChannelHandle<T>`. Each side orders its
//! GPU work after the other's with stream memory operations — the hosts wait only for each other's
//! *enqueueing* — so a consumer's kernels start when the producer's kernels are done, with no host
//! synchronisation per item. A full ring is back-pressure (`acquire` waits, `try_acquire` says
//! so); each item carries its length.
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{AsStream, GpuContext};
//! use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
//!
//! // `stream`: a cust or cudarc stream (with cuda-ipc's `cust` / `cudarc` feature), or a raw one.
//! fn producer(ctx: &GpuContext, stream: &impl AsStream) -> cuda_ipc::Result<IpcChannelHandle<f32>> {
//!     let mut tx = IpcSender::<f32>::new(ctx, 4, 1 << 20)?; // 4 slots of 1 Mi floats
//!     let handle = tx.handle(); // give this to the consumer (a ShmCell, a socket, ...)
//!     let slot = tx.acquire(stream, Duration::from_secs(5))?;
//!     // ... launch kernels on `stream` that write slot.as_raw_ptr() ...
//!     slot.send(1000)?; // 1000 elements; the consumer's GPU waits for the kernels above
//!     Ok(handle)
//! }
//!
//! fn consumer(ctx: &GpuContext, stream: &impl AsStream, handle: &IpcChannelHandle<f32>) -> cuda_ipc::Result<()> {
//!     let mut rx = IpcReceiver::<f32>::open(ctx, handle)?;
//!     let item = rx.recv(stream, Duration::from_secs(5))?;
//!     // ... launch kernels on `stream` that read item.len() floats at item.as_raw_ptr() ...
//!     item.release() // the producer may reuse the slot once those kernels are done
//! }
//! ```
//!
//! Every host wait has a deadline and checks the other side every 10 ms: a dead producer is
//! `PeerGone` (role `Exporter`), a dead consumer `PeerGone` (role `Importer`), a closed one
//! `ChannelClosed` (after everything sent was received). Neither side unmaps or frees anything
//! before the channel's operations on your streams are done — releasing streams parked on a dead
//! peer's counter — yet dropping either side never waits: `close(timeout)` waits (and reports,
//! handing the end back if it did not finish), a drop leaves what is still running on the GPU to a
//! later allocation, export, `collect_deferred()` or exit of the process. The consumer unlinks the
//! region's name on attach, so a `SIGKILL` on either side after that leaves nothing in `/dev/shm`;
//! the region of a producer killed before a consumer attached, or of a killed broadcast producer
//! (whose name stays for later consumers), is removed by the consumer whose open finds the
//! producer dead, by the next process that creates a channel, or by
//! [`shm::reclaim_stale_regions`](crate::shm::reclaim_stale_regions).
//! Items may go through different streams on either side (one producer to several consumers:
//! [Broadcast](#broadcast-one-producer-several-consumers) below): the channel keeps its counters
//! growing in item order on the GPU (a signal on a new stream first waits for the previous one).
//!
//! Each item costs a GPU wait and a GPU write on each side. Across two H200s that is at the
//! hardware's floor for large items (64 MiB stream at 97 % of a native peer copy), but between
//! two small copies every stream memory operation costs the copy engine a drain and a restart:
//! 1 MiB items stream at under half the native rate, as does a hand-written ring of raw stream
//! operations. `IpcSender::acquire_batch` and `IpcReceiver::recv_batch` take several consecutive
//! slots with one GPU wait and hand them on with one write; they mix with single items on either
//! side. Groups of 8 stream 1 MiB items at 0.86 of a native peer copy across two H200s (0.45–0.46
//! one at a time) and 0.76–0.84 on one (0.29–0.39); `BENCHMARKS.md` has the measurements.
//!
//! `cargo run --release --example pipeline` runs a producer on GPU 0 and a consumer on GPU 1 (or
//! the same GPU): 10,000 items of 1 MiB filled by a kernel and checksummed by a kernel on the
//! consumer's GPU. On two H200s: 66–68 GB/s, 15.5–15.9 µs per item, 31–33 µs per one-slot round
//! trip (p50); on one H200, 11.7–11.8 GB/s and 289–293 µs (two processes on one GPU are
//! time-sliced).
//! Measured against a hand-written ring of raw stream memory operations, native copies and
//! `torch.multiprocessing` in `BENCHMARKS.md`.
//!
//! # Waiting without a thread: descriptors, `WaitSet`, `async`
//!
//! `recv` and `acquire` park the calling thread. A program that serves many channels, or an
//! async program, makes its ends [`Listening`] instead: `rx.listening()?` (or
//! `tx.listening()?`) gives an end whose readiness is one file descriptor (`AsFd`). Its
//! `try_recv` / `try_acquire` that find nothing *arm* it, and the descriptor turns readable
//! when the other side sends, releases, closes or dies. Three ways to wait on it:
//!
//! - **Many ends in one thread:** a [`WaitSet`](crate::wait::WaitSet) of listening ends (and
//!   sockets, and deadlines) returns the keys of those ready.
//! - **`async`, any runtime** (feature `async`): `rx.recv_async(&stream).await` and
//!   `tx.acquire_async(&stream).await`, woken by one reactor thread per process: a thousand
//!   pending awaits cost that one thread and no CPU while idle. Both are cancel-safe: dropped
//!   before they return, they have taken nothing. Bound them with the runtime's timeout
//!   (`tokio::time::timeout`); the peer's death ends them with `PeerGone`.
//! - **Your own reactor:** register the descriptor (tokio's `AsyncFd`, smol's `Async`,
//!   `poll(2)`); on readable, call `try_recv` until `None` (which arms again).
//!
//! What each costs per hand-off (`BENCHMARKS.md`, one H200, a ping round trip): the blocking
//! `recv` 12.9 µs; a `WaitSet` of 64 channels 13.7 µs (the bell and the re-arm); `recv_async`
//! 12.9 µs — it and `acquire_async` first look again for 30 µs, cooperatively (the task
//! re-polls itself; other tasks run between its polls), as the blocking calls spin before they
//! sleep, so a hand-off that comes within that costs what the blocking one does. A longer wait
//! parks the task, and its wake crosses two threads (the crate's reactor thread, then the
//! runtime's): about 19 µs more. The listening end registered with the runtime's own reactor
//! (tokio's `AsyncFd` takes it: it is `AsRawFd`) and `try_recv` when it is readable costs
//! 25.3 µs: every hand-off a wake through `epoll`, with no spin.
//!
//! ```rust,no_run
//! # #[cfg(feature = "async")]
//! # async fn serve(ctx: &cuda_ipc::GpuContext, handle: &cuda_ipc::channel::IpcChannelHandle<f32>) -> cuda_ipc::Result<()> {
//! use cuda_ipc::RawStream;
//! use cuda_ipc::channel::IpcReceiver;
//!
//! let mut rx = IpcReceiver::<f32>::open(ctx, handle)?.listening()?;
//! loop {
//!     let item = rx.recv_async(&RawStream::LEGACY).await?; // the task waits, not a thread
//!     // ... launch kernels that read the item ...
//!     item.release()?;
//! }
//! # }
//! ```
//!
//! A listening end binds one socket in `/dev/shm` (`cuda-ipc-bell.<channel>.<end>`, removed
//! with the end) and holds three descriptors. The blocking calls are unchanged and keep
//! sleeping on the futex; a ring costs them one more branch. What each side sees when the other
//! stops between its ring and its tell is in `channel/ring.rs`.
//!
//! # Broadcast: one producer, several consumers
//!
//! `IpcSender::broadcast(&ctx, slots, capacity, consumers)` makes a channel whose every item
//! reaches every consumer attached when it is sent, for up to `consumers` of them at a time
//! (2 to 8). Each consumer opens the same handle with `IpcReceiver::open` and uses the channel as
//! above — `recv`, `try_recv`, `recv_batch`, `release` on its own streams — and the producer's
//! `acquire`, `try_acquire` and `acquire_batch` are unchanged:
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{AsStream, GpuContext};
//! use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
//!
//! fn producer(ctx: &GpuContext, stream: &impl AsStream) -> cuda_ipc::Result<()> {
//!     let mut tx = IpcSender::<f32>::broadcast(ctx, 4, 1 << 20, 3)?; // up to 3 consumers
//!     let handle: IpcChannelHandle<f32> = tx.handle(); // every consumer opens this one handle
//!     for _ in 0..100 {
//!         let slot = tx.acquire(stream, Duration::from_secs(5))?; // the slowest live consumer's pace
//!         // ... fill the slot on `stream` ...
//!         slot.send(1 << 20)?;
//!     }
//!     println!("attached now: {:?}", tx.consumers());
//!     tx.close(Duration::from_secs(5))?; // the consumers receive everything sent, then ChannelClosed
//!     Ok(())
//! }
//!
//! fn consumer(ctx: &GpuContext, stream: &impl AsStream, handle: &IpcChannelHandle<f32>) -> cuda_ipc::Result<()> {
//!     let mut rx = IpcReceiver::<f32>::open(ctx, handle)?; // starts at the next item sent
//!     loop {
//!         match rx.recv(stream, Duration::from_secs(5)) {
//!             Ok(item) => item.release()?, // after the kernels that read it, on `stream`
//!             Err(cuda_ipc::Error::ChannelClosed { .. }) => return Ok(()),
//!             Err(e) => return Err(e),
//!         }
//!     }
//! }
//! ```
//!
//! - **Attach and leave at any time.** A consumer that attaches late starts at the next item (it
//!   never sees a slot the producer is about to overwrite: the attach and the producer's publish
//!   are ordered by one read-modify-write each, checked by a loom model). A consumer that closes
//!   is no longer waited for; its entry is free for the next one.
//! - **A slot is written again only once every attached consumer released it**, on the GPU as on
//!   the host: the producer's stream waits for each attached consumer's release counter.
//!   Back-pressure is the slowest live consumer; an `acquire` that runs out of time is
//!   `Timeout` with `waiting_for` naming that consumer's pid.
//! - **A consumer that dies is detached** by the producer's next wait that it holds up (within the
//!   10 ms liveness check): its release counter is forced, the producer and the other consumers
//!   carry on, and `tx.consumers()` no longer lists it. A dead producer is `PeerGone` at every
//!   consumer, as for one consumer.
//! - The kill points (a consumer preempted or `SIGKILL`ed mid-attach, holding an item, after its
//!   release) are listed in `src/channel/ring.rs`'s docs, each with a replay test; a random-kill
//!   stress (`tests/broadcast_stress.rs`) checks with a shadow record that every surviving
//!   consumer receives every item from its start, in order, and that no slot is refilled under a
//!   reader.
//!
//! Cost, on one H200 (same run, `benches/broadcast.rs`): each added consumer costs the
//! producer's thread 0.9–1.4 µs per item (one look at its entry and one `cuStreamWaitValue64`)
//! and a ping round trip 5.1–5.9 µs (its process's GPU work). Streaming to N consumer processes
//! on one GPU is bounded by the GPU time-slicing those processes, not by the broadcast: at 2, 4
//! and 7 consumers it runs at 1.01–1.06× the rate of N one-consumer channels carrying the same
//! items. `BENCHMARKS.md` has the figures.

mod batch;
mod bell;
mod drain;
mod endpoint;
mod inflight;
mod listening;
mod readiness;
mod receiver;
pub(crate) mod ring;
mod sender;

use std::marker::PhantomData;
use std::time::Duration;

use bytemuck::{Pod, Zeroable};

use crate::buffer::IpcMemHandle;
use crate::buffer::{ImportedBuffer, Side};
use crate::context::GpuContext;
use crate::driver::sys;
use crate::envelope;
use crate::error::{ArgumentDefect, CloseError, Error, HandleDefect, Result, StateDefect};
use crate::handle::{Envelope, check_element, type_tag_of};
use crate::process::ProcessIdentity;
use crate::shm::{ShmOptions, ShmRegion};
use crate::signal::GpuSignal;
use crate::signal::IpcSignalHandle;
use crate::stream::AsStream;

pub use batch::{BatchItem, BatchSlot, ReceivedBatch, SendBatch};
use drain::Role;
use endpoint::Endpoint;
use inflight::InFlight;
pub use listening::Listening;
pub use receiver::{IpcReceiver, Received};
use ring::{Geometry, MAX_SLOTS, Ring, RingState};
pub use sender::{IpcSender, SendSlot};

/// The most bytes of header an item can carry ([`SendSlot::send_with_header`],
/// [`Received::header`]): 4,096.
pub const HEADER_BYTES: usize = ring::HEADER_BYTES;

/// "CICH" little-endian.
const MAGIC: u32 = u32::from_le_bytes(*b"CICH");
/// Channel handle layout version.
const VERSION: u16 = 1;
/// Consumer entries of a one-consumer channel ([`IpcSender::new`]); a broadcast channel has
/// up to `CONSUMER_ENTRIES` ([`IpcSender::broadcast`]).
const CONSUMERS: u32 = 1;
/// Bytes of a channel's shared-memory name kept in its handle.
const NAME_BYTES: usize = 64;
/// Slots start on this many bytes where the element size allows.
const SLOT_ALIGN: u64 = 256;

/// The handle's bytes.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
struct ChannelEnvelope {
    magic: u32,
    version: u16,
    flags: u16,
    elem_size: u32,
    elem_align: u32,
    type_tag: u64,
    slots: u32,
    consumers: u32,
    capacity: u64,
    stride: u64,
    producer_pid: u32,
    name_len: u32,
    producer_start: u64,
    boot_id: [u8; 16],
    name: [u8; NAME_BYTES],
    checksum: u64,
}

const _: () = assert!(std::mem::size_of::<ChannelEnvelope>() == 152);

envelope::sealed_format!(
    ChannelEnvelope,
    envelope::Format {
        magic: MAGIC,
        version: VERSION,
        versions: &[VERSION as u32],
        what: "a channel handle",
    },
    |raw| raw.flags == 0
);

impl ChannelEnvelope {
    fn seal(self) -> Self {
        envelope::seal(self)
    }

    /// Structural checks on bytes from another process; the region name and geometry.
    fn validate(&self) -> Result<(Geometry, u64, String)> {
        let bad = |defect| Err(Error::corrupt_handle(defect));
        let bad_layout = |detail: String| bad(HandleDefect::Layout { detail });
        envelope::check_identity(self)?;
        envelope::check_integrity(self)?;
        if self.consumers == 0 || self.consumers as usize > ring::CONSUMER_ENTRIES {
            return bad_layout(format!(
                "{} consumers (1 to {})",
                self.consumers,
                ring::CONSUMER_ENTRIES
            ));
        }
        if self.slots == 0 || self.slots as usize > MAX_SLOTS {
            return bad_layout(format!("{} slots (1 to {MAX_SLOTS})", self.slots));
        }
        if !self.elem_align.is_power_of_two() || !self.elem_size.is_multiple_of(self.elem_align) {
            return bad_layout(format!(
                "element size {} / alignment {} is not a valid layout",
                self.elem_size, self.elem_align
            ));
        }
        let geometry = Geometry {
            slots: u64::from(self.slots),
            capacity: self.capacity,
            consumers: u64::from(self.consumers),
        };
        match layout(geometry, u64::from(self.elem_size)) {
            Some(stride) if stride == self.stride => {}
            _ => {
                return bad_layout(format!(
                    "{} slots of {} elements (stride {}) of {} bytes is not a channel this \
                     build makes",
                    self.slots, self.capacity, self.stride, self.elem_size
                ));
            }
        }
        let name = self
            .name
            .get(..self.name_len as usize)
            .and_then(|n| std::str::from_utf8(n).ok())
            .filter(|n| n.starts_with(crate::shm::CHANNELS))
            .ok_or_else(|| {
                Error::corrupt_handle(HandleDefect::Names {
                    detail: "the channel's region name is not one this crate makes".into(),
                })
            })?;
        Ok((geometry, self.stride, name.to_owned()))
    }
}

impl ChannelEnvelope {
    /// The sealed envelope of a channel of `T`s: its geometry, its producer `me` and the name of
    /// its region.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a region name longer than a handle holds.
    fn describe<T>(
        geometry: Geometry,
        stride: u64,
        me: &ProcessIdentity,
        region: &str,
    ) -> Result<Self> {
        let name = region.as_bytes();
        if name.len() > NAME_BYTES {
            return Err(Error::InvalidName {
                name: region.into(),
                defect: crate::error::NameDefect::TooLong {
                    len: name.len(),
                    max: NAME_BYTES,
                },
            });
        }
        let mut name_bytes = [0u8; NAME_BYTES];
        name_bytes[..name.len()].copy_from_slice(name);
        Ok(Self {
            elem_size: std::mem::size_of::<T>() as u32,
            elem_align: std::mem::align_of::<T>() as u32,
            type_tag: type_tag_of::<T>(),
            slots: geometry.slots as u32,
            consumers: geometry.consumers as u32,
            capacity: geometry.capacity,
            stride,
            producer_pid: me.pid(),
            name_len: name.len() as u32,
            producer_start: me.start_time(),
            boot_id: crate::os::boot_id(),
            name: name_bytes,
            ..Zeroable::zeroed()
        }
        .seal())
    }
}

/// A channel region that does not hold what its handle describes: `field` differs.
fn ring_mismatch(field: &'static str) -> Error {
    Error::Corrupt {
        what: "IPC channel region",
        defect: StateDefect::Mismatch { field },
    }
}

impl RingState {
    /// Create a channel's region (its name random) for `geometry`, `stride` and `T`, naming
    /// the channel's memory and counters by their envelopes (the data, the send counter, one
    /// release counter per consumer), with `me` holding its producer record; returns the
    /// region and that record's word.
    fn create<T>(
        geometry: Geometry,
        stride: u64,
        me: &ProcessIdentity,
        envs: (Envelope, Envelope, &[Envelope]),
    ) -> Result<(ShmRegion<Self>, u64)> {
        let (data_env, sent_env, released_envs) = envs;
        let mut held = 0;
        // Before the first channel: the regions of producers that died without removing them
        // (killed before a consumer attached, or a broadcast producer, whose consumers leave
        // the name for later ones). Consumers still attached keep their mappings.
        crate::shm::reclaim_stale_once(crate::shm::CHANNELS);
        bell::sweep_once(); // and the bells of listeners killed since
        let ring = ShmOptions::new(crate::shm::CHANNELS)
            .random_suffix(true)
            .create_with(|s: &Self| {
                use crate::sync::Ordering::Relaxed;
                s.slots.store(geometry.slots, Relaxed);
                s.consumers.store(geometry.consumers, Relaxed);
                s.capacity.store(geometry.capacity, Relaxed);
                s.stride.store(stride, Relaxed);
                s.elem_size.store(std::mem::size_of::<T>() as u64, Relaxed);
                s.elem_align
                    .store(std::mem::align_of::<T>() as u64, Relaxed);
                s.type_tag.store(type_tag_of::<T>(), Relaxed);
                s.data.store(data_env);
                s.sent_signal.store(sent_env);
                for (entry, env) in s.consumer.iter().zip(released_envs) {
                    entry.released_signal.store(*env);
                }
                held = s.producer.claim_pausing(me, || {}).ok_or(Error::Corrupt {
                    what: "IPC channel region (just created)",
                    defect: StateDefect::Missing {
                        what: "a free producer owner record",
                    },
                })?;
                Ok(())
            })?;
        Ok((ring, held))
    }

    /// Refuse a region whose layout is not the one the handle describes: `geometry`, `stride`
    /// and the element's (size, alignment, type tag).
    fn check_layout(&self, geometry: Geometry, stride: u64, elem: (u32, u32, u64)) -> Result<()> {
        use crate::sync::Ordering::Relaxed;
        let (size, align, tag) = elem;
        let fields = [
            (self.slots.load(Relaxed), geometry.slots, "slot count"),
            (
                self.consumers.load(Relaxed),
                geometry.consumers,
                "consumer count",
            ),
            (self.capacity.load(Relaxed), geometry.capacity, "capacity"),
            (self.stride.load(Relaxed), stride, "stride"),
            (
                self.elem_size.load(Relaxed),
                u64::from(size),
                "element size",
            ),
            (
                self.elem_align.load(Relaxed),
                u64::from(align),
                "element alignment",
            ),
            (self.type_tag.load(Relaxed), tag, "type tag"),
        ];
        match fields.iter().find(|(a, b, _)| a != b) {
            Some((_, _, what)) => Err(ring_mismatch(what)),
            None => Ok(()),
        }
    }
}

/// Fuzzing hook: recompute the checksum of channel-handle bytes in place (so the fuzzer reaches
/// the checks behind it); other lengths are left alone.
#[cfg(fuzzing)]
#[doc(hidden)]
pub fn fuzz_reseal_channel(bytes: &mut [u8]) {
    envelope::reseal_bytes::<ChannelEnvelope>(bytes);
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The slot stride in elements for `geometry` with elements of `size` bytes: the capacity
/// rounded up so that each slot starts 256-byte aligned where the size allows; `None` if the
/// allocation would not fit, or a slot would hold more elements than an item's length word
/// counts (2^48 − 1).
fn layout(geometry: Geometry, size: u64) -> Option<u64> {
    if geometry.capacity == 0 || geometry.capacity > ring::MAX_CAPACITY || size == 0 {
        return None;
    }
    let unit = SLOT_ALIGN / gcd(SLOT_ALIGN, size);
    let stride = geometry.capacity.checked_next_multiple_of(unit)?;
    let bytes = stride.checked_mul(geometry.slots)?.checked_mul(size)?;
    (bytes <= isize::MAX as u64).then_some(stride)
}

/// What opens a channel: its region, its shape, its element type and its producer, in a
/// checksummed envelope of 152 bytes of plain data. Pass it like the crate's other handles
/// (a [`ShmCell`](crate::shm::ShmCell), or [`as_bytes`](Self::as_bytes) /
/// [`from_bytes`](Self::from_bytes) over any byte channel).
///
/// The GPU handles themselves are in the channel's region, which only the producer's uid can
/// open (mode `0600`).
#[repr(transparent)]
pub struct IpcChannelHandle<T> {
    env: ChannelEnvelope,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for IpcChannelHandle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for IpcChannelHandle<T> {}
impl<T> PartialEq for IpcChannelHandle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.env == other.env
    }
}
impl<T> Eq for IpcChannelHandle<T> {}

// SAFETY: repr(transparent) over `ChannelEnvelope` (Zeroable) and a zero-sized PhantomData.
unsafe impl<T: 'static> Zeroable for IpcChannelHandle<T> {}
// SAFETY: repr(transparent) over `ChannelEnvelope`, which is Pod (integers and byte arrays, no
// padding: size asserted); any bit pattern is a value (validated on open).
unsafe impl<T: 'static> Pod for IpcChannelHandle<T> {}

impl<T> IpcChannelHandle<T> {
    /// The envelope's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(&self.env)
    }

    /// Rebuild a handle from bytes received from another process, checking length, magic,
    /// version, checksum and shape (the element type and the producer are checked on open).
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let env: ChannelEnvelope = envelope::read(bytes)?;
        env.validate()?;
        Ok(Self {
            env,
            _elem: PhantomData,
        })
    }

    /// Slots in the ring.
    #[must_use]
    pub fn slots(&self) -> usize {
        self.env.slots as usize
    }

    /// Elements of `T` one slot holds.
    #[must_use]
    pub fn capacity(&self) -> usize {
        usize::try_from(self.env.capacity).unwrap_or(usize::MAX)
    }

    /// The producing process.
    #[must_use]
    pub fn producer(&self) -> ProcessIdentity {
        ProcessIdentity::from_parts(self.env.producer_pid, self.env.producer_start)
    }
}

/// What a consumer's admission found: the channel's shape, its region's name, its producer.
struct Admission {
    geometry: Geometry,
    stride: u64,
    name: String,
    producer: ProcessIdentity,
}

impl<T: Pod> IpcChannelHandle<T> {
    /// The admission a consumer's open passes in one step, before it opens the region or maps
    /// anything: the envelope's structure and checksum, the element type, the producer of this
    /// boot and not this process, and alive (as [`Handle`](crate::Handle)'s admission judges an
    /// exporter). The slots and counters the region names then open as buffers and signals do,
    /// each through its own admission.
    fn admit(&self) -> Result<Admission> {
        let env = &self.env;
        let (geometry, stride, name) = env.validate()?;
        check_element::<T>(env.elem_size, env.elem_align, env.type_tag)?;
        let producer = envelope::admit_exporter(self.producer(), &env.boot_id, false)?;
        crate::process::check_exporter_alive(&producer, false)?;
        Ok(Admission {
            geometry,
            stride,
            name,
            producer,
        })
    }
}

impl<T> IpcChannelHandle<T> {
    /// Remove the region this handle names if its creator is dead: a consumer that found the
    /// producer gone before it attached (nobody else would until the next process creates a
    /// channel). A name that is not a channel's, or a region whose creator lives, is left.
    fn reclaim_region(&self) {
        if let Ok((_, _, name)) = self.env.validate() {
            let _ = crate::shm::reclaim_stale(&name);
        }
    }
}

impl<T> std::fmt::Debug for IpcChannelHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcChannelHandle")
            .field("type", &std::any::type_name::<T>())
            .field("slots", &self.env.slots)
            .field("capacity", &self.env.capacity)
            .field("producer_pid", &self.env.producer_pid)
            .finish_non_exhaustive()
    }
}

/// Refuse a wait that is meant to be a poll or a timeout that cannot be represented.
fn wait_limit(timeout: Duration) -> Duration {
    timeout.min(Duration::from_secs(365 * 24 * 3600))
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;

/// Host-only ends of the channel protocol (no GPU): the random-kill stress test drives the
/// shared-memory ring through them, with the slots' contents in its own shared memory.
#[doc(hidden)]
#[allow(missing_debug_implementations)] // test hooks, not API
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __testing;
