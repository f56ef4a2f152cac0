//! ProcessBarrier across real processes: many generations, peers killed before, during and
//! after a wait, a stopped peer, and a poisoned barrier staying poisoned.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{Child, report, spawn, unique_name, wait_for, watchdog};
use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::error::PeerRole;
use cuda_ipc::shm::{ShmOptions, ShmRegion};
use cuda_ipc::{Error, ShmSafe};

/// The shared layout of these tests.
#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    barrier: BarrierState,
    /// Arrivals counted by the children, to check the barrier's ordering.
    counter: AtomicU64,
    /// Generations led, summed over children.
    leaders: AtomicU64,
    /// Children that joined.
    joined: AtomicU32,
    /// Test phase, set by the parent.
    phase: AtomicU32,
    /// Children that reached a checkpoint.
    checkpoint: AtomicU32,
    /// When the parent killed a peer (monotonic ns).
    killed_at: AtomicU64,
}

fn create(name_hint: &str, parties: u32) -> ShmRegion<Shared> {
    ShmOptions::new(unique_name(name_hint))
        .create_with(|s: &Shared| s.barrier.init(parties))
        .expect("create region")
}

fn open(name: &str) -> ShmRegion<Shared> {
    ShmOptions::new(name).open().expect("child: open region")
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let region = open(&args[0]);
        match role {
            "generations" => generations(&region, args[1].parse().unwrap()),
            "wait_then_report" => wait_then_report(&region, args[1].parse().unwrap()),
            "join_and_sleep" => join_and_sleep(&region, args[1].parse().unwrap()),
            "stop_victim" => stop_victim(&region),
            "stop_waiter" => stop_waiter(&region),
            "join_late" => join_late(&region),
            "blocked" => blocked(&region),
            "loop_until_killed" => loop_until_killed(&region),
            other => panic!("unknown role {other}"),
        }
    });
}

/// Many generations; after generation g every child has counted g + 1 arrivals, and none has
/// counted past g + 2.
fn generations(region: &Shared, gens: u64) -> i32 {
    let barrier = ProcessBarrier::join(&region.barrier).expect("join");
    let n = u64::from(barrier.parties());
    region.joined.fetch_add(1, Ordering::AcqRel);
    for g in 0..gens {
        region.counter.fetch_add(1, Ordering::AcqRel);
        let r = barrier.wait().expect("wait");
        assert_eq!(u64::from(r.generation()), g);
        let c = region.counter.load(Ordering::Acquire);
        assert!(
            c >= n * (g + 1) && c <= n * (g + 2),
            "generation {g}: counter {c} outside [{}, {}]",
            n * (g + 1),
            n * (g + 2)
        );
        if r.is_leader() {
            region.leaders.fetch_add(1, Ordering::AcqRel);
        }
    }
    0
}

/// Join, complete `warmup` generations, announce, then wait once more and report the outcome
/// with the latency since the parent's kill.
fn wait_then_report(region: &Shared, warmup: u32) -> i32 {
    let barrier = ProcessBarrier::join(&region.barrier).expect("join");
    region.joined.fetch_add(1, Ordering::AcqRel);
    for _ in 0..warmup {
        barrier.wait().expect("warm-up wait");
    }
    region.checkpoint.fetch_add(1, Ordering::AcqRel);
    let outcome = barrier.wait_timeout(Duration::from_secs(20));
    let now = common::monotonic_ns();
    let killed = region.killed_at.load(Ordering::Acquire);
    let latency_ms = if killed == 0 {
        -1.0
    } else {
        (now - killed) as f64 / 1e6
    };
    match outcome {
        Err(Error::PeerGone {
            pid,
            role:
                PeerRole::BarrierParty {
                    left: exited_cleanly,
                    ..
                },
        }) => {
            report(format!(
                "peer_lost pid={pid} clean={exited_cleanly} latency_ms={latency_ms:.1}"
            ));
            // Poisoned for good: the next wait fails at once with the same cause.
            match barrier.wait_timeout(Duration::from_secs(5)) {
                Err(Error::PeerGone {
                    pid: again,
                    role: PeerRole::BarrierParty { .. },
                }) if again == pid => report("still_poisoned"),
                other => report(format!("not_poisoned {other:?}")),
            }
        }
        other => report(format!("unexpected {other:?}")),
    }
    0
}

/// Join, complete `warmup` generations, announce, then sleep until killed.
fn join_and_sleep(region: &Shared, warmup: u32) -> i32 {
    let barrier = ProcessBarrier::join(&region.barrier).expect("join");
    region.joined.fetch_add(1, Ordering::AcqRel);
    for _ in 0..warmup {
        barrier.wait().expect("warm-up wait");
    }
    region.checkpoint.fetch_add(1, Ordering::AcqRel);
    // In a wait when phase says so, else idle.
    if region.phase.load(Ordering::Acquire) == 1 {
        let _ = barrier.wait_timeout(Duration::from_secs(50));
    }
    std::thread::sleep(Duration::from_secs(50));
    1
}

/// The victim of SIGSTOP: joins, then waits for phase 2 and takes part in one generation.
fn stop_victim(region: &Shared) -> i32 {
    let barrier = ProcessBarrier::join(&region.barrier).expect("join");
    region.joined.fetch_add(1, Ordering::AcqRel);
    while region.phase.load(Ordering::Acquire) < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    barrier.wait().expect("victim wait after SIGCONT");
    report("victim_done");
    0
}

/// Waits while the victim is stopped (expects Timeout, not PeerGone), then again after it is
/// continued (expects success: a timeout leaves the barrier usable).
fn stop_waiter(region: &Shared) -> i32 {
    let barrier = ProcessBarrier::join(&region.barrier).expect("join");
    region.joined.fetch_add(1, Ordering::AcqRel);
    while region.phase.load(Ordering::Acquire) < 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    match barrier.wait_timeout(Duration::from_millis(400)) {
        Err(Error::Timeout { .. }) => report("timeout"),
        other => report(format!("unexpected {other:?}")),
    }
    region.checkpoint.fetch_add(1, Ordering::AcqRel);
    while region.phase.load(Ordering::Acquire) < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    match barrier.wait() {
        Ok(r) => report(format!("completed generation={}", r.generation())),
        Err(e) => report(format!("unexpected {e:?}")),
    }
    0
}

/// Join a barrier that is already poisoned.
fn join_late(region: &Shared) -> i32 {
    match ProcessBarrier::join(&region.barrier) {
        Err(Error::PeerGone {
            pid,
            role: PeerRole::BarrierParty { .. },
        }) => report(format!("join_refused pid={pid}")),
        other => report(format!("unexpected {:?}", other.map(|b| b.slot()))),
    }
    0
}

/// Wait generation after generation until killed, recording each arrival before making it.
fn loop_until_killed(region: &Shared) -> i32 {
    let mut barrier = ProcessBarrier::join(&region.barrier).expect("join");
    barrier.set_default_timeout(Duration::from_secs(20));
    region.joined.fetch_add(1, Ordering::AcqRel);
    loop {
        region.counter.fetch_add(1, Ordering::AcqRel); // arrivals started by the victim
        if barrier.wait().is_err() {
            return 0;
        }
    }
}

/// Wait while the parent sleeps a second; report the CPU time this process used meanwhile.
fn blocked(region: &Shared) -> i32 {
    let barrier = ProcessBarrier::join(&region.barrier).expect("join");
    region.joined.fetch_add(1, Ordering::AcqRel);
    let cpu = || {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
    };
    let (c0, w0) = (cpu(), std::time::Instant::now());
    barrier.wait().expect("blocked wait");
    let (c, w) = (cpu() - c0, w0.elapsed().as_nanos() as f64);
    report(format!("{c} {w}"));
    0
}

fn run_generations(n: u32, gens: u64) {
    let _dog = watchdog("generations", Duration::from_secs(120));
    let region = create("gen", n);
    let children: Vec<Child> = (0..n)
        .map(|_| spawn("generations", &[region.name(), &gens.to_string()]))
        .collect();
    for c in children {
        c.expect_success(Duration::from_secs(100));
    }
    assert_eq!(
        region.leaders.load(Ordering::Acquire),
        gens,
        "one leader per generation"
    );
    assert_eq!(region.counter.load(Ordering::Acquire), gens * u64::from(n));
    assert_eq!(region.barrier.generation(), gens as u32);
    assert!(!region.barrier.is_poisoned());
}

#[test]
fn two_processes_many_generations() {
    run_generations(2, 3000);
}

#[test]
fn four_processes_many_generations() {
    run_generations(4, 1500);
}

#[test]
fn eight_processes_many_generations() {
    run_generations(8, 800);
}

fn parse_peer_lost(line: &str) -> (u32, bool, f64) {
    let mut pid = 0;
    let mut clean = false;
    let mut latency = f64::NAN;
    for kv in line.split_whitespace().skip(1) {
        let (k, v) = kv.split_once('=').unwrap();
        match k {
            "pid" => pid = v.parse().unwrap(),
            "clean" => clean = v.parse().unwrap(),
            "latency_ms" => latency = v.parse().unwrap(),
            _ => {}
        }
    }
    (pid, clean, latency)
}

/// Kill one of three participants while the other two wait, and check that both survivors
/// get PeerGone naming it within a second, and that the barrier stays poisoned (also for a
/// process joining later).
fn kill_scenario(warmup: u32) {
    let _dog = watchdog("kill", Duration::from_secs(60));
    let region = create("kill", 3);
    let warm = warmup.to_string();
    let victim = spawn("join_and_sleep", &[region.name(), &warm]);
    let survivors: Vec<Child> = (0..2)
        .map(|_| spawn("wait_then_report", &[region.name(), &warm]))
        .collect();
    wait_for("checkpoint", Duration::from_secs(20), || {
        region.checkpoint.load(Ordering::Acquire) == 3
    });
    wait_for("survivors in wait", Duration::from_secs(20), || {
        region.barrier.arrived() == 2
    });
    let victim_pid = victim.pid();
    region
        .killed_at
        .store(common::monotonic_ns(), Ordering::Release);
    victim.signal(libc::SIGKILL);
    let (status, _) = victim.wait(Duration::from_secs(10));
    assert!(!status.success());
    for s in survivors {
        let results = s.expect_success(Duration::from_secs(20));
        let (pid, clean, latency) = parse_peer_lost(&results[0]);
        assert_eq!(pid, victim_pid, "{results:?}");
        assert!(!clean, "a SIGKILLed peer is not a clean exit");
        assert!(
            latency < 1000.0,
            "PeerGone after {latency} ms (must be < 1 s)"
        );
        assert_eq!(results[1], "still_poisoned");
    }
    assert!(region.barrier.is_poisoned());
    let late = spawn("join_late", &[region.name()]).expect_success(Duration::from_secs(20));
    assert_eq!(late, vec![format!("join_refused pid={victim_pid}")]);
}

#[test]
fn peer_killed_before_its_wait() {
    kill_scenario(0);
}

#[test]
fn peer_killed_after_arriving_in_earlier_generations() {
    kill_scenario(5);
}

/// Kill a participant while it sleeps inside `wait`: the survivors, still in the same
/// generation, must learn of it.
#[test]
fn peer_killed_during_its_wait() {
    let _dog = watchdog("kill_during", Duration::from_secs(60));
    let region = create("kill-during", 3);
    region.phase.store(1, Ordering::Release);
    let victim = spawn("join_and_sleep", &[region.name(), "0"]);
    // One survivor in the wait beside the victim; the third participant never arrives.
    let survivor = spawn("wait_then_report", &[region.name(), "0"]);
    wait_for("both in wait", Duration::from_secs(20), || {
        region.barrier.arrived() == 2
    });
    std::thread::sleep(Duration::from_millis(150)); // both asleep on the futex by now
    let victim_pid = victim.pid();
    region
        .killed_at
        .store(common::monotonic_ns(), Ordering::Release);
    victim.signal(libc::SIGKILL);
    let _ = victim.wait(Duration::from_secs(10));
    let results = survivor.expect_success(Duration::from_secs(20));
    let (pid, clean, latency) = parse_peer_lost(&results[0]);
    assert_eq!((pid, clean), (victim_pid, false), "{results:?}");
    assert!(
        latency < 1000.0,
        "PeerGone after {latency} ms (must be < 1 s)"
    );
    assert_eq!(results[1], "still_poisoned");
}

/// A stopped participant is alive: the others time out (not PeerGone), and once it continues
/// the barrier completes normally.
#[test]
fn stopped_peer_gives_timeout_not_peer_lost() {
    let _dog = watchdog("stop", Duration::from_secs(60));
    let region = create("stop", 3);
    let victim = spawn("stop_victim", &[region.name()]);
    let waiters: Vec<Child> = (0..2)
        .map(|_| spawn("stop_waiter", &[region.name()]))
        .collect();
    wait_for("joins", Duration::from_secs(20), || {
        region.joined.load(Ordering::Acquire) == 3
    });
    victim.signal(libc::SIGSTOP);
    region.phase.store(1, Ordering::Release);
    wait_for("timeouts", Duration::from_secs(20), || {
        region.checkpoint.load(Ordering::Acquire) == 2
    });
    assert!(
        !region.barrier.is_poisoned(),
        "a stopped peer must not poison the barrier"
    );
    region.phase.store(2, Ordering::Release);
    victim.signal(libc::SIGCONT);
    for w in waiters {
        let results = w.expect_success(Duration::from_secs(20));
        assert_eq!(
            results,
            vec!["timeout".to_owned(), "completed generation=0".to_owned()]
        );
    }
    assert_eq!(
        victim.expect_success(Duration::from_secs(20)),
        vec!["victim_done"]
    );
}

/// A waiter blocked for a second sleeps on the futex: under 1% of a core.
#[test]
fn a_blocked_waiter_uses_almost_no_cpu() {
    let _dog = watchdog("blocked", Duration::from_secs(60));
    let region = create("blocked", 2);
    let child = spawn("blocked", &[region.name()]);
    wait_for("join", Duration::from_secs(20), || {
        region.joined.load(Ordering::Acquire) == 1
    });
    let me = ProcessBarrier::join(&region.barrier).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    me.wait().unwrap();
    let results = child.expect_success(Duration::from_secs(20));
    let v: Vec<f64> = results[0].split(' ').map(|x| x.parse().unwrap()).collect();
    let (cpu, wall) = (v[0], v[1]);
    eprintln!(
        "blocked waiter: {:.3} ms CPU over {:.3} s",
        cpu / 1e6,
        wall / 1e9
    );
    assert!(wall >= 1e9, "waited {wall} ns");
    assert!(
        cpu < 0.01 * wall,
        "a blocked waiter used {:.2}% of a core",
        100.0 * cpu / wall
    );
}

/// One round of the random-kill scenario: two survivor threads of this process and a victim
/// process loop through generations; the victim is SIGKILLed after a random delay. The
/// survivors must both end with PeerGone naming it, never hang, and never complete a
/// generation the victim did not arrive at.
fn random_kill_round(seed: u64) -> u64 {
    let region = create("random-kill", 3);
    let victim = spawn("loop_until_killed", &[region.name()]);
    let survivors: Vec<ProcessBarrier<'_>> = (0..2)
        .map(|_| ProcessBarrier::join(&region.barrier).unwrap())
        .collect();
    let victim_pid = victim.pid();
    let delay_us = seed % 3000;
    let completed = std::thread::scope(|scope| {
        let handles: Vec<_> = survivors
            .iter()
            .map(|b| {
                scope.spawn(move || {
                    let mut last = None;
                    loop {
                        match b.wait_timeout(Duration::from_secs(20)) {
                            Ok(r) => last = Some(r.generation()),
                            Err(Error::PeerGone {
                                pid,
                                role: PeerRole::BarrierParty { .. },
                            }) => {
                                assert_eq!(pid, victim_pid);
                                return last;
                            }
                            Err(e) => panic!("seed {seed}: survivor got {e}"),
                        }
                    }
                })
            })
            .collect();
        wait_for("victim joined", Duration::from_secs(20), || {
            region.joined.load(Ordering::Acquire) == 1
        });
        std::thread::sleep(Duration::from_micros(delay_us));
        victim.signal(libc::SIGKILL);
        let _ = victim.wait(Duration::from_secs(20));
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    // Generation g needs the victim's (g + 1)-th arrival.
    let victim_arrivals = region.counter.load(Ordering::Acquire);
    for last in completed.iter().flatten() {
        assert!(
            u64::from(*last) < victim_arrivals,
            "seed {seed}: completed generation {last} with only {victim_arrivals} victim arrivals"
        );
    }
    assert!(region.barrier.is_poisoned());
    completed
        .iter()
        .flatten()
        .map(|&g| u64::from(g) + 1)
        .max()
        .unwrap_or(0)
}

/// 1,000 kills at random points (before, during and after arriving): never a hang, never a
/// false completion, always PeerGone naming the victim.
#[test]
fn a_thousand_random_kills_never_hang_or_complete_falsely() {
    let _dog = watchdog("random kills", Duration::from_secs(900));
    let rounds: u64 = std::env::var("CUDA_IPC_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(std::process::id());
    let generations: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let mut rng = common::Rng(seed.wrapping_add(w));
                scope.spawn(move || {
                    (0..rounds / 4)
                        .map(|_| random_kill_round(rng.next()))
                        .sum::<u64>()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    eprintln!(
        "{rounds} random kills (seed {seed:#x}): {generations} generations completed before them"
    );
}

/// An awaited wait (feature `async`) learns of a participant killed while it waits, within
/// the blocking wait's bound, and the barrier stays poisoned.
#[cfg(feature = "async")]
#[test]
fn an_awaited_wait_learns_of_a_killed_peer() {
    let _dog = watchdog("awaited kill", Duration::from_secs(60));
    let region = create("await-kill", 2);
    let victim = spawn("join_and_sleep", &[region.name(), "0"]);
    wait_for("victim joined", Duration::from_secs(20), || {
        region.joined.load(Ordering::Acquire) == 1
    });
    let me = ProcessBarrier::join(&region.barrier).expect("join");
    let rt = common::tokio_runtime();
    let victim_pid = victim.pid();
    let (outcome, latency) = std::thread::scope(|s| {
        let killer = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            let at = std::time::Instant::now();
            victim.signal(libc::SIGKILL);
            at
        });
        let outcome = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), me.wait_async()).await
        });
        (outcome, killer.join().unwrap().elapsed())
    });
    let _ = victim.wait(Duration::from_secs(10));
    match outcome {
        Ok(Err(Error::PeerGone {
            pid,
            role: PeerRole::BarrierParty { left: false, .. },
        })) => assert_eq!(pid, victim_pid),
        other => panic!("expected PeerGone (barrier participant), got {other:?}"),
    }
    assert!(
        latency < Duration::from_secs(1),
        "PeerGone after {latency:?}"
    );
    assert!(region.barrier.is_poisoned());
    assert_eq!(
        region.barrier.arrived(),
        1,
        "the poisoned word keeps its count"
    );
}
