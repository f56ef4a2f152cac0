//! `IpcBuffer`s of `HandleType::Pool` between real processes: sent and received with the same
//! two calls as every other kind (`send_buffer` / `recv_buffer`), data both ways, the pool
//! imported once however many of its buffers arrive; a buffer dropped while an importer holds
//! it stays readable there and is freed once the importer lets go (no other buffer left to keep
//! its pool alive); `close` waits for the importer and reports it; later opens of a dropped
//! buffer are stale; the single-handle exports are refused with the reason; a pool payload
//! without its descriptor, a buffer handle of another pool and the wrong element type are
//! refused; the exporting process opens its own buffer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::os::fd::AsFd;
use std::time::Duration;

use common::{
    contents, expect_message, fd_connect, fd_listener, gpu, gpu_count, pattern, report, spawn,
    watchdog,
};
use cuda_ipc::error::TypeConflict;
use cuda_ipc::fd::FdSocket;
use cuda_ipc::pool::{IpcPoolHandle, PoolHandle};
use cuda_ipc::{Error, GpuContext, HandleType, ImportedBuffer, IpcBuffer};

const T: Duration = Duration::from_secs(20);
const LEN: usize = 300_001;

/// The parent's tests share this process's pools (one per context for all `Pool` buffers):
/// one at a time, so that each sees only its own buffers in them.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pool_buffer(ctx: &GpuContext, len: usize, seed: u32) -> IpcBuffer<u32> {
    let b = IpcBuffer::<u32>::new_with(ctx, len, HandleType::Pool).unwrap();
    assert_eq!(b.handle_type(), HandleType::Pool);
    b.copy_from_host(&pattern(len, seed)).unwrap();
    b
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = fd_connect(&args[0]);
        let device: u32 = args[1].parse().unwrap();
        let ctx = GpuContext::new(device).unwrap();
        match role {
            // Three buffers (the second twice): each read, the first written back.
            "importer" => {
                let a = s.recv_buffer::<u32>(&ctx, T).unwrap();
                let b = s.recv_buffer::<u32>(&ctx, T).unwrap();
                let b_again = s.recv_buffer::<u32>(&ctx, T).unwrap();
                let c = s.recv_buffer::<u32>(&ctx, T).unwrap();
                report(format!(
                    "types {} {} {}",
                    a.handle_type(),
                    b.handle_type(),
                    c.handle_type()
                ));
                report(format!(
                    "exporter {}",
                    a.exporter().map(|e| e.pid()) == Some(std::os::unix::process::parent_id())
                ));
                report(format!(
                    "read {}",
                    contents(&a) == pattern(LEN, 1)
                        && contents(&b) == pattern(LEN / 3, 2)
                        && contents(&c) == pattern(7, 3)
                ));
                report(format!(
                    "one import of b {}",
                    b.as_raw_ptr() == b_again.as_raw_ptr()
                ));
                drop(b);
                report(format!(
                    "b again {}",
                    contents(&b_again) == pattern(LEN / 3, 2)
                ));
                a.copy_from_host(&pattern(LEN, 9)).unwrap();
                s.send(b"written", &[], T).unwrap();
                expect_message(&s, b"release");
                drop((a, b_again, c));
                s.send(b"released", &[], T).unwrap();
            }
            // Hold one buffer until told; receive a second message, and open it (the parts
            // split by hand, `open_pooled`) only after the owner says it dropped the first.
            "holder" => {
                let len: usize = args[2].parse().unwrap();
                let v = s.recv_buffer::<u32>(&ctx, T).unwrap();
                s.send(b"holding", &[], T).unwrap();
                let late = s.recv(T).unwrap();
                expect_message(&s, b"dropped");
                report(format!("still reads {}", contents(&v) == pattern(len, 4)));
                let (pool, buffer) = late.payload.split_at(IpcPoolHandle::SIZE);
                let pool = IpcPoolHandle::from_bytes(pool).unwrap();
                let buffer = PoolHandle::<u32>::from_bytes(buffer).unwrap();
                let fd = late.fds.into_iter().next().unwrap();
                match ImportedBuffer::open_pooled(&ctx, &pool, fd, &buffer) {
                    Err(Error::StaleHandle { .. }) => report("late open stale"),
                    other => report(format!("late open: {:?}", other.map(|_| ()))),
                }
                expect_message(&s, b"release");
                drop(v);
                s.send(b"released", &[], T).unwrap();
            }
            // Bad input: no descriptor, another pool's buffer handle, the wrong element type.
            "forged" => {
                match s.recv_buffer::<u32>(&ctx, T) {
                    Err(Error::HandleTypeMismatch {
                        handle: HandleType::Pool,
                        conflict:
                            TypeConflict::Descriptors {
                                expected: 1,
                                found: 0,
                            },
                    }) => report("no descriptor refused"),
                    other => report(format!("no descriptor: {:?}", other.map(|_| ()))),
                }
                match s.recv_buffer::<u32>(&ctx, T) {
                    Err(Error::CorruptHandle { .. }) => report("other pool refused"),
                    other => report(format!("other pool: {:?}", other.map(|_| ()))),
                }
                match s.recv_buffer::<u64>(&ctx, T) {
                    Err(Error::TypeMismatch { .. }) => report("wrong type refused"),
                    other => report(format!("wrong type: {:?}", other.map(|_| ()))),
                }
                // Nothing of the above is held: a good one still opens.
                let v = s.recv_buffer::<u32>(&ctx, T).unwrap();
                report(format!("good one reads {}", contents(&v) == pattern(64, 5)));
                s.send(b"done", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            other => panic!("unknown role {other}"),
        }
        0
    });
}

/// Owner on device 0, importer on `device`.
fn travel(device: u32) {
    let ctx = gpu();
    let (l, raw) = fd_listener("pool-buffer-travel");
    let child = spawn("importer", &[&raw, &device.to_string()]);
    let s = l.accept(T).unwrap();
    let a = pool_buffer(&ctx, LEN, 1);
    let b = pool_buffer(&ctx, LEN / 3, 2);
    let c = pool_buffer(&ctx, 7, 3);
    for buf in [&a, &b, &b, &c] {
        s.send_buffer(buf, T).unwrap();
    }
    expect_message(&s, b"written");
    assert_eq!(contents(&a), pattern(LEN, 9), "the importer's write");
    assert_eq!(a.importers(), [child.pid()], "a held by the importer");
    assert_eq!(b.importers(), [child.pid()], "b held once more");
    s.send(b"release", &[], T).unwrap();
    expect_message(&s, b"released");
    assert!(a.importers().is_empty() && c.importers().is_empty());
    let lines = child.expect_success(T);
    assert_eq!(
        lines,
        [
            "types stream-ordered pool stream-ordered pool stream-ordered pool",
            "exporter true",
            "read true",
            "one import of b true",
            "b again true",
        ],
        "importer on device {device}"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn pool_buffers_travel_like_any_buffer_on_every_device() {
    let _dog = watchdog("pool_buffer_travel", Duration::from_secs(120));
    let _serial = serial();
    for device in 0..gpu_count() {
        if device == 0 || cuda_ipc::device::can_access_peer(device, 0).unwrap() {
            travel(device);
        }
    }
}

/// A shared pool whose last buffer drops while another thread looks through the context's
/// pools for room (holding a reference to each) is destroyed at the next allocation, not kept
/// until an explicit `collect_deferred()` (its table once stayed).
#[test]
#[ignore = "requires a CUDA device"]
fn a_shared_pool_left_without_buffers_while_another_thread_looked_is_destroyed_next() {
    let _dog = watchdog("pool_buffer_left", Duration::from_secs(60));
    let _serial = serial();
    let ctx = gpu();
    let before = common::shm_entries("cuda-ipc-arena.");
    let buf = pool_buffer(&ctx, 1024, 6);
    let table: Vec<String> = common::shm_entries("cuda-ipc-arena.")
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(table.len(), 1, "the shared pool's block table: {table:?}");
    let looking = cuda_ipc::__private::pool::look_for_room();
    drop(buf); // the pool's last buffer, while "another thread" holds the pool
    drop(looking); // that thread allocated elsewhere
    assert!(
        common::shm_exists(&table[0]),
        "not destroyed under a reference"
    );
    // Any next allocation runs the pending scan, which must find the pool left over.
    let _other = IpcBuffer::<u32>::new(&ctx, 16).unwrap();
    assert!(
        !common::shm_exists(&table[0]),
        "the shared pool outlived its last buffer"
    );
}

/// Write `value` into the size word of every block of the block table `/dev/shm/<name>`, as a
/// hostile process could: the table (`ledger/table.rs`: a header, then token, capacity, closing
/// and 16,384 blocks of state, holders, offset and size words) ends the file.
fn scribble_block_sizes(name: &str, value: u64) {
    use std::os::unix::fs::FileExt;
    const BLOCKS: u64 = cuda_ipc::arena::IpcArena::MAX_BUFFERS as u64;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{name}"))
        .unwrap();
    let len = file.metadata().unwrap().len();
    let first_block = len - BLOCKS * 32;
    for i in 0..BLOCKS {
        file.write_at(&value.to_le_bytes(), first_block + i * 32 + 24)
            .unwrap();
    }
}

/// The owner drops (or closes) a buffer its importer holds; no other pool buffer lives.
#[test]
#[ignore = "requires a CUDA device"]
fn a_dropped_pool_buffer_stays_with_its_importer_and_is_freed_after() {
    let _dog = watchdog("pool_buffer_drop", Duration::from_secs(120));
    let _serial = serial();
    let ctx = gpu();
    let (free0, _) = ctx.mem_info().unwrap();
    let (l, raw) = fd_listener("pool-buffer-drop");
    // Big enough that device memory shows whether it came back.
    let len = 64 << 20;
    let child = spawn("holder", &[&raw, "0", &len.to_string()]);
    let s = l.accept(T).unwrap();
    let tables_before = common::shm_entries("cuda-ipc-arena.");
    let buf = pool_buffer(&ctx, len, 4);
    let pool_table: Vec<String> = common::shm_entries("cuda-ipc-arena.")
        .into_iter()
        .filter(|n| !tables_before.contains(n))
        .collect();
    s.send_buffer(&buf, T).unwrap();
    expect_message(&s, b"holding");
    // close waits, gives up, names the holder and hands the buffer back.
    let buf = match buf.close(Duration::from_millis(200)) {
        Err(e) => {
            match e.error() {
                Error::LeasesOutstanding { pids, .. } => assert_eq!(pids, &[child.pid()]),
                other => panic!("close: {other:?}"),
            }
            e.into_inner()
        }
        Ok(()) => panic!("close returned while the importer holds the buffer"),
    };
    // A new message for the same buffer, then the drop: the importer opens it after.
    s.send_buffer(&buf, T).unwrap();
    drop(buf);
    // A hostile importer scribbles every block's size word in the pool's shared table: the
    // owner's count of what waits must come from its own records (two scribbled sizes once summed to pending_bytes = 18446744073709551614).
    assert_eq!(
        pool_table.len(),
        1,
        "the shared pool's block table: {pool_table:?}"
    );
    scribble_block_sizes(&pool_table[0], u64::MAX);
    let pending = cuda_ipc::collect_deferred();
    assert_eq!(
        pending.pending, 1,
        "the dropped buffer waits for its importer"
    );
    assert_eq!(
        pending.pending_bytes,
        len * 4,
        "the bytes waiting are the buffer's, whatever the shared table says"
    );
    s.send(b"dropped", &[], T).unwrap();
    s.send(b"release", &[], T).unwrap();
    expect_message(&s, b"released");
    let lines = child.expect_success(T);
    assert_eq!(lines, ["still reads true", "late open stale"]);
    let after = cuda_ipc::collect_deferred();
    assert_eq!(after.pending, 0, "freed once the importer let go");
    // The pool is gone too: device memory is back (within the driver's slack).
    let (free1, _) = ctx.mem_info().unwrap();
    assert!(
        free1 + (32 << 20) >= free0,
        "device free memory {free0} -> {free1}: the 256 MiB buffer or its pool was kept"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_closed_pool_buffer_returns_once_its_importer_lets_go() {
    let _dog = watchdog("pool_buffer_close", Duration::from_secs(120));
    let _serial = serial();
    let ctx = gpu();
    let (l, raw) = fd_listener("pool-buffer-close");
    let child = spawn("holder", &[&raw, "0", &LEN.to_string()]);
    let s = l.accept(T).unwrap();
    let buf = pool_buffer(&ctx, LEN, 4);
    s.send_buffer(&buf, T).unwrap();
    expect_message(&s, b"holding");
    let late = pool_buffer(&ctx, 16, 6);
    s.send_buffer(&late, T).unwrap(); // a live buffer: the late open succeeds this time
    s.send(b"dropped", &[], T).unwrap(); // (not dropped: the importer's read still holds)
    s.send(b"release", &[], T).unwrap();
    std::thread::scope(|scope| {
        let closer = scope.spawn(|| buf.close(Duration::from_secs(15)));
        expect_message(&s, b"released");
        assert!(
            closer.join().unwrap().is_ok(),
            "close once the importer let go"
        );
    });
    let lines = child.expect_success(T);
    assert_eq!(lines, ["still reads true", "late open: Ok(())"]);
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_pool_buffer_has_no_single_handle_and_opens_in_its_own_process() {
    let _dog = watchdog("pool_buffer_own", Duration::from_secs(60));
    let _serial = serial();
    let ctx = gpu();
    let buf = pool_buffer(&ctx, 1024, 7);
    let pooled = |r: cuda_ipc::Result<()>| {
        matches!(
            r,
            Err(Error::HandleTypeMismatch {
                handle: HandleType::Pool,
                conflict: TypeConflict::Pooled
            })
        )
    };
    assert!(pooled(buf.handle().map(|_| ())), "handle()");
    assert!(pooled(buf.export_fd().map(|_| ())), "export_fd()");
    assert!(matches!(
        buf.raw_export(),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::Needs(HandleType::Legacy),
            ..
        })
    ));
    let legacy = IpcBuffer::<u32>::new(&ctx, 16).unwrap();
    assert!(matches!(
        legacy.export_pooled(),
        Err(Error::HandleTypeMismatch {
            handle: HandleType::Legacy,
            conflict: TypeConflict::Needs(HandleType::Pool)
        })
    ));
    let (pool, fd, handle) = buf.export_pooled().unwrap();
    let own = ImportedBuffer::open_pooled(&ctx, &pool, fd, &handle).unwrap();
    assert_eq!(own.handle_type(), HandleType::Pool);
    assert_eq!(contents(&own), pattern(1024, 7));
    own.grant_access(&ctx).unwrap();
    buf.grant_access(&ctx).unwrap();
    assert_eq!(
        buf.importers(),
        [std::process::id()],
        "held by our own import"
    );
    drop(own);
    assert!(buf.importers().is_empty(), "let go");
}

/// The forged-input cases, sent by the owner to a child.
#[test]
#[ignore = "requires a CUDA device"]
fn a_pool_payload_without_its_descriptor_or_with_forged_parts_is_refused() {
    let _dog = watchdog("pool_buffer_forged", Duration::from_secs(60));
    let _serial = serial();
    let ctx = gpu();
    let (l, raw) = fd_listener("pool-buffer-forged");
    let child = spawn("forged", &[&raw, "0"]);
    let s: FdSocket = l.accept(T).unwrap();
    let good = pool_buffer(&ctx, 64, 5);
    let (pool, fd, handle) = good.export_pooled().unwrap();
    // 1. The right payload, no descriptor.
    let payload = [pool.as_bytes(), handle.as_bytes()].concat();
    s.send(&payload, &[], T).unwrap();
    // 2. This pool, the buffer handle of another pool's buffer.
    let other = cuda_ipc::pool::IpcPool::new(&ctx).unwrap();
    let foreign = other
        .alloc::<u32>(64, &cuda_ipc::RawStream::LEGACY)
        .unwrap();
    let foreign_handle: PoolHandle<u32> = foreign.handle().unwrap();
    let payload = [pool.as_bytes(), foreign_handle.as_bytes()].concat();
    s.send(&payload, &[fd.as_fd()], T).unwrap();
    // 3. The good buffer, received as u64.
    s.send_buffer(&good, T).unwrap();
    // 4. The good buffer.
    s.send_buffer(&good, T).unwrap();
    expect_message(&s, b"done");
    s.send(b"bye", &[], T).unwrap();
    let lines = child.expect_success(T);
    assert_eq!(
        lines,
        [
            "no descriptor refused",
            "other pool refused",
            "wrong type refused",
            "good one reads true",
        ]
    );
}
