use proptest::prelude::*;

use super::*;
use crate::shm::image_of;

fn put(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// A block table's payload with `blocks` written.
fn block_table(capacity: u64, blocks: &[BlockWords]) -> Vec<u8> {
    let l = &TABLE_LAYOUT;
    let mut p = vec![0u8; l.size];
    put(&mut p, l.capacity, capacity);
    for b in blocks {
        let at = l.blocks + b.index as usize * l.block_size;
        put(&mut p, at + l.state, b.state);
        put(&mut p, at + l.holders, b.holders);
        put(&mut p, at + l.offset, b.offset);
        put(&mut p, at + l.bytes, b.bytes);
        put(&mut p, at + l.label, b.label);
    }
    p
}

#[test]
fn a_short_or_foreign_file_is_not_ours() {
    assert_eq!(parse("cuda-ipc-arena.00", &[]), Parsed::NotOurs);
    assert_eq!(parse("torch_1_2", &[7u8; 4096]), Parsed::NotOurs);
}

#[test]
fn a_block_table_says_its_blocks() {
    let written = [
        BlockWords::of(0, 1, 0b101, 0, 4096, 0x4a3b_00ff_0000_0104),
        BlockWords::of(7, 4, 0b10, 8192, 512, 0),
        // A block whose only word set is its label still shows (a peer wrote it).
        BlockWords::of(9, 0, 0, 0, 0, 99),
    ];
    let payload = block_table(1 << 20, &written);
    let image = image_of::<BlockTable>(&payload, (42, 7));
    assert_eq!(
        our_header(&image).map(|h| (h.creator_pid, h.creator_start)),
        Some((42, 7))
    );
    assert_eq!(
        parse("cuda-ipc-arena.ab", &image),
        Parsed::Blocks(Blocks {
            capacity: 1 << 20,
            closing: false,
            blocks: written.to_vec(),
        })
    );
}

#[test]
fn a_lease_table_says_its_importers() {
    let l = &LEASE_LAYOUT;
    let mut p = vec![0u8; l.size];
    let me = ProcessIdentity::from_parts(1234, 99);
    let held = Owner::encode(OwnerState::Held, &me).unwrap();
    put(&mut p, l.slots + 3 * l.slot_size + SLOT_WORDS.0, held);
    p[l.exporter_pid..l.exporter_pid + 4].copy_from_slice(&77u32.to_le_bytes());
    put(&mut p, l.exporter_start, 5);
    let parsed = parse("cuda-ipc-lease.ab", &image_of::<LeaseTable>(&p, (77, 5)));
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
    let parsed = parse(
        "cuda-ipc-arena.ab",
        &image_of::<crate::sync::AtomicU64>(&[0; 8], (1, 1)),
    );
    assert!(
        matches!(&parsed, Parsed::Foreign(why) if why.contains("payload_size")),
        "{parsed:?}"
    );
    // A channel whose slot count is out of range (zeroed): not decoded, said why.
    let parsed = parse("cuda-ipc-chan.x", &image_of::<RingState>(&[], (1, 1)));
    assert!(
        matches!(&parsed, Parsed::Foreign(why) if why.contains("out of its range")),
        "{parsed:?}"
    );
    // A region of ours with no table name: another region, header only.
    assert_eq!(
        parse("mine", &image_of::<crate::sync::AtomicU64>(&[0; 8], (1, 1))),
        Parsed::Other
    );
    // A block table cut short: its header's length check says so.
    let image = image_of::<BlockTable>(&[], (1, 1));
    let parsed = parse("cuda-ipc-arena.ab", &image[..image.len() / 2]);
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
