//! The liveness rule at work, across real processes: a process whose **main thread has exited**
//! while other threads run (`pthread_exit` in `main`, some language runtimes) shows its leader
//! as `Z` in `/proc/<pid>/stat`, yet lives and holds what it holds. Every reaper must read it
//! as alive: the liveness check itself (plain and cached), a lease close, the export registry's
//! collect, the barrier, the stale-table sweep and region reclaim. Each of these once
//! took it for dead. Once its last thread exits, the same checks must read it as dead.
//!
//! No GPU: the lease table, registry and barrier are driven through their host-side hooks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{leader_is_zombie, spawn, unique_name, wait_for, watchdog, with_main_thread_gone};
use cuda_ipc::__private::{lease, process, registry};
use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::shm::{ShmOptions, ShmRegion};
use cuda_ipc::{ProcessIdentity, ShmSafe};

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    barrier: BarrierState,
    token: [AtomicU64; 2],
    generation: AtomicU64,
    exporter: [AtomicU64; 3],
    /// The child's identity (pid, start time, pidfs inode).
    child: [AtomicU64; 3],
    ready: AtomicU32,
    stop: AtomicU32,
    outcome: AtomicU32,
}

const WAIT: Duration = Duration::from_secs(20);

fn store_id(to: &[AtomicU64; 3], id: &ProcessIdentity) {
    to[0].store(u64::from(id.pid()), Ordering::SeqCst);
    to[1].store(id.start_time(), Ordering::SeqCst);
    to[2].store(id.pidfs_ino(), Ordering::SeqCst);
}

fn load_id(from: &[AtomicU64; 3]) -> ProcessIdentity {
    let pid = u32::try_from(from[0].load(Ordering::SeqCst)).unwrap();
    ProcessIdentity::from_parts(pid, from[1].load(Ordering::SeqCst))
        .with_pidfs_ino(from[2].load(Ordering::SeqCst))
}

fn token_of(s: &Shared) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&s.token[0].load(Ordering::SeqCst).to_le_bytes());
    t[8..].copy_from_slice(&s.token[1].load(Ordering::SeqCst).to_le_bytes());
    t
}

/// A token unique to this test process and `tag` (12 bytes).
fn test_token(tag: &[u8; 12]) -> [u8; 16] {
    let mut token = [0u8; 16];
    token[..4].copy_from_slice(&std::process::id().to_le_bytes());
    token[4..].copy_from_slice(tag);
    token
}

fn set_token(s: &Shared, t: &[u8; 16]) {
    s.token[0].store(
        u64::from_le_bytes(t[..8].try_into().unwrap()),
        Ordering::SeqCst,
    );
    s.token[1].store(
        u64::from_le_bytes(t[8..].try_into().unwrap()),
        Ordering::SeqCst,
    );
}

fn wait_stop(s: &Shared) {
    wait_for("the parent's stop", WAIT, || {
        s.stop.load(Ordering::SeqCst) != 0
    });
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let role = role.to_owned();
        let args = args.to_vec();
        with_main_thread_gone(move || {
            let region = ShmOptions::new(&args[0]).open::<Shared>().unwrap();
            let s = region.get();
            store_id(&s.child, &ProcessIdentity::current());
            match role.as_str() {
                "idle" => {
                    s.ready.store(1, Ordering::SeqCst);
                    wait_stop(s);
                }
                "lease_holder" => {
                    let held = lease::Held::acquire(&token_of(s)).unwrap();
                    s.ready.store(1, Ordering::SeqCst);
                    wait_stop(s);
                    drop(held);
                }
                "lease_exporter" => {
                    let export = lease::Export::create(&token_of(s)).unwrap();
                    s.ready.store(1, Ordering::SeqCst);
                    wait_stop(s);
                    drop(export);
                }
                "registry_importer" => {
                    let exporter = load_id(&s.exporter);
                    let gen_ = s.generation.load(Ordering::SeqCst);
                    let held =
                        registry::enter_pausing(&token_of(s), gen_, exporter, || {}).unwrap();
                    s.ready.store(1, Ordering::SeqCst);
                    wait_stop(s);
                    drop(held);
                }
                "region_creator" => {
                    let r = ShmOptions::new(&args[1]).create::<AtomicU64>().unwrap();
                    s.ready.store(1, Ordering::SeqCst);
                    wait_stop(s);
                    drop(r);
                }
                "barrier_party" => {
                    let b = ProcessBarrier::join(&s.barrier).unwrap();
                    s.ready.store(1, Ordering::SeqCst);
                    // Arrive well after the parent started waiting (its liveness ticks run).
                    std::thread::sleep(Duration::from_millis(1500));
                    let ok = b.wait_timeout(WAIT).is_ok();
                    s.outcome.store(if ok { 1 } else { 2 }, Ordering::SeqCst);
                    drop(b);
                }
                other => panic!("unknown role {other}"),
            }
            0
        })
    });
}

/// A shared record for one test, its barrier for two parties.
fn shared(test: &str) -> ShmRegion<Shared> {
    ShmOptions::new(unique_name(test))
        .create_with(|s: &Shared| s.barrier.init(2))
        .unwrap()
}

/// Start `role` in a child whose main thread exits; return once it is ready and its leader
/// reads as a zombie.
fn start(region: &ShmRegion<Shared>, role: &str, extra: &[&str]) -> common::Child {
    let mut args = vec![region.name()];
    args.extend_from_slice(extra);
    let child = spawn(role, &args);
    let s = region.get();
    wait_for("the child to be ready", WAIT, || {
        s.ready.load(Ordering::SeqCst) != 0
    });
    assert!(
        leader_is_zombie(child.pid()),
        "the child's main thread must have exited"
    );
    child
}

fn finish(region: &ShmRegion<Shared>, child: common::Child) -> ProcessIdentity {
    let id = load_id(&region.get().child);
    region.get().stop.store(1, Ordering::SeqCst);
    child.expect_success(WAIT);
    id
}

#[test]
fn a_process_whose_main_thread_exited_is_alive_until_its_last_thread_exits() {
    let _dog = watchdog("liveness", Duration::from_secs(60));
    let region = shared("live-zombie-leader");
    let child = start(&region, "idle", &[]);
    let id = load_id(&region.get().child);
    let bare = ProcessIdentity::from_parts(id.pid(), id.start_time());
    for _ in 0..3 {
        assert!(id.is_alive(), "a live process read as dead: {id:?}");
        assert!(bare.is_alive(), "without its inode: {bare:?}");
        assert!(process::is_alive_cached(&id), "cached: {id:?}");
        assert!(process::is_alive_cached(&bare), "cached, no inode");
    }
    let id = finish(&region, child);
    assert!(!id.is_alive(), "an exited process read as alive");
    assert!(!process::is_alive_cached(&id), "the cache missed the exit");
}

#[test]
fn a_lease_close_does_not_free_under_a_holder_whose_main_thread_exited() {
    let _dog = watchdog("liveness", Duration::from_secs(60));
    let region = shared("live-zombie-lease");
    let token = test_token(b"zombie-lease");
    set_token(region.get(), &token);
    let export = lease::Export::create(&token).unwrap();
    let child = start(&region, "lease_holder", &[]);
    assert_eq!(export.holders(), vec![child.pid()], "importers() lost it");
    let left = export.close_and_scan();
    assert_eq!(
        left,
        vec![child.pid()],
        "the close found no holder: it would free"
    );
    finish(&region, child);
    assert!(export.close_and_wait(WAIT).is_empty());
}

#[test]
fn the_registry_collect_keeps_the_slot_of_an_importer_whose_main_thread_exited() {
    let _dog = watchdog("liveness", Duration::from_secs(60));
    let region = shared("live-zombie-registry");
    let mut export = registry::Export::publish().unwrap();
    let s = region.get();
    set_token(s, &export.token());
    s.generation.store(export.generation(), Ordering::SeqCst);
    store_id(&s.exporter, &ProcessIdentity::current());
    let child = start(&region, "registry_importer", &[]);
    assert!(export.retire(), "the importer holds the export");
    registry::collect();
    assert!(export.is_held(), "collect reaped a live importer");
    finish(&region, child);
    let start = Instant::now();
    while export.is_held() && start.elapsed() < WAIT {
        registry::collect();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!export.is_held(), "the hold stayed after the importer left");
}

#[test]
fn the_stale_table_sweep_keeps_the_tables_of_an_exporter_whose_main_thread_exited() {
    let _dog = watchdog("liveness", Duration::from_secs(60));
    let region = shared("live-zombie-sweep");
    let token = test_token(b"zombie-sweep");
    set_token(region.get(), &token);
    let child = start(&region, "lease_exporter", &[]);
    let name = lease::table_name(&token);
    assert!(common::shm_exists(&name));
    cuda_ipc::shm::reclaim_stale_regions();
    assert!(
        common::shm_exists(&name),
        "the sweep removed a live exporter's table"
    );
    finish(&region, child);
    assert!(!common::shm_exists(&name), "the exporter unlinks its table");
}

#[test]
fn a_region_of_a_creator_whose_main_thread_exited_is_not_reclaimed() {
    let _dog = watchdog("liveness", Duration::from_secs(60));
    let region = shared("live-zombie-region");
    let name = unique_name("live-zombie-created");
    let child = start(&region, "region_creator", &[&name]);
    assert!(!cuda_ipc::shm::reclaim_stale(&name).unwrap(), "reclaimed");
    assert!(common::shm_exists(&name));
    finish(&region, child);
    assert!(!common::shm_exists(&name), "the creator unlinks its region");
}

#[test]
fn a_barrier_party_whose_main_thread_exited_is_waited_for_not_reported_gone() {
    let _dog = watchdog("liveness", Duration::from_secs(60));
    let region = shared("live-zombie-barrier");
    let s = region.get();
    let me = ProcessBarrier::join(&s.barrier).unwrap();
    let child = start(&region, "barrier_party", &[]);
    let r = me.wait_timeout(WAIT);
    assert!(r.is_ok(), "the parent's wait: {r:?}");
    wait_for("the child's wait", WAIT, || {
        s.outcome.load(Ordering::SeqCst) != 0
    });
    assert_eq!(
        s.outcome.load(Ordering::SeqCst),
        1,
        "the child's wait failed"
    );
    drop(me);
    finish(&region, child);
}
