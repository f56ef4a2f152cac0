//! Host-side IPC without a GPU: a parent creates a shared region holding a barrier and a slot
//! per child, starts N children by re-executing itself (never `fork` without `exec`), and the
//! children take turns through a few barrier generations, as simpleIPC's children do.
//!
//! ```text
//! cargo run --example shm_barrier -- [children (default 4)] [steps (default 3)]
//! ```

use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cuda_ipc::ShmSafe;
use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::error::StateDefect;
use cuda_ipc::shm::ShmOptions;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    barrier: BarrierState,
    /// Each child adds its id + 1 here at every step.
    sum: AtomicU64,
}

fn child(name: &str, id: u64, steps: u64) -> cuda_ipc::Result<()> {
    let region = ShmOptions::new(name).open::<Shared>()?;
    let barrier = ProcessBarrier::join(&region.barrier)?;
    let n = u64::from(barrier.parties());
    for step in 0..steps {
        region.sum.fetch_add(id + 1, Ordering::AcqRel);
        let r = barrier.wait()?;
        // After the barrier every child's addition for this step is visible.
        let expected = (step + 1) * n * (n + 1) / 2;
        let sum = region.sum.load(Ordering::Acquire);
        if sum < expected {
            return Err(cuda_ipc::Error::Corrupt {
                what: "the example's sum",
                defect: StateDefect::Counter {
                    field: "sum",
                    found: sum,
                    expected,
                },
            });
        }
        if r.is_leader() {
            println!("Step {step} done (led by child {id})");
        }
        barrier.wait()?; // nobody starts the next step before everyone checked this one
    }
    Ok(())
}

fn parent(children: u32, steps: u64) -> cuda_ipc::Result<bool> {
    let start = Instant::now();
    let region = ShmOptions::new("shm_barrier_example")
        .random_suffix(true)
        .create_with(|s: &Shared| s.barrier.init(children))?;
    let exe = std::env::current_exe().map_err(|e| cuda_ipc::Error::Os {
        call: "current_exe",
        name: String::new(),
        source: e,
    })?;
    let mut procs = Vec::new();
    for id in 0..children {
        let proc = Command::new(&exe)
            .args([
                "--child",
                region.name(),
                &id.to_string(),
                &steps.to_string(),
            ])
            .spawn()
            .map_err(|e| cuda_ipc::Error::Os {
                call: "spawn",
                name: exe.display().to_string(),
                source: e,
            })?;
        procs.push(proc);
    }
    let mut ok = true;
    for (id, mut p) in procs.into_iter().enumerate() {
        let status = p.wait().map_err(|e| cuda_ipc::Error::Os {
            call: "waitpid",
            name: format!("child {id}"),
            source: e,
        })?;
        if !status.success() {
            eprintln!("child {id} failed: {status}");
            ok = false;
        }
    }
    let n = u64::from(children);
    println!(
        "{children} processes, {steps} steps, sum {} (expected {}), {:.1} ms",
        region.sum.load(Ordering::Acquire),
        steps * n * (n + 1) / 2,
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(ok)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let (Some(name), Some(id), Some(steps)) = (args.get(1), args.get(2), args.get(3)) else {
            eprintln!("usage: --child NAME ID STEPS");
            return ExitCode::from(1);
        };
        let (Ok(id), Ok(steps)) = (id.parse(), steps.parse()) else {
            eprintln!("bad child arguments");
            return ExitCode::from(1);
        };
        return match child(name, id, steps) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("child {id}: {e}");
                ExitCode::from(1)
            }
        };
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: shm_barrier [children 1..={} (default 4)] [steps (default 3)]",
            ProcessBarrier::MAX_PARTIES
        );
        return ExitCode::SUCCESS;
    }
    let children = args.first().and_then(|s| s.parse().ok()).unwrap_or(4u32);
    let steps = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3u64);
    match parent(children, steps) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
