//! IpcEvent across processes on the GPU: ordering that a slow kernel would break without the
//! event, repeated waits on one event, bounded synchronize that notices a dead exporter.
//!
//! GPU tests are `#[ignore = "requires a CUDA device"]`: run them with `--include-ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{Module, Stream, StreamFlags, launch};
use common::{gpu, report, spawn, unique_name, wait_for, watchdog};
use cuda_ipc::error::PeerRole;
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{
    Error, ImportedBuffer, ImportedEvent, IpcBuffer, IpcEvent, IpcEventHandle, IpcMemHandle,
    ShmSafe,
};

const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");
const LEN: usize = 16 << 20;
const ROUNDS: u64 = 3;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u8>>,
    event: ShmCell<IpcEventHandle>,
    /// 1 once the writer has exported (its handles are in place), 2 once the reader has
    /// opened them.
    ready: AtomicU32,
    /// Rounds the writer has enqueued (kernel + record).
    seq: AtomicU64,
    /// Rounds the reader has checked.
    ack: AtomicU64,
}

fn region() -> ShmRegion<Shared> {
    ShmOptions::new(unique_name("gpu-evt")).create().unwrap()
}

/// The reader has opened what it needs: the slow writer may start its first round.
fn opened(shared: &Shared) {
    shared.ready.store(2, Ordering::Release);
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let shared = ShmOptions::new(&args[0])
            .open::<Shared>()
            .expect("open region");
        let delay_ns: u64 = args[1].parse().unwrap();
        let ctx = gpu();
        let module = Module::from_ptx(KERNELS, &[]).unwrap();
        let delay = module.get_function("delay_fill").unwrap();
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
        let buf = IpcBuffer::<u8>::zeroed(&ctx, LEN).unwrap();
        let event = IpcEvent::new(&ctx).unwrap();
        shared.mem.store(buf.handle().unwrap());
        shared.event.store(event.handle().unwrap());
        shared.ready.store(1, Ordering::Release);
        match role {
            // Each round: a slow kernel writes `round` into every byte, then the event is
            // recorded; the reader must see the new value only through the event.
            "slow_writer" => {
                let ptr = buf.as_raw_ptr();
                // The first kernel starts once the reader has opened the buffer and the event
                // (a first open can take longer than the kernel).
                while shared.ready.load(Ordering::Acquire) != 2 {
                    std::thread::sleep(Duration::from_micros(100));
                }
                for round in 1..=ROUNDS {
                    while shared.ack.load(Ordering::Acquire) != round - 1 {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    // SAFETY: argument types match delay_fill's PTX signature; the buffer
                    // outlives the stream's work (synchronized below).
                    unsafe {
                        launch!(delay<<<64, 256, 0, stream>>>(ptr, LEN as u64, round as u32, delay_ns))
                            .unwrap();
                    }
                    event.record(&stream).unwrap();
                    shared.seq.store(round, Ordering::Release);
                }
                while shared.ack.load(Ordering::Acquire) != ROUNDS {
                    std::thread::sleep(Duration::from_micros(100));
                }
                stream.synchronize().unwrap();
                report("writer_done");
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_event_orders_a_slow_kernel_before_the_readers_copy() {
    let _dog = watchdog("ordering", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let writer = spawn("slow_writer", &[shared.name(), "300000000"]);
    wait_for("writer ready", Duration::from_secs(60), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    let buf = ImportedBuffer::open(&ctx, &shared.mem.load()).unwrap();
    let event = ImportedEvent::open(&ctx, &shared.event.load()).unwrap();
    opened(&shared);
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut host = vec![0u8; LEN];
    for round in 1..=ROUNDS {
        wait_for("round enqueued", Duration::from_secs(30), || {
            shared.seq.load(Ordering::Acquire) == round
        });
        // Control: without the event, the 300 ms kernel has not written yet.
        buf.copy_to_host(&mut host).unwrap();
        assert!(
            host.iter().any(|&b| u64::from(b) != round),
            "round {round}: the control read already saw the new value: the test cannot tell order"
        );
        assert!(
            !event.query().unwrap(),
            "round {round}: event complete before its kernel"
        );
        // The same event, waited on again every round (cust's wait_event would consume it).
        event.wait_on(&stream).unwrap();
        // SAFETY: `host` is neither touched nor dropped until the stream is synchronized.
        unsafe { buf.copy_to_host_async(&mut host, &stream).unwrap() };
        stream.synchronize().unwrap();
        assert!(
            host.iter().all(|&b| u64::from(b) == round),
            "round {round}: the copy ordered after the event saw stale bytes"
        );
        event.synchronize(Duration::from_secs(10)).unwrap();
        assert!(event.query().unwrap());
        shared.ack.store(round, Ordering::Release);
    }
    assert_eq!(
        writer.expect_success(Duration::from_secs(60)),
        vec!["writer_done"]
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn synchronize_notices_a_dead_exporter() {
    let _dog = watchdog("dead_exporter", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    // A 60 s kernel before the record: the event cannot complete while the writer lives.
    let writer = spawn("slow_writer", &[shared.name(), "60000000000"]);
    wait_for("writer ready", Duration::from_secs(60), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    let event = ImportedEvent::open(&ctx, &shared.event.load()).unwrap();
    opened(&shared);
    wait_for("recorded", Duration::from_secs(30), || {
        shared.seq.load(Ordering::Acquire) == 1
    });
    assert!(matches!(
        event.synchronize(Duration::from_millis(200)),
        Err(Error::Timeout { .. })
    ));
    let pid = writer.pid();
    writer.signal(libc::SIGKILL);
    let _ = writer.wait(Duration::from_secs(30));
    // With the exporter gone the wait ends well before its 40 s deadline: either the driver
    // completed the event as the context died, or synchronize saw the exporter gone.
    let waited = Instant::now();
    let outcome = event.synchronize(Duration::from_secs(40));
    let waited = waited.elapsed();
    // The 60 s kernel cannot have finished: any end before the 40 s deadline came from the
    // exporter's death (an `Ok` at the deadline would be a timeout misreported).
    assert!(
        waited < Duration::from_secs(40),
        "the wait ran to its deadline ({waited:?}): the dead exporter went unnoticed"
    );
    match outcome {
        Ok(()) => eprintln!("event completed when its exporter died, after {waited:?}"),
        Err(Error::PeerGone {
            pid: p,
            role: PeerRole::Exporter,
        }) => assert_eq!(p, pid),
        Err(e) => panic!("expected completion or PeerGone (exporter), got {e}"),
    }
    // And a new open is refused before the driver is asked.
    assert!(matches!(
        ImportedEvent::open(&ctx, &shared.event.load()),
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        })
    ));
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_event_cannot_be_opened_by_its_exporter_or_reexported() {
    let ctx = gpu();
    let event = IpcEvent::new(&ctx).unwrap();
    let h = event.handle().unwrap();
    assert!(matches!(
        ImportedEvent::open(&ctx, &h),
        Err(Error::SameProcess { .. })
    ));
    // The handle names the event's device, as memory handles do.
    assert_eq!(
        h.device_uuid(),
        cuda_ipc::device::device_info(ctx.ordinal()).unwrap().uuid
    );
    assert_eq!(h.device_uuid(), event.device_uuid());
    assert!(matches!(
        IpcEventHandle::from_bytes(&h.as_bytes()[..100]),
        Err(Error::CorruptHandle { .. })
    ));
    // A fresh event has no work recorded: complete.
    assert!(event.query().unwrap());
    event.synchronize(Duration::from_secs(1)).unwrap();
}

/// The wait for an event without a thread (feature `async`), on the slow writer's three
/// rounds: an awaited wait cancelled while the 300 ms kernel runs leaves nothing, and the next
/// one ends only when the kernel has written (round 1); a watch in a `WaitSet` (round 2);
/// the blocking wait after them (round 3).
#[cfg(feature = "async")]
#[test]
#[ignore = "requires a CUDA device"]
fn an_event_is_awaited_and_watched_and_a_cancelled_wait_leaves_nothing() {
    use cuda_ipc::wait::WaitSet;

    let _dog = watchdog("awaited event", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let writer = spawn("slow_writer", &[shared.name(), "300000000"]);
    wait_for("writer ready", Duration::from_secs(60), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    let buf = ImportedBuffer::open(&ctx, &shared.mem.load()).unwrap();
    let event = ImportedEvent::open(&ctx, &shared.event.load()).unwrap();
    opened(&shared);
    let rt = common::tokio_runtime();
    let mut host = vec![0u8; LEN];
    let written = |host: &mut Vec<u8>, round: u64| {
        buf.copy_to_host(host).unwrap();
        host.iter().all(|&b| u64::from(b) == round)
    };
    for round in 1..=ROUNDS {
        wait_for("round enqueued", Duration::from_secs(30), || {
            shared.seq.load(Ordering::Acquire) == round
        });
        let t = Instant::now();
        match round {
            1 => {
                let cancelled = rt.block_on(async {
                    tokio::time::timeout(Duration::from_millis(20), event.synchronize_async()).await
                });
                assert!(
                    cancelled.is_err(),
                    "the 300 ms kernel ended in 20 ms? the wait returned {cancelled:?} after {:?}",
                    t.elapsed()
                );
                rt.block_on(event.synchronize_async()).unwrap();
            }
            2 => {
                let mut watch = event.watch().unwrap();
                let mut set = WaitSet::new().unwrap();
                let key = set.attach(&watch).unwrap();
                let mut looks = 0;
                loop {
                    assert_eq!(set.wait(Some(Duration::from_secs(30))).unwrap(), vec![key]);
                    looks += 1;
                    if watch.check().unwrap() {
                        break;
                    }
                }
                // Paced: at most one look per pause (10 µs doubling to 1 ms) over ~300 ms.
                assert!(looks < 600, "{looks} looks in {:?}", t.elapsed());
                eprintln!("event: watched in {:?}, {looks} looks", t.elapsed());
            }
            _ => event.synchronize(Duration::from_secs(10)).unwrap(),
        }
        assert!(
            written(&mut host, round),
            "round {round}: the wait ended before the kernel wrote"
        );
        eprintln!("event: round {round} waited {:?}", t.elapsed());
        shared.ack.store(round, Ordering::Release);
    }
    assert_eq!(
        writer.expect_success(Duration::from_secs(60)),
        vec!["writer_done"]
    );
}

/// An awaited wait for an event of a killed exporter ends (completed as its context died, or
/// `PeerGone` (exporter)) well before the 60 s kernel could.
#[cfg(feature = "async")]
#[test]
#[ignore = "requires a CUDA device"]
fn an_awaited_event_notices_a_dead_exporter() {
    let _dog = watchdog("awaited dead exporter", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let writer = spawn("slow_writer", &[shared.name(), "60000000000"]);
    wait_for("writer ready", Duration::from_secs(60), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    let event = ImportedEvent::open(&ctx, &shared.event.load()).unwrap();
    opened(&shared);
    wait_for("recorded", Duration::from_secs(30), || {
        shared.seq.load(Ordering::Acquire) == 1
    });
    let pid = writer.pid();
    let rt = common::tokio_runtime();
    let t = Instant::now();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            writer.signal(libc::SIGKILL);
        });
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(40), event.synchronize_async()).await
        })
    });
    let waited = t.elapsed();
    let _ = writer.wait(Duration::from_secs(30));
    match outcome {
        Ok(Ok(())) => eprintln!("event: completed when its exporter died, after {waited:?}"),
        Ok(Err(Error::PeerGone {
            pid: p,
            role: PeerRole::Exporter,
        })) => {
            assert_eq!(p, pid);
            eprintln!("event: awaited wait saw the dead exporter after {waited:?}");
        }
        other => panic!("expected completion or PeerGone (exporter) before 40 s, got {other:?}"),
    }
}
