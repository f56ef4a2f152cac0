//! Linux backend: `/dev/shm` files, shared futexes, `/proc` process identities.
//!
//! The shared-memory calls are `open(2)` on `/dev/shm/<name>`, which is exactly what glibc's
//! `shm_open` does, with the flags spelled out so that `O_NOFOLLOW` and `O_EXCL` are visible here
//! rather than implied by a libc.

use std::fs::File;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::fs::{self, FallocateFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::thread::futex;

use crate::error::{Error, Result};

/// Where POSIX shared memory lives on Linux.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// The longest file name `/dev/shm` accepts (`NAME_MAX`).
pub(crate) const NAME_MAX: usize = 255;

fn shm_path(name: &str) -> String {
    format!("{SHM_DIR}/{name}")
}

/// What `fstat` says about a shared-memory file, reduced to what the open checks need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileInfo {
    /// `S_IFMT` bits.
    pub file_type: u32,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Device and inode: which file this is, to unlink only our own.
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
}

impl FileInfo {
    /// `S_IFREG`.
    pub(crate) fn is_regular(&self) -> bool {
        FileType::from_raw_mode(self.file_type) == FileType::RegularFile
    }

    /// `S_IFSOCK`.
    pub(crate) fn is_socket(&self) -> bool {
        FileType::from_raw_mode(self.file_type) == FileType::Socket
    }
}

fn info_of(st: &fs::Stat) -> FileInfo {
    FileInfo {
        file_type: st.st_mode & libc_s_ifmt(),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        size: u64::try_from(st.st_size).unwrap_or(0),
        dev: st.st_dev,
        ino: st.st_ino,
    }
}

const fn libc_s_ifmt() -> u32 {
    0o170000
}

/// Create `/dev/shm/<name>` exclusively with mode exactly `0600` and `len` bytes reserved.
///
/// The file is created with `O_CREAT|O_EXCL|O_NOFOLLOW`, then `fchmod`ed so that the umask cannot
/// take the owner's bits away, then `fallocate`d so that a full `/dev/shm` fails here with
/// `NoSpace` instead of killing the process with `SIGBUS` on first touch. On any failure after
/// the create, the name is unlinked again.
pub(crate) fn shm_create(name: &str, len: u64) -> Result<(File, FileInfo)> {
    let path = shm_path(name);
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = fs::open(&path, flags, Mode::RUSR | Mode::WUSR)
        .map_err(|e| Error::from_os("open(O_CREAT|O_EXCL)", name, e))?;
    let finish = || -> Result<FileInfo> {
        fs::fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(|e| Error::from_os("fchmod", name, e))?;
        match fs::fallocate(&fd, FallocateFlags::empty(), 0, len) {
            Ok(()) => {}
            Err(Errno::NOSPC) => {
                return Err(Error::NoSpace {
                    name: name.to_owned(),
                    len,
                });
            }
            // A filesystem without fallocate: size it, accepting the SIGBUS risk it cannot avoid.
            Err(Errno::OPNOTSUPP) => {
                fs::ftruncate(&fd, len).map_err(|e| Error::from_os("ftruncate", name, e))?
            }
            Err(e) => return Err(Error::from_os("fallocate", name, e)),
        }
        file_info(&fd, name)
    };
    match finish() {
        Ok(info) => Ok((File::from(fd), info)),
        Err(e) => {
            // The name is ours (O_EXCL succeeded): take it back so a failed create leaves nothing.
            let _ = fs::unlink(&path);
            Err(e)
        }
    }
}

/// Open an existing `/dev/shm/<name>` read-write without following a symbolic link.
pub(crate) fn shm_open(name: &str) -> Result<(File, FileInfo)> {
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = fs::open(shm_path(name), flags, Mode::empty())
        .map_err(|e| Error::from_os("open", name, e))?;
    let info = file_info(&fd, name)?;
    Ok((File::from(fd), info))
}

/// The names in `/dev/shm` (those that are not UTF-8 cannot be the crate's and are skipped):
/// what the sweeps and the inspector walk.
pub(crate) fn shm_names() -> Result<Vec<String>> {
    let dir = std::fs::read_dir(SHM_DIR).map_err(|source| Error::Os {
        call: "opendir",
        name: SHM_DIR.to_owned(),
        source,
    })?;
    Ok(dir
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect())
}

/// Open an existing `/dev/shm/<name>` **read-only** without following a symbolic link (the
/// inspector's open: it can neither write a peer's region nor keep it from being unlinked).
pub(crate) fn shm_open_read_only(name: &str) -> Result<(File, FileInfo)> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = fs::open(shm_path(name), flags, Mode::empty())
        .map_err(|e| Error::from_os("open", name, e))?;
    let info = file_info(&fd, name)?;
    Ok((File::from(fd), info))
}

/// Read `len` bytes from the start of `file` into a new buffer (`pread`, so the bytes are a
/// copy: a peer's later writes do not reach it, and a file that shrank ends the read short
/// instead of raising `SIGBUS` as a mapping would). Returns the bytes read.
pub(crate) fn read_copy(file: &File, len: usize, name: &str) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match rustix::io::pread(file, &mut buf[done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(Error::from_os("pread", name, e)),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// `fstat` of an open shared-memory file.
pub(crate) fn shm_fstat(file: &File, name: &str) -> Result<FileInfo> {
    let st = fs::fstat(file).map_err(|e| Error::from_os("fstat", name, e))?;
    Ok(info_of(&st))
}

fn file_info(fd: &OwnedFd, name: &str) -> Result<FileInfo> {
    let st = fs::fstat(fd).map_err(|e| Error::from_os("fstat", name, e))?;
    Ok(info_of(&st))
}

/// `lstat` of `/dev/shm/<name>`, never following a link.
pub(crate) fn shm_lstat(name: &str) -> Result<FileInfo> {
    let st = fs::lstat(shm_path(name)).map_err(|e| Error::from_os("lstat", name, e))?;
    Ok(info_of(&st))
}

/// Unlink `/dev/shm/<name>` if it is still the file `(dev, ino)`; returns whether it unlinked.
///
/// Someone may have unlinked our region and created another under the same name; that one is
/// not ours to remove. (A window remains between the `lstat` and the `unlink`; only a process of
/// our own uid can race it, and such a process can unlink the name anyway.)
pub(crate) fn shm_unlink_if_same(name: &str, dev: u64, ino: u64) -> Result<bool> {
    match shm_lstat(name) {
        Ok(info) if info.dev == dev && info.ino == ino => {
            fs::unlink(shm_path(name)).map_err(|e| Error::from_os("unlink", name, e))?;
            Ok(true)
        }
        Ok(_) | Err(Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Unlink `/dev/shm/<name>` unconditionally.
pub(crate) fn shm_unlink(name: &str) -> Result<()> {
    fs::unlink(shm_path(name)).map_err(|e| Error::from_os("unlink", name, e))
}

/// Our effective uid.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Our process id.
pub(crate) fn pid() -> u32 {
    rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs()
}

/// Eight random bytes from the kernel (`getrandom`).
pub(crate) fn random_u64() -> Result<u64> {
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(e) => {
                return Err(Error::Os {
                    call: "getrandom",
                    name: String::new(),
                    source: std::io::Error::from_raw_os_error(e.raw_os_error()),
                });
            }
        }
    }
    Ok(u64::from_ne_bytes(buf))
}

/// `d` as the kernel's timespec (a duration past `i64::MAX` seconds saturates).
pub(crate) fn timespec(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// Sleep on a shared (not `FUTEX_PRIVATE`) futex while `*word == expected`, at most `timeout`.
///
/// Returns on wake-up, timeout, signal, or a value mismatch alike: the caller re-checks its
/// condition in every case.
#[cfg_attr(cuda_ipc_loom, allow(dead_code))]
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = timespec(timeout);
    // Every outcome (woken, ETIMEDOUT, EAGAIN on mismatch, EINTR) means "look again".
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wake every process sleeping on `word` (a shared futex).
#[cfg_attr(cuda_ipc_loom, allow(dead_code))]
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    // FUTEX_WAKE on a valid mapped address cannot fail in a way the caller could act on.
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX.unsigned_abs());
}

/// A pidfd for `pid` (`pidfd_open`), or `None` where the kernel or sandbox refuses it.
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    pidfd_open_checked(pid).ok()
}

/// [`pidfd_open`] keeping the reason: `ESRCH` means no such process (the only answer that proves
/// a death); anything else (`EMFILE`, `ENOSYS`, a seccomp `EPERM`) says nothing about it.
pub(crate) fn pidfd_open_checked(pid: u32) -> std::result::Result<OwnedFd, Errno> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or(Errno::SRCH)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
}

/// A copy of descriptor `fd` of process `pid` (`pidfd_open`, then `pidfd_getfd`, close-on-exec
/// as the kernel makes it). Needs ptrace-attach permission over `pid`.
pub(crate) fn pidfd_getfd(pid: u32, fd: i32) -> std::result::Result<OwnedFd, Errno> {
    let pidfd = pidfd_open_checked(pid)?;
    rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())
}

/// The pidfs inode number of process `pid`: on Linux 6.9 and later every process has one, unique
/// until reboot, so unlike a pid it is never handed to another process. `None` where pidfds are
/// unavailable or share one anonymous inode (older kernels), or `pid` does not exist.
pub(crate) fn pidfs_ino(pid: u32) -> Option<u64> {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ino_of = |pid: u32| pidfd_ino(&pidfd_open(pid)?);
    let supported = *SUPPORTED.get_or_init(|| {
        let me = ino_of(self::pid());
        let parent = rustix::process::getppid()
            .and_then(|p| u32::try_from(p.as_raw_nonzero().get()).ok())
            .and_then(ino_of);
        matches!((me, parent), (Some(a), Some(b)) if a != b)
    });
    if supported { ino_of(pid) } else { None }
}

/// The pidfs inode number of the process behind a pidfd (see [`pidfs_ino`]).
pub(crate) fn pidfd_ino(fd: &OwnedFd) -> Option<u64> {
    fs::fstat(fd).ok().map(|st| st.st_ino)
}

/// Whether the process behind a pidfd has exited (the fd polls readable once it has).
pub(crate) fn pidfd_exited(fd: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&zero)) {
        Ok(n) => n > 0 && fds[0].revents().contains(PollFlags::IN),
        Err(_) => false,
    }
}

/// How many threads `/proc/<pid>/task` lists: `Ok(None)` when the process is gone, `Err` when
/// `/proc` cannot tell. A thread-group leader that exited while other threads run is a zombie
/// (`Z` in `stat`) and still listed with them, so a count above 1 proves the group alive.
pub(crate) fn proc_task_count(pid: u32) -> std::io::Result<Option<usize>> {
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(dir) => {
            let mut n = 0usize;
            for entry in dir {
                entry?;
                n = n.saturating_add(1);
            }
            Ok(Some(n))
        }
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(Errno::SRCH.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The pids of this user's processes (`/proc/<pid>` owned by our euid).
pub(crate) fn own_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let euid = euid();
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| fs::stat(format!("/proc/{pid}")).is_ok_and(|st| st.st_uid == euid))
        .collect()
}

/// The `/dev/shm` names process `pid` maps whose files were removed (`(deleted)` in
/// `/proc/<pid>/maps`), each once, with the address range of one of its mappings
/// (`start-end` in hex, as `/proc/<pid>/map_files/` names it); empty when the maps cannot be
/// read.
pub(crate) fn unlinked_shm_mappings(pid: u32) -> Vec<(String, String)> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let prefix = format!("{SHM_DIR}/");
    let mut names: Vec<(String, String)> = maps
        .lines()
        .filter_map(|line| {
            let path = line.split_once(&prefix)?.1;
            let range = line.split_whitespace().next()?;
            Some((
                path.strip_suffix(" (deleted)")?.to_owned(),
                range.to_owned(),
            ))
        })
        .collect();
    names.sort();
    names.dedup_by(|a, b| a.0 == b.0);
    names
}

/// Open, read-only, the file behind process `pid`'s mapping at `range` (`start-end`, from
/// [`unlinked_shm_mappings`]) through `/proc/<pid>/map_files/`: a removed file's bytes, while
/// the process maps it. The kernel allows it only with `CAP_CHECKPOINT_RESTORE` or
/// `CAP_SYS_ADMIN` (root): elsewhere an error.
///
/// # Errors
///
/// [`Error::Os`] naming `open` (`EPERM` without the capability, `ENOENT` once unmapped) or
/// `fstat`.
pub(crate) fn open_mapped_file(pid: u32, range: &str) -> Result<(File, FileInfo)> {
    let path = format!("/proc/{pid}/map_files/{range}");
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = fs::open(&path, flags, Mode::empty()).map_err(|e| Error::from_os("open", &path, e))?;
    let info = file_info(&fd, &path)?;
    Ok((File::from(fd), info))
}

/// A process's command line from `/proc/<pid>/cmdline`, its arguments joined by spaces and cut
/// to `max` characters; `None` when unreadable or empty (a kernel thread, a zombie).
pub(crate) fn command_line(pid: u32, max: usize) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let line: String = String::from_utf8_lossy(&bytes)
        .split('\0')
        .filter(|arg| !arg.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let cut: String = line.chars().take(max).collect();
    (!cut.is_empty()).then_some(cut)
}

/// What `/proc/<pid>/stat` says about a process: its state letter and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `T`, `Z` (zombie), `X` (dead), ...
    pub state: u8,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
}

/// Read `/proc/<pid>/stat`; `None` when there is no such process.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    proc_stat_checked(pid).ok().flatten()
}

/// [`proc_stat`] telling "no such process" (`Ok(None)`: the file is gone, `ENOENT`/`ESRCH`)
/// apart from "could not tell" (`Err`: `/proc` unreadable, fd limit, unparsable line).
pub(crate) fn proc_stat_checked(pid: u32) -> std::io::Result<Option<ProcStat>> {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_proc_stat(&text)
            .map(Some)
            .ok_or_else(|| std::io::Error::other("unparsable /proc/<pid>/stat")),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(Errno::SRCH.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Parse the `stat` line. The command name (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so the fields after it are found from the last `)`.
pub(crate) fn parse_proc_stat(text: &[u8]) -> Option<ProcStat> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(text.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // fields now starts at field 3 (state); start time is field 22, i.e. 19 further on.
    let state = *fields.next()?.as_bytes().first()?;
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

/// `/proc/sys/kernel/random/boot_id` as 16 bytes (read once); all zero when unreadable.
pub(crate) fn boot_id() -> [u8; 16] {
    static ID: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *ID.get_or_init(read_boot_id)
}

fn read_boot_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        for (i, pair) in hex.chunks_exact(2).take(16).enumerate() {
            let s = std::str::from_utf8(pair).unwrap_or("00");
            id[i] = u8::from_str_radix(s, 16).unwrap_or(0);
        }
    }
    id
}

/// The parent process's pid (`getppid`).
pub(crate) fn parent_pid() -> u32 {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get().unsigned_abs())
}

/// What [`crate::probe::probe()`] asks of the host: facts read from `/proc`, `/sys` and the file
/// system, each `None` where it could not be read.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostFacts {
    /// `/dev/shm`: total and available bytes (`statvfs`).
    pub(crate) shm_space: Option<(u64, u64)>,
    /// `/proc/sys/kernel/yama/ptrace_scope`.
    pub(crate) ptrace_scope: Option<u32>,
    /// The `NSpid` line of `/proc/self/status`: this process's pid in each pid namespace, the
    /// outermost first.
    pub(crate) ns_pids: Option<Vec<u32>>,
    /// Signs of a container: marker files, the `container` variable, cgroup paths.
    pub(crate) container: Vec<String>,
    /// `/proc/driver/nvidia/version`'s first line.
    pub(crate) nvidia_driver: Option<String>,
}

pub(crate) fn host_facts() -> HostFacts {
    let shm_space = fs::statvfs("/dev/shm").ok().map(|v| {
        let unit = v.f_frsize.max(1);
        (
            v.f_blocks.saturating_mul(unit),
            v.f_bavail.saturating_mul(unit),
        )
    });
    let ptrace_scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let ns_pids = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| parse_ns_pids(&t));
    let mut container = Vec::new();
    for (path, what) in [
        ("/.dockerenv", "/.dockerenv exists (Docker)"),
        ("/run/.containerenv", "/run/.containerenv exists (Podman)"),
    ] {
        if std::path::Path::new(path).exists() {
            container.push(what.to_owned());
        }
    }
    if let Some(v) = std::env::var_os("container") {
        container.push(format!("container={}", v.to_string_lossy()));
    }
    if let Ok(cgroup) = std::fs::read_to_string("/proc/self/cgroup") {
        for hint in ["docker", "kubepods", "containerd", "libpod", "lxc"] {
            if cgroup.contains(hint) {
                container.push(format!("cgroup path mentions {hint}"));
            }
        }
    }
    let nvidia_driver = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        });
    HostFacts {
        shm_space,
        ptrace_scope,
        ns_pids,
        container,
        nvidia_driver,
    }
}

/// The pids of the `NSpid:` line of a `/proc/PID/status` text.
pub(crate) fn parse_ns_pids(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_whitespace()
        .map(|p| p.parse().ok())
        .collect()
}

/// Run `hook` when the process exits normally (`atexit`); whether it was registered.
///
/// # Safety
///
/// `hook` must not unwind and must not call `exit`.
pub(crate) unsafe fn at_exit(hook: extern "C" fn()) -> bool {
    // SAFETY: `atexit` only stores the pointer; the caller vouches for what `hook` does.
    unsafe { libc::atexit(hook) == 0 }
}

/// Run `hook` in every child this process forks, before `fork` returns there
/// (`pthread_atfork`'s child handler); whether it was registered.
///
/// # Safety
///
/// `hook` must not unwind and must be async-signal-safe (it runs in a child of a possibly
/// multi-threaded process).
pub(crate) unsafe fn in_forked_children(hook: extern "C" fn()) -> bool {
    // SAFETY: `pthread_atfork` only stores the pointer; the caller vouches for what `hook` does.
    unsafe { libc::pthread_atfork(None, None, Some(hook)) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pids_of_each_namespace() {
        let status = "Name:\tx\nNSpid:\t4242\t17\t1\nPPid:\t1\n";
        assert_eq!(parse_ns_pids(status), Some(vec![4242, 17, 1]));
        assert_eq!(parse_ns_pids("Name: x\n"), None);
        assert_eq!(parse_ns_pids("NSpid:\tx\n"), None);
    }

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line = b"1234 (a) b (c)) S 1 1234 1234 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100 0";
        let st = parse_proc_stat(line).unwrap();
        assert_eq!(st.state, b'S');
        assert_eq!(st.start_time, 987654);
    }

    #[test]
    fn rejects_truncated_stat() {
        assert_eq!(parse_proc_stat(b"1234 (x) S 1 2"), None);
        assert_eq!(parse_proc_stat(b""), None);
        assert_eq!(parse_proc_stat(b"no parens at all"), None);
    }

    #[test]
    fn own_stat_is_readable_and_alive() {
        let st = proc_stat(pid()).unwrap();
        assert!(
            matches!(st.state, b'R' | b'S' | b'D'),
            "{}",
            st.state as char
        );
        assert!(st.start_time > 0);
    }

    #[test]
    fn boot_id_is_not_zero() {
        assert_ne!(boot_id(), [0u8; 16]);
    }
}
