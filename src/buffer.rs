//! [`IpcBuffer<T>`]: device memory that another process can map, with typed handles, an import
//! cache, and leases that keep the exporter from freeing memory still mapped elsewhere.
//!
//! # What each role holds
//!
//! An [`IpcBuffer`] (`buffer/export.rs`, with all its methods) is its memory ([`GpuSlice`]) and
//! what the memory is (`export::Export`: a `cuMemAlloc` allocation, a POSIX-fd allocation, or a
//! pool's); an [`ImportedBuffer`] (`buffer/import.rs`) is its view and what it maps
//! (`import::Import`: a mapping shared through the import cache, or a hold on a pool buffer).
//! Each public method matches on its own role's enum: nothing is shared between the roles but
//! the slice. A signal's counter and a channel's slots, which one process owns and another
//! maps, hold a `Side` (either role; this file).
//!
//! # The way a call goes
//!
//! Each call below walks down through these files and never comes back to one it has left:
//! the import cache hands `buffer/import.rs` a hit to check or a vacancy to fill, and
//! `memory.rs` is told what to expect of a mapping, not given a check to run. The one call up
//! is the ledger's collect at an export (below), which runs what pools and channel ends
//! registered with it. Every file a call passes is counted, the *leaves* too — files that
//! decide nothing and call no other file of the crate but those named beside them: errors
//! (`error.rs`, built only on a refusal), a context's `enter` (`context.rs`, `driver/ctx.rs`),
//! the driver call's plumbing (`driver/mod.rs`'s result check, `driver/sys.rs`'s entry point,
//! `driver/loader.rs`'s table), a table's mapping (`shm.rs`) and the system calls (`os/`).
//! Atomics re-exported by `sync.rs` and the ledger's door `ledger/mod.rs` hold no code a call
//! runs; nor does `trace.rs` without the `tracing` feature (with it, every call below also
//! passes it, a leaf: its spans and events).
//!
//! **Exporting a legacy buffer** (`IpcBuffer::handle`, its block already published: the first
//! export publishes it, passing `ledger/owner.rs`, `ledger/book.rs`, `ledger/table.rs` and
//! `shm.rs` once), 18 files, 9 of them leaves: `buffer/export.rs` (the public call) →
//! `ledger/deferred.rs` (deferred frees collected if any are pending: one load; the pools'
//! and channel ends' own checks, `pool.rs` and `channel/drain.rs`, one load each) →
//! `ledger/registry.rs` (the block's token and generation) → `memory.rs`
//! (`cuIpcGetMemHandle`, remembered as this process's own) → `handle.rs` (the envelope: this
//! process's identity from `process.rs`, sealed by `envelope.rs`); leaves `context.rs`,
//! `driver/ctx.rs`, `driver/ipc.rs`, `driver/mod.rs`, `driver/sys.rs`, `driver/loader.rs`,
//! `os/linux.rs` (the boot id, read once), `error.rs`, `ledger/label.rs` (the export's label
//! for the inspector: its kind, device and read-only mark).
//!
//! **Opening it** (`ImportedBuffer::open`) in a process that imported from this exporter
//! before (its lease and tables mapped: the *warm* open), 21 files, 10 of them leaves:
//! `buffer/import.rs` (the public call, the cache key) → `handle.rs` (the admission, one step
//! before the cache: the structure and element type, with `envelope.rs`'s checksum and
//! identity checks; the exporter of this boot and alive, `process.rs`, asking `os/linux.rs`
//! when its answer is over 100 µs old; the memory's device reachable,
//! `device.rs`) → `ledger/cache.rs` (the import cache: a live mapping, which
//! `buffer/import.rs` shares if it is not closing and described alike — 10 files for a hit —
//! or a vacancy, the cache's creation lock) → `ledger/registry.rs` (the exporter's ledger,
//! found in `ledger/cache.rs`) → `ledger/holdings.rs` (this process's views of the block) →
//! `ledger/table.rs` (the block entered: our bit set, its generation checked, through
//! `shm.rs`) → `memory.rs` (`cuIpcOpenMemHandle` in `driver/ipc.rs`; the size
//! `driver/mem.rs` reports held to the envelope's) → `slice.rs` (the view); leaves
//! `context.rs`, `driver/ctx.rs`, `driver/mod.rs`, `driver/sys.rs`, `driver/loader.rs`,
//! `os/linux.rs`, `shm.rs`, `driver/mem.rs`, `driver/ipc.rs`, `error.rs`. The first import
//! from an exporter (the *cold* open) also names its tables (`ledger/token.rs`), claims its
//! lease (`ledger/lease.rs`, `owned_slot.rs`) and checks the tables it maps
//! (`shm/header.rs`, `shm_safe.rs`): 26 files. A raw handle (PyTorch, CuPy, C++) opens through the same cache
//! and `memory.rs` (`ImportedBuffer::open_raw`, with `raw.rs`'s checks) and takes no lease.
//!
//! Dropping an exported buffer retires its block (`ledger/registry.rs`) and frees the memory at
//! once or hands it to the deferred frees (`ledger/deferred.rs`); dropping the last view of an
//! import unmaps it, then leaves the block.

mod export;
mod import;

use std::time::Duration;

use bytemuck::Pod;

pub use export::{IpcBuffer, IpcMemHandle};
pub use import::ImportedBuffer;

use crate::error::{Error, ObjectState, Result};
use crate::handle::{Handle, HandleKind};
use crate::ledger::ExportKind;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;

/// A buffer on one side of an object both sides hold (a signal's counter, a channel's slots):
/// the exporter's own allocation, or the importer's mapping of it.
pub(crate) enum Side<T: Pod> {
    /// This process allocated it and exports it.
    Owner(IpcBuffer<T>),
    /// This process maps another's export.
    Importer(ImportedBuffer<T>),
}

impl<T: Pod> std::ops::Deref for Side<T> {
    type Target = GpuSlice<T>;

    fn deref(&self) -> &GpuSlice<T> {
        match self {
            Self::Owner(b) => b,
            Self::Importer(b) => b,
        }
    }
}

impl<T: Pod> Side<T> {
    /// The owner's handle of kind `K` (`call` names the public method that asked, for the
    /// errors: an import cannot be exported again, and an owner a failed close released — an
    /// [`IpcSignal`](crate::IpcSignal) handed back by its `close` — has nothing left to export).
    /// `shared_as`: what the inspector calls the export where `K` does not say.
    pub(crate) fn export_handle<K: HandleKind>(
        &self,
        call: &'static str,
        shared_as: Option<ExportKind>,
    ) -> Result<Handle<K>> {
        match self {
            Self::Owner(b) => {
                b.check_unreleased(call)?;
                b.export_handle(shared_as)
            }
            Self::Importer(_) => Err(Error::InvalidState {
                call,
                state: ObjectState::Imported,
            }),
        }
    }

    /// The exporting process, for an importer.
    pub(crate) fn exporter(&self) -> Option<ProcessIdentity> {
        match self {
            Self::Owner(_) => None,
            Self::Importer(b) => b.exporter(),
        }
    }

    /// The live importers, for the owner.
    pub(crate) fn importers(&self) -> Vec<u32> {
        match self {
            Self::Owner(b) => b.importers(),
            Self::Importer(_) => Vec::new(),
        }
    }

    /// A process that held the export but died without letting go; nothing is reaped.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        match self {
            Self::Owner(b) => b.dead_importer(),
            Self::Importer(b) => b.dead_importer(),
        }
    }

    /// Whether this side maps another process's export.
    pub(crate) fn is_imported(&self) -> bool {
        matches!(self, Self::Importer(_))
    }

    /// The owner: wait for importers up to `timeout` and free, keeping the buffer for a caller
    /// that hands it back on an error. An importer has nothing to wait for (its mapping goes
    /// when it drops).
    pub(crate) fn close_in_place(&mut self, timeout: Duration) -> Result<()> {
        match self {
            Self::Owner(b) => b.close_in_place(timeout),
            Self::Importer(_) => Ok(()),
        }
    }

    /// [`close_in_place`](Self::close_in_place), then drop.
    pub(crate) fn close(mut self, timeout: Duration) -> Result<()> {
        self.close_in_place(timeout)
    }
}
