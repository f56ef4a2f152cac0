//! simpleIPC's ring ordered by counters the GPUs write and wait on themselves: one process per
//! GPU, one buffer and one [`IpcSignal`] per device, no host in the hand-offs.
//!
//! ```text
//! cargo run --release --example signal_ring -- [--size BYTES] [--devices N]
//! ```
//!
//! The flow is `examples/simple_ipc.rs`'s (read that first): the parent picks the devices,
//! starts one child per device, allocates a buffer and a signal on each and publishes their
//! handles; in step `i` child `id` writes `id + 1` into buffer `(i + id) % n`. Instead of waiting
//! for the buffer's event, the child's stream waits (`GpuSignal::wait`, `cuStreamWaitValue64`)
//! for the buffer's counter to reach `i` — the number of writes the buffer has had — and
//! signals `i + 1` after its kernel (`GpuSignal::signal`, `cuStreamWriteValue64`, after a fence
//! for the kernel's writes). A stream can so enqueue a wait for a write that has not been
//! enqueued yet, which an event cannot express. At the end each child waits on the host
//! (`wait_host`, with a deadline that notices a dead peer) for its own buffer's counter to
//! reach `n`, and verifies the buffer holds `(id + 1) % n + 1` (never the 0 of fresh memory).
//!
//! Needs 64-bit stream memory operations on every device
//! ([`can_use_stream_mem_ops`](cuda_ipc::device::can_use_stream_mem_ops)); waived otherwise. What
//! happens when a child fails or is killed at any step is `tests/simple_ipc_faults.rs`.
//!
//! Exit status: 0 on success, 2 ("waived"), 1 on any failure.

use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::device::PeerGroup;
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{
    GpuContext, ImportedBuffer, ImportedSignal, IpcBuffer, IpcMemHandle, IpcSignal,
    IpcSignalHandle, ShmSafe,
};
#[path = "common/cuda.rs"]
mod cuda;
use cuda::{BlockSize, Module, Stream, StreamFlags, launch};

const MAX_DEVICES: usize = 8;
const THREADS: u32 = 128;
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

/// The shared region: simpleIPC's `shmStruct` with a signal in place of each event.
#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    /// The children and the parent, twice: the handles are published; every child has
    /// verified its buffer.
    start: BarrierState,
    /// The children, at every step.
    barrier: BarrierState,
    nprocesses: AtomicU32,
    size: AtomicU64,
    devices: ShmCell<[u32; MAX_DEVICES]>,
    mem: [ShmCell<IpcMemHandle<u8>>; MAX_DEVICES],
    signals: [ShmCell<IpcSignalHandle>; MAX_DEVICES],
}

type Failure = Box<dyn std::error::Error>;

/// Called by each child at the start of each step with its id and the step (see
/// `examples/simple_ipc.rs`).
pub type StepHook = fn(usize, usize);

struct Options {
    size: usize,
    max_devices: usize,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        size: 64 << 20,
        max_devices: MAX_DEVICES,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--size" => opts.size = value("--size")?,
            "--devices" => opts.max_devices = value("--devices")?.min(MAX_DEVICES),
            other => return Err(format!("unknown option {other:?} (try --help)")),
        }
    }
    if opts.size == 0 || opts.size > i32::MAX as usize || opts.max_devices == 0 {
        return Err("--size must be 1..=2^31-1 bytes and --devices at least 1".into());
    }
    Ok(opts)
}

fn epoch_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn child(region_name: &str, id: usize, at_step: StepHook) -> Result<(), Failure> {
    let started = epoch_ns();
    let shared = ShmOptions::new(region_name).open::<Shared>()?;
    let n = shared.nprocesses.load(Ordering::Acquire) as usize;
    if n == 0 || n > MAX_DEVICES || id >= n {
        return Err(format!("bad process count {n} for child {id}").into());
    }
    let size = usize::try_from(shared.size.load(Ordering::Acquire))?;
    let host = std::thread::spawn(move || vec![0xFFu8; size]);
    let start = ProcessBarrier::join(&shared.start)?;
    let barrier = ProcessBarrier::join(&shared.barrier)?;
    let device = shared.devices.load()[id];
    println!("Process {id}: Starting on device {device}...");
    let ctx = GpuContext::new(device)?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let module = Module::from_ptx(KERNELS, &[])?;
    let kernel = module.get_function("simple_kernel")?;
    let per_sm = kernel.max_active_blocks_per_multiprocessor(BlockSize::x(THREADS), 0)?;
    let blocks = per_sm * cuda_ipc::device::device_info(device)?.multiprocessors;
    start.wait()?; // the parent has published every handle
    let mut host = host.join().map_err(|_| "the allocating thread panicked")?;
    let buffers = (0..n)
        .map(|i| ImportedBuffer::open(&ctx, &shared.mem[i].load()))
        .collect::<Result<Vec<_>, _>>()?;
    let signals = (0..n)
        .map(|i| ImportedSignal::open(&ctx, &shared.signals[i].load()))
        .collect::<Result<Vec<_>, _>>()?;
    barrier.wait()?; // everyone has opened everything

    // From the first enqueued wait until the stream is synchronised, GPU work of this process
    // is queued on the buffers and counters: they must not be unmapped before it ends (which
    // is why `wait` and `signal` are unsafe), and a wait for a dead peer's write never ends.
    // So a failure in this phase exits the process without dropping them: the driver tears
    // the context down with the process.
    let mut gpu_phase = || -> Result<(), Failure> {
        for i in 0..n {
            at_step(id, i);
            let target = (i + id) % n;
            let buf = &buffers[target];
            // SAFETY: the stream is synchronised before the signals drop (or the process exits
            // without dropping them, see above). Buffer `target` has had `i` writes.
            unsafe { signals[target].wait(&stream, i as u64)? };
            let (ptr, len) = (buf.as_raw_ptr(), buf.len() as i32);
            let val = id as u32 + 1; // as simple_ipc: never the 0 of fresh memory
            // SAFETY: simple_kernel(char*, int, unsigned) writes bytes [0, len) of the mapped
            // buffer, which stays mapped until the stream is synchronised below.
            unsafe { launch!(kernel<<<blocks, THREADS, 0, stream>>>(ptr, len, val)) }?;
            // SAFETY: as for the wait above.
            unsafe { signals[target].signal(&stream, i as u64 + 1)? };
            barrier.wait()?;
            if id == 0 {
                println!("Step {i} done");
            }
        }
        // Every write of this child's buffer is done (bounded: a dead peer is an error).
        signals[id].wait_host(n as u64, Duration::from_secs(60))?;
        println!("Process {id}: verifying...");
        if buffers[id].len() != host.len() {
            return Err(
                format!("buffer {id} holds {} bytes, not {size}", buffers[id].len()).into(),
            );
        }
        buffers[id].copy_to_host(&mut host)?;
        let expect = ((id + 1) % n + 1) as u8;
        if let Some(pos) = host.iter().position(|&b| b != expect) {
            return Err(format!(
                "Process {id}: verification failed at byte {pos}: {} != {expect}",
                host[pos]
            )
            .into());
        }
        stream.synchronize()?;
        Ok(())
    };
    if let Err(e) = gpu_phase() {
        eprintln!("Process {id}: error: {}", chain(e.as_ref()));
        std::process::exit(1);
    }
    barrier.wait()?; // no buffer is unmapped while another child may still read it
    start.wait()?; // every child verified: the parent frees while we exit
    println!(
        "Process {id} complete! ({:.0} ms)",
        epoch_ns().saturating_sub(started) as f64 / 1e6
    );
    Ok(())
}

/// What the parent allocates for one device; kept alive until the children are done.
struct Published {
    _buffer: IpcBuffer<u8>,
    _signal: IpcSignal,
    _context: GpuContext,
}

/// Ok(None): waived, with the reason printed.
fn parent(opts: &Options) -> Result<Option<(usize, usize)>, Failure> {
    let group = match PeerGroup::select(opts.max_devices) {
        Err(cuda_ipc::Error::NoDevice { name, code }) => {
            eprintln!("signal_ring: waived: no CUDA device (cuInit: {name}, {code})");
            return Ok(None);
        }
        Err(cuda_ipc::Error::DriverNotFound { tried, .. }) => {
            eprintln!("signal_ring: waived: no CUDA driver library (tried {tried})");
            return Ok(None);
        }
        other => other?,
    };
    print!("{}", group.report());
    if group.devices.is_empty() {
        eprintln!(
            "signal_ring: waived: no device supports IPC (unified addressing, default compute mode)"
        );
        return Ok(None);
    }
    if let Some(d) = group.devices.iter().find(|d| !d.stream_mem_ops) {
        eprintln!(
            "signal_ring: waived: device {} cannot use 64-bit stream memory operations",
            d.ordinal
        );
        return Ok(None);
    }
    let n = group.devices.len();
    let region = ShmOptions::new("signal_ring")
        .random_suffix(true)
        .create_with(|s: &Shared| {
            s.start.init(n as u32 + 1)?;
            s.barrier.init(n as u32)?;
            s.nprocesses.store(n as u32, Ordering::Release);
            s.size.store(opts.size as u64, Ordering::Release);
            let mut devices = [u32::MAX; MAX_DEVICES];
            for (slot, d) in devices.iter_mut().zip(&group.devices) {
                *slot = d.ordinal;
            }
            s.devices.store(devices);
            Ok(())
        })?;
    let start = ProcessBarrier::join(&region.start)?;

    // The children first: their contexts come up while this process sets up its own.
    let exe = std::env::current_exe()?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for id in 0..n {
        match Command::new(&exe)
            .args(["--child", region.name(), &id.to_string()])
            .spawn()
        {
            Ok(c) => children.push((id, c)),
            Err(e) => {
                region.start.poison();
                wait_children(children, &region);
                return Err(e.into());
            }
        }
    }
    let published = publish(&group, &region, opts);
    let started = match &published {
        // Twice at the start barrier: the handles are published; every child has verified.
        Ok(_) => start
            .wait()
            .and_then(|_| start.wait_timeout(Duration::from_secs(600)).map(drop)),
        Err(_) => {
            region.start.poison();
            Ok(())
        }
    };
    drop(start);
    if started.is_err() {
        region.barrier.poison();
    }
    // Free while the children exit (a buffer a child still maps is freed once it unmaps).
    let freed = published.map(drop);
    let failed = wait_children(children, &region);
    freed?;
    if !failed.is_empty() {
        return Err(format!("failed: {}", failed.join(", ")).into());
    }
    started?;
    Ok(Some((n, n * opts.size)))
}

/// Peer access, then one buffer and one signal per device, their handles in the region.
fn publish(group: &PeerGroup, region: &Shared, opts: &Options) -> Result<Vec<Published>, Failure> {
    let contexts = group.enable_peer_access()?;
    let mut published = Vec::new();
    for (i, context) in contexts.into_iter().enumerate() {
        let buffer = IpcBuffer::<u8>::new(&context, opts.size)?;
        region.mem[i].store(buffer.handle()?);
        let signal = IpcSignal::new(&context)?; // its counter starts at 0
        region.signals[i].store(signal.handle()?);
        published.push(Published {
            _buffer: buffer,
            _signal: signal,
            _context: context,
        });
    }
    Ok(published)
}

/// Wait for every child; a failed child poisons both barriers so the others stop at their
/// next wait instead of waiting for a peer that will never come. Returns the failures.
fn wait_children(children: Vec<(usize, Child)>, region: &Shared) -> Vec<String> {
    // One thread blocked in waitpid per child: each exit is seen the moment it happens.
    let (tx, rx) = std::sync::mpsc::channel();
    let total = children.len();
    for (id, mut c) in children {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let pid = c.id();
            let _ = tx.send((id, pid, c.wait()));
        });
    }
    drop(tx);
    let mut failed = Vec::new();
    for (id, pid, status) in rx.iter().take(total) {
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => {
                region.barrier.poison();
                region.start.poison();
                failed.push(format!("child {id} (pid {pid}) {status}"));
            }
            Err(e) => failed.push(format!("child {id} (pid {pid}): {e}")),
        }
    }
    failed
}

fn main() -> ExitCode {
    run(std::env::args().skip(1).collect(), |_, _| {})
}

/// The whole program: the parent, or with `--child REGION ID` one child, calling `at_step` at
/// the start of each of its steps.
pub fn run(args: Vec<String>, at_step: StepHook) -> ExitCode {
    let start = Instant::now();
    if args.first().map(String::as_str) == Some("--child") {
        let (Some(name), Some(id)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
            eprintln!("usage: signal_ring --child REGION ID");
            return ExitCode::from(1);
        };
        return match child(name, id, at_step) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("Process {id}: error: {}", chain(e.as_ref()));
                ExitCode::from(1)
            }
        };
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "signal_ring: simpleIPC's ring ordered by IpcSignal counters on the GPUs\n\n\
             usage: signal_ring [--size BYTES] [--devices N]\n\
             exit status: 0 success, 2 waived, 1 failure"
        );
        return ExitCode::SUCCESS;
    }
    let opts = match parse_options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("signal_ring: {e}");
            return ExitCode::from(1);
        }
    };
    match parent(&opts) {
        Ok(Some((devices, bytes))) => {
            println!(
                "signal_ring: {devices} device(s), {bytes} bytes verified, {:.3} s",
                start.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::from(2),
        Err(e) => {
            eprintln!("signal_ring: error: {}", chain(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

/// "outer: inner: innermost" for an error and its sources.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}
