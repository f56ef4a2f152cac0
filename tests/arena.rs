//! `IpcArena` between real processes: hundreds of buffers through one import on every device
//! pair (every element both ways), freed buffers going stale while their ranges wait for the
//! views still held, an importer killed holding views (reaped, its range reused), forged,
//! foreign and mistyped handles, descriptors that do not match, views outliving the owner, and
//! the per-buffer open cost against a full mapping.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use common::{
    contents, expect_message, fd_connect, fd_listener, gpu, pattern, report, spawn, watchdog,
};
use cuda_ipc::arena::{ArenaHandle, ArenaView, ImportedArena, IpcArena, IpcArenaHandle};
use cuda_ipc::error::{ArgumentDefect, TypeConflict};
use cuda_ipc::fd::FdSocket;
use cuda_ipc::{Error, GpuContext};

const T: Duration = Duration::from_secs(20);

fn recv_handle(s: &FdSocket) -> ArenaHandle<u32> {
    ArenaHandle::from_bytes(&s.recv(T).unwrap().payload).unwrap()
}

/// The length of buffer `i` of the many-buffers test.
fn len_of(i: usize) -> usize {
    1 + (i * 977) % 5000
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let s = fd_connect(&args[0]);
        let device: u32 = args[1].parse().unwrap();
        let ctx = GpuContext::new(device).unwrap();
        let arena = s.recv_arena(&ctx, T).unwrap();
        match role {
            // Open every buffer, check it, write the reply pattern into it.
            "many" => {
                let n: usize = String::from_utf8(s.recv(T).unwrap().payload)
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut views = Vec::new();
                let mut open_ns = Vec::new();
                for i in 0..n {
                    let h = recv_handle(&s);
                    let t = Instant::now();
                    let v = arena.open(&h).unwrap();
                    open_ns.push(t.elapsed().as_nanos());
                    assert_eq!(v.len(), len_of(i));
                    views.push(v);
                }
                let mut wrong = 0;
                for (i, v) in views.iter().enumerate() {
                    if contents(v) != pattern(len_of(i), i as u32) {
                        wrong += 1;
                    }
                    v.copy_from_host(&pattern(len_of(i), 1000 + i as u32))
                        .unwrap();
                }
                open_ns.sort_unstable();
                report(format!("wrong {wrong}"));
                report(format!("open p50 {} ns", open_ns[n / 2]));
                s.send(b"written", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            // Hold a view of A and B; A is freed; then drop the views on command.
            "holder" => {
                let a = recv_handle(&s);
                let b = recv_handle(&s);
                let va = arena.open(&a).unwrap();
                let vb = arena.open(&b).unwrap();
                assert!(va.is_live());
                s.send(b"opened", &[], T).unwrap();
                expect_message(&s, b"freed");
                match arena.open(&a) {
                    Err(Error::StaleHandle { generation }) if generation == a.generation() => {
                        report("reopen of freed: stale");
                    }
                    other => report(format!("reopen of freed: unexpected {other:?}")),
                }
                report(format!("view live after free: {}", va.is_live()));
                let same = contents(&va) == pattern(va.len(), 7);
                report(format!("view intact after free: {same}"));
                drop(vb);
                s.send(b"checked", &[], T).unwrap();
                expect_message(&s, b"drop");
                drop(va);
                s.send(b"dropped", &[], T).unwrap();
                let c = recv_handle(&s);
                let vc = arena.open(&c).unwrap();
                report(format!(
                    "new buffer: {}",
                    contents(&vc) == pattern(vc.len(), 9)
                ));
                match arena.open(&a) {
                    Err(Error::StaleHandle { .. }) => report("old handle on reused range: stale"),
                    other => report(format!("old handle on reused range: unexpected {other:?}")),
                }
                drop(vc);
                s.send(b"done", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            // Hold a view until killed.
            "doomed" => {
                let a = recv_handle(&s);
                let _va = arena.open(&a).unwrap();
                s.send(b"holding", &[], T).unwrap();
                std::thread::sleep(Duration::from_secs(60));
            }
            // After the doomed one: join (its slot was reaped or another is free), open B.
            "late" => {
                let b = recv_handle(&s);
                let vb = arena.open(&b).unwrap();
                report(format!(
                    "late open: {}",
                    contents(&vb) == pattern(vb.len(), 8)
                ));
                drop(vb);
                s.send(b"done", &[], T).unwrap();
                expect_message(&s, b"bye");
            }
            other => panic!("unknown role {other}"),
        }
        0
    });
}

/// Owner on `owner_device` (this process), importer on `importer_device` (a child): 300 buffers
/// through one import, every element both ways.
fn many_buffers(owner_device: u32, importer_device: u32) {
    const N: usize = 300;
    let ctx = GpuContext::new(owner_device).unwrap();
    let arena = IpcArena::new(&ctx, 16 << 20).unwrap();
    let bufs: Vec<_> = (0..N)
        .map(|i| {
            let b = arena.alloc::<u32>(len_of(i)).unwrap();
            b.copy_from_host(&pattern(len_of(i), i as u32)).unwrap();
            b
        })
        .collect();
    for (i, b) in bufs.iter().enumerate().skip(1) {
        let prev = &bufs[i - 1];
        assert!(
            prev.offset() + prev.byte_len() <= b.offset(),
            "ranges overlap"
        );
    }
    let (l, raw) = fd_listener("arena-many");
    let child = spawn("many", &[&raw, &importer_device.to_string()]);
    let s = l.accept(T).unwrap();
    s.send_arena(&arena, T).unwrap();
    s.send(N.to_string().as_bytes(), &[], T).unwrap();
    for b in &bufs {
        s.send(b.handle().as_bytes(), &[], T).unwrap();
    }
    expect_message(&s, b"written");
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(
            contents(b),
            pattern(len_of(i), 1000 + i as u32),
            "buffer {i}: the importer's writes"
        );
        assert!(b.is_viewed());
    }
    assert_eq!(arena.importers(), vec![child.pid()]);
    s.send(b"bye", &[], T).unwrap();
    let out = child.expect_success(T);
    assert_eq!(out[0], "wrong 0", "every element across: {out:?}");
    eprintln!(
        "arena {owner_device}->{importer_device}: {N} buffers, {}",
        out[1]
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn hundreds_of_buffers_cross_through_one_import_on_every_device_pair() {
    let _dog = watchdog("arena_many", Duration::from_secs(180));
    let _ = gpu();
    many_buffers(0, 0);
    if !common::has_gpus(2, "arena: buffers across device pairs") {
        return;
    }
    for (o, i) in [(1, 0), (0, 1)] {
        if common::peers(i, o, "arena: a device pair") {
            many_buffers(o, i);
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_freed_buffer_goes_stale_and_its_range_waits_for_the_views() {
    let _dog = watchdog("arena_stale", Duration::from_secs(120));
    let ctx = gpu();
    let arena = IpcArena::with_max_buffers(&ctx, 1, 8).unwrap();
    let half = arena.capacity() / 2 / 4; // u32s in half the arena
    let a = arena.alloc::<u32>(half).unwrap();
    let b = arena.alloc::<u32>(half).unwrap();
    a.copy_from_host(&pattern(half, 7)).unwrap();
    b.copy_from_host(&pattern(half, 8)).unwrap();
    let (a_offset, a_handle) = (a.offset(), a.handle());
    let (l, raw) = fd_listener("arena-stale");
    let child = spawn("holder", &[&raw, "0"]);
    let s = l.accept(T).unwrap();
    s.send_arena(&arena, T).unwrap();
    s.send(a.handle().as_bytes(), &[], T).unwrap();
    s.send(b.handle().as_bytes(), &[], T).unwrap();
    expect_message(&s, b"opened");
    let t = Instant::now();
    drop(a); // never waits
    let drop_us = t.elapsed().as_micros();
    s.send(b"freed", &[], T).unwrap();
    expect_message(&s, b"checked");
    // A's range is quarantined (viewed), B is live: nothing fits.
    match arena.alloc::<u32>(half) {
        Err(Error::ArenaFull {
            free: 0,
            quarantined,
            buffers: 2,
            ..
        }) if quarantined as usize == half * 4 => {}
        other => panic!("alloc over a viewed range: {other:?}"),
    }
    assert_eq!(arena.collect(), half * 4, "still viewed");
    s.send(b"drop", &[], T).unwrap();
    expect_message(&s, b"dropped");
    assert_eq!(arena.collect(), 0, "the view is gone");
    let c = arena.alloc::<u32>(half).unwrap();
    assert_eq!(c.offset(), a_offset, "the range is reused");
    assert_ne!(c.handle().generation(), a_handle.generation());
    c.copy_from_host(&pattern(half, 9)).unwrap();
    s.send(c.handle().as_bytes(), &[], T).unwrap();
    expect_message(&s, b"done");
    s.send(b"bye", &[], T).unwrap();
    let out = child.expect_success(T);
    assert_eq!(
        out,
        [
            "reopen of freed: stale",
            "view live after free: false",
            "view intact after free: true",
            "new buffer: true",
            "old handle on reused range: stale",
        ]
    );
    eprintln!("arena: dropping a viewed buffer took {drop_us} µs");
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_importer_killed_holding_a_view_is_reaped_and_its_range_reused() {
    let _dog = watchdog("arena_killed", Duration::from_secs(120));
    let ctx = gpu();
    let arena = IpcArena::with_max_buffers(&ctx, 1, 8).unwrap();
    let half = arena.capacity() / 2 / 4;
    let a = arena.alloc::<u32>(half).unwrap();
    let b = arena.alloc::<u32>(half).unwrap();
    b.copy_from_host(&pattern(half, 8)).unwrap();
    let (l, raw) = fd_listener("arena-killed");
    let child = spawn("doomed", &[&raw, "0"]);
    let s = l.accept(T).unwrap();
    s.send_arena(&arena, T).unwrap();
    s.send(a.handle().as_bytes(), &[], T).unwrap();
    expect_message(&s, b"holding");
    child.signal(libc::SIGKILL);
    let (status, _) = child.wait(T);
    assert!(!status.success());
    drop(a);
    assert_eq!(arena.collect(), 0, "the dead importer's view was reaped");
    assert!(arena.importers().is_empty(), "and its slot");
    let c = arena.alloc::<u32>(half).unwrap();
    assert_eq!(c.offset(), 0, "its range reused");
    // A new importer joins and opens B.
    let (l, raw) = fd_listener("arena-late");
    let late = spawn("late", &[&raw, "0"]);
    let s = l.accept(T).unwrap();
    s.send_arena(&arena, T).unwrap();
    s.send(b.handle().as_bytes(), &[], T).unwrap();
    expect_message(&s, b"done");
    s.send(b"bye", &[], T).unwrap();
    assert_eq!(late.expect_success(T), ["late open: true"]);
}

fn import_here(arena: &IpcArena) -> ImportedArena {
    let (handle, fd) = arena.export_fd().unwrap();
    ImportedArena::open_fd(arena.context(), &handle, fd).unwrap()
}

#[test]
#[ignore = "requires a CUDA device"]
fn forged_foreign_and_mistyped_handles_are_refused() {
    let ctx = gpu();
    let x = IpcArena::new(&ctx, 4 << 20).unwrap();
    let y = IpcArena::new(&ctx, 4 << 20).unwrap();
    let imported = import_here(&x);
    let a = x.alloc_zeroed::<u32>(100).unwrap();
    let other = y.alloc::<u32>(100).unwrap();

    assert!(matches!(
        imported.open(&other.handle()),
        Err(Error::CorruptHandle { .. })
    ));
    let as_f32 = ArenaHandle::<f32>::from_bytes(a.handle().as_bytes()).unwrap();
    assert!(matches!(
        imported.open(&as_f32),
        Err(Error::TypeMismatch { .. })
    ));
    let mut bytes = a.handle().as_bytes().to_vec();
    bytes[60] ^= 1; // the offset
    assert!(matches!(
        ArenaHandle::<u32>::from_bytes(&bytes),
        Err(Error::CorruptHandle { .. })
    ));
    assert!(matches!(
        ArenaHandle::<u32>::from_bytes(&bytes[..79]),
        Err(Error::CorruptHandle { .. })
    ));
    // A freed buffer's handle, after its block index holds another buffer.
    let old = a.handle();
    drop(a);
    let a2 = x.alloc::<u32>(100).unwrap();
    assert!(matches!(
        imported.open(&old),
        Err(Error::StaleHandle { .. })
    ));
    // Valid checksums over forged ranges: a longer length, another offset; refused on a first
    // open (against what the owner published) and while a view is held (against what the
    // first open checked).
    let forge = |field: std::ops::Range<usize>, value: u64| {
        let mut bytes = a2.handle().as_bytes().to_vec();
        bytes[field].copy_from_slice(&value.to_le_bytes());
        cuda_ipc::__private::arena::reseal_arena_handle(&mut bytes);
        ArenaHandle::<u32>::from_bytes(&bytes).unwrap()
    };
    let longer = forge(64..72, 100_000);
    let moved = forge(56..64, a2.offset() as u64 + 256);
    for held in [false, true] {
        let _v = held.then(|| imported.open(&a2.handle()).unwrap());
        for forged in [&longer, &moved] {
            assert!(
                matches!(imported.open(forged), Err(Error::CorruptHandle { .. })),
                "held {held}: {forged:?}"
            );
        }
    }
    let v2 = imported.open(&a2.handle()).unwrap();
    assert_eq!(v2.len(), 100);
    // A handle carrying a freed buffer's *retired* generation (what its block reads once the
    // buffer is gone, here kept quarantined by a view): once it opened the freed range.
    let doomed = x.alloc_zeroed::<u32>(100).unwrap();
    let held_view = imported.open(&doomed.handle()).unwrap();
    let mut bytes = doomed.handle().as_bytes().to_vec();
    drop(doomed);
    let retired = u64::from_le_bytes(bytes[48..56].try_into().unwrap()) + 1;
    bytes[48..56].copy_from_slice(&retired.to_le_bytes());
    cuda_ipc::__private::arena::reseal_arena_handle(&mut bytes);
    let forged = ArenaHandle::<u32>::from_bytes(&bytes).unwrap();
    assert_eq!(forged.generation(), retired);
    let opened = imported.open(&forged);
    assert!(
        matches!(opened, Err(Error::StaleHandle { .. })),
        "the retired generation opened: {opened:?}"
    );
    drop(held_view);
    // Bad sizes and types.
    assert!(matches!(
        x.alloc::<u32>(0),
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::AllocationSize { len: 0, .. },
            ..
        })
    ));
    assert!(matches!(
        x.alloc::<u8>(x.capacity() + 1),
        Err(Error::ArenaFull { .. })
    ));
    assert!(matches!(
        IpcArena::new(&ctx, 0),
        Err(Error::InvalidArgument { .. })
    ));
    drop(v2);
}

#[test]
#[ignore = "requires a CUDA device"]
fn descriptors_that_do_not_match_the_arena_are_refused() {
    let ctx = gpu();
    let arena = IpcArena::new(&ctx, 4 << 20).unwrap();
    let (handle, fd) = arena.export_fd().unwrap();
    // The envelope without its descriptor, over a socket.
    let (l, raw) = fd_listener("arena-nofd");
    let s = fd_connect(&raw);
    let peer = l.accept(T).unwrap();
    s.send(handle.as_bytes(), &[], T).unwrap();
    assert!(matches!(
        peer.recv_arena(&ctx, T),
        Err(Error::HandleTypeMismatch {
            conflict: TypeConflict::Descriptors {
                expected: 1,
                found: 0
            },
            ..
        })
    ));
    // A descriptor that is not CUDA memory.
    let null: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    assert!(matches!(
        ImportedArena::open_fd(&ctx, &handle, null),
        Err(Error::Cuda { .. })
    ));
    // Another arena's descriptor with this envelope: the table names this arena, the memory
    // is another's, and a smaller one does not hold the size the envelope claims.
    let small = IpcArena::new(&ctx, 1).unwrap();
    assert!(small.capacity() < arena.capacity());
    let (_, small_fd) = small.export_fd().unwrap();
    assert!(matches!(
        ImportedArena::open_fd(&ctx, &handle, small_fd),
        Err(Error::Cuda { .. })
    ));
    // A damaged envelope.
    let mut bytes = handle.as_bytes().to_vec();
    bytes[40] ^= 0x10;
    assert!(matches!(
        IpcArenaHandle::from_bytes(&bytes),
        Err(Error::CorruptHandle { .. })
    ));
    // The right one still works, and a second import shares the first.
    let first = ImportedArena::open_fd(&ctx, &handle, fd).unwrap();
    let (_, fd2) = arena.export_fd().unwrap();
    let second = ImportedArena::open_fd(&ctx, &handle, fd2).unwrap();
    let b = arena.alloc::<u32>(10).unwrap();
    assert_eq!(
        first.open(&b.handle()).unwrap().as_raw_ptr(),
        second.open(&b.handle()).unwrap().as_raw_ptr()
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn views_outlive_the_owner_and_opens_cost_no_mapping() {
    let ctx = gpu();
    let arena = IpcArena::new(&ctx, 8 << 20).unwrap();
    let imported = import_here(&arena);
    let a = arena.alloc::<u32>(4096).unwrap();
    a.copy_from_host(&pattern(4096, 5)).unwrap();
    let handle = a.handle();

    // Per-buffer open + drop, 20,000 times: the arena's reason to exist.
    let mut ns: Vec<u128> = (0..20_000)
        .map(|_| {
            let t = Instant::now();
            drop(std::hint::black_box(imported.open(&handle).unwrap()));
            t.elapsed().as_nanos()
        })
        .collect();
    ns.sort_unstable();
    eprintln!(
        "arena: view open + drop p50 {} ns, p99 {} ns",
        ns[ns.len() / 2],
        ns[ns.len() * 99 / 100]
    );

    let view: ArenaView<u32> = imported.open(&handle).unwrap();
    drop(a);
    drop(arena); // the owner is gone; the import maps the memory
    assert!(!view.is_live());
    assert_eq!(
        contents(&view),
        pattern(4096, 5),
        "the view outlives its owner"
    );
    view.copy_from_host(&pattern(4096, 6)).unwrap();
    assert_eq!(contents(&view), pattern(4096, 6));
    assert!(matches!(
        imported.open(&handle),
        Err(Error::StaleHandle { .. })
    ));
    drop(imported);
    assert_eq!(contents(&view), pattern(4096, 6), "and its import");
}
