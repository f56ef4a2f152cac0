//! Bandwidth through an IPC mapping, against a native allocation in the same run:
//!
//! - `copy`: a device-to-device copy (copy engine, `cuMemcpyDtoDAsync`) from a local buffer into
//!   another process's buffer mapped with `IpcBuffer::open`, vs into this process's own
//!   allocation on the same device (the `cuMemcpyPeer` path when that device is another GPU);
//! - `kernel`: simpleIPC's kernel writing every byte of the mapped buffer vs of the own one;
//!
//! on one GPU (exporter and importer share device 0) and across two (the exporter's buffer on
//! device 1, written from device 0 over NVLink), for 4 KiB to 256 MiB.
//! Run: `cargo bench --bench transfer`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use cuda_ipc::driver::sys;
use cuda_ipc::{GpuContext, IpcBuffer, IpcMemHandle, ShmCell, ShmOptions, ShmRegion, ShmSafe};
use cust::function::BlockSize;
use cust::module::Module;
use cust::prelude::*;

const MAX: usize = 256 << 20;
const SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u8>>,
    ready: AtomicU32,
}
// SAFETY: repr(C), every field is ShmSafe.
unsafe impl ShmSafe for Shared {}

fn exporter(arg: &str) {
    let (region, device) = arg.split_once(':').unwrap();
    let shared = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(device.parse().unwrap()).unwrap();
    let buf = IpcBuffer::<u8>::zeroed(&ctx, MAX).unwrap();
    shared.mem.store(buf.handle().unwrap());
    shared.ready.store(1, Ordering::Release);
    std::thread::sleep(Duration::from_secs(3600));
}

/// An exported buffer on `device`, mapped here; the helper lives as long as the guard.
fn peer_buffer(
    ctx: &GpuContext,
    device: u32,
) -> (IpcBuffer<u8>, common::Helper, ShmRegion<Shared>) {
    let shared = ShmOptions::new("cuda-ipc-bench-transfer")
        .random_suffix(true)
        .create::<Shared>()
        .unwrap();
    let helper = common::spawn("exporter", &format!("{}:{device}", shared.name()));
    common::wait_for("exporter", Duration::from_secs(60), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    let buf = IpcBuffer::open(ctx, &shared.mem.load()).unwrap();
    (buf, helper, shared)
}

struct Engine<'m> {
    stream: Stream,
    kernel: cust::function::Function<'m>,
    blocks: u32,
}

impl Engine<'_> {
    fn copy(&self, dst: u64, src: u64, n: usize) {
        // SAFETY: both ranges are live device allocations (or mappings) of at least n bytes.
        let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, n, self.stream.as_inner().cast()) };
        assert_eq!(
            rc,
            0,
            "cuMemcpyDtoDAsync: {}",
            cuda_ipc::driver::error_name(rc)
        );
    }
    fn fill(&self, dst: u64, n: usize) {
        let k = &self.kernel;
        let s = &self.stream;
        // SAFETY: simple_kernel writes bytes [0, n) of `dst`, a live allocation of ≥ n bytes.
        unsafe { launch!(k<<<self.blocks, 128, 0, s>>>(dst, n as i32, 7u32)) }.unwrap();
    }
    /// Time `iters` enqueued operations, synchronised once at the end.
    fn time(&self, iters: u64, op: impl Fn()) -> Duration {
        self.stream.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..iters {
            op();
        }
        self.stream.synchronize().unwrap();
        t.elapsed()
    }
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "exporter");
        exporter(&arg);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("transfer") else {
        return;
    };
    let gpus = cuda_ipc::device_count().unwrap();
    let src = IpcBuffer::<u8>::zeroed(&ctx, MAX).unwrap();
    // (label, IPC-mapped target, native target on the same device)
    let mut cases = Vec::new();
    let mut keep = Vec::new();
    let (peer0, h0, r0) = peer_buffer(&ctx, 0);
    let own0 = IpcBuffer::<u8>::zeroed(&ctx, MAX).unwrap();
    cases.push(("1gpu", peer0.as_raw_ptr(), own0.as_raw_ptr()));
    keep.push((peer0, own0));
    let mut guards = vec![(h0, r0)];
    let ctx1 = (gpus >= 2).then(|| GpuContext::new(1).unwrap());
    if let Some(ctx1) = &ctx1 {
        ctx.enable_peer_access(ctx1).unwrap();
        let (peer1, h1, r1) = peer_buffer(&ctx, 1);
        let own1 = IpcBuffer::<u8>::zeroed(ctx1, MAX).unwrap();
        cases.push(("2gpu", peer1.as_raw_ptr(), own1.as_raw_ptr()));
        keep.push((peer1, own1));
        guards.push((h1, r1));
    } else {
        println!("bench transfer: one GPU visible; the two-GPU cases need two");
    }
    ctx.make_current().unwrap();
    let module = Module::from_ptx(KERNELS, &[]).unwrap();
    let kernel = module.get_function("simple_kernel").unwrap();
    let per_sm = kernel
        .max_active_blocks_per_multiprocessor(BlockSize::x(128), 0)
        .unwrap();
    let blocks = per_sm * cuda_ipc::device_info(0).unwrap().multiprocessors;
    let e = Engine {
        stream: Stream::new(StreamFlags::NON_BLOCKING, None).unwrap(),
        kernel,
        blocks,
    };
    let s = src.as_raw_ptr();

    let mut c = Criterion::default().configure_from_args();
    for &(label, mapped, native) in &cases {
        for op in ["copy", "kernel"] {
            let mut g = c.benchmark_group(format!("transfer_{label}_{op}"));
            g.sample_size(20)
                .measurement_time(Duration::from_secs(1))
                .warm_up_time(Duration::from_millis(200));
            for n in SIZES {
                g.throughput(Throughput::Bytes(n as u64));
                for (target, dst) in [("ipc_mapping", mapped), ("native", native)] {
                    g.bench_with_input(BenchmarkId::new(target, n), &n, |b, &n| {
                        b.iter_custom(|iters| {
                            if op == "copy" {
                                e.time(iters, || e.copy(dst, s, n))
                            } else {
                                e.time(iters, || e.fill(dst, n))
                            }
                        })
                    });
                }
            }
            g.finish();
        }
    }
    c.final_summary();
    if common::is_bench_run() {
        println!();
        println!(
            "summary: transfer bandwidth, GB/s (p10 / p50 / p90 over 31 alternating batches), ratio of p50s"
        );
        println!(
            "{:<6} {:<6} {:>10} {:>24} {:>24} {:>7}",
            "case", "op", "bytes", "ipc_mapping", "native", "ratio"
        );
        for &(label, mapped, native) in &cases {
            for op in ["copy", "kernel"] {
                for n in SIZES {
                    let reps = ((1u64 << 30) / n as u64).clamp(4, 2000);
                    // One batch's bandwidth into `dst`, GB/s.
                    let batch = |dst: u64| {
                        let t = if op == "copy" {
                            e.time(reps, || e.copy(dst, s, n))
                        } else {
                            e.time(reps, || e.fill(dst, n))
                        };
                        (n as f64 * reps as f64) / t.as_secs_f64() / 1e9
                    };
                    // Alternate mapped and native batches so drift lands on both.
                    let (mut m, mut nat) = (Vec::new(), Vec::new());
                    for _ in 0..31 {
                        m.push(batch(mapped));
                        nat.push(batch(native));
                    }
                    m.sort_by(f64::total_cmp);
                    nat.sort_by(f64::total_cmp);
                    let cell = |v: &[f64]| {
                        format!(
                            "{:.1} / {:.1} / {:.1}",
                            common::pct(v, 0.1),
                            common::pct(v, 0.5),
                            common::pct(v, 0.9)
                        )
                    };
                    println!(
                        "{label:<6} {op:<6} {n:>10} {:>24} {:>24} {:>7.3}",
                        cell(&m),
                        cell(&nat),
                        common::pct(&m, 0.5) / common::pct(&nat, 0.5)
                    );
                }
            }
        }
    }
    drop(keep);
    drop(guards);
}
