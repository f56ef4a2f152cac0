//! Importing a PyTorch tensor's raw CUDA IPC handle into Rust, against the raw driver calls and
//! against PyTorch's own receiver, in the same run:
//!
//! - `first_open`: `ImportedBuffer::open_raw` + drop (a cold map and unmap each time: the checks,
//!   `cuIpcOpenMemHandle`, `cuPointerGetAttributes`, `cuPointerGetAttribute`,
//!   `cuIpcCloseMemHandle`) vs `cuIpcOpenMemHandle` + `cuIpcCloseMemHandle`;
//! - `cached_reopen`: `open_raw` + drop while another view holds the mapping (an import-cache
//!   hit);
//! - `torch.multiprocessing`: a CUDA tensor of the same size put on a queue and rebuilt by the
//!   receiver (which answers with its data pointer), the receiver's cache warm — what PyTorch
//!   users pay per hand-off (measured by `examples/interop/cuda_ipc_peer.py torch-mp-bench`).
//!
//! The exporter is a Python process (`torch-export`), started once. Needs python3 with torch
//! (and cupy for the script's import check) on the GPU machine.
//!
//! Run: `cargo bench --bench torch_interop`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: failing loudly is the point

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::Criterion;
use cuda_ipc::ImportedBuffer;
use cuda_ipc::driver::sys;
use cuda_ipc::raw::{RawImport, RawMemHandle};

const PEER: &str = include_str!("../examples/interop/cuda_ipc_peer.py");
const NUMEL: usize = 1 << 20;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn main() {
    let Some(ctx) = common::gpu_or_skip("torch_interop") else {
        return;
    };
    let script =
        std::env::temp_dir().join(format!("cuda-ipc-bench-peer-{}.py", std::process::id()));
    std::fs::write(&script, PEER).unwrap();
    let mut exporter = Command::new("python3")
        .arg(&script)
        .args(["torch-export", &NUMEL.to_string(), "1", "plain"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("bench torch_interop needs python3 with torch");
    let mut out = BufReader::new(exporter.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        f.first(),
        Some(&"EXPORT"),
        "the Python exporter said {line:?}"
    );
    let handle = RawMemHandle::from_torch(&hex(f[1])).unwrap();
    let offset: u64 = f[2].parse().unwrap();
    let pid: u32 = f[5].parse().unwrap();
    let import = RawImport::new(handle, offset, NUMEL).exporter_pid(pid);

    ctx.make_current().unwrap(); // for the raw calls
    let raw_open_close = || {
        let mut ptr = 0;
        // SAFETY: writes one pointer; the handle is a live foreign export; closed at once.
        unsafe {
            assert_eq!(
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    sys::CUipcHandle { reserved: handle.0 },
                    sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
                ),
                sys::CUDA_SUCCESS
            );
            assert_eq!(sys::cuIpcCloseMemHandle(ptr), sys::CUDA_SUCCESS);
        }
    };
    let open = || {
        // SAFETY: the Python exporter keeps the tensor alive until its stdin closes, after
        // every view here is gone; no GPU work is enqueued on the views.
        let view = unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &import) };
        drop(view.unwrap());
    };

    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("torch_interop");
        g.bench_function("first_open/cuda_ipc", |b| b.iter(open));
        g.bench_function("first_open/raw", |b| b.iter(raw_open_close));
        // SAFETY: as above.
        let held = unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &import) }.unwrap();
        g.bench_function("cached_reopen/cuda_ipc", |b| b.iter(open));
        drop(held);
        g.finish();
    }
    c.final_summary();

    if common::is_bench_run() {
        let (ours, raw) = common::sample_pair(31, 200, open, raw_open_close);
        // SAFETY: as above.
        let held = unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &import) }.unwrap();
        let hits = common::sample(31, 20_000, open);
        drop(held);
        let torch = Command::new("python3")
            .arg(&script)
            .args(["torch-mp-bench", "2000", &NUMEL.to_string()])
            .output()
            .unwrap();
        let torch_out = String::from_utf8_lossy(&torch.stdout);
        let torch_line = torch_out
            .lines()
            .find(|l| l.starts_with("TORCH_MP"))
            .unwrap_or_else(|| panic!("torch-mp-bench said {torch_out:?} {:?}", torch.stderr));
        let t: Vec<f64> = torch_line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        let p = |v: &[f64]| {
            format!(
                "{:.2} / {:.2} / {:.2} µs",
                common::pct(v, 0.1) / 1e3,
                common::pct(v, 0.5) / 1e3,
                common::pct(v, 0.9) / 1e3
            )
        };
        println!(
            "summary: torch_interop, a {NUMEL}-element int32 PyTorch tensor (p10 / p50 / p90)"
        );
        println!("  first open + close, cuda-ipc   {}", p(&ours));
        println!("  first open + close, raw driver {}", p(&raw));
        println!(
            "  ratio (p50)                    {:.3}",
            common::pct(&ours, 0.5) / common::pct(&raw, 0.5)
        );
        println!("  cached re-open, cuda-ipc       {}", p(&hits));
        println!(
            "  torch.multiprocessing hand-off {:.2} / {:.2} / {:.2} µs (queue put -> receiver rebuilt, cache warm)",
            t[0], t[1], t[2]
        );
        println!(
            "  torch hand-off / cuda-ipc cached re-open (p50): {:.0}x; / first open: {:.2}x",
            t[1] * 1e3 / common::pct(&hits, 0.5),
            t[1] * 1e3 / common::pct(&ours, 0.5)
        );
    }
    drop(exporter.stdin.take()); // EOF: the exporter frees its tensor and exits
    let _ = exporter.wait();
    let _ = std::fs::remove_file(&script);
}
