//! One copy of model weights on the GPU, many readers: an owner holds N tensors in one arena
//! shared read-only; R reader processes each import it read-only (one descriptor, one
//! mapping, `PROT_READ`), open every tensor (no driver call each) and read all of them with
//! kernels that check every word. With `--legacy`, the same tensors as N buffers with one
//! legacy IPC handle each (`cuIpcOpenMemHandle` per tensor): the baseline.
//!
//! The owner waits until every reader is ready (context, module, scratch memory), then serves
//! them in turn and prints the time from serving the first to the last reader having every
//! tensor open (the handles' transfer over the socket included), and the device memory all
//! the imports added (free memory before serving and once every tensor is open, before any
//! reader's kernels run: `cuMemGetInfo`; mapping memory that exists adds none). Per reader:
//! the time from being served to every tensor open, the time its kernels took to read
//! everything, and whether every tensor read back as the owner wrote it.
//!
//! `cargo run --release --example shared_weights -- [--tensors 2000] [--gib 8] [--readers 1]
//! [--legacy]`; exit 0 when every reader read every tensor right, 2 without a GPU, 1 on
//! failure. `benches/torch_shared_weights.py` measures `torch.multiprocessing` on the same
//! shapes.

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use cuda_ipc::arena::{ArenaHandle, IpcArena};
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle, ReadOnlySlice};
#[path = "common/cuda.rs"]
mod cuda;
#[path = "common/weights.rs"]
mod weights;
use cuda::{DeviceBuffer, Module, Stream, StreamFlags, launch};
use weights::{recv_handles, send_handles, tensor_words};

const KERNELS: &str = include_str!("../kernels/pipeline.ptx");
const WAIT: Duration = Duration::from_secs(120);
const USAGE: &str = "usage: shared_weights [--tensors N] [--gib G] [--readers R] [--legacy]
  An owner holds N tensors (a transformer's shapes, G GiB in all; default 2000 and 8) in one
  arena shared read-only; R reader processes (default 1) import it read-only, open every
  tensor and check every word with kernels. --legacy: one legacy IPC handle per tensor.
  Exit 0 when every reader read every tensor right, 2 without a GPU, 1 on failure.";

type Failure = Box<dyn std::error::Error>;

#[derive(Clone, Copy)]
struct Options {
    tensors: usize,
    gib: f64,
    readers: usize,
    legacy: bool,
}

fn options(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        tensors: 2000,
        gib: 8.0,
        readers: 1,
        legacy: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--tensors" => o.tensors = value()?.parse()?,
            "--gib" => o.gib = value()?.parse()?,
            "--readers" => o.readers = value()?.parse()?,
            "--legacy" => o.legacy = true,
            _ => return Err(format!("unknown argument {a} (try --help)").into()),
        }
    }
    if o.tensors < 11 || o.readers == 0 || o.gib <= 0.0 {
        return Err("need at least 11 tensors, 1 reader and a positive size".into());
    }
    Ok(o)
}

/// Launch geometry for `words` words.
fn blocks(words: usize) -> u32 {
    words.div_ceil(256).clamp(1, 528) as u32
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        Some("--reader") => options(&args[2..]).and_then(|o| reader(&args[1], &o)),
        _ => options(&args).and_then(|o| owner(&o)),
    };
    result.unwrap_or_else(|e| {
        eprintln!("shared_weights: FAILED: {e}");
        ExitCode::FAILURE
    })
}

/// The owner: allocate and fill the tensors, start the readers, send each the weights, and
/// print what they report.
fn owner(o: &Options) -> Result<ExitCode, Failure> {
    let ctx = match GpuContext::new(0) {
        Ok(ctx) => ctx,
        Err(e @ (cuda_ipc::Error::NoDevice { .. } | cuda_ipc::Error::DriverNotFound { .. })) => {
            eprintln!("shared_weights: waived: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    let words = tensor_words(o.tensors, o.gib);
    let bytes: usize = words.iter().map(|w| (w + 1) * 4).sum();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let module = Module::from_ptx(KERNELS, &[])?;
    let fill = module.get_function("fill_item")?;
    let t = Instant::now();
    // Each tensor: its words, then a trailer word (zeroed) that fill_item adds their sum into.
    let (arena, arena_bufs, legacy_bufs) = if o.legacy {
        let bufs = words
            .iter()
            .map(|&w| IpcBuffer::<u32>::zeroed(&ctx, w + 1))
            .collect::<Result<Vec<_>, _>>()?;
        (None, Vec::new(), bufs)
    } else {
        // Room for every tensor on the arena's 256-byte grid.
        let room: usize = words
            .iter()
            .map(|w| ((w + 1) * 4).next_multiple_of(256))
            .sum();
        let arena = IpcArena::with_max_buffers(&ctx, room, o.tensors)?.read_only_for_importers();
        let bufs = words
            .iter()
            .map(|&w| arena.alloc_zeroed::<u32>(w + 1))
            .collect::<Result<Vec<_>, _>>()?;
        (Some(arena), bufs, Vec::new())
    };
    ctx.make_current()?;
    for (i, &w) in words.iter().enumerate() {
        let ptr = match &arena {
            Some(_) => arena_bufs[i].as_raw_ptr(),
            None => legacy_bufs[i].as_raw_ptr(),
        };
        // SAFETY: fill_item(words, n, seq) writes n + 1 words: the tensor and its trailer.
        unsafe { launch!(fill<<<blocks(w), 256, 0, stream>>>(ptr, w as u64, i as u32)) }?;
    }
    stream.synchronize()?;
    println!(
        "shared_weights: {} tensors, {:.2} GiB ({} to {} bytes each) in {}, filled in {:.0} ms",
        o.tensors,
        bytes as f64 / f64::from(1u32 << 30),
        words.iter().min().map_or(0, |w| (w + 1) * 4),
        words.iter().max().map_or(0, |w| (w + 1) * 4),
        if o.legacy {
            "one legacy buffer each"
        } else {
            "one arena shared read-only"
        },
        t.elapsed().as_secs_f64() * 1e3
    );

    let raw = format!("cuda-ipc-shared-weights-{}", std::process::id());
    let listener = FdListener::bind(SocketName::Abstract(raw.clone()), PeerPolicy::SameUid)?;
    let mut readers: Vec<Child> = Vec::new();
    let mut forward = vec!["--reader".to_string(), raw.clone()];
    forward.extend(["--tensors".into(), o.tensors.to_string()]);
    forward.extend(["--gib".into(), o.gib.to_string()]);
    if o.legacy {
        forward.push("--legacy".into());
    }
    for _ in 0..o.readers {
        readers.push(
            Command::new(std::env::current_exe()?)
                .args(&forward)
                .spawn()?,
        );
    }
    let outcome = serve(&listener, o, arena.as_ref(), &arena_bufs, &legacy_bufs);
    let mut failed = outcome.is_err();
    for mut r in readers {
        if outcome.is_err() {
            let _ = r.kill();
        }
        failed |= !r.wait()?.success();
    }
    let served = outcome?;
    let open: Vec<f64> = served.reports.iter().map(|r| r.open_ms).collect();
    let right = served.reports.iter().all(|r| r.errors == 0) && !failed;
    println!(
        "shared_weights: {} reader(s), {}: every reader had every tensor open {:.2} ms after \
         the first was served (each reader, from being served: {:.2} to {:.2} ms); device \
         memory the {} import(s) added: {:.0} MiB; every word checked: {}",
        o.readers,
        if o.legacy {
            "legacy handles"
        } else {
            "read-only arena"
        },
        served.all_open_ms,
        open.iter().cloned().fold(f64::INFINITY, f64::min),
        open.iter().cloned().fold(0.0, f64::max),
        o.readers,
        served.imports_mib,
        if right { "all right" } else { "ERRORS" }
    );
    Ok(if right {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What a reader measured.
struct Report {
    open_ms: f64,
    errors: u64,
}

/// What the owner measured, with every reader's report.
struct Served {
    /// From serving the first reader to the last reader's "opened".
    all_open_ms: f64,
    /// Device memory free before any import less free once every reader has opened every
    /// tensor (before any reader's kernels), in MiB: what the imports added, all together.
    imports_mib: f64,
    reports: Vec<Report>,
}

/// Accept every reader and wait until each is ready (its context, module and scratch
/// memory made); note the free device memory; serve each the weights in turn; wait until
/// every reader has every tensor open and note the free memory again; then let them read,
/// collect their reports and let them go.
fn serve(
    listener: &FdListener,
    o: &Options,
    arena: Option<&IpcArena>,
    arena_bufs: &[cuda_ipc::arena::ArenaBuffer<u32>],
    legacy_bufs: &[IpcBuffer<u32>],
) -> Result<Served, Failure> {
    let mut sockets = Vec::new();
    for _ in 0..o.readers {
        let s = listener.accept(WAIT)?;
        expect(&s, b"ready")?;
        sockets.push(s);
    }
    let (arena_handles, legacy_handles) = match arena {
        Some(_) => (
            arena_bufs
                .iter()
                .flat_map(|b| b.handle().as_bytes().to_vec())
                .collect(),
            Vec::new(),
        ),
        None => {
            let mut bytes = Vec::new();
            for b in legacy_bufs {
                bytes.extend_from_slice(b.handle()?.as_bytes());
            }
            (Vec::new(), bytes)
        }
    };
    let before = free_bytes()?;
    let t = Instant::now();
    for s in &sockets {
        s.send(b"go", &[], WAIT)?;
        match arena {
            Some(arena) => {
                s.send_arena(arena, WAIT)?;
                send_handles(s, &arena_handles, ArenaHandle::<u32>::SIZE, WAIT)?;
            }
            None => send_handles(s, &legacy_handles, IpcMemHandle::<u32>::SIZE, WAIT)?,
        }
    }
    for s in &sockets {
        expect(s, b"opened")?;
    }
    let all_open = t.elapsed();
    let after = free_bytes()?;
    for s in &sockets {
        s.send(b"read", &[], WAIT)?;
    }
    let mut reports = Vec::new();
    for (k, s) in sockets.iter().enumerate() {
        let line = String::from_utf8(s.recv(WAIT)?.payload)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let report = Report {
            open_ms: f.first().ok_or("empty report")?.parse()?,
            errors: f.get(2).ok_or("short report")?.parse()?,
        };
        println!(
            "  reader {k}: every tensor open {:.2} ms after being served, read in {} ms, {} \
             wrong tensor(s)",
            report.open_ms,
            f.get(1).unwrap_or(&"?"),
            report.errors
        );
        reports.push(report);
    }
    for s in &sockets {
        s.send(b"bye", &[], WAIT)?;
    }
    Ok(Served {
        all_open_ms: all_open.as_secs_f64() * 1e3,
        imports_mib: before.saturating_sub(after) as f64 / f64::from(1u32 << 20),
        reports,
    })
}

fn expect(s: &FdSocket, what: &[u8]) -> Result<(), Failure> {
    let got = s.recv(WAIT)?.payload;
    if got != what {
        return Err(format!(
            "expected {:?}, got {:?}",
            String::from_utf8_lossy(what),
            got
        )
        .into());
    }
    Ok(())
}

/// Free device memory now (`cuMemGetInfo`).
fn free_bytes() -> Result<usize, Failure> {
    Ok(cudarc::driver::result::mem_get_info()?.0)
}

/// A reader: import, open every tensor, check every word, report.
fn reader(raw: &str, o: &Options) -> Result<ExitCode, Failure> {
    let words = tensor_words(o.tensors, o.gib);
    let ctx = GpuContext::new(0)?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let module = Module::from_ptx(KERNELS, &[])?;
    let (sum, check) = (
        module.get_function("sum_item")?,
        module.get_function("check_item")?,
    );
    let acc = DeviceBuffer::<u32>::zeroed(1)?;
    let errors = DeviceBuffer::<u32>::zeroed(1)?;
    let s = FdSocket::connect(
        &SocketName::Abstract(raw.to_owned()),
        &PeerPolicy::SameUid,
        WAIT,
    )?;
    s.send(b"ready", &[], WAIT)?;
    expect(&s, b"go")?;
    let t = Instant::now();
    // Every tensor opened, as the read-only slice each kind dereferences to.
    let (arena_views, legacy_views);
    let tensors: Vec<&ReadOnlySlice<u32>> = if o.legacy {
        let bytes = recv_handles(&s, o.tensors, IpcMemHandle::<u32>::SIZE, WAIT)?;
        legacy_views = bytes
            .chunks(IpcMemHandle::<u32>::SIZE)
            .map(|h| ImportedBuffer::open(&ctx, &IpcMemHandle::<u32>::from_bytes(h)?))
            .collect::<Result<Vec<_>, _>>()?;
        legacy_views.iter().map(|v| v.as_read_only()).collect()
    } else {
        let arena = s.recv_arena_read_only(&ctx, WAIT)?;
        let bytes = recv_handles(&s, o.tensors, ArenaHandle::<u32>::SIZE, WAIT)?;
        arena_views = bytes
            .chunks(ArenaHandle::<u32>::SIZE)
            .map(|h| arena.open(&ArenaHandle::<u32>::from_bytes(h)?))
            .collect::<Result<Vec<_>, _>>()?;
        arena_views.iter().map(|v| &**v).collect()
    };
    let open = t.elapsed();
    s.send(b"opened", &[], WAIT)?;
    expect(&s, b"read")?;
    ctx.make_current()?;
    let t = Instant::now();
    let (acc_ptr, errors_ptr) = (acc.as_raw_ptr(), errors.as_raw_ptr());
    for (i, (tensor, &w)) in tensors.iter().zip(&words).enumerate() {
        if tensor.len() != w + 1 {
            return Err(format!("tensor {i}: {} words, expected {}", tensor.len(), w + 1).into());
        }
        let ptr = tensor.as_raw_ptr();
        // SAFETY: sum_item reads n words and adds their sum into `acc`; check_item reads the
        // trailer and the first word, counts a mismatch into `errors` and zeroes `acc`. The
        // tensors stay open and `acc`/`errors` alive until the synchronise below.
        unsafe {
            launch!(sum<<<blocks(w), 256, 0, stream>>>(ptr, w as u64, acc_ptr))?;
            launch!(check<<<1, 1, 0, stream>>>(ptr, w as u64, i as u32, acc_ptr, errors_ptr))?;
        }
    }
    stream.synchronize()?;
    let read = t.elapsed();
    let mut wrong = [0u32];
    errors.copy_to(&mut wrong)?;
    let report = format!(
        "{:.3} {:.1} {}",
        open.as_secs_f64() * 1e3,
        read.as_secs_f64() * 1e3,
        wrong[0]
    );
    s.send(report.as_bytes(), &[], WAIT)?;
    expect(&s, b"bye")?;
    Ok(if wrong[0] == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
