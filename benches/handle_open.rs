//! Handle-open latency, each against the raw driver call it wraps, in the same run:
//!
//! - cold open + close through `IpcBuffer` vs raw `cuIpcOpenMemHandle` + `cuIpcCloseMemHandle`;
//! - cached re-open (the import cache hit) vs the same raw open + close;
//! - event open (+ destroy) through `IpcEvent` vs raw `cuIpcOpenEventHandle` + `cuEventDestroy`;
//! - export: typed handle (envelope, checksum) vs raw `cuIpcGetMemHandle`;
//! - POSIX-fd open + close through `ImportedBuffer::open_fd` vs the raw sequence
//!   `cuMemImportFromShareableHandle`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`,
//!   `cuMemUnmap`, `cuMemAddressFree`, `cuMemRelease` (both duplicate the received descriptor
//!   first, since each open consumes one; the raw side reuses a granularity asked once);
//! - an [`IpcArena`] buffer's open + drop from an arena imported once, against the raw legacy
//!   cold open + close and the raw POSIX-fd import + map above (the driver work the arena saves
//!   per buffer; the goal is ≥ 50× under a legacy cold open and ≤ 1 µs p50);
//! - an [`IpcPool`] buffer's open + drop (`ImportedPool::open`: checks, block entry,
//!   `cuMemPoolImportPointer`, `cuPointerGetAttributes`; drop: `cuMemFree`) against raw
//!   `cuMemPoolImportPointer` + `cuMemFree` on a raw import of the same pool, and against those
//!   raw calls plus the allocation's range (`cuPointerGetAttributes`, start and size: the check a
//!   sound import cannot skip, with the call the crate makes); then the same
//!   for buffers opened once each (each import maps memory new to the process: what a first
//!   open of a buffer costs), one sample per open, alternating sides;
//! - a `HandleType::Pool` buffer's open + drop as [`FdSocket::recv_buffer`] makes it, the pool
//!   imported before (`ImportedBuffer::open_pooled`: the pool's handle admitted, the import
//!   shared, the arriving descriptor closed; then as the pool row) against the raw pointer
//!   import + free and the descriptor's close.
//!
//! A helper process, started once outside the measurement, exports a 64 MiB buffer and an
//! event, sends a 64 MiB POSIX-fd buffer and a 64 MiB arena over a socket, and the handle of
//! a 1 MiB buffer in the arena; then a pool (twice: one import for each side) and the handle of
//! a 1 MiB buffer allocated from it, and of 64 buffers of 64 MiB for the cold pool row. Run:
//! `cargo bench --bench handle_open`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use cuda_ipc::arena::{ArenaHandle, ImportedArena, IpcArena};
use cuda_ipc::driver::sys;
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
use cuda_ipc::pool::{ImportedPool, IpcPool, IpcPoolHandle, PoolHandle};
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{
    GpuContext, HandleType, ImportedBuffer, ImportedEvent, IpcBuffer, IpcEvent, IpcEventHandle,
    IpcMemHandle, RawStream, ShmSafe,
};

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u8>>,
    event: ShmCell<IpcEventHandle>,
    raw_mem: ShmCell<[u8; 64]>,
    raw_event: ShmCell<[u8; 64]>,
    ready: AtomicU32,
}

/// Pool buffers opened once each, by each side, for the cold-open row; and their size, larger
/// than a pool's chunk so that each lies in memory of its own.
const COLD_POOL_OPENS: usize = 32;
const COLD_POOL_BYTES: usize = 64 << 20;

fn exporter(region: &str) {
    let shared = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = GpuContext::new(0).unwrap();
    let buf = IpcBuffer::<u8>::zeroed(&ctx, 64 << 20).unwrap();
    let event = IpcEvent::new(&ctx).unwrap();
    shared.mem.store(buf.handle().unwrap());
    shared.event.store(event.handle().unwrap());
    ctx.make_current().unwrap();
    let mut h = sys::CUipcHandle { reserved: [0; 64] };
    let mut ev = std::ptr::null_mut();
    // SAFETY: raw driver calls with valid out-pointers, on the current context.
    unsafe {
        common::ok(
            "cuIpcGetMemHandle",
            sys::cuIpcGetMemHandle(&mut h, buf.as_raw_ptr()),
        );
        shared.raw_mem.store(h.reserved);
        common::ok(
            "cuEventCreate",
            sys::cuEventCreate(
                &mut ev,
                sys::CU_EVENT_INTERPROCESS | sys::CU_EVENT_DISABLE_TIMING,
            ),
        );
        common::ok("cuIpcGetEventHandle", sys::cuIpcGetEventHandle(&mut h, ev));
    }
    shared.raw_event.store(h.reserved);
    let fd_buf = IpcBuffer::<u8>::zeroed_with(&ctx, 64 << 20, HandleType::PosixFd).unwrap();
    let socket = FdSocket::connect(
        &fd_socket_name(region),
        &PeerPolicy::SameUid,
        Duration::from_secs(60),
    )
    .unwrap();
    socket
        .send_buffer(&fd_buf, Duration::from_secs(60))
        .unwrap();
    let arena = IpcArena::new(&ctx, 64 << 20).unwrap();
    let block = arena.alloc_zeroed::<u8>(1 << 20).unwrap();
    socket.send_arena(&arena, Duration::from_secs(60)).unwrap();
    socket
        .send(block.handle().as_bytes(), &[], Duration::from_secs(60))
        .unwrap();
    let pool = IpcPool::new(&ctx).unwrap();
    let pooled = pool.alloc::<u8>(1 << 20, &RawStream::LEGACY).unwrap();
    socket.send_pool(&pool, Duration::from_secs(60)).unwrap();
    socket.send_pool(&pool, Duration::from_secs(60)).unwrap();
    socket
        .send(
            pooled.handle().unwrap().as_bytes(),
            &[],
            Duration::from_secs(60),
        )
        .unwrap();
    // Buffers each opened once, so that each import maps memory the importer has not mapped.
    let cold: Vec<_> = (0..2 * COLD_POOL_OPENS)
        .map(|_| {
            pool.alloc::<u8>(COLD_POOL_BYTES, &RawStream::LEGACY)
                .unwrap()
        })
        .collect();
    for buf in &cold {
        socket
            .send(
                buf.handle().unwrap().as_bytes(),
                &[],
                Duration::from_secs(60),
            )
            .unwrap();
    }
    shared.ready.store(1, Ordering::Release);
    std::thread::sleep(Duration::from_secs(3600));
}

/// The minimum granularity of pinned device-0 memory exportable as a descriptor.
fn device0_granularity() -> usize {
    let prop = sys::CUmemAllocationProp {
        kind: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            kind: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    };
    let mut g = 0;
    // SAFETY: reads `prop`, writes one size; a context is current.
    common::ok("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(&mut g, &prop, sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    });
    g
}

/// A pool imported from its descriptor with the raw call (a context is current).
fn raw_import_pool(fd: &OwnedFd) -> sys::CUmemoryPool {
    let mut pool = std::ptr::null_mut();
    // SAFETY: the descriptor's number passed as the shareable handle; writes one pool handle.
    common::ok("cuMemPoolImportFromShareableHandle", unsafe {
        sys::cuMemPoolImportFromShareableHandle(
            &mut pool,
            fd.as_raw_fd() as usize as *mut std::ffi::c_void,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    });
    pool
}

fn fd_socket_name(region: &str) -> SocketName {
    SocketName::Abstract(format!("{region}-fd"))
}

struct Fixture {
    ctx: GpuContext,
    mem: IpcMemHandle<u8>,
    event: IpcEventHandle,
    raw_mem: sys::CUipcHandle,
    raw_event: sys::CUipcHandle,
    own: IpcBuffer<u8>,
    fd_mem: IpcMemHandle<u8>,
    fd: OwnedFd,
    /// Bytes the helper's POSIX-fd allocation maps, and the granularity (asked once).
    fd_bytes: usize,
    granularity: usize,
    arena: ImportedArena,
    block: ArenaHandle<u8>,
    pool: ImportedPool,
    pooled: PoolHandle<u8>,
    /// The same pool imported with raw calls, and the buffer's export data.
    raw_pool: sys::CUmemoryPool,
    /// The pool's handle and a descriptor of it, as a `HandleType::Pool` buffer arrives with.
    pool_handle: IpcPoolHandle,
    pool_fd: OwnedFd,
    raw_pooled: sys::CUmemPoolPtrExportData,
    /// Handles of pool buffers not opened yet (pairs: one for each side), for the cold row.
    cold_pooled: Vec<PoolHandle<u8>>,
}

impl Fixture {
    fn raw_open_close(&self) {
        // SAFETY: the helper's live handle, on the current context.
        unsafe { common::raw_open_close(self.raw_mem) }
    }
    fn ours_open_close(&self) {
        drop(ImportedBuffer::open(&self.ctx, &self.mem).unwrap());
    }
    fn raw_event_open(&self) {
        let mut ev = std::ptr::null_mut();
        // SAFETY: the helper's live event handle; the opened event is destroyed at once.
        unsafe {
            common::ok(
                "cuIpcOpenEventHandle",
                sys::cuIpcOpenEventHandle(&mut ev, self.raw_event),
            );
            common::ok("cuEventDestroy", sys::cuEventDestroy_v2(ev));
        }
    }
    fn ours_event_open(&self) {
        drop(ImportedEvent::open(&self.ctx, &self.event).unwrap());
    }
    fn raw_export(&self) -> sys::CUipcHandle {
        let mut h = sys::CUipcHandle { reserved: [0; 64] };
        // SAFETY: a buffer this process allocated, on the current context.
        unsafe {
            common::ok(
                "cuIpcGetMemHandle",
                sys::cuIpcGetMemHandle(&mut h, self.own.as_raw_ptr()),
            )
        };
        h
    }
    fn ours_export(&self) -> IpcMemHandle<u8> {
        self.own.handle().unwrap()
    }
    fn ours_pool_open_close(&self) {
        self.ours_pool_open_close_of(&self.pooled);
    }
    fn ours_pool_open_close_of(&self, h: &PoolHandle<u8>) {
        drop(std::hint::black_box(self.pool.open(h).unwrap()));
    }
    fn raw_pool_open_close(&self) {
        self.raw_pool_open_close_of(self.raw_pooled);
    }
    fn raw_pool_open_close_of(&self, mut data: sys::CUmemPoolPtrExportData) {
        let mut p = 0;
        // SAFETY: the helper's live allocation of a pool imported here; imported and freed once
        // on the current context.
        unsafe {
            common::ok(
                "cuMemPoolImportPointer",
                sys::cuMemPoolImportPointer(&mut p, self.raw_pool, &mut data),
            );
            common::ok("cuMemFree", sys::cuMemFree_v2(p));
        }
    }
    /// The raw calls plus the one check a sound import cannot skip: the size the driver
    /// reports for the imported allocation (`cuPointerGetAttributes`), since a handle's length
    /// is not trusted. The floor under `ours_pool_open_close`.
    fn raw_checked_pool_open_close(&self) {
        let mut data = self.raw_pooled;
        let (mut p, mut base, mut size): (sys::CUdeviceptr, sys::CUdeviceptr, usize) = (0, 0, 0);
        let mut which = [
            sys::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            sys::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut out: [*mut std::ffi::c_void; 2] = [(&raw mut base).cast(), (&raw mut size).cast()];
        // SAFETY: as in `raw_pool_open_close_of`; the range query writes one pointer and one
        // size, each to the slot of its type.
        unsafe {
            common::ok(
                "cuMemPoolImportPointer",
                sys::cuMemPoolImportPointer(&mut p, self.raw_pool, &mut data),
            );
            common::ok(
                "cuPointerGetAttributes",
                sys::cuPointerGetAttributes(2, which.as_mut_ptr(), out.as_mut_ptr(), p),
            );
            assert!(
                base == p && size >= 1 << 20,
                "{base:#x} {p:#x} {size} bytes"
            );
            common::ok("cuMemFree", sys::cuMemFree_v2(p));
        }
    }
    /// A `HandleType::Pool` buffer as `recv_buffer` opens it, the pool imported before: the
    /// pool's handle admitted and its import shared (the descriptor, duplicated first as it
    /// arrives per message, closed), then the buffer opened; dropped.
    fn ours_pooled_buffer_open_close(&self) {
        let fd = self.pool_fd.try_clone().unwrap();
        drop(std::hint::black_box(
            ImportedBuffer::open_pooled(&self.ctx, &self.pool_handle, fd, &self.pooled).unwrap(),
        ));
    }
    /// The raw calls of the same: a descriptor that arrives and is closed, the pointer's
    /// import and free.
    fn raw_pooled_buffer_open_close(&self) {
        drop(self.pool_fd.try_clone().unwrap());
        self.raw_pool_open_close();
    }
    fn ours_arena_open_close(&self) {
        drop(std::hint::black_box(self.arena.open(&self.block).unwrap()));
    }
    fn ours_fd_open_close(&self) {
        let fd = self.fd.try_clone().unwrap();
        drop(ImportedBuffer::open_fd(&self.ctx, &self.fd_mem, fd).unwrap());
    }
    fn raw_fd_open_close(&self) {
        let fd = self.fd.try_clone().unwrap();
        let (size, mut handle, mut p) = (self.fd_bytes, 0, 0);
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                kind: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                id: 0,
            },
            flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the helper's live allocation, imported from a descriptor we own, mapped into
        // a range reserved here, and torn down in order on the current context.
        unsafe {
            common::ok(
                "cuMemImportFromShareableHandle",
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                    sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                ),
            );
            drop(fd);
            common::ok(
                "cuMemAddressReserve",
                sys::cuMemAddressReserve(&mut p, size, self.granularity, 0, 0),
            );
            common::ok("cuMemMap", sys::cuMemMap(p, size, 0, handle, 0));
            common::ok("cuMemSetAccess", sys::cuMemSetAccess(p, size, &access, 1));
            common::ok("cuMemUnmap", sys::cuMemUnmap(p, size));
            common::ok("cuMemAddressFree", sys::cuMemAddressFree(p, size));
            common::ok("cuMemRelease", sys::cuMemRelease(handle));
        }
    }
}

fn benches(c: &mut Criterion, f: &Fixture) {
    let mut g = c.benchmark_group("handle_open");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g.bench_function("cold_open_close/cuda_ipc", |b| {
        b.iter(|| f.ours_open_close())
    });
    g.bench_function("cold_open_close/raw", |b| b.iter(|| f.raw_open_close()));
    {
        let _keep = ImportedBuffer::open(&f.ctx, &f.mem).unwrap();
        g.bench_function("cached_reopen/cuda_ipc", |b| b.iter(|| f.ours_open_close()));
    }
    g.bench_function("event_open/cuda_ipc", |b| b.iter(|| f.ours_event_open()));
    g.bench_function("event_open/raw", |b| b.iter(|| f.raw_event_open()));
    g.bench_function("export/cuda_ipc", |b| {
        b.iter(|| std::hint::black_box(f.ours_export()))
    });
    g.bench_function("export/raw", |b| {
        b.iter(|| std::hint::black_box(f.raw_export()))
    });
    g.bench_function("fd_open_close/cuda_ipc", |b| {
        b.iter(|| f.ours_fd_open_close())
    });
    g.bench_function("fd_open_close/raw", |b| b.iter(|| f.raw_fd_open_close()));
    g.bench_function("arena_open_close/cuda_ipc", |b| {
        b.iter(|| f.ours_arena_open_close())
    });
    g.bench_function("pool_open_close/cuda_ipc", |b| {
        b.iter(|| f.ours_pool_open_close())
    });
    g.bench_function("pool_open_close/raw", |b| {
        b.iter(|| f.raw_pool_open_close())
    });
    g.finish();
}

fn summary(f: &Fixture) {
    common::header("handle_open, 31 alternating batches each");
    let (ours, base) = common::sample_pair(31, 100, || f.ours_open_close(), || f.raw_open_close());
    common::row("cold open + close", &ours, &base);
    {
        // The goal compares a cache hit with the driver's cold open + close (`base` above).
        // (While a mapping is held, a raw re-open in the same context is also cheap: the driver
        // refcounts it; that row shows the driver's own refcounted re-open.)
        let _keep = ImportedBuffer::open(&f.ctx, &f.mem).unwrap();
        let (cached, refcounted) =
            common::sample_pair(31, 10_000, || f.ours_open_close(), || f.raw_open_close());
        common::row("cached re-open vs raw cold", &cached, &base);
        common::row("cached re-open vs raw re-open", &cached, &refcounted);
    }
    let (ours, base) =
        common::sample_pair(31, 2_000, || f.ours_event_open(), || f.raw_event_open());
    common::row("event open + destroy", &ours, &base);
    let (ours, base) = common::sample_pair(
        31,
        10_000,
        || {
            std::hint::black_box(f.ours_export());
        },
        || {
            std::hint::black_box(f.raw_export());
        },
    );
    common::row("export", &ours, &base);
    let (ours, base) =
        common::sample_pair(31, 100, || f.ours_fd_open_close(), || f.raw_fd_open_close());
    common::row("POSIX-fd open + close", &ours, &base);
    let (arena, legacy) = common::sample_pair(
        31,
        100,
        || {
            for _ in 0..100 {
                f.ours_arena_open_close();
            }
        },
        || f.raw_open_close(),
    );
    let per_open: Vec<f64> = arena.iter().map(|x| x / 100.0).collect();
    common::row("arena open vs legacy raw", &per_open, &legacy);
    let (arena, fd) = common::sample_pair(
        31,
        100,
        || {
            for _ in 0..100 {
                f.ours_arena_open_close();
            }
        },
        || f.raw_fd_open_close(),
    );
    let per_open: Vec<f64> = arena.iter().map(|x| x / 100.0).collect();
    common::row("arena open vs POSIX-fd raw", &per_open, &fd);
    let (ours, base) = common::sample_pair(
        31,
        1_000,
        || f.ours_pool_open_close(),
        || f.raw_pool_open_close(),
    );
    common::row("pool buffer open + close", &ours, &base);
    let (ours, checked) = common::sample_pair(
        31,
        1_000,
        || f.ours_pool_open_close(),
        || f.raw_checked_pool_open_close(),
    );
    common::row("pool open vs raw + size check", &ours, &checked);
    let (ours, base) = common::sample_pair(
        31,
        1_000,
        || f.ours_pooled_buffer_open_close(),
        || f.raw_pooled_buffer_open_close(),
    );
    common::row("HandleType::Pool buffer open + close", &ours, &base);
    // Each buffer once: the import maps memory new to this process (one sample per open).
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for (i, pair) in f.cold_pooled.chunks_exact(2).enumerate() {
        let mut time_ours = || {
            let t = Instant::now();
            f.ours_pool_open_close_of(&pair[0]);
            ours.push(t.elapsed().as_nanos() as f64);
        };
        let data = pool_export_data(&pair[1]);
        let mut time_raw = || {
            let t = Instant::now();
            f.raw_pool_open_close_of(data);
            base.push(t.elapsed().as_nanos() as f64);
        };
        if i % 2 == 0 {
            time_ours();
            time_raw();
        } else {
            time_raw();
            time_ours();
        }
    }
    ours.sort_by(f64::total_cmp);
    base.sort_by(f64::total_cmp);
    common::row("pool buffer cold open", &ours, &base);
}

/// The driver's export data in a pool handle: bytes 64..128 (see `RawPoolHandle`).
fn pool_export_data(h: &PoolHandle<u8>) -> sys::CUmemPoolPtrExportData {
    sys::CUmemPoolPtrExportData {
        reserved: h.as_bytes()[64..128].try_into().unwrap(),
    }
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "exporter");
        exporter(&arg);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("handle_open") else {
        return;
    };
    let shared = ShmOptions::new("cuda-ipc-bench-open")
        .random_suffix(true)
        .create::<Shared>()
        .unwrap();
    let listener = FdListener::bind(fd_socket_name(shared.name()), PeerPolicy::SameUid).unwrap();
    let _helper = common::spawn("exporter", shared.name());
    let socket = listener.accept(Duration::from_secs(60)).unwrap();
    let mut msg = socket.recv(Duration::from_secs(60)).unwrap();
    let fd_mem = IpcMemHandle::<u8>::from_bytes(&msg.payload).unwrap();
    let fd = msg.fds.pop().expect("a descriptor with the fd handle");
    let arena = socket.recv_arena(&ctx, Duration::from_secs(60)).unwrap();
    let block =
        ArenaHandle::<u8>::from_bytes(&socket.recv(Duration::from_secs(60)).unwrap().payload)
            .unwrap();
    let pool = socket.recv_pool(&ctx, Duration::from_secs(60)).unwrap();
    let mut raw_pool_msg = socket.recv(Duration::from_secs(60)).unwrap();
    let raw_pool_fd = raw_pool_msg.fds.pop().expect("the pool's descriptor");
    let pool_handle = IpcPoolHandle::from_bytes(&raw_pool_msg.payload).unwrap();
    let pooled =
        PoolHandle::<u8>::from_bytes(&socket.recv(Duration::from_secs(60)).unwrap().payload)
            .unwrap();
    let raw_pooled = pool_export_data(&pooled);
    let cold_pooled = (0..2 * COLD_POOL_OPENS)
        .map(|_| {
            PoolHandle::<u8>::from_bytes(&socket.recv(Duration::from_secs(60)).unwrap().payload)
                .unwrap()
        })
        .collect();
    common::wait_for("exporter", Duration::from_secs(60), || {
        shared.ready.load(Ordering::Acquire) == 1
    });
    // The granularity and the helper's mapped size, as a raw user would learn them once.
    ctx.make_current().unwrap();
    let granularity = device0_granularity();
    let fd_bytes = fd_mem.len().next_multiple_of(granularity);
    let f = Fixture {
        own: IpcBuffer::<u8>::new(&ctx, 64 << 20).unwrap(),
        ctx,
        mem: shared.mem.load(),
        event: shared.event.load(),
        raw_mem: sys::CUipcHandle {
            reserved: shared.raw_mem.load(),
        },
        raw_event: sys::CUipcHandle {
            reserved: shared.raw_event.load(),
        },
        fd_mem,
        fd,
        fd_bytes,
        granularity,
        arena,
        block,
        pool,
        pooled,
        raw_pool: raw_import_pool(&raw_pool_fd),
        pool_handle,
        pool_fd: raw_pool_fd,
        raw_pooled,
        cold_pooled,
    };
    f.ctx.make_current().unwrap(); // for the raw calls
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &f);
    c.final_summary();
    if common::is_bench_run() {
        summary(&f);
    }
}
