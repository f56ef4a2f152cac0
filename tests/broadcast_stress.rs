//! The broadcast ring (one producer, several consumers that attach and leave) under random
//! deaths, across real processes — host only: the shared-memory protocol that the channel's
//! GPU half will ride on, with each slot's "contents" a word in the test's own shared memory.
//!
//! A producer sends items through 2 slots of a ring with 3 consumer entries, writing each
//! item's number into its slot first. Four consumers start at random times (so at least one
//! finds every entry taken until another leaves or is reaped), pause at random (sometimes
//! inside their attach, while the entry reads *claiming*), and receive, check, hold and
//! release items. The parent `SIGKILL`s a random set of consumers, and in some runs the
//! producer, at random times; each side waits on the futex, on its descriptor (the path a
//! reactor or a `WaitSet` takes) or awaited (feature `async`), a third of the runs each. A
//! shadow record checks, every run:
//!
//! - every consumer receives `start + 1, start + 2, ...` with no gap, repeat or reordering,
//!   each with its length, and the slot holds the item's number both when received and just
//!   before it is released: the producer never writes a slot an attached consumer holds —
//!   which also catches a live consumer wrongly detached;
//! - a consumer that lives to the end receives through the last item and then sees
//!   `ChannelClosed` (or, if the producer was killed, `PeerGone`), never `Timeout`;
//! - the producer sends every item unless killed — dead consumers are detached, never waited
//!   for — and never detaches more entries than consumers were killed;
//! - the region is gone once the producer closed it, and a killed producer's is reclaimable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{Rng, Wait, pid_running, spawn, unique_name, watchdog};
use cuda_ipc::__private::channel::{HostConsumer, HostProducer};
use cuda_ipc::error::PeerRole;
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{Error, ShmSafe};

const SLOTS: usize = 2;
const ENTRIES: usize = 3;
const CONSUMERS: usize = 4;
const CAPACITY: u64 = 1000;
const ITEMS: u64 = 300;
const WAIT: Duration = Duration::from_secs(3);

#[derive(ShmSafe)]
#[repr(C)]
struct Log {
    /// Set once attached; the items published before (it receives `start + 1` first).
    attached: AtomicU32,
    start: AtomicU64,
    items: [AtomicU64; ITEMS as usize],
    len: AtomicU64,
    outcome: AtomicU32,
}

#[derive(ShmSafe)]
#[repr(C)]
struct Shadow {
    name: ShmCell<[u8; 64]>,
    name_len: AtomicU32,
    /// Per slot: the number of the item the producer last wrote there.
    slot: [AtomicU64; SLOTS],
    sent: AtomicU64,
    detached: AtomicU32,
    violations: AtomicU32,
    producer_outcome: AtomicU32,
    logs: [Log; CONSUMERS],
}

const DONE: u32 = 0;
const EXPORTER_GONE: u32 = 1;
const PEER_DIED: u32 = 2;
const CLOSED: u32 = 3;
const TIMEOUT: u32 = 4;
const NO_CHANNEL: u32 = 5;
const IN_USE: u32 = 6;
const OTHER: u32 = 9;
const RUNNING: u32 = 100;

fn outcome(e: &Error) -> u32 {
    match e {
        Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        } => EXPORTER_GONE,
        Error::PeerGone { .. } => PEER_DIED,
        Error::ChannelClosed { .. } => CLOSED,
        Error::Timeout { .. } => TIMEOUT,
        Error::ChannelInUse { .. } => IN_USE,
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

fn nap(rng: &mut Rng) {
    if rng.one_in(8) {
        std::thread::sleep(Duration::from_micros(rng.next() % 300));
    }
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = ShmOptions::new(&args[0]).open::<Shadow>().unwrap();
        let seed: u64 = args[1].parse().unwrap();
        let mut rng = Rng(seed ^ u64::from(std::process::id()).wrapping_mul(0x9E37_79B9) | 1);
        match role {
            "producer" => {
                let code = producer(&s, &mut rng);
                s.producer_outcome.store(code, Ordering::SeqCst);
            }
            "consumer" => {
                let i: usize = args[2].parse().unwrap();
                let code = consumer(&s, &mut rng, i, args[3].parse().unwrap());
                s.logs[i].outcome.store(code, Ordering::SeqCst);
            }
            _ => unreachable!(),
        }
        0
    });
}

fn producer(s: &Shadow, rng: &mut Rng) -> u32 {
    let mut tx = HostProducer::create_with(SLOTS, CAPACITY, ENTRIES).unwrap();
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
            Err(e) => return outcome(&e),
        };
        s.detached
            .store(tx.detached().len() as u32, Ordering::SeqCst);
        s.slot[slot].store(k, Ordering::SeqCst); // "write the slot"
        nap(rng);
        if let Err(e) = tx.send(len_of(k)) {
            return outcome(&e);
        }
        s.sent.store(k, Ordering::SeqCst);
        if k % 50 == 0 {
            // Let late consumers find the ring mid-stream.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    s.detached
        .store(tx.detached().len() as u32, Ordering::SeqCst);
    DONE // dropping `tx` closes the channel
}

fn consumer(s: &Shadow, rng: &mut Rng, i: usize, producer_pid: u32) -> u32 {
    let log = &s.logs[i];
    let mut waited = 0;
    while s.name_len.load(Ordering::SeqCst) == 0 {
        if !pid_running(producer_pid) {
            return NO_CHANNEL;
        }
        std::thread::sleep(Duration::from_micros(100));
        waited += 1;
        assert!(waited < 30_000, "the producer never published its channel");
    }
    // Some start at once, some well into the stream.
    std::thread::sleep(Duration::from_micros(rng.next() % 4_000));
    let name = s.name.load();
    let name = std::str::from_utf8(&name[..s.name_len.load(Ordering::SeqCst) as usize]).unwrap();
    let stall = rng.one_in(4).then(|| rng.next() % 2_000);
    let attach = || {
        HostConsumer::attach_pausing(name, SLOTS, CAPACITY, ENTRIES, || {
            if let Some(us) = stall {
                std::thread::sleep(Duration::from_micros(us));
            }
        })
    };
    // Every entry may be taken: try again for a while (one leaves or is reaped).
    let mut tries = 0;
    let mut rx = loop {
        match attach() {
            Ok(rx) => break rx,
            Err(Error::ChannelInUse { .. }) if tries < 200 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(Error::NotFound { .. } | Error::NotReady { .. }) => return NO_CHANNEL,
            Err(e) => return outcome(&e),
        }
    };
    log.start.store(rx.received(), Ordering::SeqCst);
    log.attached.store(1, Ordering::SeqCst);
    let mut expected = rx.received() + 1;
    // Some leave early (a clean close frees the entry for another).
    let leave_after = rng.one_in(3).then(|| expected + rng.next() % 100);
    // This consumer waits on the futex, on its descriptor or awaited (`common::Wait`).
    let how = Wait::pick(rng);
    loop {
        if leave_after == Some(expected) {
            return DONE; // dropping `rx` closes our entry
        }
        let got = how.recv(&mut rx, WAIT);
        let (slot, len) = match got {
            Ok(item) => item,
            Err(e) => {
                let code = outcome(&e);
                if code == CLOSED && expected != ITEMS + 1 {
                    violation(
                        s,
                        format_args!("consumer {i}: closed after {} of {ITEMS}", expected - 1),
                    );
                }
                return code;
            }
        };
        let k = expected;
        let n = log.len.fetch_add(1, Ordering::SeqCst);
        log.items[n as usize].store(k, Ordering::SeqCst);
        if len != len_of(k) {
            violation(s, format_args!("consumer {i}: item {k} has length {len}"));
        }
        let seen = s.slot[slot].load(Ordering::SeqCst);
        if seen != k {
            violation(
                s,
                format_args!("consumer {i}: item {k} received with slot {slot} holding {seen}"),
            );
        }
        nap(rng);
        let seen = s.slot[slot].load(Ordering::SeqCst);
        if seen != k {
            violation(
                s,
                format_args!(
                    "consumer {i}: slot {slot} overwritten with {seen} while item {k} was held"
                ),
            );
        }
        if let Err(e) = rx.release() {
            return outcome(&e);
        }
        expected += 1;
    }
}

#[test]
fn random_kills_keep_the_broadcast_protocol_sound() {
    let runs: u64 = std::env::var("BROADCAST_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let _dog = watchdog("broadcast stress", Duration::from_secs(600));
    let mut rng = Rng(0xb0ad_ca57 ^ u64::from(std::process::id()));
    let (mut consumers_killed, mut detached_total, mut late) = (0, 0, 0);
    for run in 0..runs {
        let name = unique_name("bcaststress");
        let shadow = ShmOptions::new(&name).create::<Shadow>().unwrap();
        shadow.producer_outcome.store(RUNNING, Ordering::SeqCst);
        for log in &shadow.logs {
            log.outcome.store(RUNNING, Ordering::SeqCst);
        }
        let seed = rng.next().to_string();
        let producer = spawn("producer", &[&name, &seed]);
        let pid = producer.pid().to_string();
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|i| spawn("consumer", &[&name, &seed, &i.to_string(), &pid]))
            .collect();
        let kill_producer = rng.one_in(4);
        let victims: Vec<bool> = (0..CONSUMERS).map(|_| rng.one_in(3)).collect();
        std::thread::sleep(Duration::from_micros(rng.next() % 20_000));
        for (i, c) in consumers.iter().enumerate() {
            if victims[i] {
                c.signal(9);
                std::thread::sleep(Duration::from_micros(rng.next() % 3_000));
            }
        }
        if kill_producer {
            producer.signal(9);
        }
        producer.expect_exit_or_kill(Duration::from_secs(60));
        for c in consumers {
            c.expect_exit_or_kill(Duration::from_secs(60));
        }

        let s = &*shadow;
        let p = s.producer_outcome.load(Ordering::SeqCst);
        let ctx = format!(
            "run {run}, producer killed {kill_producer}, victims {victims:?}: producer {p}"
        );
        assert_eq!(s.violations.load(Ordering::SeqCst), 0, "{ctx}");
        if !kill_producer {
            assert_eq!(p, DONE, "{ctx}: the producer must send everything");
        }
        let killed = victims.iter().filter(|v| **v).count() as u32;
        let detached = s.detached.load(Ordering::SeqCst);
        assert!(
            detached <= killed,
            "{ctx}: {detached} detached, {killed} killed"
        );
        consumers_killed += killed;
        detached_total += detached;
        for (i, log) in s.logs.iter().enumerate() {
            let c = log.outcome.load(Ordering::SeqCst);
            let ctx = format!("{ctx}, consumer {i}: {c}");
            assert!(c != TIMEOUT && c != OTHER, "{ctx}");
            if log.attached.load(Ordering::SeqCst) == 0 {
                continue;
            }
            let start = log.start.load(Ordering::SeqCst);
            if start > 0 {
                late += 1;
            }
            let n = log.len.load(Ordering::SeqCst);
            for j in 0..n {
                assert_eq!(
                    log.items[j as usize].load(Ordering::SeqCst),
                    start + j + 1,
                    "{ctx}: log"
                );
            }
            if !victims[i] && !kill_producer && c != DONE {
                // Lived to the end without leaving: every item through the last, then closed.
                assert_eq!((c, start + n), (CLOSED, ITEMS), "{ctx}");
            }
        }
        let chan = s.name.load();
        let chan = std::str::from_utf8(&chan[..s.name_len.load(Ordering::SeqCst) as usize])
            .unwrap()
            .to_owned();
        if !chan.is_empty() && common::shm_exists(&chan) {
            assert!(kill_producer, "{ctx}: {chan} left in /dev/shm");
            assert!(
                cuda_ipc::shm::reclaim_stale(&chan).unwrap(),
                "{ctx}: not stale"
            );
        }
    }
    println!(
        "{runs} runs: {consumers_killed} consumers killed, {detached_total} entries detached, \
         {late} consumers attached mid-stream"
    );
}
