//! A channel end's readiness as a descriptor, across real processes (host only: the ring the
//! GPU channel runs on, without a GPU). A consumer that waits on its descriptor (`poll`), not
//! on the futex, is woken by every item, by the producer's close and by its death
//! (`SIGKILL`), and never waits on a descriptor that stays quiet while an item is there.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use common::{mailbox, read_mailbox, spawn, watchdog};
use cuda_ipc::__private::channel::{HostConsumer, HostProducer};
use cuda_ipc::Error;
use cuda_ipc::error::PeerRole;

const SLOTS: usize = 4;
const ITEMS: u64 = 2_000;

/// Whether `fd` polls readable within `within`.
fn readable(fd: BorrowedFd<'_>, within: Duration) -> bool {
    let mut fds = [libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = i32::try_from(within.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) > 0 }
}

#[test]
fn child_process() {
    common::child_main(|role, args| match role {
        // Send ITEMS items, pausing now and then so that the consumer often waits.
        "producer" => {
            let mut tx = producer_for(&args[0]);
            for k in 1..=ITEMS {
                tx.acquire(Duration::from_secs(20)).unwrap();
                if k % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                tx.send(k % 100).unwrap();
            }
            0 // dropping `tx` closes the channel
        }
        // Once the consumer has armed (the file `args[1]` exists), publish one item as a
        // producer killed between its ring and its tell does (the ring takes the consumer's
        // armed bit, nobody tells it), say so in `args[2]`, then wait to be killed.
        "untold" => {
            let mut tx = producer_for(&args[0]);
            while !std::path::Path::new(&args[1]).exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
            tx.send_untold(7).unwrap();
            std::fs::write(&args[2], b"sent").unwrap();
            std::thread::sleep(Duration::from_secs(60));
            1
        }
        // Attached to, then wait to be killed.
        "idle" => {
            let tx = producer_for(&args[0]);
            while !tx.has_consumer() {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_secs(60));
            1
        }
        // Receive every item, releasing each, after a pause now and then.
        "consumer" => {
            let mut rx = HostConsumer::open_pausing(&args[0], SLOTS, 100, || {}).unwrap();
            for k in 1..=ITEMS {
                let (_, len) = rx.recv(Duration::from_secs(20)).unwrap();
                assert_eq!(len, k % 100);
                if k % 5 == 0 {
                    std::thread::sleep(Duration::from_micros(300));
                }
                rx.release().unwrap();
            }
            0
        }
        // Attach, then wait to be killed.
        "idle_consumer" => {
            let _rx = HostConsumer::open_pausing(&args[0], SLOTS, 100, || {}).unwrap();
            std::thread::sleep(Duration::from_secs(60));
            1
        }
        other => panic!("unknown role {other}"),
    });
}

/// A producer whose channel's name is written to `mailbox` for the parent.
fn producer_for(mailbox: &str) -> HostProducer {
    let tx = HostProducer::create(SLOTS, 100).unwrap();
    std::fs::write(mailbox, format!("{}\n", tx.name())).unwrap();
    tx
}

/// Every item arrives through the descriptor: whenever `try_recv_listening` finds nothing,
/// the descriptor turns readable (within 5 s) before the next item is taken; after the last
/// item, the close wakes it and reads as `ChannelClosed`.
#[test]
fn a_consumer_on_its_descriptor_is_woken_by_every_item_and_the_close() {
    let _dog = watchdog("readiness_items", Duration::from_secs(60));
    let path = mailbox("ready-items");
    let child = spawn("producer", &[path.to_str().unwrap()]);
    let name = read_mailbox(&path, 1, Duration::from_secs(20)).remove(0);
    let mut rx = HostConsumer::open_pausing(&name, SLOTS, 100, || {}).unwrap();
    rx.listen().unwrap();
    let (mut got, mut waits, mut empty_wakes) = (0u64, 0u32, 0u32);
    let mut woke = false;
    let closed = loop {
        match rx.try_recv_listening() {
            Ok(Some((_, len))) => {
                got += 1;
                assert_eq!(len, got % 100, "item {got} in order, whole");
                rx.release().unwrap();
            }
            Ok(None) => {
                // A wake that found nothing: a tell meant for a check already made.
                empty_wakes += u32::from(woke);
                waits += 1;
                assert!(
                    readable(rx.ready_fd().unwrap(), Duration::from_secs(5)),
                    "armed after item {got}, and no wake within 5 s"
                );
                woke = true;
                continue;
            }
            Err(e) => break e,
        }
        woke = false;
    };
    assert!(matches!(closed, Error::ChannelClosed { .. }), "{closed}");
    assert_eq!(got, ITEMS);
    eprintln!(
        "readiness: {ITEMS} items, {waits} waits on the descriptor, {empty_wakes} empty wakes"
    );
    assert!(waits > 0, "the consumer never waited: the test saw nothing");
    child.expect_success(Duration::from_secs(20));
}

/// A producer `SIGKILL`ed while the consumer waits on its descriptor wakes it (the pidfd in
/// its set), and the next check reads `PeerGone`.
#[test]
fn a_producer_killed_while_the_consumer_waits_wakes_it() {
    let _dog = watchdog("readiness_kill", Duration::from_secs(60));
    let path = mailbox("ready-kill");
    let child = spawn("idle", &[path.to_str().unwrap()]);
    let name = read_mailbox(&path, 1, Duration::from_secs(20)).remove(0);
    let mut rx = HostConsumer::open_pausing(&name, SLOTS, 100, || {}).unwrap();
    rx.listen().unwrap();
    assert!(rx.try_recv_listening().unwrap().is_none(), "armed");
    assert!(!readable(rx.ready_fd().unwrap(), Duration::from_millis(50)));
    child.signal(libc::SIGKILL);
    assert!(
        readable(rx.ready_fd().unwrap(), Duration::from_secs(5)),
        "the producer's death did not wake the descriptor"
    );
    match rx.try_recv_listening() {
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    child.expect_exit_or_kill(Duration::from_secs(10));
}

/// A producer that waits on its descriptor for free slots is woken by every release, and
/// sends every item.
#[test]
fn a_producer_on_its_descriptor_is_woken_by_every_release() {
    let _dog = watchdog("readiness_releases", Duration::from_secs(60));
    let mut tx = HostProducer::create(SLOTS, 100).unwrap();
    tx.listen().unwrap();
    let child = spawn("consumer", &[tx.name()]);
    let mut waits = 0u32;
    let mut k = 0;
    while k < ITEMS {
        if tx.try_acquire_listening().unwrap().is_some() {
            k += 1;
            tx.send(k % 100).unwrap();
        } else {
            waits += 1;
            assert!(
                readable(tx.ready_fd().unwrap(), Duration::from_secs(5)),
                "armed at item {k}, and no wake within 5 s"
            );
        }
    }
    child.expect_success(Duration::from_secs(20));
    eprintln!("readiness: {ITEMS} items sent, {waits} waits on the descriptor");
    assert!(waits > 0, "the producer never waited: the test saw nothing");
}

/// A consumer `SIGKILL`ed while the producer waits on its descriptor for a slot wakes it (the
/// pidfd of the consumer it armed on), and the next try reads `PeerGone`.
#[test]
fn a_consumer_killed_while_the_producer_waits_wakes_it() {
    let _dog = watchdog("readiness_consumer_kill", Duration::from_secs(60));
    let mut tx = HostProducer::create(SLOTS, 100).unwrap();
    tx.listen().unwrap();
    let child = spawn("idle_consumer", &[tx.name()]);
    while !tx.has_consumer() {
        std::thread::sleep(Duration::from_millis(1));
    }
    for k in 1..=SLOTS as u64 {
        assert!(tx.try_acquire_listening().unwrap().is_some());
        tx.send(k).unwrap();
    }
    assert!(tx.try_acquire_listening().unwrap().is_none(), "full: armed");
    assert!(!readable(tx.ready_fd().unwrap(), Duration::from_millis(50)));
    child.signal(libc::SIGKILL);
    assert!(
        readable(tx.ready_fd().unwrap(), Duration::from_secs(5)),
        "the consumer's death did not wake the descriptor"
    );
    match tx.try_acquire_listening() {
        Err(Error::PeerGone {
            role: PeerRole::Importer(_),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    child.expect_exit_or_kill(Duration::from_secs(10));
}

/// One thread serves eight channels from eight producer processes through one `WaitSet`:
/// every item of every channel arrives, in order per channel, and each channel's close is
/// seen, with no thread per channel and no busy polling (every wait on the set returns with a
/// ready key or fails the test at its 5 s bound).
#[test]
fn one_wait_set_serves_eight_producers() {
    use cuda_ipc::wait::WaitSet;
    const N: usize = 8;
    let _dog = watchdog("readiness_wait_set", Duration::from_secs(120));
    let mut set = WaitSet::new().unwrap();
    let mut ends = Vec::new();
    let mut children = Vec::new();
    for i in 0..N {
        let path = mailbox(&format!("ready-set-{i}"));
        children.push(spawn("producer", &[path.to_str().unwrap()]));
        let name = read_mailbox(&path, 1, Duration::from_secs(20)).remove(0);
        let mut rx = HostConsumer::open_pausing(&name, SLOTS, 100, || {}).unwrap();
        rx.listen().unwrap();
        let key = set.attach(&rx.ready_fd().unwrap()).unwrap();
        assert_eq!(key.index(), i);
        ends.push((rx, 0u64, false));
    }
    let (mut wakes, mut open) = (0u32, N);
    while open > 0 {
        let ready = set.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(
            !ready.is_empty(),
            "{open} channels open, none ready within 5 s"
        );
        wakes += 1;
        for key in ready {
            let (rx, got, closed) = &mut ends[key.index()];
            loop {
                match rx.try_recv_listening() {
                    Ok(Some((_, len))) => {
                        *got += 1;
                        assert_eq!(len, *got % 100, "channel {}: item {got}", key.index());
                        rx.release().unwrap();
                    }
                    Ok(None) => break,
                    Err(Error::ChannelClosed { .. }) => {
                        assert_eq!(*got, ITEMS);
                        assert!(!*closed);
                        *closed = true;
                        open -= 1;
                        set.detach(key);
                        break;
                    }
                    Err(e) => panic!("channel {}: {e}", key.index()),
                }
            }
        }
    }
    for c in children {
        c.expect_success(Duration::from_secs(20));
    }
    eprintln!("readiness: {N} channels x {ITEMS} items through one wait set, {wakes} wakes");
}

/// Replay of a producer `SIGKILL`ed between its ring and its tell: the ring takes the armed
/// consumer's bit and nobody tells its bell, so its descriptor stays quiet with an item there
/// — until the producer's death makes the pidfd in its set readable; the consumer then finds
/// the item, and after it `PeerGone`.
#[test]
fn a_producer_killed_between_its_ring_and_its_tell_still_wakes_the_consumer() {
    let _dog = watchdog("readiness_untold", Duration::from_secs(60));
    let path = mailbox("ready-untold");
    let (armed, sent) = (mailbox("ready-armed"), mailbox("ready-sent"));
    let child = spawn(
        "untold",
        &[
            path.to_str().unwrap(),
            armed.to_str().unwrap(),
            sent.to_str().unwrap(),
        ],
    );
    let name = read_mailbox(&path, 1, Duration::from_secs(20)).remove(0);
    let mut rx = HostConsumer::open_pausing(&name, SLOTS, 100, || {}).unwrap();
    rx.listen().unwrap();
    assert!(rx.try_recv_listening().unwrap().is_none(), "armed");
    std::fs::write(&armed, b"armed").unwrap();
    let start = Instant::now();
    while !sent.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the producer never published"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = std::fs::remove_file(&sent);
    let _ = std::fs::remove_file(&armed);
    assert!(
        !readable(rx.ready_fd().unwrap(), Duration::from_millis(100)),
        "told after all: this replay shows nothing"
    );
    child.signal(libc::SIGKILL);
    assert!(
        readable(rx.ready_fd().unwrap(), Duration::from_secs(5)),
        "the producer's death did not wake the descriptor"
    );
    assert_eq!(
        rx.try_recv_listening().unwrap().map(|(_, len)| len),
        Some(7),
        "the item published before the death"
    );
    rx.release().unwrap();
    match rx.try_recv_listening() {
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    child.expect_exit_or_kill(Duration::from_secs(10));
}

/// A broadcast consumer that leaves removes its bell before it gives its entry back, so a
/// consumer attaching to that entry the moment it is free (entries are reused) binds the same
/// bell name instead of finding it held (`AddressInUse`: seen once in 60 runs of the broadcast
/// stress before the order was fixed).
#[test]
fn a_consumer_attaching_to_an_entry_just_left_binds_its_bell() {
    let _dog = watchdog("readiness_entry_reuse", Duration::from_secs(60));
    let tx = HostProducer::create_with(SLOTS, 100, 2).unwrap();
    let name = tx.name().to_owned();
    let mut first = HostConsumer::attach_pausing(&name, SLOTS, 100, 2, || {}).unwrap();
    first.listen().unwrap();
    let mut second = None;
    first.close_pausing(|| {
        // The entry reads `Left`: the next attach takes it (the first `Free` or `Left` one).
        let mut rx = HostConsumer::attach_pausing(&name, SLOTS, 100, 2, || {}).unwrap();
        let bound = rx.listen();
        assert!(
            bound.is_ok(),
            "the left entry's bell is still held: {bound:?}"
        );
        second = Some(rx);
    });
    let mut rx = second.unwrap();
    assert!(rx.try_recv_listening().unwrap().is_none());
    drop(tx);
}
