//! Leak checks on the GPU: 10,000 export / open / drop cycles between two processes (file
//! descriptors, `/dev/shm` entries and free GPU memory unchanged), the same for 2,000 POSIX-fd
//! buffers sent over a socket (the exporter dropping each while the importer still maps it),
//! and for 2,000 `HandleType::Pool` buffers (each cycle its own pool, imported once),
//! a killed importer's lease reaped with the memory back to baseline, and 1,000 arenas created,
//! imported, carved into buffers and viewed (half freed while viewed) with nothing left behind,
//! 2,000 pool buffers each freed by its owner while the importer still held it, and 2,000
//! legacy buffers each dropped by its exporter while mapped (the free deferred, done by
//! `collect_deferred` once the importer let go), and 1,000 buffers never exported leaving
//! nothing in `/dev/shm`.
//!
//! GPU tests, `#[ignore = "requires a CUDA device"]`, in their own binary and serialised by a
//! lock: free device memory is device-wide, so no other test may run beside them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    fd_count, gpu, report, shm_entries, shm_entries_but_registry, spawn, unique_name, wait_for,
    watchdog,
};
use cuda_ipc::arena::{ImportedArena, IpcArena};
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
use cuda_ipc::pool::{IpcPool, PoolHandle};
use cuda_ipc::shm::{ShmCell, ShmOptions};
use cuda_ipc::{HandleType, ImportedBuffer, IpcBuffer, IpcMemHandle, RawStream, ShmSafe};

/// Serialises this binary's tests: they measure device-wide free memory.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Wait up to 2 s for device free memory to come back to `baseline` (minus `slack`).
fn wait_for_free_memory(ctx: &cuda_ipc::GpuContext, baseline: usize, slack: usize) -> usize {
    let start = Instant::now();
    loop {
        let free = ctx.mem_info().unwrap().0;
        if free + slack >= baseline || start.elapsed() > Duration::from_secs(2) {
            return free;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

const CYCLES: u64 = 10_000;
const WARMUP: u64 = 100;
const LEN: usize = 64 << 10;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u8>>,
    seq: AtomicU64,
    ack: AtomicU64,
    done: AtomicU64,
}

/// The checks both soaks end with: the importer's descriptors (after the warm-up → at the end),
/// no lease table left, device free memory back (before the exporter started → after it
/// exited), and the exporter's descriptors from its report ("fds A B free C D"). Returns the
/// exporter's free-memory pair (C, D) for the caller's own bound.
fn assert_soak_leaked_nothing(
    (fds0, fds1): (usize, usize),
    lease_tables_left: usize,
    (free_start, free1): (usize, usize),
    exporter_report: &str,
) -> (usize, usize) {
    assert!(
        fds1 <= fds0,
        "importer file descriptors leaked: {fds0} -> {fds1}"
    );
    assert_eq!(lease_tables_left, 0, "lease tables left in /dev/shm");
    assert!(
        free1 + (4 << 20) >= free_start,
        "device free memory {free1} did not return to {free_start}"
    );
    let v: Vec<usize> = exporter_report
        .split(' ')
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(v.len(), 4, "exporter report {exporter_report:?}");
    assert!(v[1] <= v[0], "exporter file descriptors leaked");
    (v[2], v[3])
}

fn spin_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "stuck waiting for {what}"
        );
        std::thread::yield_now();
    }
}

const FD_CYCLES: u64 = 2_000;
const T: Duration = Duration::from_secs(30);

/// The POSIX-fd and pool-buffer soaks' exporter (`kind` "fd" or "pool"): per cycle a new
/// buffer, sent; dropped once the importer says it mapped it (so the importer reads after the
/// drop); the next cycle once the importer let it go. A dropped pool buffer waits in
/// quarantine, and its pool with it (it has no other buffer), until the next allocation's
/// scan frees both: each cycle makes a pool, which the importer imports.
fn fd_exporter(socket: &str, kind: &str) -> i32 {
    let handle_type = if kind == "pool" {
        HandleType::Pool
    } else {
        HandleType::PosixFd
    };
    let ctx = gpu();
    let name = SocketName::Abstract(socket.to_owned());
    let s = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
    let mut baseline = (0, 0);
    for i in 0..FD_CYCLES {
        if i == WARMUP {
            baseline = (fd_count(), ctx.mem_info().unwrap().0);
        }
        let buf = IpcBuffer::<u8>::new_with(&ctx, LEN, handle_type).unwrap();
        buf.memset_bytes((i % 251) as u8).unwrap();
        s.send_buffer(&buf, T).unwrap();
        assert_eq!(s.recv(T).unwrap().payload, b"mapped");
        drop(buf);
        s.send(b"dropped", &[], T).unwrap();
        assert_eq!(s.recv(T).unwrap().payload, b"closed");
    }
    let left = cuda_ipc::collect_deferred();
    assert_eq!(
        left.pending, 0,
        "{kind}: nothing waits once the importer let go"
    );
    let end = (fd_count(), ctx.mem_info().unwrap().0);
    report(format!(
        "fds {} {} free {} {}",
        baseline.0, end.0, baseline.1, end.1
    ));
    0
}

/// The pool soak's owner: one pool, sent once; per cycle a buffer, its handle sent, dropped
/// while the importer holds it (quarantined), and freed by `collect` once the importer let go.
fn pool_owner(socket: &str) -> i32 {
    let ctx = gpu();
    let name = SocketName::Abstract(socket.to_owned());
    let s = FdSocket::connect(&name, &PeerPolicy::SameUid, T).unwrap();
    let pool = IpcPool::new(&ctx).unwrap();
    s.send_pool(&pool, T).unwrap();
    let mut baseline = (0, 0);
    for i in 0..FD_CYCLES {
        if i == WARMUP {
            baseline = (fd_count(), ctx.mem_info().unwrap().0);
        }
        let buf = pool.alloc::<u8>(LEN, &RawStream::LEGACY).unwrap();
        buf.memset_bytes((i % 251) as u8).unwrap();
        s.send(buf.handle().unwrap().as_bytes(), &[], T).unwrap();
        assert_eq!(s.recv(T).unwrap().payload, b"opened");
        drop(buf);
        assert_eq!(pool.collect(), 1, "cycle {i}: held by the importer");
        s.send(b"dropped", &[], T).unwrap();
        assert_eq!(s.recv(T).unwrap().payload, b"closed");
        assert_eq!(
            pool.collect(),
            0,
            "cycle {i}: freed once the importer let go"
        );
    }
    let end = (fd_count(), ctx.mem_info().unwrap().0);
    report(format!(
        "fds {} {} free {} {}",
        baseline.0, end.0, baseline.1, end.1
    ));
    0
}

/// The two legacy soaks' step numbers in the shared region for cycle `i`: the importer has the
/// buffer open at the first, has let it go at the second. With `deferred` the exporter drops
/// its buffer between the two (so they differ); without, it closes it after the importer let
/// go (one step).
fn steps(i: u64, deferred: bool) -> (u64, u64) {
    let k = i + 1;
    if deferred { (2 * k - 1, 2 * k) } else { (k, k) }
}

/// The legacy soaks' exporter: per cycle a `cuMemAlloc` buffer, its handle published. Without
/// `deferred`: closed once the importer let go. With it: dropped once the importer has it open
/// (the drop must return at once, the free deferred), freed by `collect_deferred` once the
/// importer has read it and let go.
fn legacy_exporter(region: &str, deferred: bool) -> i32 {
    let shared = ShmOptions::new(region).open::<Shared>().unwrap();
    let ctx = gpu();
    let cycles = if deferred { FD_CYCLES } else { CYCLES };
    let mut baseline = (0, 0);
    let mut slowest_drop = Duration::ZERO;
    for i in 0..cycles {
        if i == WARMUP {
            baseline = (fd_count(), ctx.mem_info().unwrap().0);
        }
        let (opened, closed) = steps(i, deferred);
        let buf = IpcBuffer::<u8>::new(&ctx, LEN).unwrap();
        buf.memset_bytes((i % 251) as u8).unwrap();
        shared.mem.store(buf.handle().unwrap());
        shared.seq.store(opened, Ordering::Release);
        spin_until("importer", || shared.ack.load(Ordering::Acquire) == opened);
        if !deferred {
            buf.close(Duration::ZERO).unwrap();
            continue;
        }
        let t = Instant::now();
        drop(buf);
        slowest_drop = slowest_drop.max(t.elapsed());
        let left = cuda_ipc::collect_deferred();
        assert_eq!(
            (left.freed, left.pending, left.pending_bytes),
            (0, 1, LEN),
            "cycle {i}: mapped by the importer"
        );
        shared.seq.store(closed, Ordering::Release);
        spin_until("close", || shared.ack.load(Ordering::Acquire) == closed);
        let left = cuda_ipc::collect_deferred();
        assert_eq!(
            (left.freed, left.pending),
            (1, 0),
            "cycle {i}: freed once the importer let go"
        );
    }
    let end = (fd_count(), ctx.mem_info().unwrap().0);
    if deferred {
        eprintln!("deferred soak: slowest drop {slowest_drop:?}");
        assert!(
            slowest_drop < Duration::from_millis(50),
            "a drop waited {slowest_drop:?}"
        );
    }
    report(format!(
        "fds {} {} free {} {}",
        baseline.0, end.0, baseline.1, end.1
    ));
    0
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        if role == "fd_exporter" {
            return fd_exporter(&args[0], &args[1]);
        }
        if role == "pool_owner" {
            return pool_owner(&args[0]);
        }
        if role == "exporter" || role == "deferred_exporter" {
            return legacy_exporter(&args[0], role == "deferred_exporter");
        }
        let shared = ShmOptions::new(&args[0])
            .open::<Shared>()
            .expect("open region");
        let ctx = gpu();
        if role == "open_and_sleep" {
            let buf = ImportedBuffer::open(&ctx, &shared.mem.load()).unwrap();
            shared.done.store(buf.as_raw_ptr(), Ordering::Release);
            std::thread::sleep(Duration::from_secs(50));
            return 1;
        }
        panic!("unknown role {role}");
    });
}

/// The importer's side of the two legacy soaks (see [`legacy_exporter`]): per cycle open the
/// exporter's buffer, check its contents (with `deferred`, after the exporter dropped it), let
/// it go; then check that nothing leaked on either side.
fn legacy_soak(deferred: bool) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let what = if deferred { "deferred soak" } else { "soak" };
    let _dog = watchdog(what, Duration::from_secs(400));
    let ctx = gpu();
    let shared = ShmOptions::new(unique_name("soak"))
        .create::<Shared>()
        .unwrap();
    let (free_start, _) = ctx.mem_info().unwrap();
    let role = if deferred {
        "deferred_exporter"
    } else {
        "exporter"
    };
    let exporter = spawn(role, &[shared.name()]);
    let cycles = if deferred { FD_CYCLES } else { CYCLES };
    let mut host = vec![0u8; LEN];
    let mut baseline = None;
    let start = Instant::now();
    for i in 0..cycles {
        if i == WARMUP {
            baseline = Some((fd_count(), shm_entries_but_registry("cuda-ipc-lease").len()));
        }
        let (opened, closed) = steps(i, deferred);
        spin_until("exporter", || shared.seq.load(Ordering::Acquire) == opened);
        let buf = ImportedBuffer::open_exact(&ctx, &shared.mem.load(), LEN).unwrap();
        if deferred {
            shared.ack.store(opened, Ordering::Release);
            // Once the exporter has dropped its buffer, our mapping still reads it.
            spin_until("drop", || shared.seq.load(Ordering::Acquire) == closed);
        }
        buf.copy_to_host(&mut host).unwrap();
        assert!(
            host.iter().all(|&b| u64::from(b) == i % 251),
            "cycle {i}: wrong data"
        );
        drop(buf);
        shared.ack.store(closed, Ordering::Release);
    }
    let elapsed = start.elapsed();
    let results = exporter.expect_success(Duration::from_secs(60));
    let (fds0, shm0) = baseline.unwrap();
    let (fds1, shm1) = (fd_count(), shm_entries_but_registry("cuda-ipc-lease").len());
    // Device-wide free memory: before the exporter started, and after it exited.
    let free1 = wait_for_free_memory(&ctx, free_start, 4 << 20);
    eprintln!(
        "{what}: {cycles} cycles in {:.2} s ({:.0} µs/cycle); importer fds {fds0}->{fds1}, lease \
         tables {shm0}->{shm1}, device free memory {free_start}->{free1}; exporter: {}",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / cycles as f64,
        results[0]
    );
    assert!(
        shm0 <= 2,
        "at most the current cycle's tables exist mid-run, found {shm0}"
    );
    let (exporter_free0, exporter_free1) =
        assert_soak_leaked_nothing((fds0, fds1), shm1, (free_start, free1), &results[0]);
    assert_eq!(
        exporter_free0, exporter_free1,
        "exporter-side free GPU memory changed"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn ten_thousand_export_open_drop_cycles_leak_nothing() {
    legacy_soak(false);
}

#[test]
#[ignore = "requires a CUDA device"]
fn two_thousand_buffers_dropped_while_mapped_are_freed_once_unmapped() {
    legacy_soak(true);
}

/// Lease state costs two files per process, whatever the number of exports: 1,000 buffers never exported hold nothing in `/dev/shm` and no descriptor; exporting
/// all of them adds at most this process's export registry (its two files, once) and no
/// descriptor; dropping them leaves the registry for later exports.
#[test]
#[ignore = "requires a CUDA device"]
fn a_thousand_exports_cost_two_files_per_process() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _dog = watchdog("thousand exports", Duration::from_secs(120));
    let ctx = gpu();
    let entries = || shm_entries("cuda-ipc-").len();
    let (fds0, shm0) = (fd_count(), entries());
    let t = Instant::now();
    let bufs: Vec<_> = (0..1000)
        .map(|_| IpcBuffer::<u8>::new(&ctx, 4096).unwrap())
        .collect();
    let per_new = t.elapsed() / 1000;
    let (fds1, shm1) = (fd_count(), entries());
    assert_eq!(shm1, shm0, "files in /dev/shm for buffers never exported");
    assert!(
        fds1 < fds0 + 100,
        "descriptors per buffer: {fds0} -> {fds1}"
    );
    let had_registry = !cuda_ipc::__private::registry::names().is_empty();
    let t = Instant::now();
    let handles: Vec<_> = bufs.iter().map(|b| b.handle().unwrap()).collect();
    let per_export = t.elapsed() / 1000;
    assert_eq!(
        handles[7].as_bytes(),
        bufs[7].handle().unwrap().as_bytes(),
        "exporting again gives the same handle"
    );
    let (fds2, shm2) = (fd_count(), entries());
    eprintln!(
        "1,000 buffers: {per_new:?} per new, {per_export:?} per first export; fds \
         {fds0}->{fds1}->{fds2}; /dev/shm entries {shm0}->{shm1}->{shm2} (registry existed \
         before: {had_registry})"
    );
    assert_eq!(cuda_ipc::__private::registry::names().len(), 2);
    let expected = if had_registry { shm0 } else { shm0 + 2 };
    assert_eq!(
        shm2, expected,
        "1,000 exports: at most the registry's two files"
    );
    assert!(
        fds2 <= fds1,
        "a descriptor kept per export: {fds1} -> {fds2}"
    );
    drop((handles, bufs));
    assert_eq!(entries(), shm2, "the registry stays for later exports");
}

#[test]
#[ignore = "requires a CUDA device"]
fn two_thousand_fd_buffers_outliving_their_exporter_leak_nothing() {
    buffer_soak("fd");
}

#[test]
#[ignore = "requires a CUDA device"]
fn two_thousand_pool_kind_buffers_outliving_their_exporter_leak_nothing() {
    buffer_soak("pool");
}

/// The importer's side of the POSIX-fd and pool-buffer soaks (see [`fd_exporter`]).
fn buffer_soak(kind: &str) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _dog = watchdog("buffer soak", Duration::from_secs(300));
    let ctx = gpu();
    let socket = unique_name("fd-soak");
    let listener =
        FdListener::bind(SocketName::Abstract(socket.clone()), PeerPolicy::SameUid).unwrap();
    let (free_start, _) = ctx.mem_info().unwrap();
    let exporter = spawn("fd_exporter", &[&socket, kind]);
    let s = listener.accept(T).unwrap();
    let mut host = vec![0u8; LEN];
    let mut baseline = None;
    let start = Instant::now();
    for i in 0..FD_CYCLES {
        if i == WARMUP {
            baseline = Some((fd_count(), shm_entries_but_registry("cuda-ipc-lease").len()));
        }
        let buf = s.recv_buffer::<u8>(&ctx, T).unwrap();
        s.send(b"mapped", &[], T).unwrap();
        assert_eq!(s.recv(T).unwrap().payload, b"dropped");
        // The exporter has dropped its buffer: this mapping holds the memory.
        buf.copy_to_host(&mut host).unwrap();
        assert!(
            host.iter().all(|&b| u64::from(b) == i % 251),
            "cycle {i}: wrong data after the exporter's drop"
        );
        drop(buf);
        s.send(b"closed", &[], T).unwrap();
    }
    let elapsed = start.elapsed();
    let results = exporter.expect_success(Duration::from_secs(60));
    drop((s, listener));
    let (fds0, shm0) = baseline.unwrap();
    let (fds1, shm1) = (fd_count(), shm_entries_but_registry("cuda-ipc-lease").len());
    let free1 = wait_for_free_memory(&ctx, free_start, 4 << 20);
    eprintln!(
        "soak: {FD_CYCLES} {kind} cycles in {:.2} s ({:.0} µs/cycle); importer fds \
         {fds0}->{fds1}, lease tables {shm0}->{shm1}, device free memory {free_start}->{free1}; \
         exporter: {}",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / FD_CYCLES as f64,
        results[0]
    );
    let (exporter_free0, exporter_free1) =
        assert_soak_leaked_nothing((fds0, fds1), shm1, (free_start, free1), &results[0]);
    assert!(
        exporter_free1 + (2 << 20) >= exporter_free0,
        "exporter-side free GPU memory fell: {exporter_free0} -> {exporter_free1}"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn importer_killed_its_lease_is_reaped_and_memory_freed() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _dog = watchdog("importer_killed", Duration::from_secs(90));
    let ctx = gpu();
    let shared = ShmOptions::new(unique_name("killed"))
        .create::<Shared>()
        .unwrap();
    let (free_before, _) = ctx.mem_info().unwrap();
    let len = 256 << 20;
    let buf = IpcBuffer::<u8>::new(&ctx, len).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let importer = spawn("open_and_sleep", &[shared.name()]);
    wait_for("import", Duration::from_secs(30), || {
        shared.done.load(Ordering::Acquire) != 0
    });
    assert_eq!(buf.importers(), vec![importer.pid()]);
    importer.signal(libc::SIGKILL);
    let _ = importer.wait(Duration::from_secs(20));
    assert!(
        buf.importers().is_empty(),
        "a dead importer's lease is reaped"
    );
    buf.close(Duration::from_secs(10)).unwrap();
    let slack = 4 << 20;
    let free_after = wait_for_free_memory(&ctx, free_before, slack);
    assert!(
        free_after + slack >= free_before,
        "free memory {free_after} did not return to {free_before}"
    );
}

const ARENA_CYCLES: u64 = 1_000;

#[test]
#[ignore = "requires a CUDA device"]
fn a_thousand_arenas_with_imports_quarantine_and_views_leak_nothing() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _dog = watchdog("arena soak", Duration::from_secs(300));
    let ctx = gpu();
    let (free_start, _) = ctx.mem_info().unwrap();
    let entries = || {
        (
            shm_entries_but_registry("cuda-ipc-arena").len(),
            shm_entries_but_registry("cuda-ipc-lease").len(),
        )
    };
    let mut baseline = None;
    let start = Instant::now();
    for i in 0..ARENA_CYCLES {
        if i == WARMUP / 5 {
            baseline = Some((fd_count(), entries()));
        }
        let arena = IpcArena::new(&ctx, 4 << 20).unwrap();
        let (handle, fd) = arena.export_fd().unwrap();
        let imported = ImportedArena::open_fd(&ctx, &handle, fd).unwrap();
        let mut bufs: Vec<_> = (0..32)
            .map(|k| arena.alloc::<u8>(4096 + k * 256).unwrap())
            .collect();
        let views: Vec<_> = bufs
            .iter()
            .map(|b| imported.open(&b.handle()).unwrap())
            .collect();
        bufs.truncate(16); // half freed while viewed: quarantined
        assert_eq!(
            arena.collect(),
            (16..32).map(|k| 4096 + k * 256).sum::<usize>()
        );
        drop(views);
        assert_eq!(
            arena.collect(),
            0,
            "cycle {i}: views gone, nothing quarantined"
        );
        drop(bufs);
        assert_eq!(arena.free_bytes(), arena.capacity());
        drop(imported);
        drop(arena);
    }
    let elapsed = start.elapsed();
    let (fds0, (arenas0, leases0)) = baseline.unwrap();
    let (fds1, (arenas1, leases1)) = (fd_count(), entries());
    let free1 = wait_for_free_memory(&ctx, free_start, 4 << 20);
    eprintln!(
        "soak: {ARENA_CYCLES} arena cycles (create, import, 32 buffers and views, half \
         quarantined) in {:.2} s ({:.0} µs/cycle); fds {fds0}->{fds1}, arena tables \
         {arenas0}->{arenas1}, lease tables {leases0}->{leases1}, device free memory \
         {free_start}->{free1}",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / ARENA_CYCLES as f64,
    );
    assert!(fds1 <= fds0, "file descriptors leaked: {fds0} -> {fds1}");
    assert!(arenas1 <= arenas0, "arena tables left in /dev/shm");
    assert!(leases1 <= leases0, "lease tables left in /dev/shm");
    assert!(
        free1 + (4 << 20) >= free_start,
        "device free memory {free1} did not return to {free_start}"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn two_thousand_pool_buffers_freed_while_held_leak_nothing() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _dog = watchdog("pool soak", Duration::from_secs(300));
    let ctx = gpu();
    let socket = unique_name("pool-soak");
    let listener =
        FdListener::bind(SocketName::Abstract(socket.clone()), PeerPolicy::SameUid).unwrap();
    let (free_start, _) = ctx.mem_info().unwrap();
    let owner = spawn("pool_owner", &[&socket]);
    let s = listener.accept(T).unwrap();
    let pool = s.recv_pool(&ctx, T).unwrap();
    let mut host = vec![0u8; LEN];
    let mut baseline = None;
    let start = Instant::now();
    for i in 0..FD_CYCLES {
        if i == WARMUP {
            baseline = Some(fd_count());
        }
        let handle = PoolHandle::<u8>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
        let view = pool.open(&handle).unwrap();
        s.send(b"opened", &[], T).unwrap();
        assert_eq!(s.recv(T).unwrap().payload, b"dropped");
        // The owner dropped its buffer: quarantined, still ours to read.
        assert!(!view.is_live());
        view.copy_to_host(&mut host).unwrap();
        assert!(
            host.iter().all(|&b| u64::from(b) == i % 251),
            "cycle {i}: wrong data after the owner's drop"
        );
        drop(view);
        s.send(b"closed", &[], T).unwrap();
    }
    let elapsed = start.elapsed();
    let results = owner.expect_success(Duration::from_secs(60));
    drop(pool);
    drop((s, listener));
    let fds0 = baseline.unwrap();
    let (fds1, shm1) = (fd_count(), shm_entries_but_registry("cuda-ipc-lease").len());
    let free1 = wait_for_free_memory(&ctx, free_start, 4 << 20);
    eprintln!(
        "soak: {FD_CYCLES} pool cycles in {:.2} s ({:.0} µs/cycle); importer fds {fds0}->{fds1}, \
         lease tables {shm1}, device free memory {free_start}->{free1}; owner: {}",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / FD_CYCLES as f64,
        results[0]
    );
    let (owner_free0, owner_free1) =
        assert_soak_leaked_nothing((fds0, fds1), shm1, (free_start, free1), &results[0]);
    assert!(
        owner_free1 + (2 << 20) >= owner_free0,
        "owner-side free GPU memory fell: {owner_free0} -> {owner_free1}"
    );
}
