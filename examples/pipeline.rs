//! A producer process fills GPU buffers with a kernel and a consumer process checks each one on
//! its GPU, through an [`IpcSender`] / [`IpcReceiver`] channel: no host copies, no host
//! synchronisation per item.
//!
//! ```text
//! cargo run --release --example pipeline -- [--items N] [--words N] [--slots N] [--same-gpu]
//! ```
//!
//! The consumer (the parent) runs on GPU 1 when there are two (reaching the producer's memory
//! over peer access), else on GPU 0 with the producer. Item `k` is `words` 32-bit words
//! (default 256 Ki: 1 MiB) and a trailer: the producer's `fill_item` kernel writes word `i` =
//! `k · 2654435761 + i` and adds their sum into the trailer; the consumer's `sum_item` and
//! `check_item` kernels sum the words again and count a mismatch with the trailer (or with the
//! item number the first word implies) into an error counter on the consumer's GPU, read once
//! at the end. Two phases:
//!
//! 1. **stream**: `items` items (default 10,000) through `slots` slots (default 4), as fast
//!    as the GPUs go: throughput in items/s and GB/s.
//! 2. **latency**: 1,000 one-word items through one slot; each producer iteration waits for
//!    the slot back, so an iteration is a round trip through both processes and both GPUs:
//!    p50 / p99 per item.
//!
//! Exit status: 0 when every item checked out, 2 ("waived") without a GPU that can do IPC and
//! 64-bit stream memory operations, 1 on any failure.

use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{Error, GpuContext, IpcBuffer, ShmSafe};
#[path = "common/cuda.rs"]
mod cuda;
use cuda::{Module, Stream, StreamFlags, launch};

const KERNELS: &str = include_str!("../kernels/pipeline.ptx");
const WAIT: Duration = Duration::from_secs(30);
const LATENCY_ITEMS: u64 = 1000;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    stream: ShmCell<IpcChannelHandle<u32>>,
    latency: ShmCell<IpcChannelHandle<u32>>,
    up: AtomicU32,
}

type Failure = Box<dyn std::error::Error>;

struct Options {
    items: u64,
    words: usize,
    slots: usize,
    same_gpu: bool,
}

fn options(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        items: 10_000,
        words: 256 << 10,
        slots: 4,
        same_gpu: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--items" => o.items = value()?.parse()?,
            "--words" => o.words = value()?.parse()?,
            "--slots" => o.slots = value()?.parse()?,
            "--same-gpu" => o.same_gpu = true,
            _ => return Err(format!("unknown argument {a} (try --help)").into()),
        }
    }
    Ok(o)
}

/// Launch geometry for `words` words: 256 threads, up to 4 blocks per SM's worth.
fn blocks(words: usize) -> u32 {
    (words.div_ceil(256)).clamp(1, 528) as u32
}

/// The producer: fill and send `items` items of `words` words (+ trailer) through the
/// stream channel, then 1,000 one-word items through the latency channel, one at a time.
fn producer(region: &str, device: u32, o: &Options) -> Result<(), Failure> {
    let shared = ShmOptions::new(region).open::<Shared>()?;
    let ctx = GpuContext::new(device)?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let module = Module::from_ptx(KERNELS, &[])?;
    let fill = module.get_function("fill_item")?;
    let mut tx = IpcSender::<u32>::new(&ctx, o.slots, o.words + 1)?;
    let mut ping = IpcSender::<u32>::new(&ctx, 1, 2)?;
    shared.stream.store(tx.handle());
    shared.latency.store(ping.handle());
    shared.up.store(1, Ordering::Release);

    // `stamp`: synchronise the stream after the acquire (which waits, on the GPU, for the
    // consumer's kernels on the slot's previous item) and note the time.
    let send = |tx: &mut IpcSender<u32>,
                k: u64,
                words: usize,
                stamp: Option<&mut Vec<Instant>>|
     -> Result<(), Failure> {
        let slot = tx.acquire(&stream, WAIT)?;
        if let Some(stamps) = stamp {
            stream.synchronize()?;
            stamps.push(Instant::now());
        }
        let ptr = slot.as_raw_ptr();
        // SAFETY: zeroes the trailer word and writes the slot's `words + 1` words; the
        // channel keeps the slot mapped until the send enqueued after them has run.
        unsafe {
            cuda_ipc::driver::check(
                "cuMemsetD8Async",
                cuda_ipc::driver::sys::cuMemsetD8Async(
                    ptr + 4 * words as u64,
                    0,
                    4,
                    stream.as_inner().cast(),
                ),
            )?;
            launch!(fill<<<blocks(words), 256, 0, stream>>>(ptr, words as u64, k as u32))?;
        }
        slot.send(words + 1)?;
        Ok(())
    };
    for k in 1..=o.items {
        send(&mut tx, k, o.words, None)?;
    }
    // One slot: acquiring item k waits for the consumer's kernels on item k - 1, so the time
    // between two stamps is one item's round trip through both processes and both GPUs.
    let mut stamps = Vec::with_capacity(LATENCY_ITEMS as usize);
    for k in 1..=LATENCY_ITEMS {
        send(&mut ping, k, 1, Some(&mut stamps))?;
    }
    let mut rtt: Vec<Duration> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
    rtt.sort();
    println!(
        "Producer: latency round trip per item p50 {:.1} µs, p99 {:.1} µs ({} items, 1 slot)",
        rtt[rtt.len() / 2].as_secs_f64() * 1e6,
        rtt[rtt.len() * 99 / 100].as_secs_f64() * 1e6,
        rtt.len()
    );
    stream.synchronize()?;
    tx.close(Duration::from_secs(5))?;
    ping.close(Duration::from_secs(5))?;
    Ok(())
}

/// The consumer: check every item on the GPU; return (errors, stream phase time).
fn consumer(
    shared: &Shared,
    ctx: &GpuContext,
    o: &Options,
) -> Result<(u32, Duration, u64), Failure> {
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let module = Module::from_ptx(KERNELS, &[])?;
    let (sum, check) = (
        module.get_function("sum_item")?,
        module.get_function("check_item")?,
    );
    let counters = IpcBuffer::<u32>::zeroed(ctx, 2)?; // [acc, errors]
    let (acc, errors) = (counters.as_raw_ptr(), counters.as_raw_ptr() + 4);
    let mut rx = IpcReceiver::<u32>::open(ctx, &shared.stream.load())?;
    let mut ping = IpcReceiver::<u32>::open(ctx, &shared.latency.load())?;
    let verify = |rx: &mut IpcReceiver<u32>, want: u64| -> Result<bool, Failure> {
        let item = match rx.recv(&stream, WAIT) {
            Ok(item) => item,
            Err(Error::ChannelClosed { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if item.seq() != want || item.is_empty() {
            return Err(format!(
                "item {} of length {} (wanted {want})",
                item.seq(),
                item.len()
            )
            .into());
        }
        let (ptr, words) = (item.as_raw_ptr(), item.len() as u64 - 1);
        // SAFETY: the kernels read the item's words and trailer (mapped until its release
        // has run) and update the two live counters.
        unsafe {
            launch!(sum<<<blocks(words as usize), 256, 0, stream>>>(ptr, words, acc))?;
            launch!(check<<<1, 1, 0, stream>>>(ptr, words, want as u32, acc, errors))?;
        }
        item.release()?; // after the kernels, on the GPU
        Ok(true)
    };
    let start = Instant::now();
    let mut received = 0;
    while received < o.items && verify(&mut rx, received + 1)? {
        received += 1;
    }
    stream.synchronize()?;
    let elapsed = start.elapsed();
    for k in 1..=LATENCY_ITEMS {
        if !verify(&mut ping, k)? {
            return Err(format!("latency channel closed after {} items", k - 1).into());
        }
    }
    stream.synchronize()?;
    let mut host = [0u32; 2];
    counters.copy_to_host(&mut host)?;
    Ok((host[1], elapsed, received))
}

fn parent(o: &Options) -> Result<ExitCode, Failure> {
    let n = match cuda_ipc::device::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => {
            eprintln!("pipeline: waived: no CUDA device");
            return Ok(ExitCode::from(2));
        }
        Err(e @ (Error::NoDevice { .. } | Error::DriverNotFound { .. })) => {
            eprintln!("pipeline: waived: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    if !cuda_ipc::device::can_use_stream_mem_ops(0)? {
        eprintln!("pipeline: waived: device 0 has no 64-bit stream memory operations");
        return Ok(ExitCode::from(2));
    }
    let (producer_dev, consumer_dev) = (0, if n > 1 && !o.same_gpu { 1 } else { 0 });
    let region = ShmOptions::new("pipeline")
        .random_suffix(true)
        .create::<Shared>()?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--producer", region.name(), &producer_dev.to_string()])
        .args(std::env::args().skip(1))
        .spawn()?;
    // Meanwhile, bring up our own context (the producer does the same).
    let ctx = GpuContext::new(consumer_dev)?;
    let t = Instant::now();
    while region.up.load(Ordering::Acquire) == 0 {
        if let Some(status) = child.try_wait()? {
            return Err(format!("the producer exited early: {status}").into());
        }
        if t.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the producer did not start".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "Pipeline: producer on GPU {producer_dev}, consumer on GPU {consumer_dev}; {} items of \
         {} words through {} slots",
        o.items, o.words, o.slots
    );
    let result = consumer(&region, &ctx, o);
    let status = child.wait()?;
    let (errors, elapsed, received) = result?;
    if !status.success() {
        return Err(format!("the producer failed: {status}").into());
    }
    let bytes = (o.words as f64 + 1.0) * 4.0 * received as f64;
    println!(
        "Consumer: {received} items in {:.3} s: {:.0} items/s, {:.1} GB/s, {:.1} µs per item; \
         checksum errors: {errors}",
        elapsed.as_secs_f64(),
        received as f64 / elapsed.as_secs_f64(),
        bytes / elapsed.as_secs_f64() / 1e9,
        elapsed.as_secs_f64() * 1e6 / received as f64,
    );
    if errors != 0 || received != o.items {
        return Err(format!("{errors} checksum errors, {received} of {} items", o.items).into());
    }
    println!("pipeline: PASSED");
    Ok(ExitCode::SUCCESS)
}

const USAGE: &str = "pipeline: a producer and a consumer process streaming GPU buffers through an \
     IpcSender / IpcReceiver channel, checked on the consumer's GPU\n\n\
     usage: pipeline [--items N] [--words N] [--slots N] [--same-gpu]\n\
     \x20 --items N    items in the stream phase (default 10000)\n\
     \x20 --words N    32-bit words per item (default 262144: 1 MiB)\n\
     \x20 --slots N    channel slots (default 4)\n\
     \x20 --same-gpu   producer and consumer on GPU 0 even with two GPUs\n\n\
     exit status: 0 when every item checked out, 2 (waived) without a suitable GPU, 1 on a failure";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--producer") {
        let run = || -> Result<ExitCode, Failure> {
            let device: u32 = args.get(2).ok_or("--producer REGION DEVICE")?.parse()?;
            let o = options(&args[3..])?;
            producer(&args[1], device, &o).map(|()| ExitCode::SUCCESS)
        };
        run()
    } else {
        options(&args).and_then(|o| parent(&o))
    };
    result.unwrap_or_else(|e| {
        eprintln!("pipeline: FAILED: {e}");
        ExitCode::FAILURE
    })
}
