//! A copy of one `/dev/shm` file's bytes, decoded: which of the crate's tables it is and what
//! it says. The header is checked as an open checks a mapping, then the payload is copied into
//! a table of this process's own and read through the table's own code (`census`), so the
//! inspector knows no field offsets. Every word is a peer's: counts are bounded before they
//! index anything, and bytes that do not decode are a [`Parsed::Foreign`] with the reason,
//! never a panic (`fuzz/fuzz_targets/inspect_region.rs` feeds it any bytes).

use crate::channel::ring::{RingCensus, RingState};
use crate::ledger::{BlockCensus, BlockTable, LeaseCensus, LeaseTable};
use crate::process::ProcessIdentity;
use crate::shm::{HeaderFields, copy_of, header_of_copy, is_our_header};

/// What one of the crate's regions holds, decoded from a copy of its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A region of this crate whose bytes do not decode as the table its name says: why.
    Foreign(String),
    /// A block table: one export table's exports.
    Blocks(BlockCensus),
    /// A lease table: one export table's importers.
    Leases(LeaseCensus),
    /// A channel's ring.
    Ring(RingCensus),
    /// Another region of this crate (a barrier, a user's `ShmRegion`): its header only.
    Other,
}

/// Decode a copy of file `name`'s bytes: the process that created the region (its header's)
/// and what it holds; `None` for a file that is not a published region of this crate (no
/// header of ours: left out of the snapshot). Tables are told by their header's type tag; a
/// region of the crate's table prefixes that is not the table its name says is
/// [`Parsed::Foreign`].
pub(crate) fn parse(name: &str, bytes: &[u8]) -> Option<(ProcessIdentity, Parsed)> {
    let head = our_header(bytes)?;
    let creator = ProcessIdentity::from_parts(head.creator_pid, head.creator_start);
    Some((creator, decode(name, bytes, &head)))
}

/// What the region `name` whose header is `head` holds.
fn decode(name: &str, bytes: &[u8], head: &HeaderFields) -> Parsed {
    let result = if name.starts_with(crate::shm::BLOCK_TABLES) {
        copy_of::<BlockTable>(name, bytes).map(|t| Some(Parsed::Blocks(t.census())))
    } else if name.starts_with(crate::shm::LEASE_TABLES) {
        copy_of::<LeaseTable>(name, bytes).map(|t| Some(Parsed::Leases(t.census())))
    } else if head.type_tag == <RingState as crate::ShmSafe>::type_tag() {
        copy_of::<RingState>(name, bytes).map(|t| t.census().map(Parsed::Ring))
    } else {
        return Parsed::Other;
    };
    match result {
        Ok(Some(parsed)) => parsed,
        Ok(None) => Parsed::Foreign("a count out of its range".to_owned()),
        Err(e) => Parsed::Foreign(e.to_string()),
    }
}

/// The header of a copy of a file's bytes, if it is one of this crate's regions.
pub(crate) fn our_header(bytes: &[u8]) -> Option<HeaderFields> {
    header_of_copy(bytes).filter(is_our_header)
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
        Some((_, Parsed::Blocks(b))) => b
            .blocks
            .iter()
            .map(|(_, w)| crate::ledger::Label::of_word(w.label).map(|l| l.device_name()))
            .collect(),
        _ => Vec::new(),
    };
    format!("{parsed:?} {labels:?}")
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;
