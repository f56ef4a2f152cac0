//! [`IpcSender`] and [`IpcReceiver`]: a bounded, zero-copy queue of GPU buffers between two
//! processes, ordered on the GPU by stream memory operations (no host synchronisation).
//!
//! The protocol and what each side sees when the other dies are documented on [`IpcSender`];
//! the shared-memory half, with every kill point, in `channel/ring.rs`.
//!
//! # The way a call goes
//!
//! The files of the module, each named after what it holds: `ring.rs` (the host protocol in
//! shared memory: owner words, `sent`/`released`, lengths; loom model and replay tests),
//! `endpoint.rs` (what an end holds: its view of the region, the slots, the two counters; the
//! GPU write of a counter), `inflight.rs` (the events that track the channel's GPU work),
//! `drain.rs` (taking an end apart: `close` waits, a drop defers), `batch.rs` (many items per
//! call).
//!
//! An item: `IpcSender::acquire` waits for the slot on the host (`ring.rs`) and enqueues the
//! GPU wait for its release (`signal.rs`); `SendSlot::send` enqueues the GPU write of `sent`
//! (`endpoint.rs`), publishes on the host (`ring.rs`), then records the tracking event
//! (`endpoint.rs`, `inflight.rs`: after the publish, off the consumer's path).
//! `IpcReceiver::recv` waits on the host (`ring.rs`) and enqueues the GPU wait for `sent`
//! (`signal.rs`); `Received::release` enqueues the GPU write of `released` (`endpoint.rs`),
//! publishes (`ring.rs`) and records. Each step goes down from this file to one of those and
//! back; none calls up.
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
//! (whose name stays for later consumers), is removed by the next process that creates a channel.
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
mod drain;
mod endpoint;
mod inflight;
pub(crate) mod ring;

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
use endpoint::{Endpoint, Role};
use inflight::InFlight;
use ring::{Geometry, MAX_SLOTS, Ring, RingState};

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

/// The producing side of a GPU channel: owns the slots' memory, the `sent` and `released`
/// counters and the channel's region. Created with [`new`](Self::new); the consumer opens
/// [`handle`](Self::handle) with [`IpcReceiver::open`].
///
/// # How it works
///
/// The producer creates the channel: one device allocation of `slots × capacity` elements of `T`
/// (each slot 256-byte aligned where `T` allows), two [`IpcSignal`](crate::IpcSignal) counters on
/// its device (`sent`, written by the producer's streams; `released`, written by the consumer's),
/// and a small shared-memory region for what the hosts need (item lengths, how far each side got,
/// who the parties are). The consumer opens all of it through one [`IpcChannelHandle<T>`].
///
/// For item `k` (numbered from 1, in slot `(k − 1) mod slots`):
///
/// | producer | consumer |
/// | -------- | -------- |
/// | [`acquire`](IpcSender::acquire): wait on the host until the consumer has *enqueued* its release of item `k − slots`; enqueue "wait until `released ≥ k − slots`" on the stream | |
/// | write the slot with kernels or copies on that stream | |
/// | [`send`](SendSlot::send)`(len)`: enqueue "`sent = k`", publish `k` and `len` | [`recv`](IpcReceiver::recv): wait on the host until `k` is published; enqueue "wait until `sent ≥ k`" |
/// | | read the slot on that stream |
/// | | [`release`](Received::release): enqueue "`released = k`", publish it |
///
/// The hosts only ever wait for each other's *enqueueing*, which runs ahead of the GPUs; the
/// GPUs wait for each other's work. A full ring is back-pressure: `acquire` waits (or
/// [`try_acquire`](IpcSender::try_acquire) says so). The protocol, with each point where a
/// side can be killed and what the other then sees, is written down in the source, in
/// `src/channel/ring.rs`.
///
/// # Streams
///
/// Each item may go through a different stream, on either side. The counters still only grow
/// on the GPU in item order: a signal on a stream other than the previous signal's is
/// preceded (in the same `cuStreamBatchMemOp`) by a GPU wait for the previous value, so an
/// item sent on a fast stream never lets the consumer past an earlier item still being
/// written on a slow one, and a release on a fast stream never frees a slot still being read
/// on a slow one. Signals on the stream of the previous signal need no wait (streams are
/// compared by `cuStreamGetId`, which a new stream never shares with a destroyed one).
///
/// # Batches
///
/// Each item costs one GPU wait and one GPU write on each side; between small copies on a
/// stream, each of those costs the copy engine a drain and a restart (~5 µs on an H200), so
/// 1 MiB items stream at under half the native copy rate one at a time.
/// [`acquire_batch`](IpcSender::acquire_batch) → [`SendBatch`] and
/// [`recv_batch`](IpcReceiver::recv_batch) → [`ReceivedBatch`] take several consecutive slots
/// on one stream with one wait and hand them on with one write (the counters mean "items up to
/// k"): in groups of 8, 1 MiB items stream at 0.86 of a native peer copy across two H200s and
/// 0.76–0.84 of a native copy on one. The ring still moves one item at a time, so batches and
/// single items mix freely on either side. The price: a batch's GPU work starts once *every*
/// item of it is ready.
///
/// # When a side dies or closes
///
/// Every host wait has a deadline and checks the other side every 10 ms: a dead producer is
/// [`Error::PeerGone`] (the exporter), a dead consumer [`Error::PeerGone`] (an importer), a dropped
/// one [`Error::ChannelClosed`] (after the consumer received everything sent). Dropping either side
/// first waits (bounded, 5 s) for the channel's operations on the user's streams to complete —
/// releasing them with [`IpcSignal::signal_host`](crate::GpuSignal::signal_host) if the other side
/// is dead, so nothing stays blocked — and only then unmaps or frees the memory; if they do not
/// complete it leaks the memory rather than free it under pending GPU work. The consumer unlinks
/// the shared-memory name as soon as it attaches, and both sides' leases are reclaimed as for any
/// [`IpcBuffer`](crate::IpcBuffer) (dropping the sender while the consumer still maps the memory
/// defers its free until the consumer unmaps, as for an `IpcBuffer`), so nothing is left in
/// `/dev/shm` after either side is `SIGKILL`ed once the consumer has attached. A producer killed
/// before that — or a broadcast producer, whose region keeps its name for later consumers — leaves
/// its region until the next process that creates a channel removes the regions of dead producers
/// (once, before its first), or [`reclaim_stale`](crate::shm::reclaim_stale) does.
///
/// # Kill points
///
/// Producer, item `k`: (P1) wait until the slot is free; (P2) enqueue the GPU wait for the
/// consumer's release of `k − slots`; (P3) the user's writes; (P4) enqueue the GPU signal
/// `sent = k`; (P5) store the length; (P6) publish `sent = k`.
/// - Killed before P6: the consumer never sees item `k`. Its wait checks the producer every
///   10 ms and reports [`Error::PeerGone`] (the exporter).
/// - Killed after P6, before its GPU ran P3–P4: the consumer may receive item `k` and enqueue its
///   GPU wait, which then never passes; its next call reports `PeerGone` (exporter), and dropping
///   the receiver releases its streams (work on that item sees undefined contents).
/// - Closed (dropped): the owner word goes `Held → Left` after the last publish; a consumer
///   that finds `Left` re-reads `sent` and receives every item published before reporting
///   [`Error::ChannelClosed`].
///
/// Consumer, item `k`: (C1) wait until `sent ≥ k`; (C2) read and check the length; (C3)
/// enqueue the GPU wait `sent ≥ k`; (C4) the user's reads; (C5) enqueue the GPU signal
/// `released = k`; (C6) publish `released = k`.
/// - Killed mid-attach (`Claiming`), or before C6: the producer, waiting for the slot, checks
///   the consumer every 10 ms and reports [`Error::PeerGone`] (an importer).
/// - Killed after C6, before its GPU ran C5: the producer's GPU wait for that release never passes;
///   its next wait reports `PeerGone` (importer), and dropping the sender releases its streams.
/// - Closed: once its GPU operations have completed (bounded by the drop timeout; after a
///   drop, seen by a later collect or at exit), `Held → Left`; the producer's next acquire
///   reports `ChannelClosed`.
///
/// `IpcSender<T>` is `Send`, not `Sync`: one thread at a time drives it (move it between
/// threads; to share it, put it behind a lock).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::channel::{IpcChannelHandle, IpcSender};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = GpuContext::new(0)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// // 4 slots of up to 1 Mi floats each.
/// let mut tx = IpcSender::<f32>::new(&ctx, 4, 1 << 20)?;
/// let handle: IpcChannelHandle<f32> = tx.handle(); // give it to the consumer
/// for _ in 0..100 {
///     let slot = tx.acquire(&stream, Duration::from_secs(5))?;
///     // ... enqueue kernels on `stream` that write slot.as_raw_ptr() ...
///     slot.send(1 << 20)?; // ordered after those kernels, on the GPU
/// }
/// # let _ = handle;
/// # Ok(()) }
/// ```
#[doc(alias = "IpcChannel")]
pub struct IpcSender<T: Pod> {
    end: Endpoint<T>,
    /// The next item to send (from 1).
    next: u64,
    handle: IpcChannelHandle<T>,
}

/// A slot the producer holds, between [`IpcSender::acquire`] and [`send`](Self::send).
/// Dropping it without sending keeps the slot: the next `acquire` returns it again.
pub struct SendSlot<'a, T: Pod> {
    tx: &'a mut IpcSender<T>,
    stream: sys::CUstream,
    /// A GPU wait was enqueued on `stream` and not yet covered by a recorded event.
    waited: bool,
    _stream: PhantomData<&'a ()>,
}

impl<T: Pod> IpcSender<T> {
    /// Create a channel of `slots` slots (1 to 64) of `capacity` elements of `T` each, in `ctx`:
    /// the slots' memory (`cuMemAlloc`), the two counters
    /// ([`IpcSignal::new`](crate::IpcSignal::new)) and the shared-memory region, all exported for
    /// [`handle`](Self::handle).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or more than 64 slots, a zero capacity or a size that
    /// overflows; [`Error::Unsupported`] when the device cannot use 64-bit stream memory
    /// operations; [`Error::Cuda`] naming the failing allocation or export; a shared-memory
    /// error creating the region.
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn new(ctx: &GpuContext, slots: usize, capacity: usize) -> Result<Self> {
        Self::with_consumers("IpcSender::new", ctx, slots, capacity, CONSUMERS as usize)
    }

    /// A broadcast channel: every item reaches every consumer attached when it is sent, up to
    /// `consumers` of them at a time (2 to 8). Consumers attach with [`IpcReceiver::open`] at
    /// any time and start at the next item; a slot is written again only once every attached
    /// consumer released it; a consumer that closes is no longer waited for, and one that dies
    /// is detached by the producer's next wait that it holds up (its release counter forced, so
    /// that the producer's streams go on). With nobody attached, items are sent for nobody.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::InvalidArgument`] for fewer than 2 or more than 8
    /// consumers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::GpuContext;
    /// use cuda_ipc::channel::IpcSender;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let tx = IpcSender::<f32>::broadcast(&ctx, 4, 1 << 20, 3)?; // up to 3 consumers
    /// let handle = tx.handle(); // every consumer opens the same handle
    /// # let _ = handle;
    /// # Ok(()) }
    /// ```
    pub fn broadcast(
        ctx: &GpuContext,
        slots: usize,
        capacity: usize,
        consumers: usize,
    ) -> Result<Self> {
        let call = "IpcSender::broadcast";
        ArgumentDefect::check_range(
            call,
            "consumers",
            consumers as u64,
            2,
            ring::CONSUMER_ENTRIES as u64,
        )?;
        Self::with_consumers(call, ctx, slots, capacity, consumers)
    }

    fn with_consumers(
        call: &'static str,
        ctx: &GpuContext,
        slots: usize,
        capacity: usize,
        consumers: usize,
    ) -> Result<Self> {
        let invalid = |defect| Error::InvalidArgument { call, defect };
        ArgumentDefect::check_range(call, "slots", slots as u64, 1, MAX_SLOTS as u64)?;
        let geometry = Geometry {
            slots: slots as u64,
            capacity: capacity as u64,
            consumers: consumers as u64,
        };
        let size = std::mem::size_of::<T>() as u64;
        let too_big = || {
            invalid(ArgumentDefect::AllocationSize {
                len: geometry.slots.saturating_mul(geometry.capacity),
                elem_size: size,
            })
        };
        let stride = layout(geometry, size).ok_or_else(too_big)?;
        let total = usize::try_from(stride * geometry.slots).map_err(|_| too_big())?;
        let data = Side::Owner(crate::IpcBuffer::<T>::new(ctx, total)?);
        let sent = GpuSignal::new(ctx)?;
        let released = (0..consumers)
            .map(|_| GpuSignal::new(ctx))
            .collect::<Result<Vec<_>>>()?;
        let (data_env, sent_env) = (
            data.export_handle::<crate::IpcBuffer<T>>(call)?.env,
            sent.handle()?.env,
        );
        let released_envs = released
            .iter()
            .map(|r| r.handle().map(|h| h.env))
            .collect::<Result<Vec<_>>>()?;
        let me = ProcessIdentity::current();
        let (ring, held) =
            RingState::create::<T>(geometry, stride, &me, (data_env, sent_env, &released_envs))?;
        let env = ChannelEnvelope::describe::<T>(geometry, stride, &me, ring.name())?;
        Ok(Self {
            end: Endpoint::new(
                Role::Producer,
                ring,
                geometry,
                stride,
                held,
                0,
                (data, sent, released),
            ),
            next: 1,
            handle: IpcChannelHandle {
                env,
                _elem: PhantomData,
            },
        })
    }

    fn ring(&self) -> Ring<'_> {
        self.end.ring()
    }

    /// The handle a consumer opens with [`IpcReceiver::open`].
    pub fn handle(&self) -> IpcChannelHandle<T> {
        self.handle
    }

    /// Wait on the host (at most `timeout`) until the slot for the next item is free on the
    /// host side — the consumer has *enqueued* its release of the item that used it last —
    /// then enqueue on `stream` a wait for that release on the GPU, so work enqueued next on
    /// `stream` starts only after the consumer's GPU work on the slot is done.
    ///
    /// Write the slot with work on `stream` (or on streams `stream` waits for), then
    /// [`send`](SendSlot::send). The stream must belong to the channel's context.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the ring stays full; [`Error::ChannelClosed`] when the consumer
    /// dropped its receiver; [`Error::PeerGone`] (an importer) when it died; [`Error::Corrupt`]
    /// when the shared state is inconsistent; [`Error::Cuda`] naming `cuStreamWaitValue64`.
    #[doc(alias = "cuStreamWaitValue64")]
    pub fn acquire<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        timeout: Duration,
    ) -> Result<SendSlot<'a, T>> {
        self.end.check_open("IpcSender::acquire")?;
        self.acquire_host(self.next, timeout)?;
        self.take_slot(stream)
    }

    /// The host half of an acquire of item `k`: wait for the slot; in a broadcast channel,
    /// consumers found dead meanwhile are detached and their release counters forced.
    pub(crate) fn acquire_host(&mut self, k: u64, timeout: Duration) -> Result<()> {
        let mut detached = Vec::new();
        let got = self
            .ring()
            .acquire_detaching(k, wait_limit(timeout), |i| detached.push(i));
        self.end.force_detached(&detached);
        got
    }

    /// The consumers attached now (a one-consumer channel: its consumer, once attached).
    #[must_use]
    pub fn consumers(&self) -> Vec<ProcessIdentity> {
        self.ring()
            .attached()
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    }

    /// As [`acquire`](Self::acquire), without waiting: `Ok(None)` when the ring is full.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), without [`Error::Timeout`].
    pub fn try_acquire<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<Option<SendSlot<'a, T>>> {
        self.end.check_open("IpcSender::try_acquire")?;
        if !self.ring().try_acquire(self.next)? {
            if !self.end.geometry.is_broadcast() {
                return Ok(None);
            }
            // Full: a dead consumer may be what holds it (a poller never waits, so detach here).
            let mut detached = Vec::new();
            self.ring().reap_dead_consumers(|i| detached.push(i));
            self.end.force_detached(&detached);
            if detached.is_empty() || !self.ring().try_acquire(self.next)? {
                return Ok(None);
            }
        }
        self.take_slot(stream).map(Some)
    }

    fn take_slot<'a, S: AsStream + ?Sized>(&'a mut self, stream: &'a S) -> Result<SendSlot<'a, T>> {
        let k = self.next;
        let slots = self.end.geometry.slots;
        let waited = k > slots;
        if waited {
            // SAFETY: the counter stays mapped until this wait has completed: a `record` on
            // this stream follows (at `send`, or when the slot is dropped), and the sender's
            // teardown (close, or a collect after its drop) waits for every recorded event before it
            // frees the counter.
            unsafe { self.end.wait_released(stream.as_cu_stream(), k - slots)? };
        }
        Ok(SendSlot {
            stream: stream.as_cu_stream(),
            tx: self,
            waited,
            _stream: PhantomData,
        })
    }

    /// Slots in the ring.
    pub fn slots(&self) -> usize {
        self.end.geometry.slots as usize
    }

    /// Elements of `T` one slot holds.
    pub fn capacity(&self) -> usize {
        self.end.geometry.capacity as usize
    }

    /// Items sent so far.
    pub fn sent(&self) -> u64 {
        self.next - 1
    }

    /// The context the channel lives in (streams must belong to it).
    pub fn context(&self) -> &GpuContext {
        self.end.data.context()
    }

    /// The consumer, once one has attached (a one-consumer channel; for a broadcast channel
    /// the first entry's, whoever holds it: see [`consumers`](Self::consumers)).
    pub fn consumer(&self) -> Option<ProcessIdentity> {
        let (owner, id) = self.end.region.get().consumer[0].owner.load_identity();
        (owner.state != crate::owned_slot::OwnerState::Free).then_some(id)
    }

    /// After a drop, how long the channel's GPU operations are waited for (by later collects)
    /// before the memory is leaked rather than freed under them (default 5 s). Dropping never
    /// waits: the sender is closed at once, and its memory freed once its GPU operations are
    /// done and the consumer unmapped it (at a later allocation or export of this process,
    /// [`collect_deferred`](crate::collect_deferred), or exit). [`close`](Self::close) takes
    /// its own timeout.
    pub fn set_drop_timeout(&mut self, timeout: Duration) {
        self.end.drain_timeout = timeout;
    }

    /// Close the channel: the consumer receives what was sent, then [`Error::ChannelClosed`].
    /// Waits up to `timeout` for the channel's GPU operations, then, in what is left of it,
    /// for every consumer to unmap the memory and counters, frees them, and reports what drop
    /// would hide. Nothing is freed or leaked while the wait goes on: a close that does not
    /// finish hands the sender back, closing (it sends nothing more), for another `close` or a
    /// drop (which never waits: see [`set_drop_timeout`](Self::set_drop_timeout)).
    ///
    /// # Errors
    ///
    /// In a [`CloseError`] holding the sender: [`Error::Timeout`] when the channel's GPU
    /// operations did not complete in time; [`Error::LeasesOutstanding`] when a consumer kept
    /// the memory or a counter mapped; [`Error::Cuda`] from the frees.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::GpuContext;
    /// use cuda_ipc::channel::IpcSender;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let tx = IpcSender::<f32>::new(&ctx, 4, 1024)?;
    /// // ... send items ...
    /// if let Err(e) = tx.close(Duration::from_secs(1)) {
    ///     eprintln!("{}; trying once more", e.error());
    ///     e.into_inner().close(Duration::from_secs(10))?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn close(self, timeout: Duration) -> std::result::Result<(), CloseError<Self>> {
        let mut tx = self;
        match tx.end.close_within(timeout) {
            Ok(()) => Ok(()), // what is left goes with the drop, at once
            Err(error) => Err(CloseError::new(error, tx)),
        }
    }
}

impl<T: Pod> std::fmt::Debug for IpcSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcSender")
            .field("type", &std::any::type_name::<T>())
            .field("slots", &self.end.geometry.slots)
            .field("capacity", &self.end.geometry.capacity)
            .field("sent", &self.sent())
            .finish_non_exhaustive()
    }
}

impl<T: Pod> SendSlot<'_, T> {
    /// The slot's device address (`capacity()` elements of `T`, aligned for `T`), for kernels
    /// and copies enqueued on the acquiring stream.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.tx.end.slot_ptr(self.tx.next)
    }

    /// Elements of `T` the slot can hold.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.tx.end.geometry.capacity as usize
    }

    /// The slot's index in the ring.
    #[must_use]
    pub fn index(&self) -> usize {
        self.tx.end.geometry.slot_of(self.tx.next)
    }

    /// The number of the item this slot will carry (items count from 1).
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.tx.next
    }

    /// Send the first `len` elements of the slot: enqueue "`sent` = this item" on the
    /// acquiring stream (`cuStreamWriteValue64`, after the stream's earlier work and a memory
    /// fence), then tell the consumer. Returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `len` exceeds the capacity (the slot is kept: send
    /// again); [`Error::Cuda`] naming `cuStreamWriteValue64`; [`Error::Corrupt`] when the
    /// shared state is inconsistent. An error means the item was not published (send again,
    /// or drop the slot); once published, `send` returns `Ok` — a tracking event that could
    /// not be recorded after that is reported by the sender's `close`.
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn send(self, len: usize) -> Result<()> {
        self.send_with_header(len, &[])
    }

    /// As [`send`](Self::send), with up to [`HEADER_BYTES`] bytes the consumer reads on the
    /// host ([`Received::header`]): what the item holds (a bucket's tensor names, shapes and
    /// offsets; a frame's sequence and format), so no second channel is needed. The bytes are
    /// copied into the channel's shared memory before the item is published, and copied out
    /// by the consumer when it receives it; the slot's GPU memory is not touched.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send); [`Error::InvalidArgument`] also when `header` is longer than
    /// [`HEADER_BYTES`] (checked first: nothing is enqueued, the slot is kept).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn main() -> cuda_ipc::Result<()> {
    /// # let ctx = cuda_ipc::GpuContext::new(0)?;
    /// # let stream = cuda_ipc::RawStream::LEGACY;
    /// let mut tx = cuda_ipc::channel::IpcSender::<u8>::new(&ctx, 4, 1 << 20)?;
    /// let slot = tx.acquire(&stream, Duration::from_secs(5))?;
    /// // ... enqueue the writes of 4,096 bytes at slot.as_raw_ptr() on `stream` ...
    /// slot.send_with_header(4096, b"frame 17, rgba8 32x32")?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn send_with_header(mut self, len: usize, header: &[u8]) -> Result<()> {
        self.tx.end.geometry.check_item_len("SendSlot::send", len)?;
        Geometry::check_header("SendSlot::send_with_header", header)?;
        let k = self.tx.next;
        let done = self.tx.end.signal(self.stream, k, |ring| {
            ring.publish_from(k, 1, [(len as u64, header)])
        })?;
        self.waited = false;
        done.published?;
        self.tx.next += 1;
        // Published: the item is the consumer's now. A tracking event that could not be
        // recorded made the sender untracked (its `close` reports it; its drop leaks the slots
        // rather than free them under GPU work); returning it here would tell the caller to
        // send again an item already delivered.
        drop(done.recorded);
        Ok(())
    }
}

impl<T: Pod> Drop for SendSlot<'_, T> {
    fn drop(&mut self) {
        if self.waited {
            // Not sent: the slot stays with the producer; cover the GPU wait we enqueued (a
            // failure marks the sender untracked, so its drop leaks rather than frees).
            let stream = self.stream;
            let _ = self.tx.end.record(stream);
        }
    }
}

impl<T: Pod> std::fmt::Debug for SendSlot<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendSlot")
            .field("seq", &self.seq())
            .field("index", &self.index())
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

/// The consuming side of a GPU channel, opened from the producer's [`IpcChannelHandle`].
///
/// `IpcReceiver<T>` is `Send`, not `Sync`: one thread at a time drives it (move it between
/// threads; to share it, put it behind a lock).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let handle: IpcChannelHandle<f32> = bytemuck::Zeroable::zeroed();
/// let ctx = GpuContext::new(1)?;
/// // Any `AsStream`: a cust or cudarc stream (with their features), or a raw `CUstream`.
/// let stream = cuda_ipc::RawStream::LEGACY;
/// let mut rx = IpcReceiver::<f32>::open(&ctx, &handle)?;
/// loop {
///     let item = match rx.recv(&stream, Duration::from_secs(5)) {
///         Ok(item) => item,
///         Err(cuda_ipc::Error::ChannelClosed { .. }) => break, // everything received
///         Err(e) => return Err(e.into()),
///     };
///     // ... enqueue kernels on `stream` that read item.len() floats at item.as_raw_ptr() ...
///     item.release()?; // the producer may reuse the slot once those kernels are done
/// }
/// # Ok(()) }
/// ```
pub struct IpcReceiver<T: Pod> {
    end: Endpoint<T>,
    /// Items received so far (the next is `received + 1`).
    received: u64,
}

/// An item the consumer holds, between [`IpcReceiver::recv`] and [`release`](Self::release).
/// Dropping it releases it on the receiving stream, as `release` does.
pub struct Received<'a, T: Pod> {
    rx: &'a mut IpcReceiver<T>,
    stream: sys::CUstream,
    len: usize,
    header: Vec<u8>,
    done: bool,
    _stream: PhantomData<&'a ()>,
}

impl<T: Pod> IpcReceiver<T> {
    /// Open a channel created by another process, in `ctx`, and attach as its consumer. The handle,
    /// the region and every GPU handle in it are validated; then the slots' memory and the counters
    /// are mapped (as [`ImportedBuffer::open`](crate::ImportedBuffer::open) and
    /// [`ImportedSignal::open`](crate::ImportedSignal::open): by peer access when the producer's
    /// device is another), and the region's name is unlinked.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for a malformed handle; [`Error::TypeMismatch`] for another element
    /// type; [`Error::SameProcess`]; [`Error::PeerGone`] (the exporter) when the producer is gone;
    /// [`Error::NotFound`] when the region no longer exists (the producer closed, or a consumer
    /// attached and unlinked it); [`Error::Corrupt`] when the region does not match the handle;
    /// [`Error::ChannelInUse`] when another consumer attached first; the errors of
    /// [`ImportedBuffer::open`](crate::ImportedBuffer::open) and
    /// [`ImportedSignal::open`](crate::ImportedSignal::open).
    #[doc(alias = "cuIpcOpenMemHandle")]
    pub fn open(ctx: &GpuContext, handle: &IpcChannelHandle<T>) -> Result<Self> {
        let Admission {
            geometry,
            stride,
            name,
            producer,
        } = handle.admit()?;
        let env = &handle.env;
        let (size, align, tag) = (env.elem_size, env.elem_align, env.type_tag);
        let me = ProcessIdentity::current();
        let ring = ShmOptions::new(name).open::<RingState>()?;
        let s = ring.get();
        if !ring.creator().is_same_process(&producer) {
            return Err(ring_mismatch("creator"));
        }
        s.check_layout(geometry, stride, (size, align, tag))?;
        let by_producer = |pid: u32, what: &'static str| {
            if pid == producer.pid() {
                Ok(())
            } else {
                Err(ring_mismatch(what))
            }
        };
        let data_env = s.data.load();
        by_producer(data_env.exporter_pid, "memory's exporter")?;
        let data = Side::Importer(ImportedBuffer::<T>::open_handle(
            ctx,
            &IpcMemHandle::<T>::from_envelope(data_env),
            None,
        )?);
        if data.len() as u64 != stride * geometry.slots {
            return Err(Error::LengthMismatch {
                expected: (stride * geometry.slots) as usize,
                found: data.len() as u64,
            });
        }
        let sent_env = s.sent_signal.load();
        by_producer(sent_env.exporter_pid, "send counter's exporter")?;
        let sent = GpuSignal::open(ctx, &IpcSignalHandle::from_envelope(sent_env))?;
        let open_counter = |index: usize| {
            let env = s.consumer[index].released_signal.load();
            by_producer(env.exporter_pid, "release counter's exporter")?;
            GpuSignal::open(ctx, &IpcSignalHandle::from_envelope(env))
        };
        let (entry, held, received, released) = if geometry.is_broadcast() {
            // Any free entry; its counter opened before the claim, set to where we start
            // while the entry still reads `Claiming` (see `Ring::attach_any_with`). The name
            // stays: other consumers attach later (the producer's drop removes it).
            let (attached, released) =
                Ring::new(s, geometry).attach_any_with(&me, open_counter, |counter, start| {
                    if start == 0 {
                        Ok(()) // a new counter reads 0 already
                    } else {
                        counter.signal_host(start)
                    }
                })?;
            (attached.index, attached.held, attached.start, released)
        } else {
            let released = open_counter(0)?;
            let held = Ring::new(s, geometry).attach(&me, || {})?;
            // Attached: nobody else needs the name, and a name left behind would outlive a
            // kill.
            let _ = ring.unlink_shared();
            (0, held, 0, released)
        };
        Ok(Self {
            end: Endpoint::new(
                Role::Consumer,
                ring,
                geometry,
                stride,
                held,
                entry,
                (data, sent, vec![released]),
            ),
            received,
        })
    }

    fn ring(&self) -> Ring<'_> {
        self.end.ring()
    }

    /// Wait on the host (at most `timeout`) until the producer has sent the next item, then
    /// enqueue on `stream` a wait for the producer's GPU writes of it
    /// (`cuStreamWaitValue64`): work enqueued next on `stream` sees the item. Returns a view
    /// of the item; [`release`](Received::release) it when its work is enqueued.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::ChannelClosed`] once the producer dropped its sender and
    /// every item it sent was received; [`Error::PeerGone`] (the exporter) when it died;
    /// [`Error::Corrupt`] when the shared state is inconsistent (e.g. a length above the
    /// capacity); [`Error::Cuda`] naming `cuStreamWaitValue64`.
    #[doc(alias = "cuStreamWaitValue64")]
    pub fn recv<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        timeout: Duration,
    ) -> Result<Received<'a, T>> {
        self.end.check_open("IpcReceiver::recv")?;
        let len = self.ring().recv(self.received, wait_limit(timeout))?;
        self.take_item(stream, len)
    }

    /// As [`recv`](Self::recv), without waiting: `Ok(None)` when no item is there yet.
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv), without [`Error::Timeout`].
    pub fn try_recv<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
    ) -> Result<Option<Received<'a, T>>> {
        self.end.check_open("IpcReceiver::try_recv")?;
        match self.ring().try_recv(self.received)? {
            Some(len) => self.take_item(stream, len).map(Some),
            None => Ok(None),
        }
    }

    fn take_item<'a, S: AsStream + ?Sized>(
        &'a mut self,
        stream: &'a S,
        len: u64,
    ) -> Result<Received<'a, T>> {
        let k = self.received + 1;
        let header = self.ring().header(k)?;
        // SAFETY: the counter stays mapped until this wait has completed: the item's release
        // (explicit or in its drop) records an event on this stream after it, and the
        // receiver's teardown (close, or a collect after its drop) waits for recorded events
        // before unmapping.
        unsafe { self.end.sent.wait(stream, k)? };
        self.received = k;
        Ok(Received {
            stream: stream.as_cu_stream(),
            rx: self,
            // ≤ capacity (checked by the ring), which fits in usize (the allocation does).
            len: len as usize,
            header,
            done: false,
            _stream: PhantomData,
        })
    }

    /// Slots in the ring.
    pub fn slots(&self) -> usize {
        self.end.geometry.slots as usize
    }

    /// Elements of `T` one slot holds.
    pub fn capacity(&self) -> usize {
        self.end.geometry.capacity as usize
    }

    /// Items received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The context the channel is mapped in (streams must belong to it).
    pub fn context(&self) -> &GpuContext {
        self.end.data.context()
    }

    /// The producing process.
    pub fn producer(&self) -> Option<ProcessIdentity> {
        self.end.data.exporter()
    }

    /// After a drop, how long the channel's GPU operations are waited for (by later collects)
    /// before the mappings are leaked rather than unmapped under them (default 5 s). Dropping
    /// never waits: the receiver closes (and unmaps) once its GPU operations are done — at once
    /// if they are, else at a later allocation or export of this process,
    /// [`collect_deferred`](crate::collect_deferred), or exit. [`close`](Self::close) takes its
    /// own timeout.
    pub fn set_drop_timeout(&mut self, timeout: Duration) {
        self.end.drain_timeout = timeout;
    }

    /// Enqueue "`released` = item `k`" on `stream`, publish it, record it (after the publish:
    /// off the producer's path).
    fn release_item(&mut self, stream: sys::CUstream, k: u64) -> Result<()> {
        let done = self.end.signal(stream, k, |ring| ring.release(k))?;
        done.published?;
        done.recorded
    }

    /// Close the receiver: the producer's next acquire reports [`Error::ChannelClosed`] (a
    /// broadcast producer stops waiting for this consumer). Waits up to `timeout` for the
    /// channel's GPU operations on this side, closes the receiver in the channel, unmaps, and
    /// reports what drop would hide. A close that does not finish hands the receiver back,
    /// closing (it receives nothing more), for another `close` or a drop.
    ///
    /// # Errors
    ///
    /// In a [`CloseError`] holding the receiver: [`Error::Timeout`] when the channel's GPU
    /// operations did not complete in time.
    pub fn close(self, timeout: Duration) -> std::result::Result<(), CloseError<Self>> {
        let mut rx = self;
        match rx.end.close_within(timeout) {
            Ok(()) => Ok(()),
            Err(error) => Err(CloseError::new(error, rx)),
        }
    }
}

impl<T: Pod> std::fmt::Debug for IpcReceiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcReceiver")
            .field("type", &std::any::type_name::<T>())
            .field("slots", &self.end.geometry.slots)
            .field("capacity", &self.end.geometry.capacity)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl<T: Pod> Received<'_, T> {
    /// The item's device address (`len()` elements of `T`), for kernels and copies enqueued
    /// on the receiving stream.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.rx.end.slot_ptr(self.rx.received)
    }

    /// Elements of `T` the producer sent in this item.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the item is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The header the producer sent with the item ([`SendSlot::send_with_header`]; empty
    /// after a plain [`send`](SendSlot::send)): a copy taken when the item was received, at
    /// most [`HEADER_BYTES`] bytes. Bytes from the other process: parse them as untrusted.
    #[must_use]
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// The slot's index in the ring.
    #[must_use]
    pub fn index(&self) -> usize {
        self.rx.end.geometry.slot_of(self.rx.received)
    }

    /// The item's number (items count from 1).
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.rx.received
    }

    /// Copy the item to the host: enqueue the copy on the receiving stream
    /// (`cuMemcpyDtoHAsync`, so it comes after the producer's writes) and wait for it, at most
    /// `timeout`, checking every 10 ms that the producer is alive (a producer killed before
    /// its GPU wrote the item leaves the stream blocked).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::PeerGone`] (the exporter) when the producer died with the item
    /// unwritten; [`Error::Cuda`] naming the failed call. On these errors the copy may still
    /// be pending, so its host buffer is leaked rather than freed under it.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn to_vec(&self, timeout: Duration) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        if self.len == 0 {
            return Ok(out);
        }
        let data = &self.rx.end.data;
        let _g = data.context().enter()?;
        // SAFETY: `out` holds `len` elements, the item's range is inside the mapping, and the
        // stream is live (borrowed by the item); `out` is returned only once the copy is done
        // and leaked otherwise (below).
        unsafe {
            crate::driver::mem::copy_dtoh_async(
                out.as_mut_ptr().cast(),
                self.as_raw_ptr(),
                std::mem::size_of_val(out.as_slice()),
                self.stream,
            )
        }?;
        let mut done = InFlight::new(data.context());
        let producer = data.exporter();
        let gone = std::cell::Cell::new(None);
        let finished = done.record(self.stream).is_ok()
            && done.drain(
                wait_limit(timeout),
                || {
                    if let Some(p) = producer.filter(|p| !p.is_alive()) {
                        gone.set(Some(p.pid()));
                    }
                },
                || gone.get().is_some(),
            );
        if finished {
            return Ok(out);
        }
        // The copy may still be queued: its destination must outlive it.
        std::mem::forget(out);
        Err(match gone.get() {
            Some(pid) => Error::exporter_gone(pid),
            None => Error::Timeout {
                what: "copy of a received IPC channel item to the host",
                waited: timeout,
                waiting_for: None,
            },
        })
    }

    /// Hand the slot back once the work enqueued on the receiving stream so far is done:
    /// enqueue "`released` = this item" there (`cuStreamWriteValue64`), then tell the
    /// producer. Returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuStreamWriteValue64` or `cuEventRecord`; [`Error::Corrupt`].
    #[doc(alias = "cuStreamWriteValue64")]
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        let (stream, k) = (self.stream, self.rx.received);
        self.rx.release_item(stream, k)
    }
}

impl<T: Pod> Drop for Received<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            let (stream, k) = (self.stream, self.rx.received);
            // Drop cannot report; `release` does.
            let _ = self.rx.release_item(stream, k);
        }
    }
}

impl<T: Pod> std::fmt::Debug for Received<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("seq", &self.seq())
            .field("index", &self.index())
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Host-only ends of the channel protocol (no GPU): the random-kill stress test drives the
/// shared-memory ring through them, with the slots' contents in its own shared memory.
#[doc(hidden)]
#[allow(missing_debug_implementations)] // test hooks, not API
#[cfg(any(test, fuzzing, feature = "__testing"))]
pub mod __testing;
