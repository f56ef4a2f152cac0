use super::*;

/// An arena export's label on device `GPU-4a3b00ff`.
const ARENA: u64 = 0x4a3b_00ff_0000_0004;
/// The same, read-only.
const ARENA_READ_ONLY: u64 = ARENA | 0x100;

fn block(index: u32, state: u64, holders: u64, offset: u64, bytes: u64, label: u64) -> Export {
    export(
        index,
        &BlockWords {
            state,
            holders,
            offset,
            bytes,
            label,
        },
    )
}

fn proc(pid: u32, alive: bool, command: Option<&str>) -> Process {
    Process {
        pid,
        start_time: 10,
        command: command.map(str::to_owned),
        alive,
    }
}

fn picture() -> Snapshot {
    Snapshot {
        exporters: vec![Exporter {
            process: proc(100, true, Some("trainer \"a\"")),
            tables: vec![ExportTable {
                token: "00112233445566778899aabbccddeeff".to_owned(),
                kind: TableKind::Arena,
                capacity: 64 << 20,
                closing: false,
                exports: vec![
                    block(0, 1, 0b1, 0, 1 << 20, ARENA),
                    block(1, 4, 0b10, 1 << 20, 4096, ARENA_READ_ONLY),
                    block(2, 6, 0, 0, 0, 0),
                ],
                importers: vec![
                    Importer {
                        slot: 0,
                        process: proc(101, true, Some("engine")),
                        claiming: false,
                    },
                    Importer {
                        slot: 1,
                        process: proc(102, false, None),
                        claiming: false,
                    },
                ],
                files: (true, true),
                changing: false,
            }],
        }],
        channels: vec![Channel {
            name: "cuda-ipc-chan.x".to_owned(),
            creator: proc(100, true, None),
            slots: 2,
            capacity: 8,
            elem_size: 4,
            broadcast: false,
            producer: Some(proc(100, true, None)),
            sent: 5,
            consumers_waiting: 0,
            consumers: vec![Consumer {
                entry: 0,
                process: proc(101, true, None),
                left: false,
                released: 3,
                in_flight: 2,
                producer_waiting: 1,
            }],
            changing: true,
            unchanged_for: Some(std::time::Duration::from_millis(12_300)),
            unlinked: true,
        }],
        regions: vec![Region {
            name: "mine".to_owned(),
            creator: proc(99, false, None),
            bytes: 4200,
        }],
        unreadable: vec![Unreadable {
            name: "cuda-ipc-arena.bad".to_owned(),
            reason: "header field \"type_tag\"\n".to_owned(),
        }],
        unlinked: vec![Unlinked {
            name: "cuda-ipc-chan.gone".to_owned(),
            mapped_by: vec![proc(100, true, None), proc(101, true, None)],
        }],
    }
}

#[test]
fn a_block_becomes_an_export_with_its_generation_and_holders() {
    let live = block(3, 7, 0b1001, 64, 128, ARENA_READ_ONLY);
    assert_eq!(
        (live.generation, live.live, live.holders.clone()),
        (7, true, vec![0, 3])
    );
    assert_eq!(
        (live.kind, live.device.as_deref(), live.read_only),
        (Some(ExportKind::Arena), Some("GPU-4a3b00ff"), true)
    );
    assert!(!live.is_deferred());
    let deferred = block(3, 8, 1 << 63, 0, 0, 0);
    assert_eq!(
        (deferred.generation, deferred.live, deferred.holders.clone()),
        (7, false, vec![63])
    );
    assert_eq!(
        (deferred.kind, deferred.device.clone(), deferred.read_only),
        (None, None, false),
        "a block without a label's word says no kind"
    );
    assert!(deferred.is_deferred());
    assert!(!block(3, 8, 0, 0, 0, 0).is_deferred());
}

#[test]
fn the_tree_says_who_holds_what() {
    let text = picture().to_string();
    for line in [
        "cuda-ipc on this machine: 1 exporter, 1 channel, 1 other region",
        "exporter pid 100 (alive): trainer \"a\"",
        "  arena of 64.0 MiB 0011…eeff: 3 exports, 2 importers",
        "    export 0 (generation 1): arena on GPU-4a3b00ff, 1.0 MiB at 0, held by slot 0",
        "    export 1 (generation 3, freed; the free waits for slot 1): arena on GPU-4a3b00ff, 4.0 KiB at 1048576, read-only",
        "    export 2 (generation 5, freed): unlabelled, 0 bytes at 0",
        "    importer slot 0: pid 101 (alive): engine",
        "    importer slot 1: pid 102 (DEAD: the exporter's next collect reaps it)",
        "channel cuda-ipc-chan.x: 2 slots of 8 elements (4 bytes each), 5 items sent, its name removed (its consumer attached), no progress for 12 s (changing while read)",
        "  producer pid 100 (alive) — asleep until a consumer releases",
        "  consumer entry 0: pid 101 (alive): released 3, 2 in flight (the ring is full)",
        "region mine (4.1 KiB): created by pid 99 (DEAD): shm::reclaim_stale removes it",
        "unreadable cuda-ipc-arena.bad: header field \"type_tag\"",
        "unlinked cuda-ipc-chan.gone (its name removed), mapped by:",
        "  pid 101 (alive)",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[test]
fn the_json_is_one_object_with_every_field_escaped() {
    let json = picture().to_json();
    assert!(
        json.starts_with("{\"exporters\":[{\"process\":{\"pid\":100,"),
        "{json}"
    );
    assert!(json.contains("\"command\":\"trainer \\\"a\\\"\""), "{json}");
    assert!(
        json.contains("\"kind\":\"arena\",\"capacity\":67108864"),
        "{json}"
    );
    assert!(
        json.contains("{\"block\":1,\"generation\":3,\"live\":false,\"deferred\":true,\"kind\":\"arena\",\"device\":\"GPU-4a3b00ff\",\"read_only\":true,\"offset\":1048576,\"bytes\":4096,\"holders\":[1]}"),
        "{json}"
    );
    assert!(
        json.contains(
            "\"changing\":true,\"unchanged_for_s\":12.3,\"unlinked\":true,\"consumers\":["
        ),
        "{json}"
    );
    assert!(
        json.contains("\"kind\":null,\"device\":null,\"read_only\":false"),
        "{json}"
    );
    assert!(
        json.contains("\"reason\":\"header field \\\"type_tag\\\"\\n\""),
        "{json}"
    );
    assert!(
        json.ends_with("\"unlinked\":[{\"name\":\"cuda-ipc-chan.gone\",\"mapped_by\":[{\"pid\":100,\"start_time\":10,\"alive\":true,\"command\":null},{\"pid\":101,\"start_time\":10,\"alive\":true,\"command\":null}]}]}"),
        "{json}"
    );
    // Balanced, and no raw control character inside.
    let opens = json.matches(['{', '[']).count();
    let closes = json.matches(['}', ']']).count();
    assert_eq!(opens, closes);
    assert!(!json.chars().any(char::is_control));
}

#[test]
fn a_registry_is_told_by_its_token_an_arena_by_its_capacity() {
    let mut people = People::default();
    let blocks = |capacity| BlockCensus {
        capacity,
        closing: false,
        blocks: Vec::new(),
    };
    let me = ProcessIdentity::current();
    let kind = |token: &str, capacity, people: &mut People| {
        let pair = Pair {
            blocks: Some((me, blocks(capacity))),
            leases: None,
            changing: false,
        };
        export_table(token.to_owned(), pair, people).1.kind
    };
    assert_eq!(
        kind("0123456789abcdef0123456700000000", 0, &mut people),
        TableKind::Registry
    );
    assert_eq!(
        kind("0123456789abcdef0123456789abcdef", 4096, &mut people),
        TableKind::Arena
    );
    assert_eq!(
        kind("0123456789abcdef0123456789abcdef", 0, &mut people),
        TableKind::Pool
    );
    // A pool whose token ends in four zero bytes is told by its exports' label.
    let pool_label = 0x4a3b_00ff_0000_0003;
    let pair = Pair {
        blocks: Some((
            me,
            BlockCensus {
                capacity: 0,
                closing: false,
                blocks: vec![(
                    0,
                    BlockWords {
                        state: 1,
                        label: pool_label,
                        ..Default::default()
                    },
                )],
            },
        )),
        leases: None,
        changing: false,
    };
    let table = export_table(
        "0123456789abcdef0123456700000000".to_owned(),
        pair,
        &mut people,
    )
    .1;
    assert_eq!(
        (table.kind, table.exports[0].kind),
        (TableKind::Pool, Some(ExportKind::Pool))
    );
    // Without its lease table the table still shows, with the file named missing.
    let pair = Pair {
        blocks: Some((me, blocks(0))),
        leases: None,
        changing: false,
    };
    let (owner, table) = export_table("ab".to_owned(), pair, &mut people);
    assert_eq!((owner.pid(), table.files), (me.pid(), (true, false)));
    assert!(picture().to_string().contains("0011…eeff"));
}

#[test]
fn a_watch_says_how_long_each_channel_stood_still() {
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut watch = Watch::new();
    let mut snap = picture();
    watch.progress(&mut snap, at(0));
    assert_eq!(
        snap.channels[0].unchanged_for,
        Some(Duration::ZERO),
        "first seen"
    );
    let mut snap = picture();
    watch.progress(&mut snap, at(7));
    assert_eq!(snap.channels[0].unchanged_for, Some(Duration::from_secs(7)));
    // A consumer's release is progress.
    let mut snap = picture();
    snap.channels[0].consumers[0].released += 1;
    watch.progress(&mut snap, at(9));
    assert_eq!(snap.channels[0].unchanged_for, Some(Duration::ZERO));
    let mut snap = picture();
    snap.channels[0].consumers[0].released += 1;
    watch.progress(&mut snap, at(12));
    assert_eq!(snap.channels[0].unchanged_for, Some(Duration::from_secs(3)));
    // A send is progress; a channel gone and back is seen afresh.
    let mut snap = picture();
    snap.channels[0].sent += 1;
    watch.progress(&mut snap, at(13));
    assert_eq!(snap.channels[0].unchanged_for, Some(Duration::ZERO));
    let mut gone = picture();
    gone.channels.clear();
    watch.progress(&mut gone, at(14));
    let mut snap = picture();
    snap.channels[0].sent += 1;
    watch.progress(&mut snap, at(20));
    assert_eq!(snap.channels[0].unchanged_for, Some(Duration::ZERO));
}
