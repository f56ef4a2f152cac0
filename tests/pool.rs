//! `IpcPool` between real processes: stream-ordered allocations through one imported pool on
//! every device pair (every element both ways), a freed buffer stale while the importer still
//! holds it and freed once it lets go, an importer killed holding a buffer (reaped, then freed),
//! a pool of a dead process refused, forged, foreign and mistyped handles, and descriptors that
//! do not match.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use common::{
    contents, expect_message, fd_connect, fd_listener, gpu, pattern, report, spawn, watchdog,
};
use cuda_ipc::error::{PeerRole, TypeConflict};
use cuda_ipc::fd::FdSocket;
use cuda_ipc::pool::{ImportedPool, IpcPool, PoolHandle};
use cuda_ipc::{Error, GpuContext, RawStream};

const T: Duration = Duration::from_secs(20);

fn recv_handle(s: &FdSocket) -> PoolHandle<u32> {
    PoolHandle::from_bytes(&s.recv(T).unwrap().payload).unwrap()
}

fn len_of(i: usize) -> usize {
    1 + (i * 7919) % 300_000
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = fd_connect(&args[0]);
        let device: u32 = args[1].parse().unwrap();
        let ctx = GpuContext::new(device).unwrap();
        if role == "dying_owner" {
            // Send a pool and a buffer's handle, then exit: the parent opens them after.
            let pool = IpcPool::new(&ctx).unwrap();
            let buf = pool.alloc::<u32>(1024, &RawStream::LEGACY).unwrap();
            s.send_pool(&pool, T).unwrap();
            s.send(buf.handle().unwrap().as_bytes(), &[], T).unwrap();
            report("sent");
            return 0;
        }
        let pool = s.recv_pool(&ctx, T).unwrap();
        match role {
            "many" => {
                let n: usize = String::from_utf8(s.recv(T).unwrap().payload)
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut views = Vec::new();
                let mut open_us = Vec::new();
                for i in 0..n {
                    let h = recv_handle(&s);
                    let t = Instant::now();
                    let v = pool.open(&h).unwrap();
                    open_us.push(t.elapsed().as_micros());
                    assert_eq!(v.len(), len_of(i));
                    views.push(v);
                }
                let mut wrong = 0;
                for (i, v) in views.iter().enumerate() {
                    if contents(v) != pattern(len_of(i), i as u32) {
                        wrong += 1;
                    }
                    v.copy_from_host(&pattern(len_of(i), 500 + i as u32))
                        .unwrap();
                }
                // A handle of another pool, and one read as the wrong type.
                let foreign = recv_handle(&s);
                let foreign = match pool.open(&foreign) {
                    Err(Error::CorruptHandle { .. }) => "refused",
                    _ => "OPENED",
                };
                open_us.sort_unstable();
                report(format!("wrong {wrong}"));
                report(format!("foreign {foreign}"));
                report(format!("open p50 {} us", open_us[n / 2]));
                s.send(b"written", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            "holder" => {
                let a = recv_handle(&s);
                // A valid checksum over a longer length: refused on the first open (against
                // what the owner published) and while a view is held (against the size the
                // driver reported for the import).
                let mut bytes = a.as_bytes().to_vec();
                bytes[56..64].copy_from_slice(&(a.len() as u64 * 4).to_le_bytes());
                cuda_ipc::__private::arena::reseal_pool_handle(&mut bytes);
                let longer = PoolHandle::<u32>::from_bytes(&bytes).unwrap();
                let first = matches!(pool.open(&longer), Err(Error::CorruptHandle { .. }));
                let va = pool.open(&a).unwrap();
                let held = matches!(pool.open(&longer), Err(Error::CorruptHandle { .. }));
                report(format!("longer: refused {first} {held}"));
                let as_f32 = PoolHandle::<f32>::from_bytes(a.as_bytes()).unwrap();
                match pool.open(&as_f32) {
                    Err(Error::TypeMismatch { .. }) => report("as f32: refused"),
                    other => report(format!("as f32: unexpected {other:?}")),
                }
                s.send(b"opened", &[], T).unwrap();
                expect_message(&s, b"freed");
                match pool.open(&a) {
                    Err(Error::StaleHandle { .. }) => report("reopen of freed: stale"),
                    other => report(format!("reopen of freed: unexpected {other:?}")),
                }
                report(format!("live after free: {}", va.is_live()));
                report(format!(
                    "intact after free: {}",
                    contents(&va) == pattern(va.len(), 3)
                ));
                drop(va);
                s.send(b"dropped", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            "doomed" => {
                let a = recv_handle(&s);
                let _va = pool.open(&a).unwrap();
                s.send(b"holding", &[], T).unwrap();
                std::thread::sleep(Duration::from_secs(60));
            }
            other => panic!("unknown role {other}"),
        }
        0
    });
}

fn many_buffers(owner_device: u32, importer_device: u32) {
    const N: usize = 64;
    let ctx = GpuContext::new(owner_device).unwrap();
    let pool = IpcPool::new(&ctx).unwrap();
    let other = IpcPool::new(&ctx).unwrap();
    let stream = RawStream::LEGACY;
    let bufs: Vec<_> = (0..N)
        .map(|i| {
            let b = pool.alloc::<u32>(len_of(i), &stream).unwrap();
            b.copy_from_host(&pattern(len_of(i), i as u32)).unwrap();
            b
        })
        .collect();
    let foreign = other.alloc::<u32>(16, &stream).unwrap();
    let (l, raw) = fd_listener("pool-many");
    let child = spawn("many", &[&raw, &importer_device.to_string()]);
    let s = l.accept(T).unwrap();
    s.send_pool(&pool, T).unwrap();
    s.send(N.to_string().as_bytes(), &[], T).unwrap();
    for b in &bufs {
        s.send(b.handle().unwrap().as_bytes(), &[], T).unwrap();
    }
    s.send(foreign.handle().unwrap().as_bytes(), &[], T)
        .unwrap();
    expect_message(&s, b"written");
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(
            contents(b),
            pattern(len_of(i), 500 + i as u32),
            "buffer {i}: the importer's writes"
        );
        assert!(b.is_viewed());
    }
    assert_eq!(pool.importers(), vec![child.pid()]);
    s.send(b"bye", &[], T).unwrap();
    let out = child.expect_success(T);
    assert_eq!(out[..2], ["wrong 0", "foreign refused"], "{out:?}");
    eprintln!(
        "pool {owner_device}->{importer_device}: {N} buffers, {}",
        out[2]
    );
    // The importer exited: every buffer frees at once.
    for b in bufs {
        b.free_async(&stream).unwrap();
    }
    assert_eq!(pool.collect(), 0);
}

#[test]
#[ignore = "requires a CUDA device"]
fn pool_buffers_cross_processes_on_every_device_pair() {
    let _dog = watchdog("pool_many", Duration::from_secs(180));
    let _ = gpu();
    many_buffers(0, 0);
    if !common::has_gpus(2, "pool: buffers across device pairs") {
        return;
    }
    for (o, i) in [(1, 0), (0, 1)] {
        if common::peers(i, o, "pool: a device pair") {
            many_buffers(o, i);
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_freed_pool_buffer_is_stale_and_freed_once_the_importer_lets_go() {
    let _dog = watchdog("pool_stale", Duration::from_secs(120));
    let ctx = gpu();
    let pool = IpcPool::new(&ctx).unwrap();
    let a = pool.alloc::<u32>(1 << 20, &RawStream::LEGACY).unwrap();
    a.copy_from_host(&pattern(1 << 20, 3)).unwrap();
    let (l, raw) = fd_listener("pool-stale");
    let child = spawn("holder", &[&raw, "0"]);
    let s = l.accept(T).unwrap();
    s.send_pool(&pool, T).unwrap();
    s.send(a.handle().unwrap().as_bytes(), &[], T).unwrap();
    expect_message(&s, b"opened");
    let t = Instant::now();
    drop(a); // never waits: the allocation is quarantined
    let drop_us = t.elapsed().as_micros();
    assert_eq!(pool.collect(), 1, "held by the importer");
    s.send(b"freed", &[], T).unwrap();
    expect_message(&s, b"dropped");
    assert_eq!(
        pool.collect(),
        0,
        "freed once the importer freed its import"
    );
    s.send(b"bye", &[], T).unwrap();
    let out = child.expect_success(T);
    assert_eq!(
        out,
        [
            "longer: refused true true",
            "as f32: refused",
            "reopen of freed: stale",
            "live after free: false",
            "intact after free: true",
        ]
    );
    eprintln!("pool: dropping a held buffer took {drop_us} µs");
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_importer_killed_holding_a_pool_buffer_is_reaped() {
    let _dog = watchdog("pool_killed", Duration::from_secs(120));
    let ctx = gpu();
    let pool = IpcPool::new(&ctx).unwrap();
    let a = pool.alloc::<u32>(4096, &RawStream::LEGACY).unwrap();
    let (l, raw) = fd_listener("pool-killed");
    let child = spawn("doomed", &[&raw, "0"]);
    let s = l.accept(T).unwrap();
    s.send_pool(&pool, T).unwrap();
    s.send(a.handle().unwrap().as_bytes(), &[], T).unwrap();
    expect_message(&s, b"holding");
    child.signal(libc::SIGKILL);
    let (status, _) = child.wait(T);
    assert!(!status.success());
    drop(a);
    assert_eq!(
        pool.collect(),
        0,
        "the dead importer was reaped, the buffer freed"
    );
    assert!(pool.importers().is_empty());
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_pool_from_a_dead_process_and_mismatched_descriptors_are_refused() {
    let _dog = watchdog("pool_refused", Duration::from_secs(120));
    let ctx = gpu();
    let (l, raw) = fd_listener("pool-dead");
    let child = spawn("dying_owner", &[&raw, "0"]);
    let s = l.accept(T).unwrap();
    assert_eq!(child.expect_success(T), ["sent"]);
    match s.recv_pool(&ctx, T) {
        Err(Error::PeerGone {
            role: PeerRole::Exporter,
            ..
        }) => {}
        other => panic!("a dead process's pool: {other:?}"),
    }
    // Descriptors that do not match: none, and one that is not a pool.
    let pool = IpcPool::new(&ctx).unwrap();
    let (handle, _fd) = pool.export_fd().unwrap();
    let (l, raw) = fd_listener("pool-nofd");
    let c = fd_connect(&raw);
    let peer = l.accept(T).unwrap();
    c.send(handle.as_bytes(), &[], T).unwrap();
    assert!(matches!(
        peer.recv_pool(&ctx, T),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::Descriptors {
                expected: 1,
                found: 0
            },
            ..
        })
    ));
    let null: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    assert!(matches!(
        ImportedPool::open_fd(&ctx, &handle, null),
        Err(Error::Cuda { .. })
    ));
    // Damaged handle bytes.
    let buf = pool.alloc::<u32>(64, &RawStream::LEGACY).unwrap();
    let mut bytes = buf.handle().unwrap().as_bytes().to_vec();
    bytes[70] ^= 4; // the export data
    assert!(matches!(
        PoolHandle::<u32>::from_bytes(&bytes),
        Err(Error::CorruptHandle { .. })
    ));
    assert!(matches!(
        pool.alloc::<u32>(0, &RawStream::LEGACY),
        Err(Error::InvalidArgument { .. })
    ));
}
