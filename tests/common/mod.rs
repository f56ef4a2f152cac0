//! Multi-process test harness: re-execute this test binary with a role (never `fork` without
//! `exec`), reap every child, and never let a test hang.
//!
//! A test binary that uses it defines one dispatcher test,
//!
//! ```ignore
//! #[test]
//! fn child_process() {
//!     common::child_main(|role, args| match role { ... });
//! }
//! ```
//!
//! which does nothing in a normal run and, in a child started by [`spawn`], runs the role and
//! exits with its status. Binaries without libtest (`harness = false`: the benches, through
//! `benches/common/mod.rs`, which includes this file) start helpers with [`spawn_helper`] and
//! read their role in `main` with [`helper_role`]: the same environment, no test filter.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Kernels and streams without cust (cudarc's driver calls, PTX loaded at run time): the same
/// file the examples use.
#[path = "../../examples/common/cuda.rs"]
pub mod cuda;

const ROLE_ENV: &str = "CUDA_IPC_TEST_ROLE";
const ARGS_ENV: &str = "CUDA_IPC_TEST_ARGS";
const DISPATCHER: &str = "child_process";

/// How long a child may live before its own watchdog ends it.
pub const CHILD_LIFETIME: Duration = Duration::from_secs(60);

/// A name no other test (or test run) uses.
pub fn unique_name(test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "cuda-ipc-test-{test}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A file of its own in the temporary directory, for a child to write lines to the parent
/// (a channel's name, say) with [`read_mailbox`].
pub fn mailbox(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(unique_name(tag))
}

/// The lines a child wrote to `path` once it has written `n` whole ones (then the file is
/// removed); fails the test after `within`.
pub fn read_mailbox(path: &std::path::Path, n: usize, within: Duration) -> Vec<String> {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.lines().count() >= n
            && text.ends_with('\n')
        {
            let _ = std::fs::remove_file(path);
            return text.lines().map(str::to_owned).collect();
        }
        assert!(
            start.elapsed() < within,
            "{} lines in {} within {within:?}",
            n,
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// In a child or helper: its role and arguments; `None` in the process that started it.
pub fn helper_role() -> Option<(String, Vec<String>)> {
    let role = std::env::var(ROLE_ENV).ok()?;
    let args = std::env::var(ARGS_ENV)
        .unwrap_or_default()
        .split('\x1f')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    Some((role, args))
}

/// The environment variable that makes [`child_main`] run the role with the child's main
/// thread gone ([`with_main_thread_gone`]); [`spawn_without_main_thread`] sets it.
const NO_MAIN_THREAD_ENV: &str = "CUDA_IPC_TEST_NO_MAIN_THREAD";

/// In a child: run `role` with its arguments and exit with the returned code (with its main
/// thread exited first when started by [`spawn_without_main_thread`]). In the parent test run:
/// return at once.
pub fn child_main(run: impl FnOnce(&str, &[String]) -> i32 + Send + 'static) {
    let Some((role, args)) = helper_role() else {
        return;
    };
    // A child must never outlive a broken test.
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        eprintln!("child watchdog: exceeded {CHILD_LIFETIME:?}, exiting");
        exit_child(97);
    });
    if std::env::var_os(NO_MAIN_THREAD_ENV).is_some() {
        with_main_thread_gone(move || run(&role, &args));
    }
    let code = run(&role, &args);
    exit_child(code);
}

/// End a child process with `code` from whichever thread it runs on: stdout and stderr
/// flushed, the `atexit` hooks run (the crate's among them), and no more.
///
/// Not `std::process::exit`: called off the main thread (a role runs on libtest's test thread),
/// its runtime cleanup unmaps the *main* thread's signal stack while that thread lives, and
/// glibc runs its `setuid` broadcast handler (`SIGSETXID`, `SA_ONSTACK`) on that stack; a role
/// that dropped privileges a moment before exiting was seen to die of `SIGSEGV` in 15 of 2,000
/// runs (a core showed the main thread in `__nptl_setxid_sighandler` on the unmapped stack).
/// One lock keeps two threads (a role and the child watchdog) from calling `exit` at once,
/// which glibc does not make safe.
pub fn exit_child(code: i32) -> ! {
    use std::io::Write;
    static EXITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _only_one = EXITING.lock();
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `exit` runs the atexit hooks and ends the process; the lock above keeps a second
    // thread of this process from entering it concurrently.
    unsafe { libc::exit(code) }
}

/// [`spawn`] a child whose main thread exits before the role runs on another thread: its
/// leader reads `Z` in `/proc/<pid>/stat` while the process lives, as after `pthread_exit` in
/// `main`. Every stress test runs some of its children this way.
pub fn spawn_without_main_thread(role: &str, args: &[&str]) -> Child {
    spawn_env(role, args, &[(NO_MAIN_THREAD_ENV, "1")])
}

/// A child process, killed and reaped on drop if the test did not wait for it.
pub struct Child {
    inner: std::process::Child,
    role: String,
    reaped: bool,
}

/// Start this test binary as a child running `role`.
pub fn spawn(role: &str, args: &[&str]) -> Child {
    spawn_env(role, args, &[])
}

/// [`spawn`] with extra environment variables.
pub fn spawn_env(role: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    spawn_as(&[], role, args, env)
}

/// [`spawn`] under a wrapper command, such as `["unshare", "--pid", "--fork"]`: the wrapper
/// runs this test binary as its last arguments (as root, to put the child in new namespaces).
pub fn spawn_wrapped(wrapper: &[&str], role: &str, args: &[&str]) -> Child {
    assert!(!wrapper.is_empty(), "a wrapper command");
    spawn_as(wrapper, role, args, &[])
}

/// The one builder of a test child: this test binary (under `wrapper`, if any, followed by
/// `--`), dispatched to `role` with `args`, `env` added.
fn spawn_as(wrapper: &[&str], role: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut command = match wrapper.split_first() {
        None => Command::new(exe),
        Some((program, before)) => {
            let mut command = Command::new(program);
            command.args(before).arg("--").arg(exe);
            command
        }
    };
    command
        .envs(env.iter().copied())
        .args([
            DISPATCHER,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(ROLE_ENV, role)
        .env(ARGS_ENV, args.join("\x1f"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Child::start(
        &mut command,
        role,
        &format!("child {role} (wrapper {wrapper:?})"),
    )
}

/// Start another program (`python3`, say) as a test child: its output piped as a role's is,
/// killed and reaped on drop.
pub fn spawn_program(program: &str, args: &[&str]) -> Child {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Child::start(&mut command, program, program)
}

/// Start this `harness = false` binary again as a helper running `role` (its `main` reads
/// [`helper_role`]), its output going to ours; killed and reaped on drop.
pub fn spawn_helper(role: &str, args: &[&str]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut command = Command::new(exe);
    command
        .env(ROLE_ENV, role)
        .env(ARGS_ENV, args.join("\x1f"))
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    Child::start(&mut command, role, "helper")
}

impl Child {
    /// Spawn `command` as the child named `role` (`what` names it if the spawn fails).
    fn start(command: &mut Command, role: &str, what: &str) -> Child {
        let inner = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Child {
            inner,
            role: role.to_owned(),
            reaped: false,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// Send a signal (`libc::SIGKILL`, `SIGSTOP`, `SIGCONT`).
    pub fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.pid()).expect("pid");
        // SAFETY: kill(2) on our own unreaped child's pid: it cannot be reused before we reap.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig})");
    }

    /// Wait for exit, at most `limit` (then kill it and fail the test). Returns the status
    /// and the lines the child printed that start with `RESULT `.
    pub fn wait(self, limit: Duration) -> (ExitStatus, Vec<String>) {
        let (status, out) = self.wait_output(limit);
        let results = out
            .lines()
            .filter_map(|l| l.strip_prefix("RESULT "))
            .map(str::to_owned)
            .collect();
        (status, results)
    }

    /// [`wait`](Self::wait), returning everything the child printed on its standard output.
    pub fn wait_output(mut self, limit: Duration) -> (ExitStatus, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.inner.try_wait().expect("try_wait") {
                self.reaped = true;
                let mut out = String::new();
                if let Some(mut stdout) = self.inner.stdout.take() {
                    let _ = stdout.read_to_string(&mut out);
                }
                return (status, out);
            }
            if start.elapsed() > limit {
                let _ = self.inner.kill();
                let _ = self.inner.wait();
                self.reaped = true;
                panic!("child {:?} did not exit within {limit:?}", self.role);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Wait for the child and fail the test unless it exited 0 or was killed by `SIGKILL` (the
    /// test's, or its own [`die`]): a crash (`SIGSEGV`, `SIGBUS`, `SIGABRT`), a panic (101) or
    /// any other code fails, with what the child printed.
    pub fn expect_exit_or_kill(self, limit: Duration) -> ExitStatus {
        let role = self.role.clone();
        let (status, out) = self.wait_output(limit);
        assert!(
            exited_or_killed(status),
            "child {role:?} ended neither with exit 0 nor by SIGKILL: {status}; it printed:\n{out}"
        );
        status
    }

    /// Wait for a successful exit and return its `RESULT` lines.
    pub fn expect_success(self, limit: Duration) -> Vec<String> {
        let role = self.role.clone();
        let (status, results) = self.wait(limit);
        assert!(
            status.success(),
            "child {role:?} failed: {status}; results {results:?}"
        );
        results
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.inner.kill();
            let _ = self.inner.wait();
        }
    }
}

/// The children of one role that a random-kill stress test keeps running: slot `k` always
/// holds a process started by `start(k)`; the test kills members at random
/// ([`kill_and_replace`](Self::kill_and_replace)), members may kill themselves
/// ([`replace_dead`](Self::replace_dead)), and at the end every member must have exited 0 or
/// by `SIGKILL` ([`finish`](Self::finish)); a crash by any other signal fails the test.
pub struct Crew<F: Fn(usize) -> Child> {
    members: Vec<Child>,
    start: F,
    /// What a member is, for failure messages ("an importer").
    what: &'static str,
    /// Members killed by [`kill_and_replace`](Self::kill_and_replace).
    pub kills: u32,
}

impl<F: Fn(usize) -> Child> Crew<F> {
    /// Start `n` members.
    pub fn start(n: usize, what: &'static str, start: F) -> Self {
        Self {
            members: (0..n).map(&start).collect(),
            start,
            what,
            kills: 0,
        }
    }

    /// `SIGKILL` member `k` wherever it is, reap it, and start another in its place. The old
    /// member must have ended by that kill or exited 0 before it ([`exited_or_killed`]).
    pub fn kill_and_replace(&mut self, k: usize) {
        self.members[k].signal(libc::SIGKILL);
        let old = std::mem::replace(&mut self.members[k], (self.start)(k));
        old.expect_exit_or_kill(Duration::from_secs(10));
        self.kills += 1;
    }

    /// Reap and replace the members that died by themselves; each must have exited 0 or
    /// killed itself with `SIGKILL` ([`die`]).
    pub fn replace_dead(&mut self) {
        for k in 0..self.members.len() {
            if !pid_running(self.members[k].pid()) {
                let old = std::mem::replace(&mut self.members[k], (self.start)(k));
                old.expect_exit_or_kill(Duration::from_secs(10));
            }
        }
    }

    /// Wait for every member (told to stop by the test); each must exit 0 or have ended by
    /// `SIGKILL`.
    pub fn finish(self) {
        for child in self.members {
            child.expect_exit_or_kill(Duration::from_secs(20));
        }
    }
}

/// What a stress test accepts of a child: exit 0, or death by `SIGKILL` (the only signal the
/// tests send or a child sends itself). Any other signal is a crash the test must report.
pub fn exited_or_killed(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.code() == Some(0) || status.signal() == Some(libc::SIGKILL)
}

/// A child's report: print one line the parent collects.
pub fn report(line: impl std::fmt::Display) {
    println!("RESULT {line}");
}

/// Aborts the whole test process if not disarmed within `limit`: no test can hang CI.
pub struct Watchdog {
    armed: Arc<AtomicBool>,
}

pub fn watchdog(what: &'static str, limit: Duration) -> Watchdog {
    let armed = Arc::new(AtomicBool::new(true));
    let flag = armed.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < limit {
            if !flag.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if flag.load(Ordering::Relaxed) {
            eprintln!("watchdog: test {what:?} exceeded {limit:?}; aborting");
            std::process::abort();
        }
    });
    Watchdog { armed }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.armed.store(false, Ordering::Relaxed);
    }
}

/// System-wide monotonic clock in nanoseconds (comparable between processes).
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Poll `cond` until true, at most `limit` (then fail the test).
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `/dev/shm/<name>` exists (as any file type).
pub fn shm_exists(name: &str) -> bool {
    std::fs::symlink_metadata(format!("/dev/shm/{name}")).is_ok()
}

/// Device 0's context for a GPU test; fails loudly without a GPU (GPU tests run only when
/// asked for with `--include-ignored`).
pub fn gpu() -> cuda_ipc::GpuContext {
    match cuda_ipc::GpuContext::new(0) {
        Ok(ctx) => ctx,
        Err(e) => panic!("this GPU test needs a CUDA device and found none: {e}"),
    }
}

/// Poll the device's free memory (`mem_info`) until it is within `slack` bytes of `target`, at
/// most `limit`: `Ok` once it is, else `Err` with the last free reading.
pub fn free_memory_reaches(
    ctx: &cuda_ipc::GpuContext,
    target: usize,
    slack: usize,
    limit: Duration,
) -> Result<(), usize> {
    let deadline = Instant::now() + limit;
    loop {
        let (free, _) = ctx.mem_info().unwrap();
        if free + slack >= target {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(free);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Number of GPUs visible (panics without a GPU).
pub fn gpu_count() -> u32 {
    match cuda_ipc::device::device_count() {
        Ok(n) => n,
        Err(e) => panic!("this GPU test needs a CUDA device and found none: {e}"),
    }
}

/// Skip the test (or the part of one) named `what` because of `why`, **visibly**: print
/// `SKIPPED <what>: <why>`, and append that line to the file `CUDA_IPC_SKIP_LOG` names (one
/// `write` per line, so parallel tests never interleave), which `.ci/gpu-check` lists by name
/// and counts apart from the passes. A skip is never a pass.
pub fn skip(what: &str, why: &str) {
    use std::io::Write;
    eprintln!("SKIPPED {what}: {why}");
    if let Some(path) = std::env::var_os("CUDA_IPC_SKIP_LOG") {
        let line = format!("{what}: {why}\n");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        if let Ok(mut file) = file {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// Whether this machine shows `n` GPUs, for the test (or the part of one) named `what`.
/// Without them the test is **skipped, visibly** ([`skip`]) — unless
/// `CUDA_IPC_REQUIRE_GPUS` asks for at least `n` GPUs, which makes their absence a failure.
/// (The GPU check sets it to the machine's count, so a regression that hid a GPU fails.)
pub fn has_gpus(n: u32, what: &str) -> bool {
    let visible = gpu_count();
    if visible >= n {
        return true;
    }
    let required: u32 = std::env::var("CUDA_IPC_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        required < n,
        "{what}: needs {n} GPUs, {visible} visible, and CUDA_IPC_REQUIRE_GPUS={required}"
    );
    skip(what, &format!("needs {n} GPUs, {visible} visible"));
    false
}

/// Whether a context on device `from` can map memory of device `to` (peer access), for the
/// test named `what`; `false` (with a visible `SKIPPED`) where it cannot. The crate's answer
/// (`can_access_peer`) is checked against the machine's own (`nvidia-smi topo -p2p r`, when
/// nvidia-smi is there and `CUDA_VISIBLE_DEVICES` does not renumber the devices): a
/// disagreement fails the test, so a regression in the crate's check cannot skip the tests
/// that depend on it.
pub fn peers(from: u32, to: u32, what: &str) -> bool {
    let crate_says = cuda_ipc::device::can_access_peer(from, to).unwrap();
    if let Some(machine_says) = machine_peer_access(from, to) {
        assert_eq!(
            crate_says, machine_says,
            "{what}: can_access_peer({from}, {to}) = {crate_says}, nvidia-smi topo says {machine_says}"
        );
    }
    if !crate_says {
        skip(
            what,
            &format!("device {from} cannot reach device {to} (peer access)"),
        );
    }
    crate_says
}

/// What `nvidia-smi topo -p2p r` says of reads from device `from` to device `to` (`OK` or
/// not), or `None` when it cannot be asked or the numbering may differ from ours.
fn machine_peer_access(from: u32, to: u32) -> Option<bool> {
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return None;
    }
    let out = Command::new("nvidia-smi")
        .args(["topo", "-p2p", "r"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let row = text
        .lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .find(|cols| cols.first() == Some(&format!("GPU{from}").as_str()))?;
    let cell = row.get(1 + to as usize)?;
    Some(*cell == "OK" || *cell == "X")
}

/// Open files of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Entries in /dev/shm whose name starts with `prefix`.
pub fn shm_entries(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// [`shm_entries`] without this process's export registry, which lives until the process exits
/// (created at its first export of a buffer or signal).
pub fn shm_entries_but_registry(prefix: &str) -> Vec<String> {
    let ours = cuda_ipc::__private::registry::names();
    shm_entries(prefix)
        .into_iter()
        .filter(|n| !ours.contains(n))
        .collect()
}

/// Whether `pid` names a running process, read from `/proc` (a killed child that its parent has
/// not reaped yet is a zombie, which reads as dead): for shadow records that hold bare pids.
/// A zombie *leader* whose other threads still run ([`with_main_thread_gone`]) is running: its
/// `/proc/<pid>/task` lists them.
pub fn pid_running(pid: u32) -> bool {
    match proc_state(pid) {
        None | Some('X') => false,
        Some('Z') => std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() > 1),
        Some(_) => true,
    }
}

/// Whether `pid`'s main thread (the thread-group leader) has exited: `/proc/<pid>/stat` says `Z`.
pub fn leader_is_zombie(pid: u32) -> bool {
    proc_state(pid) == Some('Z')
}

/// The state letter of `/proc/<pid>/stat` (the first field after the command's closing
/// parenthesis, which may itself contain parentheses); `None` when there is no such process.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

/// In a child: end this process's **main thread** and run `role` on another, then exit the
/// process with its code — a process whose leader exited while other threads run, as after
/// `pthread_exit` in `main` (or some language runtimes): `/proc/<pid>/stat` says `Z` until the
/// last thread exits, yet the process lives and maps memory. `role` starts only once the
/// leader reads as a zombie.
pub fn with_main_thread_gone(role: impl FnOnce() -> i32 + Send + 'static) -> ! {
    extern "C" fn exit_this_thread(_: libc::c_int) {
        // SAFETY: SYS_exit ends the calling thread only (the main thread, to which the signal
        // was directed); a raw system call is async-signal-safe and unwinds nothing.
        unsafe { libc::syscall(libc::SYS_exit, 0) };
    }
    let pid = std::process::id();
    std::thread::spawn(move || {
        wait_for("the main thread to exit", Duration::from_secs(10), || {
            leader_is_zombie(pid)
        });
        let code = role();
        exit_child(code);
    });
    // SAFETY: gettid has no preconditions.
    let on_main = unsafe { libc::gettid() } == pid as libc::pid_t;
    if on_main {
        exit_this_thread(0);
    }
    // SAFETY: a handler that only makes a raw system call, installed for a signal nothing
    // else in the test binary uses; tgkill directs the signal at the main thread (tid == pid).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = exit_this_thread as *const () as libc::sighandler_t;
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
            0
        );
        let pid = pid as libc::pid_t;
        assert_eq!(libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGUSR2), 0);
    }
    loop {
        std::thread::park();
    }
}

/// A cheap random number generator (xorshift64) for stress tests; seed it non-zero.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// True about once in `n` calls.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

/// `SIGKILL` this process (a stress test's death at a chosen step).
pub fn die() -> ! {
    // SAFETY: kill(2) on ourselves; never returns.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL")
}

/// The uid (and gid) of `nobody`, which [`drop_privileges`] switches to.
pub const NOBODY: u32 = 65534;

/// In a child process, before any other work: become `nobody` (groups, gid, uid), to test what
/// another user sees. Needs root ([`is_root`]).
pub fn drop_privileges() {
    // SAFETY: plain libc calls in a child process before any other work.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
        assert_eq!(libc::setgid(NOBODY), 0, "setgid");
        assert_eq!(libc::setuid(NOBODY), 0, "setuid");
    }
}

/// Whether this process runs as root (and so may start a process of another uid).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A recognisable `u32` pattern of `len` elements, different for each `seed`.
pub fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

/// Bytes as lowercase hex (how a child role is given binary data).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a hex string (panics on bad hex: test input).
pub fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// How long the socket helpers below wait for a peer or a message.
pub const SOCKET_WAIT: Duration = Duration::from_secs(20);

/// A listener on a unique abstract socket name (same-uid peers), and the name's text.
pub fn fd_listener(what: &str) -> (cuda_ipc::fd::FdListener, String) {
    let raw = unique_name(what);
    let l = cuda_ipc::fd::FdListener::bind(
        cuda_ipc::fd::SocketName::Abstract(raw.clone()),
        cuda_ipc::fd::PeerPolicy::SameUid,
    )
    .unwrap();
    (l, raw)
}

/// Connect to the abstract socket `raw` made by [`fd_listener`].
pub fn fd_connect(raw: &str) -> cuda_ipc::fd::FdSocket {
    cuda_ipc::fd::FdSocket::connect(
        &cuda_ipc::fd::SocketName::Abstract(raw.to_owned()),
        &cuda_ipc::fd::PeerPolicy::SameUid,
        SOCKET_WAIT,
    )
    .unwrap()
}

/// Receive one message and fail unless its payload is `what`.
pub fn expect_message(s: &cuda_ipc::fd::FdSocket, what: &[u8]) {
    let got = s.recv(SOCKET_WAIT).unwrap().payload;
    assert_eq!(got, what, "expected {:?}", String::from_utf8_lossy(what));
}

/// A device buffer's contents, copied to the host.
pub fn contents(buf: &cuda_ipc::GpuSlice<u32>) -> Vec<u32> {
    let mut host = vec![0u32; buf.len()];
    buf.copy_to_host(&mut host).unwrap();
    host
}

/// Drive `f` on this thread until it is ready or `limit` has passed (then it is dropped:
/// cancelled), parked between polls until its waker (the crate's reactor) unparks it: a
/// minimal executor, for the stresses' awaited waits. `None` at the limit.
#[cfg(feature = "async")]
pub fn block_on_for<T>(f: impl std::future::Future<Output = T>, limit: Duration) -> Option<T> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let deadline = Instant::now() + limit;
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}

/// The `Error::Timeout` a stress reports for an awaited wait it dropped at its limit.
pub fn stress_timeout(waited: Duration) -> cuda_ipc::Error {
    cuda_ipc::Error::Timeout {
        what: "awaited wait (stress)",
        waited,
        waiting_for: None,
    }
}

/// How a stress's channel end waits in one run: on the futex, on its descriptor (the path a
/// reactor takes), or awaited (`recv_async` / `acquire_async`, feature `async`).
#[derive(Clone, Copy, Debug)]
pub enum Wait {
    Futex,
    Descriptor,
    #[cfg(feature = "async")]
    Awaited,
}

impl Wait {
    /// One of the ways at random, about a third each (with `STRESS_LISTEN` set, never the
    /// futex).
    pub fn pick(rng: &mut Rng) -> Self {
        let listen = std::env::var_os("STRESS_LISTEN").is_some();
        match rng.next() % 3 {
            0 if !listen => Wait::Futex,
            #[cfg(feature = "async")]
            2 => Wait::Awaited,
            _ => Wait::Descriptor,
        }
    }
}

impl Wait {
    /// The host producer's acquire of its next slot, waited this way, at most `limit`.
    pub fn acquire(
        self,
        tx: &mut cuda_ipc::__private::channel::HostProducer,
        limit: Duration,
    ) -> cuda_ipc::Result<usize> {
        match self {
            Wait::Futex => tx.acquire(limit),
            Wait::Descriptor => tx.acquire_listening(limit),
            #[cfg(feature = "async")]
            Wait::Awaited => block_on_for(tx.acquire_async(), limit)
                .unwrap_or_else(|| Err(stress_timeout(limit))),
        }
    }

    /// The host consumer's receive of its next item, waited this way, at most `limit`.
    pub fn recv(
        self,
        rx: &mut cuda_ipc::__private::channel::HostConsumer,
        limit: Duration,
    ) -> cuda_ipc::Result<(usize, u64)> {
        match self {
            Wait::Futex => rx.recv(limit),
            Wait::Descriptor => rx.recv_listening(limit),
            #[cfg(feature = "async")]
            Wait::Awaited => {
                block_on_for(rx.recv_async(), limit).unwrap_or_else(|| Err(stress_timeout(limit)))
            }
        }
    }
}

/// A current-thread tokio runtime with its timers and I/O driver, for the tests' awaited waits
/// (the crate's own reactor wakes the tasks of its waits).
#[cfg(feature = "async")]
pub fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
