//! The owner's books: which block indexes are free, each block's generation, the freed blocks
//! that importers still view (quarantined), and — for an arena — which byte ranges are free.
//! Books of indexes only ([`Book::indexes`]) place no bytes: a pool's allocations and the
//! export registry's buffers and signals have memory the driver placed. Process-local (behind
//! the owner's lock); the shared half is [`super::table`].

use std::collections::BTreeMap;

use super::label::Label;
use super::table::{Block, MAX_BLOCKS};

/// Every range starts and ends on this many bytes
/// ([`IpcArena::ALIGN`](crate::arena::IpcArena::ALIGN)).
pub(crate) const ALIGN: u64 = 256;

/// A live or quarantined allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) index: u32,
    pub(crate) generation: u64,
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
}

/// Why an allocation could not be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Full {
    /// Bytes free now (not counting quarantined ranges).
    pub(crate) free: u64,
    /// Bytes of freed buffers that importers still view.
    pub(crate) quarantined: u64,
    /// Buffers live or quarantined.
    pub(crate) buffers: usize,
}

pub(crate) struct Book {
    capacity: u64,
    /// Free ranges, offset → length, coalesced (no two adjacent); `None` for books of indexes
    /// only.
    ranges: Option<BTreeMap<u64, u64>>,
    /// Free block indexes (the next one is popped from the end).
    free_blocks: Vec<u32>,
    /// The last generation each block index was published with (0: never).
    generations: Vec<u64>,
    /// Retired blocks whose holders were not all gone.
    quarantine: Vec<Placed>,
    max_buffers: usize,
}

impl Book {
    /// Books for `capacity` bytes (a multiple of [`ALIGN`]) and at most `max_buffers` blocks.
    pub(crate) fn new(capacity: u64, max_buffers: usize) -> Self {
        let max_buffers = max_buffers.clamp(1, MAX_BLOCKS);
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self {
            capacity,
            ranges: Some(free),
            free_blocks: (0..max_buffers as u32).rev().collect(),
            generations: vec![0; max_buffers],
            quarantine: Vec::new(),
            max_buffers,
        }
    }

    /// Books of block indexes only, for at most `max_buffers` blocks: an allocation keeps the
    /// size it was given (offset 0, no rounding), for what a quarantine reports.
    pub(crate) fn indexes(max_buffers: usize) -> Self {
        Self {
            ranges: None,
            ..Self::new(0, max_buffers)
        }
    }

    /// Bytes free now (0 for books of indexes only).
    pub(crate) fn free_bytes(&self) -> u64 {
        self.ranges.as_ref().map_or(0, |r| r.values().sum())
    }

    /// Bytes of freed buffers that importers still view.
    pub(crate) fn quarantined_bytes(&self) -> u64 {
        self.quarantine.iter().map(|p| p.bytes).sum()
    }

    /// Live and quarantined buffers.
    pub(crate) fn buffers(&self) -> usize {
        self.max_buffers - self.free_blocks.len()
    }

    /// Place `bytes` (rounded up to [`ALIGN`]) in the first free range that holds it, take a
    /// block index, and publish it in `blocks` with its next (odd) generation, labelled `label`.
    pub(crate) fn alloc(
        &mut self,
        blocks: &[Block],
        bytes: u64,
        label: Label,
    ) -> Result<Placed, Full> {
        let full = |book: &Self| Full {
            free: book.free_bytes(),
            quarantined: book.quarantined_bytes(),
            buffers: book.buffers(),
        };
        let rounded = match &self.ranges {
            Some(_) => bytes.checked_next_multiple_of(ALIGN).filter(|&b| b > 0),
            None => Some(bytes).filter(|&b| b > 0),
        };
        let Some(rounded) = rounded else {
            return Err(full(self));
        };
        let Some(&index) = self.free_blocks.last() else {
            return Err(full(self));
        };
        let Some(block) = blocks.get(index as usize) else {
            return Err(full(self));
        };
        let offset = match &mut self.ranges {
            None => 0,
            Some(ranges) => {
                let Some((&offset, &len)) = ranges.iter().find(|(_, len)| **len >= rounded) else {
                    return Err(full(self));
                };
                ranges.remove(&offset);
                if len > rounded {
                    ranges.insert(offset + rounded, len - rounded);
                }
                offset
            }
        };
        self.free_blocks.pop();
        let generation = self.generations[index as usize] + 1; // odd: live
        self.generations[index as usize] = generation;
        block.publish(generation, offset, rounded, label);
        Ok(Placed {
            index,
            generation,
            offset,
            bytes: rounded,
        })
    }

    /// Retire `placed` in `blocks`; its range and index come back now if no importer holds a
    /// view, else once [`reclaim`](Self::reclaim) finds its holders gone.
    pub(crate) fn free(&mut self, blocks: &[Block], placed: Placed) {
        let Some(block) = blocks.get(placed.index as usize) else {
            return;
        };
        // Even: retired. The next allocation of this index publishes generation + 2.
        self.generations[placed.index as usize] = placed.generation + 1;
        if block.retire(placed.generation) == 0 {
            self.give_back(placed);
        } else {
            self.quarantine.push(placed);
        }
    }

    /// Give back every quarantined block whose holders are gone, clearing first the bits that
    /// `dead` (a mask of importers proven dead) names. Returns the holders still seen, across
    /// all quarantined blocks.
    pub(crate) fn reclaim(&mut self, blocks: &[Block], dead: u64) -> u64 {
        let mut still = 0;
        let mut i = 0;
        while i < self.quarantine.len() {
            let placed = self.quarantine[i];
            let holders = match blocks.get(placed.index as usize) {
                Some(b) if dead != 0 => b.clear_dead(dead),
                Some(b) => b.holders(),
                None => 0,
            };
            if holders == 0 {
                self.quarantine.swap_remove(i);
                crate::trace::event!(
                    "quarantine over: the block's importers are gone",
                    block = placed.index,
                    generation = placed.generation,
                    bytes = placed.bytes
                );
                self.give_back(placed);
            } else {
                still |= holders;
                i += 1;
            }
        }
        still
    }

    /// Whether `placed` was freed and still waits for importers.
    pub(crate) fn is_quarantined(&self, placed: &Placed) -> bool {
        self.quarantine.contains(placed)
    }

    /// How many freed blocks still wait for importers.
    pub(crate) fn quarantined(&self) -> usize {
        self.quarantine.len()
    }

    /// Whether any freed block still waits for importers.
    pub(crate) fn has_quarantine(&self) -> bool {
        !self.quarantine.is_empty()
    }

    fn give_back(&mut self, placed: Placed) {
        self.free_blocks.push(placed.index);
        let Some(ranges) = &mut self.ranges else {
            return;
        };
        let mut offset = placed.offset;
        let mut len = placed.bytes;
        if let Some((&prev, &prev_len)) = ranges.range(..offset).next_back()
            && prev + prev_len == offset
        {
            ranges.remove(&prev);
            offset = prev;
            len += prev_len;
        }
        if let Some(&next_len) = ranges.get(&(offset + len)) {
            ranges.remove(&(offset + len));
            len += next_len;
        }
        debug_assert!(offset + len <= self.capacity);
        ranges.insert(offset, len);
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use super::*;
    use crate::ledger::table::Enter;

    fn blocks(n: usize) -> Vec<Block> {
        (0..n).map(|_| Block::new()).collect()
    }

    #[test]
    fn ranges_are_aligned_disjoint_and_coalesce_back() {
        let t = blocks(8);
        let mut book = Book::new(4096, 8);
        let a = book.alloc(&t, 1, Label::FOR_TESTS).unwrap();
        let b = book.alloc(&t, 300, Label::FOR_TESTS).unwrap();
        let c = book.alloc(&t, 256, Label::FOR_TESTS).unwrap();
        assert_eq!((a.offset, a.bytes), (0, 256));
        assert_eq!((b.offset, b.bytes), (256, 512));
        assert_eq!((c.offset, c.bytes), (768, 256));
        assert!([a, b, c].iter().all(|p| p.generation % 2 == 1));
        book.free(&t, b);
        book.free(&t, a);
        book.free(&t, c);
        assert_eq!(book.free_bytes(), 4096);
        assert_eq!(
            book.ranges.as_ref().map(BTreeMap::len),
            Some(1),
            "coalesced into one range"
        );
        assert_eq!(book.buffers(), 0);
    }

    #[test]
    fn a_viewed_block_is_quarantined_until_its_importer_leaves() {
        let t = blocks(2);
        let mut book = Book::new(512, 2);
        let a = book.alloc(&t, 512, Label::FOR_TESTS).unwrap();
        assert_eq!(t[a.index as usize].enter(1, a.generation), Enter::Held);
        book.free(&t, a);
        assert_eq!(book.quarantined_bytes(), 512);
        let full = book.alloc(&t, 256, Label::FOR_TESTS).unwrap_err();
        assert_eq!((full.free, full.quarantined, full.buffers), (0, 512, 1));
        assert_eq!(book.reclaim(&t, 0), 1, "still held");
        t[a.index as usize].leave(1);
        assert_eq!(book.reclaim(&t, 0), 0);
        let b = book.alloc(&t, 512, Label::FOR_TESTS).unwrap();
        assert_eq!(b.offset, 0);
        assert_eq!(
            t[a.index as usize].enter(2, a.generation),
            Enter::Stale,
            "the old handle does not open the reused range"
        );
    }

    #[test]
    fn a_dead_importers_bits_are_reclaimed() {
        let t = blocks(1);
        let mut book = Book::new(256, 1);
        let a = book.alloc(&t, 256, Label::FOR_TESTS).unwrap();
        assert_eq!(t[0].enter(1 << 7, a.generation), Enter::Held);
        book.free(&t, a);
        assert_eq!(book.reclaim(&t, 1 << 7), 0, "proven dead: reclaimed");
        let b = book.alloc(&t, 256, Label::FOR_TESTS).unwrap();
        assert_eq!(b.generation, a.generation + 2);
    }

    /// Books of indexes only: sizes kept as given, no byte placed, every index usable, and a
    /// quarantine reported in the sizes given.
    #[test]
    fn books_of_indexes_only_place_no_bytes() {
        let t = blocks(3);
        let mut book = Book::indexes(3);
        let a = book.alloc(&t, 1, Label::FOR_TESTS).unwrap();
        let b = book.alloc(&t, 5_000, Label::FOR_TESTS).unwrap();
        let c = book.alloc(&t, u64::MAX, Label::FOR_TESTS).unwrap();
        assert_eq!((a.offset, a.bytes, b.offset, b.bytes), (0, 1, 0, 5_000));
        assert_eq!(c.bytes, u64::MAX);
        assert_eq!(book.free_bytes(), 0);
        assert_eq!(
            book.alloc(&t, 1, Label::FOR_TESTS).unwrap_err().buffers,
            3,
            "indexes run out"
        );
        assert!(
            book.alloc(&t, 0, Label::FOR_TESTS).is_err(),
            "zero bytes is not an allocation"
        );
        assert_eq!(t[b.index as usize].enter(1, b.generation), Enter::Held);
        book.free(&t, b);
        book.free(&t, a);
        assert_eq!(book.quarantined_bytes(), 5_000);
        assert_eq!(book.buffers(), 2);
        t[b.index as usize].leave(1);
        assert_eq!(book.reclaim(&t, 0), 0);
        assert_eq!(book.buffers(), 1);
        let again = book.alloc(&t, 7, Label::FOR_TESTS).unwrap();
        assert_eq!(again.generation % 2, 1);
    }

    #[test]
    fn block_indexes_run_out_before_bytes_do() {
        let t = blocks(2);
        let mut book = Book::new(1 << 20, 2);
        let _a = book.alloc(&t, 256, Label::FOR_TESTS).unwrap();
        let _b = book.alloc(&t, 256, Label::FOR_TESTS).unwrap();
        assert_eq!(
            book.alloc(&t, 256, Label::FOR_TESTS).unwrap_err().buffers,
            2
        );
        assert!(
            book.alloc(&t, 0, Label::FOR_TESTS).is_err(),
            "zero bytes is not an allocation"
        );
        assert!(book.alloc(&t, u64::MAX, Label::FOR_TESTS).is_err());
    }

    #[test]
    fn random_alloc_and_free_never_overlap_live_ranges() {
        let t = blocks(64);
        let mut book = Book::new(64 * 1024, 64);
        let mut live: Vec<Placed> = Vec::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            if live.is_empty() || next() % 3 != 0 {
                if let Ok(p) = book.alloc(&t, 1 + next() % 4000, Label::FOR_TESTS) {
                    for q in &live {
                        assert!(
                            p.offset + p.bytes <= q.offset || q.offset + q.bytes <= p.offset,
                            "{p:?} overlaps {q:?}"
                        );
                    }
                    assert_eq!(p.offset % ALIGN, 0);
                    assert!(p.offset + p.bytes <= 64 * 1024);
                    live.push(p);
                }
            } else {
                let i = (next() % live.len() as u64) as usize;
                book.free(&t, live.swap_remove(i));
            }
            let used: u64 = live.iter().map(|p| p.bytes).sum();
            assert_eq!(used + book.free_bytes(), 64 * 1024);
        }
    }
}
