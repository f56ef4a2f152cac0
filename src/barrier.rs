//! [`ProcessBarrier`]: a reusable barrier for up to [`MAX_PARTIES`](ProcessBarrier::MAX_PARTIES)
//! processes whose state, [`BarrierState`], lives in shared memory.
//!
//! # Algorithm
//!
//! One 64-bit word holds the generation (high 32 bits), a poison bit and the number of arrivals in
//! the current generation. A waiter adds one arrival; the process whose arrival completes the count
//! swaps in `(generation + 1, 0)` with a compare-exchange, publishes the new generation in a
//! separate 32-bit futex word and wakes sleepers only if one has announced itself, so a barrier
//! whose waiters are all spinning costs no system call. Everyone else spins briefly on the state
//! word (one cache line carries both the arrivals and the completion), then yields, then sleeps on
//! the futex word (a shared futex, not `FUTEX_PRIVATE`) in ticks of
//! [`LIVENESS_TICK`](ProcessBarrier::LIVENESS_TICK), checking at each tick that every other
//! participant is alive.
//!
//! A waiter that runs out of time withdraws its arrival with a compare-exchange against the same
//! word (so it races the completing arrival cleanly: either the generation completed and the waiter
//! reports success, or its arrival is gone) and returns [`Error::Timeout`]; the barrier stays
//! usable. A dead or departed participant **poisons** the barrier: the poison bit makes the
//! completing compare-exchange impossible, and every wait then fails with [`Error::PeerGone`] (a
//! barrier participant).
//!
//! Participants register in a slot whose state and owner (pid and start time, which a reused
//! pid cannot repeat, plus the pidfs inode: [`ProcessIdentity`]) change in one atomic word
//! (`OwnedSlot`, `src/owned_slot.rs`).
//!
//! # What each side sees when another participant stops
//!
//! | A participant is preempted or `SIGKILL`ed... | The others see |
//! |-----------------------------------------------|----------------|
//! | in `join`, before its slot's compare-exchange | nothing |
//! | in `join`, after it (slot `Claiming`, named) | `PeerGone` (barrier participant) at their next liveness tick once it is dead; a later `join` takes the slot over while nobody has noticed |
//! | joined, not waiting | `PeerGone` (barrier participant) once dead (poisoned) |
//! | after its arrival, before completing | `PeerGone` (barrier participant); the poison bit makes the completing compare-exchange fail, so no false completion |
//! | right after completing, then exiting or dropping | waiters that had not seen the completion find it gone: the poison records the state word as it was, and a generation that had moved on is success |
//! | stopped (`SIGSTOP`) | alive: `Timeout` at the deadline, arrival withdrawn, barrier usable |
//!
//! A wait without a thread ([`arrive`](ProcessBarrier::arrive), whose [`BarrierArrival`] is a
//! descriptor, and `wait_async` (feature `async`), which first spins as the
//! blocking wait does) makes the same checks as the blocking wait, paced by a timer (10 µs
//! doubling to 1 ms) instead of sleeping on the futex,
//! so it sees each row above as a waiter does, up to one pause later. An arrival dropped
//! before its generation completed (a cancelled future) withdraws itself with the timed-out
//! wait's compare-exchange; a participant killed while an arrival of it is counted is one
//! killed "after its arrival" (row four).
//!
//! Tested by the loom models below (arrive/complete/withdraw, leave, a joiner killed mid-join),
//! the replay unit tests of the completer-exits and killed-joiner cases, and
//! `tests/barrier.rs` (kills before, during and after waits, an awaited wait included; 1,000
//! random kills), and the arrival's unit tests (completion beside a blocking wait, withdrawal
//! on drop at each poll, pacing, poison).

use std::time::{Duration, Instant};

use crate::error::{ArgumentDefect, Error, ObjectState, PeerRole, Result, StateDefect};
use crate::owned_slot::{OwnedSlot, OwnerState};
use crate::process::ProcessIdentity;
use crate::sync::{
    AtomicU32, AtomicU64, Ordering, futex_wait, futex_wake_all, spin_hint, yield_now,
};

/// The most participants a barrier supports.
pub(crate) const MAX_PARTIES: u32 = 64;

/// How often a sleeping waiter wakes to check that its peers are alive: a dead peer is noticed
/// within this tick plus the time to read `/proc` for each peer.
pub(crate) const LIVENESS_TICK: Duration = Duration::from_millis(100);

/// Default deadline of [`ProcessBarrier::wait`].
pub(crate) const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Default time a waiter spins before it yields and then sleeps.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long a waiter yields the CPU between polls after spinning and before sleeping.
const YIELD_FOR: Duration = Duration::from_micros(200);

/// "bar2": the layout with one-word owned slots (a barrier of the earlier layout is refused).
const MAGIC: u32 = 0x3272_6162;

/// State-word polls between the slower checks (poison, clock); 1 under the model checker.
const POLL_BATCH: u32 = if cfg!(cuda_ipc_loom) { 1 } else { 64 };

const POISON_BIT: u64 = 1 << 31;
const COUNT_MASK: u64 = POISON_BIT - 1;

const KIND_DIED: u64 = 1;
const KIND_LEFT: u64 = 2;
const KIND_EXPLICIT: u64 = 3;

fn pack(generation: u32, count: u64) -> u64 {
    (u64::from(generation) << 32) | count
}
fn generation_of(state: u64) -> u32 {
    (state >> 32) as u32
}
fn count_of(state: u64) -> u64 {
    state & COUNT_MASK
}
fn poisoned(state: u64) -> bool {
    state & POISON_BIT != 0
}
/// Whether the published futex generation `now` is past `generation`. Not `!=`: the completer
/// updates the futex word just after the state word, so a waiter that already saw the new
/// state and arrived in the next generation can find the futex word one *behind* it.
fn passed(now: u32, generation: u32) -> bool {
    (now.wrapping_sub(generation) as i32) > 0
}

/// A 64-byte aligned line holding `T`, so hot words of different roles do not share a cache
/// line (crossbeam's `CachePadded`).
#[repr(C, align(64))]
struct Line<T>(T);

/// The shared state of a [`ProcessBarrier`]: place it in a [`ShmRegion`](crate::shm::ShmRegion), on
/// its own or as a field of your own `#[repr(C)]` shared struct (as simpleIPC's
/// `barrier`/`sense` fields are), and call [`init`](Self::init) once, before publishing.
///
/// All fields are atomics: it is [`ShmSafe`](crate::ShmSafe), and every value read from it is
/// validated, so a peer that scribbles on it causes errors, not undefined behaviour.
///
/// The state must not move while processes use it (it is addressed by its mapping, and the
/// futex is keyed by its address). It is `Sync`; 1.7 KiB in size.
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
/// use cuda_ipc::shm::ShmOptions;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// // The parent creates the barrier for 2 children...
/// let region = ShmOptions::new("sync")
///     .random_suffix(true)
///     .create_with(|b: &BarrierState| b.init(2))?;
/// // ...and each child opens the region by name and joins:
/// let region = ShmOptions::new(region.name()).open::<BarrierState>()?;
/// let barrier = ProcessBarrier::join(&region)?;
/// barrier.wait()?;
/// # Ok(()) }
/// ```
#[repr(C, align(64))]
pub struct BarrierState {
    /// generation:32 | poison:1 | arrivals:31
    state: Line<AtomicU64>,
    /// The futex word (mirrors the generation) and the number of announced sleepers.
    wake: Line<Wake>,
    /// Configuration and poison record.
    config: Line<BarrierConfig>,
    /// Participant slots: state and owner in one word ([`OwnedSlot`]): `Claiming` while
    /// joining, `Held` while a participant, `Left` after it dropped.
    slots: [OwnedSlot; MAX_PARTIES as usize],
}

#[repr(C)]
struct Wake {
    /// The generation, published after the state word moves on; sleepers park on it.
    futex: AtomicU32,
    /// Waiters that announced they may sleep: the completer skips `FUTEX_WAKE` when zero.
    sleepers: AtomicU32,
}

#[repr(C)]
struct BarrierConfig {
    magic: AtomicU32,
    parties: AtomicU32,
    /// kind:8 << 40 | slot:8 << 32 | pid:32, or 0 while healthy.
    poison_info: AtomicU64,
}

// SAFETY: repr(C); every field is an integer atomic (in padded lines and plain arrays), so it
// is valid for every bit pattern, zero included, and only accessed atomically. (Under
// `--cfg cuda_ipc_loom` the atomics are loom's, which only the model checks use, on the heap: see the
// loom impls in `shm_safe.rs`.)
unsafe impl crate::ShmSafe for BarrierState {}

impl std::fmt::Debug for BarrierState {
    /// A snapshot of the shared words (each read once; another process may change them).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BarrierState")
            .field("parties", &self.config.0.parties.load(Ordering::Relaxed))
            .field("arrived", &self.arrived())
            .field("generation", &self.generation())
            .field("poisoned", &self.is_poisoned())
            .finish_non_exhaustive()
    }
}

impl BarrierState {
    /// A barrier for `parties` participants outside shared memory (for threads, or tests).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `parties` is 0 or over
    /// [`MAX_PARTIES`](ProcessBarrier::MAX_PARTIES).
    pub fn new(parties: u32) -> Result<Self> {
        let state = Self::zeroed();
        state.init(parties)?;
        Ok(state)
    }

    fn zeroed() -> Self {
        Self {
            state: Line(AtomicU64::new(0)),
            wake: Line(Wake {
                futex: AtomicU32::new(0),
                sleepers: AtomicU32::new(0),
            }),
            config: Line(BarrierConfig {
                magic: AtomicU32::new(0),
                parties: AtomicU32::new(0),
                poison_info: AtomicU64::new(0),
            }),
            slots: std::array::from_fn(|_| OwnedSlot::new()),
        }
    }

    /// Initialise zeroed state (as a fresh region's payload is) for `parties` participants.
    /// Call it once, in the creator, before other processes can see the state (in
    /// [`ShmOptions::create_with`](crate::shm::ShmOptions::create_with)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `parties` is 0 or over
    /// [`MAX_PARTIES`](ProcessBarrier::MAX_PARTIES); [`Error::InvalidState`] if the state was
    /// already initialised.
    pub fn init(&self, parties: u32) -> Result<()> {
        ArgumentDefect::check_range(
            "BarrierState::init",
            "parties",
            parties.into(),
            1,
            MAX_PARTIES.into(),
        )?;
        if self.config.0.magic.load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidState {
                call: "BarrierState::init",
                state: ObjectState::AlreadyInitialised,
            });
        }
        self.config.0.parties.store(parties, Ordering::Relaxed);
        self.config.0.poison_info.store(0, Ordering::Relaxed);
        self.state.0.store(0, Ordering::Relaxed);
        self.wake.0.futex.store(0, Ordering::Relaxed);
        self.wake.0.sleepers.store(0, Ordering::Relaxed);
        self.config.0.magic.store(MAGIC, Ordering::Release);
        Ok(())
    }

    /// The party count, validated.
    fn parties(&self) -> Result<u32> {
        let magic = self.config.0.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(Error::Corrupt {
                what: "barrier state (initialised by BarrierState::init in its creator)",
                defect: if magic == 0 {
                    StateDefect::NotInitialised
                } else {
                    StateDefect::UnknownValue {
                        field: "magic",
                        value: magic.into(),
                    }
                },
            });
        }
        let parties = self.config.0.parties.load(Ordering::Relaxed);
        if parties == 0 || parties > MAX_PARTIES {
            return Err(Error::Corrupt {
                what: "barrier state",
                defect: StateDefect::OutOfRange {
                    field: "party count",
                    value: parties.into(),
                    min: 1,
                    max: MAX_PARTIES.into(),
                },
            });
        }
        Ok(parties)
    }

    /// Whether the barrier is poisoned.
    #[must_use]
    pub fn is_poisoned(&self) -> bool {
        poisoned(self.state.0.load(Ordering::Acquire))
    }

    /// Poison the barrier from a process that is not a participant (a parent supervising its
    /// children, say, after one of them failed): every current and future wait fails with
    /// [`Error::Poisoned`] naming the calling process.
    pub fn poison(&self) {
        let _ = self.poison_with(KIND_EXPLICIT, u32::MAX, crate::os::pid());
    }

    /// How many participants have arrived in the current generation (a snapshot, for
    /// monitoring and tests).
    #[must_use]
    pub fn arrived(&self) -> u32 {
        count_of(self.state.0.load(Ordering::Acquire)) as u32
    }

    /// The current generation: the number of completed generations, wrapping at `u32::MAX`.
    #[must_use]
    pub fn generation(&self) -> u32 {
        generation_of(self.state.0.load(Ordering::Acquire))
    }

    /// Record why the barrier broke (first cause wins), set the poison bit, wake everyone.
    /// Returns the state word from just before the poison bit was set.
    fn poison_with(&self, kind: u64, slot: u32, pid: u32) -> u64 {
        let info = (kind << 40) | (u64::from(slot & 0xff) << 32) | u64::from(pid);
        let _ = self.config.0.poison_info.compare_exchange(
            0,
            info,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let prev = self.state.0.fetch_or(POISON_BIT, Ordering::SeqCst);
        futex_wake_all(&self.wake.0.futex);
        prev
    }

    /// The error a poisoned barrier reports, from the recorded cause.
    fn poison_error(&self) -> Error {
        let info = self.config.0.poison_info.load(Ordering::Acquire);
        let pid = info as u32;
        let slot = ((info >> 32) & 0xff) as u32;
        match info >> 40 {
            KIND_EXPLICIT => Error::Poisoned { pid },
            KIND_LEFT => Error::peer_gone(pid, PeerRole::BarrierParty { slot, left: true }),
            KIND_DIED => Error::peer_gone(pid, PeerRole::BarrierParty { slot, left: false }),
            _ => Error::Corrupt {
                what: "barrier state",
                defect: StateDefect::UnknownValue {
                    field: "poison record",
                    value: info,
                },
            },
        }
    }
}

/// What a successful [`ProcessBarrier::wait`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierWaitResult {
    leader: bool,
    generation: u32,
}

impl BarrierWaitResult {
    /// True for exactly one participant per generation: the one whose arrival completed it
    /// (as [`std::sync::BarrierWaitResult::is_leader`]).
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.leader
    }

    /// The generation that completed (0 for the first, wrapping at `u32::MAX`).
    #[must_use]
    pub fn generation(&self) -> u32 {
        self.generation
    }
}

/// This process's membership in a barrier whose [`BarrierState`] lives in shared memory.
///
/// [`join`](Self::join) claims one of the barrier's participant slots, recording this process's pid
/// and start time; drop gives it up (marking it *left*: a barrier whose participant left cannot
/// complete again, so a later wait by the others reports [`Error::PeerGone`] (a barrier
/// participant) with `exited_cleanly` instead of hanging).
///
/// Every wait is bounded. When a participant dies (`SIGKILL` at any point), every waiter returns
/// [`Error::PeerGone`] (a barrier participant) naming it within about
/// [`LIVENESS_TICK`](ProcessBarrier::LIVENESS_TICK), and the barrier stays poisoned: later waits
/// fail at once. A stopped (`SIGSTOP`) participant is alive: waiters get [`Error::Timeout`] at
/// their deadline, and the barrier stays usable.
///
/// `ProcessBarrier` is `Send` and `Sync`; the wait methods take `&self`, but one handle is one
/// participant: two threads waiting on the same handle count as two arrivals of one slot.
///
/// # Examples
///
/// ```
/// use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let state = BarrierState::new(2)?;
/// std::thread::scope(|s| -> cuda_ipc::Result<()> {
///     let a = ProcessBarrier::join(&state)?;
///     let b = ProcessBarrier::join(&state)?;
///     let t = s.spawn(move || b.wait().map(|r| r.is_leader()));
///     let a_leads = a.wait()?.is_leader();
///     let b_leads = t.join().expect("waiter thread")?;
///     assert!(a_leads != b_leads);
///     Ok(())
/// })
/// # }
/// ```
#[doc(alias = "pthread_barrier_t")]
pub struct ProcessBarrier<'a> {
    state: &'a BarrierState,
    parties: u32,
    slot: u32,
    /// Our slot word (`Held`), moved to `Left` on drop.
    held: u64,
    pid: u32,
    /// The process that joined: a forked child neither arrives nor leaves for it.
    home: crate::process::Home,
    timeout: Duration,
    spin: Duration,
}

impl<'a> ProcessBarrier<'a> {
    /// The most processes one barrier serves.
    pub const MAX_PARTIES: u32 = MAX_PARTIES;
    /// How often a sleeping waiter wakes to check that its peers are alive: a dead peer is
    /// noticed within about this long.
    pub const LIVENESS_TICK: Duration = LIVENESS_TICK;
    /// The deadline of [`wait`](Self::wait) unless
    /// [`set_default_timeout`](Self::set_default_timeout) changes it.
    pub const DEFAULT_WAIT_TIMEOUT: Duration = DEFAULT_WAIT_TIMEOUT;
    /// How long a waiter spins before it yields and sleeps, unless
    /// [`set_spin`](Self::set_spin) changes it.
    pub const DEFAULT_SPIN: Duration = DEFAULT_SPIN;

    /// Join the barrier: validate the shared state and claim a free participant slot.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] if the state is not initialised or holds an invalid party count,
    /// [`Error::BarrierFull`] if every slot is taken, or the poison error if the barrier is
    /// already poisoned.
    pub fn join(state: &'a BarrierState) -> Result<Self> {
        Self::join_pausing(state, || {})
    }

    /// Test access: [`join`](Self::join), calling `pause` while the claimed slot still reads
    /// *claiming* (the stress test stalls or kills itself there). Not part of the API.
    ///
    /// # Errors
    ///
    /// As [`join`](Self::join).
    #[doc(hidden)]
    pub fn __join_pausing(state: &'a BarrierState, pause: impl FnMut()) -> Result<Self> {
        Self::join_pausing(state, pause)
    }

    fn join_pausing(state: &'a BarrierState, mut pause: impl FnMut()) -> Result<Self> {
        let parties = state.parties()?;
        if state.is_poisoned() {
            return Err(state.poison_error());
        }
        let me = current_identity();
        let slots = &state.slots[..parties as usize];
        // A free slot, else one whose claimer died before it finished joining (it never
        // arrived: arrivals need a joined participant), taken over in one compare-exchange
        // against the exact word judged dead.
        let free = slots
            .iter()
            .enumerate()
            .find_map(|(i, s)| Some((i, s.claim_pausing(&me, &mut pause)?)));
        let taken = free.or_else(|| {
            slots.iter().enumerate().find_map(|(i, s)| {
                let (owner, id) = s.load_identity();
                let dead_claimer = owner.state == OwnerState::Claiming && !peer_alive(&id);
                dead_claimer.then(|| Some((i, s.claim_from(owner.word, &me, &mut pause)?)))?
            })
        });
        let Some((slot, held)) = taken else {
            return Err(Error::BarrierFull { parties });
        };
        Ok(Self {
            state,
            parties,
            slot: slot as u32,
            held,
            pid: me.pid(),
            home: crate::process::Home::here(),
            timeout: DEFAULT_WAIT_TIMEOUT,
            spin: DEFAULT_SPIN,
        })
    }

    /// Set the deadline [`wait`](Self::wait) uses (default
    /// [`DEFAULT_WAIT_TIMEOUT`](ProcessBarrier::DEFAULT_WAIT_TIMEOUT)).
    pub fn set_default_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Set how long a waiter spins before yielding and sleeping (default
    /// [`DEFAULT_SPIN`](ProcessBarrier::DEFAULT_SPIN)). Longer spins cut wake-up latency when every
    /// participant has its own core; zero suits oversubscribed machines.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// The number of participants.
    #[must_use]
    pub fn parties(&self) -> u32 {
        self.parties
    }

    /// This participant's slot index (`0..parties`).
    #[must_use]
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Wait for every participant, with the default deadline.
    ///
    /// # Errors
    ///
    /// As [`wait_timeout`](Self::wait_timeout).
    #[doc(alias = "pthread_barrier_wait")]
    #[doc(alias = "futex")]
    pub fn wait(&self) -> Result<BarrierWaitResult> {
        self.wait_timeout(self.timeout)
    }

    /// Wait for every participant to arrive, at most `timeout`.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the deadline passes first; this arrival is withdrawn and the
    ///   barrier remains usable (a later wait counts afresh).
    /// - [`Error::PeerGone`] (a barrier participant) when a participant died or left; the barrier
    ///   is poisoned.
    /// - [`Error::Poisoned`] after [`poison`](Self::poison).
    /// - [`Error::Corrupt`] when the shared state holds impossible values.
    /// - [`Error::InvalidState`] ([`ObjectState::Inherited`]) in
    ///   a child forked from the process that joined: the slot is the parent's.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<BarrierWaitResult> {
        self.check_home("ProcessBarrier::wait")?;
        let waiting = crate::trace::Waiting::start("barrier: every participant to arrive");
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut clock = || deadline.is_some_and(|d| Instant::now() >= d);
        waiting.end(
            self.wait_until(&mut clock, true)
                .map_err(|e| e.into_error(start.elapsed())),
        )
    }

    /// Poison the barrier on purpose (say, a participant failed and the others must stop):
    /// every current and future wait fails with [`Error::Poisoned`] naming this process.
    pub fn poison(&self) {
        let _ = self.state.poison_with(KIND_EXPLICIT, self.slot, self.pid);
    }

    /// Whether the barrier is poisoned.
    #[must_use]
    pub fn is_poisoned(&self) -> bool {
        self.state.is_poisoned()
    }

    /// [`Error::InvalidState`] ([`ObjectState::Inherited`]) in a child forked from the
    /// process that joined.
    pub(crate) fn check_home(&self, call: &'static str) -> Result<()> {
        if self.home.is_here() {
            return Ok(());
        }
        Err(Error::InvalidState {
            call,
            state: ObjectState::Inherited {
                made_in: self.home.pid(),
            },
        })
    }

    /// The core wait. `expired` is polled now and then; `check_peers` enables the liveness
    /// checks (the model checker turns them off: its threads are one process).
    fn wait_until(
        &self,
        expired: &mut dyn FnMut() -> bool,
        check_peers: bool,
    ) -> std::result::Result<BarrierWaitResult, WaitError> {
        let st = self.state;
        let word = &st.state.0;
        let (generation, arrived) = self.arrive_counted()?;
        let parties = u64::from(self.parties);
        if arrived == parties
            && let Some(done) = self.try_complete(generation)
        {
            return Ok(done);
        }

        let mut polls: u32 = 0;
        let spin_start = Instant::now();
        loop {
            // Spin on the state word itself: the completing compare-exchange is visible there
            // with one cache-line transfer (the futex word is for sleepers).
            let s = word.load(Ordering::Acquire);
            if generation_of(s) != generation {
                return Ok(self.completed(generation));
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(POLL_BATCH) {
                spin_hint();
                continue;
            }
            // Every 64 polls: the slow checks.
            if poisoned(s) {
                return Err(WaitError::Failed(st.poison_error()));
            }
            // A withdrawal raced our completion: whoever sees the full count completes.
            if count_of(s) == parties
                && let Some(done) = self.try_complete(generation)
            {
                return Ok(done);
            }
            if expired() {
                return self.withdraw(generation);
            }
            // Under the model checker a park is a yield (it cannot lose a wake-up), so the
            // sleep protocol below is exercised only by the multi-process tests; loom checks
            // the arrive/complete/withdraw protocol on the state word.
            if cfg!(cuda_ipc_loom) {
                if check_peers && let Some(end) = self.end_if_peer_gone(generation) {
                    return end;
                }
                yield_now();
                continue;
            }
            let spun = spin_start.elapsed();
            if spun < self.spin {
                continue;
            }
            if spun < self.spin.saturating_add(YIELD_FOR) {
                yield_now();
                continue;
            }
            if self.sleep(generation) {
                return Ok(self.completed(generation));
            }
            if check_peers && let Some(end) = self.end_if_peer_gone(generation) {
                return end;
            }
        }
    }

    /// Count this party in: the generation it waits in and how many have arrived with it
    /// (an arrival past the party count means a corrupt word: poisoned).
    fn arrive_counted(&self) -> std::result::Result<(u32, u64), WaitError> {
        let st = self.state;
        let prev = st.state.0.fetch_add(1, Ordering::AcqRel);
        if poisoned(prev) {
            return Err(WaitError::Failed(st.poison_error()));
        }
        let arrived = count_of(prev) + 1;
        let parties = u64::from(self.parties);
        if arrived > parties {
            let e = Error::Corrupt {
                what: "barrier state",
                defect: StateDefect::OutOfRange {
                    field: "arrivals",
                    value: arrived,
                    min: 1,
                    max: parties,
                },
            };
            let _ = st.poison_with(KIND_EXPLICIT, self.slot, self.pid);
            return Err(WaitError::Failed(e));
        }
        Ok((generation_of(prev), arrived))
    }

    /// Sleep on the futex for at most a liveness tick unless `generation` has passed or the
    /// barrier is poisoned: announce, re-check (Dekker with the completer's SeqCst store and
    /// load), park. Returns whether `generation` has passed.
    fn sleep(&self, generation: u32) -> bool {
        let st = self.state;
        let (futex, sleepers) = (&st.wake.0.futex, &st.wake.0.sleepers);
        sleepers.fetch_add(1, Ordering::SeqCst);
        if !passed(futex.load(Ordering::SeqCst), generation)
            && !poisoned(st.state.0.load(Ordering::SeqCst))
        {
            futex_wait(futex, generation, LIVENESS_TICK);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
        passed(futex.load(Ordering::Acquire), generation)
    }

    /// Swap `(generation, parties)` for `(generation + 1, 0)`; on success publish and wake.
    fn try_complete(&self, generation: u32) -> Option<BarrierWaitResult> {
        let st = self.state;
        let full = pack(generation, u64::from(self.parties));
        let next = generation.wrapping_add(1);
        st.state
            .0
            .compare_exchange(full, pack(next, 0), Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        st.wake.0.futex.store(next, Ordering::SeqCst);
        if st.wake.0.sleepers.load(Ordering::SeqCst) != 0 {
            futex_wake_all(&st.wake.0.futex);
        }
        Some(BarrierWaitResult {
            leader: true,
            generation,
        })
    }

    fn completed(&self, generation: u32) -> BarrierWaitResult {
        BarrierWaitResult {
            leader: false,
            generation,
        }
    }

    /// Take our arrival back, unless the generation completed meanwhile.
    fn withdraw(&self, generation: u32) -> std::result::Result<BarrierWaitResult, WaitError> {
        let word = &self.state.state.0;
        let mut s = word.load(Ordering::Acquire);
        loop {
            if generation_of(s) != generation {
                return Ok(self.completed(generation));
            }
            if poisoned(s) {
                return Err(WaitError::Failed(self.state.poison_error()));
            }
            if count_of(s) == 0 {
                // Impossible while our arrival is counted: someone wrote the word.
                return Err(WaitError::Failed(Error::Corrupt {
                    what: "barrier state (under a waiter, whose arrival it counts)",
                    defect: StateDefect::OutOfRange {
                        field: "arrivals",
                        value: 0,
                        min: 1,
                        max: u64::from(self.parties),
                    },
                }));
            }
            match word.compare_exchange_weak(s, s - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Err(WaitError::TimedOut),
                Err(now) => s = now,
            }
        }
    }

    /// The wait's outcome if a peer is gone: success if `generation` completed first, the
    /// poison error otherwise; `None` while every peer is alive.
    fn end_if_peer_gone(
        &self,
        generation: u32,
    ) -> Option<std::result::Result<BarrierWaitResult, WaitError>> {
        match self.check_peers(generation) {
            Ok(PeerCheck::AllAlive) => None,
            Ok(PeerCheck::GenerationPassed) => Some(Ok(self.completed(generation))),
            Err(e) => Some(Err(WaitError::Failed(e))),
        }
    }

    /// Poison the barrier if another participant died or left, and report it, unless
    /// `generation` completed meanwhile: a participant that completes a generation and then
    /// exits (the usual "last barrier, then exit") is found gone by waiters that have not yet
    /// seen the completion, and for them the generation succeeded.
    fn check_peers(&self, generation: u32) -> Result<PeerCheck> {
        let st = self.state;
        for slot in 0..self.parties {
            if slot == self.slot {
                continue;
            }
            let s = &st.slots[slot as usize];
            let (owner, id) = s.load_identity();
            let kind = match owner.state {
                OwnerState::Free => continue,
                // A joiner killed before it finished joining is a participant that died.
                OwnerState::Claiming | OwnerState::Held if peer_alive(&id) => continue,
                OwnerState::Claiming | OwnerState::Held => KIND_DIED,
                OwnerState::Left => KIND_LEFT,
            };
            // Judge the word we read: a dead claimer's slot may have been taken over since.
            if s.load().word != owner.word {
                continue;
            }
            let before = st.poison_with(kind, slot, owner.pid);
            if generation_of(before) != generation {
                return Ok(PeerCheck::GenerationPassed);
            }
            return Err(st.poison_error());
        }
        Ok(PeerCheck::AllAlive)
    }
}

/// What [`ProcessBarrier::check_peers`] found.
enum PeerCheck {
    AllAlive,
    /// A peer is gone, but the generation being waited for had completed before the barrier
    /// was poisoned.
    GenerationPassed,
}

#[cfg(not(cuda_ipc_loom))]
fn peer_alive(id: &ProcessIdentity) -> bool {
    id.is_alive()
}
/// Under the model checker, processes are threads of one process: pids at or above
/// [`loom_support::DEAD_FROM`] stand for participants that were killed.
#[cfg(cuda_ipc_loom)]
fn peer_alive(id: &ProcessIdentity) -> bool {
    id.pid() < loom_support::DEAD_FROM
}

#[cfg(not(cuda_ipc_loom))]
fn current_identity() -> ProcessIdentity {
    ProcessIdentity::current()
}
#[cfg(cuda_ipc_loom)]
fn current_identity() -> ProcessIdentity {
    ProcessIdentity::from_parts(loom_support::pid(), 1)
}

/// Under the model checker, each thread names the process it stands for.
#[cfg(cuda_ipc_loom)]
pub(crate) mod loom_support {
    use std::cell::Cell;

    /// Pids from here on stand for killed processes.
    pub(crate) const DEAD_FROM: u32 = 1000;

    loom::thread_local! {
        static PID: Cell<u32> = Cell::new(1);
    }

    /// The pid the calling model thread stands for.
    pub(crate) fn pid() -> u32 {
        PID.with(Cell::get)
    }

    /// Make the calling model thread stand for process `pid`.
    #[cfg(test)]
    pub(crate) fn set_pid(pid: u32) {
        PID.with(|p| p.set(pid));
    }
}

/// The internal outcome of a failed wait, before the elapsed time is attached.
#[derive(Debug)]
enum WaitError {
    TimedOut,
    Failed(Error),
}

impl WaitError {
    fn into_error(self, waited: Duration) -> Error {
        match self {
            WaitError::TimedOut => Error::Timeout {
                what: "barrier wait",
                waited,
                waiting_for: None,
            },
            WaitError::Failed(e) => e,
        }
    }
}

impl Drop for ProcessBarrier<'_> {
    fn drop(&mut self) {
        if !self.home.is_here() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // Leaving is final for the slot: the barrier cannot complete without us, so waiters
        // must learn we left (PeerGone) rather than wait for their deadline.
        self.state.slots[self.slot as usize].transition(self.held, OwnerState::Left);
    }
}

impl std::fmt::Debug for ProcessBarrier<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessBarrier")
            .field("parties", &self.parties)
            .field("slot", &self.slot)
            .field("poisoned", &self.is_poisoned())
            .finish_non_exhaustive()
    }
}

mod arrival;
pub use arrival::BarrierArrival;

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;

#[cfg(all(test, cuda_ipc_loom))]
mod loom_tests;
