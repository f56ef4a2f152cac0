//! What `examples/simple_ipc.rs` and `examples/signal_ring.rs` do when a child fails or is
//! killed at a given step (GPU): the example exits 1 within a bounded time, names the child
//! that failed, the other children stop at their next barrier instead of waiting for it, and
//! nothing of this crate is left in `/dev/shm`.
//!
//! The examples carry no fault injection of their own: this binary builds both with a hook
//! called at the start of each child's step (their `run(args, at_step)`), runs each scenario
//! as a parent process of its own (this executable again, with `CUDA_IPC_FAULT_EXAMPLE` and
//! `CUDA_IPC_FAULT` set; the parent re-executes it once per child, as the examples do), and
//! checks the outcome. `CUDA_IPC_FAULT=ID:STEP` makes child `ID` exit with status 3 at step
//! `STEP`; `ID:STEP:kill` makes it `SIGKILL` itself there.
//!
//! `harness = false`: the examples' parents start their children with `--child REGION ID`,
//! which a libtest binary would take as test filters. Without a GPU every scenario is waived
//! (exit 0), unless `CUDA_IPC_REQUIRE_GPU` is set, which makes that a failure.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// test code
// Both examples load examples/common/cuda.rs as a module of their own: two copies, harmless.
#![allow(clippy::duplicate_mod)]

#[path = "../examples/signal_ring.rs"]
mod signal_ring;
#[path = "../examples/simple_ipc.rs"]
mod simple_ipc;

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const EXAMPLE_ENV: &str = "CUDA_IPC_FAULT_EXAMPLE";
const FAULT_ENV: &str = "CUDA_IPC_FAULT";
/// A scenario that takes longer than this has hung: the example is killed and the run fails.
const LIMIT: Duration = Duration::from_secs(120);

/// The hook: fail or die where `CUDA_IPC_FAULT` says.
fn inject(id: usize, step: usize) {
    let Ok(spec) = std::env::var(FAULT_ENV) else {
        return;
    };
    if spec == format!("{id}:{step}") {
        eprintln!("Process {id}: injected failure at step {step}");
        std::process::exit(3);
    }
    if spec == format!("{id}:{step}:kill") {
        eprintln!("Process {id}: killing itself at step {step}");
        // SAFETY: sends SIGKILL to this process; no memory is involved.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::thread::sleep(Duration::from_secs(5)); // the signal arrives meanwhile
    }
}

/// One scenario: which example, with which arguments, which child fails where.
struct Scenario {
    example: &'static str,
    args: &'static [&'static str],
    id: usize,
    step: usize,
    kill: bool,
}

impl Scenario {
    fn spec(&self) -> String {
        if self.kill {
            format!("{}:{}:kill", self.id, self.step)
        } else {
            format!("{}:{}", self.id, self.step)
        }
    }

    fn label(&self) -> String {
        format!(
            "{} {} with {}",
            self.example,
            self.args.join(" "),
            self.spec()
        )
    }
}

fn scenarios() -> Vec<Scenario> {
    let mut all = Vec::new();
    let s = |example, args, id, step, kill| Scenario {
        example,
        args,
        id,
        step,
        kill,
    };
    all.push(s("simple_ipc", &[][..], 1, 0, false));
    for (id, step) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        all.push(s("simple_ipc", &[][..], id, step, true));
    }
    // The buffers came over a socket (fd), or as pool allocations the killed child imported.
    all.push(s("simple_ipc", &["--handles", "fd"][..], 1, 0, true));
    all.push(s("simple_ipc", &["--handles", "pool"][..], 1, 0, true));
    // A survivor's stream may be parked on a GPU wait the dead child would have satisfied: its
    // host-side barrier and signal waits must still end it.
    for (id, step) in [(0, 1), (1, 0)] {
        all.push(s("signal_ring", &[][..], id, step, true));
    }
    // What one GPU allows (one child, one step): child 0 failing and killed at step 0 in every
    // example and handle type, so a one-GPU run covers each path, not one of nine.
    all.push(s("simple_ipc", &[][..], 0, 0, false));
    all.push(s("simple_ipc", &["--handles", "fd"][..], 0, 0, true));
    all.push(s("simple_ipc", &["--handles", "pool"][..], 0, 0, false));
    all.push(s("signal_ring", &[][..], 0, 0, true));
    all
}

/// This crate's names in `/dev/shm` (the driver's `cuda.shm.*` are not ours).
fn ours_in_shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("cuda.shm."))
                .collect()
        })
        .unwrap_or_default()
}

/// Run one scenario; returns its exit code and output (stdout and stderr together).
fn run_scenario(sc: &Scenario) -> (Option<i32>, String, Duration) {
    let exe = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let mut child = Command::new(exe)
        .args(sc.args)
        .env(EXAMPLE_ENV, sc.example)
        .env(FAULT_ENV, sc.spec())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read both pipes on threads (a full pipe would stall the example).
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{}: still running after {LIMIT:?} (hung)", sc.label());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = t0.elapsed();
    let output = reader.join().unwrap() + &err_reader.join().unwrap();
    (status.code(), output, elapsed)
}

fn runner() -> ExitCode {
    let require_gpu = std::env::var_os("CUDA_IPC_REQUIRE_GPU").is_some();
    let devices = match cuda_ipc::device::PeerGroup::select(8) {
        Ok(g) => g.devices.len(),
        Err(e) if !require_gpu => {
            println!("simple_ipc_faults: no GPU ({e}); every scenario waived");
            return ExitCode::SUCCESS;
        }
        Err(e) => panic!("simple_ipc_faults: a GPU is required here: {e}"),
    };
    if devices == 0 {
        assert!(!require_gpu, "simple_ipc_faults: no device can do IPC");
        println!("simple_ipc_faults: no device can do IPC; every scenario waived");
        return ExitCode::SUCCESS;
    }
    let mut failures = Vec::new();
    let mut ran = 0;
    for sc in scenarios() {
        // n children and n steps: a fault beyond them would never fire.
        if sc.id >= devices || sc.step >= devices {
            continue;
        }
        let before = ours_in_shm();
        let (code, output, elapsed) = run_scenario(&sc);
        ran += 1;
        let culprit = format!("child {} (pid", sc.id);
        let how = if sc.kill {
            "signal: 9 (SIGKILL)"
        } else {
            "exit status: 3"
        };
        let named = output
            .lines()
            .any(|l| l.contains("error: failed:") && l.contains(&culprit) && l.contains(how));
        let left: Vec<String> = ours_in_shm().difference(&before).cloned().collect();
        let summary: Vec<&str> = output.lines().filter(|l| l.contains("error")).collect();
        println!(
            "{}: rc={} in {} ms: {}",
            sc.label(),
            code.map_or("signal".into(), |c| c.to_string()),
            elapsed.as_millis(),
            summary.join(" | ")
        );
        if code != Some(1) {
            failures.push(format!(
                "{}: exit {code:?}, expected 1\n{output}",
                sc.label()
            ));
        } else if !named {
            failures.push(format!(
                "{}: the parent did not name {culprit} … {how})\n{output}",
                sc.label()
            ));
        } else if !left.is_empty() {
            failures.push(format!("{}: left in /dev/shm: {left:?}", sc.label()));
        }
    }
    println!(
        "simple_ipc_faults: {ran} scenario(s) on {devices} device(s), {} failed",
        failures.len()
    );
    for f in &failures {
        eprintln!("FAILED: {f}");
    }
    let applicable = scenarios()
        .iter()
        .filter(|sc| sc.id < devices && sc.step < devices)
        .count();
    assert!(
        ran == applicable && ran >= 5,
        "{ran} of {applicable} scenarios ran (one GPU allows five)"
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match std::env::var(EXAMPLE_ENV).as_deref() {
        // A scenario's parent, or one of its children: the example itself, with the hook.
        Ok("signal_ring") => signal_ring::run(args, inject),
        Ok(_) => simple_ipc::run(args, inject),
        // Run by cargo test or .gpu/run (libtest's flags, such as --include-ignored, ignored).
        Err(_) => runner(),
    }
}
