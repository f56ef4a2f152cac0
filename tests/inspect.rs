//! `cuda_ipc::inspect` against a known picture built by real processes, without a GPU: two
//! exporters (arena tables: the ledger's protocol with no memory behind it), three importers
//! holding exports, a broadcast channel whose producer sleeps on a full ring, then a `SIGKILL`ed
//! importer whose export's free is deferred, and a killed consumer — each checked field by field.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{spawn, unique_name, wait_for, watchdog};
use cuda_ipc::__private::arena::{Importer, Owner};
use cuda_ipc::__private::channel::{HostConsumer, HostProducer};
use cuda_ipc::inspect::{self, ExportKind, ExportTable, Snapshot, TableKind};
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{ImportedBuffer, IpcBuffer, IpcMemHandle, ShmSafe};

const CAPACITY: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const SLOTS: usize = 2;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    token: [ShmCell<[u8; 16]>; 2],
    generation: [[AtomicU64; 3]; 2],
    exporters_ready: AtomicU32,
    importers_ready: AtomicU32,
    /// Exporter 0 frees its block 2 when this reads 1, then sets it to 2.
    free_block_2: AtomicU32,
    consumer_ready: AtomicU32,
    stop: AtomicU32,
}

#[derive(ShmSafe)]
#[repr(C)]
struct GpuShared {
    handle: ShmCell<IpcMemHandle<u8>>,
    opened: AtomicU32,
}

fn open(name: &str) -> ShmRegion<Shared> {
    ShmOptions::new(name).open::<Shared>().unwrap()
}

fn until_stopped(s: &Shared) {
    while s.stop.load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        if role == "gpu_importer" {
            // Map the buffer this test exports, say so, and hold it until killed.
            let s = ShmOptions::new(&args[0]).open::<GpuShared>().unwrap();
            let ctx = common::gpu();
            let _mapped = ImportedBuffer::open(&ctx, &s.handle.load()).unwrap();
            s.opened.store(1, Ordering::Release);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let s = open(&args[0]);
        match role {
            // Exporter `which`: an arena's tables with three 4 KiB buffers.
            "exporter" => {
                let which: usize = args[1].parse().unwrap();
                let mut token = [0u8; 16];
                token[..4].copy_from_slice(&std::process::id().to_le_bytes());
                token[4..8].copy_from_slice(&(which as u32 + 1).to_le_bytes());
                token[8..].copy_from_slice(&0x9abc_def0_5eed_1234_u64.to_le_bytes());
                let mut owner = Owner::create(&token, CAPACITY, 16).unwrap();
                let placed: Vec<_> = (0..3).map(|_| owner.alloc(BLOCK).unwrap()).collect();
                for (i, p) in placed.iter().enumerate() {
                    s.generation[which][i].store(p.1, Ordering::Release);
                }
                s.token[which].store(token);
                s.exporters_ready.fetch_add(1, Ordering::AcqRel);
                while s.stop.load(Ordering::Acquire) == 0 {
                    if which == 0 && s.free_block_2.load(Ordering::Acquire) == 1 {
                        owner.free(placed[2]);
                        s.free_block_2.store(2, Ordering::Release);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                0
            }
            // An importer holding the blocks `args[1]` names: "0:1" is exporter 0's block 1.
            "importer" => {
                let mut held = Vec::new();
                for spec in args[1].split(',') {
                    let (which, block) = spec.split_once(':').unwrap();
                    let (which, block): (usize, u32) =
                        (which.parse().unwrap(), block.parse().unwrap());
                    let importer = Importer::open(&s.token[which].load(), CAPACITY).unwrap();
                    let generation = s.generation[which][block as usize].load(Ordering::Acquire);
                    assert!(importer.enter_pausing(block, generation, || {}).is_some());
                    held.push(importer);
                }
                s.importers_ready.fetch_add(1, Ordering::AcqRel);
                until_stopped(&s);
                0
            }
            // A one-consumer channel's consumer: attaching removes the channel's name.
            "single_consumer" => {
                let _rx = HostConsumer::open_pausing(&args[1], SLOTS, 8, || {}).unwrap();
                s.consumer_ready.store(1, Ordering::Release);
                until_stopped(&s);
                0
            }
            // A broadcast channel's consumer that receives nothing and releases nothing.
            "consumer" => {
                let _rx = HostConsumer::attach_pausing(&args[1], SLOTS, 8, 2, || {}).unwrap();
                s.consumer_ready.store(1, Ordering::Release);
                until_stopped(&s);
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

fn snapshot_until(what: &str, ok: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let mut last = None;
    wait_for(what, Duration::from_secs(20), || {
        let snap = inspect::snapshot().unwrap();
        let done = ok(&snap);
        last = Some(snap);
        done
    });
    last.unwrap()
}

#[test]
fn a_known_picture_is_read_field_by_field_and_after_its_kills() {
    let _dog = watchdog("inspect picture", Duration::from_secs(120));
    let shared: ShmRegion<Shared> = ShmOptions::new(unique_name("inspect")).create().unwrap();
    let name = shared.name().to_owned();
    let exporters: Vec<_> = (0..2)
        .map(|w| spawn("exporter", &[&name, &w.to_string()]))
        .collect();
    wait_for("exporters", Duration::from_secs(20), || {
        shared.exporters_ready.load(Ordering::Acquire) == 2
    });
    let importers = [
        spawn("importer", &[&name, "0:0"]),
        spawn("importer", &[&name, "0:1,1:0"]),
        spawn("importer", &[&name, "0:2"]),
    ];
    wait_for("importers", Duration::from_secs(20), || {
        shared.importers_ready.load(Ordering::Acquire) == 3
    });

    // A broadcast channel (its name stays while it lives) whose producer, on this test's
    // thread, fills both slots and then sleeps waiting for the consumer's release.
    let mut tx = HostProducer::create_with(SLOTS, 8, 2).unwrap();
    let channel = tx.name().to_owned();
    let consumer = spawn("consumer", &[&name, &channel]);
    wait_for("consumer", Duration::from_secs(20), || {
        shared.consumer_ready.load(Ordering::Acquire) == 1
    });
    for _ in 0..SLOTS {
        tx.acquire(Duration::from_secs(5)).unwrap();
        tx.send(1).unwrap();
    }
    let producer = std::thread::spawn(move || {
        let blocked = tx.acquire(Duration::from_secs(60));
        (tx, blocked)
    });

    let tokens: Vec<String> = (0..2).map(|w| hex(&shared.token[w].load())).collect();
    let snap = snapshot_until("the producer asleep", |s| {
        s.channels
            .iter()
            .any(|c| c.name == channel && c.consumers.iter().any(|x| x.producer_waiting > 0))
    });
    let text = snap.to_string();
    eprintln!("{text}");
    // The exporters, each with its arena table, found by token.
    for (w, exporter) in exporters.iter().enumerate() {
        let e = snap
            .exporters
            .iter()
            .find(|e| e.process.pid == exporter.pid())
            .unwrap_or_else(|| panic!("exporter {w} missing:\n{text}"));
        assert!(e.process.alive);
        assert!(
            e.process
                .command
                .as_deref()
                .is_some_and(|c| c.contains("child_process"))
        );
        assert_eq!(e.tables.len(), 1, "{text}");
        let t = &e.tables[0];
        assert_eq!(t.token, tokens[w]);
        assert_eq!(
            (t.kind, t.capacity, t.closing, t.files, t.changing),
            (TableKind::Arena, CAPACITY, false, (true, true), false)
        );
        assert_eq!(t.exports.len(), 3);
        for (i, x) in t.exports.iter().enumerate() {
            assert_eq!(x.block as usize, i);
            assert_eq!(
                x.generation,
                shared.generation[w][i].load(Ordering::Acquire)
            );
            assert!(x.live && !x.is_deferred());
            assert_eq!((x.offset, x.bytes), (i as u64 * BLOCK, BLOCK));
            // The test owner labels its blocks as an arena's on no device.
            assert_eq!(
                (x.kind, x.device.as_deref(), x.read_only),
                (Some(ExportKind::Arena), Some("GPU-00000000"), false)
            );
        }
    }
    // The importers: each holds what it entered, by the slot its lease names.
    let slot_of = |w: usize, pid: u32| {
        table_of(&snap, exporters[w].pid())
            .importers
            .iter()
            .find(|i| i.process.pid == pid)
            .map(|i| i.slot)
    };
    let a = table_of(&snap, exporters[0].pid());
    let b = table_of(&snap, exporters[1].pid());
    assert_eq!(a.importers.len(), 3, "{text}");
    assert_eq!(b.importers.len(), 1, "{text}");
    assert!(
        a.importers
            .iter()
            .chain(&b.importers)
            .all(|i| i.process.alive && !i.claiming)
    );
    for (block, importer) in importers.iter().enumerate() {
        assert_eq!(
            a.exports[block].holders,
            vec![slot_of(0, importer.pid()).unwrap()]
        );
    }
    assert_eq!(
        b.exports[0].holders,
        vec![slot_of(1, importers[1].pid()).unwrap()]
    );
    assert!(b.exports[1].holders.is_empty() && b.exports[2].holders.is_empty());
    // The channel: this process produces, the consumer holds both items.
    let c = snap.channels.iter().find(|c| c.name == channel).unwrap();
    assert_eq!(
        (c.slots, c.capacity, c.broadcast, c.sent),
        (SLOTS as u64, 8, true, SLOTS as u64)
    );
    assert_eq!(c.producer.as_ref().map(|p| p.pid), Some(std::process::id()));
    assert_eq!(c.consumers.len(), 1, "{text}");
    let x = &c.consumers[0];
    assert_eq!(
        (x.process.pid, x.left, x.released, x.in_flight),
        (consumer.pid(), false, 0, SLOTS as u64)
    );
    assert!(
        text.contains("asleep until a consumer releases") && text.contains("the ring is full"),
        "{text}"
    );
    let json = snap.to_json();
    assert!(
        json.starts_with("{\"exporters\":[")
            && json.contains(&format!("\"token\":\"{}\"", tokens[0])),
        "{json}"
    );

    // SIGKILL the importer of block 2, then free that block: its free waits for the dead one.
    let killed_slot = slot_of(0, importers[2].pid()).unwrap();
    let [i0, i1, i2] = importers;
    i2.signal(libc::SIGKILL);
    let _ = i2.wait(Duration::from_secs(10));
    shared.free_block_2.store(1, Ordering::Release);
    wait_for("the free", Duration::from_secs(20), || {
        shared.free_block_2.load(Ordering::Acquire) == 2
    });
    consumer.signal(libc::SIGKILL);
    let _ = consumer.wait(Duration::from_secs(10));
    let snap = snapshot_until("the kills seen", |s| {
        s.channels
            .iter()
            .any(|c| c.name == channel && c.consumers.iter().all(|x| !x.process.alive))
    });
    let text = snap.to_string();
    eprintln!("{text}");
    let a = table_of(&snap, exporters[0].pid());
    let freed = &a.exports[2];
    assert!(!freed.live && freed.is_deferred(), "{text}");
    assert_eq!(
        freed.generation,
        shared.generation[0][2].load(Ordering::Acquire)
    );
    assert_eq!(freed.holders, vec![killed_slot]);
    let dead = a.importers.iter().find(|i| i.slot == killed_slot).unwrap();
    assert!(
        !dead.process.alive && dead.process.command.is_none(),
        "{text}"
    );
    assert!(
        text.contains("the free waits for slot") && text.contains("DEAD"),
        "{text}"
    );
    assert!(a.exports[..2].iter().all(|x| x.live));

    shared.stop.store(1, Ordering::Release);
    for child in exporters.into_iter().chain([i0, i1]) {
        assert!(child.wait(Duration::from_secs(20)).0.success());
    }
    // The producer's wait ended once its dead consumer was detached (a broadcast channel
    // goes on without it), and the entry says so.
    let (_tx, went_on) = producer.join().unwrap();
    assert!(went_on.is_ok(), "{went_on:?}");
    let snap = inspect::snapshot().unwrap();
    let c = snap.channels.iter().find(|c| c.name == channel).unwrap();
    assert!(
        c.consumers.iter().all(|x| x.left && !x.process.alive),
        "{snap}"
    );
}

/// A channel with one consumer removes its name once the consumer attaches (nobody else may):
/// before, the snapshot reads it by name; after, it names it under `unlinked`, mapped by both
/// ends' processes.
#[test]
fn an_attached_one_consumer_channel_shows_as_unlinked_mapped_by_both_ends() {
    let _dog = watchdog("inspect unlinked", Duration::from_secs(60));
    let shared: ShmRegion<Shared> = ShmOptions::new(unique_name("inspect-one"))
        .create()
        .unwrap();
    let mut tx = HostProducer::create(SLOTS, 8).unwrap();
    let channel = tx.name().to_owned();
    let me = std::process::id();
    let snap = inspect::snapshot().unwrap();
    let c = snap.channels.iter().find(|c| c.name == channel).unwrap();
    assert!(!c.broadcast && c.consumers.is_empty(), "{snap}");
    assert_eq!(c.producer.as_ref().map(|p| p.pid), Some(me));
    assert!(!snap.unlinked.iter().any(|u| u.name == channel), "{snap}");

    let consumer = spawn("single_consumer", &[shared.name(), &channel]);
    wait_for("consumer", Duration::from_secs(20), || {
        shared.consumer_ready.load(Ordering::Acquire) == 1
    });
    // One item sent to the attached consumer, not yet released.
    tx.acquire(Duration::from_secs(5)).unwrap();
    tx.send(1).unwrap();
    let snap = snapshot_until("the channel unlinked", |s| {
        s.unlinked.iter().any(|u| u.name == channel)
    });
    // Its contents, through a process that maps it: the kernel opens `/proc/<pid>/map_files`
    // only for root (or CAP_CHECKPOINT_RESTORE); for others the channel is only unlinked.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let read: Vec<_> = snap.channels.iter().filter(|c| c.name == channel).collect();
    if root {
        assert_eq!(read.len(), 1, "{snap}");
        let c = read[0];
        assert!(c.unlinked && !c.broadcast, "{snap}");
        assert_eq!(c.producer.as_ref().map(|p| p.pid), Some(me), "{snap}");
        assert_eq!(c.consumers.len(), 1, "{snap}");
        assert_eq!(c.consumers[0].process.pid, consumer.pid(), "{snap}");
        assert_eq!((c.sent, c.consumers[0].in_flight), (1, 1), "{snap}");
        assert!(
            snap.to_string().contains(&format!("channel {channel}: ")),
            "{snap}"
        );
    } else {
        assert!(read.is_empty(), "{snap}");
    }
    let u = snap.unlinked.iter().find(|u| u.name == channel).unwrap();
    let mut pids: Vec<u32> = u.mapped_by.iter().map(|p| p.pid).collect();
    pids.sort_unstable();
    let mut want = vec![me, consumer.pid()];
    want.sort_unstable();
    assert_eq!(pids, want, "{snap}");
    assert!(u.mapped_by.iter().all(|p| p.alive), "{snap}");
    assert!(
        snap.to_string()
            .contains(&format!("unlinked {channel} (its name removed)"))
    );
    shared.stop.store(1, Ordering::Release);
    assert!(consumer.wait(Duration::from_secs(20)).0.success());
    drop(tx);
}

/// On a GPU: a buffer this process exports (through its export registry) and a child maps
/// shows as a live export of this process's registry held by the child's lease slot; dropped
/// while the child holds it, its free is deferred behind that slot; with the child
/// `SIGKILL`ed the slot shows dead until a collect reaps it and frees the memory.
#[test]
#[ignore = "requires a CUDA device"]
fn a_registry_export_its_importer_and_a_deferred_free_show_on_a_gpu() {
    let _dog = watchdog("inspect on a GPU", Duration::from_secs(120));
    let ctx = common::gpu();
    let shared: ShmRegion<GpuShared> = ShmOptions::new(unique_name("inspect-gpu"))
        .create()
        .unwrap();
    let buf = IpcBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let handle = buf.handle().unwrap();
    shared.handle.store(handle);
    // A signal's counter: a second export of the registry, held by nobody.
    let signal = cuda_ipc::IpcSignal::new(&ctx).unwrap();
    let _ = signal.handle().unwrap();
    let uuid = handle.device_uuid();
    let device = format!(
        "GPU-{:02x}{:02x}{:02x}{:02x}",
        uuid[0], uuid[1], uuid[2], uuid[3]
    );
    let buffer_kind = match buf.handle_type() {
        cuda_ipc::HandleType::PosixFd => ExportKind::PosixFd,
        _ => ExportKind::Legacy,
    };
    let importer = spawn("gpu_importer", &[shared.name()]);
    wait_for("the import", Duration::from_secs(60), || {
        shared.opened.load(Ordering::Acquire) == 1
    });
    let me = std::process::id();
    let registry = |s: &Snapshot| -> Option<ExportTable> {
        let e = s.exporters.iter().find(|e| e.process.pid == me)?;
        e.tables
            .iter()
            .find(|t| t.kind == TableKind::Registry)
            .cloned()
    };
    let snap = snapshot_until("the importer's hold", |s| {
        registry(s).is_some_and(|t| t.exports.iter().any(|x| x.live && !x.holders.is_empty()))
    });
    let t = registry(&snap).unwrap();
    let slot = t
        .importers
        .iter()
        .find(|i| i.process.pid == importer.pid())
        .unwrap()
        .slot;
    let held: Vec<_> = t
        .exports
        .iter()
        .filter(|x| x.live && !x.holders.is_empty())
        .collect();
    assert_eq!(held.len(), 1, "{snap}");
    assert_eq!(held[0].holders, vec![slot], "{snap}");
    // What each export is: the buffer (its kind, device and size) and the signal.
    assert_eq!(
        (
            held[0].kind,
            held[0].device.as_deref(),
            held[0].bytes,
            held[0].read_only
        ),
        (Some(buffer_kind), Some(device.as_str()), 1 << 20, false),
        "{snap}"
    );
    let signals: Vec<_> = t
        .exports
        .iter()
        .filter(|x| x.live && x.kind == Some(ExportKind::Signal))
        .collect();
    assert_eq!(signals.len(), 1, "{snap}");
    assert_eq!(
        (signals[0].device.as_deref(), signals[0].bytes),
        (Some(device.as_str()), 8),
        "{snap}"
    );
    drop(signal);
    let block = held[0].block;
    let export_of =
        |s: &Snapshot| registry(s).and_then(|t| t.exports.into_iter().find(|x| x.block == block));

    // Dropped while the importer maps it: retired, its free deferred behind the live slot.
    drop(buf);
    let snap = inspect::snapshot().unwrap();
    let x = export_of(&snap).unwrap();
    assert!(
        !x.live && x.is_deferred() && x.holders == vec![slot],
        "{snap}"
    );
    // The importer killed: the slot shows dead; nothing has reaped it yet.
    importer.signal(libc::SIGKILL);
    let _ = importer.wait(Duration::from_secs(30));
    let snap = inspect::snapshot().unwrap();
    assert!(export_of(&snap).unwrap().is_deferred(), "{snap}");
    let t = registry(&snap).unwrap();
    assert!(
        t.importers
            .iter()
            .any(|i| i.slot == slot && !i.process.alive),
        "{snap}"
    );
    eprintln!("{snap}");
    // A collect reaps the dead importer and frees the memory: nothing waits any more.
    let left = cuda_ipc::collect_deferred();
    let snap = inspect::snapshot().unwrap();
    assert!(
        !export_of(&snap).is_some_and(|x| x.is_deferred()),
        "{left:?}\n{snap}"
    );
    assert!(
        registry(&snap)
            .unwrap()
            .importers
            .iter()
            .all(|i| i.slot != slot),
        "{snap}"
    );
}

/// The one export table of the exporter `pid`.
fn table_of(snap: &Snapshot, pid: u32) -> &ExportTable {
    &snap
        .exporters
        .iter()
        .find(|e| e.process.pid == pid)
        .unwrap_or_else(|| panic!("exporter {pid} missing:\n{snap}"))
        .tables[0]
}

fn hex(token: &[u8; 16]) -> String {
    token.iter().map(|b| format!("{b:02x}")).collect()
}
