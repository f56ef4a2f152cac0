//! Producer/consumer hand-off between two processes, through the crate's types vs the same
//! protocol with raw driver calls, in the same run.
//!
//! One round trip: the producer's stream waits for the consumer's event (the buffer is handed
//! back), a kernel writes the buffer, the producer records its event and bumps a sequence
//! number in shared memory; the consumer sees it, makes its stream wait on the producer's
//! event, copies the first bytes to the host, records its own event, synchronises, and
//! acknowledges. Run: `cargo bench --bench handoff`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use cuda_ipc::driver::{error_name, sys};
use cuda_ipc::{
    GpuContext, IpcBuffer, IpcEvent, IpcEventHandle, IpcMemHandle, ShmCell, ShmOptions, ShmSafe,
};
use cust::module::Module;
use cust::prelude::*;

const LEN: usize = 1 << 20;
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u8>>,
    producer_event: ShmCell<IpcEventHandle>,
    consumer_event: ShmCell<IpcEventHandle>,
    raw_mem: ShmCell<[u8; 64]>,
    raw_producer_event: ShmCell<[u8; 64]>,
    raw_consumer_event: ShmCell<[u8; 64]>,
    consumer_ready: AtomicU32,
    seq: AtomicU64,
    ack: AtomicU64,
    stop_at: AtomicU64,
}
// SAFETY: repr(C), every field is ShmSafe.
unsafe impl ShmSafe for Shared {}

fn ok(call: &str, rc: i32) {
    assert_eq!(rc, 0, "{call}: {}", error_name(rc));
}

fn spin(cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "hand-off partner stopped"
        );
        std::hint::spin_loop();
    }
}

fn raw_event() -> (sys::CUevent, [u8; 64]) {
    let mut ev = std::ptr::null_mut();
    let mut h = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: raw driver calls with valid out-pointers on the current context.
    unsafe {
        ok(
            "cuEventCreate",
            sys::cuEventCreate(
                &mut ev,
                sys::CU_EVENT_INTERPROCESS | sys::CU_EVENT_DISABLE_TIMING,
            ),
        );
        ok("cuIpcGetEventHandle", sys::cuIpcGetEventHandle(&mut h, ev));
    }
    (ev, h.reserved)
}

fn raw_open_event(h: [u8; 64]) -> sys::CUevent {
    let mut ev = std::ptr::null_mut();
    // SAFETY: a live handle from the partner process.
    unsafe {
        ok(
            "cuIpcOpenEventHandle",
            sys::cuIpcOpenEventHandle(&mut ev, sys::CUipcHandle { reserved: h }),
        )
    };
    ev
}

/// The consumer loop (helper process), in `mode` "crate" or "raw".
fn consumer(arg: &str) {
    let (region, mode) = arg.split_once(':').unwrap();
    let shared = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(0).unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let s = stream.as_inner().cast();
    let mut host = [0u8; 64];
    let mut k = 0u64;
    let done = |k: u64| shared.stop_at.load(Ordering::Acquire) == k;
    if mode == "crate" {
        let buf = IpcBuffer::open(&ctx, &shared.mem.load()).unwrap();
        let theirs = IpcEvent::open(&ctx, &shared.producer_event.load()).unwrap();
        let mine = IpcEvent::new(&ctx).unwrap();
        shared.consumer_event.store(mine.handle().unwrap());
        shared.consumer_ready.store(1, Ordering::Release);
        loop {
            k += 1;
            spin(|| shared.seq.load(Ordering::Acquire) >= k);
            theirs.wait_on(&stream).unwrap();
            // SAFETY: `host` outlives the synchronize below.
            let rc = unsafe {
                sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), buf.as_raw_ptr(), host.len(), s)
            };
            ok("cuMemcpyDtoHAsync", rc);
            mine.record(&stream).unwrap();
            stream.synchronize().unwrap();
            shared.ack.store(k, Ordering::Release);
            if done(k) {
                break;
            }
        }
    } else {
        ctx.make_current().unwrap();
        let mut ptr = 0;
        // SAFETY: the producer's live handle.
        unsafe {
            ok(
                "cuIpcOpenMemHandle",
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    sys::CUipcHandle {
                        reserved: shared.raw_mem.load(),
                    },
                    sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
                ),
            )
        };
        let theirs = raw_open_event(shared.raw_producer_event.load());
        let (mine, h) = raw_event();
        shared.raw_consumer_event.store(h);
        shared.consumer_ready.store(1, Ordering::Release);
        loop {
            k += 1;
            spin(|| shared.seq.load(Ordering::Acquire) >= k);
            // SAFETY: live events, stream and mapping; `host` outlives the synchronize.
            unsafe {
                ok("cuStreamWaitEvent", sys::cuStreamWaitEvent(s, theirs, 0));
                ok(
                    "cuMemcpyDtoHAsync",
                    sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, host.len(), s),
                );
                ok("cuEventRecord", sys::cuEventRecord(mine, s));
                ok("cuStreamSynchronize", sys::cuStreamSynchronize(s));
            }
            shared.ack.store(k, Ordering::Release);
            if done(k) {
                break;
            }
        }
    }
}

/// The producer side of one mode.
struct Producer<'m> {
    shared: &'m Shared,
    stream: Stream,
    kernel: cust::function::Function<'m>,
    ptr: u64,
    /// Crate mode: the typed events; raw mode: the raw ones.
    typed: Option<(IpcEvent, IpcEvent)>,
    raw: Option<(sys::CUevent, sys::CUevent)>,
    k: std::cell::Cell<u64>,
    _helper: common::Helper,
}

impl Producer<'_> {
    fn round_trip(&self) {
        let k = self.k.get() + 1;
        self.k.set(k);
        let s = &self.stream;
        let kern = &self.kernel;
        if let Some((mine, theirs)) = &self.typed {
            if k > 1 {
                theirs.wait_on(s).unwrap();
            }
            // SAFETY: simple_kernel writes LEN bytes of the producer's live buffer.
            unsafe { launch!(kern<<<8, 128, 0, s>>>(self.ptr, LEN as i32, k as u32)) }.unwrap();
            mine.record(s).unwrap();
        } else if let Some((mine, theirs)) = self.raw {
            let sr = s.as_inner().cast();
            if k > 1 {
                // SAFETY: live event and stream.
                unsafe { ok("cuStreamWaitEvent", sys::cuStreamWaitEvent(sr, theirs, 0)) };
            }
            // SAFETY: as above.
            unsafe { launch!(kern<<<8, 128, 0, s>>>(self.ptr, LEN as i32, k as u32)) }.unwrap();
            // SAFETY: live event and stream.
            unsafe { ok("cuEventRecord", sys::cuEventRecord(mine, sr)) };
        }
        self.shared.seq.store(k, Ordering::Release);
        spin(|| self.shared.ack.load(Ordering::Acquire) == k);
    }

    fn stop(&self) {
        self.shared
            .stop_at
            .store(self.k.get() + 1, Ordering::Release);
        self.round_trip();
    }
}

fn producer<'m>(
    ctx: &GpuContext,
    module: &'m Module,
    region: &'m cuda_ipc::ShmRegion<Shared>,
    mode: &str,
    own: &IpcBuffer<u8>,
    raw_ptr: u64,
) -> Producer<'m> {
    let shared: &'m Shared = region;
    ctx.make_current().unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let (typed, raw, ptr);
    if mode == "crate" {
        let mine = IpcEvent::new(ctx).unwrap();
        shared.mem.store(own.handle().unwrap());
        shared.producer_event.store(mine.handle().unwrap());
        let helper = common::spawn("consumer", &format!("{}:crate", region.name()));
        common::wait_for("consumer", Duration::from_secs(60), || {
            shared.consumer_ready.load(Ordering::Acquire) == 1
        });
        let theirs = IpcEvent::open(ctx, &shared.consumer_event.load()).unwrap();
        (typed, raw, ptr) = (Some((mine, theirs)), None, own.as_raw_ptr());
        return Producer {
            shared,
            stream,
            kernel: module.get_function("simple_kernel").unwrap(),
            ptr,
            typed,
            raw,
            k: std::cell::Cell::new(0),
            _helper: helper,
        };
    }
    let (mine, h) = raw_event();
    let mut mh = sys::CUipcHandle { reserved: [0; 64] };
    // SAFETY: a raw allocation of this process on the current context.
    unsafe {
        ok(
            "cuIpcGetMemHandle",
            sys::cuIpcGetMemHandle(&mut mh, raw_ptr),
        )
    };
    shared.raw_mem.store(mh.reserved);
    shared.raw_producer_event.store(h);
    let helper = common::spawn("consumer", &format!("{}:raw", region.name()));
    common::wait_for("consumer", Duration::from_secs(60), || {
        shared.consumer_ready.load(Ordering::Acquire) == 1
    });
    let theirs = raw_open_event(shared.raw_consumer_event.load());
    Producer {
        shared,
        stream,
        kernel: module.get_function("simple_kernel").unwrap(),
        ptr: raw_ptr,
        typed: None,
        raw: Some((mine, theirs)),
        k: std::cell::Cell::new(0),
        _helper: helper,
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
    // SAFETY: a raw allocation for the raw protocol, freed at the end.
    unsafe { ok("cuMemAlloc", sys::cuMemAlloc_v2(&mut raw_ptr, LEN)) };

    let region = || {
        ShmOptions::new("cuda-ipc-bench-handoff")
            .random_suffix(true)
            .create::<Shared>()
            .unwrap()
    };
    let (r1, r2) = (region(), region());
    let ours = producer(&ctx, &module, &r1, "crate", &own, raw_ptr);
    let base = producer(&ctx, &module, &r2, "raw", &own, raw_ptr);
    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("handoff_round_trip");
        g.measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_millis(500));
        g.bench_function("cuda_ipc", |b| b.iter(|| ours.round_trip()));
        g.bench_function("raw", |b| b.iter(|| base.round_trip()));
        g.finish();
    }
    c.final_summary();
    if common::is_bench_run() {
        common::header("hand-off round trip, 31 alternating batches of 500");
        let (a, b) = common::sample_pair(31, 500, || ours.round_trip(), || base.round_trip());
        common::row("round trip", &a, &b);
    }
    ours.stop();
    base.stop();
    drop(ours);
    drop(base);
    // SAFETY: allocated above; the consumer that mapped it has exited.
    unsafe { ok("cuMemFree", sys::cuMemFree_v2(raw_ptr)) };
}
