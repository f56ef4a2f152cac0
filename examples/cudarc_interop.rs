//! Two processes that use cudarc for their contexts, streams and kernels, and cuda-ipc to share
//! GPU memory and order their work — no host synchronisation between the two kernels.
//!
//! The producer (GPU 0) fills a buffer with a cudarc kernel launch and signals on its cudarc
//! stream; the consumer (GPU 1 if there are two, else GPU 0) waits for the signal on its own
//! cudarc stream, checks the bytes, overwrites them with another kernel and signals back; the
//! producer checks the consumer's bytes.
//!
//! ```text
//! cargo run --example cudarc_interop --features cudarc
//! ```
//!
//! Exit status: 0 success, 2 waived (no GPU or no driver), 1 failure.

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{
    Error, GpuContext, GpuSlice, ImportedBuffer, ImportedSignal, IpcBuffer, IpcMemHandle,
    IpcSignal, IpcSignalHandle, ShmSafe,
};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");
const LEN: usize = 16 << 20;
const FILL: u8 = 0x2a;
const REPLY: u8 = 0x55;

type Failure = Box<dyn std::error::Error>;

/// What the producer publishes for the consumer.
#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    data: ShmCell<IpcMemHandle<u8>>,
    ready: ShmCell<IpcSignalHandle>,
    ack: ShmCell<IpcSignalHandle>,
    published: AtomicU32,
}

/// A cudarc context, a stream of it, and `simple_kernel` loaded there.
fn cudarc_side(ordinal: usize) -> Result<(GpuContext, Arc<CudaStream>, CudaFunction), Failure> {
    let cctx = CudaContext::new(ordinal)?;
    let stream = cctx.new_stream()?;
    let kernel = cctx
        .load_module(Ptx::from_src(KERNELS))?
        .load_function("simple_kernel")?;
    // cudarc uses the device's primary context, as cuda-ipc does: the same context.
    let ctx = GpuContext::from_cudarc(&cctx)?;
    Ok((ctx, stream, kernel))
}

/// `simple_kernel(ptr, len, value)` on `buf`, through cudarc's launch builder.
fn fill(
    stream: &CudaStream,
    kernel: &CudaFunction,
    buf: &GpuSlice<u8>,
    value: u8,
) -> Result<(), Failure> {
    let len = i32::try_from(buf.len())?;
    let value = u32::from(value);
    let cfg = LaunchConfig {
        grid_dim: (256, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: simple_kernel(char*, int, unsigned) writes bytes [0, len) of `buf`, which the
    // caller keeps alive until the stream is synchronised.
    unsafe {
        stream
            .launch_builder(kernel)
            .arg(buf)
            .arg(&len)
            .arg(&value)
            .launch(cfg)?
    };
    Ok(())
}

fn check_bytes(host: &[u8], want: u8, who: &str) -> Result<(), Failure> {
    match host.iter().position(|&b| b != want) {
        None => Ok(()),
        Some(i) => Err(format!("{who}: byte {i} is {:#x}, expected {want:#x}", host[i]).into()),
    }
}

fn producer() -> Result<Option<Duration>, Failure> {
    let devices = match cuda_ipc::device::device_count() {
        Ok(n) => n,
        Err(Error::NoDevice { name, .. }) => {
            eprintln!("cudarc_interop: waived: no CUDA device (cuInit: {name})");
            return Ok(None);
        }
        Err(Error::DriverNotFound { tried, .. }) => {
            eprintln!("cudarc_interop: waived: no CUDA driver library (tried {tried})");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let (ctx, stream, kernel) = cudarc_side(0)?;
    let data = IpcBuffer::<u8>::new(&ctx, LEN)?;
    let ready = IpcSignal::new(&ctx)?;
    let ack = IpcSignal::new(&ctx)?;
    let region = ShmOptions::new(format!("cuda-ipc-cudarc-interop-{}", std::process::id()))
        .create::<Shared>()?;
    region.data.store(data.handle()?);
    region.ready.store(ready.handle()?);
    region.ack.store(ack.handle()?);
    region.published.store(1, Ordering::Release);

    let consumer_device = if devices > 1 { 1 } else { 0 };
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--consumer", region.name(), &consumer_device.to_string()])
        .spawn()?;

    let start = Instant::now();
    fill(&stream, &kernel, &data, FILL)?;
    // SAFETY: `ready` outlives the write: the stream is synchronised below, before it drops.
    unsafe { ready.signal(&*stream, 1)? };
    // The consumer's kernel runs after ours and signals back; the host only waits for that.
    let waited = ack.wait_host(1, Duration::from_secs(60));
    let round_trip = start.elapsed();
    stream.synchronize()?;
    let status = child.wait()?;
    waited?;
    if !status.success() {
        return Err(format!("consumer failed: {status}").into());
    }
    let mut host = vec![0u8; LEN];
    data.copy_to_host(&mut host)?;
    check_bytes(&host, REPLY, "producer")?;
    println!(
        "Producer (GPU 0): the consumer (GPU {consumer_device}) saw our {LEN} bytes and wrote its own"
    );
    Ok(Some(round_trip))
}

fn consumer(region_name: &str, device: usize) -> Result<(), Failure> {
    let region = ShmOptions::new(region_name).open::<Shared>()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while region.published.load(Ordering::Acquire) == 0 {
        if Instant::now() > deadline {
            return Err("the producer never published its handles".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (ctx, stream, kernel) = cudarc_side(device)?;
    let data = ImportedBuffer::open(&ctx, &region.data.load())?;
    let ready = ImportedSignal::open(&ctx, &region.ready.load())?;
    let ack = ImportedSignal::open(&ctx, &region.ack.load())?;
    let mut host = vec![0u8; data.len()];
    // SAFETY: everything enqueued here (the wait, the copy into `host`, the kernel, the
    // signal) has completed when `stream.synchronize()` returns, before any of it drops and
    // before `host` is read.
    unsafe {
        ready.wait(&*stream, 1)?;
        data.copy_to_host_async(&mut host, &*stream)?;
    }
    stream.synchronize()?;
    check_bytes(&host, FILL, "consumer")?;
    fill(&stream, &kernel, &data, REPLY)?;
    // SAFETY: as above: synchronised before `ack` drops.
    unsafe { ack.signal(&*stream, 1)? };
    stream.synchronize()?;
    println!("Consumer (GPU {device}): {} bytes verified", data.len());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "cudarc_interop: a cudarc kernel, a cuda-ipc signal and a buffer shared with a \
             consumer process\n\nusage: cudarc_interop (no options; exit 2 without a GPU)"
        );
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("--consumer") {
        let (Some(name), Some(device)) = (args.get(1), args.get(2).and_then(|d| d.parse().ok()))
        else {
            eprintln!("usage: cudarc_interop --consumer REGION DEVICE");
            return ExitCode::from(1);
        };
        return match consumer(name, device) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("consumer: error: {e}");
                ExitCode::from(1)
            }
        };
    }
    match producer() {
        Ok(Some(t)) => {
            println!(
                "cudarc_interop: ok, kernel -> signal -> kernel -> signal round trip {:.1} ms",
                t.as_secs_f64() * 1e3
            );
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::from(2),
        Err(e) => {
            eprintln!("cudarc_interop: error: {e}");
            ExitCode::from(1)
        }
    }
}
