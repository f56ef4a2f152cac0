//! The channel's shared-memory protocol: who may write which slot, which item the consumer may
//! read next, and how each side learns that the other closed or died. The GPU half (stream
//! waits and writes on the two [`IpcSignal`](crate::IpcSignal) counters) rides on top of it in
//! [`crate::channel`]; this module is host-only, so the loom model, the replay tests and the
//! random-kill stress test check it without a GPU.
//!
//! # State
//!
//! Items are numbered from 1. Item `k` lives in slot `(k − 1) mod slots`.
//!
//! - `sent`: the number of items the producer has published. Only the producer writes it, one
//!   step at a time, *after* the item's length (and its header's byte count, in the top 16
//!   bits) is stored in `lens[slot]`, its header's bytes (up to [`HEADER_BYTES`]) in
//!   `headers[slot]`, and the item's GPU signal is enqueued (release store, then a futex wake
//!   if the consumer sleeps).
//! - `consumer[0].released`: the number of items the consumer has handed back. Only that
//!   consumer writes it, after its GPU release signal is enqueued.
//! - Owner words ([`OwnedSlot`]): the producer (claimed at creation) and each consumer entry
//!   (claimed at attach), each naming its process and its state in **one** atomic word:
//!   `Held` while working, `Left` once closed for good.
//!
//! Item `k` may be written when every attached consumer has released `k − slots`; it may be
//! read when `sent ≥ k`. So `released ≤ received ≤ sent ≤ released + slots` always holds for
//! honest peers, and anything else read from the region is reported as
//! [`Error::Corrupt`] (a peer cannot make this side index out of bounds or read a slot twice).
//!
//! # When the other side stops
//!
//! Producer, item `k`: (P1) wait until the slot is free; (P2) enqueue the GPU wait for the
//! consumer's release of `k − slots`; (P3) the user's writes; (P4) enqueue the GPU signal
//! `sent = k`; (P5) store the length; (P6) publish `sent = k`.
//! - Killed before P6: the consumer never sees item `k`. Its wait checks the producer every
//!   10 ms and reports [`Error::PeerGone`] (the exporter).
//! - Killed after P6, before its GPU ran P3–P4: the consumer may receive item `k` and enqueue its
//!   GPU wait, which then never passes; its next call reports `PeerGone` (exporter), and dropping
//!   the receiver releases its streams (work on that item sees undefined contents).
//! - Closed (dropped): the owner word goes `Held → Left` after the last publish; a consumer
//!   that finds `Left` re-reads `sent` and receives every item published before reporting
//!   [`Error::ChannelClosed`].
//!
//! Consumer, item `k`: (C1) wait until `sent ≥ k`; (C2) read and check the length; (C3)
//! enqueue the GPU wait `sent ≥ k`; (C4) the user's reads; (C5) enqueue the GPU signal
//! `released = k`; (C6) publish `released = k`.
//! - Killed mid-attach (`Claiming`), or before C6: the producer, waiting for the slot, checks
//!   the consumer every 10 ms and reports [`Error::PeerGone`] (an importer).
//! - Killed after C6, before its GPU ran C5: the producer's GPU wait for that release never passes;
//!   its next wait reports `PeerGone` (importer), and dropping the sender releases its streams.
//! - Closed: once its GPU operations have completed (bounded by the drop timeout), `Held →
//!   Left`; the producer's next acquire reports `ChannelClosed`. Closing only after the GPU
//!   work matters: a producer that finds the consumer gone forces the release counter at its
//!   own teardown, which must not free slots the consumer's GPU is still reading.
//!
//! Ends that wait on a descriptor instead of the futex (*listeners*) arm the doorbells:
//! `ring/arm.rs`, with what each side sees when the other stops mid-step.
//!
//! With one consumer nothing here is ever reaped: the channel has one producer and one
//! consumer for its whole life, so a dead or departed party ends the channel, and no slot can
//! be re-claimed by a process that might be mid-claim.
//!
//! # Broadcast (`consumers > 1`)
//!
//! The layout holds [`CONSUMER_ENTRIES`] consumer entries, each with its owner word, its
//! `released` count, its doorbell and the envelope of its own GPU release counter; the handle
//! says how many are in use. With more than one, consumers attach and leave while the producer
//! runs:
//!
//! - **Attach** ([`Ring::attach_any_with`]): the first entry that is `Free` or `Left` is claimed
//!   (`→ Claiming(me)`, a compare-exchange against the exact word seen); still `Claiming`, the
//!   consumer reads `sent` with a read-modify-write and sets `released = sent`: it starts at
//!   the next item. Then `Held`.
//! - **Write** (producer, item `k`): every `Held` entry must have released `k − slots`; a
//!   `Claiming` one blocks (it is choosing where it starts); `Free` and `Left` ones are not
//!   waited for. With nobody attached, items are written and published for nobody.
//! - **Leave** (consumer): `Held → Left` once its GPU work is done, as with one consumer; the
//!   producer stops waiting for it, and the entry can be attached again.
//! - **Reap** (only the producer, from its liveness check while it waits): a `Claiming` entry
//!   of a dead process is freed; a `Held` one is moved to `Left` and reported, so that the
//!   producer's GPU half forces that consumer's release counter to `sent` (its streams' waits
//!   on the dead consumer then pass). Each is a compare-exchange against the exact word judged.
//!
//! Why a late consumer never reads an overwritten slot: the producer overwrites item `j`'s
//! slot only when writing `j + slots`, after checking the entries, which follows its publish
//! of `j + slots − 1`, a read-modify-write of `sent` like the attacher's read. Of the two, the
//! later in `sent`'s modification order reads from the earlier: either the producer's check
//! sees the claim (and waits for its releases), or the attacher reads `sent ≥ j` and starts
//! after item `j`. Acquire and release on the read-modify-writes suffice, which loom checks
//! exactly (`loom_tests`).
//!
//! | The other side is preempted or `SIGKILL`ed... | This side sees |
//! |------------------------------------------------|----------------|
//! | a consumer, inside its attach (`Claiming`) | the producer waits (bounded by its liveness check: a dead claimer's entry is freed) |
//! | a consumer, attached, holding or releasing items | the producer waits for its releases until it is found dead, then detaches it; the other consumers see nothing |
//! | a consumer, after its host release, before its GPU release ran | the producer's GPU waits on it stall until the host finds it dead (at the latest when the ring comes round to its unreleased slot), then its counter is forced |
//! | the producer, at any point | every consumer: as with one consumer (`PeerGone`, or `ChannelClosed` after the last item) |

use std::time::{Duration, Instant};

use super::bell;
use crate::error::{ArgumentDefect, Error, PeerRole, Result, StateDefect};
use crate::handle::Envelope;
use crate::owned_slot::{OwnedSlot, OwnerState};
use crate::process::ProcessIdentity;
use crate::shm::ShmRegion;
use crate::shm_safe::{ShmCell, ShmSafe};
use crate::sync::{AtomicU64, Ordering};

/// The most slots a channel can have.
pub(crate) const MAX_SLOTS: usize = 64;
/// The most header bytes an item can carry ([`crate::channel::SendSlot::send_with_header`]):
/// 4 KiB in each of the [`MAX_SLOTS`] slots' entries, whatever the ring's slot count (256 KiB
/// of shared memory per channel). Under loom, one word (the model checks the ordering, not
/// the size).
#[cfg(not(cuda_ipc_loom))]
pub(crate) const HEADER_BYTES: usize = 4096;
#[cfg(cuda_ipc_loom)]
pub(crate) const HEADER_BYTES: usize = 8;
const HEADER_WORDS: usize = HEADER_BYTES / 8;
/// A `lens` word: the item's elements in the low [`LEN_BITS`] bits, its header's bytes above.
pub(crate) const LEN_BITS: u32 = 48;
/// The most elements a slot can hold (what [`LEN_BITS`] can count).
pub(crate) const MAX_CAPACITY: u64 = (1 << LEN_BITS) - 1;
/// Consumer entries in the layout (one used today; the rest keep the format for broadcast).
pub(crate) const CONSUMER_ENTRIES: usize = 8;
/// How often a waiting side checks that the other side is alive.
pub(crate) const LIVENESS_CHECK: Duration = Duration::from_millis(10);
/// How long a waiter spins before it sleeps on the futex (an `async` wait: before it parks its
/// task on the descriptor).
pub(crate) const SPIN: Duration = Duration::from_micros(30);

/// One consumer's entry: who it is, how far it has released, and its GPU release counter.
#[repr(C)]
pub(crate) struct ConsumerEntry {
    pub(crate) owner: OwnedSlot,
    released: AtomicU64,
    released_bell: Doorbell,
    _pad: [AtomicU64; 4],
    /// The envelope of this consumer's GPU release counter (an `IpcSignal` handle).
    pub(crate) released_signal: ShmCell<Envelope>,
}

/// One slot's item header bytes, as little-endian words (their count is in `lens`).
#[repr(C)]
pub(crate) struct ItemHeader {
    words: [AtomicU64; HEADER_WORDS],
}

/// The channel's region. Fields above `producer` are written once, before the region is
/// published, and are cross-checked against the handle on open.
#[repr(C)]
pub(crate) struct RingState {
    pub(crate) slots: AtomicU64,
    pub(crate) consumers: AtomicU64,
    pub(crate) capacity: AtomicU64,
    pub(crate) stride: AtomicU64,
    pub(crate) elem_size: AtomicU64,
    pub(crate) elem_align: AtomicU64,
    pub(crate) type_tag: AtomicU64,
    _pad0: AtomicU64,
    pub(crate) producer: OwnedSlot,
    _pad1: [AtomicU64; 6],
    sent: AtomicU64,
    sent_bell: Doorbell,
    _pad2: [AtomicU64; 6],
    pub(crate) consumer: [ConsumerEntry; CONSUMER_ENTRIES],
    lens: [AtomicU64; MAX_SLOTS],
    /// The envelope of the slots' memory (an `IpcBuffer<T>` handle).
    pub(crate) data: ShmCell<Envelope>,
    /// The envelope of the producer's GPU send counter (an `IpcSignal` handle).
    pub(crate) sent_signal: ShmCell<Envelope>,
    /// Each slot's item header.
    headers: [ItemHeader; MAX_SLOTS],
}

// SAFETY: repr(C); every field is an integer atomic, an `OwnedSlot` (two AtomicU64), a
// `Doorbell` (two AtomicU32), an `ItemHeader` (AtomicU64s) or a `ShmCell` of plain data, each valid for any bits and
// accessed only atomically. Under `--cfg cuda_ipc_loom` (model checks only, never mapped) the atomics
// are loom's.
unsafe impl ShmSafe for RingState {
    fn type_tag() -> u64 {
        u64::from_le_bytes(*b"chanrg03")
    }
}

impl RingState {
    /// A zeroed state on the heap (the model checks and unit tests; a region starts zeroed).
    #[cfg(test)]
    pub(crate) fn boxed() -> Box<Self> {
        use bytemuck::Zeroable;
        let u64s = || AtomicU64::new(0);
        Box::new(Self {
            slots: u64s(),
            consumers: u64s(),
            capacity: u64s(),
            stride: u64s(),
            elem_size: u64s(),
            elem_align: u64s(),
            type_tag: u64s(),
            _pad0: u64s(),
            producer: OwnedSlot::new(),
            _pad1: std::array::from_fn(|_| u64s()),
            sent: u64s(),
            sent_bell: Doorbell::new(),
            _pad2: std::array::from_fn(|_| u64s()),
            consumer: std::array::from_fn(|_| ConsumerEntry {
                owner: OwnedSlot::new(),
                released: u64s(),
                released_bell: Doorbell::new(),
                _pad: std::array::from_fn(|_| u64s()),
                released_signal: ShmCell::new(Envelope::zeroed()),
            }),
            lens: std::array::from_fn(|_| u64s()),
            data: ShmCell::new(Envelope::zeroed()),
            sent_signal: ShmCell::new(Envelope::zeroed()),
            headers: std::array::from_fn(|_| ItemHeader {
                words: std::array::from_fn(|_| u64s()),
            }),
        })
    }
}

/// The shape of a channel, validated once and then kept locally (never re-read from the
/// region, which a peer can scribble on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Slots in the ring, `1..=MAX_SLOTS`.
    pub(crate) slots: u64,
    /// Elements a slot can hold.
    pub(crate) capacity: u64,
    /// Consumer entries in use, `1..=CONSUMER_ENTRIES`: 1 is a channel with one consumer for
    /// its whole life; more is a broadcast channel, whose consumers attach and leave (see
    /// the module docs).
    pub(crate) consumers: u64,
}

impl Geometry {
    /// Whether consumers attach and leave (more than one entry in use).
    pub(crate) fn is_broadcast(&self) -> bool {
        self.consumers > 1
    }

    /// The entries in use.
    fn entries(&self) -> std::ops::Range<usize> {
        // At most CONSUMER_ENTRIES (validated with the handle), so the cast is exact.
        0..(self.consumers as usize).min(CONSUMER_ENTRIES)
    }

    /// The slot item `k` (from 1) lives in.
    pub(crate) fn slot_of(&self, k: u64) -> usize {
        // `slots` ≤ MAX_SLOTS, so the remainder fits.
        ((k - 1) % self.slots) as usize
    }

    /// Check, for `call` (a send), that an item of `len` elements fits a slot.
    pub(crate) fn check_item_len(&self, call: &'static str, len: usize) -> Result<()> {
        let what = "item elements (up to the slot capacity)";
        ArgumentDefect::check_range(call, what, len as u64, 0, self.capacity)
    }

    /// An item header's byte count, checked against [`HEADER_BYTES`].
    pub(crate) fn check_header(call: &'static str, header: &[u8]) -> Result<()> {
        let what = "item header bytes (up to 4,096)";
        ArgumentDefect::check_range(call, what, header.len() as u64, 0, HEADER_BYTES as u64)
    }
}

/// Store `header`'s bytes (at most [`HEADER_BYTES`], checked by the caller) in `h`.
fn write_header(h: &ItemHeader, header: &[u8]) {
    for (word, chunk) in h.words.iter().zip(header.chunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
    }
}

/// Whether a process is alive, for the protocol (threads stand in for processes under loom).
#[cfg(not(cuda_ipc_loom))]
fn alive(id: &ProcessIdentity) -> bool {
    crate::process::is_alive_cached(id)
}
#[cfg(cuda_ipc_loom)]
fn alive(id: &ProcessIdentity) -> bool {
    id.pid() < crate::barrier::loom_support::DEAD_FROM
}

/// What a one-consumer channel's acquire that timed out waited for, when no consumer had
/// attached: a consumer that died before attaching cannot be told from one still on its way.
const NOBODY_ATTACHED: &str = "IPC channel acquire (no consumer has attached: one that died \
     before opening the channel cannot be told from one that has yet to)";

/// `e` with the process it waited for named, if `e` is a time-out.
fn waiting_for(e: Error, pid: Option<u32>) -> Error {
    match e {
        Error::Timeout { what, waited, .. } => Error::Timeout {
            what,
            waited,
            waiting_for: pid,
        },
        other => other,
    }
}

fn corrupt(defect: StateDefect) -> Error {
    Error::Corrupt {
        what: "IPC channel state",
        defect,
    }
}

/// A word of the channel state, `field`, found at `value`, above the most it may be.
fn over(field: &'static str, value: u64, max: u64) -> Error {
    corrupt(StateDefect::OutOfRange {
        field,
        value,
        min: 0,
        max,
    })
}

/// The protocol over one channel state, as seen by one side. `geometry` is the validated local
/// copy.
pub(crate) struct Ring<'a> {
    pub(crate) state: &'a RingState,
    pub(crate) geometry: Geometry,
    /// The consumer entry this side is (a consumer's own; 0 for the producer, which reads
    /// every entry).
    index: usize,
    /// The channel's region name, whose bells the side that rings tells (`channel/bell.rs`);
    /// `None` where nobody listens (the loom models).
    bells: Option<&'a str>,
}

/// A consumer that attached to a broadcast channel: its entry, its owner word, and the items
/// it starts after (it receives `start + 1` first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attached {
    pub(crate) index: usize,
    pub(crate) held: u64,
    pub(crate) start: u64,
}

/// What a wait ends with when its condition is not met yet.
enum Step<T> {
    Ready(T),
    NotYet,
}

impl<'a> Ring<'a> {
    /// The protocol on the channel region `region`, telling its listeners' bells when it
    /// rings (every ring must: a ring takes the armed bits, and a bit taken untold is a
    /// listener never woken).
    pub(crate) fn of(region: &'a ShmRegion<RingState>, geometry: Geometry) -> Self {
        Self {
            state: region.get(),
            geometry,
            index: 0,
            bells: Some(region.name()),
        }
    }

    /// The protocol on `state` with no bells: for the loom models and unit tests, where
    /// nobody listens, and the replay of a ringer killed between its ring and its tells
    /// (`channel::__testing`).
    #[cfg(any(test, cuda_ipc_test_hooks))]
    pub(crate) fn new(state: &'a RingState, geometry: Geometry) -> Self {
        Self {
            state,
            geometry,
            index: 0,
            bells: None,
        }
    }

    /// Ring the doorbell of items sent, and tell the consumers it found listening.
    fn ring_sent(&self) {
        let told = self.state.sent_bell.ring();
        if let Some(channel) = self.bells {
            bell::tell_consumers(channel, told);
        }
    }

    /// Ring entry `i`'s doorbell of items released, and tell the producer if it listened.
    fn ring_released(&self, i: usize) {
        let told = self.state.consumer[i].released_bell.ring();
        if let Some(channel) = self.bells {
            bell::tell_producer(channel, told);
        }
    }

    /// The protocol as consumer entry `index` sees it (a broadcast consumer's own entry).
    pub(crate) fn at_entry(mut self, index: usize) -> Self {
        self.index = index.min(CONSUMER_ENTRIES - 1);
        self
    }

    fn entry(&self) -> &'a ConsumerEntry {
        &self.state.consumer[self.index]
    }

    /// Wait for `poll` to be ready: spin, then sleep on `bell` (at most [`LIVENESS_CHECK`] at
    /// a time), calling `peer` at least every [`LIVENESS_CHECK`] while waiting, at most
    /// `timeout` in all. `peer` returning an error ends the wait with it; `poll` is called
    /// once more after `peer` fails, so a failure is only reported on a re-read state.
    fn wait<T>(
        &self,
        bell: &'a Doorbell,
        timeout: Duration,
        what: &'static str,
        poll: impl FnMut() -> Result<Step<T>>,
        peer: impl FnMut() -> Result<()>,
    ) -> Result<T> {
        self.wait_on(|| bell, timeout, what, poll, peer)
    }

    /// [`wait`](Self::wait), sleeping on the bell `bell` names at each turn (read before the
    /// poll; a poll that changes the answer turns again without sleeping).
    fn wait_on<T>(
        &self,
        bell: impl Fn() -> &'a Doorbell,
        timeout: Duration,
        what: &'static str,
        poll: impl FnMut() -> Result<Step<T>>,
        peer: impl FnMut() -> Result<()>,
    ) -> Result<T> {
        let waiting = crate::trace::Waiting::start(what);
        waiting.end(self.wait_on_untraced(bell, timeout, what, poll, peer))
    }

    /// [`wait_on`](Self::wait_on) without its trace.
    fn wait_on_untraced<T>(
        &self,
        bell: impl Fn() -> &'a Doorbell,
        timeout: Duration,
        what: &'static str,
        mut poll: impl FnMut() -> Result<Step<T>>,
        mut peer: impl FnMut() -> Result<()>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut next_check = start + LIVENESS_CHECK;
        loop {
            let bell_now = bell();
            let ticket = bell_now.ticket();
            if let Step::Ready(v) = poll()? {
                return Ok(v);
            }
            if !std::ptr::eq(bell(), bell_now) {
                continue; // another entry blocks now: sleep on its bell
            }
            // Under the model checker every step must be deterministic: the peer is checked at
            // every turn and the waiter yields, with no clock in any decision.
            let now = Instant::now();
            if cfg!(cuda_ipc_loom) || now >= next_check {
                if let Err(e) = peer() {
                    return match poll()? {
                        Step::Ready(v) => Ok(v),
                        Step::NotYet => Err(e),
                    };
                }
                next_check = now + LIVENESS_CHECK;
            }
            if cfg!(cuda_ipc_loom) {
                crate::sync::yield_now();
                continue;
            }
            let waited = now - start;
            if waited >= timeout {
                return Err(Error::Timeout {
                    what,
                    waited,
                    waiting_for: None,
                });
            }
            if waited < SPIN {
                crate::sync::spin_hint();
            } else {
                let nap = (timeout - waited).min(next_check.saturating_duration_since(now));
                bell_now.sleep(ticket, nap.max(Duration::from_micros(1)));
            }
        }
    }

    // ---- producer side ----

    /// Producer: whether item `k` may be written now: every consumer that may read the slot's
    /// current item has released it. One consumer: entry 0, attached or not (it receives from
    /// item 1 whenever it attaches). Broadcast: every `Held` entry; a `Claiming` one blocks
    /// until it is `Held` (it is choosing where it starts) or reaped; `Free` and `Left` ones
    /// read nothing. Also returns the entry that blocks, to sleep on its bell.
    fn slot_free(&self, k: u64) -> Result<(bool, usize)> {
        let sent = self.state.sent.load(Ordering::Relaxed);
        if !self.geometry.is_broadcast() {
            return self.released_allows(0, k, sent).map(|free| (free, 0));
        }
        for i in self.geometry.entries() {
            match self.state.consumer[i].owner.load().state {
                OwnerState::Free | OwnerState::Left => {}
                OwnerState::Claiming => return Ok((false, i)),
                OwnerState::Held => {
                    if !self.released_allows(i, k, sent)? {
                        return Ok((false, i));
                    }
                }
            }
        }
        Ok((true, 0))
    }

    /// Whether entry `i` has released far enough for item `k` to be written.
    fn released_allows(&self, i: usize, k: u64, sent: u64) -> Result<bool> {
        let released = self.state.consumer[i].released.load(Ordering::Acquire);
        // Both words are the peer's to scribble: bound `released` by `sent`, and add without
        // wrapping (`released = sent = u64::MAX` must read as corrupt, not as a full ring).
        let room = released.checked_add(self.geometry.slots);
        match room {
            Some(room) if released <= sent => Ok(room >= k),
            _ => Err(over(
                "items released",
                released,
                sent.min(u64::MAX - self.geometry.slots),
            )),
        }
    }

    /// Producer: fail if the consumer closed or died (an unattached consumer is fine). A
    /// broadcast channel has no such failure: consumers come and go (see
    /// [`reap_dead_consumers`](Self::reap_dead_consumers)).
    pub(crate) fn consumer_status(&self) -> Result<()> {
        if self.geometry.is_broadcast() {
            return Ok(());
        }
        let (owner, id) = self.entry().owner.load_identity();
        match owner.state {
            OwnerState::Free => Ok(()),
            OwnerState::Left => Err(Error::ChannelClosed {
                pid: owner.pid,
                role: "consumer",
            }),
            OwnerState::Claiming | OwnerState::Held if alive(&id) => Ok(()),
            OwnerState::Claiming | OwnerState::Held => Err(Error::peer_gone(
                owner.pid,
                PeerRole::Importer("IPC channel (as its consumer)"),
            )),
        }
    }

    /// Producer of a broadcast channel: detach every consumer proven dead. One killed
    /// mid-attach (`Claiming`) is freed; one attached (`Held`) is moved to `Left` and its entry
    /// passed to `detached` — the producer's GPU half then forces that consumer's release
    /// counter to what was sent, so that its streams' waits on the dead consumer pass. Each
    /// change is a compare-exchange against the exact word judged (a dead process's word does
    /// not come back), and only the producer reaps, so no live claimer loses its entry.
    pub(crate) fn reap_dead_consumers(&self, mut detached: impl FnMut(usize)) {
        for i in self.geometry.entries() {
            let slot = &self.state.consumer[i].owner;
            let (owner, id) = slot.load_identity();
            match owner.state {
                OwnerState::Claiming if !alive(&id) => {
                    slot.reap(owner.word);
                }
                OwnerState::Held
                    if !alive(&id) && slot.transition(owner.word, OwnerState::Left) =>
                {
                    detached(i);
                }
                _ => {}
            }
        }
    }

    /// Producer: the consumers attached now (`Held`), by entry.
    pub(crate) fn attached(&self) -> Vec<(usize, ProcessIdentity)> {
        self.geometry
            .entries()
            .filter_map(|i| {
                let (owner, id) = self.state.consumer[i].owner.load_identity();
                (owner.state == OwnerState::Held).then_some((i, id))
            })
            .collect()
    }

    /// Producer: whether item `k` may be written now, without waiting (`Ok(false)`: full).
    /// A closed consumer is an error even with room left (nobody will read the item); a
    /// broadcast channel writes with no consumer attached (late consumers start after it).
    pub(crate) fn try_acquire(&self, k: u64) -> Result<bool> {
        if !self.geometry.is_broadcast() && self.entry().owner.load().state == OwnerState::Left {
            return self.consumer_status().map(|()| false);
        }
        self.slot_free(k).map(|(free, _)| free)
    }

    /// Producer: wait until item `k` may be written, at most `timeout` (the tests' shorthand
    /// for [`acquire_detaching`](Self::acquire_detaching)).
    #[cfg(test)]
    pub(crate) fn acquire(&self, k: u64, timeout: Duration) -> Result<()> {
        self.acquire_detaching(k, timeout, |_| {})
    }

    /// Producer: wait until item `k` may be written, at most `timeout`; in a broadcast
    /// channel, consumers found dead while waiting are detached
    /// ([`reap_dead_consumers`](Self::reap_dead_consumers), each passed to `detached`) and the
    /// wait goes on without them. A time-out names the consumer that held the slot.
    pub(crate) fn acquire_detaching(
        &self,
        k: u64,
        timeout: Duration,
        mut detached: impl FnMut(usize),
    ) -> Result<()> {
        let blocking = std::cell::Cell::new(0);
        let broadcast = self.geometry.is_broadcast();
        let got = self.wait_on(
            || &self.state.consumer[blocking.get()].released_bell,
            timeout,
            "IPC channel acquire (waiting for the consumer to release a slot)",
            || {
                if !broadcast && self.entry().owner.load().state == OwnerState::Left {
                    self.consumer_status()?;
                }
                let (free, at) = self.slot_free(k)?;
                blocking.set(at);
                Ok(if free { Step::Ready(()) } else { Step::NotYet })
            },
            || {
                if broadcast {
                    self.reap_dead_consumers(&mut detached);
                }
                self.consumer_status()
            },
        );
        // A time-out names the consumer that held the slot, if one holds it still; with one
        // consumer that never attached, it says so (nothing can tell one not yet attached from
        // one that died before it did: the caller's own hand-off of the handle can).
        got.map_err(|e| match e {
            Error::Timeout { waited, .. }
                if !broadcast && self.entry().owner.load().state == OwnerState::Free =>
            {
                Error::Timeout {
                    what: NOBODY_ATTACHED,
                    waited,
                    waiting_for: None,
                }
            }
            e => waiting_for(e, self.holder(blocking.get())),
        })
    }

    /// The pid of entry `i`'s consumer while it is attached or attaching.
    fn holder(&self, i: usize) -> Option<u32> {
        self.consumer_identity(i).map(|id| id.pid())
    }

    /// Entry `i`'s consumer while it is attached or attaching.
    pub(crate) fn consumer_identity(&self, i: usize) -> Option<ProcessIdentity> {
        let (owner, id) = self.state.consumer.get(i)?.owner.load_identity();
        matches!(owner.state, OwnerState::Claiming | OwnerState::Held).then_some(id)
    }

    /// Producer: publish item `k` of `len` elements with no header (its GPU signal already
    /// enqueued): the unit tests' and the loom models' short form.
    #[cfg(test)]
    pub(crate) fn publish(&self, k: u64, len: u64) -> Result<()> {
        self.publish_from(k, 1, [(len, &[][..])])
    }

    /// Producer: publish items `first..first + count` (each its length and header) in one step —
    /// the counter and every header's size checked before anything is written, then the
    /// lengths and headers, then one store of `sent` — so that an error always means "nothing
    /// of this call was published" (a caller must know whether to send again).
    pub(crate) fn publish_from<'h>(
        &self,
        first: u64,
        count: u64,
        items: impl IntoIterator<Item = (u64, &'h [u8])> + Clone,
    ) -> Result<()> {
        let sent = self.state.sent.load(Ordering::Relaxed);
        let expected = first.saturating_sub(1);
        if sent != expected || count == 0 {
            return Err(corrupt(StateDefect::Counter {
                field: "items sent",
                found: sent,
                expected,
            }));
        }
        for (_, header) in items.clone() {
            Geometry::check_header("IPC channel send", header)?;
        }
        for (k, (len, header)) in (first..first + count).zip(items) {
            let slot = self.geometry.slot_of(k);
            // len ≤ capacity ≤ MAX_CAPACITY (the geometry's bound), header ≤ HEADER_BYTES.
            let word = len | (header.len() as u64) << LEN_BITS;
            self.state.lens[slot].store(word, Ordering::Relaxed);
            if !header.is_empty() {
                write_header(&self.state.headers[slot], header);
            }
        }
        // A read-modify-write, as a broadcast attach's read of `sent` is: of the two, the
        // later in `sent`'s modification order reads from the earlier, so either the attacher
        // starts after this item, or this producer's next check sees the attacher's claim
        // (see `attach_any`).
        self.state.sent.swap(first + count - 1, Ordering::AcqRel);
        self.ring_sent();
        Ok(())
    }

    /// Producer: no more items (`Held → Left`), then wake a sleeping consumer.
    pub(crate) fn close_producer(&self, held: u64) {
        self.state.producer.transition(held, OwnerState::Left);
        self.ring_sent();
    }

    // ---- consumer side ----

    /// Consumer: whether the producer died (as opposed to running or closed).
    pub(crate) fn producer_dead(&self) -> bool {
        self.producer_identity().is_some_and(|id| !alive(&id))
    }

    /// The producer while it has not closed.
    pub(crate) fn producer_identity(&self) -> Option<ProcessIdentity> {
        let (owner, id) = self.state.producer.load_identity();
        matches!(owner.state, OwnerState::Claiming | OwnerState::Held).then_some(id)
    }

    /// Consumer: fail if the producer is gone and no item after `received` is left.
    pub(crate) fn producer_status(&self, received: u64) -> Result<()> {
        let (owner, id) = self.state.producer.load_identity();
        let err = match owner.state {
            OwnerState::Left => Error::ChannelClosed {
                pid: owner.pid,
                role: "producer",
            },
            OwnerState::Free => {
                return Err(corrupt(StateDefect::Missing {
                    what: "the producer's owner record",
                }));
            }
            OwnerState::Claiming | OwnerState::Held if alive(&id) => return Ok(()),
            OwnerState::Claiming | OwnerState::Held => {
                return Err(Error::exporter_gone(owner.pid));
            }
        };
        // Closed: items published before the close are still delivered.
        if self.state.sent.load(Ordering::Acquire) > received {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Consumer: the length of item `received + 1` if it was published, checked.
    pub(crate) fn try_recv(&self, received: u64) -> Result<Option<u64>> {
        let sent = self.state.sent.load(Ordering::Acquire);
        if sent <= received {
            if self.state.producer.load().state == OwnerState::Left {
                // Re-read inside: an item published just before the close is still received.
                return self.producer_status(received).map(|()| None);
            }
            return Ok(None);
        }
        let k = received + 1;
        // `released` is ours to write but the producer's to scribble: it must not exceed what
        // we received (our own record), so `sent - released` cannot wrap.
        let released = self.entry().released.load(Ordering::Relaxed);
        if released > received {
            return Err(over("items released", released, received));
        }
        let outstanding = sent - released; // sent > received >= released
        if outstanding > self.geometry.slots {
            return Err(over(
                "items sent and not released",
                outstanding,
                self.geometry.slots,
            ));
        }
        let (len, _) = self.item_word(k)?;
        if len > self.geometry.capacity {
            return Err(over("item elements", len, self.geometry.capacity));
        }
        Ok(Some(len))
    }

    /// Consumer: a copy of item `k`'s header, once [`try_recv`](Self::try_recv) or
    /// [`recv`](Self::recv) returned `k`'s length (whose acquire of `sent` made it visible).
    pub(crate) fn header(&self, k: u64) -> Result<Vec<u8>> {
        let h = &self.state.headers[self.geometry.slot_of(k)];
        let (_, len) = self.item_word(k)?; // re-read: a peer may have changed it
        let len = len as usize; // ≤ HEADER_BYTES
        let mut out = Vec::with_capacity(len);
        for word in h.words.iter().take(len.div_ceil(8)) {
            let bytes = word.load(Ordering::Relaxed).to_le_bytes();
            let take = (len - out.len()).min(8);
            out.extend_from_slice(&bytes[..take]);
        }
        Ok(out)
    }

    /// Item `k`'s `lens` word: (elements, header bytes), the header's count checked against
    /// [`HEADER_BYTES`] (the elements are the caller's to check: only a receive knows the
    /// capacity matters).
    fn item_word(&self, k: u64) -> Result<(u64, u64)> {
        let word = self.state.lens[self.geometry.slot_of(k)].load(Ordering::Relaxed);
        let (len, header) = (word & MAX_CAPACITY, word >> LEN_BITS);
        if header > HEADER_BYTES as u64 {
            return Err(over("item header bytes", header, HEADER_BYTES as u64));
        }
        Ok((len, header))
    }

    /// Consumer: wait for item `received + 1`, at most `timeout`; its length.
    pub(crate) fn recv(&self, received: u64, timeout: Duration) -> Result<u64> {
        self.wait(
            &self.state.sent_bell,
            timeout,
            "IPC channel receive (waiting for the producer to send)",
            || {
                Ok(match self.try_recv(received)? {
                    Some(len) => Step::Ready(len),
                    None => Step::NotYet,
                })
            },
            || self.producer_status(received),
        )
        .map_err(|e| {
            let producer = self.state.producer.load();
            let live = matches!(producer.state, OwnerState::Claiming | OwnerState::Held);
            waiting_for(e, live.then_some(producer.pid))
        })
    }

    /// Consumer: hand item `k` back (its GPU release signal already enqueued).
    pub(crate) fn release(&self, k: u64) -> Result<()> {
        let e = self.entry();
        let released = e.released.load(Ordering::Relaxed);
        if released != k - 1 {
            return Err(corrupt(StateDefect::Counter {
                field: "items released",
                found: released,
                expected: k - 1,
            }));
        }
        e.released.store(k, Ordering::Release);
        self.ring_released(self.index);
        Ok(())
    }

    /// Consumer: attach as consumer 0 (`Free → Claiming → Held` in the owner word), calling
    /// `pause` while the word reads `Claiming` (the stress test stalls or dies there).
    pub(crate) fn attach(&self, me: &ProcessIdentity, pause: impl FnOnce()) -> Result<u64> {
        let entry = self.entry();
        // Rung once the entry reads `Claiming`: a producer listening for this entry's releases
        // (it blocks on a free entry once the ring is full) learns that a consumer is there,
        // and watches it from then on — else a consumer killed before its first release
        // would never wake it.
        let claiming = || {
            self.ring_released(self.index);
            pause();
        };
        if let Some(held) = entry.owner.claim_pausing(me, claiming) {
            return Ok(held);
        }
        let owner = entry.owner.load();
        Err(Error::ChannelInUse { pid: owner.pid })
    }

    /// [`attach_any_with`](Self::attach_any_with) with no GPU counter, calling `pause` while
    /// the entry reads `Claiming` (the replay tests, the loom model and the stress test stall or
    /// die there).
    #[cfg(any(test, cuda_ipc_loom, fuzzing, cuda_ipc_test_hooks))]
    pub(crate) fn attach_any(
        &self,
        me: &ProcessIdentity,
        pause: impl FnOnce(),
    ) -> Result<Attached> {
        let mut pause = Some(pause);
        let (attached, ()) = self.attach_any_with(
            me,
            |_| Ok(()),
            |(), _| {
                if let Some(pause) = pause.take() {
                    pause();
                }
                Ok(())
            },
        )?;
        Ok(attached)
    }

    /// Consumer of a broadcast channel: attach to the first entry that is `Free` or `Left`
    /// (`→ Claiming(me)`, a compare-exchange against the exact word seen), then, still
    /// `Claiming`, read `sent` (a read-modify-write) and start there: `released = sent`, so
    /// the first item received is the next one published. Then `Held`, and a ring of the
    /// entry's bell (a producer waiting on the claim).
    ///
    /// Why the start is safe: the producer overwrites item `j`'s slot only when writing
    /// `j + slots`, after checking every entry, and that check comes after its publish of
    /// `j + slots − 1`, a read-modify-write of `sent` like ours. If our read of `sent` comes
    /// first in its modification order, the producer's later publish reads from it, so its
    /// check sees our claim and waits for our releases; if it comes later, we read
    /// `sent ≥ j + slots − 1 ≥ j` and never receive item `j`. Loom checks this exactly (acquire
    /// and release on read-modify-writes, no sequential consistency needed).
    ///
    /// For the GPU half: `prepare(index)` runs for each candidate entry before its claim
    /// (opening that entry's GPU release counter: a driver call, kept out of the `Claiming`
    /// window that holds the producer), and `in_claim(&prepared, start)` while `Claiming`,
    /// after `released = start` (setting the GPU counter to `start`, so that a producer's GPU
    /// wait on it never waits for a value the new consumer will not write). An error from
    /// either ends the attach; one from `in_claim` first gives the entry back.
    ///
    /// # Errors
    ///
    /// [`Error::ChannelInUse`] when every entry is taken (naming the first entry's process);
    /// what `prepare` or `in_claim` returns.
    pub(crate) fn attach_any_with<P>(
        &self,
        me: &ProcessIdentity,
        mut prepare: impl FnMut(usize) -> Result<P>,
        mut in_claim: impl FnMut(&P, u64) -> Result<()>,
    ) -> Result<(Attached, P)> {
        for index in self.geometry.entries() {
            let entry = &self.state.consumer[index];
            let seen = entry.owner.load();
            if !matches!(seen.state, OwnerState::Free | OwnerState::Left) {
                continue;
            }
            let prepared = prepare(index)?;
            let mut start = 0;
            let mut failed = None;
            let claimed = entry.owner.claim_from_unless(seen.word, me, || {
                start = self.state.sent.fetch_add(0, Ordering::AcqRel);
                entry.released.store(start, Ordering::Release);
                match in_claim(&prepared, start) {
                    Ok(()) => true,
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            if let Some(held) = claimed {
                self.ring_released(index);
                return Ok((Attached { index, held, start }, prepared));
            }
        }
        Err(Error::ChannelInUse {
            pid: self.state.consumer[0].owner.load().pid,
        })
    }

    /// Producer: the items published (the value a dead consumer's GPU counter is forced to).
    pub(crate) fn sent(&self) -> u64 {
        self.state.sent.load(Ordering::Acquire)
    }

    /// Producer: the entries whose consumer is attached now (`Held`): the counters its GPU
    /// waits for before reusing a slot.
    pub(crate) fn held_entries(&self) -> impl Iterator<Item = usize> + '_ {
        self.geometry
            .entries()
            .filter(|&i| self.state.consumer[i].owner.load().state == OwnerState::Held)
    }

    /// Consumer: no more receives (`Held → Left`), then wake a sleeping producer.
    pub(crate) fn close_consumer(&self, held: u64) {
        self.entry().owner.transition(held, OwnerState::Left);
        self.ring_released(self.index);
    }
}

mod arm;
mod census;
mod doorbell;
pub(crate) use census::RingCensus;

pub(crate) use doorbell::Doorbell;

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;

#[cfg(all(test, cuda_ipc_loom))]
mod loom_tests;
