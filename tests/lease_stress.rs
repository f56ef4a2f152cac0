//! The lease protocol under random deaths, across real processes, without a GPU: importers
//! claim, hold and release leases on one table and are `SIGKILL`ed at random points (some kill
//! themselves between steps, some stall or die inside a claim), while the exporter polls
//! `importers()` and closes — in odd runs as a drop does: one scan, then, while holders remain,
//! sweeps at random intervals as the deferred-free list does. A shadow record
//! in shared memory checks the two invariants every run:
//!
//! - no slot is ever held by two live processes (each holder writes its pid into the shadow slot
//!   after its claim and clears it before its release; finding a live pid there is a violation);
//! - the close never reports "no holders" while a live process holds a lease (a live pid left in
//!   the shadow record after the close returned is a violation), and no holder sees the memory
//!   "freed" while it holds its lease.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{Rng, die, pid_running, spawn, unique_name, watchdog};
use cuda_ipc::__private::lease::{Export, Held};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, IpcBuffer, ProcessIdentity, ShmSafe};

const MAX_IMPORTERS: usize = IpcBuffer::<u8>::MAX_IMPORTERS;

#[derive(ShmSafe)]
#[repr(C)]
struct Shadow {
    token: ShmCell<[u8; 16]>,
    /// Per lease slot: the pid that says it holds it, 0 for none.
    owner: [AtomicU32; MAX_IMPORTERS],
    /// Set once the exporter's close found no holder (the memory would be freed now).
    freed: AtomicU32,
    violations: AtomicU32,
    /// Claims that succeeded, over all runs (to show the test exercised something).
    claims: AtomicU64,
}

#[test]
fn child_process() {
    common::child_main(|role, args| match role {
        "claimer" => claimer(&args[0]),
        other => panic!("unknown role {other}"),
    });
}

fn claimer(shadow_name: &str) -> i32 {
    {
        let shadow = ShmOptions::new(shadow_name).open::<Shadow>().unwrap();
        let me = std::process::id();
        let mut rng = Rng(u64::from(me).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let token = shadow.token.load();
        loop {
            // One claim in four stalls in the claim's windows (the slot reads *claiming*, then
            // *held* before the closing check) and sometimes dies there, while the exporter
            // polls and closes: a reported release/exit interleaving, made wide.
            let claimed = if rng.one_in(4) {
                let mut pause_rng = Rng(rng.next() | 1);
                Held::acquire_pausing(&token, || {
                    if pause_rng.one_in(12) {
                        die(); // mid-claim
                    }
                    std::thread::sleep(Duration::from_micros(pause_rng.next() % 300));
                })
            } else {
                Held::acquire(&token)
            };
            let lease = match claimed {
                Ok(l) => l,
                Err(Error::StaleHandle { .. }) => return 0, // the exporter closed
                Err(Error::TooManyImporters { .. }) => continue,
                Err(e) => panic!("claim: {e}"),
            };
            if rng.one_in(8) {
                die(); // between the claim and the shadow record
            }
            shadow.claims.fetch_add(1, Ordering::Relaxed);
            let slot = lease.slot();
            let before = shadow.owner[slot].swap(me, Ordering::SeqCst);
            if before != 0 && before != me && pid_running(before) {
                eprintln!("slot {slot} held by {me} and by live {before}");
                shadow.violations.fetch_add(1, Ordering::SeqCst);
            }
            for _ in 0..rng.next() % 50 {
                if shadow.freed.load(Ordering::SeqCst) != 0 {
                    eprintln!("{me} holds slot {slot} of freed memory");
                    shadow.violations.fetch_add(1, Ordering::SeqCst);
                }
                std::hint::spin_loop();
            }
            if rng.one_in(8) {
                die(); // holding, recorded
            }
            let _ = shadow.owner[slot].compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
            if rng.one_in(16) {
                die(); // recorded as released, lease not yet released
            }
            drop(lease);
            if rng.one_in(32) {
                std::thread::yield_now();
            }
        }
    }
}

/// One run: an exporter, `n` claimers, one killed by the parent at a random time (others may
/// kill themselves), `importers()` polled meanwhile, then the close: `close_and_wait` in even
/// runs, a drop's single scan followed by deferred sweeps in odd ones. Either way the table's
/// name is gone once the exporter's side is dropped.
fn run(shadow: &ShmRegion<Shadow>, run: u64, n: usize) -> u64 {
    let mut token = [0u8; 16];
    token[..8].copy_from_slice(&run.to_le_bytes());
    token[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    token[12..].copy_from_slice(b"strs");
    shadow.token.store(token);
    shadow.freed.store(0, Ordering::SeqCst);
    for o in &shadow.owner {
        o.store(0, Ordering::SeqCst);
    }
    let export = Export::create(&token).unwrap();
    // One claimer in every third run has no main thread (its leader reads as a zombie, and it
    // must be treated as the live process it is).
    let children: Vec<_> = (0..n)
        .map(|i| {
            if i == 0 && run % 3 == 2 {
                common::spawn_without_main_thread("claimer", &[shadow.name()])
            } else {
                spawn("claimer", &[shadow.name()])
            }
        })
        .collect();
    let mut rng = Rng(run.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let polls = rng.next() % 20;
    for _ in 0..polls {
        let _ = export.holders(); // the public `importers()` path, which once reaped slots
        std::thread::sleep(Duration::from_micros(rng.next() % 500));
    }
    children[rng.next() as usize % n].signal(libc::SIGKILL);
    let _ = export.holders();
    let mut sweeps = 0;
    let left = if run % 2 == 1 {
        let start = std::time::Instant::now();
        loop {
            let left = export.close_and_scan();
            if left.is_empty() || start.elapsed() > Duration::from_secs(20) {
                break left;
            }
            sweeps += 1;
            std::thread::sleep(Duration::from_micros(rng.next() % 2000));
        }
    } else {
        export.close_and_wait(Duration::from_secs(20))
    };
    assert!(
        left.is_empty(),
        "run {run}: close gave up with holders {left:?}"
    );
    shadow.freed.store(1, Ordering::SeqCst);
    for (slot, o) in shadow.owner.iter().enumerate() {
        let pid = o.load(Ordering::SeqCst);
        if pid != 0 && pid_running(pid) {
            eprintln!("run {run}: close returned while live {pid} held slot {slot}");
            shadow.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    for c in children {
        // Killed ones end by SIGKILL (ours or their own); any other end is a failure.
        c.expect_exit_or_kill(Duration::from_secs(30));
    }
    drop(export);
    let name = cuda_ipc::__private::lease::table_name(&token);
    assert!(
        !std::path::Path::new("/dev/shm").join(&name).exists(),
        "run {run}: {name} left in /dev/shm"
    );
    sweeps
}

#[test]
fn a_thousand_runs_with_random_kills_never_grant_a_slot_twice_or_free_under_a_holder() {
    let _dog = watchdog("lease_stress", Duration::from_secs(600));
    let shadow = ShmOptions::new(unique_name("lease-stress"))
        .create::<Shadow>()
        .unwrap();
    let runs = std::env::var("LEASE_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000u64);
    let start = std::time::Instant::now();
    let (mut sweeps, mut deferred) = (0, 0);
    for r in 0..runs {
        let s = run(&shadow, r, 3);
        sweeps += s;
        deferred += u64::from(s > 0);
        assert_eq!(shadow.violations.load(Ordering::SeqCst), 0, "run {r}");
    }
    let claims = shadow.claims.load(Ordering::Relaxed);
    eprintln!(
        "lease stress: {runs} runs, {claims} claims, {deferred} drops deferred ({sweeps} \
         sweeps), 0 violations, {:?}",
        start.elapsed()
    );
    assert!(claims > runs, "the claimers hardly ran: {claims} claims");
    let _ = ProcessIdentity::current();
}
