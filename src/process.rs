//! Process identities that survive pid reuse.
//!
//! A pid alone names a process only while it lives: once it exits, the kernel may hand the same
//! number to a new process, and `kill(pid, 0)` would then report the stranger as alive. A
//! [`ProcessIdentity`] pairs the pid with the process's start time (field 22 of
//! `/proc/<pid>/stat`) and, where the kernel has pidfs (Linux 6.9+), the process's pidfs inode
//! number. The start time is counted in clock ticks (10 ms), so a pid reused within the same
//! tick repeats it (a test forces exactly that); the pidfs inode is unique until reboot.

use crate::os;

/// A process named by pid and start time, as recorded in shared memory by the barrier and the
/// region header.
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
        // check re-reads after a fork (the child has a new pid and start time).
        static CACHE: std::sync::Mutex<Option<ProcessIdentity>> = std::sync::Mutex::new(None);
        let pid = os::pid();
        let mut cached = CACHE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *cached {
            Some(id) if id.pid == pid => id,
            _ => {
                let start_time = os::proc_stat(pid).map_or(0, |s| s.start_time);
                let pidfs_ino = os::pidfs_ino(pid).unwrap_or(0);
                let id = Self {
                    pid,
                    start_time,
                    pidfs_ino,
                };
                *cached = Some(id);
                id
            }
        }
    }

    /// Rebuild an identity from its parts (as read back from shared memory); the pidfs inode
    /// is unknown (add it with [`with_pidfs_ino`](Self::with_pidfs_ino)).
    pub fn from_parts(pid: u32, start_time: u64) -> Self {
        Self {
            pid,
            start_time,
            pidfs_ino: 0,
        }
    }

    /// The same identity with its pidfs inode number (0 for unknown).
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
    pub fn is_same_process(&self, other: &Self) -> bool {
        self.pid == other.pid
            && self.start_time == other.start_time
            && (self.pidfs_ino == 0 || other.pidfs_ino == 0 || self.pidfs_ino == other.pidfs_ino)
    }

    /// The pidfs inode number: unique per process until reboot (Linux 6.9+); 0 when unknown.
    pub fn pidfs_ino(&self) -> u64 {
        self.pidfs_ino
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The start time in clock ticks after boot (0 if it was unknown).
    pub fn start_time(&self) -> u64 {
        self.start_time
    }

    /// Whether this very process still runs: the pid exists, is not a zombie, and started at
    /// the recorded time; where the pidfs inode is known, the pid's current process must also
    /// have that inode, so a reused pid reads as dead even within one clock tick.
    ///
    /// Only a proven death reads as dead: when the kernel cannot be asked (`/proc` unreadable,
    /// no file descriptors left), the process counts as alive, because the crate frees shared
    /// memory and reaps slots on a death, and a guess there would be a use-after-free.
    /// A stopped process (`SIGSTOP`) is alive.
    pub fn is_alive(&self) -> bool {
        !self.is_proven_dead()
    }

    fn is_proven_dead(&self) -> bool {
        if self.pid == 0 {
            return true;
        }
        if self.pidfs_ino != 0 {
            match os::pidfd_open_checked(self.pid) {
                // No such process.
                Err(rustix::io::Errno::SRCH) => return true,
                // Another inode: the pid was reused.
                Ok(fd) if os::pidfd_ino(&fd).is_some_and(|ino| ino != self.pidfs_ino) => {
                    return true;
                }
                Ok(fd) if os::pidfd_exited(&fd) => return true,
                // Ours and running, or pidfds unusable here: ask /proc too.
                Ok(_) | Err(_) => {}
            }
        }
        match os::proc_stat_checked(self.pid) {
            Ok(None) => true,
            Ok(Some(st)) => {
                let exited = matches!(st.state, b'Z' | b'X' | b'x');
                let other = self.start_time != 0 && st.start_time != self.start_time;
                exited || other
            }
            // Could not tell: not a proof of death.
            Err(_) => false,
        }
    }
}

/// Liveness checks of the same processes over and over (an exporter, at every open of its
/// handles) cost a `/proc` read each. This cache pins each checked process with a pidfd, after
/// confirming through `/proc` that the pid still names the process that started at the recorded
/// time; later checks are a zero-timeout `poll` on the pidfd (pid reuse cannot fool a pidfd).
pub(crate) fn is_alive_cached(id: &ProcessIdentity) -> bool {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static PINNED: Mutex<BTreeMap<(u32, u64), rustix::fd::OwnedFd>> = Mutex::new(BTreeMap::new());
    const MAX_PINNED: usize = 256;

    let key = (id.pid, id.start_time);
    let mut pinned = PINNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(fd) = pinned.get(&key) {
        if !os::pidfd_exited(fd) {
            return true;
        }
        pinned.remove(&key);
        return false;
    }
    let Some(fd) = os::pidfd_open(id.pid) else {
        return id.is_alive();
    };
    // The pidfd names whatever process has the pid now: keep it only if that is ours.
    if !id.is_alive() {
        return false;
    }
    if pinned.len() >= MAX_PINNED {
        pinned.retain(|_, fd| !os::pidfd_exited(fd));
        if pinned.len() >= MAX_PINNED {
            pinned.clear();
        }
    }
    pinned.insert(key, fd);
    true
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

    #[test]
    fn the_pidfd_cache_sees_a_child_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let st = crate::os::proc_stat(child.id()).unwrap();
        let id = ProcessIdentity::from_parts(child.id(), st.start_time);
        assert!(is_alive_cached(&id));
        assert!(is_alive_cached(&id)); // from the cache
        assert!(!is_alive_cached(&ProcessIdentity::from_parts(
            child.id(),
            st.start_time + 1
        )));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_alive_cached(&id));
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

    /// `Eq` must be an equivalence: on 66d5eef an unknown inode matched any, so a == b and
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
