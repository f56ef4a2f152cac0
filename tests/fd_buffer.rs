//! POSIX-fd buffers (`HandleType::PosixFd`) between real processes: contents across both ways
//! on every device pair, memory that outlives its exporter (dropped, exited or killed), a dead
//! exporter's descriptor refused, handle bytes that cannot map without the descriptor (also from
//! another uid, where `pidfd_getfd` is denied while a legacy handle's bytes map), forged and
//! mismatched descriptors, the import cache, and no descriptor, mapping or device memory leaked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{
    contents, drop_privileges, fd_connect, fd_count, fd_listener, from_hex, gpu, is_root, pattern,
    report, shm_entries_but_registry, spawn, to_hex, watchdog,
};
use cuda_ipc::error::{PeerRole, TypeConflict};
use cuda_ipc::raw::{RawImport, RawMemHandle};
use cuda_ipc::{Error, GpuContext, HandleType, ImportedBuffer, IpcBuffer, IpcMemHandle};

const T: Duration = Duration::from_secs(20);

/// Serialises this binary's GPU tests: several count this process's descriptors, which any
/// test running beside them would change (`.gpu/run` runs tests on parallel threads).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This process's descriptors and what they point to.
fn fd_links() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let target = std::fs::read_link(e.path()).map(|p| p.display().to_string());
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.unwrap_or_default()
            )
        })
        .collect();
    v.sort();
    v
}

/// Fail unless this process holds exactly `before.len() - consumed` descriptors, naming the
/// ones opened since `before`.
fn assert_fds_closed(before: &[String], consumed: usize, what: &str) {
    let now = fd_links();
    let new: Vec<&String> = now.iter().filter(|l| !before.contains(l)).collect();
    assert_eq!(
        now.len() + consumed,
        before.len(),
        "{what}: {} descriptors before ({consumed} consumed), {} now; new: {new:?}",
        before.len(),
        now.len()
    );
}

/// One export, open and drop in this process, before a test takes its descriptor baseline: the
/// first lease release pins a pidfd of this process in the crate's liveness cache (one per
/// checked process, kept for later checks), which is not a leak.
fn warm_up(ctx: &GpuContext) {
    let buf = IpcBuffer::<u8>::new_with(ctx, 1, HandleType::PosixFd).unwrap();
    let (handle, fd) = buf.export_fd().unwrap();
    drop(ImportedBuffer::open_fd(ctx, &handle, fd).unwrap());
}

/// The exporter child's tail after sending, by mode: what it does once the parent says
/// "opened" (or, for `killed_before_open`, at once).
#[test]
fn child_process() {
    common::child_main(|role, args| {
        match role {
            // args: socket, device, len, mode
            "exporter" => {
                let device: u32 = args[1].parse().unwrap();
                let len: usize = args[2].parse().unwrap();
                let ctx = GpuContext::new(device).unwrap();
                let buf = IpcBuffer::<u32>::zeroed_with(&ctx, len, HandleType::PosixFd).unwrap();
                assert_eq!(buf.handle_type(), HandleType::PosixFd);
                buf.copy_from_host(&pattern(len, 11)).unwrap();
                let s = fd_connect(&args[0]);
                s.send_buffer(&buf, T).unwrap();
                match args[3].as_str() {
                    "verify_reply" => {
                        // The parent wrote the doubled pattern: we must see it.
                        assert_eq!(s.recv(T).unwrap().payload, b"written");
                        let want: Vec<u32> =
                            pattern(len, 11).iter().map(|x| x.wrapping_mul(2)).collect();
                        let ok = contents(&buf) == want;
                        report(if ok { "verified" } else { "WRONG" });
                        assert_eq!(buf.importers(), vec![s.peer().pid]);
                        s.send(b"bye", &[], T).unwrap();
                        assert!(matches!(s.recv(T), Err(Error::PeerClosed { .. })));
                    }
                    "drop_then_exit" => {
                        assert_eq!(s.recv(T).unwrap().payload, b"opened");
                        let t = Instant::now();
                        drop(buf); // must not wait for the importer: it keeps the memory
                        report(format!("dropped in {} us", t.elapsed().as_micros()));
                    }
                    "killed_after_open" => {
                        assert_eq!(s.recv(T).unwrap().payload, b"opened");
                        report("waiting");
                        std::thread::sleep(Duration::from_secs(50));
                    }
                    "killed_before_open" => {
                        report("sent");
                        std::thread::sleep(Duration::from_secs(50));
                    }
                    "handle_only" => {
                        // The handle's bytes, but no descriptor.
                        s.send(buf.handle().unwrap().as_bytes(), &[], T).unwrap();
                        assert!(matches!(s.recv(T), Err(Error::PeerClosed { .. })));
                    }
                    other => panic!("unknown mode {other}"),
                }
                0
            }
            // args: fd handle hex, legacy raw handle hex, parent pid, parent's fd number
            "nobody_tries" => {
                drop_privileges();
                let ctx = GpuContext::new(0).unwrap();
                let handle = IpcMemHandle::<u32>::from_bytes(&from_hex(&args[0])).unwrap();
                match ImportedBuffer::open(&ctx, &handle) {
                    Err(Error::HandleTypeMismatch {
                        conflict: TypeConflict::Descriptors { found: 0, .. },
                        ..
                    }) => report("fd handle: no descriptor"),
                    other => report(format!("fd handle: unexpected {other:?}")),
                }
                let pid: u32 = args[2].parse().unwrap();
                match cuda_ipc::fd::take_fd_from_process(pid, args[3].parse().unwrap()) {
                    Err(Error::PtraceDenied { .. }) => report("pidfd_getfd: denied"),
                    other => report(format!("pidfd_getfd: unexpected {other:?}")),
                }
                // The contrast: a legacy handle is a bearer token; its bytes map from here.
                let raw = RawMemHandle(from_hex(&args[1]).try_into().unwrap());
                let import = RawImport::new(raw, 0, 1024).exporter_pid(pid);
                // SAFETY: the parent keeps the buffer alive until this child exits.
                match unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &import) } {
                    Ok(b) if contents(&b) == pattern(1024, 5) => report("legacy bytes: mapped"),
                    other => report(format!("legacy bytes: unexpected {other:?}")),
                }
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// Exporter on `exporter_device` (a child), importer on `importer_device` (this process):
/// every element across, the importer's writes seen by the exporter.
fn both_ways(exporter_device: u32, importer_device: u32) {
    let ctx = GpuContext::new(importer_device).unwrap();
    let (l, raw) = fd_listener("fd-both-ways");
    let len = (3 << 20) / 4 + 7; // not a multiple of the granularity
    let child = spawn(
        "exporter",
        &[
            &raw,
            &exporter_device.to_string(),
            &len.to_string(),
            "verify_reply",
        ],
    );
    let s = l.accept(T).unwrap();
    let buf = s.recv_buffer::<u32>(&ctx, T).unwrap();
    assert_eq!(buf.handle_type(), HandleType::PosixFd);
    assert_eq!(buf.exporter().map(|e| e.pid()), Some(child.pid()));
    assert_eq!(buf.len(), len);
    assert_eq!(contents(&buf), pattern(len, 11), "every element across");
    let doubled: Vec<u32> = pattern(len, 11).iter().map(|x| x.wrapping_mul(2)).collect();
    buf.copy_from_host(&doubled).unwrap();
    s.send(b"written", &[], T).unwrap();
    assert_eq!(s.recv(T).unwrap().payload, b"bye");
    drop(buf);
    drop(s);
    assert_eq!(child.expect_success(T), ["verified"]);
}

#[test]
#[ignore = "requires a CUDA device"]
fn fd_buffers_cross_processes_both_ways_on_every_device_pair() {
    let _serial = serial();
    let _dog = watchdog("fd_both_ways", Duration::from_secs(120));
    both_ways(0, 0);
    if !common::has_gpus(2, "fd buffers: device pairs") {
        return;
    }
    for (e, i) in [(1, 0), (0, 1)] {
        if common::peers(i, e, "fd buffers: a device pair") {
            both_ways(e, i);
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn the_memory_outlives_its_exporter() {
    let _serial = serial();
    let _dog = watchdog("fd_outlives", Duration::from_secs(120));
    let ctx = gpu();
    let len = 1 << 20;
    for mode in ["drop_then_exit", "killed_after_open"] {
        let (l, raw) = fd_listener("fd-outlives");
        let child = spawn("exporter", &[&raw, "0", &len.to_string(), mode]);
        let s = l.accept(T).unwrap();
        let buf = s.recv_buffer::<u32>(&ctx, T).unwrap();
        s.send(b"opened", &[], T).unwrap();
        let out = if mode == "killed_after_open" {
            // Wait until the child is past its recv, then kill it.
            assert!(s.recv(Duration::from_millis(200)).is_err());
            child.signal(libc::SIGKILL);
            let (status, out) = child.wait(T);
            assert!(!status.success());
            out
        } else {
            child.expect_success(T)
        };
        // The exporter is gone: its buffer dropped or its process dead. Ours still holds it.
        assert_eq!(contents(&buf), pattern(len, 11), "{mode}: {out:?}");
        buf.copy_from_host(&pattern(len, 3)).unwrap();
        assert_eq!(contents(&buf), pattern(len, 3), "{mode}: still writable");
        if mode == "drop_then_exit" {
            assert!(out[0].starts_with("dropped in "), "{out:?}");
            eprintln!("fd buffers: exporter {}", out[0]);
        }
        drop(buf);
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_dead_exporters_descriptor_and_a_bare_handle_are_refused() {
    let _serial = serial();
    let _dog = watchdog("fd_refused", Duration::from_secs(60));
    let ctx = gpu();
    let before = fd_count();
    // Sent, then killed before we open: the descriptor arrives, the open is refused.
    let (l, raw) = fd_listener("fd-dead");
    let child = spawn("exporter", &[&raw, "0", "4096", "killed_before_open"]);
    let s = l.accept(T).unwrap();
    // Once the message is queued, kill the exporter; the descriptor in flight arrives anyway.
    let mut pfd = libc::pollfd {
        fd: s.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for a socket we own.
    let ready = unsafe { libc::poll(&mut pfd, 1, 20_000) };
    assert_eq!(ready, 1, "the exporter never sent");
    child.signal(libc::SIGKILL);
    let _ = child.wait(T);
    match s.recv_buffer::<u32>(&ctx, T) {
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        }) => {}
        other => panic!("expected PeerGone (exporter), got {other:?}"),
    }
    drop((s, l));
    assert_eq!(fd_count(), before, "the received descriptor is closed");
    // The handle's bytes without the descriptor.
    let (l, raw) = fd_listener("fd-bare");
    let child = spawn("exporter", &[&raw, "0", "4096", "handle_only"]);
    let s = l.accept(T).unwrap();
    let _first = s.recv_buffer::<u32>(&ctx, T).unwrap(); // send_buffer's message
    let msg = s.recv(T).unwrap();
    let handle = IpcMemHandle::<u32>::from_bytes(&msg.payload).unwrap();
    assert_eq!(handle.handle_type(), HandleType::PosixFd);
    match ImportedBuffer::open(&ctx, &handle) {
        Err(Error::HandleTypeMismatch { handle, conflict }) => {
            assert_eq!(handle, HandleType::PosixFd);
            assert_eq!(
                conflict,
                TypeConflict::Descriptors {
                    expected: 1,
                    found: 0
                }
            );
        }
        other => panic!("expected HandleTypeMismatch, got {other:?}"),
    }
    drop((s, l));
    child.expect_success(T);
}

#[test]
#[ignore = "requires a CUDA device"]
fn another_uid_with_the_handle_bytes_cannot_map_fd_memory() {
    let _serial = serial();
    if !is_root() {
        common::skip(
            "fd buffers of another uid",
            "needs root to start a process of another uid",
        );
        return;
    }
    let _dog = watchdog("fd_other_uid", Duration::from_secs(60));
    let ctx = gpu();
    let fd_buf = IpcBuffer::<u32>::zeroed_with(&ctx, 1024, HandleType::PosixFd).unwrap();
    let (handle, fd) = fd_buf.export_fd().unwrap();
    let legacy = IpcBuffer::<u32>::new(&ctx, 1024).unwrap();
    legacy.copy_from_host(&pattern(1024, 5)).unwrap();
    let raw = legacy.raw_export().unwrap();
    let out = spawn(
        "nobody_tries",
        &[
            &to_hex(handle.as_bytes()),
            &to_hex(&raw.handle.0),
            &std::process::id().to_string(),
            &fd.as_raw_fd().to_string(),
        ],
    )
    .expect_success(T);
    assert_eq!(
        out,
        [
            "fd handle: no descriptor",
            "pidfd_getfd: denied",
            "legacy bytes: mapped"
        ]
    );
    drop(fd);
}

#[test]
#[ignore = "requires a CUDA device"]
fn forged_and_mismatched_descriptors_are_refused_and_nothing_leaks() {
    let _serial = serial();
    let _dog = watchdog("fd_forged", Duration::from_secs(120));
    let ctx = gpu();
    warm_up(&ctx);
    let fds = fd_links();
    let (free_before, _) = ctx.mem_info().unwrap();
    let shm_before = shm_entries_but_registry("cuda-ipc-lease.").len();
    let buf = IpcBuffer::<u32>::zeroed_with(&ctx, 1 << 20, HandleType::PosixFd).unwrap();
    let (handle, fd) = buf.export_fd().unwrap();
    // Not CUDA memory.
    for path in ["/dev/null", "/proc/self/stat"] {
        let before = fd_links();
        let other = std::fs::File::open(path).unwrap();
        match ImportedBuffer::open_fd(&ctx, &handle, OwnedFd::from(other)) {
            Err(Error::Cuda { call, .. }) => assert_eq!(call, "cuMemImportFromShareableHandle"),
            other => panic!("expected a refused import, got {other:?}"),
        }
        assert_fds_closed(&before, 0, path);
    }
    // A smaller allocation's descriptor under a larger handle: the map is refused.
    let small = IpcBuffer::<u32>::zeroed_with(&ctx, 1024, HandleType::PosixFd).unwrap();
    let (_, small_fd) = small.export_fd().unwrap();
    let big = IpcBuffer::<u32>::zeroed_with(&ctx, 8 << 20, HandleType::PosixFd).unwrap();
    let (big_handle, _big_fd) = big.export_fd().unwrap();
    let before = fd_links();
    match ImportedBuffer::open_fd(&ctx, &big_handle, small_fd) {
        Err(Error::Cuda { call, .. }) => assert_eq!(call, "cuMemMap"),
        other => panic!("expected cuMemMap to refuse, got {other:?}"),
    }
    assert_fds_closed(&before, 1, "a descriptor too small for its handle");
    let before = fd_links();
    // Types that do not match the handle.
    let legacy = IpcBuffer::<u32>::zeroed(&ctx, 1024).unwrap();
    let dup = fd.try_clone().unwrap();
    assert!(matches!(
        ImportedBuffer::open_fd(&ctx, &legacy.handle().unwrap(), dup),
        Err(Error::HandleTypeMismatch {
            handle: HandleType::Legacy,
            conflict: TypeConflict::Descriptors {
                expected: 0,
                found: 1
            }
        })
    ));
    assert!(matches!(
        legacy.export_fd(),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::Needs(HandleType::PosixFd),
            ..
        })
    ));
    assert!(matches!(
        buf.raw_export(),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::Needs(HandleType::Legacy),
            ..
        })
    ));
    assert!(matches!(
        ImportedBuffer::<f32>::open_fd(
            &ctx,
            &IpcMemHandle::from_bytes(handle.as_bytes()).unwrap(),
            fd.try_clone().unwrap()
        ),
        Err(Error::TypeMismatch { .. })
    ));
    assert_fds_closed(&before, 0, "mismatched types");
    let before = fd_links();
    // Over a socket: wrong descriptor counts, a payload that is not a handle, a silent peer.
    let (l, raw) = fd_listener("fd-forged");
    let tx = fd_connect(&raw);
    let rx = l.accept(T).unwrap();
    let two = [fd.as_fd(), fd.as_fd()];
    let legacy_handle = legacy.handle().unwrap();
    let cases: [(&[u8], &[std::os::fd::BorrowedFd<'_>]); 4] = [
        (handle.as_bytes(), &[]),
        (handle.as_bytes(), &two),
        (legacy_handle.as_bytes(), &two[..1]),
        (b"not a handle", &two[..1]),
    ];
    for (payload, sent) in cases {
        tx.send(payload, sent, T).unwrap();
        match rx.recv_buffer::<u32>(&ctx, T) {
            Err(Error::HandleTypeMismatch { .. } | Error::CorruptHandle { .. }) => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    match rx.recv_buffer::<u32>(&ctx, Duration::from_millis(100)) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop((tx, rx, l));
    assert_fds_closed(&before, 0, "socket cases");
    // A freed buffer's handle with a descriptor taken before the free: stale.
    let (stale_handle, stale_fd) = small.export_fd().unwrap();
    drop(small);
    match ImportedBuffer::open_fd(&ctx, &stale_handle, stale_fd) {
        Err(Error::StaleHandle { .. }) => {}
        other => panic!("expected StaleHandle, got {other:?}"),
    }
    drop((fd, buf, big, legacy, _big_fd));
    assert_fds_closed(&fds, 0, "the whole test");
    assert_eq!(
        shm_entries_but_registry("cuda-ipc-lease.").len(),
        shm_before
    );
    let (free_after, _) = ctx.mem_info().unwrap();
    assert!(
        free_after + (2 << 20) >= free_before,
        "device memory freed: {free_before} before, {free_after} after"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn opening_in_the_exporting_process_shares_one_mapping_and_soaks_clean() {
    let _serial = serial();
    let _dog = watchdog("fd_same_process", Duration::from_secs(120));
    let ctx = gpu();
    let auto = IpcBuffer::<u8>::new_with(&ctx, 1, HandleType::Auto).unwrap();
    assert_eq!(
        auto.handle_type(),
        HandleType::PosixFd,
        "an H200 supports fds"
    );
    drop(auto);
    warm_up(&ctx);
    let fds = fd_count();
    let shm_before = shm_entries_but_registry("cuda-ipc-lease.").len();
    let (free_before, _) = ctx.mem_info().unwrap();
    let len = 300_000;
    for round in 0..200u32 {
        let buf = IpcBuffer::<u32>::zeroed_with(&ctx, len, HandleType::PosixFd).unwrap();
        buf.copy_from_host(&pattern(len, round)).unwrap();
        let (h1, fd1) = buf.export_fd().unwrap();
        let (h2, fd2) = buf.export_fd().unwrap();
        let a = ImportedBuffer::open_fd(&ctx, &h1, fd1).unwrap();
        let b = ImportedBuffer::open_fd(&ctx, &h2, fd2).unwrap();
        assert_eq!(a.as_raw_ptr(), b.as_raw_ptr(), "one mapping per export");
        assert_ne!(a.as_raw_ptr(), buf.as_raw_ptr(), "a mapping of its own");
        if round % 50 == 0 {
            assert_eq!(contents(&a), pattern(len, round));
            assert_eq!(buf.importers(), vec![std::process::id()]);
        }
        drop(buf); // never waits: our own import holds the memory
        if round % 50 == 0 {
            assert_eq!(contents(&b), pattern(len, round), "outlives the export");
        }
        drop((a, b));
    }
    assert_eq!(fd_count(), fds, "descriptors");
    assert_eq!(
        shm_entries_but_registry("cuda-ipc-lease.").len(),
        shm_before,
        "lease tables"
    );
    let (free_after, _) = ctx.mem_info().unwrap();
    assert!(
        free_after + (4 << 20) >= free_before,
        "device memory: {free_before} before, {free_after} after 200 rounds"
    );
}
