//! IpcSignal across processes on the GPU: a slow producer kernel is never overtaken, 100,000
//! GPU-side hand-offs lose no wake-up and wake nobody early (one GPU and across two), host
//! waits notice a dead exporter or importer before their deadline, and wrong or stale handles
//! are refused before CUDA sees them.
//!
//! GPU tests are `#[ignore = "requires a CUDA device"]`: run them with `--include-ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{Module, Stream, StreamFlags, launch};
use common::{gpu, report, spawn, unique_name, wait_for, watchdog};
use cuda_ipc::driver::{error_name, sys};
use cuda_ipc::error::{ArgumentDefect, HandleDefect, PeerRole};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{
    Error, GpuContext, GpuSignal, GpuSlice, ImportedBuffer, ImportedSignal, IpcBuffer,
    IpcMemHandle, IpcSignal, IpcSignalHandle, ShmSafe,
};

const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");
/// Bytes the slow kernel fills.
const SLOW_LEN: usize = 16 << 20;
const SLOW_ROUNDS: u64 = 3;
/// GPU-side hand-offs in the long test.
const HANDOFFS: u32 = 100_000;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    data: ShmCell<IpcMemHandle<u8>>,
    words: ShmCell<IpcMemHandle<u32>>,
    /// Exported by the producer (or the child, in the single-signal tests).
    ready: ShmCell<IpcSignalHandle>,
    /// Exported by the consumer.
    ack: ShmCell<IpcSignalHandle>,
    /// A signal the child exported and then dropped.
    dropped: ShmCell<IpcSignalHandle>,
    producer_up: AtomicU32,
    consumer_up: AtomicU32,
    /// Rounds the producer has enqueued.
    seq: AtomicU64,
    /// Set by the parent when the child may exit.
    release: AtomicU32,
}

fn region() -> ShmRegion<Shared> {
    ShmOptions::new(unique_name("gpu-sig")).create().unwrap()
}

fn ok(call: &str, rc: i32) {
    assert_eq!(rc, 0, "{call}: {}", error_name(rc));
}

/// `cuMemcpyDtoDAsync` of one u32 between two device addresses.
fn copy_word(dst: u64, src: u64, stream: &Stream) {
    // SAFETY: both addresses are 4-byte words inside live allocations the caller holds until
    // the stream is synchronised.
    let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, 4, stream.as_inner().cast()) };
    ok("cuMemcpyDtoDAsync", rc);
}

/// The GPU tests of this binary run one at a time: a test's legacy-stream calls would wait for
/// another test's parked streams (same process, same context) and blur what each measures.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Copy `buf` to `host` on a fresh non-blocking stream: ordered after nothing else.
fn read_unordered(buf: &GpuSlice<u8>, host: &mut [u8]) {
    assert_eq!(host.len(), buf.len());
    let _ctx = buf.context().make_current();
    let mut s = std::ptr::null_mut();
    // SAFETY: a new stream; `host` is valid for its length and outlives the synchronize; the
    // device range is the buffer's.
    unsafe {
        ok(
            "cuStreamCreate",
            sys::cuStreamCreate(&mut s, sys::CU_STREAM_NON_BLOCKING),
        );
        ok(
            "cuMemcpyDtoHAsync",
            sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), buf.as_raw_ptr(), host.len(), s),
        );
        ok("cuStreamSynchronize", sys::cuStreamSynchronize(s));
        ok("cuStreamDestroy", sys::cuStreamDestroy_v2(s));
    }
}

fn arg_device(args: &[String]) -> u32 {
    args[1].parse().unwrap()
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let shared = ShmOptions::new(&args[0])
            .open::<Shared>()
            .expect("open region");
        match role {
            // Each round: a slow kernel (delay, then fill every byte with the round number),
            // then `ready.signal(round)`; the next round starts when the consumer acknowledges.
            "slow_producer" => {
                let ctx = GpuContext::new(arg_device(args)).unwrap();
                let module = Module::from_ptx(KERNELS, &[]).unwrap();
                let delay = module.get_function("delay_fill").unwrap();
                let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
                let data = IpcBuffer::<u8>::zeroed(&ctx, SLOW_LEN).unwrap();
                let ready = IpcSignal::new(&ctx).unwrap();
                shared.data.store(data.handle().unwrap());
                shared.ready.store(ready.handle().unwrap());
                shared.producer_up.store(1, Ordering::Release);
                wait_for("consumer", Duration::from_secs(30), || {
                    shared.consumer_up.load(Ordering::Acquire) == 1
                });
                let ack = ImportedSignal::open(&ctx, &shared.ack.load()).unwrap();
                let ptr = data.as_raw_ptr();
                for round in 1..=SLOW_ROUNDS {
                    // SAFETY: delay_fill(ptr, len, value, delay_ns) writes SLOW_LEN bytes of
                    // the live buffer; the stream is synchronised before it is dropped.
                    unsafe {
                        launch!(delay<<<64, 256, 0, stream>>>(ptr, SLOW_LEN as u64, round as u32, 300_000_000u64))
                            .unwrap();
                    }
                    // SAFETY: the stream is synchronised before the signal drops.
                    unsafe { ready.signal(&stream, round).unwrap() };
                    shared.seq.store(round, Ordering::Release);
                    ack.wait_host(round, Duration::from_secs(30)).unwrap();
                }
                stream.synchronize().unwrap();
                report("producer_done");
                0
            }
            // Hand-off i: wait for the consumer's ack of i - 1, copy the value i into the shared
            // word, signal `ready = i`; all enqueued without the host waiting.
            "fast_producer" => {
                let ctx = GpuContext::new(arg_device(args)).unwrap();
                let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
                let word = IpcBuffer::<u32>::zeroed(&ctx, 1).unwrap();
                let values = IpcBuffer::<u32>::new(&ctx, HANDOFFS as usize + 1).unwrap();
                values
                    .copy_from_host(&(0..=HANDOFFS).collect::<Vec<u32>>())
                    .unwrap();
                // Each signal lives on its waiter's device (the slow-producer test covers the
                // other placement, where the consumer waits on the producer's counter).
                let ack = IpcSignal::new(&ctx).unwrap();
                shared.words.store(word.handle().unwrap());
                shared.ack.store(ack.handle().unwrap());
                shared.producer_up.store(1, Ordering::Release);
                wait_for("consumer", Duration::from_secs(30), || {
                    shared.consumer_up.load(Ordering::Acquire) == 1
                });
                let ready = ImportedSignal::open(&ctx, &shared.ready.load()).unwrap();
                let start = Instant::now();
                for i in 1..=u64::from(HANDOFFS) {
                    // SAFETY: the stream is synchronised before the signals drop.
                    unsafe { ack.wait(&stream, i - 1).unwrap() };
                    copy_word(word.as_raw_ptr(), values.as_raw_ptr() + 4 * i, &stream);
                    // SAFETY: as above.
                    unsafe { ready.signal(&stream, i).unwrap() };
                }
                let enqueued = start.elapsed();
                ack.wait_host(u64::from(HANDOFFS), Duration::from_secs(50))
                    .unwrap();
                let total = start.elapsed();
                stream.synchronize().unwrap();
                report(format!(
                    "producer enqueued {HANDOFFS} in {enqueued:?}, all acknowledged after {total:?} ({:.2} µs per round trip)",
                    total.as_secs_f64() * 1e6 / f64::from(HANDOFFS)
                ));
                0
            }
            // Export a signal and idle until released or killed.
            "idle_exporter" => {
                let ctx = gpu();
                let sig = IpcSignal::new(&ctx).unwrap();
                shared.ready.store(sig.handle().unwrap());
                // And one that is gone before anyone opens it.
                let dropped = IpcSignal::new(&ctx).unwrap();
                shared.dropped.store(dropped.handle().unwrap());
                drop(dropped);
                let buf = IpcBuffer::<u8>::new(&ctx, 64).unwrap();
                shared.data.store(buf.handle().unwrap());
                shared.producer_up.store(1, Ordering::Release);
                wait_for("release", Duration::from_secs(50), || {
                    shared.release.load(Ordering::Acquire) == 1
                });
                0
            }
            // Open the parent's signal and idle until released or killed.
            "idle_importer" => {
                let ctx = gpu();
                let _sig = ImportedSignal::open(&ctx, &shared.ready.load()).unwrap();
                shared.consumer_up.store(1, Ordering::Release);
                wait_for("release", Duration::from_secs(50), || {
                    shared.release.load(Ordering::Acquire) == 1
                });
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// The consumer of `slow_producer`, on `device`: every round, a control read shows the slow
/// kernel has not written yet, then the copy ordered after `ready.wait` sees all of it.
fn slow_producer_is_never_overtaken(producer_device: u32, consumer_device: u32) {
    let _dog = watchdog("slow producer", Duration::from_secs(120));
    let ctx = GpuContext::new(consumer_device).unwrap();
    let shared = region();
    let producer = spawn(
        "slow_producer",
        &[shared.name(), &producer_device.to_string()],
    );
    wait_for("producer", Duration::from_secs(60), || {
        shared.producer_up.load(Ordering::Acquire) == 1
    });
    let data = ImportedBuffer::open(&ctx, &shared.data.load()).unwrap();
    let ready = ImportedSignal::open(&ctx, &shared.ready.load()).unwrap();
    let ack = IpcSignal::new(&ctx).unwrap();
    shared.ack.store(ack.handle().unwrap());
    shared.consumer_up.store(1, Ordering::Release);
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut host = vec![0u8; SLOW_LEN];
    for round in 1..=SLOW_ROUNDS {
        wait_for("round enqueued", Duration::from_secs(30), || {
            shared.seq.load(Ordering::Acquire) == round
        });
        // Control: the 300 ms kernel has not finished, so an unordered read sees old bytes and
        // the counter is still below the round. (Through a non-blocking stream: a legacy-stream
        // copy would wait for this process's other blocking streams.)
        read_unordered(&data, &mut host);
        assert!(
            host.iter().any(|&b| u64::from(b) != round),
            "round {round}: the control read already saw the new bytes: the test cannot tell order"
        );
        assert!(
            ready.value().unwrap() < round,
            "round {round}: signalled before its kernel ended"
        );
        // SAFETY: the stream is synchronised before the signals drop.
        unsafe { ready.wait(&stream, round).unwrap() };
        // SAFETY: `host` is neither touched nor dropped until the stream is synchronised.
        unsafe { data.copy_to_host_async(&mut host, &stream).unwrap() };
        // SAFETY: the stream is synchronised before the signals drop.
        unsafe { ack.signal(&stream, round).unwrap() };
        // The host learns of the hand-off only through the signal (a deadline, not a hang).
        assert_eq!(
            ack.wait_host(round, Duration::from_secs(30)).unwrap(),
            round
        );
        stream.synchronize().unwrap();
        assert!(
            host.iter().all(|&b| u64::from(b) == round),
            "round {round}: the copy ordered after the signal saw stale bytes"
        );
    }
    assert_eq!(
        producer.expect_success(Duration::from_secs(60)),
        vec!["producer_done"]
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_signal_orders_a_slow_kernel_before_the_consumers_copy() {
    let _serial = serial();
    slow_producer_is_never_overtaken(0, 0);
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_signal_orders_a_slow_kernel_across_two_gpus() {
    let _serial = serial();
    if !common::has_gpus(2, "a_signal_orders_a_slow_kernel_across_two_gpus") {
        return;
    }
    slow_producer_is_never_overtaken(0, 1);
}

/// The consumer of `fast_producer`: enqueue all hand-offs at once (waits for values not yet
/// signalled), then check that hand-off i copied exactly the value i: an early wake-up would
/// copy i - 1, a lost one would never finish (the host wait's deadline turns that into a
/// failure, not a hang).
fn handoffs_without_lost_or_early_wakeups(producer_device: u32, consumer_device: u32) {
    let _dog = watchdog("100k hand-offs", Duration::from_secs(240));
    let ctx = GpuContext::new(consumer_device).unwrap();
    let shared = region();
    let producer = spawn(
        "fast_producer",
        &[shared.name(), &producer_device.to_string()],
    );
    wait_for("producer", Duration::from_secs(60), || {
        shared.producer_up.load(Ordering::Acquire) == 1
    });
    let word = ImportedBuffer::open(&ctx, &shared.words.load()).unwrap();
    let ack = ImportedSignal::open(&ctx, &shared.ack.load()).unwrap();
    let ready = IpcSignal::new(&ctx).unwrap();
    let log = IpcBuffer::<u32>::zeroed(&ctx, HANDOFFS as usize + 1).unwrap();
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    shared.ready.store(ready.handle().unwrap());
    shared.consumer_up.store(1, Ordering::Release);
    let start = Instant::now();
    for i in 1..=u64::from(HANDOFFS) {
        // SAFETY: the stream is synchronised before the signals drop.
        unsafe { ready.wait(&stream, i).unwrap() };
        copy_word(log.as_raw_ptr() + 4 * i, word.as_raw_ptr(), &stream);
        // SAFETY: as above.
        unsafe { ack.signal(&stream, i).unwrap() };
    }
    let enqueued = start.elapsed();
    let last = ack
        .wait_host(u64::from(HANDOFFS), Duration::from_secs(60))
        .unwrap();
    assert_eq!(last, u64::from(HANDOFFS));
    let total = start.elapsed();
    stream.synchronize().unwrap();
    let mut host = vec![0u32; HANDOFFS as usize + 1];
    log.copy_to_host(&mut host).unwrap();
    let wrong: Vec<(usize, u32)> = host
        .iter()
        .enumerate()
        .skip(1)
        .filter(|&(i, &v)| v as usize != i)
        .map(|(i, &v)| (i, v))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "hand-offs that read the wrong value (index, value): {wrong:?}"
    );
    let results = producer.expect_success(Duration::from_secs(60));
    eprintln!(
        "signal: {HANDOFFS} hand-offs device {producer_device} -> {consumer_device}: consumer enqueued in {enqueued:?}, done after {total:?}; {}",
        results.join("; ")
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_hundred_thousand_handoffs_on_one_gpu() {
    let _serial = serial();
    handoffs_without_lost_or_early_wakeups(0, 0);
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_hundred_thousand_handoffs_across_two_gpus() {
    let _serial = serial();
    if !common::has_gpus(2, "a_hundred_thousand_handoffs_across_two_gpus") {
        return;
    }
    handoffs_without_lost_or_early_wakeups(0, 1);
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_host_wait_notices_a_dead_exporter_before_its_deadline() {
    let _serial = serial();
    let _dog = watchdog("dead exporter", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let child = spawn("idle_exporter", &[shared.name()]);
    wait_for("exporter", Duration::from_secs(60), || {
        shared.producer_up.load(Ordering::Acquire) == 1
    });
    let sig = ImportedSignal::open(&ctx, &shared.ready.load()).unwrap();
    assert_eq!(sig.exporter().pid(), child.pid());
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    // Alive and silent: a plain timeout.
    assert!(matches!(
        sig.wait_host(1, Duration::from_millis(100)),
        Err(Error::Timeout { .. })
    ));
    let pid = child.pid();
    child.signal(libc::SIGKILL);
    let _ = child.wait(Duration::from_secs(30));
    let t = Instant::now();
    match sig.wait_host(1, Duration::from_secs(30)) {
        Err(Error::PeerGone {
            pid: p,
            role: PeerRole::Exporter,
        }) => assert_eq!(p, pid),
        other => panic!("expected PeerGone (exporter), got {other:?}"),
    }
    eprintln!("signal: dead exporter noticed after {:?}", t.elapsed());
    // Remembered: a GPU-side wait that could never end is refused too.
    // SAFETY: refused before anything is enqueued (and the stream is synchronised anyway).
    let refused = unsafe { sig.wait(&stream, 1) };
    assert!(matches!(
        refused,
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        })
    ));
    // Once our mapping is gone, opening again is refused before the driver is asked (while
    // it is open, a second open is a view of the same mapping).
    drop(sig);
    assert!(matches!(
        ImportedSignal::open(&ctx, &shared.ready.load()),
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        })
    ));
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_host_wait_notices_a_dead_importer_before_its_deadline() {
    let _serial = serial();
    let _dog = watchdog("dead importer", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let sig = IpcSignal::new(&ctx).unwrap();
    shared.ready.store(sig.handle().unwrap());
    let child = spawn("idle_importer", &[shared.name()]);
    wait_for("importer", Duration::from_secs(60), || {
        shared.consumer_up.load(Ordering::Acquire) == 1
    });
    assert_eq!(sig.importers(), vec![child.pid()]);
    assert!(matches!(
        sig.wait_host(1, Duration::from_millis(100)),
        Err(Error::Timeout { .. })
    ));
    let pid = child.pid();
    child.signal(libc::SIGKILL);
    let _ = child.wait(Duration::from_secs(30));
    let t = Instant::now();
    match sig.wait_host(1, Duration::from_secs(30)) {
        Err(Error::PeerGone {
            pid: p,
            role: PeerRole::Importer(what),
        }) => {
            assert_eq!((p, what), (pid, "signal"));
        }
        other => panic!("expected PeerGone (importer), got {other:?}"),
    }
    eprintln!("signal: dead importer noticed after {:?}", t.elapsed());
    // The dead lease is reaped, so the signal is freed at once, not leaked.
    assert!(sig.importers().is_empty());
    sig.close(Duration::ZERO).unwrap();
}

#[test]
#[ignore = "requires a CUDA device"]
fn wrong_and_stale_signal_handles_are_refused_before_cuda() {
    let _serial = serial();
    let _dog = watchdog("bad handles", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let child = spawn("idle_exporter", &[shared.name()]);
    wait_for("exporter", Duration::from_secs(60), || {
        shared.producer_up.load(Ordering::Acquire) == 1
    });
    // A dropped signal's handle: stale, even though its exporter lives.
    assert!(matches!(
        ImportedSignal::open(&ctx, &shared.dropped.load()),
        Err(Error::StaleHandle { .. })
    ));
    // A buffer handle is not a signal handle, and the reverse.
    let buffer = shared.data.load();
    assert!(matches!(
        IpcSignalHandle::from_bytes(buffer.as_bytes()),
        Err(Error::CorruptHandle { .. })
    ));
    let live = shared.ready.load();
    assert!(matches!(
        IpcMemHandle::<u64>::from_bytes(live.as_bytes()),
        Err(Error::CorruptHandle { .. })
    ));
    // Any flipped bit.
    let mut bytes = live.as_bytes().to_vec();
    bytes[100] ^= 0x10;
    assert!(matches!(
        IpcSignalHandle::from_bytes(&bytes),
        Err(Error::CorruptHandle { .. })
    ));
    // A handle that says "signal" but describes a larger buffer, even with a valid checksum.
    let mut forged = buffer.as_bytes().to_vec();
    forged[6..8].copy_from_slice(&3u16.to_le_bytes()); // kind: signal
    cuda_ipc::__private::reseal(&mut forged);
    let err = IpcSignalHandle::from_bytes(&forged).unwrap_err();
    assert!(
        matches!(&err, Error::CorruptHandle { defect: HandleDefect::Layout { detail } }
            if detail.contains("one 8-byte counter")),
        "{err}"
    );
    // Our own export, opened by us: refused (CUDA would fail it).
    let own = IpcSignal::new(&ctx).unwrap();
    assert!(matches!(
        ImportedSignal::open(&ctx, &own.handle().unwrap()),
        Err(Error::SameProcess { .. })
    ));
    // The live one opens (an `ImportedSignal` has no `handle()` to export it again).
    let opened = ImportedSignal::open(&ctx, &live).unwrap();
    drop(opened);
    shared.release.store(1, Ordering::Release);
    child.expect_success(Duration::from_secs(60));
}

#[test]
#[ignore = "requires a CUDA device"]
fn host_reads_writes_and_waits_do_not_queue_behind_a_blocked_stream() {
    let _serial = serial();
    let _dog = watchdog("basics", Duration::from_secs(60));
    let ctx = gpu();
    assert!(cuda_ipc::device::can_use_stream_mem_ops(0).unwrap());
    assert!(cuda_ipc::device::device_info(0).unwrap().stream_mem_ops);
    let sig = IpcSignal::new(&ctx).unwrap();
    assert_eq!(sig.value().unwrap(), 0);
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    // Made before the stream blocks: its memset uses the legacy stream, which a blocked cust
    // stream would hold up (see IpcSignal's docs).
    let after = IpcBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    // The stream signals 1, then blocks until someone signals 2.
    // SAFETY: `sig` and `after` outlive the stream's work: it is synchronised below, after
    // the host releases the wait.
    unsafe {
        sig.signal(&stream, 1).unwrap();
        sig.wait(&stream, 2).unwrap();
        after.memset_bytes_async(0xab, &stream).unwrap();
    }
    assert_eq!(sig.wait_host(1, Duration::from_secs(10)).unwrap(), 1);
    // Still blocked: host reads and a bounded host wait go around it.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(sig.value().unwrap(), 1);
    assert!(matches!(
        sig.wait_host(2, Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
    // Values must increase, and stay below 2^63.
    // SAFETY: both are refused before anything is enqueued.
    let (again, too_big) = unsafe {
        (
            sig.signal(&stream, 1),
            sig.wait(&stream, GpuSignal::MAX_VALUE + 1),
        )
    };
    assert!(matches!(
        again,
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::NotIncreasing { value: 1, .. },
            ..
        })
    ));
    assert!(matches!(
        too_big,
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::OutOfRange { .. },
            ..
        })
    ));
    // The host releases the stream.
    sig.signal_host(2).unwrap();
    stream.synchronize().unwrap();
    let mut host = [0u32];
    after.copy_to_host(&mut host).unwrap();
    assert_eq!(host[0], 0xabab_abab, "work after the wait ran");
    assert_eq!(sig.value().unwrap(), 2);
    // A wait for a value already reached passes at once.
    // SAFETY: the stream is synchronised before the signal closes.
    unsafe { sig.wait(&stream, 1).unwrap() };
    stream.synchronize().unwrap();
    sig.close(Duration::ZERO).unwrap();
}

/// The host waits without a thread (feature `async`): an awaited wait cancelled before the
/// value comes leaves nothing (the next await and the blocking wait see the value); a value
/// a GPU stream writes is found through a watch in a `WaitSet` (readable at once, then paced);
/// a value out of range is refused.
#[cfg(feature = "async")]
#[test]
#[ignore = "requires a CUDA device"]
fn host_waits_are_awaited_and_watched_and_a_cancelled_one_leaves_nothing() {
    use cuda_ipc::wait::WaitSet;

    let _serial = serial();
    let _dog = watchdog("awaited host waits", Duration::from_secs(120));
    let ctx = gpu();
    let sig = IpcSignal::new(&ctx).unwrap();
    let rt = common::tokio_runtime();
    // Cancelled: nothing came within 30 ms.
    let cancelled = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(30), sig.wait_host_async(1)).await
    });
    assert!(cancelled.is_err(), "{cancelled:?}");
    // Signalled by another thread after 50 ms: awaited.
    let t = Instant::now();
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            sig.signal_host(1).unwrap();
        });
        rt.block_on(sig.wait_host_async(1)).unwrap()
    });
    assert_eq!(got, 1);
    assert!(
        t.elapsed() >= Duration::from_millis(45),
        "{:?}",
        t.elapsed()
    );
    eprintln!("signal: awaited a host signal in {:?}", t.elapsed());
    assert_eq!(sig.wait_host(1, Duration::ZERO).unwrap(), 1);
    // A GPU stream writes 2 after a 50 ms host sleep; a WaitSet finds it through the watch.
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut watch = sig.watch(2).unwrap();
    assert_eq!(watch.value(), 2);
    let mut set = WaitSet::new().unwrap();
    let key = set.attach(&watch).unwrap();
    let _deadline = set.attach_deadline(Instant::now() + Duration::from_secs(30));
    assert_eq!(
        set.wait(Some(Duration::ZERO)).unwrap(),
        vec![key],
        "ready at once"
    );
    assert_eq!(watch.check().unwrap(), None);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: `sig` outlives the stream's work (synchronised below).
            unsafe { sig.signal(&stream, 2).unwrap() };
        });
        let mut looks = 0;
        let found = loop {
            let ready = set.wait(None).unwrap();
            assert_eq!(ready, vec![key], "the deadline is 30 s away");
            looks += 1;
            if let Some(v) = watch.check().unwrap() {
                break v;
            }
        };
        assert_eq!(found, 2);
        // Paced: at most one look per pause (10 µs doubling to 1 ms) over ~50 ms.
        assert!(looks < 200, "{looks} looks in {:?}", t.elapsed());
        eprintln!(
            "signal: watched a GPU write in {:?}, {looks} looks",
            t.elapsed()
        );
    });
    stream.synchronize().unwrap();
    assert!(matches!(
        sig.watch(GpuSignal::MAX_VALUE + 1),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::OutOfRange { .. },
            ..
        })
    ));
    drop((watch, set));
    sig.close(Duration::ZERO).unwrap();
}

/// An awaited host wait ends with `PeerGone` (exporter) when the exporter is killed, within
/// the blocking wait's bound.
#[cfg(feature = "async")]
#[test]
#[ignore = "requires a CUDA device"]
fn an_awaited_host_wait_notices_a_dead_exporter() {
    let _serial = serial();
    let _dog = watchdog("awaited dead exporter", Duration::from_secs(120));
    let ctx = gpu();
    let shared = region();
    let child = spawn("idle_exporter", &[shared.name()]);
    wait_for("exporter", Duration::from_secs(60), || {
        shared.producer_up.load(Ordering::Acquire) == 1
    });
    let sig = ImportedSignal::open(&ctx, &shared.ready.load()).unwrap();
    let pid = child.pid();
    let rt = common::tokio_runtime();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            child.signal(libc::SIGKILL);
        });
        let t = Instant::now();
        let r = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sig.wait_host_async(1)).await
        });
        eprintln!(
            "signal: awaited wait saw the dead exporter after {:?}",
            t.elapsed()
        );
        r
    });
    let _ = child.wait(Duration::from_secs(30));
    match outcome {
        Ok(Err(Error::PeerGone {
            pid: p,
            role: PeerRole::Exporter,
        })) => assert_eq!(p, pid),
        other => panic!("expected PeerGone (exporter), got {other:?}"),
    }
}
