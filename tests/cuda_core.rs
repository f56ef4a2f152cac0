//! Pools shared with NVIDIA's cuda.core, both ways, against the real cuda.core (a Python peer,
//! `tests/cuda_core_peer.py`, run with `python3`): a cuda.core buffer opened here as a
//! `PoolView` and an `IpcPool` buffer opened there, every byte checked each way; forged,
//! oversized and malformed descriptors refused; a cuda.core exporter `SIGKILL`ed while viewed,
//! with this process's device memory back at its baseline afterwards.
//!
//! Without `python3`, cuda.core or CuPy the tests skip visibly — unless
//! `CUDA_IPC_REQUIRE_CUDA_CORE` is set (the GPU check sets it), which makes that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use common::{fd_connect, fd_listener, gpu, spawn_program, watchdog};
use cuda_ipc::error::{HandleDefect, PeerRole};
use cuda_ipc::pool::{ForeignPool, IpcPool, PoolBufferDescriptor};
use cuda_ipc::{Error, RawStream};

const T: Duration = Duration::from_secs(60);
const PEER: &str = include_str!("cuda_core_peer.py");

/// One test at a time: each peer's CUDA context takes device memory, which the kill test
/// measures.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The peer's byte pattern.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n as u64)
        .map(|i| ((i * 7 + seed) % 251) as u8)
        .collect()
}

/// Whether cuda.core and CuPy are here for the test `what` (else a visible skip, or a failure
/// where they are required).
fn have_cuda_core(what: &str) -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", "import cuda.core, cupy"])
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    assert!(
        std::env::var_os("CUDA_IPC_REQUIRE_CUDA_CORE").is_none(),
        "{what}: python3 with cuda.core and CuPy is required here"
    );
    common::skip(what, "no python3 with cuda.core and CuPy");
    false
}

fn peer(role: &str, name: &str, nbytes: usize, seed: u64, seed2: u64) -> common::Child {
    let (n, s, s2) = (nbytes.to_string(), seed.to_string(), seed2.to_string());
    spawn_program("python3", &["-c", PEER, role, name, &n, &s, &s2])
}

/// A cuda.core exporter's pool descriptor and first message.
fn accept_export(
    listener: &cuda_ipc::fd::FdListener,
) -> (cuda_ipc::fd::FdSocket, OwnedFd, PoolBufferDescriptor) {
    let socket = listener.accept(T).unwrap();
    let mut message = socket.recv(T).unwrap();
    assert_eq!(message.fds.len(), 1, "the pool's descriptor");
    let fd = message.fds.pop().unwrap();
    let descriptor = PoolBufferDescriptor::from_bytes(&message.payload).unwrap();
    (socket, fd, descriptor)
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_cuda_core_buffer_opens_here_and_bad_descriptors_are_refused() {
    if !have_cuda_core("a_cuda_core_buffer_opens_here_and_bad_descriptors_are_refused") {
        return;
    }
    let _serial = serial();
    let _dog = watchdog("cuda_core_export", Duration::from_secs(120));
    let ctx = gpu();
    let (listener, name) = fd_listener("cc-export");
    let nbytes = (1 << 20) + 12; // not a whole number of pages
    let child = peer("export", &name, nbytes, 3, 5);
    let (socket, fd, descriptor) = accept_export(&listener);
    assert_eq!(descriptor.bytes, nbytes as u64);
    let pool = ForeignPool::open_fd(&ctx, fd, Some(socket.peer().pid)).unwrap();
    assert_eq!(pool.exporter().map(|e| e.pid()), Some(child.pid()));

    // SAFETY: the peer keeps the buffer until it is told "done", after every view dropped.
    let view = unsafe { pool.open::<u8>(&descriptor) }.unwrap();
    let mut host = vec![0u8; view.len()];
    view.copy_to_host(&mut host).unwrap();
    assert_eq!(host, pattern(nbytes, 3), "every byte cuda.core wrote");
    // SAFETY: as above.
    let again = unsafe {
        pool.open::<u32>(&PoolBufferDescriptor {
            bytes: 4096,
            ..descriptor
        })
    }
    .unwrap();
    assert_eq!(
        again.as_raw_ptr(),
        view.as_raw_ptr(),
        "one import of the allocation"
    );
    assert!(again.is_live());
    drop(again);
    view.copy_from_host(&pattern(nbytes, 5)).unwrap(); // still mapped after a view dropped
    socket.send(b"verify", &[], T).unwrap();
    assert_eq!(socket.recv(T).unwrap().payload, b"checked");

    // Refused before the driver: no size, a size not of whole elements.
    fn layout<T: bytemuck::Pod>(r: cuda_ipc::Result<cuda_ipc::pool::PoolView<T>>) {
        match r {
            Err(Error::CorruptHandle {
                defect: HandleDefect::Layout { .. },
            }) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened"),
        }
    }
    // SAFETY: refused before anything is mapped.
    layout(unsafe {
        pool.open::<u8>(&PoolBufferDescriptor {
            bytes: 0,
            ..descriptor
        })
    });
    // SAFETY: as above.
    layout(unsafe {
        pool.open::<u32>(&PoolBufferDescriptor {
            bytes: 6,
            ..descriptor
        })
    });
    // Refused by the driver's range: more bytes than the allocation holds (a fresh import:
    // the view above is the only one, so drop it first).
    drop(view);
    // SAFETY: refused: nothing stays mapped.
    match unsafe {
        pool.open::<u8>(&PoolBufferDescriptor {
            bytes: 1 << 40,
            ..descriptor
        })
    } {
        Err(Error::CorruptHandle {
            defect: HandleDefect::Memory { detail },
        }) => {
            assert!(detail.contains("cuPointerGetAttributes"), "{detail}");
        }
        other => panic!("{:?}", other.map(|v| v.len())),
    }
    // Refused by the driver: export data of no allocation of this pool.
    let mut forged = descriptor;
    forged.export_data.iter_mut().for_each(|b| *b ^= 0x5a);
    // SAFETY: refused: nothing is mapped.
    match unsafe { pool.open::<u8>(&forged) } {
        Err(Error::Cuda { call, .. }) => assert_eq!(call, "cuMemPoolImportPointer"),
        other => panic!("{:?}", other.map(|v| v.len())),
    }
    // A descriptor that is not a pool.
    let not_a_pool = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    match ForeignPool::open_fd(&ctx, not_a_pool, None) {
        Err(Error::Cuda { call, .. }) => assert_eq!(call, "cuMemPoolImportFromShareableHandle"),
        other => panic!("{other:?}"),
    }
    socket.send(b"done", &[], T).unwrap();
    let out = child.expect_success(T);
    assert_eq!(out, ["written exact", "closed"]);
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_ipc_pool_buffer_opens_in_cuda_core() {
    if !have_cuda_core("an_ipc_pool_buffer_opens_in_cuda_core") {
        return;
    }
    let _serial = serial();
    let _dog = watchdog("cuda_core_import", Duration::from_secs(120));
    let ctx = gpu();
    let pool = IpcPool::new(&ctx).unwrap();
    let nbytes = 3 << 20;
    let buf = pool.alloc::<u8>(nbytes, &RawStream::LEGACY).unwrap();
    buf.copy_from_host(&pattern(nbytes, 11)).unwrap();
    let name = common::unique_name("cc-import");
    let child = peer("import", &name, nbytes, 11, 13);
    let socket = fd_connect(&name);
    let (_handle, fd) = pool.export_fd().unwrap();
    let descriptor = buf.descriptor().unwrap();
    assert_eq!(descriptor.bytes, nbytes as u64);
    socket
        .send(&descriptor.to_bytes(), &[fd.as_fd()], T)
        .unwrap();
    drop(fd);
    assert_eq!(socket.recv(T).unwrap().payload, b"closed");
    let out = child.expect_success(T);
    assert_eq!(out, [format!("read {nbytes} exact"), "closed".into()]);
    let mut host = vec![0u8; nbytes];
    buf.copy_to_host(&mut host).unwrap();
    assert_eq!(host, pattern(nbytes, 13), "every byte cuda.core wrote");
    // cuda.core closed its import before it answered: the buffer frees at once.
    buf.free_async(&RawStream::LEGACY).unwrap();
    ctx.synchronize().unwrap();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_killed_cuda_core_exporter_leaves_this_process_its_memory_back() {
    if !have_cuda_core("a_killed_cuda_core_exporter_leaves_this_process_its_memory_back") {
        return;
    }
    let _serial = serial();
    let _dog = watchdog("cuda_core_killed", Duration::from_secs(120));
    let ctx = gpu();
    let (baseline, _) = ctx.mem_info().unwrap();
    let (listener, name) = fd_listener("cc-killed");
    let nbytes = 64 << 20;
    let child = peer("export", &name, nbytes, 17, 0);
    let (socket, fd, descriptor) = accept_export(&listener);
    let pool = ForeignPool::open_fd(&ctx, fd, Some(socket.peer().pid)).unwrap();
    // SAFETY: the peer holds the buffer until it is killed; what the view reads after that is
    // checked below, never trusted.
    let view = unsafe { pool.open::<u8>(&descriptor) }.unwrap();
    socket.send(b"hold", &[], T).unwrap();
    assert_eq!(socket.recv(T).unwrap().payload, b"holding");
    let pid = child.pid();
    child.signal(libc::SIGKILL);
    child.expect_exit_or_kill(T);
    // The driver keeps the survivor's imports mapped: the view still reads what was there.
    let mut host = vec![0u8; nbytes];
    view.copy_to_host(&mut host).unwrap();
    assert_eq!(host, pattern(nbytes, 17));
    assert!(!view.is_live(), "the named exporter is gone");
    // SAFETY: refused before the driver (the exporter is dead).
    match unsafe { pool.open::<u8>(&descriptor) } {
        Err(Error::PeerGone {
            pid: gone,
            role: PeerRole::Exporter,
        }) => assert_eq!(gone, pid),
        other => panic!("{:?}", other.map(|v| v.len())),
    }
    drop(view);
    drop(pool);
    // Within 32 MiB of the baseline (the driver's own bookkeeping may move).
    if let Err(free) =
        common::free_memory_reaches(&ctx, baseline, 32 << 20, Duration::from_secs(20))
    {
        panic!(
            "{} MiB of device memory not back 20 s after the exporter's death",
            (baseline - free) >> 20
        );
    }
}
