//! The cost of calling the driver through the table loaded at run time: a cheap driver call
//! (`cuCtxGetCurrent`) through `cuda_ipc::driver::sys` against the same entry point resolved by
//! hand (`dlsym` once, then a plain call through the pointer), in the same run. The difference
//! is what the run-time loading adds per call (goal: < 5 ns).
//!
//! Run: `cargo bench --bench driver_call`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: failing loudly is the point

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use cuda_ipc::driver::sys;

type GetCurrent = unsafe extern "C" fn(*mut sys::CUcontext) -> sys::CUresult;

fn main() {
    let Some(ctx) = common::gpu_or_skip("driver_call") else {
        return;
    };
    ctx.make_current().unwrap();
    let path = cuda_ipc::driver::library_path().unwrap();
    // SAFETY: the driver library is already loaded by this process (the bench's baseline
    // resolves the same symbol a second time); kept open until the end of main.
    let library = unsafe { libloading::Library::new(path) }.unwrap();
    // SAFETY: cuCtxGetCurrent's prototype is `CUresult (CUcontext *)`.
    let direct: GetCurrent = unsafe { *library.get::<GetCurrent>(b"cuCtxGetCurrent\0").unwrap() };
    let through_table = || {
        let mut c = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        black_box(unsafe { sys::cuCtxGetCurrent(&mut c) });
        black_box(c);
    };
    let raw = || {
        let mut c = std::ptr::null_mut();
        // SAFETY: as above, through the pointer resolved by hand.
        black_box(unsafe { black_box(direct)(&mut c) });
        black_box(c);
    };
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let mut g = c.benchmark_group("driver_call");
    g.bench_function("cuCtxGetCurrent/raw", |b| b.iter(raw));
    g.bench_function("cuCtxGetCurrent/cuda_ipc", |b| b.iter(through_table));
    g.finish();
    c.final_summary();
    if common::is_bench_run() {
        let (ours, base) = common::sample_pair(101, 100_000, through_table, raw);
        let (o, r) = (common::pct(&ours, 0.5), common::pct(&base, 0.5));
        println!(
            "driver_call summary: cuCtxGetCurrent p50 {o:.2} ns through cuda-ipc's table, \
             {r:.2} ns raw: +{:.2} ns per call",
            o - r
        );
    }
}
