//! Export and open cost with 1, 100, 1,000 and 10,000 live buffers: the
//! per-operation cost should stay within 1.2× of the 1-buffer case, and the descriptors and
//! `/dev/shm` entries of each process should not grow with the number of exports.
//!
//! - **first export**: `IpcBuffer::handle` of a buffer never exported (it publishes the
//!   buffer's block in this process's export registry, then `cuIpcGetMemHandle` and the
//!   envelope), with N − 1 other buffers of this process exported and live; against raw
//!   `cuIpcGetMemHandle` of a fresh buffer in the same state;
//! - **open + close**: `ImportedBuffer::open` + drop of a helper process's buffer (a cold
//!   open: the mapping is closed each time), with N − 1 other buffers of the same helper
//!   opened and held; against raw `cuIpcOpenMemHandle` + `cuIpcCloseMemHandle`.
//!
//! Buffers are 2 MiB (one allocation each: smaller `cuMemAlloc` blocks may share one, and a
//! legacy handle maps the allocation). The helper exports 10,001 buffers (20 GB) once, before
//! the measurement. Run: `cargo bench --bench scaling` (or `-- --bench none` for the summary
//! alone).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion};
use cuda_ipc::driver::sys;
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle, ShmSafe};

/// The live-buffer counts measured.
const SIZES: [usize; 4] = [1, 100, 1_000, 10_000];
const MAX: usize = 10_000;
const BYTES: usize = 2 << 20;
/// Fresh buffers timed per sample set of the summary (each exported once).
const FRESH: usize = 200;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    ready: AtomicU32,
    /// Buffer 0's raw driver handle (the raw open baseline).
    raw: ShmCell<[u8; 64]>,
    mem: [ShmCell<IpcMemHandle<u8>>; MAX],
}

/// The helper: 10,000 buffers exported and kept live.
fn exporter(region: &str) {
    let shared = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(0).unwrap();
    let bufs: Vec<IpcBuffer<u8>> = (0..MAX)
        .map(|_| IpcBuffer::<u8>::new(&ctx, BYTES).unwrap())
        .collect();
    for (cell, buf) in shared.mem.iter().zip(&bufs) {
        cell.store(buf.handle().unwrap());
    }
    ctx.make_current().unwrap();
    let mut h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: a buffer this process allocated, on the current context.
    common::ok("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut h, bufs[0].as_raw_ptr())
    });
    shared.raw.store(h.reserved);
    shared.ready.store(1, Ordering::Release);
    std::thread::sleep(Duration::from_secs(3600));
}

/// Open file descriptors, `/dev/shm` entries of this crate, and memory mappings of this
/// process.
fn footprint() -> (usize, usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let shm = std::fs::read_dir("/dev/shm").map_or(0, |d| {
        d.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("cuda-ipc-"))
            .count()
    });
    let maps = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    (fds, shm, maps)
}

struct Fixture {
    ctx: GpuContext,
    shared: cuda_ipc::shm::ShmRegion<Shared>,
    raw_handle: sys::CUipcHandle,
    /// This process's exported buffers (the export side's background).
    own: Vec<IpcBuffer<u8>>,
    /// The helper's buffers opened here (the open side's background).
    held: Vec<ImportedBuffer<u8>>,
}

impl Fixture {
    /// Grow both backgrounds to `n - 1` live buffers.
    fn grow_to(&mut self, n: usize) {
        while self.own.len() < n - 1 {
            let buf = IpcBuffer::<u8>::new(&self.ctx, BYTES).unwrap();
            std::hint::black_box(buf.handle().unwrap());
            self.own.push(buf);
        }
        while self.held.len() < n - 1 {
            let i = self.held.len() + 1; // buffer 0 is the one measured
            self.held
                .push(ImportedBuffer::open(&self.ctx, &self.shared.mem[i].load()).unwrap());
        }
    }

    fn fresh(&self) -> IpcBuffer<u8> {
        IpcBuffer::<u8>::new(&self.ctx, BYTES).unwrap()
    }

    fn raw_export(buf: &IpcBuffer<u8>) -> sys::CUipcHandle {
        let mut h = sys::CUipcHandle { reserved: [0; 64] };
        // SAFETY: a buffer this process allocated, on the current context.
        common::ok("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, buf.as_raw_ptr())
        });
        h
    }

    fn ours_open_close(&self) {
        drop(ImportedBuffer::open(&self.ctx, &self.shared.mem[0].load()).unwrap());
    }

    fn raw_open_close(&self) {
        // SAFETY: the helper's live handle, on the current context.
        unsafe { common::raw_open_close(self.raw_handle) }
    }

    /// Per-call times (ns) of first exports, ours and raw, each of a fresh buffer, alternating
    /// in groups of 20; sorted.
    fn sample_exports(&self) -> (Vec<f64>, Vec<f64>) {
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for round in 0..FRESH / 20 {
            let mut time_ours = || {
                let bufs: Vec<_> = (0..20).map(|_| self.fresh()).collect();
                for b in &bufs {
                    let t = Instant::now();
                    std::hint::black_box(b.handle().unwrap());
                    ours.push(t.elapsed().as_nanos() as f64);
                }
            };
            let mut time_raw = || {
                let bufs: Vec<_> = (0..20).map(|_| self.fresh()).collect();
                for b in &bufs {
                    let t = Instant::now();
                    std::hint::black_box(Self::raw_export(b));
                    base.push(t.elapsed().as_nanos() as f64);
                }
            };
            if round % 2 == 0 {
                time_ours();
                time_raw();
            } else {
                time_raw();
                time_ours();
            }
        }
        ours.sort_by(f64::total_cmp);
        base.sort_by(f64::total_cmp);
        (ours, base)
    }
}

fn benches(c: &mut Criterion, f: &mut Fixture) {
    let mut g = c.benchmark_group("scaling");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(20);
    for n in SIZES {
        f.grow_to(n);
        let fx = &*f;
        g.bench_with_input(BenchmarkId::new("first_export/cuda_ipc", n), &n, |b, _| {
            b.iter_batched(
                || fx.fresh(),
                |buf| {
                    std::hint::black_box(buf.handle().unwrap());
                    buf
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("first_export/raw", n), &n, |b, _| {
            b.iter_batched(
                || fx.fresh(),
                |buf| {
                    std::hint::black_box(Fixture::raw_export(&buf));
                    buf
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("open_close/cuda_ipc", n), &n, |b, _| {
            b.iter(|| fx.ours_open_close())
        });
        g.bench_with_input(BenchmarkId::new("open_close/raw", n), &n, |b, _| {
            b.iter(|| fx.raw_open_close())
        });
    }
    g.finish();
}

fn summary(f: &mut Fixture) {
    println!();
    println!(
        "summary: scaling with N live buffers (p50 per call; ratio to the raw call, and to N = 1)"
    );
    println!(
        "{:>6} {:>12} {:>10} {:>6} {:>6} {:>12} {:>10} {:>6} {:>6} {:>5} {:>5} {:>6}",
        "N",
        "export",
        "raw",
        "ratio",
        "/N=1",
        "open+close",
        "raw",
        "ratio",
        "/N=1",
        "fds",
        "shm",
        "maps"
    );
    let (mut export1, mut open1) = (None, None);
    for n in SIZES {
        f.grow_to(n);
        let (ours_x, raw_x) = f.sample_exports();
        let (ours_o, raw_o) =
            common::sample_pair(31, 20, || f.ours_open_close(), || f.raw_open_close());
        let (x, xr, o, or) = (
            common::pct(&ours_x, 0.5),
            common::pct(&raw_x, 0.5),
            common::pct(&ours_o, 0.5),
            common::pct(&raw_o, 0.5),
        );
        let x1 = *export1.get_or_insert(x);
        let o1 = *open1.get_or_insert(o);
        let (fds, shm, maps) = footprint();
        println!(
            "{n:>6} {:>9.2} µs {:>7.2} µs {:>6.3} {:>6.3} {:>9.2} µs {:>7.2} µs {:>6.3} {:>6.3} \
             {fds:>5} {shm:>5} {maps:>6}",
            x / 1e3,
            xr / 1e3,
            x / xr,
            x / x1,
            o / 1e3,
            or / 1e3,
            o / or,
            o / o1,
        );
    }
    println!(
        "(fds, shm: this process's descriptors and the crate's /dev/shm entries of both \
         processes; maps: this process's memory mappings, the driver's included)"
    );
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "exporter");
        exporter(&arg);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("scaling") else {
        return;
    };
    let shared = ShmOptions::new("cuda-ipc-bench-scaling")
        .random_suffix(true)
        .create::<Shared>()
        .unwrap();
    let _helper = common::spawn("exporter", shared.name());
    common::wait_for("exporter", Duration::from_secs(300), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    let raw_handle = sys::CUipcHandle {
        reserved: shared.raw.load(),
    };
    let mut f = Fixture {
        ctx,
        shared,
        raw_handle,
        own: Vec::new(),
        held: Vec::new(),
    };
    f.ctx.make_current().unwrap(); // for the raw calls
    if common::is_bench_run() {
        summary(&mut f);
        // The Criterion groups start again from one live buffer.
        f.own.clear();
        f.held.clear();
    }
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &mut f);
    c.final_summary();
}
