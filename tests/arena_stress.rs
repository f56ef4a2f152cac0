//! The arena protocol under random deaths, across real processes, without a GPU: importer
//! processes enter blocks of one arena, check the range's contents, hold it a while and leave,
//! and are `SIGKILL`ed at random (the parent kills them, and some kill themselves between
//! setting their bit and reading the block's state, or while holding a view), while the owner
//! allocates, frees, reuses and collects. The "memory" is a shared array of stamps: on each
//! allocation the owner writes its (block, generation) stamp over the range.
//!
//! Invariants checked every run:
//!
//! - an importer holding a view always reads its own allocation's stamp over the whole range,
//!   before and after holding it (a range reused under a view would show another stamp);
//! - the owner never hands out a range whose previous stamp belongs to an allocation that a
//!   live importer's shadow record says it holds (each importer records (block, generation)
//!   after its enter and clears it before leaving);
//! - at the end, with every importer gone, `collect` gives back every freed range (dead
//!   importers' bits and slots are reaped), so nothing stays quarantined.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Child, Crew, Rng, die, pid_running, spawn, unique_name, watchdog};
use cuda_ipc::__private::arena::{Importer, Owner, Placement};
use cuda_ipc::arena::IpcArena;
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, ShmSafe};

const BLOCKS: usize = 48;
const UNITS: usize = 256;
const IMPORTERS: usize = 6;

#[derive(ShmSafe)]
#[repr(C)]
struct World {
    token: ShmCell<[u8; 16]>,
    stop: AtomicU32,
    violations: AtomicU32,
    entered: AtomicU64,
    stale: AtomicU64,
    /// What the owner has published per block: generation (0: none), offset, bytes.
    pub_gen: [AtomicU64; BLOCKS],
    /// Per `IpcArena::ALIGN` unit: the stamp of the allocation that last took it.
    contents: [AtomicU64; UNITS],
    /// Per importer: the generation it holds of each block (0: none).
    holds: [[AtomicU64; BLOCKS]; IMPORTERS],
    importer_pid: [AtomicU32; IMPORTERS],
}

fn stamp(index: u32, generation: u64) -> u64 {
    (u64::from(index) << 48) | generation
}

fn units(offset: u64, bytes: u64) -> std::ops::Range<usize> {
    (offset / IpcArena::ALIGN) as usize..((offset + bytes) / IpcArena::ALIGN) as usize
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        assert_eq!(role, "importer");
        let world = ShmOptions::new(&args[0]).open::<World>().unwrap();
        let k: usize = args[1].parse().unwrap();
        let me = std::process::id();
        // Clear the dead predecessor's shadow row before naming ourselves (the owner reads the
        // pid first, then the row).
        for h in &world.holds[k] {
            h.store(0, Ordering::SeqCst);
        }
        world.importer_pid[k].store(me, Ordering::SeqCst);
        let token = world.token.load();
        let importer = loop {
            match Importer::open(&token, (UNITS as u64) * IpcArena::ALIGN) {
                Ok(i) => break i,
                Err(Error::TooManyImporters { .. }) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("import: {e}"),
            }
            if world.stop.load(Ordering::SeqCst) != 0 {
                return 0;
            }
        };
        let mut rng = Rng(u64::from(me).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        while world.stop.load(Ordering::SeqCst) == 0 {
            let b = (rng.next() % BLOCKS as u64) as u32;
            let g = world.pub_gen[b as usize].load(Ordering::Acquire);
            if g == 0 {
                continue;
            }
            let mut pause_rng = Rng(rng.next() | 1);
            let entered = importer.enter_pausing(b, g, || {
                if pause_rng.one_in(40) {
                    die(); // bit set, state never read
                }
                if pause_rng.one_in(4) {
                    std::thread::sleep(Duration::from_micros(pause_rng.next() % 200));
                }
            });
            let Some((offset, bytes)) = entered else {
                world.stale.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            world.holds[k][b as usize].store(g, Ordering::SeqCst);
            world.entered.fetch_add(1, Ordering::Relaxed);
            let check = |when: &str| {
                for u in units(offset, bytes) {
                    let found = world.contents[u].load(Ordering::SeqCst);
                    if found != stamp(b, g) {
                        eprintln!(
                            "importer {me} holding block {b} gen {g} ({when}): unit {u} holds \
                             stamp {found:#x}, not {:#x}: the range was reused under a view",
                            stamp(b, g)
                        );
                        world.violations.fetch_add(1, Ordering::SeqCst);
                    }
                }
            };
            check("on entry");
            if rng.one_in(30) {
                die(); // holding a view
            }
            std::thread::sleep(Duration::from_micros(rng.next() % 300));
            check("before leaving");
            world.holds[k][b as usize].store(0, Ordering::SeqCst);
            importer.leave(b);
        }
        0
    });
}

/// The owner's check before writing its stamps over `p`'s range: the allocation that last
/// held each unit is not held by a live importer.
fn check_free_to_reuse(world: &World, p: Placement) {
    for u in units(p.2, p.3) {
        let prev = world.contents[u].load(Ordering::SeqCst);
        let (b, g) = ((prev >> 48) as usize, prev & ((1 << 48) - 1));
        if g == 0 {
            continue;
        }
        for k in 0..IMPORTERS {
            let pid = world.importer_pid[k].load(Ordering::SeqCst);
            if world.holds[k][b].load(Ordering::SeqCst) == g && pid_running(pid) {
                eprintln!(
                    "owner reuses unit {u} of block {b} gen {g} while live importer {pid} holds it"
                );
                world.violations.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[test]
fn random_kills_never_let_the_owner_reuse_a_range_under_a_view() {
    let _dog = watchdog("arena stress", Duration::from_secs(120));
    let name = unique_name("arena-stress");
    let world: ShmRegion<World> = ShmOptions::new(&name).create().unwrap();
    let mut seed = Rng(common::monotonic_ns() | 1);
    let token: [u8; 16] = std::array::from_fn(|_| seed.next() as u8);
    world.token.store(token);
    let capacity = (UNITS as u64) * IpcArena::ALIGN;
    let mut owner = Owner::create(&token, capacity, BLOCKS).unwrap();

    let mut importers = Crew::start(IMPORTERS, "an importer", |k: usize| -> Child {
        spawn("importer", &[&name, &k.to_string()])
    });
    let mut live: Vec<Placement> = Vec::new();
    let mut rng = Rng(0x5eed_1234_5678_9abd);
    let mut allocs = 0u64;
    let mut frees_under_views = 0u64;
    let began = Instant::now();
    let mut last_kill = Instant::now();
    while began.elapsed() < Duration::from_secs(8) {
        if live.len() < BLOCKS - 2 && (live.is_empty() || !rng.one_in(3)) {
            let bytes = IpcArena::ALIGN * (1 + rng.next() % 8);
            if let Some(p) = owner.alloc(bytes) {
                check_free_to_reuse(&world, p);
                for u in units(p.2, p.3) {
                    world.contents[u].store(stamp(p.0, p.1), Ordering::SeqCst);
                }
                world.pub_gen[p.0 as usize].store(p.1, Ordering::Release);
                live.push(p);
                allocs += 1;
            }
        } else if !live.is_empty() {
            let p = live.swap_remove((rng.next() % live.len() as u64) as usize);
            world.pub_gen[p.0 as usize].store(0, Ordering::Release);
            if (0..IMPORTERS).any(|k| world.holds[k][p.0 as usize].load(Ordering::SeqCst) == p.1) {
                frees_under_views += 1;
            }
            owner.free(p);
        }
        if rng.one_in(50) {
            owner.collect();
        }
        // Kill an importer now and then (wherever it is), reap it, start another in its place.
        if last_kill.elapsed() > Duration::from_millis(40) {
            last_kill = Instant::now();
            importers.kill_and_replace((rng.next() % IMPORTERS as u64) as usize);
        }
        // Importers that killed themselves: reap and replace.
        importers.replace_dead();
        std::thread::sleep(Duration::from_micros(rng.next() % 200));
    }
    world.stop.store(1, Ordering::SeqCst);
    let kills = importers.kills;
    importers.finish();
    for p in live.drain(..) {
        world.pub_gen[p.0 as usize].store(0, Ordering::Release);
        owner.free(p);
    }
    let quarantined = owner.collect();
    let entered = world.entered.load(Ordering::SeqCst);
    let stale = world.stale.load(Ordering::SeqCst);
    eprintln!(
        "{allocs} allocations, {entered} views, {stale} stale opens, {frees_under_views} frees \
         under a view, {kills} kills by the parent"
    );
    assert_eq!(world.violations.load(Ordering::SeqCst), 0, "see stderr");
    assert_eq!(quarantined, 0, "dead importers' bits were not all reaped");
    assert_eq!(owner.free_bytes(), capacity, "every range came back");
    assert!(
        entered > 1000 && stale > 10 && frees_under_views > 10,
        "the test exercised little"
    );
}
