//! Bandwidth through an IPC mapping, against a native allocation in the same run:
//!
//! - `copy`: a device-to-device copy (copy engine, `cuMemcpyDtoDAsync`) from a local buffer into
//!   another process's buffer — a legacy mapping (`ipc_mapping`) and a POSIX-fd one
//!   (`fd_mapping`, `cuMemMap` of an imported descriptor; an `IpcArena` is such a mapping too)
//!   and a stream-ordered pool allocation (`pool_mapping`, `cuMemPoolImportPointer`) — vs into
//!   this process's own
//!   allocation on the same device (`native`, `cuMemAlloc`; the `cuMemcpyPeer` path when that
//!   device is another GPU) and into an own virtual-memory allocation there (`native_vmm`, a
//!   `HandleType::PosixFd` buffer: `cuMemCreate` memory mapped by this process, no IPC — the
//!   floor for the fd and pool mappings, whose memory is of that kind: the `fd/vmm` and
//!   `pool/vmm` ratios);
//! - `kernel`: simpleIPC's kernel writing every byte of the mapped buffers vs of the own one;
//!
//! on one GPU (exporter and importer share device 0) and across two (the exporter's buffer on
//! device 1, written from device 0 over NVLink), for 4 KiB to 256 MiB.
//! Run: `cargo bench --bench transfer`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::cuda::{BlockSize, Module, Stream, StreamFlags, launch};
use criterion::{BenchmarkId, Criterion, Throughput};
use cuda_ipc::driver::sys;
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
use cuda_ipc::pool::{IpcPool, PoolHandle};
use cuda_ipc::{GpuContext, GpuSlice, HandleType, IpcBuffer, RawStream};

const MAX: usize = 256 << 20;
const SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

const T: Duration = Duration::from_secs(60);

/// Any of the mapped buffers.
type Mapped = Box<dyn std::ops::Deref<Target = GpuSlice<u8>>>;

/// The helper: allocate on a device with a handle type (or from a pool), send it over the
/// socket, wait.
fn exporter(arg: &str) {
    let mut parts = arg.split(':');
    let (socket, device, kind) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let ctx = GpuContext::new(device.parse().unwrap()).unwrap();
    let name = SocketName::Abstract(socket.to_owned());
    if kind == "pool" {
        let pool = IpcPool::new(&ctx).unwrap();
        let buf = pool.alloc::<u8>(MAX, &RawStream::LEGACY).unwrap();
        buf.memset_bytes(0).unwrap();
        let s = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
        s.send_pool(&pool, T).unwrap();
        s.send(buf.handle().unwrap().as_bytes(), &[], T).unwrap();
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let handle_type = if kind == "fd" {
        HandleType::PosixFd
    } else {
        HandleType::Legacy
    };
    let buf = IpcBuffer::<u8>::zeroed_with(&ctx, MAX, handle_type).unwrap();
    let s = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
    s.send_buffer(&buf, T).unwrap();
    std::thread::sleep(Duration::from_secs(3600));
}

/// A buffer exported on `device` with `kind` ("legacy", "fd" or "pool") by a helper, mapped
/// here; the helper lives as long as its guard.
fn peer_buffer(ctx: &GpuContext, device: u32, kind: &str) -> (Mapped, common::Helper) {
    let socket = format!(
        "cuda-ipc-bench-transfer-{}-{device}-{kind}",
        std::process::id()
    );
    let listener =
        FdListener::bind(SocketName::Abstract(socket.clone()), PeerPolicy::SameUid).unwrap();
    let helper = common::spawn("exporter", &format!("{socket}:{device}:{kind}"));
    let s = listener.accept(T).unwrap();
    if kind == "pool" {
        let pool = s.recv_pool(ctx, T).unwrap();
        let handle = PoolHandle::<u8>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
        return (Box::new(pool.open(&handle).unwrap()), helper);
    }
    let buf = s.recv_buffer::<u8>(ctx, T).unwrap();
    if kind == "fd" {
        assert_eq!(buf.handle_type(), HandleType::PosixFd);
    }
    (Box::new(buf), helper)
}

struct Engine<'m> {
    stream: Stream,
    kernel: common::cuda::Function<'m>,
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
    let gpus = cuda_ipc::device::device_count().unwrap();
    let src = IpcBuffer::<u8>::zeroed(&ctx, MAX).unwrap();
    // (label, legacy-mapped, fd-mapped and pool-mapped targets, native targets on the same
    // device: `cuMemAlloc` and own `cuMemCreate` memory)
    let mut cases = Vec::new();
    let mut keep = Vec::new();
    let mut guards = Vec::new();
    let ctx1 = (gpus >= 2).then(|| GpuContext::new(1).unwrap());
    if let Some(ctx1) = &ctx1 {
        ctx.enable_peer_access(ctx1).unwrap();
    } else {
        println!("bench transfer: one GPU visible; the two-GPU cases need two");
    }
    for (label, device, own_ctx) in [("1gpu", 0, Some(&ctx)), ("2gpu", 1, ctx1.as_ref())] {
        let Some(own_ctx) = own_ctx else { continue };
        let (legacy, h_legacy) = peer_buffer(&ctx, device, "legacy");
        let (fd, h_fd) = peer_buffer(&ctx, device, "fd");
        let (pool, h_pool) = peer_buffer(&ctx, device, "pool");
        let own = IpcBuffer::<u8>::zeroed(own_ctx, MAX).unwrap();
        let own_vmm = IpcBuffer::<u8>::new_with(own_ctx, MAX, HandleType::PosixFd).unwrap();
        own_vmm.memset_bytes(0).unwrap();
        // The crate maps virtual memory for its own device only; the copies and kernels below
        // run on device 0, which an importer there has access to, so give it access here too.
        own_vmm.grant_access(&ctx).unwrap();
        cases.push((
            label,
            [legacy.as_raw_ptr(), fd.as_raw_ptr(), pool.as_raw_ptr()],
            [own_vmm.as_raw_ptr(), own.as_raw_ptr()],
        ));
        keep.push((legacy, fd, pool, own, own_vmm));
        guards.push((h_legacy, h_fd, h_pool));
    }
    ctx.make_current().unwrap();
    let module = Module::from_ptx(KERNELS, &[]).unwrap();
    let kernel = module.get_function("simple_kernel").unwrap();
    let per_sm = kernel
        .max_active_blocks_per_multiprocessor(BlockSize::x(128), 0)
        .unwrap();
    let blocks = per_sm * cuda_ipc::device::device_info(0).unwrap().multiprocessors;
    let e = Engine {
        stream: Stream::new(StreamFlags::NON_BLOCKING, None).unwrap(),
        kernel,
        blocks,
    };
    let s = src.as_raw_ptr();

    let mut c = Criterion::default().configure_from_args();
    for &(label, [mapped, fd_mapped, pool_mapped], [native_vmm, native]) in &cases {
        for op in ["copy", "kernel"] {
            let mut g = c.benchmark_group(format!("transfer_{label}_{op}"));
            g.sample_size(20)
                .measurement_time(Duration::from_secs(1))
                .warm_up_time(Duration::from_millis(200));
            for n in SIZES {
                g.throughput(Throughput::Bytes(n as u64));
                for (target, dst) in [
                    ("ipc_mapping", mapped),
                    ("fd_mapping", fd_mapped),
                    ("pool_mapping", pool_mapped),
                    ("native_vmm", native_vmm),
                    ("native", native),
                ] {
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
            "summary: transfer bandwidth, GB/s (p10 / p50 / p90 over 31 rounds of one batch per target, the order rotated every round), ratios of p50s to native (cuMemAlloc), and of the fd and pool mappings to native_vmm (own cuMemCreate memory)"
        );
        println!(
            "{:<6} {:<6} {:>10} {:>24} {:>24} {:>24} {:>24} {:>24} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
            "case",
            "op",
            "bytes",
            "ipc_mapping",
            "fd_mapping",
            "pool_mapping",
            "native_vmm",
            "native",
            "ipc",
            "fd",
            "pool",
            "vmm",
            "fd/vmm",
            "pool/vmm"
        );
        for &(label, [mapped, fd_mapped, pool_mapped], [native_vmm, native]) in &cases {
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
                    // Alternate mapped and native batches so drift lands on all, and rotate
                    // their order every round so that no target always follows the same one
                    // (a batch can inherit the state its predecessor left: caches, clocks).
                    let targets = [mapped, fd_mapped, pool_mapped, native_vmm, native];
                    let mut runs: [Vec<f64>; 5] = Default::default();
                    for round in 0..31 {
                        for k in 0..targets.len() {
                            let t = (round + k) % targets.len();
                            runs[t].push(batch(targets[t]));
                        }
                    }
                    for v in &mut runs {
                        v.sort_by(f64::total_cmp);
                    }
                    let [m, f, p, vmm, nat] = runs;
                    let cell = |v: &[f64]| {
                        format!(
                            "{:.1} / {:.1} / {:.1}",
                            common::pct(v, 0.1),
                            common::pct(v, 0.5),
                            common::pct(v, 0.9)
                        )
                    };
                    let ratio = |v: &[f64], to: &[f64]| common::pct(v, 0.5) / common::pct(to, 0.5);
                    println!(
                        "{label:<6} {op:<6} {n:>10} {:>24} {:>24} {:>24} {:>24} {:>24} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
                        cell(&m),
                        cell(&f),
                        cell(&p),
                        cell(&vmm),
                        cell(&nat),
                        ratio(&m, &nat),
                        ratio(&f, &nat),
                        ratio(&p, &nat),
                        ratio(&vmm, &nat),
                        ratio(&f, &vmm),
                        ratio(&p, &vmm)
                    );
                }
            }
        }
    }
    drop(keep);
    drop(guards);
}
