//! The `async` waits (feature `async`) under tokio and smol, across real processes (host
//! only): the channel's (through the ring the GPU channel runs on and the test hooks' ends,
//! which await as `Listening::recv_async` / `acquire_async` do) and the fd sockets'
//! (`accept_async`, `recv_async`). Every item or message arrives in order; a wait cancelled
//! at any point loses nothing; the peer's death ends a wait; and a thousand pending awaits
//! cost no thread each and no CPU while idle.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::{Duration, Instant};

use common::{Rng, mailbox, read_mailbox, spawn, watchdog};
use cuda_ipc::__private::channel::{HostConsumer, HostProducer};
use cuda_ipc::Error;
use cuda_ipc::error::PeerRole;

const SLOTS: usize = 4;

/// One test at a time: one of them counts this process's threads and CPU time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
const ITEMS: u64 = 2_000;

#[test]
fn child_process() {
    common::child_main(|role, args| match role {
        // Send ITEMS items through one channel, pausing now and then.
        "producer" => {
            let mut tx = HostProducer::create(SLOTS, 100).unwrap();
            std::fs::write(&args[0], format!("{}\n", tx.name())).unwrap();
            for k in 1..=ITEMS {
                tx.acquire(Duration::from_secs(20)).unwrap();
                if k % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                tx.send(k % 100).unwrap();
            }
            0
        }
        // Attached to, then wait to be killed.
        "idle" => {
            let tx = HostProducer::create(SLOTS, 100).unwrap();
            std::fs::write(&args[0], format!("{}\n", tx.name())).unwrap();
            std::thread::sleep(Duration::from_secs(60));
            1
        }
        // `args[1]` channels; once the file `args[2]` exists, one item on each, then close.
        "many" => {
            let n: usize = args[1].parse().unwrap();
            let mut txs: Vec<_> = (0..n)
                .map(|_| HostProducer::create(2, 1).unwrap())
                .collect();
            let names: String = txs.iter().map(|t| format!("{}\n", t.name())).collect();
            std::fs::write(&args[0], names).unwrap();
            while !std::path::Path::new(&args[2]).exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            for (i, tx) in txs.iter_mut().enumerate() {
                tx.acquire(Duration::from_secs(20)).unwrap();
                tx.send(i as u64 % 2).unwrap();
            }
            0
        }
        // Connect to the socket `args[0]`; send ITEMS numbered messages, pausing now and then.
        "sender" => {
            let s = common::fd_connect(&args[0]);
            for k in 1..=ITEMS {
                if k % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                s.send(&k.to_le_bytes(), &[], Duration::from_secs(20))
                    .unwrap();
            }
            common::expect_message(&s, b"bye");
            0
        }
        // Connect to the socket `args[0]`, then wait to be killed.
        "idle_sender" => {
            let _s = common::fd_connect(&args[0]);
            std::thread::sleep(Duration::from_secs(60));
            1
        }
        // Receive ITEMS items, releasing each, pausing now and then.
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
        other => panic!("unknown role {other}"),
    });
}

/// A consumer of a producer process's channel, listening.
fn consumer_of(role: &str) -> (HostConsumer, common::Child) {
    let path = mailbox("async");
    let child = spawn(role, &[path.to_str().unwrap()]);
    let name = read_mailbox(&path, 1, Duration::from_secs(60)).remove(0);
    let mut rx = HostConsumer::open_pausing(&name, SLOTS, 100, || {}).unwrap();
    rx.listen().unwrap();
    (rx, child)
}

/// Receive until the channel closes: the items' count (each checked in order).
async fn receive_all(rx: &mut HostConsumer) -> u64 {
    let mut got = 0;
    loop {
        match rx.recv_async().await {
            Ok((_, len)) => {
                got += 1;
                assert_eq!(len, got % 100, "item {got} in order");
                rx.release().unwrap();
            }
            Err(Error::ChannelClosed { .. }) => return got,
            Err(e) => panic!("after {got} items: {e}"),
        }
    }
}

#[test]
fn a_tokio_task_receives_every_item() {
    let _serial = serial();
    let _dog = watchdog("async_tokio", Duration::from_secs(60));
    let (mut rx, child) = consumer_of("producer");
    let rt = common::tokio_runtime();
    assert_eq!(rt.block_on(receive_all(&mut rx)), ITEMS);
    child.expect_success(Duration::from_secs(20));
}

#[test]
fn a_smol_task_receives_every_item() {
    let _serial = serial();
    let _dog = watchdog("async_smol", Duration::from_secs(60));
    let (mut rx, child) = consumer_of("producer");
    assert_eq!(smol::block_on(receive_all(&mut rx)), ITEMS);
    child.expect_success(Duration::from_secs(20));
}

/// Every `recv_async` raced against a yield or a timeout of up to 2 ms (the future dropped
/// wherever it stands, mostly while pending): the items still arrive each once, in order.
#[test]
fn a_cancelled_recv_loses_nothing() {
    let _serial = serial();
    let _dog = watchdog("async_cancel", Duration::from_secs(60));
    let (mut rx, child) = consumer_of("producer");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (got, cancelled) = rt.block_on(async {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut got, mut cancelled) = (0u64, 0u32);
        loop {
            // Dropped after its first poll (a yield wins the race unless an item is there),
            // or when a timer of up to 2 ms fires.
            let r = if rng.one_in(2) {
                tokio::select! {
                    biased;
                    r = rx.recv_async() => Some(r),
                    () = tokio::task::yield_now() => None,
                }
            } else {
                let limit = Duration::from_micros(rng.next() % 2_000);
                tokio::time::timeout(limit, rx.recv_async()).await.ok()
            };
            match r {
                None => cancelled += 1,
                Some(Ok((_, len))) => {
                    got += 1;
                    assert_eq!(len, got % 100, "item {got}: none lost, none twice");
                    rx.release().unwrap();
                }
                Some(Err(Error::ChannelClosed { .. })) => return (got, cancelled),
                Some(Err(e)) => panic!("after {got} items: {e}"),
            }
        }
    });
    eprintln!("async: {got} items, {cancelled} waits cancelled");
    assert_eq!(got, ITEMS);
    assert!(cancelled > 0, "no wait was cancelled: the test saw nothing");
    child.expect_success(Duration::from_secs(20));
}

/// The producer `SIGKILL`ed while a task awaits ends the wait with `PeerGone`.
#[test]
fn the_producers_death_ends_a_pending_recv() {
    let _serial = serial();
    let _dog = watchdog("async_death", Duration::from_secs(60));
    let (mut rx, child) = consumer_of("idle");
    let pid = child.pid();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: a plain kill(2) of our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let r = smol::block_on(rx.recv_async());
    killer.join().unwrap();
    match r {
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    child.expect_exit_or_kill(Duration::from_secs(10));
}

/// A producer task awaiting free slots (`acquire_async`) sends every item to a consumer
/// process.
#[test]
fn a_tokio_task_sends_every_item() {
    let _serial = serial();
    let _dog = watchdog("async_send", Duration::from_secs(60));
    let mut tx = HostProducer::create(SLOTS, 100).unwrap();
    tx.listen().unwrap();
    let child = spawn("consumer", &[tx.name()]);
    let rt = common::tokio_runtime();
    rt.block_on(async {
        for k in 1..=ITEMS {
            tx.acquire_async().await.unwrap();
            tx.send(k % 100).unwrap();
        }
    });
    child.expect_success(Duration::from_secs(20));
}

/// CPU time this process has used (user + system).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // SAFETY: sysconf is always safe to call.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 1000 / tick)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// 1,000 tasks await items from 1,000 channels of 10 producer processes: the awaits add one
/// thread in all (the reactor), use under 5 % of a core while idle for a second, and each
/// task gets its item once the producers send.
#[test]
fn a_thousand_pending_receives_cost_no_thread_each_and_no_cpu_idle() {
    const PRODUCERS: usize = 10;
    const PER: usize = 100;
    let _serial = serial();
    let _dog = watchdog("async_thousand", Duration::from_secs(120));
    let go = mailbox("async-go");
    let mut children = Vec::new();
    let mut names = Vec::new();
    for _ in 0..PRODUCERS {
        let path = mailbox("async-many");
        children.push(spawn(
            "many",
            &[
                path.to_str().unwrap(),
                &PER.to_string(),
                go.to_str().unwrap(),
            ],
        ));
        names.extend(read_mailbox(&path, PER, Duration::from_secs(60)));
    }
    let mut consumers: Vec<HostConsumer> = names
        .iter()
        .map(|n| {
            let mut rx = HostConsumer::open_pausing(n, 2, 1, || {}).unwrap();
            rx.listen().unwrap();
            rx
        })
        .collect();
    let rt = common::tokio_runtime();
    let before = threads();
    let (threads_pending, idle_cpu, received) = rt.block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut tasks = Vec::new();
                for mut rx in consumers.drain(..) {
                    tasks.push(tokio::task::spawn_local(async move {
                        let got = rx.recv_async().await.map(|(_, len)| len);
                        (rx, got)
                    }));
                }
                tokio::time::sleep(Duration::from_millis(200)).await; // every task pending
                let pending = threads();
                let cpu0 = cpu_time();
                let t0 = Instant::now();
                tokio::time::sleep(Duration::from_secs(1)).await;
                let idle =
                    cpu_time().saturating_sub(cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
                std::fs::write(&go, b"go").unwrap();
                let mut received = 0;
                for t in tasks {
                    let (rx, got) = t.await.unwrap();
                    got.unwrap();
                    received += 1;
                    drop(rx);
                }
                (pending, idle, received)
            })
            .await
    });
    let _ = std::fs::remove_file(&go);
    for c in children {
        c.expect_success(Duration::from_secs(20));
    }
    eprintln!(
        "async: {received} receives; threads {before} before, {threads_pending} with 1,000 pending; \
         idle CPU {:.2} % of a core",
        idle_cpu * 100.0
    );
    assert_eq!(received, PRODUCERS * PER);
    assert!(
        threads_pending <= before + 1,
        "{before} -> {threads_pending} threads"
    );
    assert!(idle_cpu < 0.05, "idle CPU {:.1} %", idle_cpu * 100.0);
}

/// A socket's messages awaited (`accept_async`, then `recv_async` raced against a yield, so
/// that most waits are dropped while pending): every message arrives once, in order.
#[test]
fn socket_messages_awaited_and_cancelled_arrive_in_order() {
    let _serial = serial();
    let _dog = watchdog("async_socket", Duration::from_secs(60));
    let (l, name) = common::fd_listener("async-socket");
    let child = spawn("sender", &[&name]);
    let rt = common::tokio_runtime();
    let cancelled = rt.block_on(async {
        let s = l.accept_async().await.unwrap();
        let (mut got, mut cancelled) = (0u64, 0u32);
        while got < ITEMS {
            tokio::select! {
                biased;
                m = s.recv_async() => {
                    got += 1;
                    let m = m.unwrap();
                    assert_eq!(m.payload, got.to_le_bytes(), "message {got}");
                }
                () = tokio::task::yield_now() => cancelled += 1,
            }
        }
        s.send(b"bye", &[], Duration::from_secs(5)).unwrap();
        cancelled
    });
    eprintln!("async: {ITEMS} messages, {cancelled} waits cancelled");
    assert!(cancelled > 0, "no wait was cancelled: the test saw nothing");
    child.expect_success(Duration::from_secs(20));
}

/// A peer `SIGKILL`ed while a task awaits its next message ends the wait with `PeerClosed`.
#[test]
fn a_socket_peers_death_ends_a_pending_recv() {
    let _serial = serial();
    let _dog = watchdog("async_socket_death", Duration::from_secs(60));
    let (l, name) = common::fd_listener("async-socket-death");
    let child = spawn("idle_sender", &[&name]);
    let pid = child.pid();
    let r = smol::block_on(async {
        let s = l.accept_async().await.unwrap();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: a plain kill(2) of our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        s.recv_async().await
    });
    assert!(matches!(r, Err(Error::PeerClosed { .. })), "{r:?}");
    child.expect_exit_or_kill(Duration::from_secs(10));
}

/// A runtime shut down while a task awaits an item drops the wait cleanly: no hang, no panic,
/// and the channel is intact — the item sent afterwards is received by the next wait, under
/// another runtime.
#[test]
fn a_runtime_shut_down_with_a_pending_recv_leaves_the_channel_intact() {
    let _serial = serial();
    let _dog = watchdog("async_shutdown", Duration::from_secs(60));
    let mut tx = HostProducer::create(SLOTS, 100).unwrap();
    let mut rx = HostConsumer::open_pausing(tx.name(), SLOTS, 100, || {}).unwrap();
    rx.listen().unwrap();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pending = {
        let rx = rx.clone();
        rt.spawn(async move {
            let mut rx = rx.lock().await;
            rx.recv_async().await.map(|(_, len)| len)
        })
    };
    std::thread::sleep(Duration::from_millis(100)); // the task is waiting
    assert!(!pending.is_finished());
    rt.shutdown_timeout(Duration::from_secs(5)); // the pending task is dropped
    tx.acquire(Duration::from_secs(5)).unwrap();
    tx.send(42).unwrap();
    let mut rx = rx.try_lock().expect("the dropped task let the receiver go");
    let got = smol::block_on(rx.recv_async()).unwrap();
    assert_eq!(got.1, 42, "the item sent after the shutdown, received once");
}
