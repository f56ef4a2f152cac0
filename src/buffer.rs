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
//! no layer runs code of a layer above it (the import cache hands `buffer/import.rs` a hit to
//! check or a vacancy to fill; `memory.rs` is told what to expect of a mapping, not given a
//! check to run). Together the two calls pass through 10 files, counted this way: the ledger
//! is one stop (`ledger/mod.rs` is its only door; its own docs walk the files behind it and
//! what they use the first time this process imports from an exporter — shared tables through
//! `shm.rs`, a lease slot through `owned_slot.rs`, its owner's identity from `process.rs`);
//! errors, a context's `enter` (`context.rs`, `driver/ctx.rs`), the system calls behind
//! process identities and boot ids (`os/`) and the device list read once
//! (`driver/device.rs`) are leaves every layer may ask.
//!
//! Exporting a legacy buffer (`IpcBuffer::handle`), 6 files: `buffer/export.rs` (the public
//! call, and what the buffer is) → the ledger (`ledger/mod.rs`: deferred frees collected, the
//! export's block published in this process's registry) → `memory.rs` (the handle,
//! `cuIpcGetMemHandle` in `driver/ipc.rs`, remembered as this process's own) → `handle.rs` (the
//! envelope, sealed by `envelope.rs`).
//!
//! Opening it (`ImportedBuffer::open`), 9 files: `buffer/import.rs` → `handle.rs` (the
//! admission, one step before the cache: `envelope.rs`'s checks and the kind's, the exporter
//! of this boot and alive (`process.rs`), the memory's device reachable (`device.rs`)) → the
//! ledger (`ledger/mod.rs`): its import cache hands back a live mapping, which
//! `buffer/import.rs` shares if it is not closing and described alike, or a vacancy (the
//! cache's creation lock), under which the ledger enters the export's block (the exporter's
//! lease table once per exporter, then the block through this process's holdings) →
//! `memory.rs`, which maps (`cuIpcOpenMemHandle` in `driver/ipc.rs`) and holds the size
//! `driver/mem.rs` reports to the envelope's; the mapping then fills the vacancy. A raw handle
//! (PyTorch, CuPy, C++) opens through the same cache and `memory.rs`
//! (`ImportedBuffer::open_raw`, with `raw.rs`'s checks).
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
    pub(crate) fn export_handle<K: HandleKind>(&self, call: &'static str) -> Result<Handle<K>> {
        match self {
            Self::Owner(b) => {
                b.check_unreleased(call)?;
                b.export_handle()
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
