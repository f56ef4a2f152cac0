//! Shared pieces of the GPU benches: helper processes (this bench binary re-executed with a
//! role), the "no GPU, nothing to measure" exit, and the same-run summary table.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

/// The re-exec harness shared with the tests (`tests/common/mod.rs`).
#[path = "../../tests/common/mod.rs"]
mod process;
/// Kernels and streams without cust (`examples/common/cuda.rs`).
#[allow(unused_imports)] // not every bench launches a kernel
pub use process::cuda;
#[allow(unused_imports)] // not every bench waits for its helper
pub use process::wait_for;

/// In a helper process: its role and argument.
pub fn role() -> Option<(String, String)> {
    process::helper_role().map(|(role, args)| (role, args.into_iter().next().unwrap_or_default()))
}

/// A helper process, killed and reaped on drop; then the tables a killed exporter could not
/// unlink are reclaimed.
pub struct Helper(Option<process::Child>);

pub fn spawn(role: &str, arg: &str) -> Helper {
    Helper(Some(process::spawn_helper(role, &[arg])))
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.0.take()); // killed and reaped
        cuda_ipc::shm::reclaim_stale_regions();
    }
}

/// Device `ordinal`'s context, or `None` (after saying so) when there is no GPU: the bench
/// then exits 0 so that `cargo test --benches` passes on machines without one.
pub fn gpu_or_skip(bench: &str) -> Option<cuda_ipc::GpuContext> {
    match cuda_ipc::GpuContext::new(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            assert!(
                std::env::var_os("CUDA_IPC_REQUIRE_GPU").is_none(),
                "bench {bench}: a GPU is required here: {e}"
            );
            println!("bench {bench}: no CUDA device ({e}); nothing to measure");
            None
        }
    }
}

/// Whether this is a real benchmark run (`cargo bench`), not `cargo test --benches`.
pub fn is_bench_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Per-call times (ns) of `batches` batches of `per_batch` calls, sorted.
pub fn sample(batches: usize, per_batch: u32, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..per_batch {
        f();
    }
    let mut v: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(per_batch)
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Calls per batch so that a batch of `f` takes about `target` (20 to 20,000).
pub fn batch_size(target: Duration, mut f: impl FnMut()) -> u32 {
    let t = Instant::now();
    for _ in 0..20 {
        f();
    }
    let per_call = t.elapsed().as_secs_f64() / 20.0;
    (target.as_secs_f64() / per_call.max(1e-9)).clamp(20.0, 20_000.0) as u32
}

/// Like [`sample`] for two variants, alternating their batches (A, B, A, B, ...) so that drift
/// in the machine or the driver lands on both alike.
pub fn sample_pair(
    batches: usize,
    per_batch: u32,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (Vec<f64>, Vec<f64>) {
    for _ in 0..per_batch {
        a();
        b();
    }
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        t.elapsed().as_nanos() as f64 / f64::from(per_batch)
    };
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        va.push(time(&mut a));
        vb.push(time(&mut b));
    }
    va.sort_by(f64::total_cmp);
    vb.sort_by(f64::total_cmp);
    (va, vb)
}

/// Panic unless a raw driver call of a baseline succeeded, naming the call and its code.
pub fn ok(call: &str, rc: i32) {
    assert_eq!(rc, 0, "{call} failed: {}", cuda_ipc::driver::error_name(rc));
}

/// The raw baseline of a cold legacy open: `cuIpcOpenMemHandle` (lazy peer access) and
/// `cuIpcCloseMemHandle` of `handle` on the current context.
///
/// # Safety
///
/// `handle` is a live export of another process, and a context is current.
pub unsafe fn raw_open_close(handle: cuda_ipc::driver::sys::CUipcHandle) {
    use cuda_ipc::driver::sys;
    let mut p = 0;
    // SAFETY: the caller's duty; the pointer is closed once, right after it was opened.
    unsafe {
        ok(
            "cuIpcOpenMemHandle",
            sys::cuIpcOpenMemHandle_v2(&mut p, handle, sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
        );
        ok("cuIpcCloseMemHandle", sys::cuIpcCloseMemHandle(p));
    }
}

pub fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One summary row: ours against its baseline, p10/p50/p90 and the p50 ratio.
pub fn row(name: &str, ours: &[f64], base: &[f64]) {
    let fmt = |v: &[f64]| {
        let unit = |x: f64| {
            if x >= 1e6 {
                format!("{:.2} ms", x / 1e6)
            } else if x >= 1e3 {
                format!("{:.2} µs", x / 1e3)
            } else {
                format!("{x:.0} ns")
            }
        };
        format!(
            "{} / {} / {}",
            unit(pct(v, 0.1)),
            unit(pct(v, 0.5)),
            unit(pct(v, 0.9))
        )
    };
    println!(
        "{name:<28} {:>34} {:>34} {:>7.3}",
        fmt(ours),
        fmt(base),
        pct(ours, 0.5) / pct(base, 0.5)
    );
}

pub fn header(title: &str) {
    println!();
    println!("summary: {title} (p10 / p50 / p90 per call)");
    println!(
        "{:<28} {:>34} {:>34} {:>7}",
        "", "cuda-ipc", "raw baseline", "ratio"
    );
}
