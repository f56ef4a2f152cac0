//! IpcSender / IpcReceiver across processes on the GPU: a slow producer kernel is never
//! overtaken (every byte of every item checked, across two GPUs when there are two),
//! back-pressure and capacity, the death of either side at each step (a clear error within a
//! bound, every stream released, nothing left in `/dev/shm`), and forged or misused handles.
//!
//! GPU tests are `#[ignore = "requires a CUDA device"]`: run them with `--include-ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{DeviceBuffer, Module, Stream, StreamFlags, launch};
use common::{die, gpu, gpu_count, shm_entries, spawn, unique_name, wait_for, watchdog};
use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
use cuda_ipc::error::{ArgumentDefect, ObjectState, PeerRole};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, GpuContext, ShmSafe};

const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");
const ITEM: usize = 4 << 20;
const SLOTS: usize = 3;
const ITEMS: u64 = 12;
const WAIT: Duration = Duration::from_secs(20);
/// Items of the several-streams tests.
const STREAM_ITEMS: u64 = 6;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    handle: ShmCell<IpcChannelHandle<u8>>,
    up: AtomicU32,
    /// Items the child has sent / received.
    progress: AtomicU64,
    /// Set by the parent to let the child go on.
    go: AtomicU64,
}

fn region() -> ShmRegion<Shared> {
    ShmOptions::new(unique_name("gpu-chan")).create().unwrap()
}

/// The other GPU when there are two, else the same one.
fn other_device() -> u32 {
    gpu_count().min(2) - 1
}

/// The channel regions, lease tables and block tables in `/dev/shm`, but for this process's
/// export registry (it lives until the process exits).
fn entries() -> HashSet<String> {
    let mut all: HashSet<String> = shm_entries("cuda-ipc-chan").into_iter().collect();
    all.extend(shm_entries("cuda-ipc-lease."));
    all.extend(shm_entries("cuda-ipc-arena."));
    for name in cuda_ipc::__private::registry::names() {
        all.remove(&name);
    }
    all
}

/// Fail if a channel region or lease table appeared since `before`.
fn assert_nothing_left(before: &HashSet<String>, what: &str) {
    let left: Vec<_> = entries().difference(before).cloned().collect();
    assert!(left.is_empty(), "{what}: left in /dev/shm: {left:?}");
}

/// The GPU tests of this binary run one at a time (lease and /dev/shm counts are per test).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn wait_go(s: &Shared, at_least: u64) {
    wait_for("the parent's go", WAIT, || {
        s.go.load(Ordering::SeqCst) >= at_least
    });
}

/// What a GPU test holds while it consumes from a producer child.
struct Attached {
    s: ShmRegion<Shared>,
    before: HashSet<String>,
    child: common::Child,
    ctx: GpuContext,
    stream: Stream,
    rx: IpcReceiver<u8>,
}

/// Start a producer child in `role` (given the region's name, device 0, then `args`) and
/// attach to its channel as the consumer, on the other GPU when there are two (on the same
/// GPU otherwise), with a stream of our own there.
fn attach(role: &str, args: &[&str]) -> Attached {
    let s = region();
    let before = entries();
    let mut all = vec![s.name(), "0"];
    all.extend_from_slice(args);
    let child = spawn(role, &all);
    wait_for("producer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
    let ctx = GpuContext::new(other_device()).unwrap();
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let rx = IpcReceiver::<u8>::open(&ctx, &s.handle.load()).unwrap();
    Attached {
        s,
        before,
        child,
        ctx,
        stream,
        rx,
    }
}

/// Copy `len` bytes at `ptr` to the host on `stream` and check that every one is `value`.
/// Item `k`'s header in the batch test: none for every third item, else up to 4,096 bytes
/// naming it.
fn header_of(k: u64) -> Vec<u8> {
    if k.is_multiple_of(3) {
        return Vec::new();
    }
    let name = format!("item {k};");
    name.bytes()
        .cycle()
        .take(name.len() * (1 + (k as usize * 97) % 450))
        .take(4096)
        .collect()
}

fn check_bytes(stream: &Stream, ptr: u64, len: usize, value: u8) {
    let mut host = vec![0u8; len];
    // SAFETY: `len` bytes of a received item, inside the mapping until its release; `host`
    // lives until the stream is synchronised below.
    let rc = unsafe {
        cuda_ipc::driver::sys::cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr().cast(),
            ptr,
            len,
            stream.as_inner().cast(),
        )
    };
    assert_eq!(rc, 0, "cuMemcpyDtoHAsync");
    stream.synchronize().unwrap();
    let bad = host.iter().filter(|&&b| b != value).count();
    assert_eq!(
        bad, 0,
        "item {value} (mod 256): {bad} of {len} bytes differ"
    );
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = ShmOptions::new(&args[0]).open::<Shared>().unwrap();
        let device: u32 = args[1].parse().unwrap();
        let ctx = GpuContext::new(device).unwrap();
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
        match role {
            // Items 1..=ITEMS, each filled by a kernel that first spins 20 ms: every byte = k.
            // With `die_at` = "before_send", dies holding a slot after 2 items; with
            // "after_send", dies right after sending item 3 while its 1 s kernel still runs;
            // "exit" returns and "unopened" dies as soon as the handle is out.
            "slow_producer" => {
                let die_at = args.get(2).map(String::as_str).unwrap_or("");
                let module = Module::from_ptx(KERNELS, &[]).unwrap();
                let delay = module.get_function("delay_fill").unwrap();
                let mut tx = IpcSender::<u8>::new(&ctx, SLOTS, ITEM).unwrap();
                s.handle.store(tx.handle());
                s.up.store(1, Ordering::SeqCst);
                match die_at {
                    "exit" => return 0,  // gone before anyone opens the handle
                    "unopened" => die(), // killed before anyone opens it: the region stays
                    _ => {}
                }
                wait_for("the consumer to attach", WAIT, || tx.consumer().is_some());
                for k in 1..=ITEMS {
                    // Before a death, items 1 and 2 are complete on the GPU (a process that
                    // dies takes its unfinished GPU work with it).
                    if !die_at.is_empty() && k == 3 {
                        stream.synchronize().unwrap();
                    }
                    let slot = tx.acquire(&stream, WAIT).unwrap();
                    if die_at == "before_send" && k == 3 {
                        die();
                    }
                    let spin: u64 = if die_at == "after_send" && k == 3 {
                        1_000_000_000
                    } else {
                        20_000_000
                    };
                    let ptr = slot.as_raw_ptr();
                    // SAFETY: delay_fill(ptr, n, value, delay_ns) writes ITEM bytes of the slot;
                    // the channel tracks the stream until the send after it has run.
                    unsafe {
                        launch!(delay<<<64, 256, 0, stream>>>(ptr, ITEM as u64, k as u32, spin))
                            .unwrap();
                    }
                    slot.send(ITEM - k as usize).unwrap();
                    s.progress.store(k, Ordering::SeqCst);
                    if die_at == "after_send" && k == 3 {
                        die();
                    }
                }
                wait_go(&s, 1);
                0
            }
            // Receive `hold` items (releasing all but the last), then: "hold" dies holding it;
            // "after_release" releases it behind a 1 s kernel and dies; "close" drops the
            // receiver; "wait" waits for the parent's go first (back-pressure), then receives all;
            // "linger" receives and releases all, then waits for the parent's go to drop.
            // A consumer of a broadcast channel: receive until closed, checking every byte of
            // item k = k (mod 256); "die" dies holding its 3rd item; "batch" receives in
            // batches of up to 2 and with `try_recv`, in turn. Reports its first and last
            // item and how many it received.
            "broadcast_consumer" => {
                let how = args[2].as_str();
                let mut rx = IpcReceiver::<u8>::open(&ctx, &s.handle.load()).unwrap();
                s.up.fetch_add(1, Ordering::SeqCst);
                let (mut first, mut last, mut count) = (0u64, 0u64, 0u64);
                let mut seen = |k: u64, ptr: u64, len: usize| {
                    if first == 0 {
                        first = k;
                    }
                    assert!(last == 0 || k == last + 1, "item {k} after {last}");
                    check_bytes(&stream, ptr, len, k as u8);
                    last = k;
                    count += 1;
                    count
                };
                let mut turn = 0u64;
                loop {
                    turn += 1;
                    let result = if how == "batch" && turn.is_multiple_of(2) {
                        rx.recv_batch(&stream, 2, WAIT).map(|batch| {
                            for item in batch.items().collect::<Vec<_>>() {
                                seen(item.seq, item.ptr, item.len);
                            }
                            batch.release().unwrap();
                        })
                    } else if how == "batch" {
                        let deadline = std::time::Instant::now() + WAIT;
                        loop {
                            match rx.try_recv(&stream) {
                                Ok(Some(item)) => {
                                    seen(item.seq(), item.as_raw_ptr(), item.len());
                                    item.release().unwrap();
                                    break Ok(());
                                }
                                Ok(None) => {
                                    assert!(std::time::Instant::now() < deadline, "try_recv");
                                    std::thread::sleep(Duration::from_micros(50));
                                }
                                Err(e) => break Err(e),
                            }
                        }
                    } else {
                        rx.recv(&stream, WAIT).map(|item| {
                            let n = seen(item.seq(), item.as_raw_ptr(), item.len());
                            if how == "die" && n == 3 {
                                die();
                            }
                            item.release().unwrap();
                        })
                    };
                    match result {
                        Ok(()) => {}
                        Err(Error::ChannelClosed { .. }) => break,
                        Err(e) => panic!("broadcast consumer: {e}"),
                    }
                }
                common::report(format!("first {first} last {last} count {count}"));
                drop(rx);
                0
            }
            "consumer" => {
                let how = args[2].as_str();
                let hold: u64 = args[3].parse().unwrap();
                let module = Module::from_ptx(KERNELS, &[]).unwrap();
                let delay = module.get_function("delay_fill").unwrap();
                // Plain device memory (an IpcBuffer would leave its lease table at our death).
                let mut scratch = 0u64;
                // SAFETY: writes one device pointer; the process dies with it.
                let rc = unsafe { cuda_ipc::driver::sys::cuMemAlloc_v2(&mut scratch, 16) };
                assert_eq!(rc, 0);
                let mut rx = IpcReceiver::<u8>::open(&ctx, &s.handle.load()).unwrap();
                s.up.store(1, Ordering::SeqCst);
                if how == "wait" {
                    wait_go(&s, 1);
                }
                for k in 1..=hold {
                    let item = rx.recv(&stream, WAIT).unwrap();
                    assert_eq!(item.seq(), k);
                    s.progress.store(k, Ordering::SeqCst);
                    if k < hold {
                        item.release().unwrap();
                        continue;
                    }
                    match how {
                        "hold" => die(),
                        "after_release" => {
                            let p = scratch;
                            // SAFETY: writes 16 bytes of a live scratch buffer after 1 s.
                            unsafe {
                                launch!(delay<<<1, 32, 0, stream>>>(p, 16u64, 1u32, 1_000_000_000u64))
                                    .unwrap();
                            }
                            item.release().unwrap();
                            die();
                        }
                        // Release behind a 1 s kernel and drop the receiver at once: the drop
                        // returns without waiting for the kernel (the end drains later), and
                        // the process returns from its role while the kernel still runs: the
                        // exit hook finishes the drain, so the producer sees a clean close.
                        "drop_behind_kernel" => {
                            let p = scratch;
                            // SAFETY: writes 16 bytes of a live scratch buffer after 1 s.
                            unsafe {
                                launch!(delay<<<1, 32, 0, stream>>>(p, 16u64, 1u32, 1_000_000_000u64))
                                    .unwrap();
                            }
                            item.release().unwrap();
                            let t = Instant::now();
                            drop(rx);
                            let dropped = t.elapsed();
                            let left = cuda_ipc::collect_deferred();
                            common::report(format!("dropped in {} ms", dropped.as_millis()));
                            common::report(format!("draining {}", left.draining));
                            // The kernel still runs: leave its module and stream to the exit
                            // (an unload under a running kernel is not ours to test here).
                            std::mem::forget(module);
                            std::mem::forget(stream);
                            return 0;
                        }
                        _ => item.release().unwrap(),
                    }
                }
                if how == "linger" {
                    wait_go(&s, 1); // still attached, mapping the slots and counters
                }
                drop(rx);
                0
            }
            // Items 1..=STREAM_ITEMS in a ring of `args[2]` slots, every byte of item k = k.
            // "alternate": odd items on one stream behind a 150 ms spin, even ones on another
            // stream at once; "one": every item on one stream at once.
            "stream_producer" => {
                let slots: usize = args[2].parse().unwrap();
                let alternate = args[3] == "alternate";
                let module = Module::from_ptx(KERNELS, &[]).unwrap();
                let delay = module.get_function("delay_fill").unwrap();
                let other = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
                let mut tx = IpcSender::<u8>::new(&ctx, slots, ITEM).unwrap();
                s.handle.store(tx.handle());
                s.up.store(1, Ordering::SeqCst);
                wait_for("the consumer to attach", WAIT, || tx.consumer().is_some());
                for k in 1..=STREAM_ITEMS {
                    let (on, spin) = match (alternate, k % 2) {
                        (true, 1) => (&stream, 150_000_000u64),
                        (true, _) => (&other, 0),
                        (false, _) => (&stream, 0),
                    };
                    let slot = tx.acquire(on, WAIT).unwrap();
                    let ptr = slot.as_raw_ptr();
                    // SAFETY: delay_fill writes ITEM bytes of the slot; the channel tracks the
                    // stream until the send after it has run.
                    unsafe {
                        launch!(delay<<<64, 256, 0, on>>>(ptr, ITEM as u64, k as u32, spin))
                            .unwrap();
                    }
                    slot.send(ITEM).unwrap();
                }
                wait_go(&s, 1);
                0
            }
            // Items 1..=ITEMS in batches of 1, 2 and 3 slots (every byte of item k = k, k in
            // 5 ms for odd k), lengths ITEM - k; misuse of a batch refused first.
            "batch_producer" => {
                let module = Module::from_ptx(KERNELS, &[]).unwrap();
                let delay = module.get_function("delay_fill").unwrap();
                let mut tx = IpcSender::<u8>::new(&ctx, SLOTS, ITEM).unwrap();
                s.handle.store(tx.handle());
                s.up.store(1, Ordering::SeqCst);
                wait_for("the consumer to attach", WAIT, || tx.consumer().is_some());
                for bad in [0, SLOTS + 1] {
                    let e = tx.acquire_batch(&stream, bad, WAIT).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                }
                let mut k = 1u64;
                for size in [1usize, 2, 3, 1, 3, 2] {
                    let mut batch = tx.acquire_batch(&stream, size, WAIT).unwrap();
                    assert_eq!(batch.len(), size);
                    for slot in batch.slots().collect::<Vec<_>>() {
                        assert_eq!((slot.seq, slot.capacity), (k, ITEM));
                        let (ptr, spin) = (slot.ptr, if k % 2 == 1 { 5_000_000u64 } else { 0 });
                        // SAFETY: delay_fill writes ITEM bytes of the slot; the channel tracks
                        // the stream until the send after it has run.
                        unsafe {
                            launch!(delay<<<64, 256, 0, stream>>>(ptr, ITEM as u64, k as u32, spin))
                                .unwrap();
                        }
                        k += 1;
                    }
                    let lens: Vec<usize> = batch.slots().map(|s| ITEM - s.seq as usize).collect();
                    let headers: Vec<Vec<u8>> = batch.slots().map(|s| header_of(s.seq)).collect();
                    let headers: Vec<&[u8]> = headers.iter().map(Vec::as_slice).collect();
                    // A wrong number of lengths or headers, or a header over the bound, keeps
                    // the slots: send again.
                    let e = batch.send(&lens[1..]).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                    batch = tx.acquire_batch(&stream, size, WAIT).unwrap();
                    let e = batch.send_with_headers(&lens, &headers[1..]).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                    batch = tx.acquire_batch(&stream, size, WAIT).unwrap();
                    let big = vec![0u8; cuda_ipc::channel::HEADER_BYTES + 1];
                    let mut too_big = headers.clone();
                    too_big[0] = &big;
                    let e = batch.send_with_headers(&lens, &too_big).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                    batch = tx.acquire_batch(&stream, size, WAIT).unwrap();
                    if size == 1 {
                        // A single slot of a batch and a plain item mix: send it as one.
                        drop(batch);
                        let slot = tx.acquire(&stream, WAIT).unwrap();
                        let e = slot.send_with_header(lens[0], &big).unwrap_err();
                        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                        let slot = tx.acquire(&stream, WAIT).unwrap();
                        slot.send_with_header(lens[0], headers[0]).unwrap();
                    } else {
                        batch.send_with_headers(&lens, &headers).unwrap();
                    }
                    s.progress.store(k - 1, Ordering::SeqCst);
                }
                assert_eq!(k - 1, ITEMS);
                wait_go(&s, 1);
                0
            }
            // A consumer arriving after another attached: refused, never a second attach.
            "second_consumer" => match IpcReceiver::<u8>::open(&ctx, &s.handle.load()) {
                Err(Error::NotFound { .. } | Error::ChannelInUse { .. }) => 0,
                other => {
                    eprintln!("second consumer: {other:?}");
                    1
                }
            },
            _ => unreachable!("{role}"),
        }
    });
}

/// A producer whose kernels spin 20 ms before writing: the consumer's GPU work (a copy to the
/// host on the receiving stream) never sees an item before its kernel is done, and every byte
/// of every item is the item's number; lengths travel with items. Across two GPUs when there
/// are two. Then the producer's close ends the stream of items with `ChannelClosed`.
#[test]
#[ignore = "requires a CUDA device"]
fn a_slow_producer_is_never_overtaken() {
    let _g = serial();
    let _dog = watchdog("slow producer", Duration::from_secs(120));
    let Attached {
        s,
        before,
        child,
        ctx: _ctx,
        stream,
        mut rx,
    } = attach("slow_producer", &[]);
    assert_eq!((rx.slots(), rx.capacity()), (SLOTS, ITEM));
    let chans: HashSet<String> = shm_entries("cuda-ipc-chan").into_iter().collect();
    assert!(
        chans.is_subset(&before),
        "the consumer unlinks the channel's name on attach: {chans:?}"
    );
    let mut early = 0;
    for k in 1..=ITEMS {
        let item = rx.recv(&stream, WAIT).unwrap();
        assert_eq!((item.seq(), item.len()), (k, ITEM - k as usize));
        let t = Instant::now();
        let host = item.to_vec(WAIT).unwrap();
        // recv itself did not wait for the kernel: the copy did, on the GPU.
        if t.elapsed() > Duration::from_millis(5) {
            early += 1;
        }
        let bad = host.iter().filter(|&&b| b != k as u8).count();
        assert_eq!(bad, 0, "item {k}: {bad} bytes not yet written");
        item.release().unwrap();
    }
    println!("{early} of {ITEMS} items were received before their kernel finished");
    assert!(
        early > 0,
        "recv never returned ahead of the producer's GPU work"
    );
    s.go.store(1, Ordering::SeqCst);
    let e = rx.recv(&stream, WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ChannelClosed {
                role: "producer",
                ..
            }
        ),
        "{e}"
    );
    rx.close(WAIT).unwrap();
    child.expect_success(WAIT);
    assert_nothing_left(&before, "after both closed");
}

/// The producer sends odd items on a stream that spins 150 ms before writing and even items
/// on another stream at once: the consumer's GPU never reads an item before its writes are
/// done, though the later item's signal was ready first (the counter must not jump ahead, nor
/// go back).
#[test]
#[ignore = "requires a CUDA device"]
fn items_sent_on_several_streams_arrive_in_order() {
    let _g = serial();
    let _dog = watchdog("several producer streams", Duration::from_secs(120));
    let Attached {
        s,
        before,
        child,
        ctx: _ctx,
        stream,
        mut rx,
    } = attach("stream_producer", &["3", "alternate"]);
    for k in 1..=STREAM_ITEMS {
        let item = rx.recv(&stream, WAIT).unwrap();
        let host = item.to_vec(WAIT).unwrap();
        let bad = host.iter().filter(|&&b| b != k as u8).count();
        assert_eq!(
            bad, 0,
            "item {k}: {bad} bytes read before they were written"
        );
        item.release().unwrap();
    }
    s.go.store(1, Ordering::SeqCst);
    rx.close(WAIT).unwrap();
    child.expect_success(WAIT);
    assert_nothing_left(&before, "after both closed");
}

/// The consumer reads item 1 on a stream that first spins 150 ms, and releases item 2 on
/// another stream at once: the producer (2 slots) must not refill item 1's slot with item 3
/// before that read, though release 2 reached the GPU first.
#[test]
#[ignore = "requires a CUDA device"]
fn items_released_on_several_streams_free_slots_in_order() {
    use cuda_ipc::driver::sys;
    let _g = serial();
    let _dog = watchdog("several consumer streams", Duration::from_secs(120));
    let Attached {
        s,
        before,
        child,
        ctx: _ctx,
        stream: _,
        mut rx,
    } = attach("stream_producer", &["2", "one"]);
    let module = Module::from_ptx(KERNELS, &[]).unwrap();
    let delay = module.get_function("delay_fill").unwrap();
    let slow = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let fast = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let copy = DeviceBuffer::<u8>::zeroed(ITEM).unwrap();
    let scratch = DeviceBuffer::<u8>::zeroed(16).unwrap();
    // Item 1: spin 150 ms on `slow`, then copy the slot out, then release — all on `slow`.
    let item = rx.recv(&slow, WAIT).unwrap();
    let p = scratch.as_raw_ptr();
    // SAFETY: delay_fill writes 16 bytes of a live scratch buffer after spinning.
    unsafe {
        launch!(delay<<<1, 32, 0, slow>>>(p, 16u64, 0u32, 150_000_000u64)).unwrap();
    }
    // SAFETY: both ranges are ITEM bytes inside live allocations; the slot stays mapped until
    // the release after the copy has run (the receiver tracks its stream).
    let rc = unsafe {
        sys::cuMemcpyDtoDAsync_v2(
            copy.as_raw_ptr(),
            item.as_raw_ptr(),
            ITEM,
            slow.as_inner().cast(),
        )
    };
    assert_eq!(rc, 0);
    item.release().unwrap();
    // Items 2..: on `fast`; item 3 reuses item 1's slot.
    for k in 2..=STREAM_ITEMS {
        let item = rx.recv(&fast, WAIT).unwrap();
        let host = item.to_vec(WAIT).unwrap();
        assert!(host.iter().all(|&b| b == k as u8), "item {k} wrong");
        item.release().unwrap();
    }
    slow.synchronize().unwrap();
    let mut host = vec![0u8; ITEM];
    copy.copy_to(&mut host[..]).unwrap();
    let bad = host.iter().filter(|&&b| b != 1).count();
    assert_eq!(
        bad, 0,
        "item 1's slot was refilled while the consumer was still reading it ({bad} bytes)"
    );
    s.go.store(1, Ordering::SeqCst);
    rx.close(WAIT).unwrap();
    child.expect_success(WAIT);
    assert_nothing_left(&before, "after both closed");
}

/// Batches on both sides: the producer sends batches of 1, 2 and 3 slots (odd items behind a
/// 5 ms kernel; a batch of one sent as a plain slot), the consumer alternates batches of up to
/// 3 with single items; every byte of every item arrives, in order, with its length and its
/// header (0 to 4,096 bytes), and misuse is refused (wrong counts, a header over the bound).
#[test]
#[ignore = "requires a CUDA device"]
fn batches_carry_items_in_order_and_mix_with_single_items() {
    use cuda_ipc::driver::sys;
    let _g = serial();
    let _dog = watchdog("batches", Duration::from_secs(120));
    let Attached {
        s,
        before,
        child,
        ctx: _ctx,
        stream,
        mut rx,
    } = attach("batch_producer", &[]);
    for bad in [0, SLOTS + 1] {
        let e = rx.recv_batch(&stream, bad, WAIT).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
    let check = |seq: u64, ptr: u64, len: usize, header: &[u8]| {
        assert_eq!(len, ITEM - seq as usize, "item {seq}'s length");
        assert_eq!(header, header_of(seq), "item {seq}'s header");
        let mut host = vec![0u8; len];
        // SAFETY: `len` bytes of the item, inside the mapping until its release; `host` lives
        // until the stream is synchronised below.
        let rc = unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, len, stream.as_inner().cast())
        };
        assert_eq!(rc, 0);
        stream.synchronize().unwrap();
        let bad = host.iter().filter(|&&b| b != seq as u8).count();
        assert_eq!(bad, 0, "item {seq}: {bad} bytes not yet written");
    };
    let mut next = 1u64;
    let mut batches = 0;
    while next <= ITEMS {
        if batches % 2 == 0 {
            let batch = rx.recv_batch(&stream, SLOTS, WAIT).unwrap();
            for (i, item) in batch.items().collect::<Vec<_>>().into_iter().enumerate() {
                assert_eq!(item.seq, next);
                check(item.seq, item.ptr, item.len, batch.header(i).unwrap());
                next += 1;
            }
            assert!(batch.header(batch.len()).is_none());
            batch.release().unwrap();
        } else {
            let item = rx.recv(&stream, WAIT).unwrap();
            assert_eq!(item.seq(), next);
            check(item.seq(), item.as_raw_ptr(), item.len(), item.header());
            next += 1;
            item.release().unwrap();
        }
        batches += 1;
    }
    s.go.store(1, Ordering::SeqCst);
    let e = rx.recv_batch(&stream, 2, WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ChannelClosed {
                role: "producer",
                ..
            }
        ),
        "{e}"
    );
    rx.close(WAIT).unwrap();
    child.expect_success(WAIT);
    assert_nothing_left(&before, "after both closed");
}

/// A full ring holds the producer back (try_acquire says so, acquire times out), a release
/// frees exactly one slot, a length above the capacity is refused, and the consumer's close
/// ends the producer with `ChannelClosed`.
#[test]
#[ignore = "requires a CUDA device"]
fn back_pressure_and_capacity() {
    let _g = serial();
    let _dog = watchdog("back-pressure", Duration::from_secs(120));
    let s = region();
    let ctx = gpu();
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut tx = IpcSender::<u8>::new(&ctx, 2, 4096).unwrap();
    s.handle.store(tx.handle());
    let child = spawn(
        "consumer",
        &[s.name(), &other_device().to_string(), "wait", "3"],
    );
    wait_for("consumer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
    assert!(tx.consumer().is_some());
    let slot = tx.acquire(&stream, WAIT).unwrap();
    let e = slot.send(4097).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                call: "SendSlot::send",
                defect: ArgumentDefect::OutOfRange {
                    value: 4097,
                    max: 4096,
                    ..
                }
            }
        ),
        "{e}"
    );
    tx.acquire(&stream, WAIT).unwrap().send(4096).unwrap();
    tx.acquire(&stream, WAIT).unwrap().send(0).unwrap();
    assert!(
        tx.try_acquire(&stream).unwrap().is_none(),
        "2 slots, 2 sent"
    );
    let e = tx.acquire(&stream, Duration::from_millis(50)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    s.go.store(1, Ordering::SeqCst);
    // The consumer receives item 1 and releases it: one slot comes back.
    tx.acquire(&stream, WAIT).unwrap().send(1).unwrap();
    wait_for("consumer done", WAIT, || {
        s.progress.load(Ordering::SeqCst) == 3
    });
    child.expect_success(WAIT);
    let e = tx.acquire(&stream, WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ChannelClosed {
                role: "consumer",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(tx.sent(), 3);
    tx.close(WAIT).unwrap();
}

/// The producer dies holding a slot (before its send) or right after a send whose kernel is
/// still running: the consumer gets what was sent and completed, then `PeerGone` (exporter) within a
/// bound; dropping the receiver releases its stream (blocked on the dead producer's counter)
/// instead of hanging, and leaves nothing in `/dev/shm`.
#[test]
#[ignore = "requires a CUDA device"]
fn a_dead_producer_is_reported_and_nothing_hangs() {
    let _g = serial();
    let _dog = watchdog("dead producer", Duration::from_secs(120));
    for die_at in ["before_send", "after_send"] {
        let Attached {
            s: _s,
            before,
            child,
            ctx: _ctx,
            stream,
            mut rx,
        } = attach("slow_producer", &[die_at]);
        let mut got = 0;
        let err = loop {
            match rx.recv(&stream, WAIT) {
                Ok(item) => {
                    got += 1;
                    if item.seq() <= 2 {
                        let host = item.to_vec(WAIT).unwrap();
                        assert!(host.iter().all(|&b| b == item.seq() as u8));
                    }
                    // Item 3 of "after_send" was published, but its kernel died with the
                    // producer: do not wait for it on the host.
                    item.release().unwrap();
                }
                Err(e) => break e,
            }
        };
        let (status, _) = child.wait(WAIT);
        assert!(!status.success());
        assert!(
            matches!(
                err,
                Error::PeerGone {
                    role: PeerRole::Exporter,
                    ..
                }
            ),
            "{die_at}: {err}"
        );
        let want = if die_at == "before_send" { 2 } else { 3 };
        assert_eq!(got, want, "{die_at}");
        let t = Instant::now();
        drop(rx); // must not hang on the stream parked on item 3's counter
        let dropped = t.elapsed();
        println!(
            "{die_at}: PeerGone (exporter) after {got} items; receiver dropped in {dropped:?}"
        );
        // A drop that had to give up (and leak) would leave the stream blocked for good.
        assert!(
            dropped < Duration::from_secs(5),
            "{die_at}: the stream was not released"
        );
        stream.synchronize().unwrap();
        // The drop forced the dead producer's counter and left the rest to a collect: with the
        // stream done, this one closes the receiver (and its import of the dead producer's
        // memory, whose names the last importer removes).
        assert_eq!(cuda_ipc::collect_deferred().draining, 0, "{die_at}");
        assert_nothing_left(&before, die_at);
    }
}

/// Dropping a channel end never waits for its GPU work: a consumer that
/// releases its last item behind a 1 s kernel drops its receiver in well under that second
/// (the end waits on this process's list of draining ends), then returns from `main` while
/// the kernel runs; the exit hook finishes the drain, so the producer sees `ChannelClosed`, a
/// clean close, not `PeerGone` (which a consumer that never closed would be).
#[test]
#[ignore = "requires a CUDA device"]
fn a_dropped_end_never_waits_and_still_closes_cleanly_at_exit() {
    let _g = serial();
    let _dog = watchdog("drop never waits", Duration::from_secs(120));
    let s = region();
    let before = entries();
    let ctx = gpu();
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut tx = IpcSender::<u8>::new(&ctx, 2, 1 << 20).unwrap();
    s.handle.store(tx.handle());
    let child = spawn(
        "consumer",
        &[
            s.name(),
            &other_device().to_string(),
            "drop_behind_kernel",
            "2",
        ],
    );
    wait_for("consumer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
    for _ in 0..2 {
        tx.acquire(&stream, WAIT).unwrap().send(16).unwrap();
    }
    let out = child.expect_success(WAIT);
    let dropped: u64 = out[0]
        .strip_prefix("dropped in ")
        .and_then(|r| r.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("child said {out:?}"));
    println!(
        "receiver dropped in {dropped} ms behind a 1 s kernel; {}",
        out[1]
    );
    assert!(
        dropped < 500,
        "the drop waited for the kernel: {dropped} ms"
    );
    assert_eq!(
        out[1], "draining 1",
        "the dropped end was not left to a collect"
    );
    let err = loop {
        match tx.acquire(&stream, WAIT) {
            Ok(slot) => slot.send(16).unwrap(),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::ChannelClosed { .. }),
        "the consumer's exit did not close its end: {err}"
    );
    tx.close(WAIT).unwrap();
    stream.synchronize().unwrap();
    assert_nothing_left(&before, "after the exit drain");
}

/// The consumer dies holding an item, or right after releasing one behind a 1 s kernel: the
/// producer gets `PeerGone` (importer) when it needs that slot, within a bound; dropping the sender
/// releases its stream and frees the memory without waiting out the lease timeout.
#[test]
#[ignore = "requires a CUDA device"]
fn a_dead_consumer_is_reported_and_nothing_hangs() {
    let _g = serial();
    let _dog = watchdog("dead consumer", Duration::from_secs(120));
    for how in ["hold", "after_release"] {
        let s = region();
        let before = entries();
        let ctx = gpu();
        ctx.make_current().unwrap();
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
        let mut tx = IpcSender::<u8>::new(&ctx, 2, 1 << 20).unwrap();
        s.handle.store(tx.handle());
        let child = spawn(
            "consumer",
            &[s.name(), &other_device().to_string(), how, "2"],
        );
        wait_for("consumer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
        let mut sent = 0;
        let t = Instant::now();
        let err = loop {
            match tx.acquire(&stream, WAIT) {
                Ok(slot) => {
                    slot.send(16).unwrap();
                    sent += 1;
                }
                Err(e) => break e,
            }
        };
        let (status, _) = child.wait(WAIT);
        assert!(!status.success());
        assert!(
            matches!(
                err,
                Error::PeerGone {
                    role: PeerRole::Importer(_),
                    ..
                }
            ),
            "{how}: {err}"
        );
        assert!(sent >= 2, "{how}: {sent}");
        println!(
            "{how}: PeerGone (consumer) after {sent} sends, {:?}",
            t.elapsed()
        );
        let t = Instant::now();
        tx.close(WAIT).unwrap();
        let closed = t.elapsed();
        println!("{how}: sender closed in {closed:?}");
        assert!(
            closed < Duration::from_secs(5),
            "{how}: close waited out the leases"
        );
        stream.synchronize().unwrap();
        assert_nothing_left(&before, how);
    }
}

/// A `close` that does not finish hands the end back whole: a sender whose
/// last send is behind a 400 ms kernel times out closing in 50 ms — nothing freed or leaked —
/// and refuses to send from then on; once the kernel is done, a consumer that still maps the
/// slots makes the close `LeasesOutstanding`, again with the sender back; after the consumer
/// has gone, the third close finishes and nothing is left.
#[test]
#[ignore = "requires a CUDA device"]
fn a_close_that_does_not_finish_hands_the_end_back_whole() {
    let _g = serial();
    let _dog = watchdog("close hands back", Duration::from_secs(60));
    let s = region();
    let before = entries();
    let ctx = gpu();
    ctx.make_current().unwrap();
    let module = Module::from_ptx(KERNELS, &[]).unwrap();
    let fill = module.get_function("delay_fill").unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut tx = IpcSender::<u8>::new(&ctx, SLOTS, ITEM).unwrap();
    s.handle.store(tx.handle());
    let dev = other_device().to_string();
    let child = spawn("consumer", &[s.name(), &dev, "linger", "2"]);
    wait_for("the consumer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
    for (k, spin_ns) in [(1u64, 1_000u64), (2, 400_000_000)] {
        let slot = tx.acquire(&stream, WAIT).unwrap();
        let ptr = slot.as_raw_ptr();
        // SAFETY: delay_fill(ptr, n, value, delay_ns) writes ITEM bytes of the slot; the
        // channel tracks the stream until the send after it has run.
        unsafe {
            launch!(fill<<<16, 256, 0, stream>>>(ptr, ITEM as u64, k as u32, spin_ns)).unwrap();
        }
        slot.send(ITEM).unwrap();
    }
    let e = tx.close(Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(e.error(), Error::Timeout { .. }),
        "behind the kernel: {}",
        e.error()
    );
    let mut tx = e.into_inner();
    match tx.acquire(&stream, WAIT) {
        Err(Error::InvalidState {
            state: ObjectState::Closing,
            ..
        }) => {}
        Err(other) => panic!("a closing sender: {other}"),
        Ok(_) => panic!("a closing sender handed out a slot"),
    }
    wait_for("the consumer's receipts", WAIT, || {
        s.progress.load(Ordering::SeqCst) == 2
    });
    stream.synchronize().unwrap();
    let e = tx.close(Duration::from_millis(100)).unwrap_err();
    assert!(
        matches!(e.error(), Error::LeasesOutstanding { .. }),
        "the consumer maps the slots: {}",
        e.error()
    );
    let tx = e.into_inner();
    s.go.store(1, Ordering::SeqCst);
    tx.close(WAIT).unwrap();
    child.expect_success(WAIT);
    assert_nothing_left(&before, "after the closes");
}

/// A broadcast channel: three consumers — two attached from the start, one of which
/// dies holding its third item, and one attached mid-stream — every byte of every item
/// checked by each. The live consumers receive every item from their start to the last, the
/// late one starts after the first item; the dead one is detached and the producer sends on.
#[test]
#[ignore = "requires a CUDA device"]
fn a_broadcast_reaches_every_consumer_and_a_dead_one_is_detached() {
    const N: u64 = 40;
    const BYTES: usize = 64 << 10;
    let _g = serial();
    let _dog = watchdog("broadcast", Duration::from_secs(120));
    let s = region();
    let before = entries();
    let ctx = gpu();
    ctx.make_current().unwrap();
    let module = Module::from_ptx(KERNELS, &[]).unwrap();
    let fill = module.get_function("delay_fill").unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let mut tx = IpcSender::<u8>::broadcast(&ctx, 2, BYTES, 3).unwrap();
    s.handle.store(tx.handle());
    let dev = other_device().to_string();
    let early = spawn("broadcast_consumer", &[s.name(), &dev, "live", "0"]);
    let doomed = spawn("broadcast_consumer", &[s.name(), &dev, "die", "0"]);
    wait_for("two consumers", WAIT, || s.up.load(Ordering::SeqCst) == 2);
    assert_eq!(tx.consumers().len(), 2);
    let mut late = None;
    let fill_at = |ptr: u64, k: u64| {
        // SAFETY: delay_fill(ptr, n, value, delay_ns) writes BYTES bytes of the slot; the
        // channel tracks the stream until the send after it has run.
        unsafe {
            launch!(fill<<<16, 256, 0, stream>>>(ptr, BYTES as u64, k as u32, 1_000u64)).unwrap();
        }
    };
    let mut k = 1;
    while k <= N {
        // In turn: `acquire`, `try_acquire` (polled), and a batch of two.
        match k % 3 {
            0 => {
                let deadline = std::time::Instant::now() + WAIT;
                let slot = loop {
                    if let Some(slot) = tx.try_acquire(&stream).unwrap() {
                        break slot;
                    }
                    assert!(std::time::Instant::now() < deadline, "try_acquire");
                    std::thread::sleep(Duration::from_micros(50));
                };
                fill_at(slot.as_raw_ptr(), k);
                slot.send(BYTES).unwrap();
            }
            1 if k < N && k != N / 2 => {
                let batch = tx.acquire_batch(&stream, 2, WAIT).unwrap();
                for slot in batch.slots() {
                    fill_at(slot.ptr, slot.seq);
                }
                batch.send(&[BYTES, BYTES]).unwrap();
                k += 1;
            }
            _ => {
                let slot = tx.acquire(&stream, WAIT).unwrap();
                fill_at(slot.as_raw_ptr(), k);
                slot.send(BYTES).unwrap();
            }
        }
        if k >= N / 2 && late.is_none() {
            late = Some(spawn("broadcast_consumer", &[s.name(), &dev, "batch", "0"]));
            wait_for("the late consumer", WAIT, || {
                s.up.load(Ordering::SeqCst) == 3
            });
        }
        k += 1;
    }
    tx.close(WAIT).unwrap();
    stream.synchronize().unwrap();
    let parse = |out: Vec<String>| -> (u64, u64, u64) {
        let w: Vec<u64> = out[0].split(' ').filter_map(|t| t.parse().ok()).collect();
        (w[0], w[1], w[2])
    };
    let (first, last, count) = parse(early.expect_success(WAIT));
    assert_eq!(
        (first, last, count),
        (1, N, N),
        "the early consumer got every item"
    );
    let (first, last, count) = parse(late.unwrap().expect_success(WAIT));
    assert!(
        first > 1 && last == N && count == N - first + 1,
        "late: {first} {last} {count}"
    );
    let (status, _) = doomed.wait(WAIT);
    assert!(!status.success(), "the doomed consumer died");
    println!("broadcast: {N} items to 3 consumers; the late one started at item {first}");
    assert_nothing_left(&before, "after the broadcast");
}

/// Open `handle`, whose producer is gone: the open must fail with `PeerGone` naming it (the
/// exporter).
fn assert_producer_gone(ctx: &GpuContext, handle: &IpcChannelHandle<u8>) {
    let e = IpcReceiver::<u8>::open(ctx, handle).unwrap_err();
    assert!(
        matches!(
            e,
            Error::PeerGone {
                role: PeerRole::Exporter,
                ..
            }
        ),
        "{e}"
    );
}

/// Handles that must not open: the wrong element type, flipped bytes, the producer's own
/// process, a second consumer, and a producer that is gone.
#[test]
#[ignore = "requires a CUDA device"]
fn forged_and_misused_handles_are_refused() {
    let _g = serial();
    let _dog = watchdog("forged handles", Duration::from_secs(120));
    let s = region();
    let ctx = gpu();
    let tx = IpcSender::<u8>::new(&ctx, 2, 64).unwrap();
    let handle = tx.handle();
    let e = IpcReceiver::<u8>::open(&ctx, &handle).unwrap_err();
    assert!(matches!(e, Error::SameProcess { .. }), "{e}");
    // SAFETY: the same 152 bytes viewed as a handle for another element type.
    let as_u32: IpcChannelHandle<u32> = bytemuck::cast(handle);
    let e = IpcReceiver::<u32>::open(&ctx, &as_u32).unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    let mut bytes = handle.as_bytes().to_vec();
    bytes[40] ^= 1;
    let e = IpcChannelHandle::<u8>::from_bytes(&bytes).unwrap_err();
    assert!(matches!(e, Error::CorruptHandle { .. }), "{e}");
    // A second consumer while the first is attached (it unlinked the name).
    s.handle.store(handle);
    let first = spawn("consumer", &[s.name(), "0", "wait", "0"]);
    wait_for("consumer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
    spawn("second_consumer", &[s.name(), "0"]).expect_success(WAIT);
    s.go.store(1, Ordering::SeqCst);
    first.expect_success(WAIT);
    drop(tx);
    // The producer's handle after it is gone (a child's channel, after the child exited).
    let s2 = region();
    let producer = spawn("slow_producer", &[s2.name(), "0", "exit"]);
    wait_for("producer", WAIT, || s2.up.load(Ordering::SeqCst) == 1);
    let dead_handle = s2.handle.load();
    producer.expect_success(WAIT);
    assert_producer_gone(&ctx, &dead_handle);
}

/// A producer killed before any consumer opened its handle leaves its region in `/dev/shm` (it
/// could not unlink it); the consumer whose open finds it dead removes it, so a long-lived
/// consumer whose producers are killed early leaves nothing behind either.
#[test]
#[ignore = "requires a CUDA device"]
fn an_open_that_finds_the_producer_killed_removes_its_region() {
    let _g = serial();
    let _dog = watchdog("killed producer's region", Duration::from_secs(120));
    let ctx = gpu();
    let s = region();
    let before: HashSet<String> = shm_entries("cuda-ipc-chan").into_iter().collect();
    let producer = spawn("slow_producer", &[s.name(), "0", "unopened"]);
    wait_for("producer", WAIT, || s.up.load(Ordering::SeqCst) == 1);
    let handle = s.handle.load();
    let (status, _) = producer.wait(WAIT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "the producer was to die by SIGKILL: {status}"
    );
    let left: Vec<String> = shm_entries("cuda-ipc-chan")
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(left.len(), 1, "the killed producer's region: {left:?}");
    assert_producer_gone(&ctx, &handle);
    assert!(
        !common::shm_exists(&left[0]),
        "the open that found the producer dead left {}",
        left[0]
    );
}

/// `close` on a sender nobody opened removes its region and lease tables (before, `close`
/// skipped the region's drop: its name stayed in `/dev/shm`).
#[test]
#[ignore = "requires a CUDA device"]
fn closing_an_unopened_sender_leaves_nothing() {
    let _g = serial();
    let before = entries();
    let ctx = gpu();
    let tx = IpcSender::<u8>::new(&ctx, 2, 64).unwrap();
    let mine: Vec<String> = entries().difference(&before).cloned().collect();
    assert!(
        mine.iter().any(|n| n.starts_with("cuda-ipc-chan")),
        "the channel's region: {mine:?}"
    );
    tx.close(WAIT).unwrap();
    assert_nothing_left(&before, "after close");
}
