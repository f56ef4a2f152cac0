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
use cuda_ipc::{BarrierState, Error, PeerRole, ProcessBarrier, ShmOptions, ShmSafe};

#[repr(C)]
struct Shared {
    barrier: BarrierState,
    joined: AtomicU32,
}
// SAFETY: repr(C), every field is ShmSafe.
unsafe impl ShmSafe for Shared {}

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

#[test]
fn a_dead_peers_pid_taken_by_a_new_process_is_still_peer_lost() {
    if rustix::process::geteuid().as_raw() != 0
        || std::fs::write(
            "/proc/sys/kernel/ns_last_pid",
            std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap_or_default(),
        )
        .is_err()
    {
        eprintln!("SKIPPED: choosing a pid needs root and a writable /proc/sys/kernel/ns_last_pid");
        return;
    }
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
