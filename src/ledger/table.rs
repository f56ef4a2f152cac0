//! The arena's block table in shared memory, and the two-party protocol on each block: the
//! owner publishes and retires blocks, importers enter (take a view) and leave.
//!
//! # Layout
//!
//! One [`BlockTable`] per arena, in a [`ShmRegion`] named after the arena's
//! random token (`cuda-ipc-arena.<token>`), created by the owner. Each [`Block`] is five
//! words: `state`, `holders`, `offset`, `bytes`, and `label` (what the export is: its kind,
//! device and read-only mark, `ledger/label.rs`; only the inspector reads it).
//!
//! - `state` is the block's generation: **odd** while the block is live (allocated, its handle
//!   openable), **even** once retired. Each reuse of a block index moves it on by two, so a
//!   handle names one allocation for ever: it opens only while `state` equals its generation.
//! - `holders` has bit `i` set while the importer holding lease slot `i` of the arena's lease
//!   table has at least one view of the block. One process sets and clears its own bit; the
//!   owner clears it only for a process proven dead.
//!
//! # Protocol
//!
//! - **Publish** (owner, on allocation, with `holders == 0`): write `offset`, `bytes` and
//!   `label`, then `state = g` (odd) with release ordering.
//! - **Enter** (importer, opening a view with generation `g`): `holders |= bit` (read-modify-
//!   write), then read `state` with a read-modify-write (`fetch_add(0)`); if it is not `g`,
//!   `holders &= !bit` and the handle is stale. Only then are `offset` and `bytes` read and
//!   checked against the handle.
//! - **Leave** (importer, its last view of the block dropped): `holders &= !bit`.
//! - **Retire** (owner, on freeing a buffer): `state = g + 1` (a swap), then read `holders`.
//!   If it is 0 the range may be reused at once; otherwise the block waits (quarantined) until
//!   every bit has been cleared by its importer or, for a dead importer, by the owner.
//! - Enter's read of `state` and retire's swap are read-modify-writes of the one word, so one
//!   of them comes second in its modification order and reads from the other: if the
//!   importer's comes second it sees the retired state and backs off; if the owner's comes
//!   second it acquires the importer's release, so its read of `holders` sees the importer's
//!   bit. Either the importer refuses the view or the owner sees the holder — never neither.
//!   (Acquire/release suffices for that argument, which loom checks exactly; sequential
//!   consistency across the two words would also work but loom cannot check it.)
//! - **Reap** (owner): a bit whose lease slot is held by a process proven dead is cleared
//!   (the dead cannot be mid-enter), and then the slot itself is reaped by a compare-exchange
//!   against the exact word judged, so a new importer that takes the slot starts with no bits.
//!
//! # What each side sees when the other stops
//!
//! | The other side is preempted or `SIGKILL`ed... | This side sees |
//! |------------------------------------------------|----------------|
//! | importer, after setting its bit, before reading `state` | owner: a holder (the block is quarantined); once the importer is dead, its bit is reaped |
//! | importer, after a successful enter (holding a view) | owner: a holder until the view drops, or until the importer is dead and reaped; the range is never reused under it |
//! | importer, after a failed enter, before clearing its bit | owner: a holder of a block it already retired; quarantined until the bit clears or the importer is reaped |
//! | importer, after its last view, before `holders &= !bit` | owner: a holder until the bit clears or the importer is reaped |
//! | owner, between writing `offset`/`bytes` and `state` | importers: the block is still retired (its old even state): handles of it are stale |
//! | owner, between retire's swap and its read of `holders` | importers: the handle is stale from the swap on; views already held stay valid |
//! | owner, killed at any point | importers: live blocks stay openable and views stay valid (the driver keeps the memory while an importer maps it); nothing is reused, since only the owner reuses |
//!
//! Tested by: a loom model of retire-and-reuse against an importer's enter, use and leave, and
//! against one that dies after setting its bit (`loom_tests`); replay tests of each row above
//! (`tests`); and `tests/arena_stress.rs`, where importer processes enter, check the range's
//! contents, leave and are `SIGKILL`ed at random while the owner allocates, frees and reuses,
//! checked against a shadow record of who holds what.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use crate::error::{Error, HandleDefect, Result};
use crate::ledger::label::Label;
use crate::ledger::token::{token_name, token_words};
use crate::shm::{ShmOptions, ShmRegion};
use crate::shm_safe::ShmSafe;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The most blocks one block table holds — whatever owns it: an arena's or a pool's buffers
/// ([`IpcArena::MAX_BUFFERS`](crate::arena::IpcArena::MAX_BUFFERS),
/// [`IpcPool::MAX_BUFFERS`](crate::pool::IpcPool::MAX_BUFFERS)), or the exports of this
/// process's export registry.
pub(crate) const MAX_BLOCKS: usize = 16_384;

/// A map keyed by block index, for this process's own books on a table (its views of arena
/// and pool blocks, its holds on export blocks). Hashed with one multiplication instead of
/// SipHash: an open and its drop each look the index up, and a block index is checked against
/// the table's size before it reaches a map, so a peer cannot choose keys that crowd a bucket
/// beyond what that bound allows.
pub(crate) type BlockMap<V> = HashMap<u32, V, BuildHasherDefault<BlockHasher>>;

/// The hasher of a [`BlockMap`]: Fibonacci hashing (a multiplication by 2⁶⁴/φ), whose low bits
/// are distinct for distinct low bits of the index and whose high bits mix all of them.
#[derive(Default)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, index: u32) {
        self.0 = (self.0.rotate_left(32) ^ u64::from(index)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The one admission predicate for a handle's generation, used by every open (registry,
/// arenas, pools): live blocks have odd generations, retired ones even, so only an odd
/// generation can name a live export.
pub(crate) fn names_a_live_export(generation: u64) -> bool {
    generation % 2 == 1
}

/// One block's shared words (see the module docs).
#[repr(C)]
pub(crate) struct Block {
    state: AtomicU64,
    holders: AtomicU64,
    offset: AtomicU64,
    bytes: AtomicU64,
    /// What the export is ([`Label`]'s word), for the inspector only.
    label: AtomicU64,
}

/// What an importer's enter found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Enter {
    /// The block is live with the handle's generation; the caller's bit is set.
    Held,
    /// The block is not (or no longer) the handle's allocation; the caller's bit is clear.
    Stale,
}

impl Block {
    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// A retired block of generation 0 (state built outside shared memory, which starts zeroed).
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            holders: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            label: AtomicU64::new(0),
        }
    }

    /// Owner: make the block live as generation `generation` (odd) over `offset..offset+bytes`,
    /// labelled `label` (what the export is, for the inspector).
    pub(crate) fn publish(&self, generation: u64, offset: u64, bytes: u64, label: Label) {
        self.offset.store(offset, Ordering::Relaxed);
        self.bytes.store(bytes, Ordering::Relaxed);
        self.label.store(label.word(), Ordering::Relaxed);
        self.state.store(generation, Ordering::Release);
    }

    /// Owner: relabel the live block (an exported buffer marked read-only after its first
    /// handle). Only the inspector reads the word.
    pub(crate) fn relabel(&self, label: Label) {
        self.label.store(label.word(), Ordering::Relaxed);
    }

    /// Owner: retire generation `generation` (new opens of its handles are stale from here
    /// on) and return the holders seen after it: 0 means no importer holds a view.
    pub(crate) fn retire(&self, generation: u64) -> u64 {
        self.state
            .swap(generation.wrapping_add(1), Ordering::AcqRel);
        self.holders.load(Ordering::Acquire)
    }

    /// The importers holding views now (acquire: a cleared bit's views are all gone).
    pub(crate) fn holders(&self) -> u64 {
        self.holders.load(Ordering::Acquire)
    }

    /// Owner: clear the bits in `dead` (importers proven dead); returns the holders left.
    pub(crate) fn clear_dead(&self, dead: u64) -> u64 {
        self.holders.fetch_and(!dead, Ordering::AcqRel) & !dead
    }

    /// Importer: set `bit`, then check that the block is live with `generation`; on a mismatch
    /// clear `bit` again. `pause` runs between the two steps (the stress test stalls or kills
    /// itself there).
    ///
    /// A generation that [`names_a_live_export`] refuses is stale at once, whatever the block
    /// holds: a retired block reads its even generation, and a handle carrying it (forged, or
    /// built from a retired block's words) must not open the range the block once had.
    pub(crate) fn enter_pausing(&self, bit: u64, generation: u64, pause: impl FnOnce()) -> Enter {
        if !names_a_live_export(generation) {
            return Enter::Stale;
        }
        self.holders.fetch_or(bit, Ordering::AcqRel);
        pause();
        // A read-modify-write, against retire's swap: see the module docs.
        if self.state.fetch_add(0, Ordering::AcqRel) == generation {
            Enter::Held
        } else {
            self.holders.fetch_and(!bit, Ordering::Release);
            Enter::Stale
        }
    }

    /// [`enter_pausing`](Self::enter_pausing) without a pause.
    #[cfg(any(test, cuda_ipc_loom, fuzzing, cuda_ipc_test_hooks))]
    pub(crate) fn enter(&self, bit: u64, generation: u64) -> Enter {
        self.enter_pausing(bit, generation, || {})
    }

    /// Importer, holding a view: whether the block is still generation `generation` (it may
    /// have been retired since; it cannot have been reused while our bit is set).
    pub(crate) fn is_live(&self, generation: u64) -> bool {
        names_a_live_export(generation) && self.state.load(Ordering::Acquire) == generation
    }

    /// Importer: give up `bit` (the last view of the block in this process is gone).
    pub(crate) fn leave(&self, bit: u64) {
        self.holders.fetch_and(!bit, Ordering::Release);
    }

    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
    /// Overwrite word `field % 5` (state, holders, offset, bytes, label) with `value`, as a
    /// hostile process writing the shared table would (the fuzz target's hook).
    pub(crate) fn scribble(&self, field: usize, value: u64) {
        let word = match field % 5 {
            0 => &self.state,
            1 => &self.holders,
            2 => &self.offset,
            3 => &self.bytes,
            _ => &self.label,
        };
        word.store(value, Ordering::Relaxed);
    }

    /// Every word, each read on its own (for the inspector, of a private copy).
    pub(crate) fn words(&self) -> BlockWords {
        BlockWords {
            state: self.state.load(Ordering::Relaxed),
            holders: self.holders.load(Ordering::Relaxed),
            offset: self.offset.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            label: self.label.load(Ordering::Relaxed),
        }
    }

    /// The range the owner published (read after a successful enter).
    pub(crate) fn range(&self) -> (u64, u64) {
        (
            self.offset.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// The shared table of one arena.
#[repr(C)]
pub(crate) struct BlockTable {
    pub(crate) token: [AtomicU64; 2],
    /// The arena's mapped size in bytes.
    pub(crate) capacity: AtomicU64,
    /// Set by the owner's drop: every block is retired, nothing will be published again.
    pub(crate) closing: AtomicU32,
    _reserved: AtomicU32,
    pub(crate) blocks: [Block; MAX_BLOCKS],
}

// SAFETY: repr(C), all fields integer atomics (valid for any bits, accessed atomically).
// Under `--cfg cuda_ipc_loom` (model checks only, where no region is ever mapped) the atomics are
// loom's; see `shm_safe.rs`.
unsafe impl ShmSafe for BlockTable {
    fn type_tag() -> u64 {
        u64::from_le_bytes(*b"arena002")
    }
}

/// One block's words as read at one moment (the inspector reads them of a private copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BlockWords {
    pub(crate) state: u64,
    pub(crate) holders: u64,
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    /// What the export is ([`Label`]'s word; a peer's, so it may not decode).
    pub(crate) label: u64,
}

/// What a block table says, read word by word: its capacity, whether its owner is closing it,
/// and every block ever published (its words not all zero), by index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockCensus {
    pub(crate) capacity: u64,
    pub(crate) closing: bool,
    pub(crate) blocks: Vec<(u32, BlockWords)>,
}

impl BlockTable {
    /// Create the block table of export `token` (an arena of `capacity` bytes, or a pool with
    /// 0), after removing, once per process, tables whose owners died.
    pub(crate) fn create(token: &[u8; 16], capacity: u64) -> Result<ShmRegion<Self>> {
        crate::shm::reclaim_stale_once(crate::shm::BLOCK_TABLES);
        let words = token_words(token);
        ShmOptions::new(token_name(crate::shm::BLOCK_TABLES, token)).create_with(|t: &Self| {
            t.token[0].store(words[0], Ordering::Relaxed);
            t.token[1].store(words[1], Ordering::Relaxed);
            t.capacity.store(capacity, Ordering::Relaxed);
            Ok(())
        })
    }

    /// Open the block table of export `token`, which a handle of `generation` named. A table
    /// that is gone is [`Error::StaleHandle`] (its owner dropped the arena or pool); one that
    /// names another token or capacity is [`Error::CorruptHandle`].
    pub(crate) fn open(
        token: &[u8; 16],
        capacity: u64,
        generation: u64,
    ) -> Result<ShmRegion<Self>> {
        let table = match ShmOptions::new(token_name(crate::shm::BLOCK_TABLES, token))
            .open_timeout(Duration::from_millis(200))
            .open::<Self>()
        {
            Ok(t) => t,
            Err(Error::NotFound { .. }) | Err(Error::NotReady { .. }) => {
                return Err(Error::StaleHandle { generation });
            }
            Err(e) => return Err(e),
        };
        let words = token_words(token);
        if table.token[0].load(Ordering::Relaxed) != words[0]
            || table.token[1].load(Ordering::Relaxed) != words[1]
            || table.capacity.load(Ordering::Relaxed) != capacity
        {
            return Err(Error::corrupt_handle(HandleDefect::Names {
                detail: "the block table names another arena or pool, or another size".into(),
            }));
        }
        Ok(table)
    }

    /// Block `index`, if the index is in range.
    pub(crate) fn block(&self, index: u32) -> Option<&Block> {
        self.blocks.get(index as usize)
    }

    /// What the table says, read word by word (the inspector reads a private copy).
    pub(crate) fn census(&self) -> BlockCensus {
        let never_published = BlockWords::default();
        BlockCensus {
            capacity: self.capacity.load(Ordering::Relaxed),
            closing: self.closing.load(Ordering::Relaxed) != 0,
            blocks: (0u32..)
                .zip(&self.blocks)
                .map(|(i, b)| (i, b.words()))
                .filter(|(_, w)| *w != never_published)
                .collect(),
        }
    }

    /// Clear lease slot `slot`'s bit in every block: done by whoever took a dead importer's
    /// slot (the owner reaping, or an importer taking it over), while it holds the slot and
    /// before it gives it on or uses it, so that the slot's next holder starts with no bits.
    pub(crate) fn clear_slot_bits(&self, slot: usize) {
        let Some(bit) = 1u64.checked_shl(u32::try_from(slot).unwrap_or(u32::MAX)) else {
            return;
        };
        for block in &self.blocks {
            if block.holders() & bit != 0 {
                block.clear_dead(bit);
            }
        }
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    //! Replay tests: each interleaving of the module docs' table, played step by step.
    use super::*;

    const A: u64 = 1 << 3; // importer in lease slot 3
    const B: u64 = 1 << 5;

    fn live(g: u64) -> Block {
        let b = Block::new();
        b.publish(g, 4096, 512, Label::FOR_TESTS);
        b
    }

    /// Every block index lands in a bucket of its own in a table of any power-of-two size up
    /// to the index range (the low bits of the hash are a bijection of the index's), and the
    /// map works as a map.
    #[test]
    fn block_indices_hash_to_distinct_buckets() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<BlockHasher>::default();
        for bits in [4u32, 8, 14] {
            let mask = (1u64 << bits) - 1;
            let mut seen = std::collections::HashSet::new();
            for i in 0..(1u32 << bits) {
                assert!(seen.insert(build.hash_one(i) & mask), "{i} of {bits} bits");
            }
        }
        let mut m = BlockMap::default();
        for i in 0..MAX_BLOCKS as u32 {
            m.insert(i, u64::from(i) * 3);
        }
        assert!((0..MAX_BLOCKS as u32).all(|i| m[&i] == u64::from(i) * 3));
        assert_eq!(m.remove(&7), Some(21));
        assert_eq!(m.len(), MAX_BLOCKS - 1);
    }

    #[test]
    fn enter_then_retire_sees_the_holder_and_the_view_stays_valid() {
        let b = live(1);
        assert_eq!(b.enter(A, 1), Enter::Held);
        assert_eq!(b.range(), (4096, 512));
        assert_eq!(
            b.retire(1),
            A,
            "the owner must see the holder and keep the range"
        );
        assert!(!b.is_live(1));
        b.leave(A);
        assert_eq!(b.holders(), 0, "reusable once the view is gone");
    }

    /// Once a handle carrying the retired generation (2, what the block reads once
    /// generation 1 is retired) entered: arena and pool opens then mapped the freed range,
    /// reused for another buffer.
    #[test]
    fn a_retired_generation_never_enters_and_never_reads_live() {
        let b = live(1);
        assert_eq!(b.retire(1), 0);
        assert_eq!(
            b.enter(A, 2),
            Enter::Stale,
            "the retired generation entered"
        );
        assert_eq!(b.holders(), 0);
        assert!(!b.is_live(2));
        let never = Block::new(); // generation 0: never published
        assert_eq!(never.enter(A, 0), Enter::Stale);
        assert!(!never.is_live(0));
    }

    #[test]
    fn retire_then_enter_is_stale_and_leaves_no_bit() {
        let b = live(1);
        assert_eq!(b.retire(1), 0);
        assert_eq!(b.enter(A, 1), Enter::Stale);
        assert_eq!(b.holders(), 0);
    }

    #[test]
    fn bit_set_then_retire_then_state_read_backs_off_and_the_owner_waits() {
        // The importer is preempted between its two steps; the owner retires in between.
        let b = live(1);
        let mut seen_by_owner = 0;
        let got = b.enter_pausing(A, 1, || seen_by_owner = b.retire(1));
        assert_eq!(
            seen_by_owner, A,
            "the owner saw the half-done enter: quarantine"
        );
        assert_eq!(got, Enter::Stale);
        assert_eq!(
            b.holders(),
            0,
            "the importer cleared its bit on the way out"
        );
    }

    #[test]
    fn an_importer_killed_after_its_bit_is_reaped_by_the_owner() {
        let b = live(1);
        // Killed in the pause: its bit stays, and it never learns the state.
        b.holders.fetch_or(A, Ordering::AcqRel);
        assert_eq!(b.retire(1), A);
        assert_eq!(b.clear_dead(A), 0, "proven dead: its bit goes");
    }

    #[test]
    fn reaping_one_dead_importer_keeps_a_live_one() {
        let b = live(1);
        assert_eq!(b.enter(A, 1), Enter::Held);
        assert_eq!(b.enter(B, 1), Enter::Held);
        assert_eq!(b.retire(1), A | B);
        assert_eq!(b.clear_dead(B), A, "A still holds a view: the range waits");
        b.leave(A);
        assert_eq!(b.holders(), 0);
    }

    #[test]
    fn a_reused_block_refuses_handles_of_its_old_generation() {
        let b = live(1);
        assert_eq!(b.retire(1), 0);
        b.publish(3, 0, 256, Label::FOR_TESTS);
        assert_eq!(
            b.enter(A, 1),
            Enter::Stale,
            "an old handle never opens the new buffer"
        );
        assert_eq!(
            b.enter(A, 2),
            Enter::Stale,
            "an even (retired) generation never opens"
        );
        assert_eq!(b.enter(A, 3), Enter::Held);
        assert_eq!(b.range(), (0, 256));
    }

    #[test]
    fn a_half_published_block_is_still_stale() {
        // The owner is stopped between writing the range and the state.
        let b = live(1);
        b.retire(1);
        b.offset.store(8192, Ordering::Relaxed);
        b.bytes.store(1024, Ordering::Relaxed);
        assert_eq!(b.enter(A, 3), Enter::Stale);
        assert_eq!(b.enter(A, 1), Enter::Stale);
    }

    #[test]
    fn a_table_opens_only_for_its_token_and_capacity_and_a_missing_one_is_stale() {
        let token: [u8; 16] = std::array::from_fn(|i| i as u8 ^ (std::process::id() as u8));
        let table = BlockTable::create(&token, 1 << 21).unwrap();
        assert!(BlockTable::open(&token, 1 << 21, 7).is_ok());
        assert!(matches!(
            BlockTable::open(&token, 1 << 22, 7),
            Err(Error::CorruptHandle { .. })
        ));
        let mut other = token;
        other[0] ^= 0xff;
        assert!(matches!(
            BlockTable::open(&other, 1 << 21, 7),
            Err(Error::StaleHandle { generation: 7 })
        ));
        drop(table); // the owner's drop unlinks it: later opens are stale
        assert!(matches!(
            BlockTable::open(&token, 1 << 21, 9),
            Err(Error::StaleHandle { generation: 9 })
        ));
    }

    #[test]
    fn the_table_is_small_enough_for_dev_shm_and_indexes_are_bounded() {
        assert_eq!(std::mem::size_of::<Block>(), 40);
        // 16,384 blocks of 40 bytes: 640 KiB (and the header) of /dev/shm per table.
        assert!(std::mem::size_of::<BlockTable>() <= 641 * 1024);
    }
}

#[cfg(all(test, cuda_ipc_loom))]
mod loom_tests {
    //! Model check of retire-and-reuse against importers. The block's contents are a loom
    //! `UnsafeCell`: the owner writes it when it reuses the range, an importer reads it while it
    //! holds a view, and loom reports any such pair not ordered by happens-before — a reuse under
    //! a live view.
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicBool;

    struct Model {
        block: Block,
        contents: UnsafeCell<u64>,
        /// The importer in slot B is dead (it set its bit and stopped).
        dead: AtomicBool,
    }

    // SAFETY: loom checks every access to `contents` for races; that is the point of the model.
    unsafe impl Sync for Model {}

    const A: u64 = 1;
    const B: u64 = 2;

    #[test]
    fn the_owner_never_reuses_a_range_under_a_view() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let m = Arc::new(Model {
                block: Block::new(),
                contents: UnsafeCell::new(0),
                dead: AtomicBool::new(false),
            });
            m.contents.with_mut(|p| {
                // SAFETY: no other thread exists yet.
                unsafe { *p = 1 }
            });
            m.block.publish(1, 0, 8, Label::FOR_TESTS);

            let importer = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    if m.block.enter(A, 1) == Enter::Held {
                        m.contents.with(|p| {
                            // SAFETY: loom checks this read against the owner's reuse write.
                            assert_eq!(unsafe { *p }, 1, "read a reused range");
                        });
                        m.block.leave(A);
                    }
                })
            };
            let dying = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    // Killed right after setting its bit: it never reads the state or leaves.
                    m.block.holders.fetch_or(B, Ordering::AcqRel);
                    m.dead.store(true, Ordering::Release);
                })
            };

            // The owner: retire, wait for holders (reaping the dead one), reuse.
            let mut holders = m.block.retire(1);
            while holders != 0 {
                let dead = if m.dead.load(Ordering::Acquire) { B } else { 0 };
                holders = m.block.clear_dead(dead);
                if holders != 0 {
                    loom::thread::yield_now();
                    holders = m.block.holders();
                }
            }
            m.contents.with_mut(|p| {
                // SAFETY: loom checks this write against the importer's read.
                unsafe { *p = 2 }
            });
            m.block.publish(3, 0, 8, Label::FOR_TESTS);
            importer.join().unwrap();
            dying.join().unwrap();
        });
    }
}
