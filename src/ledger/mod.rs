//! The ledger: who holds an export, and when its memory may be freed — in one place.
//!
//! Every export of this crate (a buffer or signal through the per-process export registry, an
//! arena's buffers, a pool's allocations) is freed by the same rule: **retire, then free only
//! once no importer holds it**. The folder's face is this file's re-exports — the owner's side
//! ([`Ledger`], its [`Placed`] blocks, the deferred frees), the importer's side ([`Holdings`],
//! the registry's [`Hold`]) and the import cache; the parts behind it are private, each in the
//! file named after it:
//!
//! | File | What it holds | Shared with peers? |
//! |------|---------------|--------------------|
//! | [`table`] | the block table: per export a generation (odd: live) and a 64-bit mask of holding importers; the enter/leave/retire protocol, its loom model and replay tests | yes (`cuda-ipc-arena.<token>`) |
//! | [`lease`] | the lease table: one slot per importing process, claimed before mapping, reaped once its owner is proven dead; a slot number is the importer's bit in the block table | yes (`cuda-ipc-lease.<token>`) |
//! | [`book`] | the owner's books: free byte ranges and block indexes, generations, quarantined blocks | no (the owner's lock) |
//! | [`owner`] ([`Ledger`]) | a block table, a lease table and the books behind one lock: the owner side of the registry, every arena and every pool | — |
//! | [`registry`] | this process's export registry (one ledger for every exported buffer and signal) and the importer's hold on an export | — |
//! | [`deferred`] | frees of exports dropped while held, and the quarantines of other owners (pools) registered with it, collected together | — |
//! | [`cache`] | the one process-wide cache of imports (buffers, arenas, pools, exporters' ledgers), and the one cache of tables mapped | — |
//! | [`holdings`] | the importer side, opened in one step: its lease slot, its bit in an exporter's block table and the blocks it holds, with each kind's record (used by the registry's imports, arenas and pools) | no (the importer's lock) |
//! | [`label`] | what an export is (kind, device, read-only), one word of its block that only the inspector reads | yes (in the block table) |
//! | [`token`] | an export token's `/dev/shm` name and its two table words (below both tables) | — |
//!
//! The owned-slot word a lease slot is made of (state and owner identity in one atomic word)
//! is `owned_slot.rs`, shared with the barrier's participant slots; whether a holder is alive
//! is decided only by `process.rs`.
//!
//! # The way a call goes
//!
//! - **Export** (owner): [`Ledger::alloc`] publishes a block with a new odd generation; the
//!   handle names the table, the block and the generation.
//! - **Open** (importer): a lease slot in the exporter's lease table (once per exporter, through
//!   [`cache`]), then *enter* the block ([`table`], through the importer's [`holdings`], which
//!   count its views of each block); only then is memory mapped.
//! - **Close** (importer): at the last view of a block, unmap, then *leave* (clear the bit); the
//!   lease goes with the last hold.
//! - **Drop** (owner): [`Ledger::free`] retires the block; with no bit set the memory is freed
//!   at once, otherwise [`deferred`] keeps it until a collect finds the bits cleared — by their
//!   importers, or by `owner::reap_dead_importers` for importers proven dead.
//!
//! Arenas book byte ranges ([`Ledger::create`]); pools and the export registry book block
//! indexes only ([`Ledger::create_indexed`]: the driver placed their memory). A pool keeps, beside
//! its ledger, the pointers of its quarantined allocations, freed once the ledger gives their
//! blocks back, and registers that quarantine with [`deferred`].
//!
//! The stress test (`tests/arena_stress.rs`, through `arena::__testing::Owner`) drives
//! [`Ledger`] with processes killed at random.

mod book;
mod cache;
mod deferred;
mod holdings;
mod label;
mod lease;
mod owner;
mod registry;
mod table;
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
#[doc(hidden)]
#[allow(missing_debug_implementations)] // test hooks, not API
pub mod testing;
mod token;

// The face of the ledger, and nothing else leaves the folder:
// - the owner's side: [`Ledger`] (arenas, pools, the export registry's [`Record`]s), the
//   placements it hands out, and the deferred frees;
pub(crate) use book::{ALIGN, Placed};
pub use deferred::{DeferredFrees, collect_deferred};
pub(crate) use deferred::{Pending, collect_if_pending, free_or_defer, register_pending};
pub use label::ExportKind;
pub(crate) use label::Label;
pub(crate) use owner::{Ledger, Reap};
pub(crate) use registry::{MAX_EXPORTS, Record, collect as collect_exports};
pub(crate) use table::MAX_BLOCKS;
// - the importer's side: [`Holdings`] (lease, bit and holds, opened in one step), the blocks
//   they enter, the registry's [`Hold`] on one export, and the import cache every kind uses.
pub(crate) use cache::{Dying, Entry, ImportCache};
pub(crate) use holdings::{Holding, Holdings};
pub(crate) use lease::MAX_IMPORTERS;
pub(crate) use registry::{Hold, enter};
pub(crate) use table::Block;
// - for the inspector (`inspect.rs`), which reads private copies of both tables: their types
//   (for the header's check) and what each says (`census`).
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub use {lease::__testing as lease_testing, registry::__testing as registry_testing};
pub(crate) use {
    lease::{LeaseCensus, LeaseTable},
    table::{BlockCensus, BlockTable, BlockWords, names_a_live_export},
};
