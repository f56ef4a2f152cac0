//! A broadcast channel (`IpcSender::broadcast`) with 1, 2, 4 and 7 consumer processes on one
//! GPU, against the one-consumer channel (`IpcSender::new`) in the same run.
//!
//! - `ping`: one slot, a tiny item, no kernels. One iteration: `acquire` (waits on the host for
//!   every consumer's release of the previous item and enqueues a GPU wait on each consumer's
//!   counter), a stream synchronise (every consumer's GPU release inside the time), `send`.
//!   Each consumer loops `recv` + `release`. The summary gives the p50 round trip for each
//!   consumer count and the host and GPU cost per added consumer against the one-consumer
//!   channel.
//! - `stream_1MiB`, `stream_64MiB`: 4 slots; the producer sends items (no writes) and every
//!   consumer copies each item out of its slot into its own memory (`cuMemcpyDtoDAsync`),
//!   releases it, and synchronises every 16 items. The summary gives the producer's items per
//!   second and each consumer's GB/s for each consumer count, against one consumer, and
//!   against the same work without a broadcast: N one-consumer channels, one per consumer
//!   process, the producer sending every item into each (on one GPU, N consumer processes
//!   time-slice whichever channel feeds them; this baseline shows what the broadcast itself
//!   costs or saves).
//! - host cost: 64 slots, every consumer releasing at once. The producer waits until every
//!   consumer has released all it sent, then times 32 `acquire` + `send` calls in a row (no
//!   host wait for room can occur: 32 of 64 slots are free), per item. This is what each
//!   attached consumer adds on the producer's thread (a look at its entry, one
//!   `cuStreamWaitValue64` enqueued per acquire), apart from GPU time-slicing; the summary
//!   gives it per added consumer (goal ≤ 2 µs).
//!
//! Run: `cargo bench --bench broadcast` (under `cargo test` it only checks that it starts).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
use cuda_ipc::driver::sys;
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, GpuContext, RawStream, ShmSafe};

const PING_ELEMS: usize = 256;
const HELPERS: usize = 7;
const COUNTS: [usize; 4] = [1, 2, 4, 7];
const SLOTS: usize = 4;
const SYNC_EVERY: u64 = 16;
const WAIT: Duration = Duration::from_secs(60);

const CMD_IDLE: u32 = 0;
const CMD_PING: u32 = 1;
const CMD_STREAM: u32 = 2;
const CMD_HOST: u32 = 3;
/// As `CMD_STREAM`, each helper on its own one-consumer channel (`chans[index]`).
const CMD_FANOUT: u32 = 4;
const HOST_SLOTS: usize = 64;
const HOST_BURST: u64 = 32;
const CMD_EXIT: u32 = 9;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    chan: ShmCell<IpcChannelHandle<u32>>,
    /// The fan-out baseline's channels, one per helper.
    chans: [ShmCell<IpcChannelHandle<u32>>; HELPERS],
    /// The phase's command, its number, and how many helpers take part (helpers 0..n).
    cmd: AtomicU32,
    cmd_seq: AtomicU32,
    takers: AtomicU32,
    /// Helpers attached to the phase's channel, and done with it (saw it closed).
    attached: AtomicU32,
    done: AtomicU32,
    /// Items each helper has released in the current phase.
    released: [AtomicU64; HELPERS],
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

fn spin(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < WAIT, "timed out: {what}");
        std::thread::yield_now();
    }
}

/// Helper `index`: take part in every phase that asks for it (index < takers), until told to
/// exit.
fn helper(index: u32, region: &str) {
    let s = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(0).unwrap();
    let stream = stream_new();
    // SAFETY: a stream of this process that lives until it exits.
    let rs = unsafe { RawStream::from_raw(stream) };
    let dst = alloc(64 << 20);
    let mut seen = 0;
    loop {
        spin("a command", || s.cmd_seq.load(Ordering::Acquire) != seen);
        seen = s.cmd_seq.load(Ordering::Acquire);
        let cmd = s.cmd.load(Ordering::Acquire);
        if cmd == CMD_EXIT {
            return;
        }
        if index >= s.takers.load(Ordering::Acquire) || cmd == CMD_IDLE {
            continue;
        }
        let handle = if cmd == CMD_FANOUT {
            s.chans[index as usize].load()
        } else {
            s.chan.load()
        };
        let mut rx = IpcReceiver::<u32>::open(&ctx, &handle).unwrap();
        let copies = cmd == CMD_STREAM || cmd == CMD_FANOUT;
        s.attached.fetch_add(1, Ordering::AcqRel);
        let mut n = 0u64;
        loop {
            let item = match rx.recv(&rs, WAIT) {
                Ok(item) => item,
                Err(Error::ChannelClosed { .. }) => break,
                Err(e) => panic!("helper {index}: {e}"),
            };
            if copies {
                let bytes = item.len() * 4;
                // SAFETY: copies the item (inside the mapping until its release has run) into
                // our own allocation, on our stream.
                unsafe {
                    common::ok(
                        "cuMemcpyDtoDAsync",
                        sys::cuMemcpyDtoDAsync_v2(dst, item.as_raw_ptr(), bytes, stream),
                    )
                };
            }
            item.release().unwrap();
            n += 1;
            s.released[index as usize].store(n, Ordering::Release);
            if copies && n.is_multiple_of(SYNC_EVERY) {
                sync(stream);
            }
        }
        sync(stream);
        drop(rx);
        s.done.fetch_add(1, Ordering::AcqRel);
    }
}

struct Bench<'a> {
    s: &'a ShmRegion<Shared>,
    ctx: &'a GpuContext,
    stream: sys::CUstream,
}

impl Bench<'_> {
    /// A channel for `consumers` helpers (1: the one-consumer channel), every helper attached.
    fn phase(&self, consumers: usize, slots: usize, elems: usize, cmd: u32) -> IpcSender<u32> {
        let tx = if consumers == 1 {
            IpcSender::<u32>::new(self.ctx, slots, elems).unwrap()
        } else {
            IpcSender::<u32>::broadcast(self.ctx, slots, elems, consumers).unwrap()
        };
        let s = self.s;
        s.chan.store(tx.handle());
        s.attached.store(0, Ordering::Release);
        s.done.store(0, Ordering::Release);
        for r in &s.released {
            r.store(0, Ordering::Release);
        }
        s.takers.store(consumers as u32, Ordering::Release);
        s.cmd.store(cmd, Ordering::Release);
        s.cmd_seq.fetch_add(1, Ordering::AcqRel);
        spin("the consumers to attach", || {
            s.attached.load(Ordering::Acquire) as usize == consumers
        });
        tx
    }

    /// The fan-out baseline: one one-consumer channel per helper, every helper attached.
    fn phase_fanout(&self, consumers: usize, elems: usize) -> Vec<IpcSender<u32>> {
        let s = self.s;
        let txs: Vec<_> = (0..consumers)
            .map(|i| {
                let tx = IpcSender::<u32>::new(self.ctx, SLOTS, elems).unwrap();
                s.chans[i].store(tx.handle());
                tx
            })
            .collect();
        s.attached.store(0, Ordering::Release);
        s.done.store(0, Ordering::Release);
        s.takers.store(consumers as u32, Ordering::Release);
        s.cmd.store(CMD_FANOUT, Ordering::Release);
        s.cmd_seq.fetch_add(1, Ordering::AcqRel);
        spin("the consumers to attach", || {
            s.attached.load(Ordering::Acquire) as usize == consumers
        });
        txs
    }

    /// Close the fan-out channels and wait until every helper has left its own.
    fn end_fanout(&self, txs: Vec<IpcSender<u32>>) {
        let n = txs.len();
        for tx in txs {
            tx.close(WAIT).unwrap();
        }
        let s = self.s;
        spin("the consumers to finish", || {
            s.done.load(Ordering::Acquire) as usize == n
        });
    }

    /// Items per second each of `items` items reaches every consumer of the fan-out baseline
    /// (sent once into each channel).
    fn fanout_rate(&self, txs: &mut [IpcSender<u32>], elems: usize, items: u64) -> f64 {
        // SAFETY: as in `ping`.
        let rs = unsafe { RawStream::from_raw(self.stream) };
        let t = Instant::now();
        for _ in 0..items {
            for tx in txs.iter_mut() {
                tx.acquire(&rs, WAIT).unwrap().send(elems).unwrap();
            }
        }
        sync(self.stream);
        items as f64 / t.elapsed().as_secs_f64()
    }

    /// Close the phase's channel and wait until every helper has left it.
    fn end(&self, tx: IpcSender<u32>, consumers: usize) {
        tx.close(WAIT).unwrap();
        let s = self.s;
        spin("the consumers to finish", || {
            s.done.load(Ordering::Acquire) as usize == consumers
        });
    }

    /// One ping round trip.
    fn ping(&self, tx: &mut IpcSender<u32>) {
        // SAFETY: a stream of this process, alive for the whole bench.
        let rs = unsafe { RawStream::from_raw(self.stream) };
        let slot = tx.acquire(&rs, WAIT).unwrap();
        sync(self.stream);
        slot.send(PING_ELEMS).unwrap();
    }

    /// Host time per item of `HOST_BURST` acquire + send calls in a row, started once every
    /// consumer has released all `sent` items so far (so no call waits for room).
    fn host_burst(&self, tx: &mut IpcSender<u32>, consumers: usize, sent: &mut u64) -> f64 {
        // SAFETY: as in `ping`.
        let rs = unsafe { RawStream::from_raw(self.stream) };
        let s = self.s;
        spin("every consumer's releases", || {
            s.released[..consumers]
                .iter()
                .all(|r| r.load(Ordering::Acquire) == *sent)
        });
        sync(self.stream);
        let t = Instant::now();
        for _ in 0..HOST_BURST {
            tx.acquire(&rs, WAIT).unwrap().send(PING_ELEMS).unwrap();
        }
        let per = t.elapsed().as_nanos() as f64 / HOST_BURST as f64;
        *sent += HOST_BURST;
        per
    }

    /// Items per second the producer sends `items` items of `elems` u32 at, every consumer
    /// copying each out.
    fn stream_rate(&self, tx: &mut IpcSender<u32>, elems: usize, items: u64) -> f64 {
        // SAFETY: as in `ping`.
        let rs = unsafe { RawStream::from_raw(self.stream) };
        let t = Instant::now();
        for _ in 0..items {
            tx.acquire(&rs, WAIT).unwrap().send(elems).unwrap();
        }
        sync(self.stream);
        items as f64 / t.elapsed().as_secs_f64()
    }
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "helper");
        let (index, region) = arg.split_once(':').unwrap();
        helper(index.parse().unwrap(), region);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("broadcast") else {
        return;
    };
    let stream = stream_new();
    let s: ShmRegion<Shared> = ShmOptions::new("bench-bcast")
        .random_suffix(true)
        .create()
        .unwrap();
    let helpers: Vec<_> = (0..HELPERS)
        .map(|i| common::spawn("helper", &format!("{i}:{}", s.name())))
        .collect();
    let b = Bench {
        s: &s,
        ctx: &ctx,
        stream,
    };
    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("broadcast_ping_1gpu");
        g.measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(300));
        for n in [1, 4] {
            let mut tx = b.phase(n, 1, PING_ELEMS, CMD_PING);
            g.bench_function(format!("{n}_consumers"), |bch| bch.iter(|| b.ping(&mut tx)));
            b.end(tx, n);
        }
        g.finish();
    }
    if common::is_bench_run() {
        // Ping: each consumer count in turn, 9 rounds of 500 round trips each.
        let mut ping: Vec<Vec<f64>> = vec![Vec::new(); COUNTS.len()];
        for _ in 0..9 {
            for (i, &n) in COUNTS.iter().enumerate() {
                let mut tx = b.phase(n, 1, PING_ELEMS, CMD_PING);
                ping[i].extend(common::sample(5, 100, || b.ping(&mut tx)));
                b.end(tx, n);
            }
        }
        println!("\nsummary: broadcast ping 1gpu, round trip p10 / p50 / p90 per consumer count");
        println!(
            "  consumers          p10         p50         p90   /1 consumer   per added consumer"
        );
        let base = {
            let mut v = ping[0].clone();
            v.sort_by(f64::total_cmp);
            common::pct(&v, 0.5)
        };
        for (i, &n) in COUNTS.iter().enumerate() {
            let mut v = ping[i].clone();
            v.sort_by(f64::total_cmp);
            let p50 = common::pct(&v, 0.5);
            let per = if n > 1 {
                format!("{:.2} µs", (p50 - base) / 1000.0 / (n - 1) as f64)
            } else {
                "-".into()
            };
            println!(
                "  {n:>9}  {:>8.2} µs {:>8.2} µs {:>8.2} µs  {:>10.3}   {per}",
                common::pct(&v, 0.1) / 1000.0,
                p50 / 1000.0,
                common::pct(&v, 0.9) / 1000.0,
                p50 / base
            );
        }
        // Host cost: each consumer count in turn, 9 rounds of 40 bursts each.
        let mut host: Vec<Vec<f64>> = vec![Vec::new(); COUNTS.len()];
        for _ in 0..9 {
            for (i, &n) in COUNTS.iter().enumerate() {
                let mut tx = b.phase(n, HOST_SLOTS, PING_ELEMS, CMD_HOST);
                let mut sent = 0;
                for _ in 0..40 {
                    host[i].push(b.host_burst(&mut tx, n, &mut sent));
                }
                b.end(tx, n);
            }
        }
        println!(
            "\nsummary: broadcast host cost 1gpu, producer's acquire + send per item \
             (no wait for room), p10 / p50 / p90"
        );
        println!("  consumers          p10         p50         p90   per added consumer");
        let base = {
            let mut v = host[0].clone();
            v.sort_by(f64::total_cmp);
            common::pct(&v, 0.5)
        };
        for (i, &n) in COUNTS.iter().enumerate() {
            let mut v = host[i].clone();
            v.sort_by(f64::total_cmp);
            let p50 = common::pct(&v, 0.5);
            let per = if n > 1 {
                format!("{:.2} µs", (p50 - base) / 1000.0 / (n - 1) as f64)
            } else {
                "-".into()
            };
            println!(
                "  {n:>9}  {:>8.2} µs {:>8.2} µs {:>8.2} µs   {per}",
                common::pct(&v, 0.1) / 1000.0,
                p50 / 1000.0,
                common::pct(&v, 0.9) / 1000.0,
            );
        }
        for (label, bytes, items) in [("1MiB", 1usize << 20, 2_000u64), ("64MiB", 64 << 20, 200)] {
            let elems = bytes / 4;
            println!(
                "\nsummary: broadcast stream {label} 1gpu, {SLOTS} slots (median of 5 phases)"
            );
            println!(
                "  consumers   items/s   GB/s per consumer   /1 consumer   fan-out items/s   \
                 broadcast / fan-out"
            );
            let mut base = 0.0;
            for &n in &COUNTS {
                // Broadcast and fan-out phases alternate, so that both see the same machine.
                let mut rates = Vec::new();
                let mut fanout = Vec::new();
                for _ in 0..5 {
                    let mut tx = b.phase(n, SLOTS, elems, CMD_STREAM);
                    rates.push(b.stream_rate(&mut tx, elems, items));
                    b.end(tx, n);
                    let mut txs = b.phase_fanout(n, elems);
                    fanout.push(b.fanout_rate(&mut txs, elems, items));
                    b.end_fanout(txs);
                }
                rates.sort_by(f64::total_cmp);
                fanout.sort_by(f64::total_cmp);
                let (r, f) = (rates[2], fanout[2]);
                if n == 1 {
                    base = r;
                }
                println!(
                    "  {n:>9}  {r:>8.0}   {:>17.1}   {:>10.3}   {f:>15.0}   {:>10.3}",
                    r * bytes as f64 / 1e9,
                    r / base,
                    r / f
                );
            }
        }
    }
    s.cmd.store(CMD_EXIT, Ordering::Release);
    s.cmd_seq.fetch_add(1, Ordering::AcqRel);
    drop(helpers);
}
