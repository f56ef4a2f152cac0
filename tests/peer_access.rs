//! Granting another device of the process access to shared memory (`grant_access`), for every
//! kind of memory the crate shares, as its owner and as its importer: a process with a context
//! on each of two GPUs holds memory mapped for the first; before the grant, a copy enqueued on
//! the second device into virtual memory (POSIX-fd buffers, arenas, pools) is refused by the
//! driver; after it, a kernel on the second device writes every byte, and the first device
//! reads what it wrote (the importer's writes are read by the owner, in its own process). An
//! import mapped for the second device and granted to the first — the device that holds the
//! memory — works the same way. A legacy import cannot be granted (the driver maps it for its
//! context only): the grant is refused, and the handle opened in the second device's context
//! works instead. Each case runs in a process of its own, so a fault cannot hide
//! behind another case. These need two GPUs, each reaching the other; on one GPU, granting the
//! memory's own device does nothing and succeeds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::Duration;

use common::cuda::{DeviceBuffer, Module, Stream, StreamFlags, launch};
use common::{expect_message, fd_connect, fd_listener, gpu, report, spawn, watchdog};
use cuda_ipc::arena::{ArenaHandle, IpcArena};
use cuda_ipc::error::TypeConflict;
use cuda_ipc::fd::FdSocket;
use cuda_ipc::pool::{IpcPool, PoolHandle};
use cuda_ipc::{GpuContext, HandleType, ImportedBuffer, IpcBuffer, IpcMemHandle, RawStream};

const T: Duration = Duration::from_secs(20);
const BYTES: usize = 4 << 20;
const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

/// Copy `BYTES` from new memory of `ctx`'s device to `ptr`, in `ctx` (`cuMemcpyDtoD`).
fn copy_in(ctx: &GpuContext, ptr: u64) -> Result<(), String> {
    ctx.make_current().map_err(|e| e.to_string())?;
    let src = DeviceBuffer::<u8>::zeroed(BYTES).map_err(|e| e.to_string())?;
    // SAFETY: `ptr..ptr + BYTES` is memory this process maps for the whole call, and `src`
    // holds BYTES bytes.
    let rc = unsafe { cuda_ipc::driver::sys::cuMemcpyDtoD_v2(ptr, src.as_raw_ptr(), BYTES) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "cuMemcpyDtoD: {}",
            cuda_ipc::driver::error_name(rc)
        ))
    }
}

/// Set every byte of `ptr..ptr + BYTES` to `val` with a kernel on `ctx`'s device, and wait.
fn kernel_writes(ctx: &GpuContext, ptr: u64, val: u8) -> Result<(), String> {
    ctx.make_current().map_err(|e| e.to_string())?;
    let module = Module::from_ptx(KERNELS, &[]).map_err(|e| e.to_string())?;
    let f = module
        .get_function("simple_kernel")
        .map_err(|e| e.to_string())?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(|e| e.to_string())?;
    // SAFETY: the arguments match simple_kernel's PTX signature; the memory outlives the
    // synchronize below.
    unsafe { launch!(f<<<64, 256, 0, stream>>>(ptr, BYTES as i32, u32::from(val))) }
        .map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())
}

/// The second device (`to`) is refused before `grant` (virtual memory only: legacy memory is
/// copied through the driver either way), then, once granted (twice: the second is a no-op),
/// a kernel there writes `val` over `ptr..ptr + BYTES`. Reports one line per step.
fn through(
    to: &GpuContext,
    ptr: u64,
    vmm: bool,
    val: u8,
    grant: impl Fn() -> cuda_ipc::Result<()>,
) {
    if vmm {
        match copy_in(to, ptr) {
            Err(e) => {
                eprintln!("before the grant: {e}");
                report("refused");
            }
            Ok(()) => report("copied before the grant"),
        }
    }
    match grant().and_then(|()| grant()) {
        Ok(()) => report("granted"),
        Err(e) => report(format!("grant failed: {e}")),
    }
    match kernel_writes(to, ptr, val) {
        Ok(()) => report("written"),
        Err(e) => report(format!("kernel failed: {e}")),
    }
}

/// Whether every byte of `mem` is `val` (read in `mem`'s own context).
fn all_are(mem: &cuda_ipc::GpuSlice<u8>, val: u8) -> bool {
    let mut host = vec![0u8; BYTES];
    mem.copy_to_host(&mut host).unwrap();
    host.iter().all(|&b| b == val)
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let (ctx0, ctx1) = (GpuContext::new(0).unwrap(), GpuContext::new(1).unwrap());
        match role {
            "own" => own(&args[0], &ctx0, &ctx1),
            "import" => {
                let s = fd_connect(&args[1]);
                import(&s, &args[0], &ctx0, &ctx1);
                s.send(b"done", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            other => panic!("unknown role {other}"),
        }
        0
    });
}

/// Memory of this process on device 0, granted to device 1, read back on device 0.
fn own(kind: &str, ctx0: &GpuContext, ctx1: &GpuContext) {
    let val = 0x5A;
    let read = match kind {
        "legacy" | "fd" => {
            let ht = if kind == "fd" {
                HandleType::PosixFd
            } else {
                HandleType::Legacy
            };
            let b = IpcBuffer::<u8>::zeroed_with(ctx0, BYTES, ht).unwrap();
            through(ctx1, b.as_raw_ptr(), kind == "fd", val, || {
                b.grant_access(ctx1)
            });
            all_are(&b, val)
        }
        "arena" => {
            let arena = IpcArena::new(ctx0, 2 * BYTES).unwrap();
            let b = arena.alloc_zeroed::<u8>(BYTES).unwrap();
            through(ctx1, b.as_raw_ptr(), true, val, || arena.grant_access(ctx1));
            all_are(&b, val)
        }
        "pool" => {
            let pool = IpcPool::new(ctx0).unwrap();
            let b = pool.alloc::<u8>(BYTES, &RawStream::LEGACY).unwrap();
            b.memset_bytes(0).unwrap();
            through(ctx1, b.as_raw_ptr(), true, val, || pool.grant_access(ctx1));
            all_are(&b, val)
        }
        "pooled" => {
            let b = IpcBuffer::<u8>::zeroed_with(ctx0, BYTES, HandleType::Pool).unwrap();
            through(ctx1, b.as_raw_ptr(), true, val, || b.grant_access(ctx1));
            all_are(&b, val)
        }
        other => panic!("unknown kind {other}"),
    };
    report(format!("read {read}"));
}

/// Memory of the owner (device 0), imported here for device 0 and granted to device 1 — or,
/// for `fd_reverse`, imported for device 1 and granted to device 0, which holds it. The owner
/// reads the result.
fn import(s: &FdSocket, kind: &str, ctx0: &GpuContext, ctx1: &GpuContext) {
    let val = 0xC3;
    match kind {
        // A legacy import is mapped for its context only: refused, and opened there instead.
        "legacy" => {
            let h = IpcMemHandle::<u8>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
            let v0 = ImportedBuffer::open(ctx0, &h).unwrap();
            match v0.grant_access(ctx1) {
                Err(cuda_ipc::Error::HandleTypeMismatch {
                    conflict: TypeConflict::ImportMappedPerContext,
                    ..
                }) => report("not grantable"),
                other => report(format!("grant: {other:?}")),
            }
            let v1 = ImportedBuffer::open(ctx1, &h).unwrap();
            match kernel_writes(ctx1, v1.as_raw_ptr(), val) {
                Ok(()) => report("written"),
                Err(e) => report(format!("kernel failed: {e}")),
            }
        }
        "fd" | "pooled" => {
            let v = s.recv_buffer::<u8>(ctx0, T).unwrap();
            through(ctx1, v.as_raw_ptr(), true, val, || v.grant_access(ctx1));
        }
        "fd_reverse" => {
            let v = s.recv_buffer::<u8>(ctx1, T).unwrap();
            through(ctx0, v.as_raw_ptr(), true, val, || v.grant_access(ctx0));
        }
        "arena" => {
            let a = s.recv_arena(ctx0, T).unwrap();
            let h = ArenaHandle::<u8>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
            let v = a.open(&h).unwrap();
            through(ctx1, v.as_raw_ptr(), true, val, || a.grant_access(ctx1));
        }
        "pool" => {
            let p = s.recv_pool(ctx0, T).unwrap();
            let h = PoolHandle::<u8>::from_bytes(&s.recv(T).unwrap().payload).unwrap();
            let v = p.open(&h).unwrap();
            through(ctx1, v.as_raw_ptr(), true, val, || p.grant_access(ctx1));
        }
        other => panic!("unknown kind {other}"),
    }
}

/// What a case must report: refused first for virtual memory, then granted and written.
fn expected(vmm: bool) -> Vec<&'static str> {
    let mut lines = if vmm { vec!["refused"] } else { vec![] };
    lines.extend(["granted", "written"]);
    lines
}

fn run_own(kind: &str) {
    let lines = spawn("own", &[kind]).expect_success(T * 3);
    eprintln!("own {kind}: {lines:?}");
    let mut want = expected(kind != "legacy");
    want.push("read true");
    assert_eq!(lines, want, "own {kind}");
}

/// The owner's side of an import case: memory on device 0, zeroed, sent; once the importer is
/// done, every byte must be what its kernel wrote.
fn run_import(kind: &str) {
    let ctx = GpuContext::new(0).unwrap();
    let (l, raw) = fd_listener(&format!("peer-access-{kind}"));
    let child = spawn("import", &[kind, &raw]);
    let s = l.accept(T).unwrap();
    let mem: Box<dyn std::ops::Deref<Target = cuda_ipc::GpuSlice<u8>>> = match kind {
        "legacy" => {
            let b = IpcBuffer::<u8>::zeroed(&ctx, BYTES).unwrap();
            s.send(b.handle().unwrap().as_bytes(), &[], T).unwrap();
            Box::new(b)
        }
        "fd" | "fd_reverse" | "pooled" => {
            let ht = if kind == "pooled" {
                HandleType::Pool
            } else {
                HandleType::PosixFd
            };
            let b = IpcBuffer::<u8>::zeroed_with(&ctx, BYTES, ht).unwrap();
            s.send_buffer(&b, T).unwrap();
            Box::new(b)
        }
        "arena" => {
            let arena = IpcArena::new(&ctx, 2 * BYTES).unwrap();
            let b = arena.alloc_zeroed::<u8>(BYTES).unwrap();
            s.send_arena(&arena, T).unwrap();
            s.send(b.handle().as_bytes(), &[], T).unwrap();
            Box::new(b)
        }
        "pool" => {
            let pool = IpcPool::new(&ctx).unwrap();
            let b = pool.alloc::<u8>(BYTES, &RawStream::LEGACY).unwrap();
            b.memset_bytes(0).unwrap();
            s.send_pool(&pool, T).unwrap();
            s.send(b.handle().unwrap().as_bytes(), &[], T).unwrap();
            Box::new(b)
        }
        other => panic!("unknown kind {other}"),
    };
    expect_message(&s, b"done");
    let read = all_are(&mem, 0xC3);
    s.send(b"bye", &[], T).unwrap();
    let lines = child.expect_success(T * 3);
    eprintln!("import {kind}: {lines:?}");
    let want = if kind == "legacy" {
        vec!["not grantable", "written"]
    } else {
        expected(true)
    };
    assert_eq!(lines, want, "import {kind}");
    assert!(
        read,
        "import {kind}: the owner must read what the importer's kernel wrote"
    );
}

/// Whether the test `name` can run here: two GPUs, each reaching the other.
fn two_gpus(name: &str) -> bool {
    common::has_gpus(2, name) && common::peers(1, 0, name) && common::peers(0, 1, name)
}

macro_rules! two_gpu_case {
    ($name:ident, $run:ident, $kind:literal) => {
        #[test]
        #[ignore = "requires a CUDA device"]
        fn $name() {
            let _dog = watchdog(
                concat!("peer_access_", stringify!($name)),
                Duration::from_secs(120),
            );
            if two_gpus(stringify!($name)) {
                $run($kind);
            }
        }
    };
}

two_gpu_case!(
    an_owned_legacy_buffer_granted_to_a_second_device,
    run_own,
    "legacy"
);
two_gpu_case!(
    an_owned_posix_fd_buffer_granted_to_a_second_device,
    run_own,
    "fd"
);
two_gpu_case!(an_owned_arena_granted_to_a_second_device, run_own, "arena");
two_gpu_case!(an_owned_pool_granted_to_a_second_device, run_own, "pool");
two_gpu_case!(
    an_imported_legacy_buffer_is_refused_and_opened_on_a_second_device_instead,
    run_import,
    "legacy"
);
two_gpu_case!(
    an_imported_posix_fd_buffer_granted_to_a_second_device,
    run_import,
    "fd"
);
two_gpu_case!(
    an_imported_posix_fd_buffer_granted_to_the_device_holding_it,
    run_import,
    "fd_reverse"
);
two_gpu_case!(
    an_owned_pool_kind_buffer_granted_to_a_second_device,
    run_own,
    "pooled"
);
two_gpu_case!(
    an_imported_pool_kind_buffer_granted_to_a_second_device,
    run_import,
    "pooled"
);
two_gpu_case!(
    an_imported_arena_granted_to_a_second_device,
    run_import,
    "arena"
);
two_gpu_case!(
    an_imported_pool_granted_to_a_second_device,
    run_import,
    "pool"
);

/// On any machine with a GPU: granting the memory's own device succeeds and changes nothing.
#[test]
#[ignore = "requires a CUDA device"]
fn granting_the_memorys_own_device_does_nothing() {
    let _dog = watchdog("peer_access_own_device", Duration::from_secs(60));
    let ctx = gpu();
    let legacy = IpcBuffer::<u32>::new(&ctx, 1024).unwrap();
    legacy.grant_access(&ctx).unwrap();
    let fd = IpcBuffer::<u32>::new_with(&ctx, 1024, HandleType::PosixFd).unwrap();
    fd.grant_access(&ctx).unwrap();
    let arena = IpcArena::new(&ctx, 1 << 20).unwrap();
    arena.grant_access(&ctx).unwrap();
    let pool = IpcPool::new(&ctx).unwrap();
    pool.grant_access(&ctx).unwrap();
    let b = pool.alloc::<u32>(1024, &RawStream::LEGACY).unwrap();
    b.copy_from_host(&[7; 1024]).unwrap();
    let mut host = vec![0u32; 1024];
    b.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&v| v == 7));
}
