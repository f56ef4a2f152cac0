//! The export registry under random deaths, across real processes, without a GPU: this process
//! exports (publishes records), drops exports (retiring them, freeing at once or deferring
//! while they are held) and sweeps its deferred frees; importer processes enter exports through
//! the registry as an open does, check the export's "memory", hold it a while and leave, and
//! are `SIGKILL`ed at random (the parent kills them, and some kill themselves between setting
//! their bit and checking the generation, or while holding). Each export has its own
//! "memory": a word of a shared array holding the export's stamp (block and generation) while
//! allocated, 0 once freed. (A block may be reused while an earlier export of it still waits to
//! be freed: its holders are gone, so the sweep frees it next.)
//!
//! Invariants checked every run:
//!
//! - an importer holding an export always reads its generation in the export's memory, before
//!   and after holding it (memory freed under a holder would read 0, or a later export's
//!   generation);
//! - the exporter never frees an export that a live importer's shadow record says it holds
//!   (each importer records (block, generation) after its enter and clears it before
//!   leaving);
//! - at the end, with every importer gone, a collect lets every deferred free through (dead
//!   importers' bits and slots are reaped).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use common::{Child, Crew, Rng, die, pid_running, spawn, unique_name, watchdog};
use cuda_ipc::__private::registry::{Export, collect, enter_pausing};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, ProcessIdentity, ShmSafe};

/// Exports published at a time (slots in the world), and the registry's blocks.
const SLOTS: usize = 32;
/// Words of "memory", one per export, reused round-robin (checked free before reuse).
const MEMORY: usize = 1 << 16;
const IMPORTERS: usize = 6;
/// Importers that die holding a filler export before the run, so that slots run short.
const FILLERS: usize = 60;

#[derive(ShmSafe)]
#[repr(C)]
struct World {
    exporter: ShmCell<[u64; 2]>,
    stop: AtomicU32,
    violations: AtomicU32,
    entered: AtomicU64,
    stale: AtomicU64,
    /// Published exports: token (two words), generation, memory word; generation 0: none.
    published: [Published; SLOTS],
    /// Per export: its stamp while allocated, 0 once freed.
    memory: [AtomicU64; MEMORY],
    /// Per importer: the stamp it holds in each slot (0: none).
    holds: [[AtomicU64; SLOTS]; IMPORTERS],
    importer_pid: [AtomicU32; IMPORTERS],
}

/// One published export, written by the exporter alone, read by importers whole: a sequence
/// number, odd while the four words change, around them (a seqlock). A `ShmCell` would not
/// do: its loads may tear, and a torn read pairs one export's token with another export's
/// memory word, which the importer's check then reports as memory freed under a holder (the
/// first run of this test on a 32-core machine did exactly that).
#[derive(ShmSafe)]
#[repr(C)]
struct Published {
    seq: AtomicU64,
    words: [AtomicU64; 4],
}

impl Published {
    /// Exporter (the one writer).
    fn store(&self, words: [u64; 4]) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// Importers: the four words of one store, never a mix of two.
    fn load(&self) -> [u64; 4] {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            let words = self.words.each_ref().map(|w| w.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if before.is_multiple_of(2) && self.seq.load(Ordering::Relaxed) == before {
                return words;
            }
            std::hint::spin_loop();
        }
    }
}

fn pack(e: &Export, m: usize) -> [u64; 4] {
    let token = e.token();
    let word = |i: usize| u64::from_le_bytes(token[i..i + 8].try_into().unwrap());
    [word(0), word(8), e.generation(), m as u64]
}

fn unpack(w: [u64; 4]) -> ([u8; 16], u64, usize) {
    let mut token = [0u8; 16];
    token[..8].copy_from_slice(&w[0].to_le_bytes());
    token[8..].copy_from_slice(&w[1].to_le_bytes());
    (token, w[2], w[3] as usize)
}

/// What an export's memory word holds while it is allocated.
fn stamp(token: &[u8; 16], generation: u64) -> u64 {
    ((block_of(token) as u64) << 40) | generation
}

fn block_of(token: &[u8; 16]) -> usize {
    u32::from_le_bytes([token[12], token[13], token[14], token[15]]) as usize
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        if role == "fill" {
            // Enter the filler export and die holding it: a dead importer's slot and bit.
            let token: [u8; 16] = common::from_hex(&args[0]).try_into().unwrap();
            let exporter =
                ProcessIdentity::from_parts(args[2].parse().unwrap(), args[3].parse().unwrap());
            let _held = enter_pausing(&token, args[1].parse().unwrap(), exporter, || {}).unwrap();
            die();
        }
        assert_eq!(role, "importer");
        let world = ShmOptions::new(&args[0]).open::<World>().unwrap();
        let k: usize = args[1].parse().unwrap();
        let me = std::process::id();
        for h in &world.holds[k] {
            h.store(0, Ordering::SeqCst);
        }
        world.importer_pid[k].store(me, Ordering::SeqCst);
        let [pid, start] = world.exporter.load();
        let exporter = ProcessIdentity::from_parts(pid as u32, start);
        let mut rng = Rng(u64::from(me).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        while world.stop.load(Ordering::SeqCst) == 0 {
            let slot = (rng.next() % SLOTS as u64) as usize;
            let (token, g, m) = unpack(world.published[slot].load());
            if g == 0 {
                continue;
            }
            let mut pause_rng = Rng(rng.next() | 1);
            let held = enter_pausing(&token, g, exporter, || {
                if pause_rng.one_in(40) {
                    die(); // bit set, generation never checked
                }
                if pause_rng.one_in(4) {
                    std::thread::sleep(Duration::from_micros(pause_rng.next() % 200));
                }
            });
            let held = match held {
                Ok(h) => h,
                Err(Error::StaleHandle { .. }) => {
                    world.stale.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(Error::TooManyImporters { .. }) => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => panic!("enter: {e}"),
            };
            let want = stamp(&token, g);
            world.holds[k][slot].store(want, Ordering::SeqCst);
            world.entered.fetch_add(1, Ordering::Relaxed);
            let check = |when: &str| {
                let found = world.memory[m].load(Ordering::SeqCst);
                if found != want {
                    eprintln!(
                        "importer {me} holding export {want:#x} ({when}): its memory (word \
                         {m}) reads {found:#x}: freed (or reused) under a holder"
                    );
                    world.violations.fetch_add(1, Ordering::SeqCst);
                }
            };
            check("on entry");
            if rng.one_in(30) {
                die(); // holding
            }
            std::thread::sleep(Duration::from_micros(rng.next() % 300));
            check("before leaving");
            world.holds[k][slot].store(0, Ordering::SeqCst);
            drop(held);
        }
        0
    });
}

/// The exporter's check before freeing the export stamped `s`: no live importer's shadow
/// record holds it.
fn check_free(world: &World, s: u64) {
    for k in 0..IMPORTERS {
        let pid = world.importer_pid[k].load(Ordering::SeqCst);
        for slot in 0..SLOTS {
            if world.holds[k][slot].load(Ordering::SeqCst) == s && pid_running(pid) {
                eprintln!("exporter frees export {s:#x} while live importer {pid} holds it");
                world.violations.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// A published export, the slot it is published in, and its memory word.
struct Live {
    export: Export,
    slot: usize,
    m: usize,
}

#[test]
fn random_kills_never_let_the_exporter_free_under_a_holder() {
    let _dog = watchdog("registry stress", Duration::from_secs(120));
    let name = unique_name("registry-stress");
    let world: ShmRegion<World> = ShmOptions::new(&name).create().unwrap();
    let me = ProcessIdentity::current();
    world.exporter.store([u64::from(me.pid()), me.start_time()]);

    // Fill all but four of the registry's 64 importer slots with importers that died holding
    // a filler export: the six live importers (and every replacement) then keep taking dead
    // slots over while this exporter's collects reap them too.
    let filler = Export::publish().unwrap();
    let (token, generation) = (
        common::to_hex(&filler.token()),
        filler.generation().to_string(),
    );
    let (pid, start) = (me.pid().to_string(), me.start_time().to_string());
    for _ in 0..FILLERS {
        let (status, _) =
            spawn("fill", &[&token, &generation, &pid, &start]).wait(Duration::from_secs(30));
        assert!(
            status.code().is_none(),
            "a filler did not die holding: {status}"
        );
    }
    let mut filler = Some(filler);
    let mut importers = Crew::start(IMPORTERS, "an importer", |k: usize| -> Child {
        // Importer 0 (and every replacement of it) runs with its main thread gone: a live
        // process whose leader reads `Z`, whose holds must never be reaped.
        if k == 0 {
            common::spawn_without_main_thread("importer", &[&name, &k.to_string()])
        } else {
            spawn("importer", &[&name, &k.to_string()])
        }
    });
    let mut live: Vec<Live> = Vec::new();
    let mut deferred: Vec<(Export, usize)> = Vec::new();
    let mut next_m = 0usize;
    let mut free_slots: Vec<usize> = (0..SLOTS).collect();
    let mut rng = Rng(0x5eed_4321_8765_cafe);
    let (mut exports, mut deferrals) = (0u64, 0u64);
    let free = |world: &World, e: &Export, m: usize| {
        check_free(world, stamp(&e.token(), e.generation()));
        if let Some(word) = world.memory.get(m) {
            word.store(0, Ordering::SeqCst);
        }
    };
    let began = Instant::now();
    let mut last_kill = Instant::now();
    while began.elapsed() < Duration::from_secs(8) {
        if !free_slots.is_empty() && (live.is_empty() || !rng.one_in(3)) {
            let export = Export::publish().unwrap();
            let m = next_m % MEMORY;
            next_m += 1;
            assert_eq!(
                world.memory[m].load(Ordering::SeqCst),
                0,
                "memory word {m} in use"
            );
            world.memory[m].store(
                stamp(&export.token(), export.generation()),
                Ordering::SeqCst,
            );
            let slot = free_slots.pop().unwrap();
            world.published[slot].store(pack(&export, m));
            live.push(Live { export, slot, m });
            exports += 1;
        } else if !live.is_empty() {
            let Live {
                mut export,
                slot,
                m,
            } = live.swap_remove((rng.next() % live.len() as u64) as usize);
            world.published[slot].store([0; 4]);
            free_slots.push(slot);
            if export.retire() {
                collect(); // as a drop does: reap the dead, look again
            }
            if export.is_held() {
                deferrals += 1;
                deferred.push((export, m));
            } else {
                free(&world, &export, m);
            }
        }
        if rng.one_in(20) {
            collect();
            deferred.retain(|(e, m)| {
                if e.is_held() {
                    return true;
                }
                free(&world, e, *m);
                false
            });
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
    for Live {
        mut export,
        slot,
        m,
    } in live.drain(..)
    {
        world.published[slot].store([0; 4]);
        export.retire();
        deferred.push((export, m));
    }
    if let Some(mut f) = filler.take() {
        f.retire();
        deferred.push((f, MEMORY)); // no memory word: never read by importers
    }
    collect();
    let held: Vec<_> = deferred.iter().filter(|(e, _)| e.is_held()).collect();
    let entered = world.entered.load(Ordering::SeqCst);
    let stale = world.stale.load(Ordering::SeqCst);
    eprintln!(
        "{exports} exports, {entered} holds, {stale} stale opens, {deferrals} frees deferred, \
         {kills} kills by the parent"
    );
    assert_eq!(world.violations.load(Ordering::SeqCst), 0, "see stderr");
    assert!(
        held.is_empty(),
        "{} exports still held with every importer gone: dead bits not reaped",
        held.len()
    );
    assert!(
        entered > 1000 && stale > 10 && deferrals > 10,
        "the test exercised little"
    );
}
