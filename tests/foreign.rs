//! Foreign memory (`cuda_ipc::foreign`) between real processes: a `cuMemAlloc` allocation and a
//! virtual-memory one, exported by address as another allocator's memory would be, sent over
//! an `FdSocket` and opened in a child with every byte checked; memory that cannot be shared is
//! refused by name. (Forged messages and a sender that stops between continuations are the
//! module's unit tests: they need no GPU. PyTorch's own memory — the caching allocator and
//! expandable segments of many chunks, an importer in another pid namespace — is the Python
//! package's GPU test, `python/tests/test_foreign_gpu.py`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::Duration;

use common::{fd_connect, fd_listener, gpu, pattern, spawn, watchdog};
use cuda_ipc::error::{ArgumentDefect, PeerRole};
use cuda_ipc::foreign::{ForeignExport, ForeignMemory};
use cuda_ipc::raw::RawImport;
use cuda_ipc::{Error, HandleType, ImportedBuffer, IpcBuffer, ProcessIdentity};

const T: Duration = Duration::from_secs(20);

#[test]
fn child_process() {
    common::child_main(|role, args| match role {
        "import" => {
            let ctx = gpu();
            let socket = fd_connect(&args[0]);
            let received = socket.recv_foreign::<u32>(&ctx, T).unwrap();
            let (buffer, kind) = match received.memory {
                ForeignMemory::Mapped(b) => (b, "mapped"),
                // SAFETY: the parent keeps the buffer alive until this child says "done".
                ForeignMemory::Raw(raw) => (
                    unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &raw) }.unwrap(),
                    "raw",
                ),
            };
            let mut host = vec![0u32; buffer.len()];
            buffer.copy_to_host(&mut host).unwrap();
            let meta = String::from_utf8(received.meta).unwrap();
            let [total, seed, skip]: [usize; 3] = meta
                .split(' ')
                .map(|w| w.parse().unwrap())
                .collect::<Vec<_>>()
                .try_into()
                .unwrap();
            let expected = pattern(total, seed as u32)[skip..skip + host.len()].to_vec();
            println!(
                "RESULT {kind} {} {}",
                host.len(),
                if host == expected { "exact" } else { "WRONG" }
            );
            socket.send(b"done", &[], T).unwrap();
            0
        }
        // Export a legacy buffer by address, as another allocator's memory, and hold it until
        // killed.
        "export_legacy" => {
            let ctx = gpu();
            let socket = fd_connect(&args[0]);
            let buffer = IpcBuffer::<u32>::new_with(&ctx, 1 << 16, HandleType::Legacy).unwrap();
            buffer.copy_from_host(&pattern(1 << 16, 5)).unwrap();
            let export = ForeignExport::new(&ctx, buffer.as_raw_ptr(), 4 << 16).unwrap();
            socket.send_foreign(&export, b"", T).unwrap();
            std::thread::sleep(Duration::from_secs(60)); // until killed
            3
        }
        _ => 2,
    });
}

/// A legacy export received from a process that then dies: the import names the sender by its
/// identity (a pid reused by another process reads as dead), and a re-open of the mapped
/// handle — the import cache's hit, as `Socket.recv_tensor` makes for every tensor of one
/// PyTorch block — is `PeerGone` once the exporter died, named or not, while the first view
/// stays mapped.
#[test]
#[ignore = "requires a CUDA device"]
fn a_raw_reopen_after_the_exporter_died_is_refused() {
    let _dog = watchdog("foreign legacy exporter death", Duration::from_secs(60));
    let ctx = gpu();
    let (listener, name) = fd_listener("foreign-death");
    let child = spawn("export_legacy", &[&name]);
    let peer = listener.accept(T).unwrap();
    let received = peer.recv_foreign::<u32>(&ctx, T).unwrap();
    let ForeignMemory::Raw(import) = received.memory else {
        panic!("a cuMemAlloc buffer arrives as a raw handle");
    };
    let exporter = import.exporter.expect("the socket's sender");
    assert_eq!(exporter.pid(), child.pid());
    assert_ne!(
        exporter.start_time(),
        0,
        "named by its identity, not a bare pid"
    );
    // The same pid with another start time: what a reuse after a death looks like.
    let reused = ProcessIdentity::from_parts(exporter.pid(), exporter.start_time() + 1);
    let child_pid = child.pid();
    let gone = |r: cuda_ipc::Result<ImportedBuffer<u32>>| match r {
        Err(Error::PeerGone {
            pid,
            role: PeerRole::Exporter,
        }) => assert_eq!(pid, child_pid),
        other => panic!(
            "expected PeerGone (exporter), got {:?}",
            other.map(|b| b.len())
        ),
    };
    // SAFETY: refused before the driver (the named process is not the exporter).
    gone(unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &import.exporter(reused)) });
    // SAFETY: the child holds the buffer until it is killed; after that only refusals follow.
    let first = unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &import) }.unwrap();
    let mut host = vec![0u32; first.len()];
    first.copy_to_host(&mut host).unwrap();
    assert_eq!(host, pattern(1 << 16, 5));
    child.signal(libc::SIGKILL);
    child.expect_exit_or_kill(T);
    // Mapped here still (a cache hit), the exporter dead: refused, named and unnamed.
    // SAFETY: refused (the exporter is dead).
    gone(unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &import) });
    let unnamed = RawImport::new(import.handle, import.offset, 16);
    // SAFETY: as above (the mapping's recorded exporter is dead).
    gone(unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &unnamed) });
    first.copy_to_host(&mut host).unwrap(); // the first view stays mapped
    assert_eq!(host, pattern(1 << 16, 5));
}

/// Export `len` words at word `skip` of a buffer of `handle_type` by address, as another
/// allocator's memory, to a child that checks every word; returns what the child reported.
fn round_trip(handle_type: HandleType, total: usize, skip: usize, len: usize) -> String {
    let ctx = gpu();
    let buffer = IpcBuffer::<u32>::new_with(&ctx, total, handle_type).unwrap();
    let seed = 11;
    let data = pattern(total, seed);
    buffer.copy_from_host(&data).unwrap();
    let ptr = buffer.as_raw_ptr() + (skip * 4) as u64;
    let export = ForeignExport::new(&ctx, ptr, len * 4).unwrap();
    assert_eq!(export.bytes(), (len * 4) as u64);
    assert_eq!(export.raw().is_some(), handle_type == HandleType::Legacy);
    let (listener, name) = fd_listener("foreign");
    let child = spawn("import", &[&name]);
    let peer = listener.accept(T).unwrap();
    let meta = format!("{total} {seed} {skip}");
    peer.send_foreign(&export, meta.as_bytes(), T).unwrap();
    assert_eq!(peer.recv(T).unwrap().payload, b"done");
    let (status, results) = child.wait(T);
    assert!(status.success(), "child: {status:?}");
    results.join(" ")
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_cumemalloc_allocation_exports_as_a_legacy_handle_at_its_offset() {
    let _dog = watchdog("foreign legacy", Duration::from_secs(60));
    let report = round_trip(HandleType::Legacy, 1 << 20, 1000, 5000);
    assert_eq!(report, "raw 5000 exact");
}

#[test]
#[ignore = "requires a CUDA device"]
fn virtual_memory_exports_as_descriptors_mapped_at_the_same_offset() {
    let _dog = watchdog("foreign vmm", Duration::from_secs(60));
    let report = round_trip(HandleType::PosixFd, 3 << 20, 123_457, 400_000);
    assert_eq!(report, "mapped 400000 exact");
}

#[test]
#[ignore = "requires a CUDA device"]
fn memory_that_cannot_be_shared_is_refused_by_name() {
    let ctx = gpu();
    let not_shareable = |r: cuda_ipc::Result<ForeignExport>, what: &str| match r {
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::NotShareable { detail, .. },
            ..
        }) => detail,
        other => panic!("{what}: expected NotShareable, got {other:?}"),
    };
    let legacy = IpcBuffer::<u32>::new(&ctx, 1024).unwrap();
    let past = not_shareable(
        ForeignExport::new(&ctx, legacy.as_raw_ptr(), 1 << 30),
        "a range past its allocation",
    );
    assert!(past.contains("leave its allocation"), "{past}");
    let host = vec![0u8; 4096];
    let unknown = not_shareable(
        ForeignExport::new(&ctx, host.as_ptr() as u64, 4096),
        "host memory",
    );
    assert!(unknown.contains("no device memory"), "{unknown}");
    assert!(matches!(
        ForeignExport::new(&ctx, legacy.as_raw_ptr(), 0),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::AllocationSize { .. },
            ..
        })
    ));
    let pooled = IpcBuffer::<u32>::new_with(&ctx, 1024, HandleType::Pool).unwrap();
    let pool = not_shareable(
        ForeignExport::new(&ctx, pooled.as_raw_ptr(), 4096),
        "stream-ordered pool memory",
    );
    assert!(pool.contains("pool"), "{pool}");
}
