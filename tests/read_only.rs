//! Read-only sharing between real processes, per kind: a reader that opens a POSIX-fd buffer
//! or an arena read-only reads the owner's data, and every way of writing through its mapping
//! — `cuMemsetD8`, `cuMemcpyHtoD`, a kernel — fails in the reader (a fault, for the kernel)
//! and leaves the owner's data intact; a pool opened read-only is read-only by type only, and
//! a raw write through it *does* reach the owner's data (what the docs say, checked). An
//! export marked read-only refuses read-write opens and opens read-only (a pool-backed
//! `IpcBuffer` through `recv_buffer_read_only` too); a legacy buffer cannot be shared
//! read-only; a read-only and a read-write import of one arena in one process are two
//! mappings of the same memory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::Duration;

use common::cuda::{Module, Stream, StreamFlags, launch};
use common::{expect_message, fd_connect, fd_listener, gpu, pattern, report, spawn, watchdog};
use cuda_ipc::arena::{ArenaHandle, IpcArena, ReadOnlyArena};
use cuda_ipc::error::TypeConflict;
use cuda_ipc::fd::FdSocket;
use cuda_ipc::pool::{IpcPool, PoolHandle};
use cuda_ipc::{Error, GpuContext, HandleType, IpcBuffer, RawStream, ReadOnlySlice};

const T: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 18; // 1 MiB of u32
const SEED: u32 = 0x5EED;
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

/// What a reader received: its read-only memory, as the type every kind dereferences to,
/// and whether the GPU enforces it.
fn read(slice: &ReadOnlySlice<u32>) -> Vec<u32> {
    let mut host = vec![0u32; slice.len()];
    slice.copy_to_host(&mut host).unwrap();
    host
}

/// Write through the raw address of a read-only mapping as `how` says, and say what the
/// driver answered.
fn write_through(ctx: &GpuContext, ptr: u64, bytes: usize, how: &str) -> String {
    use cudarc::driver::result;
    ctx.make_current().unwrap();
    let answer = match how {
        // SAFETY: `ptr` is mapped for `bytes` (read-only: the driver refuses or the test
        // fails); the call reads nothing of ours.
        "memset" => unsafe { result::memset_d8_sync(ptr, 0x5A, bytes) },
        "htod" => {
            let junk = vec![0x5Au8; bytes];
            // SAFETY: as above; `junk` holds `bytes` bytes.
            unsafe { result::memcpy_htod_sync(ptr, &junk) }
        }
        "kernel" => {
            let module = Module::from_ptx(KERNELS, &[]).unwrap();
            let kernel = module.get_function("simple_kernel").unwrap();
            let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
            // SAFETY: the argument types match simple_kernel's; the mapping outlives the
            // synchronise (a fault there ends this process's context, which is the point).
            let launched =
                unsafe { launch!(kernel<<<64, 256, 0, stream>>>(ptr, bytes as i32, 0x5Au32)) };
            launched.and_then(|()| stream.synchronize())
        }
        other => panic!("unknown write {other}"),
    };
    match answer {
        Ok(()) => "ok".into(),
        Err(e) => format!("{:?}", e.0),
    }
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = fd_connect(&args[0]);
        let ctx = gpu();
        let how = args.get(1).map(String::as_str).unwrap_or("none");
        let (data, enforced, ptr, bytes) = match role {
            "arena" => {
                let arena = s.recv_arena_read_only(&ctx, T).unwrap();
                let handle = ArenaHandle::<u32>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
                let view = arena.open(&handle).unwrap();
                let out = (
                    read(&view),
                    arena.is_enforced_by_gpu(),
                    view.as_raw_ptr(),
                    view.byte_len(),
                );
                std::mem::forget((view, arena)); // kept mapped until the process exits
                out
            }
            "fd" => {
                let buf = s.recv_buffer_read_only::<u32>(&ctx, T).unwrap();
                let out = (
                    read(&buf),
                    buf.is_enforced_by_gpu(),
                    buf.as_raw_ptr(),
                    buf.byte_len(),
                );
                std::mem::forget(buf);
                out
            }
            "pool" => {
                let pool = s.recv_pool_read_only(&ctx, T).unwrap();
                let handle = PoolHandle::<u32>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
                let view = pool.open(&handle).unwrap();
                let out = (
                    read(&view),
                    pool.is_enforced_by_gpu(),
                    view.as_raw_ptr(),
                    view.byte_len(),
                );
                std::mem::forget((view, pool));
                out
            }
            // A read-write open of an export marked read-only.
            "rw_arena" => {
                report(refusal(s.recv_arena(&ctx, T).map(drop)));
                return 0;
            }
            "rw_fd" => {
                report(refusal(s.recv_buffer::<u32>(&ctx, T).map(drop)));
                return 0;
            }
            "rw_pool" => {
                report(refusal(s.recv_pool(&ctx, T).map(drop)));
                return 0;
            }
            "ro_legacy" => {
                report(refusal(s.recv_buffer_read_only::<u32>(&ctx, T).map(drop)));
                return 0;
            }
            other => panic!("unknown role {other}"),
        };
        report(format!("intact {}", data == pattern(LEN, SEED)));
        report(format!("enforced {enforced}"));
        if how != "none" {
            report(format!("write {}", write_through(&ctx, ptr, bytes, how)));
        }
        s.send(b"done", &[], T).unwrap();
        expect_message(&s, b"bye");
        0
    });
}

/// How a refused open was refused.
fn refusal(outcome: cuda_ipc::Result<()>) -> String {
    match outcome {
        Ok(()) => "opened".into(),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::ReadOnly,
            ..
        }) => "refused: read-only".into(),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::NoReadOnlyMapping,
            ..
        }) => "refused: no read-only mapping".into(),
        Err(e) => format!("refused otherwise: {e}"),
    }
}

/// The owner's side of one kind: its data (`pattern(LEN, SEED)`), marked read-only for
/// importers or not, sent to a child running `role` with `how`; returns the child's results
/// and whether the owner's data is still intact after the child's attempt.
fn share(kind: &str, role: &str, how: &str, marked: bool) -> (Vec<String>, bool) {
    let ctx = gpu();
    let (l, raw) = fd_listener(&format!("read-only-{role}-{how}"));
    let child = spawn(role, &[&raw, how]);
    let s = l.accept(T).unwrap();
    let data = pattern(LEN, SEED);
    let intact = |slice: &cuda_ipc::GpuSlice<u32>| {
        let mut host = vec![0u32; LEN];
        slice.copy_to_host(&mut host).unwrap();
        host == data
    };
    let finish = |s: &FdSocket, child: common::Child| {
        if role.starts_with("rw_") || role == "ro_legacy" {
            return child.expect_success(T);
        }
        expect_message(s, b"done");
        s.send(b"bye", &[], T).unwrap();
        child.expect_success(T)
    };
    match kind {
        "arena" => {
            let arena = IpcArena::new(&ctx, 4 << 20).unwrap();
            let arena = if marked {
                arena.read_only_for_importers()
            } else {
                arena
            };
            let buf = arena.alloc::<u32>(LEN).unwrap();
            buf.copy_from_host(&data).unwrap();
            s.send_arena(&arena, T).unwrap();
            if !role.starts_with("rw_") {
                s.send(buf.handle().as_bytes(), &[], T).unwrap();
            }
            let out = finish(&s, child);
            (out, intact(&buf))
        }
        "fd" | "legacy" | "pool_buffer" => {
            let handle_type = match kind {
                "fd" => HandleType::PosixFd,
                "pool_buffer" => HandleType::Pool,
                _ => HandleType::Legacy,
            };
            let buf = IpcBuffer::<u32>::new_with(&ctx, LEN, handle_type).unwrap();
            let buf = if marked {
                buf.read_only_for_importers()
            } else {
                buf
            };
            buf.copy_from_host(&data).unwrap();
            s.send_buffer(&buf, T).unwrap();
            let out = finish(&s, child);
            (out, intact(&buf))
        }
        "pool" => {
            let pool = IpcPool::new(&ctx).unwrap();
            let pool = if marked {
                pool.read_only_for_importers()
            } else {
                pool
            };
            let buf = pool.alloc::<u32>(LEN, &RawStream::LEGACY).unwrap();
            buf.copy_from_host(&data).unwrap();
            s.send_pool(&pool, T).unwrap();
            if !role.starts_with("rw_") {
                s.send(buf.handle().unwrap().as_bytes(), &[], T).unwrap();
            }
            let out = finish(&s, child);
            let still = intact(&buf);
            buf.free_async(&RawStream::LEGACY).unwrap();
            (out, still)
        }
        other => panic!("unknown kind {other}"),
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_read_only_arena_or_fd_buffer_refuses_every_write_and_the_owners_data_stays_intact() {
    let _dog = watchdog("read-only: writes refused", Duration::from_secs(240));
    for kind in ["arena", "fd"] {
        for how in ["none", "memset", "htod", "kernel"] {
            let (out, intact) = share(kind, kind, how, false);
            assert!(
                out.contains(&"intact true".to_string()),
                "{kind} {how}: {out:?}"
            );
            assert!(
                out.contains(&"enforced true".to_string()),
                "{kind} {how}: {out:?}"
            );
            let expected = match how {
                "none" => None,
                "memset" | "htod" => Some("write CUDA_ERROR_INVALID_VALUE"),
                _ => Some("write CUDA_ERROR_ILLEGAL_ADDRESS"),
            };
            if let Some(expected) = expected {
                assert!(
                    out.iter().any(|l| l == expected),
                    "{kind} {how}: expected {expected:?}, the reader reported {out:?}"
                );
            }
            assert!(intact, "{kind} {how}: the owner's data changed: {out:?}");
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_read_only_pool_is_read_only_by_type_only_and_a_raw_write_reaches_the_owner() {
    let _dog = watchdog("read-only: pool", Duration::from_secs(60));
    let (out, _) = share("pool", "pool", "none", false);
    assert!(out.contains(&"intact true".to_string()), "{out:?}");
    assert!(out.contains(&"enforced false".to_string()), "{out:?}");
    // The documented limit, checked: the driver cannot map a pool read-only, so a raw write
    // through a ReadOnlyPool view's address goes through.
    let (out, intact) = share("pool", "pool", "memset", false);
    assert!(out.contains(&"write ok".to_string()), "{out:?}");
    assert!(
        !intact,
        "a raw write through a read-only pool view did not land: {out:?}"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_export_marked_read_only_refuses_read_write_opens_and_opens_read_only() {
    let _dog = watchdog("read-only: marked exports", Duration::from_secs(120));
    // (kind, the reader's role): an `IpcBuffer` of `HandleType::Pool` travels as a buffer
    // (`send_buffer`, `recv_buffer_read_only`), as a POSIX-fd one does.
    for (kind, role) in [
        ("arena", "arena"),
        ("fd", "fd"),
        ("pool", "pool"),
        ("pool_buffer", "fd"),
    ] {
        let (out, intact) = share(kind, &format!("rw_{role}"), "none", true);
        assert_eq!(out, vec!["refused: read-only"], "{kind}");
        assert!(intact);
        let (out, intact) = share(kind, role, "none", true);
        assert!(out.contains(&"intact true".to_string()), "{kind}: {out:?}");
        assert!(intact);
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_legacy_buffer_cannot_be_shared_or_opened_read_only() {
    let _dog = watchdog("read-only: legacy", Duration::from_secs(60));
    let ctx = gpu();
    let marked = IpcBuffer::<u32>::new(&ctx, 16)
        .unwrap()
        .read_only_for_importers();
    for refused in [marked.handle().map(drop), marked.raw_export().map(drop)] {
        assert!(
            matches!(
                refused,
                Err(Error::HandleTypeMismatch {
                    handle: HandleType::Legacy,
                    conflict: TypeConflict::NoReadOnlyMapping,
                })
            ),
            "{refused:?}"
        );
    }
    let (out, _) = share("legacy", "ro_legacy", "none", false);
    assert_eq!(out, vec!["refused: no read-only mapping"]);
}

#[test]
#[ignore = "requires a CUDA device"]
fn read_only_and_read_write_imports_of_one_arena_are_two_mappings_of_one_memory() {
    let _dog = watchdog("read-only: two mappings", Duration::from_secs(60));
    let ctx = gpu();
    let arena = IpcArena::new(&ctx, 2 << 20).unwrap();
    let buf = arena.alloc::<u32>(1024).unwrap();
    buf.copy_from_host(&pattern(1024, 1)).unwrap();
    let (h, fd) = arena.export_fd().unwrap();
    let writable = cuda_ipc::arena::ImportedArena::open_fd(&ctx, &h, fd).unwrap();
    let (h, fd) = arena.export_fd().unwrap();
    let readable = ReadOnlyArena::open_fd(&ctx, &h, fd).unwrap();
    let (h2, fd2) = arena.export_fd().unwrap();
    let again = ReadOnlyArena::open_fd(&ctx, &h2, fd2).unwrap();
    let w = writable.open(&buf.handle()).unwrap();
    let r = readable.open(&buf.handle()).unwrap();
    let r2 = again.open(&buf.handle()).unwrap();
    assert_ne!(
        w.as_raw_ptr(),
        r.as_raw_ptr(),
        "one mapping for both accesses"
    );
    assert_eq!(
        r.as_raw_ptr(),
        r2.as_raw_ptr(),
        "read-only imports share one mapping"
    );
    w.copy_from_host(&pattern(1024, 2)).unwrap();
    assert_eq!(
        read(&r),
        pattern(1024, 2),
        "the read-only mapping sees the write"
    );
    assert_eq!(read(buf.as_read_only()), pattern(1024, 2));
}
