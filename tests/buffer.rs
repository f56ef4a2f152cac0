//! IpcBuffer across processes on the GPU: data round trips on one and two GPUs, the import
//! cache, and every refusal (self-open, wrong type or length, stale handle, exporter gone),
//! leases when an importer dies, and the committed kernels.
//!
//! GPU tests are `#[ignore = "requires a CUDA device"]`: run them with `--include-ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{Module, Stream, StreamFlags, launch};
use common::{gpu, pattern, report, spawn, unique_name, wait_for, watchdog};
use cuda_ipc::error::{HandleDefect, PeerRole};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{Error, GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle, ShmSafe};

const KERNELS: &str = include_str!("../kernels/simple_ipc.ptx");

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    mem: ShmCell<IpcMemHandle<u32>>,
    phase: AtomicU32,
    done: AtomicU32,
    ptr: AtomicU64,
}

fn region() -> ShmRegion<Shared> {
    ShmOptions::new(unique_name("gpu-buf")).create().unwrap()
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let shared = ShmOptions::new(&args[0])
            .open::<Shared>()
            .expect("open region");
        match role {
            // Open on `device`, check the pattern, write the doubled pattern back.
            "verify_and_double" => {
                let device: u32 = args[1].parse().unwrap();
                let ctx = GpuContext::new(device).unwrap();
                let h = shared.mem.load();
                let buf = ImportedBuffer::open(&ctx, &h).unwrap();
                let mut host = vec![0u32; buf.len()];
                buf.copy_to_host(&mut host).unwrap();
                assert_eq!(
                    host,
                    pattern(buf.len(), 7),
                    "importer on device {device} read wrong data"
                );
                let doubled: Vec<u32> = host.iter().map(|x| x.wrapping_mul(2)).collect();
                buf.copy_from_host(&doubled).unwrap();
                report("verified");
                0
            }
            // Open twice: one mapping, one lease; hold until phase 1.
            "open_twice" => {
                let ctx = gpu();
                let h = shared.mem.load();
                let a = ImportedBuffer::open(&ctx, &h).unwrap();
                let b = ImportedBuffer::open(&ctx, &h).unwrap();
                assert_eq!(
                    a.as_raw_ptr(),
                    b.as_raw_ptr(),
                    "the cache must share one mapping"
                );
                drop(a);
                let mut host = vec![0u32; b.len()];
                b.copy_to_host(&mut host).unwrap(); // still mapped after one view dropped
                assert_eq!(host, pattern(b.len(), 7));
                shared.done.store(1, Ordering::Release);
                while shared.phase.load(Ordering::Acquire) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(b);
                let again = ImportedBuffer::open(&ctx, &h).unwrap(); // a fresh open after close
                again.copy_to_host(&mut host).unwrap();
                assert_eq!(host, pattern(again.len(), 7));
                report("ok");
                0
            }
            "expect_stale" => {
                let ctx = gpu();
                match ImportedBuffer::open(&ctx, &shared.mem.load()) {
                    Err(Error::StaleHandle { .. }) => report("stale"),
                    other => report(format!("unexpected {:?}", other.map(|b| b.as_raw_ptr()))),
                }
                0
            }
            "expect_unreachable" => {
                // Run with CUDA_VISIBLE_DEVICES=0: the buffer's device 1 is not visible.
                let ctx = gpu();
                match ImportedBuffer::open(&ctx, &shared.mem.load()) {
                    Err(Error::DeviceNotReachable { peer: None, .. }) => {
                        report("unreachable: not visible")
                    }
                    other => report(format!("unexpected {:?}", other.map(|b| b.as_raw_ptr()))),
                }
                0
            }
            "expect_exporter_gone" => {
                let ctx = gpu();
                match ImportedBuffer::open(&ctx, &shared.mem.load()) {
                    Err(Error::PeerGone {
                        pid,
                        role: PeerRole::Exporter,
                    }) => report(format!("gone {pid}")),
                    other => report(format!("unexpected {:?}", other.map(|b| b.as_raw_ptr()))),
                }
                0
            }
            // Export a buffer holding the pattern and sleep until killed.
            "export_and_sleep" => {
                let ctx = gpu();
                let buf = IpcBuffer::<u32>::new(&ctx, 1 << 16).unwrap();
                buf.copy_from_host(&pattern(1 << 16, 7)).unwrap();
                shared.mem.store(buf.handle().unwrap());
                shared.done.store(1, Ordering::Release);
                std::thread::sleep(Duration::from_secs(50));
                1
            }
            // Open, announce, sleep until killed.
            "open_and_sleep" => {
                let ctx = gpu();
                let buf = ImportedBuffer::open(&ctx, &shared.mem.load()).unwrap();
                shared.ptr.store(buf.as_raw_ptr(), Ordering::Release);
                shared.done.store(1, Ordering::Release);
                std::thread::sleep(Duration::from_secs(50));
                1
            }
            // The envelope's length is the peer's word. Forge it (and
            // reseal: the checksum is integrity, not authenticity) and try both paths.
            "forged_lengths" => {
                let ctx = gpu();
                let h = shared.mem.load();
                let forged = with_len(&h, h.len() as u64 * 1024);
                // Through the import cache (a real view is open): refused, not served.
                let real = ImportedBuffer::open(&ctx, &h).unwrap();
                match ImportedBuffer::open(&ctx, &forged) {
                    Err(Error::CorruptHandle {
                        defect: defect @ HandleDefect::Memory { .. },
                    }) => report(format!("hit: {defect}")),
                    other => report(format!("hit: unexpected {:?}", other.map(|b| b.len()))),
                }
                drop(real);
                // A first open: held to the size the driver reports for the mapping.
                match ImportedBuffer::open(&ctx, &forged) {
                    Err(Error::CorruptHandle {
                        defect: defect @ HandleDefect::Memory { .. },
                    }) => report(format!("miss: {defect}")),
                    other => report(format!("miss: unexpected {:?}", other.map(|b| b.len()))),
                }
                // Nothing is left behind: the real handle still opens, with its real length.
                let real = ImportedBuffer::open(&ctx, &h).unwrap();
                let mut host = vec![0u32; real.len()];
                real.copy_to_host(&mut host).unwrap();
                assert_eq!(host, pattern(real.len(), 7));
                report(format!("real {}", real.len()));
                0
            }
            // A cache hit must see that the exporter is closing. Hold a
            // view and keep re-opening (cache hits) until refused, then let the close finish.
            "reopen_until_closing" => {
                let ctx = gpu();
                let h = shared.mem.load();
                let held = ImportedBuffer::open(&ctx, &h).unwrap();
                shared.done.store(1, Ordering::Release);
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                let outcome = loop {
                    match ImportedBuffer::open(&ctx, &h) {
                        Ok(view) => drop(view),
                        Err(e) => break format!("refused: {e:?}"),
                    }
                    if std::time::Instant::now() > deadline {
                        break "never refused while closing".to_owned();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                drop(held);
                report(outcome);
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// `h` with its length replaced by `len`, resealed so that only the length is wrong.
fn with_len(h: &IpcMemHandle<u32>, len: u64) -> IpcMemHandle<u32> {
    let mut bytes = h.as_bytes().to_vec();
    bytes[24..32].copy_from_slice(&len.to_le_bytes());
    cuda_ipc::__private::reseal(&mut bytes);
    let forged = IpcMemHandle::<u32>::from_bytes(&bytes).unwrap();
    assert_eq!(forged.len() as u64, len);
    forged
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_forged_length_is_refused_on_first_open_and_on_a_cache_hit() {
    let _dog = watchdog("forged_lengths", Duration::from_secs(60));
    let ctx = gpu();
    let shared = region();
    let buf = IpcBuffer::<u32>::new(&ctx, 1 << 16).unwrap();
    buf.copy_from_host(&pattern(1 << 16, 7)).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let out = spawn("forged_lengths", &[shared.name()]).expect_success(Duration::from_secs(50));
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(
        out[0].starts_with("hit: ") && out[0].contains("already maps the same export"),
        "{out:?}"
    );
    assert!(
        out[1].starts_with("miss: ") && out[1].contains("cuPointerGetAttributes"),
        "{out:?}"
    );
    assert_eq!(out[2], format!("real {}", 1 << 16));
    assert!(buf.importers().is_empty());
    buf.close(Duration::ZERO).unwrap();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_cache_hit_is_refused_once_the_exporter_closes() {
    let _dog = watchdog("hit_while_closing", Duration::from_secs(60));
    let ctx = gpu();
    let shared = region();
    let buf = IpcBuffer::<u32>::new(&ctx, 4096).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let child = spawn("reopen_until_closing", &[shared.name()]);
    wait_for("child opened", Duration::from_secs(30), || {
        shared.done.load(Ordering::Acquire) == 1
    });
    // Waits for the child's lease; the child's next open must see the table closing.
    buf.close(Duration::from_secs(30)).unwrap();
    let out = child.expect_success(Duration::from_secs(30));
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(out[0].starts_with("refused: StaleHandle"), "{out:?}");
}

fn round_trip(importer_device: u32) {
    let _dog = watchdog("round_trip", Duration::from_secs(60));
    let ctx = gpu();
    let shared = region();
    let len = 1 << 20;
    let buf = IpcBuffer::<u32>::new(&ctx, len).unwrap();
    buf.copy_from_host(&pattern(len, 7)).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let out = spawn(
        "verify_and_double",
        &[shared.name(), &importer_device.to_string()],
    )
    .expect_success(Duration::from_secs(50));
    assert_eq!(out, vec!["verified"]);
    let mut host = vec![0u32; len];
    buf.copy_to_host(&mut host).unwrap();
    let expect: Vec<u32> = pattern(len, 7).iter().map(|x| x.wrapping_mul(2)).collect();
    assert_eq!(host, expect, "exporter must see the importer's writes");
    assert!(
        buf.importers().is_empty(),
        "the importer's lease is released at its exit"
    );
    buf.close(Duration::ZERO).unwrap();
}

#[test]
#[ignore = "requires a CUDA device"]
fn round_trip_across_processes_on_one_gpu() {
    round_trip(0);
}

#[test]
#[ignore = "requires a CUDA device"]
fn round_trip_across_processes_and_two_gpus() {
    if !common::has_gpus(2, "round_trip_across_processes_and_two_gpus") {
        return;
    }
    // Exported on device 0, mapped in a context of device 1 (lazy peer access).
    round_trip(1);
}

#[test]
#[ignore = "requires a CUDA device"]
fn memory_on_an_invisible_device_is_refused_before_cuda() {
    if !common::has_gpus(2, "memory_on_an_invisible_device_is_refused_before_cuda") {
        return;
    }
    let _dog = watchdog("unreachable", Duration::from_secs(60));
    let ctx1 = GpuContext::new(1).unwrap();
    let shared = region();
    let buf = IpcBuffer::<u32>::new(&ctx1, 1024).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let out = common::spawn_env(
        "expect_unreachable",
        &[shared.name()],
        &[("CUDA_VISIBLE_DEVICES", "0")],
    )
    .expect_success(Duration::from_secs(50));
    assert_eq!(out, vec!["unreachable: not visible"]);
}

#[test]
#[ignore = "requires a CUDA device"]
fn opening_twice_shares_one_mapping_and_one_lease() {
    let _dog = watchdog("twice", Duration::from_secs(60));
    let ctx = gpu();
    let shared = region();
    let buf = IpcBuffer::<u32>::new(&ctx, 4096).unwrap();
    buf.copy_from_host(&pattern(4096, 7)).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let child = spawn("open_twice", &[shared.name()]);
    wait_for("child opened", Duration::from_secs(30), || {
        shared.done.load(Ordering::Acquire) == 1
    });
    assert_eq!(
        buf.importers(),
        vec![child.pid()],
        "one lease per importing process"
    );
    shared.phase.store(1, Ordering::Release);
    assert_eq!(child.expect_success(Duration::from_secs(30)), vec!["ok"]);
    assert!(buf.importers().is_empty());
}

#[test]
#[ignore = "requires a CUDA device"]
fn opening_in_the_exporting_process_is_refused_before_cuda() {
    let ctx = gpu();
    let buf = IpcBuffer::<u32>::new(&ctx, 16).unwrap();
    let h = buf.handle().unwrap();
    assert!(matches!(
        ImportedBuffer::open(&ctx, &h),
        Err(Error::SameProcess { pid }) if pid == std::process::id()
    ));
}

#[test]
#[ignore = "requires a CUDA device"]
fn wrong_type_and_wrong_length_are_refused() {
    let ctx = gpu();
    let buf = IpcBuffer::<u32>::new(&ctx, 16).unwrap();
    let h = buf.handle().unwrap();
    let as_f32 = IpcMemHandle::<f32>::from_bytes(h.as_bytes()).unwrap();
    assert!(matches!(
        ImportedBuffer::open(&ctx, &as_f32),
        Err(Error::TypeMismatch {
            found_size: 4,
            expected_size: 4,
            ..
        })
    ));
    let as_u64 = IpcMemHandle::<u64>::from_bytes(h.as_bytes()).unwrap();
    assert!(matches!(
        ImportedBuffer::open(&ctx, &as_u64),
        Err(Error::TypeMismatch {
            found_size: 4,
            expected_size: 8,
            ..
        })
    ));
    assert!(matches!(
        ImportedBuffer::open_exact(&ctx, &h, 17),
        Err(Error::LengthMismatch {
            expected: 17,
            found: 16
        })
    ));
    // A bit flipped anywhere is caught before the driver sees the handle.
    let mut bytes = h.as_bytes().to_vec();
    bytes[120] ^= 0x10; // inside the CUDA handle
    assert!(matches!(
        IpcMemHandle::<u32>::from_bytes(&bytes),
        Err(Error::CorruptHandle { .. })
    ));
    assert!(buf.handle().is_ok());
    let _ = IpcMemHandle::<u32>::from_bytes(&[0u8; 3]).unwrap_err();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_freed_buffers_handle_never_opens_its_successor() {
    let _dog = watchdog("stale", Duration::from_secs(60));
    let ctx = gpu();
    let shared = region();
    let len = 1 << 20;
    let old = IpcBuffer::<u32>::new(&ctx, len).unwrap();
    let old_ptr = old.as_raw_ptr();
    let old_handle = old.handle().unwrap();
    old.close(Duration::ZERO).unwrap();
    let new = IpcBuffer::<u32>::new(&ctx, len).unwrap();
    new.copy_from_host(&pattern(len, 7)).unwrap();
    eprintln!(
        "freed buffer at {old_ptr:#x}, new one at {:#x} ({})",
        new.as_raw_ptr(),
        if new.as_raw_ptr() == old_ptr {
            "same address: the raw handle would map it"
        } else {
            "different address"
        }
    );
    shared.mem.store(old_handle);
    let out = spawn("expect_stale", &[shared.name()]).expect_success(Duration::from_secs(50));
    assert_eq!(out, vec!["stale"]);
    // The successor's own handle works.
    shared.mem.store(new.handle().unwrap());
    let out =
        spawn("verify_and_double", &[shared.name(), "0"]).expect_success(Duration::from_secs(50));
    assert_eq!(out, vec!["verified"]);
}

#[test]
#[ignore = "requires a CUDA device"]
fn exporter_killed_while_mapped() {
    let _dog = watchdog("exporter_killed", Duration::from_secs(90));
    let ctx = gpu();
    let shared = region();
    let exporter = spawn("export_and_sleep", &[shared.name()]);
    wait_for("export", Duration::from_secs(30), || {
        shared.done.load(Ordering::Acquire) == 1
    });
    let h = shared.mem.load();
    let buf = ImportedBuffer::open(&ctx, &h).unwrap();
    let mut host = vec![0u32; buf.len()];
    buf.copy_to_host(&mut host).unwrap();
    assert_eq!(host, pattern(buf.len(), 7));
    let pid = exporter.pid();
    exporter.signal(libc::SIGKILL);
    let _ = exporter.wait(Duration::from_secs(20));
    // Our mapping keeps the memory alive: still readable.
    host.fill(0);
    buf.copy_to_host(&mut host).unwrap();
    assert_eq!(
        host,
        pattern(buf.len(), 7),
        "importer must still read after the exporter died"
    );
    // A re-open here would be a cache hit: the admission, before the cache, refuses it.
    match ImportedBuffer::open(&ctx, &h) {
        Err(Error::PeerGone {
            pid: gone,
            role: PeerRole::Exporter,
        }) => assert_eq!(gone, pid),
        other => panic!(
            "a re-open of a dead exporter's export: {:?}",
            other.map(|b| b.len())
        ),
    }
    // A new open elsewhere fails clearly, before the driver is asked.
    let out =
        spawn("expect_exporter_gone", &[shared.name()]).expect_success(Duration::from_secs(50));
    assert_eq!(out, vec![format!("gone {pid}")]);
    // The last importer removes the dead exporter's lease table.
    drop(buf);
}

#[test]
#[ignore = "requires a CUDA device"]
fn close_reports_importers_that_outlive_the_deadline_and_gives_the_buffer_back() {
    let _dog = watchdog("outstanding", Duration::from_secs(90));
    let ctx = gpu();
    let shared = region();
    let buf = IpcBuffer::<u32>::new(&ctx, 1024).unwrap();
    buf.copy_from_host(&pattern(1024, 3)).unwrap();
    shared.mem.store(buf.handle().unwrap());
    let importer = spawn("open_and_sleep", &[shared.name()]);
    wait_for("import", Duration::from_secs(30), || {
        shared.done.load(Ordering::Acquire) == 1
    });
    let t = Instant::now();
    let err = buf.close(Duration::from_millis(300)).unwrap_err();
    let waited = t.elapsed();
    match err.error() {
        Error::LeasesOutstanding { pids, .. } => assert_eq!(pids, &vec![importer.pid()]),
        other => panic!("{other:?}"),
    }
    assert!(
        (Duration::from_millis(300)..Duration::from_secs(2)).contains(&waited),
        "close waited {waited:?}"
    );
    // The buffer comes back intact, closing: still ours to read, its handle refused.
    let buf = err.into_inner();
    let mut host = vec![0u32; 1024];
    buf.copy_to_host(&mut host).unwrap();
    assert_eq!(host, pattern(1024, 3));
    assert!(matches!(
        buf.close(Duration::from_millis(50))
            .map_err(|e| e.into_parts().0),
        Err(Error::LeasesOutstanding { .. })
    ));
    drop(importer); // killed and reaped
}

#[test]
#[ignore = "requires a CUDA device"]
fn dropping_an_export_while_mapped_returns_at_once_and_refuses_new_opens() {
    let _dog = watchdog("drop_while_mapped", Duration::from_secs(90));
    let ctx = gpu();
    let shared = region();
    let buf = IpcBuffer::<u32>::new(&ctx, 1 << 16).unwrap();
    buf.copy_from_host(&pattern(1 << 16, 5)).unwrap();
    let handle = buf.handle().unwrap();
    shared.mem.store(handle);
    let importer = spawn("open_and_sleep", &[shared.name()]);
    wait_for("import", Duration::from_secs(30), || {
        shared.done.load(Ordering::Acquire) == 1
    });
    let t = Instant::now();
    drop(buf);
    let dropped = t.elapsed();
    eprintln!("drop of a buffer mapped by another process: {dropped:?}");
    assert!(
        dropped < Duration::from_millis(50),
        "drop waited {dropped:?}"
    );
    // A new open of the dropped buffer's handle is refused, though its memory still exists.
    let out = spawn("expect_stale", &[shared.name()]).expect_success(Duration::from_secs(50));
    assert_eq!(out, vec!["stale"]);
    drop(importer); // killed; the next scan reaps it and frees the memory
}

/// Load the committed PTX and check that each kernel does what kernels/simple_ipc.cu says.
#[test]
#[ignore = "requires a CUDA device"]
fn kernels_load_and_run() {
    let ctx = gpu();
    ctx.make_current().unwrap();
    let module = Module::from_ptx(KERNELS, &[]).expect("load kernels/simple_ipc.ptx");
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let len = (3 << 20) + 17;
    let buf = IpcBuffer::<u8>::zeroed(&ctx, len).unwrap();
    let simple = module.get_function("simple_kernel").unwrap();
    let delay = module.get_function("delay_fill").unwrap();
    let ptr = buf.as_raw_ptr();
    // SAFETY: argument types match the kernels' PTX signatures; the buffer outlives the sync.
    unsafe {
        launch!(simple<<<64, 128, 0, stream>>>(ptr, len as i32, 0xA5u32)).unwrap();
    }
    stream.synchronize().unwrap();
    let mut host = vec![0u8; len];
    buf.copy_to_host(&mut host).unwrap();
    assert!(
        host.iter().all(|&b| b == 0xA5),
        "simple_kernel must set every byte"
    );
    let t = std::time::Instant::now();
    // SAFETY: as above.
    unsafe {
        launch!(delay<<<32, 256, 0, stream>>>(ptr, len as u64, 0x3Cu32, 50_000_000u64)).unwrap();
    }
    stream.synchronize().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(45),
        "delay_fill must wait its delay"
    );
    buf.copy_to_host(&mut host).unwrap();
    assert!(
        host.iter().all(|&b| b == 0x3C),
        "delay_fill must set every byte"
    );
}
