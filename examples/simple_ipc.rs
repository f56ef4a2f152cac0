//! NVIDIA's simpleIPC sample on cuda-ipc's public API: one process per GPU, peer access, lazy
//! peer mapping, interprocess events and a barrier in shared memory.
//!
//! ```text
//! cargo run --release --example simple_ipc -- [--size BYTES] [--devices N] [--handles legacy|fd|pool]
//! ```
//!
//! The parent picks every device that supports unified addressing, is in the default compute
//! mode and reaches every device already picked, and re-executes itself once per device. While
//! the children bring up their CUDA contexts (a few hundred milliseconds each), the parent
//! allocates one buffer and one interprocess event per device and publishes their handles in a
//! shared region; parent and children then meet at a start barrier, and the children open the
//! handles. (NVIDIA's sample allocates first and then starts its children, so their context
//! creation follows the parent's set-up instead of overlapping it.) In step `i` child `id` waits
//! for the event of buffer `(i + id) % n`, writes `id + 1` into every byte of it, records the
//! event, and meets the others at the barrier. At the end every buffer `id` must hold
//! `(id + 1) % n + 1`, which each child verifies byte by byte. (NVIDIA's sample writes `id`;
//! the `+ 1` keeps every expected byte apart from the zeros fresh memory usually holds, so a
//! run on one GPU — one child, one value — still shows that the kernels ran.)
//! Every process keeps its contexts until it exits ([`GpuContext::retain_until_exit`]), as
//! NVIDIA's runtime does.
//!
//! `--handles fd` allocates the buffers as virtual-memory allocations shared as POSIX file
//! descriptors ([`HandleType::PosixFd`]) instead of legacy IPC handles: after the start barrier
//! each child connects to the parent's Unix socket ([`FdListener`]) and receives every buffer
//! with its descriptor ([`FdSocket::recv_buffer`]); a process that only read the shared region
//! could not map them. `--handles pool` allocates each buffer from a stream-ordered pool on its
//! device ([`HandleType::Pool`], `cuMemAllocFromPoolAsync`), and the same two calls send and
//! open it: the pool's descriptor and the buffer's export data travel together, and a child
//! imports the pool and then the buffer (`cuMemPoolImportPointer`). Only the handle type
//! differs between the three ways.
//!
//! The same ring ordered by counters that the GPUs write and wait on themselves is
//! `examples/signal_ring.rs`. What happens when a child fails or is killed at any step is
//! `tests/simple_ipc_faults.rs`, which builds this file with a hook at each step.
//!
//! Exit status: 0 on success, 2 ("waived") when no device can do IPC, 1 on any failure.

use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
use cuda_ipc::device::PeerGroup;
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{
    Error, GpuContext, GpuSlice, HandleType, ImportedBuffer, ImportedEvent, IpcBuffer, IpcEvent,
    IpcEventHandle, IpcMemHandle, ShmSafe,
};
#[path = "common/cuda.rs"]
mod cuda;
use cuda::{BlockSize, Module, Stream, StreamFlags, launch};

const MAX_DEVICES: usize = 8;
const THREADS: u32 = 128;
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

/// simpleIPC's `shmStruct`.
#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    /// The children and the parent, twice: the handles below are published; every child has
    /// verified its buffer (the parent may then free while the children exit).
    start: BarrierState,
    /// The children, at every step.
    barrier: BarrierState,
    nprocesses: AtomicU32,
    /// Bytes per buffer.
    size: AtomicU64,
    devices: ShmCell<[u32; MAX_DEVICES]>,
    mem: [ShmCell<IpcMemHandle<u8>>; MAX_DEVICES],
    events: [ShmCell<IpcEventHandle>; MAX_DEVICES],
    /// How the buffers are shared: [`Handles`] as a number. For `fd` and `pool` they come over
    /// the parent's socket, not from `mem`.
    handles: AtomicU32,
}

type Failure = Box<dyn std::error::Error>;

struct Options {
    size: usize,
    max_devices: usize,
    timings: bool,
    handles: Handles,
}

/// `--handles`: how the parent shares its buffers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Handles {
    /// Legacy IPC handles in the shared region (simpleIPC's way).
    Legacy = 0,
    /// POSIX-fd buffers ([`HandleType::PosixFd`]) over a Unix socket.
    Fd = 1,
    /// Buffers of a stream-ordered pool per device ([`HandleType::Pool`]), over a Unix socket.
    Pool = 2,
}

impl std::fmt::Display for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Legacy => "legacy",
            Self::Fd => "fd",
            Self::Pool => "pool",
        })
    }
}

/// The parent's socket for `--handles fd|pool`, named after the region.
fn socket_name(region: &str) -> SocketName {
    SocketName::Abstract(format!("{region}.fd"))
}

const SOCKET_TIMEOUT: Duration = Duration::from_secs(60);

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        size: 64 << 20,
        max_devices: MAX_DEVICES,
        timings: false,
        handles: Handles::Legacy,
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
            "--timings" => opts.timings = true,
            "--handles" => match it.next().map(String::as_str) {
                Some("legacy") => opts.handles = Handles::Legacy,
                Some("fd") => opts.handles = Handles::Fd,
                Some("pool") => opts.handles = Handles::Pool,
                _ => return Err("--handles takes legacy, fd or pool".into()),
            },
            other => return Err(format!("unknown option {other:?} (try --help)")),
        }
    }
    if opts.size == 0 || opts.size > i32::MAX as usize || opts.max_devices == 0 {
        return Err("--size must be 1..=2^31-1 bytes and --devices at least 1".into());
    }
    Ok(opts)
}

/// Where the time goes, printed with `--timings`: milliseconds since the parent started (the
/// parent passes its start time to the children in `SIMPLE_IPC_TIMINGS`).
struct Phases {
    origin_ns: u128,
    marks: Vec<(&'static str, f64)>,
}

fn epoch_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

impl Phases {
    fn new(origin_ns: u128) -> Self {
        Self {
            origin_ns,
            marks: Vec::new(),
        }
    }

    fn mark(&mut self, what: &'static str) {
        let ms = epoch_ns().saturating_sub(self.origin_ns) as f64 / 1e6;
        self.marks.push((what, ms));
    }

    fn line(&self) -> String {
        let marks: Vec<String> = self
            .marks
            .iter()
            .map(|(what, ms)| format!("{what} {ms:.0}"))
            .collect();
        marks.join(", ")
    }
}

/// Called by each child at the start of each step with its id and the step. `main` passes a
/// no-op; `tests/simple_ipc_faults.rs` builds this file with a hook that makes a child fail or
/// die there.
pub type StepHook = fn(usize, usize);

fn child(region_name: &str, id: usize, at_step: StepHook) -> Result<(), Failure> {
    let origin = std::env::var("SIMPLE_IPC_TIMINGS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(epoch_ns);
    let mut phases = Phases::new(origin);
    let shared = ShmOptions::new(region_name).open::<Shared>()?;
    let n = shared.nprocesses.load(Ordering::Acquire) as usize;
    if n == 0 || n > MAX_DEVICES || id >= n {
        return Err(format!("bad process count {n} for child {id}").into());
    }
    let size = usize::try_from(shared.size.load(Ordering::Acquire))?;
    // The verification buffer, allocated and touched on another thread while this one brings
    // up the context (page faults on 64 MiB would otherwise slow the copy down). Page-locked
    // memory would copy faster, but pinning 64 MiB holds up the driver calls of the main
    // thread (on one GPU, where the children come up last, the open waited 40 ms for it).
    let host = std::thread::spawn(move || vec![0xFFu8; size]);
    let start = ProcessBarrier::join(&shared.start)?;
    let barrier = ProcessBarrier::join(&shared.barrier)?;
    let device = shared.devices.load()[id];
    println!("Process {id}: Starting on device {device}...");
    let ctx = GpuContext::new(device)?;
    // As NVIDIA's runtime does: the context lives until the process exits, when the driver
    // reclaims it faster than an explicit release would.
    ctx.retain_until_exit()?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    phases.mark("context");
    let module = Module::from_ptx(KERNELS, &[])?;
    let kernel = module.get_function("simple_kernel")?;
    let per_sm = kernel.max_active_blocks_per_multiprocessor(BlockSize::x(THREADS), 0)?;
    let blocks = per_sm * cuda_ipc::device::device_info(device)?.multiprocessors;
    phases.mark("module");
    start.wait()?; // the parent has published every handle
    phases.mark("start");
    let mut host = host.join().map_err(|_| "the allocating thread panicked")?;

    // Every kind of buffer is a `GpuSlice` to the code below.
    type Buffer = Box<dyn std::ops::Deref<Target = GpuSlice<u8>>>;
    let handles = shared.handles.load(Ordering::Acquire);
    let socket = || {
        FdSocket::connect(
            &socket_name(region_name),
            &PeerPolicy::SameUid,
            SOCKET_TIMEOUT,
        )
    };
    let buffers: Vec<Buffer> = if handles != Handles::Legacy as u32 {
        let socket = socket()?;
        (0..n)
            .map(|_| Ok(Box::new(socket.recv_buffer::<u8>(&ctx, SOCKET_TIMEOUT)?) as Buffer))
            .collect::<Result<_, Error>>()?
    } else {
        (0..n)
            .map(|i| Ok(Box::new(ImportedBuffer::open(&ctx, &shared.mem[i].load())?) as Buffer))
            .collect::<Result<_, Error>>()?
    };
    let events = (0..n)
        .map(|i| ImportedEvent::open(&ctx, &shared.events[i].load()))
        .collect::<Result<Vec<_>, _>>()?;
    phases.mark("open");
    barrier.wait()?; // everyone has opened everything
    phases.mark("barrier");

    // From the first kernel until the stream is synchronised, GPU work of this process may be
    // queued on the buffers: they must not be unmapped before it ends. So a failure in this
    // phase exits the process without dropping them: the driver tears the context down with
    // the process.
    let mut gpu_phase = || -> Result<(), Failure> {
        for i in 0..n {
            at_step(id, i);
            let target = (i + id) % n;
            let buf = &buffers[target];
            // Buffer `target` was last written in step i - 1; its event was recorded after.
            events[target].wait_on(&stream)?;
            let (ptr, len) = (buf.as_raw_ptr(), buf.len() as i32);
            let val = id as u32 + 1; // see the module docs: never the 0 of fresh memory
            // SAFETY: simple_kernel(char*, int, unsigned) writes bytes [0, len) of the mapped
            // buffer, which stays mapped until the stream is synchronised below.
            unsafe { launch!(kernel<<<blocks, THREADS, 0, stream>>>(ptr, len, val)) }?;
            events[target].record(&stream)?;
            barrier.wait()?;
            if id == 0 {
                println!("Step {i} done");
            }
        }

        // The last write of this child's buffer is complete (bounded: a dead peer is an error).
        events[id].synchronize(Duration::from_secs(60))?;
        phases.mark("steps");
        println!("Process {id}: verifying...");
        if buffers[id].len() != host.len() {
            return Err(
                format!("buffer {id} holds {} bytes, not {size}", buffers[id].len()).into(),
            );
        }
        buffers[id].copy_to_host(&mut host)?;
        let expect = ((id + 1) % n + 1) as u8;
        if let Some(pos) = first_difference(&host, expect) {
            return Err(format!(
                "Process {id}: verification failed at byte {pos}: {} != {expect}",
                host[pos]
            )
            .into());
        }
        stream.synchronize()?;
        phases.mark("verify");
        Ok(())
    };
    if let Err(e) = gpu_phase() {
        eprintln!("Process {id}: error: {}", chain(e.as_ref()));
        std::process::exit(1);
    }
    barrier.wait()?; // no buffer is unmapped while another child may still read it
    start.wait()?; // every child verified: the parent frees while we exit
    println!("Process {id} complete!");
    if std::env::var_os("SIMPLE_IPC_TIMINGS").is_some() {
        println!(
            "Process {id} timings (ms since the parent started): {}",
            phases.line()
        );
    }
    Ok(())
}

/// The index of the first byte of `bytes` that is not `value`. Compares 4 KiB at a time
/// against a block of `value` (a `memcmp`, vectorised), then looks inside the block that
/// differs.
fn first_difference(bytes: &[u8], value: u8) -> Option<usize> {
    const BLOCK: usize = 4096;
    let want = [value; BLOCK];
    bytes.chunks(BLOCK).enumerate().find_map(|(i, chunk)| {
        (chunk != &want[..chunk.len()])
            .then(|| i * BLOCK + chunk.iter().position(|&b| b != value).unwrap_or(0))
    })
}

/// Ok(None): waived, with the reason printed.
fn parent(opts: &Options, origin_ns: u128) -> Result<Option<(usize, usize)>, Failure> {
    let mut phases = Phases::new(origin_ns);
    println!("Checking for multiple GPUs...");
    let group = match PeerGroup::select(opts.max_devices) {
        Err(Error::NoDevice { name, code }) => {
            eprintln!("simple_ipc: waived: no CUDA device (cuInit: {name}, {code})");
            return Ok(None);
        }
        Err(Error::DriverNotFound { tried, .. }) => {
            eprintln!("simple_ipc: waived: no CUDA driver library (tried {tried})");
            return Ok(None);
        }
        other => other?,
    };
    print!("{}", group.report());
    if group.devices.is_empty() {
        eprintln!(
            "simple_ipc: waived: no device supports IPC (unified addressing, default compute mode)"
        );
        return Ok(None);
    }
    let n = group.devices.len();
    phases.mark("select");
    let region = ShmOptions::new("simple_ipc")
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
            s.handles.store(opts.handles as u32, Ordering::Release);
            Ok(())
        })?;
    let start = ProcessBarrier::join(&region.start)?;
    let listener = (opts.handles != Handles::Legacy)
        .then(|| FdListener::bind(socket_name(region.name()), PeerPolicy::SameUid))
        .transpose()?;

    // The children first: their contexts come up while this process sets up its own.
    println!("Spawning processes and assigning GPUs...");
    let exe = std::env::current_exe()?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for id in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(["--child", region.name(), &id.to_string()]);
        if opts.timings {
            cmd.env("SIMPLE_IPC_TIMINGS", origin_ns.to_string());
        }
        match cmd.spawn() {
            Ok(c) => children.push((id, c)),
            Err(e) => {
                region.start.poison();
                wait_children(children, &region);
                return Err(e.into());
            }
        }
    }

    phases.mark("spawned");
    let published = publish(&group, &region, opts);
    phases.mark("set-up");
    // Twice at the start barrier: the handles are published; every child has verified.
    let started = match &published {
        Ok(published) => start.wait().map_err(Failure::from).and_then(|_| {
            phases.mark("start");
            if let Some(listener) = &listener {
                send_buffers(listener, published)?;
                phases.mark("sent");
            }
            Ok(start.wait_timeout(Duration::from_secs(600)).map(drop)?)
        }),
        Err(_) => {
            // Stop the children at the start barrier instead of letting them wait for us.
            region.start.poison();
            Ok(())
        }
    };
    drop(start);
    if started.is_err() {
        region.barrier.poison();
    }
    phases.mark("verified");
    // Free while the children exit: a buffer a child still maps is freed once it unmaps (or
    // at our exit, with the context), without waiting here.
    let freed = published.map(drop);
    phases.mark("freed");
    let failed = wait_children(children, &region);
    phases.mark("children");
    // A set-up failure first: the children then failing at the start barrier is its result.
    freed?;
    if !failed.is_empty() {
        return Err(format!("failed: {}", failed.join(", ")).into());
    }
    started?;
    if opts.timings {
        println!("Parent timings (ms since it started): {}", phases.line());
    }
    Ok(Some((n, n * opts.size)))
}

/// `--handles fd|pool`: accept every child's connection and send it every buffer, with its
/// descriptor (a pool buffer: its pool's).
fn send_buffers(listener: &FdListener, published: &[Published]) -> Result<(), Failure> {
    for _ in 0..published.len() {
        let socket = listener.accept(SOCKET_TIMEOUT)?;
        for p in published {
            socket.send_buffer(&p.buffer, SOCKET_TIMEOUT)?;
        }
    }
    Ok(())
}

/// What the parent allocates and exports for one device; kept alive until the children are
/// done with it.
struct Published {
    buffer: IpcBuffer<u8>,
    _event: IpcEvent,
    _context: GpuContext,
}

/// Peer access, then one buffer and one event per device, their handles stored in the region
/// (or, for `--handles fd|pool`, the buffers sent later over the socket).
fn publish(group: &PeerGroup, region: &Shared, opts: &Options) -> Result<Vec<Published>, Failure> {
    let contexts = group.enable_peer_access()?;
    println!("Peer access enabled among {} device(s)", contexts.len());
    for context in &contexts {
        // Until the process exits, as in the children: whether the buffers are freed at once
        // or deferred until the children unmap, no context is released one by one.
        context.retain_until_exit()?;
    }
    let mut published = Vec::new();
    for (i, context) in contexts.into_iter().enumerate() {
        let buffer = match opts.handles {
            Handles::Pool => IpcBuffer::<u8>::new_with(&context, opts.size, HandleType::Pool)?,
            Handles::Fd => IpcBuffer::<u8>::new_with(&context, opts.size, HandleType::PosixFd)?,
            Handles::Legacy => {
                let buffer = IpcBuffer::<u8>::new(&context, opts.size)?;
                region.mem[i].store(buffer.handle()?);
                buffer
            }
        };
        let event = IpcEvent::new(&context)?;
        region.events[i].store(event.handle()?);
        published.push(Published {
            buffer,
            _event: event,
            _context: context,
        });
    }
    Ok(published)
}

/// Wait for every child; a failed child poisons both barriers (start and step) so the others
/// stop at their next wait instead of waiting for a peer that will never come. Returns the
/// failures.
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

/// The whole program: the parent, or with `--child REGION ID` one child (the parent runs this
/// executable again for each), calling `at_step` at the start of each of its steps.
pub fn run(args: Vec<String>, at_step: StepHook) -> ExitCode {
    let start = Instant::now();
    let origin_ns = epoch_ns();
    if args.first().map(String::as_str) == Some("--child") {
        let (Some(name), Some(id)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
            eprintln!("usage: simple_ipc --child REGION ID");
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
            "simple_ipc: NVIDIA's simpleIPC sample on cuda-ipc\n\n\
             usage: simple_ipc [--size BYTES] [--devices N] [--handles legacy|fd|pool] [--timings]\n\
             \x20 --size BYTES   bytes per device buffer (default 67108864 = 64 MiB)\n\
             \x20 --devices N    use at most N devices (default and maximum {MAX_DEVICES})\n\
             \x20 --handles legacy  share the buffers as legacy IPC handles (default)\n\
             \x20 --handles fd   share them as POSIX file descriptors over a Unix socket\n\
             \x20 --handles pool allocate them from stream-ordered pools, sent over a socket\n\
             \x20 --timings      print where each child's time goes\n\n\
             exit status: 0 success, 2 waived (no device can do IPC), 1 failure"
        );
        return ExitCode::SUCCESS;
    }
    let opts = match parse_options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("simple_ipc: {e}");
            return ExitCode::from(1);
        }
    };
    match parent(&opts, origin_ns) {
        Ok(Some((devices, bytes))) => {
            println!(
                "simple_ipc: {devices} device(s), {} handles, {bytes} bytes verified, {:.3} s",
                opts.handles,
                start.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::from(2),
        Err(e) => {
            eprintln!("simple_ipc: error: {}", chain(e.as_ref()));
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

#[cfg(test)]
mod tests {
    /// `launch!` (examples/common/cuda.rs) hands the kernel each argument's address, in
    /// order, with its own type and value, evaluating each argument once.
    #[test]
    fn launch_passes_each_argument_by_address_in_order() {
        use super::cuda::launch;
        struct Kernel;
        impl Kernel {
            unsafe fn launch(
                &self,
                grid: u32,
                block: u32,
                shared: u32,
                _stream: &(),
                args: &mut [*mut std::ffi::c_void],
            ) -> Result<(u32, u32, u32, u64, u32, i8), ()> {
                assert_eq!(args.len(), 3);
                // SAFETY: the macro passed the addresses of a u64, a u32 and an i8, alive
                // for the call.
                unsafe {
                    let (a, b, c) = (
                        args[0].cast::<u64>(),
                        args[1].cast::<u32>(),
                        args[2].cast::<i8>(),
                    );
                    Ok((grid, block, shared, *a, *b, *c))
                }
            }
        }
        let (kernel, stream) = (Kernel, ());
        let mut evaluated = 0;
        let mut next = || {
            evaluated += 1;
            evaluated
        };
        // SAFETY: the fake kernel only reads its arguments.
        let seen =
            unsafe { launch!(kernel<<<7, 128, 16, stream>>>(u64::MAX - 1, next() as u32, -3i8)) };
        assert_eq!(seen, Ok((7, 128, 16, u64::MAX - 1, 1, -3)));
        assert_eq!(next(), 2, "each argument evaluated once");
        // SAFETY: as above (no arguments: an empty array).
        let none = unsafe {
            struct Empty;
            impl Empty {
                unsafe fn launch(
                    &self,
                    _: u32,
                    _: u32,
                    _: u32,
                    _: &(),
                    args: &mut [*mut std::ffi::c_void],
                ) -> usize {
                    args.len()
                }
            }
            let empty = Empty;
            launch!(empty<<<1, 1, 0, stream>>>())
        };
        assert_eq!(none, 0);
    }

    #[test]
    fn first_difference_finds_the_first_differing_byte_anywhere() {
        use super::first_difference;
        let n = 3 * 4096 + 17; // a short last block
        let mut bytes = vec![5u8; n];
        assert_eq!(first_difference(&bytes, 5), None);
        assert_eq!(first_difference(&[], 5), None);
        for at in [0, 1, 4095, 4096, 8191, 3 * 4096, n - 1] {
            bytes[at] = 6;
            assert_eq!(first_difference(&bytes, 5), Some(at), "at {at}");
            bytes[n - 1] = 6; // a later difference does not hide the first
            assert_eq!(first_difference(&bytes, 5), Some(at), "at {at}");
            bytes[at] = 5;
            bytes[n - 1] = 5;
        }
    }
}
