//! The channel's shared-memory protocol under random deaths, across real processes (host only:
//! the ring that `IpcSender`/`IpcReceiver` run their GPU operations on, with each slot's
//! "contents" a word in the test's own shared memory). A producer sends items through 4 slots,
//! writing each item's number into its slot first; a consumer receives, checks, holds and
//! releases them; both pause at random, the consumer sometimes inside its attach (while its
//! owner word reads *claiming*); and the parent `SIGKILL`s one of them at a random time, or
//! neither; each side waits on the futex, on its descriptor (the path a reactor or a `WaitSet`
//! takes) or awaited (`recv_async` / `acquire_async` on a small executor; feature `async`),
//! a third of the runs each. A shadow record checks, every run:
//!
//! - the consumer receives items 1, 2, 3, ... with no gap, repeat or reordering, each with its
//!   length and its header (up to 96 bytes naming the item), and the slot holds the item's number both when received and just before it is
//!   released (the producer never writes a slot the consumer holds);
//! - no side ends in `Timeout` while the other is attached, alive or dead: a dead producer is
//!   `PeerGone` (exporter), a dead consumer `PeerGone` (importer), a finished producer `ChannelClosed` after the
//!   last item (the one exemption: a consumer killed before it attached is no peer yet, so the
//!   producer's full ring times out);
//! - nothing is left in `/dev/shm` once the consumer has attached (it unlinks the name), and
//!   before that a killed producer's region is reclaimable as stale.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{Rng, Wait, pid_running, spawn, unique_name, watchdog};
use cuda_ipc::__private::channel::{HostConsumer, HostProducer};
use cuda_ipc::error::PeerRole;
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{Error, ShmSafe};

const SLOTS: usize = 4;
const CAPACITY: u64 = 1000;
const ITEMS: u64 = 200;
const WAIT: Duration = Duration::from_secs(3);

#[derive(ShmSafe)]
#[repr(C)]
struct Shadow {
    name: ShmCell<[u8; 64]>,
    name_len: AtomicU32,
    /// The consumer is about to open the channel; it has attached.
    opening: AtomicU32,
    attached: AtomicU32,
    /// Per slot: the number of the item the producer last wrote there.
    slot: [AtomicU64; SLOTS],
    /// The items the consumer received, in order.
    log: [AtomicU64; ITEMS as usize],
    log_len: AtomicU64,
    violations: AtomicU32,
    /// Each side's outcome (`Outcome` codes), 100 while running.
    producer_outcome: AtomicU32,
    consumer_outcome: AtomicU32,
}

const DONE: u32 = 0;
const EXPORTER_GONE: u32 = 1;
const PEER_DIED: u32 = 2;
const CLOSED: u32 = 3;
const TIMEOUT: u32 = 4;
const NO_CHANNEL: u32 = 5;
const OTHER: u32 = 9;
const RUNNING: u32 = 100;

fn outcome(e: &Error) -> u32 {
    match e {
        Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        } => EXPORTER_GONE,
        Error::PeerGone {
            role: PeerRole::Importer(_),
            ..
        } => PEER_DIED,
        Error::ChannelClosed { .. } => CLOSED,
        Error::Timeout { .. } => TIMEOUT,
        _ => {
            eprintln!("unexpected error: {e}");
            OTHER
        }
    }
}

fn violation(s: &Shadow, what: std::fmt::Arguments<'_>) {
    eprintln!("violation ({}): {what}", std::process::id());
    s.violations.fetch_add(1, Ordering::SeqCst);
}

fn len_of(k: u64) -> u64 {
    1 + k % CAPACITY
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = ShmOptions::new(&args[0]).open::<Shadow>().unwrap();
        let seed: u64 = args[1].parse().unwrap();
        let mut rng = Rng(seed ^ u64::from(std::process::id()).wrapping_mul(0x9E37_79B9) | 1);
        let code = match role {
            "producer" => producer(&s, &mut rng),
            "consumer" => consumer(&s, &mut rng, args[2].parse().unwrap()),
            _ => unreachable!(),
        };
        match role {
            "producer" => s.producer_outcome.store(code, Ordering::SeqCst),
            _ => s.consumer_outcome.store(code, Ordering::SeqCst),
        }
        0
    });
}

/// Item `k`'s header: `k % 97` bytes of `k`'s little-endian bytes, repeated (empty for some).
fn header_of(k: u64) -> Vec<u8> {
    k.to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take((k % 97) as usize)
        .collect()
}

fn nap(rng: &mut Rng) {
    if rng.one_in(8) {
        std::thread::sleep(Duration::from_micros(rng.next() % 300));
    }
}

fn producer(s: &Shadow, rng: &mut Rng) -> u32 {
    let mut tx = HostProducer::create(SLOTS, CAPACITY).unwrap();
    let mut name = [0u8; 64];
    name[..tx.name().len()].copy_from_slice(tx.name().as_bytes());
    s.name.store(name);
    s.name_len.store(tx.name().len() as u32, Ordering::SeqCst);
    // The producer waits on the futex, on its descriptor or awaited (`common::Wait`).
    let how = Wait::pick(rng);
    for k in 1..=ITEMS {
        let got = how.acquire(&mut tx, WAIT);
        let slot = match got {
            Ok(slot) => slot,
            Err(e) => {
                let code = outcome(&e);
                if code == TIMEOUT && !tx.has_consumer() {
                    return NO_CHANNEL; // nobody attached: not a peer to wait for
                }
                return code;
            }
        };
        s.slot[slot].store(k, Ordering::SeqCst); // "write the slot"
        nap(rng);
        if let Err(e) = tx.send_with_header(len_of(k), &header_of(k)) {
            return outcome(&e);
        }
    }
    DONE // dropping `tx` closes the channel
}

fn consumer(s: &Shadow, rng: &mut Rng, producer_pid: u32) -> u32 {
    let mut waited = 0;
    while s.name_len.load(Ordering::SeqCst) == 0 {
        if !pid_running(producer_pid) {
            return NO_CHANNEL;
        }
        std::thread::sleep(Duration::from_micros(100));
        waited += 1;
        assert!(waited < 30_000, "the producer never published its channel");
    }
    let name = s.name.load();
    let name = std::str::from_utf8(&name[..s.name_len.load(Ordering::SeqCst) as usize]).unwrap();
    s.opening.store(1, Ordering::SeqCst);
    let stall = rng.one_in(4).then(|| rng.next() % 2_000);
    let mut rx = match HostConsumer::open_pausing(name, SLOTS, CAPACITY, || {
        if let Some(us) = stall {
            std::thread::sleep(Duration::from_micros(us));
        }
    }) {
        Ok(rx) => rx,
        // The producer died before or during our open: its region is gone or half there.
        Err(Error::NotFound { .. } | Error::NotReady { .. }) => return NO_CHANNEL,
        Err(e) => return outcome(&e),
    };
    s.attached.store(1, Ordering::SeqCst);
    // The consumer waits on the futex, on its descriptor or awaited (`common::Wait`).
    let how = Wait::pick(rng);
    for k in 1.. {
        let got = how.recv(&mut rx, WAIT);
        let (slot, len) = match got {
            Ok(item) => item,
            Err(e) => {
                let code = outcome(&e);
                if code == CLOSED && k != ITEMS + 1 {
                    violation(s, format_args!("closed after {} items of {ITEMS}", k - 1));
                }
                return code;
            }
        };
        let i = s.log_len.fetch_add(1, Ordering::SeqCst);
        s.log[i as usize].store(k, Ordering::SeqCst);
        if len != len_of(k) {
            violation(s, format_args!("item {k} has length {len}"));
        }
        match rx.header() {
            Ok(h) if h == header_of(k) => {}
            Ok(h) => violation(
                s,
                format_args!("item {k} has a header of {} bytes", h.len()),
            ),
            Err(e) => return outcome(&e),
        }
        let seen = s.slot[slot].load(Ordering::SeqCst);
        if seen != k {
            violation(
                s,
                format_args!("item {k} received with slot {slot} holding {seen}"),
            );
        }
        nap(rng);
        let seen = s.slot[slot].load(Ordering::SeqCst);
        if seen != k {
            violation(
                s,
                format_args!("slot {slot} overwritten with {seen} while item {k} was held"),
            );
        }
        if let Err(e) = rx.release() {
            return outcome(&e);
        }
    }
    unreachable!()
}

#[test]
fn random_kills_keep_the_channel_protocol_sound() {
    let runs: u64 = std::env::var("CHANNEL_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let _dog = watchdog("channel stress", Duration::from_secs(600));
    let mut rng = Rng(0x5eed_cafe ^ u64::from(std::process::id()));
    let mut tally = [[0u32; 10]; 3]; // [no kill, producer killed, consumer killed][outcome]
    for run in 0..runs {
        let name = unique_name("chanstress");
        let shadow = ShmOptions::new(&name).create::<Shadow>().unwrap();
        shadow.producer_outcome.store(RUNNING, Ordering::SeqCst);
        shadow.consumer_outcome.store(RUNNING, Ordering::SeqCst);
        let seed = rng.next().to_string();
        // In one run of three the producer, in another the consumer, runs with its main thread
        // gone (its leader reads `Z`): its peer must keep treating it as alive.
        let start = |role: &str, args: &[&str], leaderless: bool| {
            if leaderless {
                common::spawn_without_main_thread(role, args)
            } else {
                spawn(role, args)
            }
        };
        let producer = start("producer", &[&name, &seed], run % 3 == 1);
        let consumer = start(
            "consumer",
            &[&name, &seed, &producer.pid().to_string()],
            run % 3 == 2,
        );
        let victim = rng.next() % 3; // 0: none, 1: producer, 2: consumer
        if victim != 0 {
            // Kill once the consumer is about to open (earlier, it is no peer of anybody yet).
            common::wait_for("the consumer to start", Duration::from_secs(20), || {
                shadow.opening.load(Ordering::SeqCst) == 1
                    || shadow.consumer_outcome.load(Ordering::SeqCst) != RUNNING
            });
            std::thread::sleep(Duration::from_micros(rng.next() % 15_000));
            let child = if victim == 1 { &producer } else { &consumer };
            child.signal(libc_sigkill());
        }
        // Each ends with exit 0 or by our SIGKILL; a crash or a panic fails the run.
        producer.expect_exit_or_kill(Duration::from_secs(30));
        consumer.expect_exit_or_kill(Duration::from_secs(30));

        let s = &*shadow;
        let (p, c) = (
            s.producer_outcome.load(Ordering::SeqCst),
            s.consumer_outcome.load(Ordering::SeqCst),
        );
        let ctx = format!("run {run}, victim {victim}: producer {p}, consumer {c}");
        assert_eq!(s.violations.load(Ordering::SeqCst), 0, "{ctx}");
        let n = s.log_len.load(Ordering::SeqCst);
        for i in 0..n {
            assert_eq!(
                s.log[i as usize].load(Ordering::SeqCst),
                i + 1,
                "{ctx}: log"
            );
        }
        let attached = s.attached.load(Ordering::SeqCst) == 1;
        match victim {
            0 => {
                assert_eq!((p, c, n), (DONE, CLOSED, ITEMS), "{ctx}");
            }
            1 => {
                // A producer killed after it finished closed the channel first.
                assert!(
                    [EXPORTER_GONE, NO_CHANNEL].contains(&c) || (c == CLOSED && n == ITEMS),
                    "{ctx}"
                );
            }
            _ => {
                assert!(
                    [PEER_DIED, CLOSED].contains(&p)
                        || (p == DONE && n >= ITEMS - SLOTS as u64)
                        || (p == NO_CHANNEL && !attached),
                    "{ctx}"
                );
            }
        }
        assert!(
            p != TIMEOUT && c != TIMEOUT && p != OTHER && c != OTHER,
            "{ctx}"
        );
        let chan = s.name.load();
        let chan = std::str::from_utf8(&chan[..s.name_len.load(Ordering::SeqCst) as usize])
            .unwrap()
            .to_owned();
        if !chan.is_empty() && common::shm_exists(&chan) {
            // Only a producer that died before a consumer attached leaves its region.
            assert!(!attached && victim == 1, "{ctx}: {chan} left in /dev/shm");
            assert!(
                cuda_ipc::shm::reclaim_stale(&chan).unwrap(),
                "{ctx}: not stale"
            );
        }
        tally[victim as usize][p.min(9) as usize] += 1;
        tally[victim as usize][c.min(9) as usize] += 1;
    }
    println!(
        "{runs} runs; outcomes per victim [done, exporter gone, peer died, closed, timeout, \
         no channel, .., other]: none {:?}, producer {:?}, consumer {:?}",
        tally[0], tally[1], tally[2]
    );
}

fn libc_sigkill() -> i32 {
    9
}
