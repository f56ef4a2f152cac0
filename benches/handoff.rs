//! Producer/consumer hand-off between two processes, four ways in the same run: raw
//! interprocess events, the crate's `IpcEvent`, raw stream memory operations on IPC-mapped
//! counters, and the crate's `IpcSignal`.
//!
//! One round trip `k`, event protocol (simpleIPC's way): the producer's stream waits for the
//! consumer's event (the buffer is handed back), a kernel writes the buffer, the producer
//! records its event and bumps a sequence number in shared memory; the consumer sees it, makes
//! its stream wait on the producer's event, copies the first 64 bytes to the host, records its
//! own event, synchronises, and acknowledges in shared memory. An event can only be waited on
//! after it was recorded, so the consumer's host must be in the loop.
//!
//! Signal protocol: the producer enqueues the kernel, `ready = k`, publishes `k`, then
//! enqueues "wait until `ack ≥ k`" and a local event, and spins on that event; the consumer,
//! seeing `k` published, enqueues "wait until `ready ≥ k`", a 64-byte device copy out of the
//! buffer, and `ack = k`, and never synchronises. Both GPUs' streams hand off by themselves.
//! Each counter lives on the device of the process that waits on it (`ready` on the
//! consumer's, `ack` on the producer's); `signal_cuda_ipc_writer_owned` puts each on its
//! writer's device instead, so that across two GPUs every wait polls the other GPU's memory.
//!
//! Each protocol runs twice: `round_trip_*` with the kernel and the copy, `ping_pong_*` with
//! neither (the hand-off alone). The producer runs on device 0; the consumer on device 0, and
//! on device 1 too when there are two GPUs (peer access over NVLink). Two processes on one GPU
//! are time-sliced by the GPU (no MPS), which bounds every cross-process hand-off there.
//! Run: `cargo bench --bench handoff`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{Function, Module, Stream, StreamFlags, launch};
use criterion::Criterion;
use cuda_ipc::driver::sys;
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{
    GpuContext, GpuSignal, ImportedBuffer, ImportedEvent, ImportedSignal, IpcBuffer, IpcEvent,
    IpcEventHandle, IpcMemHandle, IpcSignal, IpcSignalHandle, ShmSafe,
};

const LEN: usize = 1 << 20;
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    EventRaw,
    EventCrate,
    /// Each counter on its waiter's device (the placement the docs recommend).
    SignalRaw,
    SignalCrate,
    /// Each counter on its writer's device: across GPUs, waits poll remote memory.
    SignalCrateWriterOwned,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::EventRaw,
        Mode::EventCrate,
        Mode::SignalRaw,
        Mode::SignalCrate,
        Mode::SignalCrateWriterOwned,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::EventRaw => "event_raw",
            Mode::EventCrate => "event_cuda_ipc",
            Mode::SignalRaw => "signal_raw_memops",
            Mode::SignalCrate => "signal_cuda_ipc",
            Mode::SignalCrateWriterOwned => "signal_cuda_ipc_writer_owned",
        }
    }

    fn parse(s: &str) -> Mode {
        *Mode::ALL.iter().find(|m| m.name() == s).unwrap()
    }

    fn is_crate(self) -> bool {
        matches!(
            self,
            Mode::EventCrate | Mode::SignalCrate | Mode::SignalCrateWriterOwned
        )
    }
}

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u8>>,
    producer_event: ShmCell<IpcEventHandle>,
    consumer_event: ShmCell<IpcEventHandle>,
    ready: ShmCell<IpcSignalHandle>,
    ack_signal: ShmCell<IpcSignalHandle>,
    raw_mem: ShmCell<[u8; 64]>,
    raw_producer_event: ShmCell<[u8; 64]>,
    raw_consumer_event: ShmCell<[u8; 64]>,
    raw_ready: ShmCell<[u8; 64]>,
    raw_ack: ShmCell<[u8; 64]>,
    consumer_ready: AtomicU32,
    seq: AtomicU64,
    ack: AtomicU64,
    stop_at: AtomicU64,
}

/// Spin until `cond`. A consumer idles here while the other modes are measured, so the limit
/// only catches a partner that is gone for good.
fn spin(cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "hand-off partner stopped"
        );
        std::hint::spin_loop();
    }
}

fn raw_event(flags: u32) -> sys::CUevent {
    let mut ev = std::ptr::null_mut();
    // SAFETY: writes one event handle on the current context.
    unsafe { common::ok("cuEventCreate", sys::cuEventCreate(&mut ev, flags)) };
    ev
}

fn raw_ipc_event() -> (sys::CUevent, [u8; 64]) {
    let ev = raw_event(sys::CU_EVENT_INTERPROCESS | sys::CU_EVENT_DISABLE_TIMING);
    let mut h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: an interprocess event of the current context.
    unsafe { common::ok("cuIpcGetEventHandle", sys::cuIpcGetEventHandle(&mut h, ev)) };
    (ev, h.reserved)
}

fn raw_open_event(h: [u8; 64]) -> sys::CUevent {
    let mut ev = std::ptr::null_mut();
    // SAFETY: a live handle from the partner process.
    unsafe {
        common::ok(
            "cuIpcOpenEventHandle",
            sys::cuIpcOpenEventHandle(&mut ev, sys::CUipcHandle { reserved: h }),
        )
    };
    ev
}

/// A raw 8-byte counter at 0 and its IPC handle.
fn raw_counter() -> (u64, [u8; 64]) {
    let mut ptr = 0;
    let mut h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: raw allocation on the current context, zeroed, exported.
    unsafe {
        common::ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut ptr, 8));
        common::ok("cuMemsetD8", sys::cuMemsetD8_v2(ptr, 0, 8));
        common::ok("cuIpcGetMemHandle", sys::cuIpcGetMemHandle(&mut h, ptr));
    }
    (ptr, h.reserved)
}

fn raw_open_mem(h: [u8; 64]) -> u64 {
    let mut ptr = 0;
    // SAFETY: the partner's live handle.
    unsafe {
        common::ok(
            "cuIpcOpenMemHandle",
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                sys::CUipcHandle { reserved: h },
                sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
            ),
        )
    };
    ptr
}

fn raw_write(s: sys::CUstream, addr: u64, v: u64) {
    // SAFETY: a live stream and an 8-byte device counter mapped for the bench's lifetime.
    let rc =
        unsafe { sys::cuStreamWriteValue64_v2(s, addr, v, sys::CU_STREAM_WRITE_VALUE_DEFAULT) };
    common::ok("cuStreamWriteValue64", rc);
}

fn raw_wait(s: sys::CUstream, addr: u64, v: u64) {
    // SAFETY: as in `raw_write`.
    let rc = unsafe { sys::cuStreamWaitValue64_v2(s, addr, v, sys::CU_STREAM_WAIT_VALUE_GEQ) };
    common::ok("cuStreamWaitValue64", rc);
}

/// The consumer loop (helper process): `REGION:MODE:DEVICE`.
fn consumer(arg: &str) {
    let mut parts = arg.split(':');
    let (region, mode, device) = (
        parts.next().unwrap(),
        Mode::parse(parts.next().unwrap()),
        parts.next().unwrap().parse::<u32>().unwrap(),
    );
    // "bare": hand the buffer back and forth without touching it (the signalling alone).
    let work = parts.next() == Some("work");
    let shared = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(device).unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let s: sys::CUstream = stream.as_inner().cast();
    let mut host = [0u8; 64];
    let mut scratch = 0;
    // SAFETY: a 64-byte device scratch buffer for the signal protocol's read.
    unsafe { common::ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut scratch, 64)) };
    let done = |k: u64| shared.stop_at.load(Ordering::Acquire) == k;
    let mut k = 0u64;
    match mode {
        Mode::EventCrate => {
            let buf = ImportedBuffer::open(&ctx, &shared.mem.load()).unwrap();
            let theirs = ImportedEvent::open(&ctx, &shared.producer_event.load()).unwrap();
            let mine = IpcEvent::new(&ctx).unwrap();
            shared.consumer_event.store(mine.handle().unwrap());
            shared.consumer_ready.store(1, Ordering::Release);
            loop {
                k += 1;
                spin(|| shared.seq.load(Ordering::Acquire) >= k);
                theirs.wait_on(&stream).unwrap();
                if work {
                    // SAFETY: `host` outlives the synchronize below.
                    let rc = unsafe {
                        sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), buf.as_raw_ptr(), 64, s)
                    };
                    common::ok("cuMemcpyDtoHAsync", rc);
                }
                mine.record(&stream).unwrap();
                stream.synchronize().unwrap();
                shared.ack.store(k, Ordering::Release);
                if done(k) {
                    break;
                }
            }
        }
        Mode::EventRaw => {
            let ptr = raw_open_mem(shared.raw_mem.load());
            let theirs = raw_open_event(shared.raw_producer_event.load());
            let (mine, h) = raw_ipc_event();
            shared.raw_consumer_event.store(h);
            shared.consumer_ready.store(1, Ordering::Release);
            loop {
                k += 1;
                spin(|| shared.seq.load(Ordering::Acquire) >= k);
                // SAFETY: live events, stream and mapping; `host` outlives the synchronize.
                unsafe {
                    common::ok("cuStreamWaitEvent", sys::cuStreamWaitEvent(s, theirs, 0));
                    if work {
                        common::ok(
                            "cuMemcpyDtoHAsync",
                            sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, 64, s),
                        );
                    }
                    common::ok("cuEventRecord", sys::cuEventRecord(mine, s));
                    common::ok("cuStreamSynchronize", sys::cuStreamSynchronize(s));
                }
                shared.ack.store(k, Ordering::Release);
                if done(k) {
                    break;
                }
            }
        }
        Mode::SignalCrate | Mode::SignalCrateWriterOwned => {
            let buf = ImportedBuffer::open(&ctx, &shared.mem.load()).unwrap();
            // One side exports, the other opens; both are used as `GpuSignal`s.
            let (ready, ack): (AnySignal, AnySignal) = if mode == Mode::SignalCrate {
                let ready = IpcSignal::new(&ctx).unwrap();
                shared.ready.store(ready.handle().unwrap());
                (
                    Box::new(ready),
                    Box::new(ImportedSignal::open(&ctx, &shared.ack_signal.load()).unwrap()),
                )
            } else {
                let ack = IpcSignal::new(&ctx).unwrap();
                shared.ack_signal.store(ack.handle().unwrap());
                (
                    Box::new(ImportedSignal::open(&ctx, &shared.ready.load()).unwrap()),
                    Box::new(ack),
                )
            };
            shared.consumer_ready.store(1, Ordering::Release);
            loop {
                k += 1;
                spin(|| shared.seq.load(Ordering::Acquire) >= k);
                // SAFETY: the stream is synchronised before the signals drop (below).
                unsafe { ready.wait(&stream, k).unwrap() };
                if work {
                    // SAFETY: both device ranges are live; the stream orders the copy.
                    let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(scratch, buf.as_raw_ptr(), 64, s) };
                    common::ok("cuMemcpyDtoDAsync", rc);
                }
                // SAFETY: as above.
                unsafe { ack.signal(&stream, k).unwrap() };
                if done(k) {
                    stream.synchronize().unwrap();
                    break;
                }
            }
        }
        Mode::SignalRaw => {
            let ptr = raw_open_mem(shared.raw_mem.load());
            let ack = raw_open_mem(shared.raw_ack.load());
            let (ready, h) = raw_counter();
            shared.raw_ready.store(h);
            shared.consumer_ready.store(1, Ordering::Release);
            loop {
                k += 1;
                spin(|| shared.seq.load(Ordering::Acquire) >= k);
                raw_wait(s, ready, k);
                if work {
                    // SAFETY: as above.
                    let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(scratch, ptr, 64, s) };
                    common::ok("cuMemcpyDtoDAsync", rc);
                }
                raw_write(s, ack, k);
                if done(k) {
                    stream.synchronize().unwrap();
                    break;
                }
            }
        }
    }
}

/// A signal this process exported or opened: either is used through its `GpuSignal`.
type AnySignal = Box<dyn std::ops::Deref<Target = GpuSignal>>;

/// What the producer waits and signals with.
enum Sync {
    Events {
        mine: sys::CUevent,
        theirs: sys::CUevent,
        /// Kept alive: the crate's events (raw handles above are theirs).
        typed: Option<(IpcEvent, ImportedEvent)>,
    },
    SignalCrate {
        ready: AnySignal,
        ack: AnySignal,
    },
    SignalRaw {
        ready: u64,
        ack: u64,
    },
}

/// The producer side of one mode, with its consumer helper.
struct Producer<'m> {
    region: ShmRegion<Shared>,
    stream: Stream,
    kernel: Function<'m>,
    ptr: u64,
    sync: Sync,
    /// Whether a round trip writes the buffer (kernel) and reads it (copy), or only hands off.
    work: bool,
    /// Local (non-IPC) event the signal protocol's host spins on.
    done: sys::CUevent,
    k: Cell<u64>,
    _helper: common::Helper,
}

impl<'m> Producer<'m> {
    fn new(
        ctx: &GpuContext,
        module: &'m Module,
        mode: Mode,
        consumer_device: u32,
        work: bool,
        own: &IpcBuffer<u8>,
        raw_ptr: u64,
    ) -> Self {
        ctx.make_current().unwrap();
        let region = ShmOptions::new("cuda-ipc-bench-handoff")
            .random_suffix(true)
            .create::<Shared>()
            .unwrap();
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
        let shared: &Shared = &region;
        let ptr = if mode.is_crate() {
            shared.mem.store(own.handle().unwrap());
            own.as_raw_ptr()
        } else {
            let mut mh = sys::CUipcHandle { reserved: [0; 64] };
            // SAFETY: a raw allocation of this process on the current context.
            unsafe {
                common::ok(
                    "cuIpcGetMemHandle",
                    sys::cuIpcGetMemHandle(&mut mh, raw_ptr),
                )
            };
            shared.raw_mem.store(mh.reserved);
            raw_ptr
        };
        // Export what the consumer opens, start it, open what it exports.
        let mut typed_mine = None;
        let mut raw_mine = None;
        let mut crate_signal = None;
        let mut raw_ack = 0;
        match mode {
            Mode::EventCrate => {
                let mine = IpcEvent::new(ctx).unwrap();
                shared.producer_event.store(mine.handle().unwrap());
                typed_mine = Some(mine);
            }
            Mode::EventRaw => {
                let (mine, h) = raw_ipc_event();
                shared.raw_producer_event.store(h);
                raw_mine = Some(mine);
            }
            Mode::SignalCrate => {
                let ack = IpcSignal::new(ctx).unwrap();
                shared.ack_signal.store(ack.handle().unwrap());
                crate_signal = Some(ack);
            }
            Mode::SignalCrateWriterOwned => {
                let ready = IpcSignal::new(ctx).unwrap();
                shared.ready.store(ready.handle().unwrap());
                crate_signal = Some(ready);
            }
            Mode::SignalRaw => {
                let (ack, h) = raw_counter();
                shared.raw_ack.store(h);
                raw_ack = ack;
            }
        }
        let helper = common::spawn(
            "consumer",
            &format!(
                "{}:{}:{consumer_device}:{}",
                region.name(),
                mode.name(),
                if work { "work" } else { "bare" }
            ),
        );
        common::wait_for("consumer", Duration::from_secs(60), || {
            shared.consumer_ready.load(Ordering::Acquire) == 1
        });
        ctx.make_current().unwrap();
        let sync = match mode {
            Mode::EventCrate => {
                let mine = typed_mine.unwrap();
                let theirs = ImportedEvent::open(ctx, &shared.consumer_event.load()).unwrap();
                Sync::Events {
                    mine: std::ptr::null_mut(),
                    theirs: std::ptr::null_mut(),
                    typed: Some((mine, theirs)),
                }
            }
            Mode::EventRaw => Sync::Events {
                mine: raw_mine.unwrap(),
                theirs: raw_open_event(shared.raw_consumer_event.load()),
                typed: None,
            },
            Mode::SignalCrate => Sync::SignalCrate {
                ready: Box::new(ImportedSignal::open(ctx, &shared.ready.load()).unwrap()),
                ack: Box::new(crate_signal.unwrap()),
            },
            Mode::SignalCrateWriterOwned => Sync::SignalCrate {
                ready: Box::new(crate_signal.unwrap()),
                ack: Box::new(ImportedSignal::open(ctx, &shared.ack_signal.load()).unwrap()),
            },
            Mode::SignalRaw => Sync::SignalRaw {
                ready: raw_open_mem(shared.raw_ready.load()),
                ack: raw_ack,
            },
        };
        Producer {
            region,
            stream,
            kernel: module.get_function("simple_kernel").unwrap(),
            ptr,
            sync,
            work,
            done: raw_event(sys::CU_EVENT_DISABLE_TIMING),
            k: Cell::new(0),
            _helper: helper,
        }
    }

    fn round_trip(&self) {
        let k = self.k.get() + 1;
        self.k.set(k);
        let shared: &Shared = &self.region;
        let s = &self.stream;
        let sr: sys::CUstream = s.as_inner().cast();
        let kern = &self.kernel;
        let launch = || {
            if self.work {
                // SAFETY: simple_kernel writes LEN bytes of the producer's live buffer.
                unsafe { launch!(kern<<<8, 128, 0, s>>>(self.ptr, LEN as i32, k as u32)) }.unwrap();
            }
        };
        match &self.sync {
            Sync::Events {
                typed: Some((mine, theirs)),
                ..
            } => {
                if k > 1 {
                    theirs.wait_on(s).unwrap();
                }
                launch();
                mine.record(s).unwrap();
                shared.seq.store(k, Ordering::Release);
                spin(|| shared.ack.load(Ordering::Acquire) == k);
            }
            Sync::Events { mine, theirs, .. } => {
                if k > 1 {
                    // SAFETY: live event and stream.
                    unsafe {
                        common::ok("cuStreamWaitEvent", sys::cuStreamWaitEvent(sr, *theirs, 0))
                    };
                }
                launch();
                // SAFETY: live event and stream.
                unsafe { common::ok("cuEventRecord", sys::cuEventRecord(*mine, sr)) };
                shared.seq.store(k, Ordering::Release);
                spin(|| shared.ack.load(Ordering::Acquire) == k);
            }
            Sync::SignalCrate { ready, ack } => {
                launch();
                // SAFETY: `await_stream` below waits for the stream before the next step, and
                // the signals outlive this helper.
                unsafe { ready.signal(s, k).unwrap() };
                shared.seq.store(k, Ordering::Release);
                // SAFETY: as above.
                unsafe { ack.wait(s, k).unwrap() };
                self.await_stream(sr);
            }
            Sync::SignalRaw { ready, ack } => {
                launch();
                raw_write(sr, *ready, k);
                shared.seq.store(k, Ordering::Release);
                raw_wait(sr, *ack, k);
                self.await_stream(sr);
            }
        }
    }

    /// Record the local event and spin until the stream has passed it.
    fn await_stream(&self, s: sys::CUstream) {
        // SAFETY: a live local event and stream.
        unsafe { common::ok("cuEventRecord", sys::cuEventRecord(self.done, s)) };
        let t = Instant::now();
        loop {
            // SAFETY: a live event.
            match unsafe { sys::cuEventQuery(self.done) } {
                0 => return,
                sys::CUDA_ERROR_NOT_READY => {
                    assert!(
                        t.elapsed() < Duration::from_secs(60),
                        "hand-off partner stopped"
                    );
                    std::hint::spin_loop();
                }
                rc => common::ok("cuEventQuery", rc),
            }
        }
    }

    fn stop(self) {
        self.region
            .stop_at
            .store(self.k.get() + 1, Ordering::Release);
        self.round_trip();
        self.stream.synchronize().unwrap();
        // SAFETY: the stream is idle, so nothing uses these any more; each is released once.
        unsafe {
            common::ok("cuEventDestroy", sys::cuEventDestroy_v2(self.done));
            match self.sync {
                Sync::Events {
                    mine,
                    theirs,
                    typed: None,
                } => {
                    common::ok("cuEventDestroy", sys::cuEventDestroy_v2(mine));
                    common::ok("cuEventDestroy", sys::cuEventDestroy_v2(theirs));
                }
                Sync::SignalRaw { ready, ack } => {
                    common::ok("cuIpcCloseMemHandle", sys::cuIpcCloseMemHandle(ready));
                    common::ok("cuMemFree", sys::cuMemFree_v2(ack));
                }
                Sync::Events { .. } | Sync::SignalCrate { .. } => {}
            }
        }
    }
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "consumer");
        consumer(&arg);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("handoff") else {
        return;
    };
    let module = Module::from_ptx(KERNELS, &[]).unwrap();
    let own = IpcBuffer::<u8>::zeroed(&ctx, LEN).unwrap();
    let mut raw_ptr = 0;
    // SAFETY: a raw allocation for the raw protocols, freed at the end.
    unsafe { common::ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut raw_ptr, LEN)) };
    let consumers: Vec<u32> = if cuda_ipc::device::device_count().unwrap() >= 2 {
        vec![0, 1]
    } else {
        vec![0]
    };

    let mut c = Criterion::default().configure_from_args();
    for (&device, work) in consumers.iter().flat_map(|d| [(d, true), (d, false)]) {
        let label = match (device, work) {
            (0, true) => "round_trip_1gpu",
            (0, false) => "ping_pong_1gpu",
            (_, true) => "round_trip_2gpu",
            (_, false) => "ping_pong_2gpu",
        };
        let producers: Vec<Producer> = Mode::ALL
            .iter()
            .map(|&m| Producer::new(&ctx, &module, m, device, work, &own, raw_ptr))
            .collect();
        {
            let mut g = c.benchmark_group(format!("handoff_{label}"));
            g.measurement_time(Duration::from_secs(3))
                .warm_up_time(Duration::from_millis(500));
            for (mode, p) in Mode::ALL.iter().zip(&producers) {
                g.bench_function(mode.name(), |b| b.iter(|| p.round_trip()));
            }
            g.finish();
        }
        if common::is_bench_run() {
            let [
                event_raw,
                event_crate,
                signal_raw,
                signal_crate,
                writer_owned,
            ] = &producers[..]
            else {
                unreachable!()
            };
            common::header(&format!(
                "hand-off {label}: consumer on device {device}{}, alternating batches",
                if work {
                    ", kernel writes 1 MiB, consumer copies 64 B"
                } else {
                    ", signalling only"
                }
            ));
            let pairs: [(&str, &Producer, &Producer); 4] = [
                ("IpcEvent vs raw events", event_crate, event_raw),
                ("IpcSignal vs raw memops", signal_crate, signal_raw),
                ("IpcSignal vs raw events", signal_crate, event_raw),
                ("writer- vs waiter-owned", writer_owned, signal_crate),
            ];
            for (name, ours, base) in pairs {
                // About 50 ms per batch, whatever a round trip costs here.
                let per_batch = common::batch_size(Duration::from_millis(50), || base.round_trip());
                let (a, b) =
                    common::sample_pair(31, per_batch, || ours.round_trip(), || base.round_trip());
                common::row(name, &a, &b);
            }
        }
        for p in producers {
            p.stop();
        }
    }
    c.final_summary();
    ctx.make_current().unwrap();
    // SAFETY: allocated above; the consumers that mapped it have exited.
    unsafe { common::ok("cuMemFree", sys::cuMemFree_v2(raw_ptr)) };
}
