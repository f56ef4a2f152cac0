use proptest::prelude::*;

use super::*;
use crate::ledger::{BlockWords, Label};
use crate::owned_slot::OwnerState;
use crate::process::ProcessIdentity;
use crate::shm::{bytes_of, image_of, zeroed};

/// What region `name` holds, which must be one of the crate's.
#[allow(clippy::panic)] // a test helper: failing loudly is the point
fn held(name: &str, bytes: &[u8]) -> Parsed {
    match parse(name, bytes) {
        Some((_, parsed)) => parsed,
        None => panic!("{name}: not one of the crate's regions"),
    }
}

#[test]
fn a_short_or_foreign_file_is_not_ours() {
    assert_eq!(parse("cuda-ipc-arena.00", &[]), None);
    assert_eq!(parse("torch_1_2", &[7u8; 4096]), None);
}

#[test]
fn a_block_table_says_its_blocks() {
    let table = zeroed::<BlockTable>().unwrap();
    table
        .capacity
        .store(1 << 20, crate::sync::Ordering::Relaxed);
    let label = Label::new(
        crate::ledger::ExportKind::Arena,
        &[0x4a, 0x3b, 0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        true,
    );
    // Block 0 live and held by slots 0 and 2; block 7 retired while slot 1 held it.
    table.blocks[0].publish(1, 0, 4096, label);
    let _ = table.blocks[0].enter(0b1, 1); // enters: the block is live with that generation
    let _ = table.blocks[0].enter(0b100, 1); // enters: the block is live with that generation
    table.blocks[7].publish(3, 8192, 512, Label::FOR_TESTS);
    let _ = table.blocks[7].enter(0b10, 3); // enters: the block is live with that generation
    table.blocks[7].retire(3);
    // A block whose only word set is its label still shows (a peer wrote it).
    table.blocks[9].scribble(4, 99);
    let image = image_of::<BlockTable>(bytes_of(&*table), (42, 7));
    assert_eq!(
        our_header(&image).map(|h| (h.creator_pid, h.creator_start)),
        Some((42, 7))
    );
    let creator = parse("cuda-ipc-arena.ab", &image).map(|(c, _)| (c.pid(), c.start_time()));
    assert_eq!(creator, Some((42, 7)), "the creator, from the header");
    let words = |state, holders, offset, bytes, label| BlockWords {
        state,
        holders,
        offset,
        bytes,
        label,
    };
    assert_eq!(
        held("cuda-ipc-arena.ab", &image),
        Parsed::Blocks(BlockCensus {
            capacity: 1 << 20,
            closing: false,
            blocks: vec![
                (0, words(1, 0b101, 0, 4096, label.word())),
                (7, words(4, 0b10, 8192, 512, Label::FOR_TESTS.word())),
                (9, words(0, 0, 0, 0, 99)),
            ],
        })
    );
}

#[test]
fn a_lease_table_says_its_importers() {
    let exporter = ProcessIdentity::from_parts(77, 5);
    let holder = ProcessIdentity::from_parts(1234, 99);
    let table = LeaseTable::for_tests(&exporter, &[(3, holder)]).unwrap();
    let parsed = held(
        "cuda-ipc-lease.ab",
        &image_of::<LeaseTable>(bytes_of(&*table), (77, 5)),
    );
    let Parsed::Leases(leases) = parsed else {
        panic!("{parsed:?}");
    };
    assert_eq!(
        (leases.exporter.pid(), leases.exporter.start_time()),
        (77, 5)
    );
    assert_eq!(leases.slots.len(), 1);
    assert_eq!(
        (leases.slots[0].0, leases.slots[0].1),
        (3, OwnerState::Held)
    );
    assert_eq!(
        (leases.slots[0].2.pid(), leases.slots[0].2.start_time()),
        (1234, 99)
    );
}

#[test]
fn a_table_of_the_wrong_type_or_out_of_range_is_named_so() {
    // A block table's name over another type's region: the header check names the field.
    let parsed = held(
        "cuda-ipc-arena.ab",
        &image_of::<crate::sync::AtomicU64>(&[0; 8], (1, 1)),
    );
    assert!(
        matches!(&parsed, Parsed::Foreign(why) if why.contains("payload_size")),
        "{parsed:?}"
    );
    // A channel whose slot count is out of range (zeroed): not decoded, said why.
    let parsed = held("cuda-ipc-chan.x", &image_of::<RingState>(&[], (1, 1)));
    assert!(
        matches!(&parsed, Parsed::Foreign(why) if why.contains("out of its range")),
        "{parsed:?}"
    );
    // A region of ours with no table name: another region, header only.
    assert_eq!(
        held("mine", &image_of::<crate::sync::AtomicU64>(&[0; 8], (1, 1))),
        Parsed::Other
    );
    // A block table cut short: its header's length check says so.
    let image = image_of::<BlockTable>(&[], (1, 1));
    let parsed = held("cuda-ipc-arena.ab", &image[..image.len() / 2]);
    assert!(matches!(parsed, Parsed::Foreign(_)), "{parsed:?}");
}

proptest! {
    #[test]
    fn any_bytes_under_any_table_name_decode_without_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
    ) {
        let _ = parse_for_fuzzing(&bytes);
    }

    #[test]
    fn any_words_in_a_ring_decode_without_panic(words in proptest::collection::vec(any::<u64>(), 0..512)) {
        let payload: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let _ = parse("cuda-ipc-chan.x", &image_of::<RingState>(&payload, (1, 1)));
        let _ = parse("cuda-ipc-lease.x", &image_of::<LeaseTable>(&payload, (1, 1)));
    }
}
