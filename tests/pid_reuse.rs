//! A real pid reuse: a barrier participant is killed and a new, unrelated process is made to
//! receive exactly its pid (as root, through `/proc/sys/kernel/ns_last_pid`). A liveness check by
//! pid alone (`kill(pid, 0)`) would now see the peer as alive and the survivor would wait until
//! its deadline; pid + start time must report `PeerGone` (barrier participant) at once.
//!
//! Its own test binary, so that no other test forks between choosing the pid and taking it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{spawn, unique_name, wait_for, watchdog};
use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::error::PeerRole;
use cuda_ipc::shm::ShmOptions;
use cuda_ipc::{Error, ProcessIdentity, ShmSafe};

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    barrier: BarrierState,
    joined: AtomicU32,
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        assert_eq!(role, "join_and_sleep");
        let region = ShmOptions::new(&args[0]).open::<Shared>().unwrap();
        let _b = ProcessBarrier::join(&region.barrier).unwrap();
        region.joined.store(1, Ordering::Release);
        std::thread::sleep(Duration::from_secs(50));
        1
    });
}

/// The tests of this binary choose pids through one kernel setting: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Start `sleep` so that it gets `pid`; `None` if the kernel does not let us choose.
fn spawn_with_pid(pid: u32) -> Option<std::process::Child> {
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        if child.id() == pid {
            return Some(child);
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}

/// Whether this process may choose the next pid (root, and `ns_last_pid` writable): the
/// serialising lock when it may, after recording `test` as skipped when it may not.
fn may_choose_pids(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let writable = || {
        let last = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap_or_default();
        std::fs::write("/proc/sys/kernel/ns_last_pid", last).is_ok()
    };
    if rustix::process::geteuid().as_raw() != 0 || !writable() {
        common::skip(
            test,
            "choosing a pid needs root and a writable /proc/sys/kernel/ns_last_pid",
        );
        return None;
    }
    Some(
        ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

#[test]
fn a_dead_peers_pid_taken_by_a_new_process_is_still_peer_lost() {
    let Some(_one) = may_choose_pids("a_dead_peers_pid_taken_by_a_new_process_is_still_peer_lost")
    else {
        return;
    };
    let _dog = watchdog("pid reuse", Duration::from_secs(60));
    let region = ShmOptions::new(unique_name("pid-reuse"))
        .create_with(|s: &Shared| s.barrier.init(2))
        .unwrap();
    let survivor = ProcessBarrier::join(&region.barrier).unwrap();
    let victim = spawn("join_and_sleep", &[region.name()]);
    wait_for("victim joined", Duration::from_secs(20), || {
        region.joined.load(Ordering::Acquire) == 1
    });
    let victim_pid = victim.pid();
    let stat_start = |pid: u32| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = text
            .rsplit_once(')')
            .map(|(_, r)| r.to_owned())
            .unwrap_or_default();
        after.split_whitespace().nth(19).unwrap_or("?").to_owned()
    };
    let victim_start = stat_start(victim_pid);
    victim.signal(libc::SIGKILL);
    let _ = victim.wait(Duration::from_secs(20));

    let mut impostor = spawn_with_pid(victim_pid).expect("could not hand the dead peer's pid on");
    assert!(
        std::path::Path::new(&format!("/proc/{victim_pid}")).exists(),
        "the impostor holds the pid"
    );
    eprintln!(
        "victim start {victim_start}, impostor start {}",
        stat_start(victim_pid)
    );
    let start = Instant::now();
    let outcome = survivor.wait_timeout(Duration::from_secs(20));
    let took = start.elapsed();
    let _ = impostor.kill();
    let _ = impostor.wait();
    match outcome {
        Err(Error::PeerGone {
            pid,
            role: PeerRole::BarrierParty { left: false, .. },
        }) => assert_eq!(pid, victim_pid),
        other => panic!(
            "expected PeerGone for the reused pid {victim_pid}, got {other:?} after {took:?}"
        ),
    }
    eprintln!("pid {victim_pid} reused by a new process: PeerGone after {took:?}");
}

/// The start tick and pidfs inode of a live process (`None` without pidfs).
fn start_and_inode(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let start = rest.split_whitespace().nth(19)?.parse().ok()?;
    let fd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?,
        rustix::process::PidfdFlags::empty(),
    )
    .ok()?;
    let ino = rustix::fs::fstat(&fd).ok()?.st_ino;
    Some((start, ino))
}

/// Two processes that get one pid within one clock tick share pid and start time and differ
/// only in their pidfs inode. The liveness cache keyed its pinned pidfd on (pid, start time)
/// alone once: after the first died, the second (alive) read as dead, and once the
/// second was pinned, the first (dead) read as alive.
#[test]
fn the_liveness_cache_tells_two_processes_of_one_pid_and_tick_apart_by_their_inodes() {
    use cuda_ipc::__private::process::is_alive_cached;
    let Some(_one) = may_choose_pids(
        "the_liveness_cache_tells_two_processes_of_one_pid_and_tick_apart_by_their_inodes",
    ) else {
        return;
    };
    let _dog = watchdog("pid reuse, one tick", Duration::from_secs(120));
    for attempt in 0..500 {
        let mut first = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = first.id();
        let Some((start, ino_first)) = start_and_inode(pid) else {
            let _ = first.kill();
            let _ = first.wait();
            common::skip(
                "the_liveness_cache_tells_two_processes_of_one_pid_and_tick_apart_by_their_inodes",
                "no pidfs inodes on this kernel",
            );
            return;
        };
        let dead = ProcessIdentity::from_parts(pid, start).with_pidfs_ino(ino_first);
        assert!(is_alive_cached(&dead), "the first process is alive");
        let _ = first.kill();
        let _ = first.wait();
        let Some(mut second) = spawn_with_pid(pid) else {
            panic!("could not hand pid {pid} on");
        };
        let same_tick = start_and_inode(pid).filter(|&(s, _)| s == start);
        let Some((_, ino_second)) = same_tick else {
            let _ = second.kill();
            let _ = second.wait();
            continue; // another tick: try again
        };
        let live = ProcessIdentity::from_parts(pid, start).with_pidfs_ino(ino_second);
        let live_reads_alive = is_alive_cached(&live);
        let dead_reads_dead = !is_alive_cached(&dead);
        let live_again = is_alive_cached(&live);
        let _ = second.kill();
        let _ = second.wait();
        assert!(
            live_reads_alive && live_again,
            "the live process read as dead"
        );
        assert!(dead_reads_dead, "the dead process read as alive");
        eprintln!("pid {pid} reused within tick {start} (attempt {attempt}): told apart");
        return;
    }
    panic!("no pid was reused within one clock tick in 500 attempts");
}
