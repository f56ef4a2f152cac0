//! `IpcSender`/`IpcReceiver` against the same protocol written by hand with raw driver calls,
//! in the same run. The producer is this process (device 0); a consumer helper process runs on
//! device 0, and on device 1 too when there are two GPUs.
//!
//! - `ping`: one slot, a tiny item, no kernels. One iteration: `acquire` (waits on the host
//!   for the consumer's release of the previous item and enqueues the GPU wait for it), a
//!   stream synchronise (so the consumer's GPU release is inside the time), `send`. The
//!   consumer loops `recv` + `release` and never synchronises. So an iteration is a round trip
//!   through both hosts and both GPUs. Baseline (`raw_ring`): the same steps with
//!   `cuStreamWaitValue64` / `cuStreamWriteValue64` on raw IPC-mapped counters and spinning
//!   on shared-memory words; both counters on the producer's device in both.
//! - `stream_1MiB`, `stream_64MiB`: 4 slots; the producer sends batches of items (no writes);
//!   the consumer copies each item out of its slot into its own memory on its stream
//!   (`cuMemcpyDtoDAsync`: a peer copy across GPUs), releases it, and synchronises at the end
//!   of a batch. Baseline (`native_copy`): the consumer copies the same bytes, the same number
//!   of times, from an IPC mapping of a producer buffer, with no channel.
//! - `stream_1MiB_grouped`: as `stream_1MiB` with 16 slots, the producer sending and the
//!   consumer receiving in groups of 8 (`acquire_batch` / `recv_batch`: one GPU wait and one
//!   write per group on each side), against the same native copy.
//! - `ping_async` (feature `async`): the `ping` round trip with the consumer a tokio task
//!   awaiting each item (`Listening::recv_async`, woken through its descriptor) instead of a
//!   thread blocked in `recv`, against the blocking `ping` in the same run.
//! - `ping_async_fd` (feature `async`): the same, the listening receiver registered with
//!   tokio's own reactor (`tokio::io::unix::AsyncFd`) and `try_recv` called when it is
//!   readable: one thread hop fewer than `recv_async`, whose wake goes through the crate's
//!   reactor thread.
//! - `ping_wait_set`: the `ping` round trip through one of 64 channels in turn, the consumer
//!   one thread waiting on a `WaitSet` of all 64 listening receivers, against the one-channel
//!   blocking `ping` in the same run.
//! - `torch.multiprocessing`: a CUDA tensor of the ping item's size put on a queue and rebuilt
//!   by another Python process (`examples/interop/cuda_ipc_peer.py torch-mp-bench`), against
//!   the one-GPU ping round trip.
//!
//! Run: `cargo bench --bench channel`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
use cuda_ipc::driver::sys;
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, GpuContext, RawStream, ShmSafe};

const PING_ELEMS: usize = 1024;
const SLOTS: usize = 4;
const WAIT: Duration = Duration::from_secs(60);
const PEER: &str = include_str!("../examples/interop/cuda_ipc_peer.py");

const CMD_IDLE: u32 = 0;
const CMD_CHANNEL: u32 = 1;
const CMD_RAW: u32 = 2;
const CMD_STREAM: u32 = 3;
const CMD_NATIVE: u32 = 4;
const CMD_STREAM_BATCH: u32 = 5;
/// The consumer a tokio task on a listening receiver (`recv_async`).
const CMD_CHANNEL_ASYNC: u32 = 6;
/// The consumer one thread on a `WaitSet` of [`MANY`] listening receivers.
const CMD_WAIT_SET: u32 = 7;
/// The consumer a tokio task on a listening receiver registered with tokio's own reactor
/// (`AsyncFd`), calling `try_recv` when it is readable.
const CMD_CHANNEL_ASYNC_FD: u32 = 8;
/// Channels in the `WaitSet` ping.
const MANY: usize = 64;
/// Batched streaming: slots in the ring, items per batch on each side.
const BATCH_SLOTS: usize = 16;
const BATCH: usize = 8;
const CMD_EXIT: u32 = 9;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    chan: ShmCell<IpcChannelHandle<u32>>,
    /// The `WaitSet` ping's channels.
    many: [ShmCell<IpcChannelHandle<u32>>; MANY],
    raw_data: ShmCell<[u8; 64]>,
    raw_sent: ShmCell<[u8; 64]>,
    raw_released: ShmCell<[u8; 64]>,
    /// Command for the consumer and its argument (bytes per item, items per batch).
    cmd: AtomicU32,
    cmd_seq: AtomicU32,
    ack_seq: AtomicU32,
    item_bytes: AtomicU64,
    batch: AtomicU64,
    /// Raw ring: items published by the producer's host / released by the consumer's host.
    raw_published: AtomicU64,
    raw_released_host: AtomicU64,
    /// Stream phases: batches the consumer finished (its stream synchronised); native copy
    /// batches' times (ns) are written by the consumer.
    batches_done: AtomicU64,
    native_ns: AtomicU64,
}

fn spin(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out: {what}");
        std::hint::spin_loop();
    }
}

fn stream_new() -> sys::CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: writes one stream handle in the current context.
    unsafe {
        common::ok(
            "cuStreamCreate",
            sys::cuStreamCreate(&mut s, sys::CU_STREAM_NON_BLOCKING),
        )
    };
    s
}

fn sync(s: sys::CUstream) {
    // SAFETY: a live stream.
    unsafe { common::ok("cuStreamSynchronize", sys::cuStreamSynchronize(s)) };
}

fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    // SAFETY: writes one device pointer; freed by the process's exit (bench code).
    unsafe { common::ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, bytes)) };
    p
}

fn ipc_handle(ptr: u64) -> [u8; 64] {
    let mut h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: a cuMemAlloc pointer of this process.
    unsafe { common::ok("cuIpcGetMemHandle", sys::cuIpcGetMemHandle(&mut h, ptr)) };
    h.reserved
}

fn ipc_open(bytes: [u8; 64]) -> u64 {
    let mut p = 0;
    // SAFETY: a handle from the parent, opened in the current context.
    unsafe {
        common::ok(
            "cuIpcOpenMemHandle",
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                sys::CUipcHandle { reserved: bytes },
                sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
            ),
        )
    };
    p
}

/// The consumer helper: run commands until told to exit.
fn consumer(device: u32, region: &str) {
    let s = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(device).unwrap();
    let stream = stream_new();
    // SAFETY: a stream of this process that lives until it exits.
    let rs = unsafe { RawStream::from_raw(stream) };
    let mut seen = 0;
    loop {
        spin("a command", || s.cmd_seq.load(Ordering::Acquire) != seen);
        seen = s.cmd_seq.load(Ordering::Acquire);
        let cmd = s.cmd.load(Ordering::Acquire);
        let bytes = s.item_bytes.load(Ordering::Acquire) as usize;
        let batch = s.batch.load(Ordering::Acquire);
        s.ack_seq.store(seen, Ordering::Release);
        match cmd {
            CMD_EXIT => return,
            CMD_CHANNEL | CMD_STREAM => {
                let mut rx = IpcReceiver::<u32>::open(&ctx, &s.chan.load()).unwrap();
                let dst = if cmd == CMD_STREAM { alloc(bytes) } else { 0 };
                let mut n = 0u64;
                loop {
                    let item = match rx.recv(&rs, WAIT) {
                        Ok(item) => item,
                        Err(Error::ChannelClosed { .. }) => break,
                        Err(e) => panic!("consumer recv: {e}"),
                    };
                    if cmd == CMD_STREAM {
                        // SAFETY: copies the item (inside the mapping until its release has
                        // run) into our own allocation.
                        unsafe {
                            common::ok(
                                "cuMemcpyDtoDAsync",
                                sys::cuMemcpyDtoDAsync_v2(dst, item.as_raw_ptr(), bytes, stream),
                            )
                        };
                    }
                    item.release().unwrap();
                    n += 1;
                    if cmd == CMD_STREAM && n.is_multiple_of(batch) {
                        sync(stream);
                        s.batches_done.fetch_add(1, Ordering::AcqRel);
                    }
                }
                sync(stream);
                drop(rx);
                if dst != 0 {
                    // SAFETY: allocated above, nothing queued on it (synchronised).
                    unsafe { common::ok("cuMemFree", sys::cuMemFree_v2(dst)) };
                }
            }
            CMD_STREAM_BATCH => {
                let mut rx = IpcReceiver::<u32>::open(&ctx, &s.chan.load()).unwrap();
                let dst = alloc(bytes);
                let mut n = 0u64;
                loop {
                    let items = match rx.recv_batch(&rs, BATCH, WAIT) {
                        Ok(items) => items,
                        Err(Error::ChannelClosed { .. }) => break,
                        Err(e) => panic!("consumer recv_batch: {e}"),
                    };
                    for item in items.items() {
                        // SAFETY: copies the item (inside the mapping until the batch's release
                        // has run) into our own allocation.
                        unsafe {
                            common::ok(
                                "cuMemcpyDtoDAsync",
                                sys::cuMemcpyDtoDAsync_v2(dst, item.ptr, bytes, stream),
                            )
                        };
                        n += 1;
                    }
                    items.release().unwrap();
                    if n.is_multiple_of(batch) {
                        sync(stream);
                        s.batches_done.fetch_add(1, Ordering::AcqRel);
                    }
                }
                sync(stream);
                drop(rx);
                // SAFETY: allocated above, nothing queued on it (synchronised).
                unsafe { common::ok("cuMemFree", sys::cuMemFree_v2(dst)) };
            }
            CMD_CHANNEL_ASYNC => {
                #[cfg(feature = "async")]
                {
                    let mut rx = IpcReceiver::<u32>::open(&ctx, &s.chan.load())
                        .unwrap()
                        .listening()
                        .unwrap();
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        loop {
                            match rx.recv_async(&rs).await {
                                Ok(item) => item.release().unwrap(),
                                Err(Error::ChannelClosed { .. }) => break,
                                Err(e) => panic!("consumer recv_async: {e}"),
                            }
                        }
                    });
                    sync(stream);
                }
            }
            CMD_CHANNEL_ASYNC_FD => {
                #[cfg(feature = "async")]
                {
                    let rx = IpcReceiver::<u32>::open(&ctx, &s.chan.load())
                        .unwrap()
                        .listening()
                        .unwrap();
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_io()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        // SAFETY: the listening receiver owns its descriptor, which stays open
                        // and the same for as long as the receiver (moved into the AsyncFd).
                        let mut rx = unsafe { tokio::io::unix::AsyncFd::register(rx) }.unwrap();
                        loop {
                            let mut ready = rx.readable_mut().await.unwrap();
                            let found = match ready.get_inner_mut().try_recv(&rs) {
                                Ok(Some(item)) => {
                                    item.release().unwrap();
                                    true
                                }
                                Ok(None) => false,
                                Err(Error::ChannelClosed { .. }) => break,
                                Err(e) => panic!("consumer try_recv: {e}"),
                            };
                            if !found {
                                ready.clear_ready();
                            }
                        }
                    });
                    sync(stream);
                }
            }
            CMD_WAIT_SET => {
                let mut set = cuda_ipc::wait::WaitSet::new().unwrap();
                let mut rxs: Vec<_> = s
                    .many
                    .iter()
                    .map(|h| {
                        let rx = IpcReceiver::<u32>::open(&ctx, &h.load())
                            .unwrap()
                            .listening()
                            .unwrap();
                        set.attach(&rx).unwrap();
                        Some(rx)
                    })
                    .collect();
                let mut open = MANY;
                while open > 0 {
                    for key in set.wait(Some(WAIT)).unwrap() {
                        let Some(rx) = rxs[key.index()].as_mut() else {
                            continue;
                        };
                        let closed = loop {
                            match rx.try_recv(&rs) {
                                Ok(Some(item)) => item.release().unwrap(),
                                Ok(None) => break false,
                                Err(Error::ChannelClosed { .. }) => break true,
                                Err(e) => panic!("consumer try_recv: {e}"),
                            }
                        };
                        if closed {
                            set.detach(key);
                            rxs[key.index()] = None;
                            open -= 1;
                        }
                    }
                }
                sync(stream);
            }
            CMD_RAW => {
                let (sent, released) =
                    (ipc_open(s.raw_sent.load()), ipc_open(s.raw_released.load()));
                let mut k = 0u64;
                loop {
                    k += 1;
                    spin("a raw item", || {
                        s.raw_published.load(Ordering::Acquire) >= k
                            || s.cmd_seq.load(Ordering::Acquire) != seen
                    });
                    if s.raw_published.load(Ordering::Acquire) < k {
                        break; // a new command: the raw phase is over
                    }
                    // SAFETY: both counters are IPC mappings held until the stream is
                    // synchronised below.
                    unsafe {
                        common::ok(
                            "cuStreamWaitValue64",
                            sys::cuStreamWaitValue64_v2(
                                stream,
                                sent,
                                k,
                                sys::CU_STREAM_WAIT_VALUE_GEQ,
                            ),
                        );
                        common::ok(
                            "cuStreamWriteValue64",
                            sys::cuStreamWriteValue64_v2(
                                stream,
                                released,
                                k,
                                sys::CU_STREAM_WRITE_VALUE_DEFAULT,
                            ),
                        );
                    }
                    s.raw_released_host.store(k, Ordering::Release);
                }
                sync(stream);
                // SAFETY: mapped above, nothing queued on them any more.
                unsafe {
                    common::ok("cuIpcCloseMemHandle", sys::cuIpcCloseMemHandle(sent));
                    common::ok("cuIpcCloseMemHandle", sys::cuIpcCloseMemHandle(released));
                }
                // The next command was already posted: the loop's top takes it.
                continue;
            }
            CMD_NATIVE => {
                let src = ipc_open(s.raw_data.load());
                let dst = alloc(bytes);
                let copy = || {
                    for _ in 0..batch {
                        // SAFETY: both ranges are `bytes` long inside live allocations.
                        unsafe {
                            common::ok(
                                "cuMemcpyDtoDAsync",
                                sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream),
                            )
                        };
                    }
                    sync(stream);
                };
                copy(); // warm
                let t = Instant::now();
                copy();
                s.native_ns
                    .store(t.elapsed().as_nanos() as u64, Ordering::Release);
                // SAFETY: freed / unmapped once, nothing queued (synchronised above).
                unsafe {
                    common::ok("cuMemFree", sys::cuMemFree_v2(dst));
                    common::ok("cuIpcCloseMemHandle", sys::cuIpcCloseMemHandle(src));
                }
                s.batches_done.fetch_add(1, Ordering::AcqRel);
            }
            _ => {}
        }
        let _ = &ctx;
    }
}

struct Bench<'a> {
    s: &'a ShmRegion<Shared>,
    ctx: &'a GpuContext,
    stream: sys::CUstream,
    raw_sent: u64,
    raw_released: u64,
}

impl Bench<'_> {
    /// Post `cmd` to the consumer and wait until it has taken it.
    fn command(&self, cmd: u32, bytes: usize, batch: u64) {
        self.s.cmd.store(cmd, Ordering::Release);
        self.s.item_bytes.store(bytes as u64, Ordering::Release);
        self.s.batch.store(batch, Ordering::Release);
        let seq = self.s.cmd_seq.fetch_add(1, Ordering::AcqRel) + 1;
        spin("the consumer's ack", || {
            self.s.ack_seq.load(Ordering::Acquire) >= seq
        });
    }

    fn channel(&self, slots: usize, elems: usize, cmd: u32, batch: u64) -> IpcSender<u32> {
        let tx = IpcSender::<u32>::new(self.ctx, slots, elems).unwrap();
        self.s.chan.store(tx.handle());
        self.command(cmd, elems * 4, batch);
        spin("the consumer to attach", || tx.consumer().is_some());
        tx
    }

    /// [`MANY`] one-slot ping channels for the `WaitSet` consumer, once it has attached to all.
    fn many_channels(&self) -> Vec<IpcSender<u32>> {
        let txs: Vec<_> = self
            .s
            .many
            .iter()
            .map(|h| {
                let tx = IpcSender::<u32>::new(self.ctx, 1, PING_ELEMS).unwrap();
                h.store(tx.handle());
                tx
            })
            .collect();
        self.command(CMD_WAIT_SET, PING_ELEMS * 4, 0);
        spin("the consumer to attach to every channel", || {
            txs.iter().all(|tx| tx.consumer().is_some())
        });
        txs
    }

    /// One ping round trip through the channel.
    fn ping(&self, tx: &mut IpcSender<u32>) {
        // SAFETY: our stream, live for the bench.
        let rs = unsafe { RawStream::from_raw(self.stream) };
        let slot = tx.acquire(&rs, WAIT).unwrap();
        sync(self.stream);
        slot.send(1).unwrap();
    }

    /// One ping round trip through the hand-written ring; `k` counts items.
    fn raw_ping(&self, k: &mut u64) {
        *k += 1;
        let k = *k;
        let s = self.s;
        spin("raw release", || {
            s.raw_released_host.load(Ordering::Acquire) + 1 >= k
        });
        // SAFETY: our own counters, live for the bench; the stream is synchronised here.
        unsafe {
            if k > 1 {
                common::ok(
                    "cuStreamWaitValue64",
                    sys::cuStreamWaitValue64_v2(
                        self.stream,
                        self.raw_released,
                        k - 1,
                        sys::CU_STREAM_WAIT_VALUE_GEQ,
                    ),
                );
            }
            common::ok("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream));
            common::ok(
                "cuStreamWriteValue64",
                sys::cuStreamWriteValue64_v2(
                    self.stream,
                    self.raw_sent,
                    k,
                    sys::CU_STREAM_WRITE_VALUE_DEFAULT,
                ),
            );
        }
        s.raw_published.store(k, Ordering::Release);
    }

    fn raw_start(&self) {
        // Zero the two counters on our stream and wait: a synchronous cuMemsetD8 runs on the
        // legacy stream, which a non-blocking stream does not wait for, so it could land after
        // the first write.
        // SAFETY: our own counters, nothing else queued on them (the stream is synchronised).
        unsafe {
            common::ok(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(self.raw_sent, 0, 8, self.stream),
            );
            common::ok(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(self.raw_released, 0, 8, self.stream),
            );
        }
        sync(self.stream);
        self.s.raw_published.store(0, Ordering::Release);
        self.s.raw_released_host.store(0, Ordering::Release);
        self.command(CMD_RAW, 0, 0);
    }

    /// One batch of `batch` items through the stream channel, one at a time (`group` 1) or in
    /// groups of `group` (`acquire_batch`; the consumer receives in groups too); its time.
    fn stream_batch(&self, tx: &mut IpcSender<u32>, batch: u64, group: usize) -> Duration {
        // SAFETY: our stream, live for the bench.
        let rs = unsafe { RawStream::from_raw(self.stream) };
        let done = self.s.batches_done.load(Ordering::Acquire);
        let t = Instant::now();
        if group == 1 {
            for _ in 0..batch {
                let slot = tx.acquire(&rs, WAIT).unwrap();
                let n = slot.capacity();
                slot.send(n).unwrap();
            }
        } else {
            let lens = vec![tx.capacity(); group];
            for _ in 0..batch / group as u64 {
                tx.acquire_batch(&rs, group, WAIT)
                    .unwrap()
                    .send(&lens)
                    .unwrap();
            }
        }
        spin("the consumer's batch", || {
            self.s.batches_done.load(Ordering::Acquire) > done
        });
        t.elapsed()
    }

    /// One native batch, timed by the consumer.
    fn native_batch(&self, bytes: usize, batch: u64) -> Duration {
        let done = self.s.batches_done.load(Ordering::Acquire);
        self.command(CMD_NATIVE, bytes, batch);
        spin("the native batch", || {
            self.s.batches_done.load(Ordering::Acquire) > done
        });
        Duration::from_nanos(self.s.native_ns.load(Ordering::Acquire))
    }
}

fn torch_mp() -> Option<Vec<f64>> {
    let script =
        std::env::temp_dir().join(format!("cuda-ipc-bench-chan-{}.py", std::process::id()));
    std::fs::write(&script, PEER).unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .args(["torch-mp-bench", "2000", &PING_ELEMS.to_string()])
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("TORCH_MP"))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect(),
    )
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "consumer");
        let (device, region) = arg.split_once(':').unwrap();
        consumer(device.parse().unwrap(), region);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("channel") else {
        return;
    };
    let stream = stream_new();
    let devices: Vec<u32> = if cuda_ipc::device::device_count().unwrap() >= 2 {
        vec![0, 1]
    } else {
        vec![0]
    };
    let raw_data = alloc(64 << 20);
    // Each counter in an allocation of its own 2 MiB: the driver sub-allocates small
    // cuMemAllocs from shared blocks, and an IPC handle maps the whole block (two handles of
    // one block cannot both be opened in one process).
    let (raw_sent, raw_released) = (alloc(2 << 20), alloc(2 << 20));
    let mut c = Criterion::default().configure_from_args();
    let mut ping_1gpu = Vec::new();
    for &device in &devices {
        let label = if device == 0 { "1gpu" } else { "2gpu" };
        let s: ShmRegion<Shared> = ShmOptions::new("bench-chan")
            .random_suffix(true)
            .create()
            .unwrap();
        s.raw_data.store(ipc_handle(raw_data));
        s.raw_sent.store(ipc_handle(raw_sent));
        s.raw_released.store(ipc_handle(raw_released));
        let helper = common::spawn("consumer", &format!("{device}:{}", s.name()));
        let b = Bench {
            s: &s,
            ctx: &ctx,
            stream,
            raw_sent,
            raw_released,
        };

        // Ping: the channel and the raw ring, each with its own consumer phase, so the two
        // alternate by phase (Criterion), then by batch in the summary below.
        {
            let mut g = c.benchmark_group(format!("channel_ping_{label}"));
            g.measurement_time(Duration::from_secs(3))
                .warm_up_time(Duration::from_millis(500));
            let mut tx = b.channel(1, PING_ELEMS, CMD_CHANNEL, 0);
            g.bench_function("cuda_ipc_channel", |bch| bch.iter(|| b.ping(&mut tx)));
            drop(tx);
            b.raw_start();
            let mut k = 0;
            g.bench_function("raw_ring", |bch| bch.iter(|| b.raw_ping(&mut k)));
            g.finish();
        }
        if common::is_bench_run() {
            // Same-run summary: alternate phases of 2,000 round trips, 9 times.
            let (mut ours, mut raw) = (Vec::new(), Vec::new());
            for _ in 0..9 {
                let mut tx = b.channel(1, PING_ELEMS, CMD_CHANNEL, 0);
                ours.extend(common::sample(10, 200, || b.ping(&mut tx)));
                drop(tx);
                b.raw_start();
                let mut k = 0;
                raw.extend(common::sample(10, 200, || b.raw_ping(&mut k)));
            }
            b.command(CMD_IDLE, 0, 0);
            ours.sort_by(f64::total_cmp);
            raw.sort_by(f64::total_cmp);
            common::header(&format!(
                "channel ping {label} (round trip: acquire + GPU wait + send, recv + release)"
            ));
            common::row("channel vs raw ring", &ours, &raw);
            if device == 0 {
                ping_1gpu = ours;
            }
            // The consumer waiting on its descriptor: a tokio task, then one thread over 64
            // channels, each against the blocking consumer in alternating phases.
            let blocking = |n: usize| {
                let mut tx = b.channel(1, PING_ELEMS, CMD_CHANNEL, 0);
                let v = common::sample(n, 200, || b.ping(&mut tx));
                drop(tx);
                v
            };
            #[cfg(feature = "async")]
            {
                let (mut waited, mut base) = (Vec::new(), Vec::new());
                for _ in 0..9 {
                    let mut tx = b.channel(1, PING_ELEMS, CMD_CHANNEL_ASYNC, 0);
                    waited.extend(common::sample(10, 200, || b.ping(&mut tx)));
                    drop(tx);
                    base.extend(blocking(10));
                }
                waited.sort_by(f64::total_cmp);
                base.sort_by(f64::total_cmp);
                common::row("tokio recv_async vs recv", &waited, &base);
                let (mut waited, mut base) = (Vec::new(), Vec::new());
                for _ in 0..9 {
                    let mut tx = b.channel(1, PING_ELEMS, CMD_CHANNEL_ASYNC_FD, 0);
                    waited.extend(common::sample(10, 200, || b.ping(&mut tx)));
                    drop(tx);
                    base.extend(blocking(10));
                }
                waited.sort_by(f64::total_cmp);
                base.sort_by(f64::total_cmp);
                common::row("tokio AsyncFd + try_recv vs recv", &waited, &base);
            }
            let (mut waited, mut base) = (Vec::new(), Vec::new());
            for _ in 0..5 {
                let mut txs = b.many_channels();
                let mut i = 0;
                waited.extend(common::sample(10, 200, || {
                    i = (i + 37) % MANY; // every channel in turn, not in order
                    b.ping(&mut txs[i]);
                }));
                drop(txs);
                base.extend(blocking(10));
            }
            b.command(CMD_IDLE, 0, 0);
            waited.sort_by(f64::total_cmp);
            base.sort_by(f64::total_cmp);
            common::row("WaitSet of 64 vs one recv", &waited, &base);
        }

        // Streaming: one item at a time (4 slots), and 1 MiB items in groups of [`BATCH`] on
        // both sides (one GPU wait and one write per group; [`BATCH_SLOTS`] slots).
        for (size, elems, batch, group) in [
            ("1MiB", 256 << 10, 64u64, 1),
            ("64MiB", 16 << 20, 8u64, 1),
            ("1MiB", 256 << 10, 64u64, BATCH),
        ] {
            let bytes = elems * 4;
            let (slots, cmd, name, function, how) = if group == 1 {
                (
                    SLOTS,
                    CMD_STREAM,
                    size.to_owned(),
                    "cuda_ipc_channel",
                    String::new(),
                )
            } else {
                (
                    BATCH_SLOTS,
                    CMD_STREAM_BATCH,
                    format!("{size}_grouped"),
                    "cuda_ipc_channel_batches",
                    format!(" in groups of {group} ({BATCH_SLOTS} slots)"),
                )
            };
            let mut g = c.benchmark_group(format!("channel_stream_{name}_{label}"));
            g.throughput(Throughput::Bytes(bytes as u64 * batch))
                .sample_size(10)
                .measurement_time(Duration::from_secs(3))
                .warm_up_time(Duration::from_millis(300));
            let mut tx = b.channel(slots, elems, cmd, batch);
            g.bench_function(function, |bch| {
                bch.iter_custom(|n| (0..n).map(|_| b.stream_batch(&mut tx, batch, group)).sum())
            });
            drop(tx);
            b.command(CMD_IDLE, 0, 0);
            g.bench_function("native_copy", |bch| {
                bch.iter_custom(|n| (0..n).map(|_| b.native_batch(bytes, batch)).sum())
            });
            g.finish();
            if common::is_bench_run() {
                let (mut ours, mut native) = (Vec::new(), Vec::new());
                for _ in 0..7 {
                    let mut tx = b.channel(slots, elems, cmd, batch);
                    b.stream_batch(&mut tx, batch, group); // warm
                    ours.push(b.stream_batch(&mut tx, batch, group).as_secs_f64());
                    drop(tx);
                    b.command(CMD_IDLE, 0, 0);
                    native.push(b.native_batch(bytes, batch).as_secs_f64());
                }
                ours.sort_by(f64::total_cmp);
                native.sort_by(f64::total_cmp);
                let gbs = |t: f64| (bytes as f64 * batch as f64) / t / 1e9;
                println!(
                    "summary: channel stream {size} {label}{how}, {batch} items per batch, 7 \
                     alternating batches: channel {:.1} GB/s (median), native copy {:.1} GB/s; \
                     ratio {:.3}",
                    gbs(ours[3]),
                    gbs(native[3]),
                    native[3] / ours[3]
                );
            }
        }
        b.command(CMD_EXIT, 0, 0);
        drop(helper);
    }
    if common::is_bench_run() && !ping_1gpu.is_empty() {
        match torch_mp() {
            Some(t) => println!(
                "summary: torch.multiprocessing, {PING_ELEMS}-element int32 CUDA tensor, queue put \
                 -> receiver rebuilt: {:.2} / {:.2} / {:.2} µs (p10/p50/p90); channel ping round \
                 trip on one GPU p50 {:.2} µs: {:.1}x lower",
                t[0],
                t[1],
                t[2],
                common::pct(&ping_1gpu, 0.5) / 1e3,
                t[1] * 1e3 / common::pct(&ping_1gpu, 0.5)
            ),
            None => println!("summary: torch.multiprocessing: python3 with torch not available"),
        }
    }
    c.final_summary();
}
