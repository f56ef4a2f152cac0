//! A tokio server that receives GPU buffers from several producer processes and answers each
//! one, in one thread: every producer's requests arrive on its own channel, and one task per
//! producer awaits them (`recv_async`) — no thread per producer, no polling.
//!
//! ```text
//! cargo run --release --features async --example async_server -- [--producers N] [--items N] [--bytes N]
//! ```
//!
//! Each producer process (default 4) sends `items` requests (default 1,000) of `bytes` bytes
//! (default 64 KiB) through its request channel, each filled on its GPU with a byte that names
//! it, and waits for the server's answer on its reply channel: the server's task copies the
//! request into a reply slot on the GPU (`cuMemcpyDtoDAsync`, after the channel's GPU wait
//! for the producer's fill) and sends it back; the producer checks every byte of the answer
//! and times the round trip. The server runs on a current-thread tokio runtime; it prints how
//! many threads the process has while every task waits.
//!
//! Exit status: 0 when every answer checked out, 2 ("waived") without a GPU that can do IPC
//! and 64-bit stream memory operations, 1 on any failure.

use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
use cuda_ipc::driver::{check, sys};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, GpuContext, ShmSafe};
#[path = "common/cuda.rs"]
mod cuda;
use cuda::{Stream, StreamFlags};

const MAX_PRODUCERS: usize = 16;
const WAIT: Duration = Duration::from_secs(30);

/// One producer's two channels: its requests (it sends) and the server's replies.
#[derive(ShmSafe)]
#[repr(C)]
struct Pair {
    requests: ShmCell<IpcChannelHandle<u8>>,
    replies: ShmCell<IpcChannelHandle<u8>>,
    up: AtomicU32,
}

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    pairs: [Pair; MAX_PRODUCERS],
}

type Failure = Box<dyn std::error::Error>;

struct Options {
    producers: usize,
    items: u64,
    bytes: usize,
}

fn options(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        producers: 4,
        items: 1000,
        bytes: 64 << 10,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--producers" => o.producers = value()?.parse()?,
            "--items" => o.items = value()?.parse()?,
            "--bytes" => o.bytes = value()?.parse()?,
            _ => return Err(format!("unknown argument {a} (try --help)").into()),
        }
    }
    if !(1..=MAX_PRODUCERS).contains(&o.producers) || o.bytes == 0 {
        return Err(format!("1 to {MAX_PRODUCERS} producers, and at least one byte").into());
    }
    Ok(o)
}

/// The byte that fills producer `p`'s request `k`.
fn fill_byte(p: usize, k: u64) -> u8 {
    (p as u64 * 31 + k) as u8
}

/// A producer: send `items` requests, check each answer, report the round trips.
fn producer(region: &str, p: usize, o: &Options) -> Result<(), Failure> {
    let shared = ShmOptions::new(region).open::<Shared>()?;
    let pair = &shared.pairs[p];
    let ctx = GpuContext::new(0)?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let mut tx = IpcSender::<u8>::new(&ctx, 2, o.bytes)?;
    pair.requests.store(tx.handle());
    pair.up.store(1, Ordering::Release);
    while pair.up.load(Ordering::Acquire) != 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut rx = IpcReceiver::<u8>::open(&ctx, &pair.replies.load())?;
    let mut host = vec![0u8; o.bytes];
    let mut rtt = Vec::with_capacity(o.items as usize);
    for k in 1..=o.items {
        let start = Instant::now();
        let slot = tx.acquire(&stream, WAIT)?;
        // SAFETY: fills the slot's bytes on our stream; the channel keeps it mapped until the
        // send enqueued after it has run.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(
                slot.as_raw_ptr(),
                fill_byte(p, k),
                o.bytes,
                stream.as_inner().cast(),
            )
        })?;
        slot.send(o.bytes)?;
        let answer = rx.recv(&stream, WAIT)?;
        stream.synchronize()?; // the GPU wait for the server's copy has passed
        // SAFETY: reads the answer's bytes (mapped until its release) into `host`.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), answer.as_raw_ptr(), o.bytes)
        })?;
        answer.release()?;
        rtt.push(start.elapsed());
        if first_wrong(&host, fill_byte(p, k)).is_some() {
            return Err(format!("producer {p}: answer {k} differs from its request").into());
        }
    }
    rtt.sort();
    println!(
        "Producer {p}: {} answers checked, round trip p50 {:.1} µs, p99 {:.1} µs",
        o.items,
        rtt[rtt.len() / 2].as_secs_f64() * 1e6,
        rtt[rtt.len() * 99 / 100].as_secs_f64() * 1e6
    );
    tx.close(Duration::from_secs(5))?;
    Ok(())
}

/// The index of the first byte of `bytes` that is not `want`, if any.
fn first_wrong(bytes: &[u8], want: u8) -> Option<usize> {
    bytes.iter().position(|&b| b != want)
}

/// One server task: answer every request of one producer, until it closes its channel.
async fn serve(
    ctx: GpuContext,
    requests: IpcChannelHandle<u8>,
    replies: IpcSender<u8>,
) -> Result<u64, Failure> {
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let mut rx = IpcReceiver::<u8>::open(&ctx, &requests)?.listening()?;
    let mut tx = replies.listening()?;
    let mut answered = 0;
    loop {
        let request = match rx.recv_async(&stream).await {
            Ok(r) => r,
            Err(Error::ChannelClosed { .. }) => return Ok(answered),
            Err(e) => return Err(e.into()),
        };
        let slot = tx.acquire_async(&stream).await?;
        // SAFETY: both are mapped until the operations enqueued after this copy on `stream`
        // (the reply's send, the request's release) have run.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                slot.as_raw_ptr(),
                request.as_raw_ptr(),
                request.len(),
                stream.as_inner().cast(),
            )
        })?;
        slot.send(request.len())?;
        request.release()?;
        answered += 1;
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

fn server(o: &Options) -> Result<ExitCode, Failure> {
    match cuda_ipc::device::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => {
            eprintln!("async_server: waived: no CUDA device");
            return Ok(ExitCode::from(2));
        }
        Err(e @ (Error::NoDevice { .. } | Error::DriverNotFound { .. })) => {
            eprintln!("async_server: waived: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    }
    if !cuda_ipc::device::can_use_stream_mem_ops(0)? {
        eprintln!("async_server: waived: device 0 has no 64-bit stream memory operations");
        return Ok(ExitCode::from(2));
    }
    let ctx = GpuContext::new(0)?;
    let region: ShmRegion<Shared> = ShmOptions::new("async-server")
        .random_suffix(true)
        .create()?;
    let mut children: Vec<Child> = Vec::new();
    let mut replies = Vec::new();
    for p in 0..o.producers {
        children.push(
            Command::new(std::env::current_exe()?)
                .args(["--producer", region.name(), &p.to_string()])
                .args(std::env::args().skip(1))
                .spawn()?,
        );
        let tx = IpcSender::<u8>::new(&ctx, 2, o.bytes)?;
        region.pairs[p].replies.store(tx.handle());
        replies.push(tx);
    }
    let start = Instant::now();
    let mut requests = Vec::new();
    for (p, pair) in region.pairs.iter().take(o.producers).enumerate() {
        while pair.up.load(Ordering::Acquire) == 0 {
            if start.elapsed() > WAIT {
                return Err(format!("producer {p} did not start").into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        requests.push(pair.requests.load());
        pair.up.store(2, Ordering::Release);
    }
    let before = threads();
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let local = tokio::task::LocalSet::new();
    let answered = local.block_on(&runtime, async {
        let tasks: Vec<_> = requests
            .into_iter()
            .zip(replies)
            .map(|(req, rep)| tokio::task::spawn_local(serve(ctx.clone(), req, rep)))
            .collect();
        tokio::task::yield_now().await;
        println!(
            "Server: {} producer tasks on one thread; the process has {} threads ({} before \
             the tasks: the reactor is the one more)",
            o.producers,
            threads(),
            before
        );
        let mut answered = Vec::new();
        for t in tasks {
            answered.push(
                t.await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok::<_, String>(answered)
    })?;
    let mut failed = 0;
    for mut c in children {
        if !c.wait()?.success() {
            failed += 1;
        }
    }
    println!("Server: answered {answered:?} requests");
    if failed > 0 || answered.iter().any(|&n| n != o.items) {
        return Err(format!("{failed} producer(s) failed; answered {answered:?}").into());
    }
    println!("async_server: PASSED");
    Ok(ExitCode::SUCCESS)
}

const USAGE: &str = "async_server: a tokio server that answers GPU buffers from several producer \
     processes, one task per producer on one thread\n\n\
     usage: async_server [--producers N] [--items N] [--bytes N]\n\
     \x20 --producers N  producer processes (default 4, at most 16)\n\
     \x20 --items N      requests per producer (default 1000)\n\
     \x20 --bytes N      bytes per request (default 65536)\n\n\
     exit status: 0 when every answer checked out, 2 (waived) without a suitable GPU, 1 on a \
     failure";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--producer") {
        let run = || -> Result<ExitCode, Failure> {
            let p: usize = args.get(2).ok_or("--producer REGION INDEX")?.parse()?;
            let o = options(&args[3..])?;
            producer(&args[1], p, &o).map(|()| ExitCode::SUCCESS)
        };
        run()
    } else {
        options(&args).and_then(|o| server(&o))
    };
    result.unwrap_or_else(|e| {
        eprintln!("async_server: FAILED: {e}");
        ExitCode::FAILURE
    })
}
