//! A copy of one `/dev/shm` file's bytes, decoded: which of the crate's tables it is and what
//! it says. Every word is a peer's: sizes and counts are bounded before they index anything,
//! and bytes that do not decode are a [`Parsed::Foreign`] with the reason, never a panic
//! (`fuzz/fuzz_targets/inspect_region.rs` feeds it any bytes).

use crate::channel::ring::{RING_LAYOUT, RingState};
use crate::ledger::{BlockTable, LEASE_LAYOUT, LeaseTable, TABLE_LAYOUT};
use crate::owned_slot::{Owner, OwnerState, SLOT_WORDS};
use crate::process::ProcessIdentity;
use crate::shm::{HeaderFields, header_of_copy, is_our_header, payload_of_copy};

/// What one file holds, decoded from a copy of its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Not a published region of this crate (no header of ours): left out of the snapshot.
    NotOurs,
    /// A region of this crate whose bytes do not decode as the table its name says: why.
    Foreign(String),
    /// A block table: one export table's exports.
    Blocks(Blocks),
    /// A lease table: one export table's importers.
    Leases(Leases),
    /// A channel's ring.
    Ring(Ring),
    /// Another region of this crate (a barrier, a user's `ShmRegion`): its header only.
    Other,
}

/// A decoded block table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub(crate) capacity: u64,
    pub(crate) closing: bool,
    /// Every block ever published (its words not all zero).
    pub(crate) blocks: Vec<BlockWords>,
}

/// One block's words, as read (a peer's: `label` may not decode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BlockWords {
    pub(crate) index: u32,
    pub(crate) state: u64,
    pub(crate) holders: u64,
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    pub(crate) label: u64,
}

#[cfg(test)]
impl BlockWords {
    /// Block `index`'s words, for the tests.
    pub(crate) fn of(
        index: u32,
        state: u64,
        holders: u64,
        offset: u64,
        bytes: u64,
        label: u64,
    ) -> Self {
        Self {
            index,
            state,
            holders,
            offset,
            bytes,
            label,
        }
    }
}

/// A decoded lease table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leases {
    pub(crate) closing: bool,
    pub(crate) exporter: ProcessIdentity,
    /// Every slot not free: index, state, owner.
    pub(crate) slots: Vec<(u32, OwnerState, ProcessIdentity)>,
}

/// A decoded channel ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ring {
    pub(crate) slots: u64,
    pub(crate) capacity: u64,
    pub(crate) elem_size: u64,
    pub(crate) entries: u64,
    pub(crate) producer: Option<(OwnerState, ProcessIdentity)>,
    pub(crate) sent: u64,
    /// Threads asleep waiting for an item (consumers' blocking `recv`).
    pub(crate) sent_sleepers: u32,
    /// Every consumer entry not free: index, state, owner, items released, threads asleep
    /// waiting for its release (the producer's blocking `acquire`).
    pub(crate) consumers: Vec<(u32, OwnerState, ProcessIdentity, u64, u32)>,
}

/// The most consumer entries and slots a ring can have (checked before they index).
const MAX_ENTRIES: u64 = crate::channel::ring::CONSUMER_ENTRIES as u64;
const MAX_SLOTS: u64 = crate::channel::ring::MAX_SLOTS as u64;

/// Decode a copy of file `name`'s bytes. Tables are told by their header's type tag; a region
/// of the crate's table prefixes that is not the table its name says is [`Parsed::Foreign`].
pub(crate) fn parse(name: &str, bytes: &[u8]) -> Parsed {
    let Some(head) = header_of_copy(bytes) else {
        return Parsed::NotOurs;
    };
    if !is_our_header(&head) {
        return Parsed::NotOurs;
    }
    let result = if name.starts_with(crate::shm::BLOCK_TABLES) {
        payload_of_copy::<BlockTable>(name, bytes).map(|p| blocks(p).map(Parsed::Blocks))
    } else if name.starts_with(crate::shm::LEASE_TABLES) {
        payload_of_copy::<LeaseTable>(name, bytes).map(|p| leases(p).map(Parsed::Leases))
    } else if head.type_tag == <RingState as crate::ShmSafe>::type_tag() {
        payload_of_copy::<RingState>(name, bytes).map(|p| ring(p).map(Parsed::Ring))
    } else {
        return Parsed::Other;
    };
    match result {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            Parsed::Foreign("a field out of its range, or fewer bytes than the layout".to_owned())
        }
        Err(e) => Parsed::Foreign(e.to_string()),
    }
}

/// The header of a copy of a file's bytes, if it is one of this crate's regions.
pub(crate) fn our_header(bytes: &[u8]) -> Option<HeaderFields> {
    header_of_copy(bytes).filter(is_our_header)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let word: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(word))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let word: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(word))
}

/// An owned slot's two words at `at`: its state and owner.
fn slot_at(bytes: &[u8], at: usize) -> Option<(OwnerState, ProcessIdentity)> {
    let owner = Owner::decode(u64_at(bytes, at + SLOT_WORDS.0)?);
    let ino = u64_at(bytes, at + SLOT_WORDS.1)?;
    Some((owner.state, owner.identity(ino)))
}

fn blocks(p: &[u8]) -> Option<Blocks> {
    let l = &TABLE_LAYOUT;
    let count = p.len().checked_sub(l.blocks)? / l.block_size;
    let mut blocks = Vec::new();
    for i in 0..count.min(crate::ledger::MAX_BLOCKS) {
        let at = l.blocks + i * l.block_size;
        let words = BlockWords {
            index: u32::try_from(i).ok()?,
            state: u64_at(p, at + l.state)?,
            holders: u64_at(p, at + l.holders)?,
            offset: u64_at(p, at + l.offset)?,
            bytes: u64_at(p, at + l.bytes)?,
            label: u64_at(p, at + l.label)?,
        };
        let never_published = BlockWords {
            index: words.index,
            ..BlockWords::default()
        };
        if words != never_published {
            blocks.push(words);
        }
    }
    Some(Blocks {
        capacity: u64_at(p, l.capacity)?,
        closing: u32_at(p, l.closing)? != 0,
        blocks,
    })
}

fn leases(p: &[u8]) -> Option<Leases> {
    let l = &LEASE_LAYOUT;
    let mut slots = Vec::new();
    for i in 0..crate::ledger::MAX_IMPORTERS {
        let (state, owner) = slot_at(p, l.slots + i * l.slot_size)?;
        if state != OwnerState::Free {
            slots.push((u32::try_from(i).ok()?, state, owner));
        }
    }
    Some(Leases {
        closing: u32_at(p, l.closing)? != 0,
        exporter: ProcessIdentity::from_parts(
            u32_at(p, l.exporter_pid)?,
            u64_at(p, l.exporter_start)?,
        ),
        slots,
    })
}

fn ring(p: &[u8]) -> Option<Ring> {
    let l = &RING_LAYOUT;
    let entries = u64_at(p, l.consumers)?;
    let slots = u64_at(p, l.slots)?;
    if !(1..=MAX_ENTRIES).contains(&entries) || !(1..=MAX_SLOTS).contains(&slots) {
        return None;
    }
    let producer = slot_at(p, l.producer)?;
    let mut consumers = Vec::new();
    for i in 0..MAX_ENTRIES as usize {
        let at = l.consumer + i * l.entry_size;
        let (state, owner) = slot_at(p, at + l.entry_owner)?;
        if state != OwnerState::Free {
            consumers.push((
                u32::try_from(i).ok()?,
                state,
                owner,
                u64_at(p, at + l.entry_released)?,
                u32_at(p, at + l.entry_bell + l.bell_sleepers)?,
            ));
        }
    }
    Some(Ring {
        slots,
        capacity: u64_at(p, l.capacity)?,
        elem_size: u64_at(p, l.elem_size)?,
        entries,
        producer: (producer.0 != OwnerState::Free).then_some(producer),
        sent: u64_at(p, l.sent)?,
        sent_sleepers: u32_at(p, l.sent_bell + l.bell_sleepers)?,
        consumers,
    })
}

/// `parse` for the fuzz target: the first byte picks the name the file goes by (a block
/// table's, a lease table's, a channel's, another region's), the second whether the rest is
/// the whole file or the payload behind a header sealed for that table's type (so that the
/// decoders behind the header check are reached). What it decodes to, as text. Not API.
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
#[must_use]
pub fn parse_for_fuzzing(data: &[u8]) -> String {
    let (Some(&pick), Some(&seal), Some(rest)) = (data.first(), data.get(1), data.get(2..)) else {
        return String::new();
    };
    let names = [
        "cuda-ipc-arena.f",
        "cuda-ipc-lease.f",
        "cuda-ipc-chan.f",
        "other.f",
    ];
    let which = usize::from(pick % 4);
    let bytes = match (seal % 2, which) {
        (0, _) => rest.to_vec(),
        (_, 0) => crate::shm::image_of::<BlockTable>(rest, (1, 1)),
        (_, 1) => crate::shm::image_of::<LeaseTable>(rest, (1, 1)),
        (_, 2) => crate::shm::image_of::<RingState>(rest, (1, 1)),
        _ => crate::shm::image_of::<crate::sync::AtomicU64>(rest, (1, 1)),
    };
    let parsed = parse(names[which], &bytes);
    // Each block's label decoded as the snapshot decodes it (a peer's word: any bits).
    let labels: Vec<Option<String>> = match &parsed {
        Parsed::Blocks(b) => b
            .blocks
            .iter()
            .map(|w| crate::ledger::Label::of_word(w.label).map(|l| l.device_name()))
            .collect(),
        _ => Vec::new(),
    };
    format!("{parsed:?} {labels:?}")
}

#[cfg(test)]
mod tests;
