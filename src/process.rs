//! Process identities that survive pid reuse, and the one rule that says a process is dead.
//!
//! A pid alone names a process only while it lives: once it exits, the kernel may hand the same
//! number to a new process, and `kill(pid, 0)` would then report the stranger as alive. A
//! [`ProcessIdentity`] pairs the pid with the process's start time (field 22 of
//! `/proc/<pid>/stat`) and, where the kernel has pidfs (Linux 6.9+), the process's pidfs inode
//! number. The start time is counted in clock ticks (10 ms), so a pid reused within the same
//! tick repeats it (a test forces exactly that); the pidfs inode is unique until reboot.
//!
//! # Liveness
//!
//! The rule that proves a death is written once, on [`ProcessIdentity`]
//! ([the liveness rule](ProcessIdentity#the-liveness-rule)).
//!
//! [`ProcessIdentity::is_alive`] applies the rule; `is_alive_cached` applies it once per
//! process and then polls a pinned pidfd. Every caller asks one of the two, and nothing else in
//! the crate reads `/proc` for liveness. What a wrong answer would cost each of them:
//!
//! | Caller | On "dead" it… | A live process taken for dead would… |
//! |---|---|---|
//! | lease close / drop (`ledger/lease.rs`), arena and pool books | frees an export with no live holder | free memory another process maps (use after free) |
//! | export registry collect (`ledger/registry.rs`) | clears the slot, grants it to the next importer | let two importers share one slot, then free under one |
//! | stale-region sweep ([`reclaim_stale_regions`](crate::shm::reclaim_stale_regions), each process's first export or channel, a consumer that found its producer gone) | unlinks the regions | delete a live exporter's tables or a live producer's channel: its handles turn stale |
//! | [`reclaim_stale`](crate::shm::reclaim_stale), region open (`NotReady { creator_dead }`) | replaces or reports the region | replace a live creator's region under it |
//! | barrier arrival and wait | poisons with `PeerGone` | poison a barrier a live peer is about to reach |
//! | channel ends (`channel.rs`, `channel/ring.rs`) | forces the dead end's counters | let a slot be refilled under a live reader |
//! | handle admission, event and signal waits, buffer opens | refuses with `PeerGone` | refuse a valid open or end a wait early |
//!
//! A live process taken for alive costs only time: a wait runs to its timeout, a free waits for
//! the next close or collect.

use crate::error::{Error, Result};
use crate::os;

/// A process named by pid and start time, as recorded in shared memory by the barrier and the
/// region header.
///
/// # The liveness rule
///
/// A process is alive until its death is **proven**; one of these proves it:
///
/// | Signal | Why it is a proof |
/// |---|---|
/// | the pid is 0 | no process has it |
/// | `pidfd_open(pid)` fails `ESRCH` | no thread group has the pid |
/// | the pid's pidfd has another pidfs inode than the record | the pid was reused |
/// | the pid's pidfd polls readable | the whole thread group has exited |
/// | `/proc/<pid>/stat` is gone, or names another start time | gone, or the pid was reused |
/// | `stat` says `X` | dead |
/// | `stat` says `Z`, no pidfd could be opened, and `/proc/<pid>/task` lists the leader alone | the group is empty |
///
/// Not proofs: `Z` alone (a thread-group leader that exited — `pthread_exit` in `main`, some
/// language runtimes — is a zombie until the group's last thread exits, and the others still
/// run and map memory), `T` (stopped), `D`, and any answer the kernel would not give (`EMFILE`,
/// `ENOSYS`, a seccomp `EPERM`, an unreadable `/proc`): those read as alive. A record without a
/// pidfs inode cannot tell a successor that got the same pid in the same clock tick from itself;
/// both read alive (the safe side).
///
/// `ProcessIdentity` is plain data (`Copy`, `Send`, `Sync`). `==` compares every field, the
/// pidfs inode included, so it is an equivalence; [`is_same_process`](Self::is_same_process)
/// is the looser question "could these two records name one process?", where an unknown inode
/// matches any.
///
/// # Examples
///
/// ```
/// use cuda_ipc::ProcessIdentity;
///
/// let me = ProcessIdentity::current();
/// assert_eq!(me.pid(), std::process::id());
/// assert!(me.is_alive());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    pid: u32,
    start_time: u64,
    /// pidfs inode number, 0 when unknown.
    pidfs_ino: u64,
}

impl ProcessIdentity {
    /// The calling process.
    ///
    /// If `/proc` cannot be read the start time is 0, which [`is_alive`](Self::is_alive) treats
    /// as "pid only".
    pub fn current() -> Self {
        // Cached: reading /proc costs microseconds, and exports record it every time. The pid
        // (`current_pid`: no system call, refreshed in a forked child) says whether the cache
        // is this process's: after a fork the child has a new pid and start time, so it reads
        // them again. Lock-free, so that a fork while another thread held a lock cannot leave
        // the child stuck: every writer in one process writes the same values (its own
        // identity), the pid last with `Release`, so a reader that sees its own pid sees them.
        use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
        static CACHED_PID: AtomicU32 = AtomicU32::new(0);
        static START_TIME: AtomicU64 = AtomicU64::new(0);
        static PIDFS_INO: AtomicU64 = AtomicU64::new(0);
        let pid = current_pid();
        if CACHED_PID.load(Ordering::Acquire) == pid {
            return Self {
                pid,
                start_time: START_TIME.load(Ordering::Relaxed),
                pidfs_ino: PIDFS_INO.load(Ordering::Relaxed),
            };
        }
        let me = Self::of_pid(pid);
        START_TIME.store(me.start_time, Ordering::Relaxed);
        PIDFS_INO.store(me.pidfs_ino, Ordering::Relaxed);
        CACHED_PID.store(pid, Ordering::Release);
        me
    }

    /// The process that `pid` names now: its start time and pidfs inode read at once, so that
    /// a later reuse of the pid reads as another process. A pid that names nobody (or 0) gives
    /// an identity that is not alive.
    pub(crate) fn of_pid(pid: u32) -> Self {
        if pid == 0 {
            return Self::from_parts(0, 0);
        }
        let start_time = os::proc_stat(pid).map_or(0, |s| s.start_time);
        let pidfs_ino = os::pidfs_ino(pid).unwrap_or(0);
        Self::from_parts(pid, start_time).with_pidfs_ino(pidfs_ino)
    }

    /// Rebuild an identity from its parts (as read back from shared memory); the pidfs inode
    /// is unknown (add it with [`with_pidfs_ino`](Self::with_pidfs_ino)).
    #[must_use]
    pub fn from_parts(pid: u32, start_time: u64) -> Self {
        Self {
            pid,
            start_time,
            pidfs_ino: 0,
        }
    }

    /// The same identity with its pidfs inode number (0 for unknown).
    #[must_use]
    pub fn with_pidfs_ino(mut self, ino: u64) -> Self {
        self.pidfs_ino = ino;
        self
    }

    /// Whether `self` and `other` can name the same process: same pid and start time, and the
    /// same pidfs inode where both records know theirs (an identity read back from an envelope
    /// or a region header has no inode). Not an equivalence relation (two records with
    /// different inodes can each match one without), which is why it is not `==`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::ProcessIdentity;
    ///
    /// let me = ProcessIdentity::current();
    /// let recorded = ProcessIdentity::from_parts(me.pid(), me.start_time());
    /// assert!(recorded.is_same_process(&me));
    /// ```
    #[must_use]
    pub fn is_same_process(&self, other: &Self) -> bool {
        self.pid == other.pid
            && self.start_time == other.start_time
            && (self.pidfs_ino == 0 || other.pidfs_ino == 0 || self.pidfs_ino == other.pidfs_ino)
    }

    /// The pidfs inode number: unique per process until reboot (Linux 6.9+); 0 when unknown.
    #[must_use]
    pub fn pidfs_ino(&self) -> u64 {
        self.pidfs_ino
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The start time in clock ticks after boot (0 if it was unknown).
    #[must_use]
    pub fn start_time(&self) -> u64 {
        self.start_time
    }

    /// Whether this very process still runs: some thread of the process that started at the
    /// recorded time (with the recorded pidfs inode, where known) has not exited. A reused pid
    /// reads as dead even within one clock tick where the inode is known.
    ///
    /// Only a proven death reads as dead (the [liveness rule](Self#the-liveness-rule)):
    /// when the kernel cannot be asked (`/proc` unreadable, no file descriptors left), the process
    /// counts as alive, because the crate frees shared memory and reaps slots on a death, and a
    /// guess there would be a use-after-free. A stopped process (`SIGSTOP`) is alive, and so is
    /// one whose main thread has exited while other threads still run.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuda_ipc::ProcessIdentity;
    ///
    /// assert!(ProcessIdentity::current().is_alive());
    /// assert!(!ProcessIdentity::from_parts(0, 0).is_alive());
    /// ```
    #[must_use]
    pub fn is_alive(&self) -> bool {
        !self.is_proven_dead()
    }

    /// The liveness rule, in one place: see the module docs.
    fn is_proven_dead(&self) -> bool {
        if self.pid == 0 {
            return true;
        }
        // What the pid's pidfd says, if one can be opened: `Some(true)` the group is gone or the
        // pid names another process, `Some(false)` some thread of the pid's process runs.
        let pidfd_says = match os::pidfd_open_checked(self.pid) {
            Err(rustix::io::Errno::SRCH) => return true,
            Ok(fd) => {
                let other = self.pidfs_ino != 0
                    && os::pidfd_ino(&fd).is_some_and(|ino| ino != self.pidfs_ino);
                if other || os::pidfd_exited(&fd) {
                    return true;
                }
                Some(false)
            }
            // EMFILE, ENOSYS (before Linux 5.3), a seccomp EPERM: says nothing.
            Err(_) => None,
        };
        match os::proc_stat_checked(self.pid) {
            Ok(None) => true,
            Ok(Some(st)) => {
                if self.start_time != 0 && st.start_time != self.start_time {
                    return true; // the pid names another process
                }
                match st.state {
                    b'X' | b'x' => true,
                    // A zombie leader: the whole group is gone only if no other thread runs.
                    // A pidfd that did not poll readable has already said one does.
                    b'Z' => pidfd_says.is_none() && only_the_leader_left(self.pid),
                    _ => false,
                }
            }
            // Could not tell: not a proof of death.
            Err(_) => false,
        }
    }
}

/// Without a pidfd: whether a zombie leader's thread group is empty (`/proc/<pid>/task` lists
/// the leader alone, or the process is gone). Unreadable: `false`, not a proof.
fn only_the_leader_left(pid: u32) -> bool {
    matches!(os::proc_task_count(pid), Ok(None | Some(0 | 1)))
}

/// [`ProcessIdentity::is_alive`] for the same processes asked about over and over (an exporter,
/// at every open of its handles), which would cost a `/proc` read each. The cache pins each
/// checked process with a pidfd, after confirming that the pid still names the recorded
/// process (its pidfs inode where the record has one, its start time through `/proc`); later
/// checks are a zero-timeout `poll` on the pidfd, which turns readable only when the whole
/// thread group has exited (pid reuse cannot fool a pidfd).
///
/// The key is everything the verdict depends on: pid, start time and pidfs inode, so two
/// records that differ only in their inode (two processes that shared a pid within one clock
/// tick) are judged apart. A pinned process that exited proves the death of a record that
/// knows its inode (the pin checked it); a record without one is judged afresh, since a
/// successor in the same tick matches it too.
///
/// The cache holds one pidfd per pinned process, at most 256; each new pin first lets go of
/// the pins of processes that exited (judged afresh if asked about again), so the descriptors
/// it holds are those of processes alive at the last pin, not of every process it ever saw.
#[must_use]
pub fn is_alive_cached(id: &ProcessIdentity) -> bool {
    is_alive_pinned(id, 0)
}

/// How long [`check_exporter_alive`] trusts a pinned process's last "alive" answer (100 µs):
/// a tight loop of opens of one exporter's handles pays a clock read, not a `poll`, per open.
const ALIVE_REUSE_NS: u64 = 100_000;
// The documented bound: a death is seen by the first open that starts 100 µs after it.
const _: () = assert!(ALIVE_REUSE_NS > 0 && ALIVE_REUSE_NS <= 100_000);

/// [`is_alive_cached`], trusting a pin's "alive" answer younger than `trust_ns` without asking
/// the kernel again.
fn is_alive_pinned(id: &ProcessIdentity, trust_ns: u64) -> bool {
    if id.pid == 0 {
        return false;
    }
    let mut pinned = PINNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    judge_pinned(&mut pinned, id, trust_ns, monotonic_ns())
}

/// [`is_alive_pinned`] with the pins locked, at `now` (monotonic nanoseconds).
fn judge_pinned(pinned: &mut Pins, id: &ProcessIdentity, trust_ns: u64, now: u64) -> bool {
    let key = (id.pid, id.start_time, id.pidfs_ino);
    if let Some((fd, seen)) = pinned.get_mut(&key) {
        if now.saturating_sub(*seen) < trust_ns {
            return true;
        }
        if !os::pidfd_exited(fd) {
            *seen = now;
            return true;
        }
        pinned.remove(&key);
        if id.pidfs_ino != 0 {
            return false;
        }
    }
    let Some(fd) = os::pidfd_open(id.pid) else {
        return id.is_alive();
    };
    // The pidfd names whatever process has the pid now: keep it only if that is ours.
    if id.pidfs_ino != 0 && os::pidfd_ino(&fd).is_some_and(|ino| ino != id.pidfs_ino) {
        return false;
    }
    if !id.is_alive() {
        return false;
    }
    if os::pidfd_exited(&fd) {
        // The pinned-to-be process exited after `is_alive` looked: judge again, pin nothing.
        return id.is_alive();
    }
    pinned.retain(|_, (fd, _)| !os::pidfd_exited(fd));
    if pinned.len() >= MAX_PINNED {
        pinned.clear();
    }
    pinned.insert(key, (fd, now));
    true
}

/// Monotonic nanoseconds since this process first asked.
fn monotonic_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Refuse an exporter that is not alive (or was replaced by another process with its pid),
/// unless it is this process — possible only for a handle that came with its descriptor
/// (`with_fd`, as passed to [`Handle::admit`](crate::Handle)). An "alive" answer up to
/// [`ALIVE_REUSE_NS`] old is trusted: a death is reported by the first open that starts that
/// long after it. A view handed out inside that window is in the position of one opened just
/// before the death, which no check can prevent (the exporter may die right after any check):
/// the check turns a known death into a clear error, it does not keep the memory alive.
pub(crate) fn check_exporter_alive(exporter: &ProcessIdentity, with_fd: bool) -> Result<()> {
    // Only a handle that came with its descriptor may name this process (`admit` refused it
    // otherwise): only then is the question (a `getpid` and a lock) worth asking.
    if (with_fd && exporter.is_same_process(&ProcessIdentity::current()))
        || is_alive_pinned(exporter, ALIVE_REUSE_NS)
    {
        return Ok(());
    }
    Err(Error::exporter_gone(exporter.pid()))
}

/// A child process (`sleep 10`) and its identity (pid and start time), for tests that watch a
/// process die: kill and wait it.
#[cfg(test)]
pub(crate) fn sleeping_child() -> (std::process::Child, ProcessIdentity) {
    let child = std::process::Command::new("sleep")
        .arg("10")
        .spawn()
        .unwrap();
    let st = os::proc_stat(child.id()).unwrap();
    let id = ProcessIdentity::from_parts(child.id(), st.start_time);
    (child, id)
}

/// A pin's key: pid, start time, pidfs inode (see [`is_alive_cached`]).
type PinKey = (u32, u64, u64);

/// Pinned processes: each one's pidfd and when it was last seen alive (monotonic ns).
type Pins = std::collections::BTreeMap<PinKey, (rustix::fd::OwnedFd, u64)>;

/// [`is_alive_cached`]'s pins.
static PINNED: std::sync::Mutex<Pins> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The most processes [`is_alive_cached`] pins at once.
const MAX_PINNED: usize = 256;

/// The process an object was made in. A child forked without `exec` inherits every object's
/// memory, but not the right to act for it: the CUDA context, the lease and barrier slots and
/// the shared tables all belong to the parent, which still uses them. So every object that
/// acts on shared state or the driver records its `Home` and, in any other process, does
/// nothing — its `Drop` and its `atexit` hook return at once, [`GpuContext`](crate::GpuContext)
/// refuses to be entered, regions are not unlinked, slots are not released.
///
/// Reading it costs one load: this process's pid is cached, and a `pthread_atfork` child
/// handler refreshes the cache in every forked child (`fork`, Python's `os.fork`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Home(u32);

static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn refresh_pid_in_child() {
    // getpid is async-signal-safe, as an atfork child handler must be.
    PID.store(os::pid(), std::sync::atomic::Ordering::Relaxed);
}

/// This process's pid, from the cache [`Home`] describes.
pub(crate) fn current_pid() -> u32 {
    use std::sync::atomic::Ordering::Relaxed;
    let pid = PID.load(Relaxed);
    if pid != 0 {
        return pid;
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function that makes one system call and one
        // atomic store: it cannot unwind, and it is async-signal-safe. A failed registration
        // (ENOMEM) leaves the cache empty in children, which then ask the kernel each time.
        let registered = unsafe { os::in_forked_children(refresh_pid_in_child) };
        if registered {
            PID.store(os::pid(), Relaxed);
        }
    });
    match PID.load(Relaxed) {
        0 => os::pid(),
        pid => pid,
    }
}

impl Home {
    /// The calling process.
    pub(crate) fn here() -> Self {
        Self(current_pid())
    }

    /// Whether the calling process is the one the object was made in (false in a forked
    /// child). Always true under the model checker, whose threads stand in for processes.
    pub(crate) fn is_here(self) -> bool {
        cfg!(cuda_ipc_loom) || self.0 == current_pid()
    }

    /// The pid of the process the object was made in.
    pub(crate) fn pid(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_pid_reads_as_dead() {
        let me = ProcessIdentity::current();
        let impostor = ProcessIdentity::from_parts(me.pid(), me.start_time() + 1);
        assert!(me.is_alive());
        assert!(!impostor.is_alive());
    }

    /// The trust window itself: a pinned exporter's "alive" answer is taken without asking the
    /// kernel while it is younger than `ALIVE_REUSE_NS`, and no longer. The clock is set by
    /// hand, with the pins locked throughout (the death of a child takes longer than the window
    /// to bring about, and other tests pin and unpin meanwhile), so the test fails with no
    /// trust at all and with trust for longer than the window.
    #[test]
    fn an_exporters_alive_answer_is_trusted_for_a_moment_only() {
        for _attempt in 0..20 {
            let (mut child, id) = sleeping_child();
            assert!(check_exporter_alive(&id, false).is_ok()); // pinned, confirmed now
            child.kill().unwrap();
            child.wait().unwrap();
            let mut pinned = PINNED.lock().unwrap();
            let Some(&(_, seen)) = pinned.get(&(id.pid, id.start_time, id.pidfs_ino)) else {
                continue; // another test's new pin let go of the dead one: again
            };
            // Dead now. Confirmed alive a moment before (well inside the window): trusted.
            assert!(
                judge_pinned(
                    &mut pinned,
                    &id,
                    ALIVE_REUSE_NS,
                    seen + ALIVE_REUSE_NS / 100
                ),
                "an answer 1 µs old is trusted (no trust at all?)"
            );
            // As old as the window: the kernel is asked afresh, and the process is dead.
            assert!(
                !judge_pinned(&mut pinned, &id, ALIVE_REUSE_NS, seen + ALIVE_REUSE_NS),
                "an answer as old as the window is not trusted (trust for longer?)"
            );
            drop(pinned);
            assert!(matches!(
                check_exporter_alive(&id, false),
                Err(Error::PeerGone { .. })
            ));
            return;
        }
        panic!("the dead child's pin was let go by other tests 20 times over");
    }

    #[test]
    fn the_pidfd_cache_sees_a_child_exit() {
        let (mut child, id) = sleeping_child();
        assert!(is_alive_cached(&id));
        assert!(is_alive_cached(&id)); // from the cache
        assert!(!is_alive_cached(&ProcessIdentity::from_parts(
            child.id(),
            id.start_time + 1
        )));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_alive_cached(&id));
    }

    /// A new pin lets go of the pins of processes that exited: the cache's descriptors are
    /// those of live processes, not of every process it checked.
    #[test]
    fn a_new_pin_lets_go_of_exited_ones() {
        let pinned = |id: &ProcessIdentity| {
            PINNED
                .lock()
                .unwrap()
                .contains_key(&(id.pid, id.start_time, id.pidfs_ino))
        };
        let (mut a, a_id) = sleeping_child();
        assert!(is_alive_cached(&a_id) && pinned(&a_id));
        a.kill().unwrap();
        a.wait().unwrap();
        let (mut b, b_id) = sleeping_child();
        assert!(is_alive_cached(&b_id) && pinned(&b_id));
        assert!(!pinned(&a_id), "the exited process's pidfd was let go");
        assert!(!is_alive_cached(&a_id), "and it is judged dead afresh");
        b.kill().unwrap();
        b.wait().unwrap();
    }

    /// `of_pid` identifies the process a pid names now — start time and pidfs inode — so an
    /// identity taken from a socket's peer pid does not carry over to a process that later
    /// reuses the pid (a bare pid, start time 0, would).
    #[test]
    fn an_identity_of_a_pid_is_that_process_not_the_pid() {
        assert_eq!(
            ProcessIdentity::of_pid(os::pid()),
            ProcessIdentity::current()
        );
        assert!(!ProcessIdentity::of_pid(0).is_alive());
        let (mut child, child_id) = sleeping_child();
        let id = ProcessIdentity::of_pid(child.id());
        assert_eq!(id.start_time(), child_id.start_time());
        assert!(id.start_time() != 0 && id.is_alive());
        // Another process at the same pid: what a reuse looks like (same pid, other start).
        let reused = ProcessIdentity::from_parts(id.pid(), id.start_time() + 1);
        assert!(!reused.is_alive());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!id.is_alive());
    }

    #[test]
    fn a_reused_pid_with_the_same_start_tick_reads_as_dead_by_its_pidfs_inode() {
        let me = ProcessIdentity::current();
        if me.pidfs_ino() == 0 {
            eprintln!("no pidfs on this kernel: covered by the start time only");
            return;
        }
        let impostor = ProcessIdentity::from_parts(me.pid(), me.start_time())
            .with_pidfs_ino(me.pidfs_ino() + 1);
        assert!(me.is_alive());
        assert!(!impostor.is_alive());
        // The loose comparison still matches when one side does not know the inode.
        assert!(ProcessIdentity::from_parts(me.pid(), me.start_time()).is_same_process(&me));
        assert!(!impostor.is_same_process(&me));
        assert_ne!(impostor, me);
    }

    /// `Eq` must be an equivalence: once an unknown inode matched any, so a == b and
    /// b == c held while a != c.
    #[test]
    fn equality_is_transitive() {
        let a = ProcessIdentity::from_parts(7, 9).with_pidfs_ino(1);
        let b = ProcessIdentity::from_parts(7, 9);
        let c = ProcessIdentity::from_parts(7, 9).with_pidfs_ino(2);
        assert_ne!(a, c);
        assert!(!(a == b && b == c), "a == b and b == c must imply a == c");
        assert!(a.is_same_process(&b) && b.is_same_process(&c) && !a.is_same_process(&c));
    }

    #[test]
    fn pid_zero_is_never_alive() {
        assert!(!ProcessIdentity::from_parts(0, 0).is_alive());
    }

    #[test]
    fn an_exited_child_reads_as_dead_even_before_it_is_reaped() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessIdentity::from_parts(child.id(), 0);
        // Until we wait on it, the exited child is a zombie that /proc still lists.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while id.is_alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!id.is_alive());
        child.wait().unwrap();
    }
}
