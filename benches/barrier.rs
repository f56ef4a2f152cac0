//! Barrier round trip for 2, 4 and 8 processes: `ProcessBarrier` against two baselines in the
//! same run, on the same machine:
//!
//! - `spin`: simpleIPC's own barrier (`barrierWait`: an atomic counter and a sense flag, both
//!   phases busy-waiting), the floor for a barrier that never sleeps;
//! - `pthread`: a process-shared `pthread_barrier_t` (glibc, futex-based, always sleeps).
//!
//! With feature `async`, the summary also times `ProcessBarrier::wait_async` (every
//! participant awaiting on a minimal executor) against the blocking `wait` in the same run.
//!
//! The measuring process is one participant; the others are helper processes (this bench
//! binary re-executed with a role) that wait in a loop until told to stop. One iteration is one
//! barrier generation. After Criterion's groups, a summary re-times each variant (p10/p50/p90
//! over batches) and prints the ratios, and one more measurement reports the CPU a waiter
//! burns while blocked for a second.
//!
//! Run: `cargo bench --bench barrier`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use cuda_ipc::ShmSafe;
use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::shm::{ShmOptions, ShmRegion};

const ROLE_ENV: &str = "CUDA_IPC_BENCH_ROLE";
const NAME_ENV: &str = "CUDA_IPC_BENCH_REGION";
const PARTIES: [u32; 3] = [2, 4, 8];

/// Everything the three barriers need, in one region.
#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    ours: BarrierState,
    /// simpleIPC's `barrier` and `sense`.
    spin_count: AtomicI32,
    spin_sense: AtomicI32,
    /// Storage for a `pthread_barrier_t` (32 bytes on x86-64 glibc; room to spare).
    pthread: [AtomicU64; 16],
    /// The wait (1-based count) after which helpers stop; 0 = keep going.
    stop_at: AtomicU64,
    ready: AtomicU32,
    /// CPU nanoseconds a blocked waiter used, and the wall time it was blocked.
    blocked_cpu_ns: AtomicU64,
    blocked_wall_ns: AtomicU64,
}
// SAFETY: repr(C); every field is ShmSafe (the pthread storage is atomics that only glibc's
// barrier code, through a raw pointer, reads and writes).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ours,
    /// `ProcessBarrier::wait_async` on a minimal executor (feature `async`).
    Awaited,
    Spin,
    Pthread,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ours => "process_barrier",
            Kind::Awaited => "process_barrier_async",
            Kind::Spin => "spin_simpleipc",
            Kind::Pthread => "pthread_barrier",
        }
    }
    fn parse(s: &str) -> Self {
        match s {
            "process_barrier" => Kind::Ours,
            "process_barrier_async" => Kind::Awaited,
            "spin_simpleipc" => Kind::Spin,
            _ => Kind::Pthread,
        }
    }
}

/// simpleIPC's `barrierWait`, transcribed (its `cpu_atomic_add32` returns the new value).
fn spin_wait(s: &Shared, n: i32) {
    let count = s.spin_count.fetch_add(1, Ordering::SeqCst) + 1;
    if count == n {
        s.spin_sense.store(1, Ordering::SeqCst);
    }
    while s.spin_sense.load(Ordering::SeqCst) == 0 {
        std::hint::spin_loop();
    }
    let count = s.spin_count.fetch_sub(1, Ordering::SeqCst) - 1;
    if count == 0 {
        s.spin_sense.store(0, Ordering::SeqCst);
    }
    while s.spin_sense.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
}

fn pthread_ptr(s: &Shared) -> *mut libc::pthread_barrier_t {
    const _: () = assert!(std::mem::size_of::<libc::pthread_barrier_t>() <= 16 * 8);
    s.pthread.as_ptr().cast_mut().cast()
}

fn pthread_init(s: &Shared, n: u32) {
    // SAFETY: the storage is large and aligned enough (asserted above, u64-aligned), lives in
    // the shared mapping for the whole run, and is initialised once before any helper starts.
    unsafe {
        let mut attr: libc::pthread_barrierattr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_barrierattr_init(&mut attr), 0);
        assert_eq!(
            libc::pthread_barrierattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED),
            0
        );
        assert_eq!(libc::pthread_barrier_init(pthread_ptr(s), &attr, n), 0);
        libc::pthread_barrierattr_destroy(&mut attr);
    }
}

fn pthread_wait(s: &Shared) {
    // SAFETY: initialised by pthread_init with PTHREAD_PROCESS_SHARED before helpers started.
    let rc = unsafe { libc::pthread_barrier_wait(pthread_ptr(s)) };
    assert!(
        rc == 0 || rc == libc::PTHREAD_BARRIER_SERIAL_THREAD,
        "pthread_barrier_wait: {rc}"
    );
}

/// One participant's wait for `kind`.
struct Participant<'a> {
    shared: &'a Shared,
    kind: Kind,
    n: u32,
    ours: Option<ProcessBarrier<'a>>,
    /// Waits done so far (every participant does the same number).
    waits: std::cell::Cell<u64>,
}

impl<'a> Participant<'a> {
    fn new(shared: &'a Shared, kind: Kind, n: u32) -> Self {
        let ours = matches!(kind, Kind::Ours | Kind::Awaited).then(|| {
            let mut b = ProcessBarrier::join(&shared.ours).expect("join");
            b.set_default_timeout(Duration::from_secs(600));
            b
        });
        Self {
            shared,
            kind,
            n,
            ours,
            waits: std::cell::Cell::new(0),
        }
    }

    fn wait(&self) {
        self.waits.set(self.waits.get() + 1);
        match self.kind {
            Kind::Ours => {
                self.ours.as_ref().map(|b| b.wait().expect("barrier wait"));
            }
            #[cfg(feature = "async")]
            Kind::Awaited => {
                self.ours
                    .as_ref()
                    .map(|b| block_on(b.wait_async()).expect("barrier wait_async"));
            }
            #[cfg(not(feature = "async"))]
            Kind::Awaited => unreachable!("timed only with feature async"),
            Kind::Spin => spin_wait(self.shared, self.n as i32),
            Kind::Pthread => pthread_wait(self.shared),
        }
    }
}

/// Run `f` to completion on this thread, parked between polls until its waker (the crate's
/// reactor, or the future itself while it spins) unparks it.
#[cfg(feature = "async")]
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// Helper process: wait in a loop until the wait the parent named in `stop_at`. (A plain stop
/// flag would race: a helper leaving a generation could see the flag the parent set after
/// leaving the same generation, and quit one generation early.)
fn helper(kind: Kind, n: u32) {
    let name = std::env::var(NAME_ENV).expect("region name");
    let region = ShmOptions::new(name).open::<Shared>().expect("helper open");
    let me = Participant::new(&region, kind, n);
    region.ready.fetch_add(1, Ordering::AcqRel);
    loop {
        me.wait();
        if region.stop_at.load(Ordering::Acquire) == me.waits.get() {
            break;
        }
    }
}

/// Helper that measures its own CPU time while blocked in one wait.
fn blocked_helper() {
    let name = std::env::var(NAME_ENV).expect("region name");
    let region = ShmOptions::new(name).open::<Shared>().expect("helper open");
    let barrier = ProcessBarrier::join(&region.ours).expect("join");
    region.ready.fetch_add(1, Ordering::AcqRel);
    let cpu0 = cpu_ns();
    let wall0 = Instant::now();
    barrier.wait().expect("blocked wait");
    let cpu = cpu_ns() - cpu0;
    region.blocked_cpu_ns.store(cpu, Ordering::Release);
    region
        .blocked_wall_ns
        .store(wall0.elapsed().as_nanos() as u64, Ordering::Release);
    barrier.wait().expect("report wait");
}

fn cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A region with `n - 1` helpers running `kind`; the caller is the n-th participant.
struct Group {
    region: ShmRegion<Shared>,
    helpers: Vec<Child>,
}

impl Group {
    fn start(kind: Kind, n: u32, role: &str) -> Self {
        let region = ShmOptions::new("cuda-ipc-bench-barrier")
            .random_suffix(true)
            .create_with(|s: &Shared| s.ours.init(n))
            .expect("create region");
        if kind == Kind::Pthread {
            pthread_init(&region, n);
        }
        let exe = std::env::current_exe().expect("current_exe");
        let helpers = (1..n)
            .map(|_| {
                Command::new(&exe)
                    .env(ROLE_ENV, format!("{role}:{}:{n}", kind.name()))
                    .env(NAME_ENV, region.name())
                    .spawn()
                    .expect("spawn helper")
            })
            .collect();
        let start = Instant::now();
        while region.ready.load(Ordering::Acquire) != n - 1 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "helpers did not start"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        Self { region, helpers }
    }

    /// Tell the helpers to stop after one more generation, and run it.
    fn stop(&self, me: &Participant<'_>) {
        self.region
            .stop_at
            .store(me.waits.get() + 1, Ordering::Release);
        me.wait();
    }

    /// Reap the stopped helpers.
    fn reap(mut self) {
        for h in &mut self.helpers {
            let status = h.wait().expect("reap helper");
            assert!(status.success(), "helper failed: {status}");
        }
        self.helpers.clear();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for h in &mut self.helpers {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

fn round_trip(c: &mut Criterion) {
    let mut group = c.benchmark_group("barrier_round_trip");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    for n in PARTIES {
        for kind in [Kind::Ours, Kind::Spin, Kind::Pthread] {
            let g = Group::start(kind, n, "loop");
            let me = Participant::new(&g.region, kind, n);
            group.bench_with_input(BenchmarkId::new(kind.name(), n), &n, |b, _| {
                b.iter(|| me.wait())
            });
            g.stop(&me);
            drop(me);
            g.reap();
        }
    }
    group.finish();
}

/// Per-round-trip times (ns) of `batches` batches of `per_batch` generations.
fn sample(kind: Kind, n: u32, batches: usize, per_batch: u32) -> Vec<f64> {
    let g = Group::start(kind, n, "loop");
    let me = Participant::new(&g.region, kind, n);
    for _ in 0..per_batch {
        me.wait(); // warm up
    }
    let mut out: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                me.wait();
            }
            t.elapsed().as_nanos() as f64 / f64::from(per_batch)
        })
        .collect();
    g.stop(&me);
    drop(me);
    g.reap();
    out.sort_by(f64::total_cmp);
    out
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A sample's p10 / p50 / p90 in whole nanoseconds, for the summary tables.
fn cell(v: &[f64]) -> String {
    format!(
        "{:.0} / {:.0} / {:.0}",
        pct(v, 0.1),
        pct(v, 0.5),
        pct(v, 0.9)
    )
}

fn summary() {
    println!();
    println!("summary: barrier round trip, ns per generation (p10 / p50 / p90 over 31 batches)");
    println!(
        "{:>3}  {:>26}  {:>26}  {:>26}  {:>9}  {:>11}",
        "N", "process_barrier", "spin_simpleipc", "pthread_barrier", "ours/spin", "pthread/ours"
    );
    for n in PARTIES {
        let per_batch = 4000 / n;
        let r: Vec<Vec<f64>> = [Kind::Ours, Kind::Spin, Kind::Pthread]
            .into_iter()
            .map(|k| sample(k, n, 31, per_batch))
            .collect();
        println!(
            "{n:>3}  {:>26}  {:>26}  {:>26}  {:>9.2}  {:>11.1}",
            cell(&r[0]),
            cell(&r[1]),
            cell(&r[2]),
            pct(&r[0], 0.5) / pct(&r[1], 0.5),
            pct(&r[2], 0.5) / pct(&r[0], 0.5),
        );
    }
    #[cfg(feature = "async")]
    {
        println!(
            "summary: awaited barrier round trip (every participant in wait_async), ns per generation (p10 / p50 / p90 over 31 batches)"
        );
        println!(
            "{:>3}  {:>26}  {:>26}  {:>13}",
            "N", "wait_async", "wait", "async/blocking"
        );
        for n in PARTIES {
            let per_batch = 4000 / n;
            // Alternating, so that drift lands on both.
            let (mut awaited, mut blocking) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                awaited.extend(sample(Kind::Awaited, n, 11, per_batch));
                blocking.extend(sample(Kind::Ours, n, 11, per_batch));
            }
            awaited.sort_by(f64::total_cmp);
            blocking.sort_by(f64::total_cmp);
            println!(
                "{n:>3}  {:>26}  {:>26}  {:>13.2}",
                cell(&awaited),
                cell(&blocking),
                pct(&awaited, 0.5) / pct(&blocking, 0.5)
            );
        }
    }
    // A waiter blocked for one second: how much CPU does it burn?
    let region = ShmOptions::new("cuda-ipc-bench-blocked")
        .random_suffix(true)
        .create_with(|s: &Shared| s.ours.init(2))
        .expect("create region");
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .env(ROLE_ENV, "blocked:process_barrier:2")
        .env(NAME_ENV, region.name())
        .spawn()
        .expect("spawn");
    while region.ready.load(Ordering::Acquire) != 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let me = ProcessBarrier::join(&region.ours).expect("join");
    std::thread::sleep(Duration::from_secs(1));
    me.wait().expect("release blocked waiter");
    me.wait().expect("report");
    let cpu = region.blocked_cpu_ns.load(Ordering::Acquire) as f64;
    let wall = region.blocked_wall_ns.load(Ordering::Acquire) as f64;
    assert!(child.wait().expect("reap").success());
    println!(
        "blocked waiter: {:.3} ms CPU over {:.3} s blocked = {:.3}% of a core",
        cpu / 1e6,
        wall / 1e9,
        100.0 * cpu / wall
    );
}

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        let mut parts = role.split(':');
        let what = parts.next().unwrap_or_default();
        let kind = Kind::parse(parts.next().unwrap_or_default());
        let n: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(2);
        match what {
            "blocked" => blocked_helper(),
            _ => helper(kind, n),
        }
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    round_trip(&mut c);
    c.final_summary();
    // `cargo test --benches` runs each bench once as a smoke test; the summary is for real runs.
    if std::env::args().any(|a| a == "--bench") {
        summary();
    }
}
