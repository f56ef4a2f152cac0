//! [`IpcBuffer<T>`]: device memory that another process can map, with typed handles, an import
//! cache, and leases that keep the exporter from freeing memory still mapped elsewhere.
//!
//! # What each role holds
//!
//! An [`IpcBuffer`] is its memory ([`GpuSlice`]) and what the memory is (`export::Export`: a
//! `cuMemAlloc` allocation, a POSIX-fd allocation, or a pool's); an [`ImportedBuffer`] is its
//! view and what it maps (`import::Import`: a mapping shared through the import cache, or a
//! hold on a pool buffer). Each public method matches on its own role's enum: nothing is
//! shared between the roles but the slice. A signal's counter and a channel's slots, which
//! one process owns and another maps, hold a `Side` (either role).
//!
//! # The way a call goes
//!
//! Each call below walks down through these files and never comes back to one it has left
//! (the ledger counts as one stop: `ledger/mod.rs` is its only door, and its own docs walk the
//! files behind it; errors and a context's `enter` are leaves every layer may ask). Together
//! the two calls pass through 11 files.
//!
//! Exporting a legacy buffer (`IpcBuffer::handle`), 7 files: `buffer.rs` (the public call) →
//! `buffer/export.rs` (what the buffer is) → the ledger (`ledger/mod.rs`: deferred frees
//! collected, the export's block published in this process's registry) → `memory.rs` (the
//! handle, `cuIpcGetMemHandle` in `driver/ipc.rs`, remembered as this process's own) →
//! `handle.rs` (the envelope, sealed by `envelope.rs`).
//!
//! Opening it (`ImportedBuffer::open`), 10 files: `buffer.rs` → `buffer/import.rs` →
//! `handle.rs` (the admission, one step before the cache: `envelope.rs`'s checks and the
//! kind's, the exporter of this boot and alive (`process.rs`), the memory's device reachable
//! (`device.rs`)) → the ledger (`ledger/mod.rs`): its import cache shares a live mapping (not
//! closing, described alike) or, under its creation lock, enters the export's block (the
//! exporter's lease table once per exporter, then the block through this process's holdings)
//! → `memory.rs`, which maps (`cuIpcOpenMemHandle` in `driver/ipc.rs`) and holds the size
//! `driver/mem.rs` reports to the envelope's. A raw handle (PyTorch, CuPy, C++) opens through
//! the same cache and `memory.rs` (`ImportedBuffer::open_raw`, with `raw.rs`'s checks).
//!
//! Dropping an exported buffer retires its block (`ledger/registry.rs`) and frees the memory at
//! once or hands it to the deferred frees (`ledger/deferred.rs`); dropping the last view of an
//! import unmaps it, then leaves the block.

mod export;
mod import;

use std::os::fd::OwnedFd;
use std::time::Duration;

use bytemuck::Pod;

pub use export::IpcBuffer;
pub(crate) use export::{Export, pooled};
pub(crate) use import::Import;
pub use import::ImportedBuffer;

use crate::context::GpuContext;
use crate::device;
use crate::error::{CloseError, Error, ObjectState, Result, TypeConflict};
use crate::handle::{Handle, HandleKind, HandleType, IpcMemHandle};
use crate::pool::{IpcPoolHandle, PoolHandle};
use crate::process::ProcessIdentity;
use crate::raw::{RawExport, RawImport};
use crate::slice::GpuSlice;

impl<T: Pod> IpcBuffer<T> {
    /// The most processes that can import from one exporting process at a time, across all its
    /// exported buffers and signals (a further process's open is [`Error::TooManyImporters`]);
    /// an arena or a pool has the same bound for its own importers.
    pub const MAX_IMPORTERS: usize = crate::ledger::MAX_IMPORTERS;

    /// The most buffers and signals one process can have exported at a time (live, or dropped
    /// while importers still map them); a further first export is [`Error::TooManyBuffers`].
    pub const MAX_EXPORTS: usize = crate::ledger::MAX_EXPORTS;

    /// Allocate `len` elements with `cuMemAlloc` in `ctx`, contents unspecified (any bytes are
    /// a valid `T`: it is `Pod`). Nothing is created in `/dev/shm`: the first export of any
    /// buffer of this process creates its export registry (two files, whatever the number of
    /// exports), and each export takes a 32-byte block in it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero or overflowing size, [`Error::Cuda`] naming
    /// `cuMemAlloc` (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
    #[doc(alias = "cuMemAlloc")]
    pub fn new(ctx: &GpuContext, len: usize) -> Result<Self> {
        Self::new_with(ctx, len, HandleType::Legacy)
    }

    /// Allocate `len` elements in `ctx`, shared through handles of type `handle_type`
    /// (contents unspecified): [`HandleType::Legacy`] as [`new`](Self::new);
    /// [`HandleType::PosixFd`] a virtual-memory allocation (`cuMemCreate`, its size rounded up
    /// to the allocation granularity, mapped read-write for `ctx`'s device) that other
    /// processes map only through a file descriptor sent to them
    /// ([`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer)); [`HandleType::Auto`] the
    /// latter where the device supports it; [`HandleType::Pool`] an allocation from a
    /// stream-ordered pool this process keeps for such buffers in `ctx` (one pool while it has
    /// room for [`IpcPool::MAX_BUFFERS`](crate::pool::IpcPool::MAX_BUFFERS), then another; each
    /// freed with its last buffer), complete before this returns, which peers open after
    /// importing the pool once ([`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer) sends
    /// both). [`handle_type`](Self::handle_type) says which.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); for POSIX-fd buffers [`Error::Unsupported`] when the device
    /// cannot export virtual memory as file descriptors, and [`Error::Cuda`] naming
    /// `cuMemGetAllocationGranularity`, `cuMemCreate`, `cuMemAddressReserve`, `cuMemMap` or
    /// `cuMemSetAccess`; for pool buffers as [`IpcPool::new`](crate::pool::IpcPool::new) and
    /// [`IpcPool::alloc`](crate::pool::IpcPool::alloc), and [`Error::Cuda`] naming
    /// `cuStreamSynchronize`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
    /// use cuda_ipc::fd::{FdListener, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let buf = IpcBuffer::<f32>::zeroed_with(&ctx, 1 << 20, HandleType::PosixFd)?;
    /// let listener = FdListener::bind(SocketName::Abstract("my-app".into()), PeerPolicy::SameUid)?;
    /// let peer = listener.accept(Duration::from_secs(5))?;
    /// peer.send_buffer(&buf, Duration::from_secs(5))?;
    /// // The peer: let buf = socket.recv_buffer::<f32>(&ctx, Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    pub fn new_with(ctx: &GpuContext, len: usize, handle_type: HandleType) -> Result<Self> {
        Self::allocate(ctx, len, handle_type)
    }

    /// [`new`](Self::new), then fill with zero bytes; the zeroes are on the device when it
    /// returns, so a handle exported next never shows another process the allocation's old
    /// contents. The fill runs on a stream of its own that does not synchronise with other
    /// streams (the memory is new: nothing else can be using it), so it does not wait behind
    /// the caller's blocked streams either.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), and [`Error::Cuda`] naming `cuStreamCreate`, `cuMemsetD8Async`
    /// or `cuStreamSynchronize`.
    #[doc(alias = "cuMemsetD8")]
    pub fn zeroed(ctx: &GpuContext, len: usize) -> Result<Self> {
        Self::zeroed_with(ctx, len, HandleType::Legacy)
    }

    /// [`new_with`](Self::new_with), then fill with zero bytes as [`zeroed`](Self::zeroed)
    /// does (for a POSIX-fd buffer, the whole granularity-rounded allocation: a peer maps all
    /// of it).
    ///
    /// # Errors
    ///
    /// As [`new_with`](Self::new_with) and [`zeroed`](Self::zeroed).
    pub fn zeroed_with(ctx: &GpuContext, len: usize, handle_type: HandleType) -> Result<Self> {
        Self::allocate_zeroed(ctx, len, handle_type)
    }

    /// Export: the typed handle another process opens (`cuIpcGetMemHandle` in an envelope).
    ///
    /// For a [`HandleType::PosixFd`] buffer the handle describes the memory but cannot map it:
    /// use [`export_fd`](Self::export_fd) or
    /// [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer), which send a descriptor with it.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuIpcGetMemHandle`; [`Error::TooManyBuffers`] when
    /// [`MAX_EXPORTS`](Self::MAX_EXPORTS) buffers and signals of this process are exported; at
    /// this process's first export, a shared-memory error creating its export registry;
    /// [`Error::HandleTypeMismatch`] ([`TypeConflict::NoReadOnlyMapping`]) for a legacy buffer
    /// shared [read-only](Self::read_only_for_importers); [`Error::InvalidState`]
    /// ([`ObjectState::Closing`]) for a buffer a [`close`](Self::close) released (see there).
    #[doc(alias = "cuIpcGetMemHandle")]
    pub fn handle(&self) -> Result<IpcMemHandle<T>> {
        self.check_unreleased("IpcBuffer::handle")?;
        self.check_read_only_shareable()?;
        let handle: IpcMemHandle<T> = self.export_handle()?;
        Ok(handle.marked_read_only_if(self.read_only))
    }

    /// Share this buffer **read-only**: every handle it exports from now on says so
    /// ([`Handle::is_read_only`](crate::Handle::is_read_only)), and importers must open it
    /// with [`ReadOnlyBuffer`](crate::ReadOnlyBuffer) (or
    /// [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only)): a
    /// read-write open is refused ([`TypeConflict::ReadOnly`]). For a
    /// [`HandleType::PosixFd`] buffer the importers' mappings are then `PROT_READ` and the GPU
    /// refuses their writes; for a [`HandleType::Pool`] buffer only the importers' types are
    /// read-only (pools cannot be mapped read-only); a [`HandleType::Legacy`] buffer cannot be
    /// shared read-only, and its exports then fail ([`TypeConflict::NoReadOnlyMapping`]).
    ///
    /// This protects the data against bugs in cooperating readers, not against a hostile
    /// process: whoever holds the descriptor could import the memory read-write itself
    /// (SECURITY.md). The owner still writes it as before.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let weights = IpcBuffer::<f32>::zeroed_with(&ctx, 1 << 20, HandleType::PosixFd)?
    ///     .read_only_for_importers();
    /// let (handle, _fd) = weights.export_fd()?;
    /// assert!(handle.is_read_only());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn read_only_for_importers(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Whether [`read_only_for_importers`](Self::read_only_for_importers) was called.
    #[must_use]
    pub fn is_read_only_for_importers(&self) -> bool {
        self.read_only
    }

    /// A legacy buffer shared read-only cannot be exported: the driver would map it
    /// read-write in every importer.
    fn check_read_only_shareable(&self) -> Result<()> {
        if self.read_only && self.handle_type() == HandleType::Legacy {
            return Err(Error::HandleTypeMismatch {
                handle: HandleType::Legacy,
                conflict: TypeConflict::NoReadOnlyMapping,
            });
        }
        Ok(())
    }

    /// Export a [`HandleType::PosixFd`] buffer: its handle and a new file descriptor for the
    /// memory (`cuMemExportToShareableHandle`), to send together over a Unix socket
    /// (`SCM_RIGHTS`; [`FdSocket::send`](crate::fd::FdSocket::send) or any other). The receiver
    /// opens them with [`open_fd`](ImportedBuffer::open_fd). Each call makes a new descriptor; dropping
    /// it after sending is right (the receiver has its own).
    ///
    /// The descriptor is the capability: whoever holds it can map the memory, whatever uid or
    /// namespace it runs in; the handle alone cannot.
    ///
    /// # Errors
    ///
    /// [`Error::HandleTypeMismatch`] for a legacy buffer; [`Error::Cuda`] naming
    /// `cuMemExportToShareableHandle`; [`Error::InvalidState`] ([`ObjectState::Closing`]) for
    /// a buffer a [`close`](Self::close) released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::os::fd::AsFd;
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
    /// use cuda_ipc::fd::FdSocket;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// # let socket: FdSocket = unimplemented!();
    /// let ctx = GpuContext::new(0)?;
    /// let buf = IpcBuffer::<u32>::zeroed_with(&ctx, 4096, HandleType::PosixFd)?;
    /// let (handle, fd) = buf.export_fd()?;
    /// socket.send(handle.as_bytes(), &[fd.as_fd()], Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export_fd(&self) -> Result<(IpcMemHandle<T>, OwnedFd)> {
        self.check_unreleased("IpcBuffer::export_fd")?;
        let memory = match &self.export {
            Export::Vmm {
                memory: Some(m), ..
            } => m,
            Export::Pooled(_) => return Err(pooled()),
            Export::Vmm { .. } | Export::Legacy { .. } => {
                return Err(Error::HandleTypeMismatch {
                    handle: HandleType::Legacy,
                    conflict: TypeConflict::Needs(HandleType::PosixFd),
                });
            }
        };
        let handle: IpcMemHandle<T> = self.export_handle()?;
        let fd = memory.export_fd()?;
        Ok((handle.marked_read_only_if(self.read_only), fd))
    }

    /// Export a [`HandleType::Pool`] buffer: its pool's handle and a new descriptor of the
    /// pool (`cuMemPoolExportToShareableHandle`), and the buffer's [`PoolHandle`]
    /// (`cuMemPoolExportPointer` data), for a peer's
    /// [`ImportedBuffer::open_pooled`]. [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer)
    /// does this and sends all three in one message; this is for other channels. A peer that
    /// imported the pool before (for an earlier buffer) shares that import and closes the new
    /// descriptor unused.
    ///
    /// # Errors
    ///
    /// [`Error::HandleTypeMismatch`] for a buffer of another handle type;
    /// [`Error::Cuda`] naming `cuMemPoolExportToShareableHandle`, `cuEventSynchronize` or
    /// `cuMemPoolExportPointer`; [`Error::InvalidState`] ([`ObjectState::Closing`]) for a buffer a
    /// [`close`](Self::close) released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::os::fd::AsFd;
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
    /// use cuda_ipc::fd::FdSocket;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// # let socket: FdSocket = unimplemented!();
    /// let ctx = GpuContext::new(0)?;
    /// let buf = IpcBuffer::<u32>::zeroed_with(&ctx, 4096, HandleType::Pool)?;
    /// let (pool, fd, handle) = buf.export_pooled()?;
    /// socket.send(pool.as_bytes(), &[fd.as_fd()], Duration::from_secs(5))?;
    /// socket.send(handle.as_bytes(), &[], Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolExportPointer")]
    pub fn export_pooled(&self) -> Result<(IpcPoolHandle, OwnedFd, PoolHandle<T>)> {
        self.check_unreleased("IpcBuffer::export_pooled")?;
        let Export::Pooled(alloc) = &self.export else {
            return Err(Error::HandleTypeMismatch {
                handle: self.handle_type(),
                conflict: TypeConflict::Needs(HandleType::Pool),
            });
        };
        let (pool, fd) = alloc.pool().export_fd()?;
        let buffer = alloc.handle(self.slice.len)?;
        Ok((pool.marked_read_only_if(self.read_only), fd, buffer))
    }

    /// Let the device of `ctx`, another context of this process, read and write this buffer
    /// — kernels launched there, copies enqueued there — for as long as the buffer lives.
    ///
    /// A buffer is accessible from the device of the context it was created in. Another device
    /// needs access granted, and how depends on the memory:
    ///
    /// - [`HandleType::PosixFd`]: `cuMemSetAccess` on this process's mapping, for `ctx`'s
    ///   device. Peer access between contexts does not reach virtual memory; without this,
    ///   copies there fail with `CUDA_ERROR_INVALID_VALUE` and kernels fault.
    /// - [`HandleType::Legacy`]: peer access from `ctx` to the buffer's context, as
    ///   [`GpuContext::enable_peer_access`] grants it (to every allocation of that context).
    ///
    /// Granting the buffer's own device, or a device granted before, does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::DeviceNotReachable`] when `ctx`'s device cannot access the memory's device
    /// (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming `cuMemSetAccess` or
    /// `cuCtxEnablePeerAccess`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let (gpu0, gpu1) = (GpuContext::new(0)?, GpuContext::new(1)?);
    /// let buf = IpcBuffer::<f32>::new_with(&gpu0, 1 << 20, HandleType::PosixFd)?;
    /// buf.grant_access(&gpu1)?; // kernels on GPU 1 may now take buf.as_raw_ptr()
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        match &self.export {
            Export::Pooled(alloc) => alloc.grant(ctx),
            Export::Vmm {
                memory: Some(memory),
                ..
            } => memory.grant(ctx),
            Export::Vmm { .. } | Export::Legacy { .. } => {
                device::check_peer(ctx.ordinal(), self.slice.ctx.ordinal())?;
                ctx.enable_peer_access(&self.slice.ctx)
            }
        }
    }

    /// How this buffer's memory is shared: [`HandleType::Legacy`] or [`HandleType::PosixFd`]
    /// (an `Auto` request resolved).
    pub fn handle_type(&self) -> HandleType {
        match &self.export {
            Export::Legacy { .. } => HandleType::Legacy,
            Export::Vmm { .. } => HandleType::PosixFd,
            Export::Pooled(_) => HandleType::Pool,
        }
    }

    /// The raw legacy IPC handle of this exported buffer, for a peer that does not use this
    /// crate (PyTorch, CuPy, C/C++; see [`RawExport`] for the layout and the
    /// [`raw` module](crate::raw::RawMemHandle) for what a foreign peer gets).
    ///
    /// What ends at this boundary: a foreign peer takes no lease, so this buffer's drop cannot
    /// see it and frees the memory when the buffer drops, whether the peer still maps it or
    /// not; nor can the peer detect that the buffer was freed (a raw handle has no export
    /// token). Keep the buffer alive until the peer says it is done with the memory (a message,
    /// a barrier, the peer's exit), and tell the peer the element type and count.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuIpcGetMemHandle`; [`Error::InvalidState`]
    /// ([`ObjectState::Closing`]) for a buffer a [`close`](Self::close) released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, IpcBuffer};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let buf = IpcBuffer::<f32>::zeroed(&ctx, 1 << 20)?;
    /// let export = buf.raw_export()?;
    /// // CuPy: cupy.cuda.runtime.ipcOpenMemHandle(bytes(export.handle.0)) + export.offset
    /// println!("{} bytes at offset {}", export.bytes, export.offset);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuIpcGetMemHandle")]
    pub fn raw_export(&self) -> Result<RawExport> {
        self.check_unreleased("IpcBuffer::raw_export")?;
        self.check_read_only_shareable()?;
        let published = match &self.export {
            Export::Legacy { published, .. } => published,
            Export::Vmm { .. } | Export::Pooled(_) => {
                return Err(Error::HandleTypeMismatch {
                    handle: self.handle_type(),
                    conflict: TypeConflict::Needs(HandleType::Legacy),
                });
            }
        };
        Ok(RawExport {
            handle: self.legacy_ipc_handle()?,
            offset: 0,
            bytes: self.byte_len() as u64,
            device_uuid: published.uuid(),
            device_ordinal: self.slice.ctx.ordinal(),
            exporter_pid: std::process::id(),
        })
    }

    /// For an exported buffer: the pids of the live processes that import it now (dead ones
    /// are left out).
    pub fn importers(&self) -> Vec<u32> {
        match &self.export {
            Export::Legacy { published, .. } | Export::Vmm { published, .. } => {
                published.importers()
            }
            Export::Pooled(alloc) => alloc.importers(),
        }
    }

    /// Close the buffer and report what drop would hide: mark it closing (new opens are
    /// refused from here on, whatever this returns), wait up to `timeout` for every importer
    /// to unmap it (reaping importers that died), then free it. A POSIX-fd buffer is released
    /// at once (the driver keeps the memory while importers map it); a
    /// [`HandleType::Pool`] buffer waits for its importers to free their imports, as a legacy
    /// one waits for them to unmap.
    ///
    /// When importers remain, the buffer comes back in the error, still closing: call `close`
    /// again to wait longer, or drop it (its free is then deferred until they unmap, see
    /// [dropping an exported buffer](Self#dropping-an-exported-buffer)). `?` turns the error
    /// into an [`Error`], dropping the buffer.
    ///
    /// # Errors
    ///
    /// [`Error::LeasesOutstanding`] naming the importers still mapping the memory after
    /// `timeout`; [`Error::Cuda`] naming `cuMemFree` when the driver refused the free. That
    /// buffer comes back released: its memory is no longer its own to share — every export
    /// (`handle`, `export_fd`, `export_pooled`, `raw_export`) is [`Error::InvalidState`]
    /// ([`ObjectState::Closing`]) —, and dropping it leaks the memory (a free the driver
    /// refused is not retried).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{Error, GpuContext, IpcBuffer};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let buf = IpcBuffer::<u32>::zeroed(&ctx, 1024)?;
    /// // ... export it; importers map it ...
    /// match buf.close(Duration::from_secs(1)) {
    ///     Ok(()) => println!("freed"),
    ///     Err(e) => match e.error() {
    ///         Error::LeasesOutstanding { pids, .. } => {
    ///             println!("still mapped by {pids:?}; freed once they unmap");
    ///             drop(e); // the buffer in it is dropped: its free is deferred
    ///         }
    ///         _ => return Err(e.into()),
    ///     },
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemFree")]
    pub fn close(self, timeout: Duration) -> std::result::Result<(), CloseError<Self>> {
        let mut buf = self;
        match buf.close_in_place(timeout) {
            Ok(()) => Ok(()), // released: its drop has nothing left to do
            Err(error) => Err(CloseError::new(error, buf)),
        }
    }
}

impl<T: Pod> ImportedBuffer<T> {
    /// Map a buffer exported by another process into `ctx`.
    ///
    /// # Errors
    ///
    /// Checked before the driver sees the handle: [`Error::CorruptHandle`],
    /// [`Error::TypeMismatch`], [`Error::HandleTypeMismatch`] (a POSIX-fd handle: it opens
    /// only with its descriptor, [`open_fd`](Self::open_fd)), [`Error::SameProcess`],
    /// [`Error::PeerGone`] (the exporter), [`Error::DeviceNotReachable`], [`Error::StaleHandle`] (the
    /// buffer was freed, even if a new one now sits at its address),
    /// [`Error::TooManyImporters`]. Then [`Error::Cuda`] naming `cuIpcOpenMemHandle`.
    #[doc(alias = "cuIpcOpenMemHandle")]
    pub fn open(ctx: &GpuContext, handle: &IpcMemHandle<T>) -> Result<Self> {
        Self::open_handle(ctx, handle, None)
    }

    /// Map a [`HandleType::PosixFd`] buffer from its handle and the file descriptor its
    /// exporter sent with it ([`export_fd`](IpcBuffer::export_fd); received over a Unix socket):
    /// `cuMemImportFromShareableHandle`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`
    /// for `ctx`'s device. `fd` is consumed (closed once imported, or on any error). Opening the
    /// same export again in the same context shares the mapping, as for legacy handles; unlike
    /// them, the exporting process may open its own handle.
    ///
    /// The mapping keeps the memory alive: an exporter that drops its buffer (or exits) after
    /// this returns does not free it under this view; the driver frees it when the last
    /// process unmaps it.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open) for the handle (a freed buffer is [`Error::StaleHandle`], a dead
    /// exporter [`Error::PeerGone`] (the exporter), before the descriptor is used);
    /// [`Error::HandleTypeMismatch`] for a legacy handle; [`Error::Cuda`] naming
    /// `cuMemImportFromShareableHandle` for a descriptor that is not CUDA memory;
    /// [`Error::CorruptHandle`] when the descriptor's memory is not on the device the handle
    /// names or the handle's size does not fit it; [`Error::Cuda`] naming `cuMemMap` (the
    /// handle claims more than the allocation holds) or `cuMemSetAccess`;
    /// [`Error::HandleTypeMismatch`] ([`TypeConflict::ReadOnly`]) when the exporter shares the
    /// buffer read-only ([`ReadOnlyBuffer::open_fd`](crate::ReadOnlyBuffer::open_fd) opens it).
    #[doc(alias = "cuMemImportFromShareableHandle")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcMemHandle<T>, fd: OwnedFd) -> Result<Self> {
        handle.refuse_if_read_only()?;
        Self::open_handle(ctx, handle, Some(fd))
    }

    /// Open a [`HandleType::Pool`] buffer from its pool's handle and descriptor and its
    /// [`PoolHandle`] ([`IpcBuffer::export_pooled`]): the pool is imported once per process
    /// (`cuMemPoolImportFromShareableHandle`; a pool imported before, in any context, is shared
    /// and `fd` closed unused, as [`ImportedPool::open_fd`](crate::pool::ImportedPool::open_fd) does),
    /// then the buffer (`cuMemPoolImportPointer`), its size checked against the driver's. `fd`
    /// is consumed. Opening the same buffer again shares the import; the last view's drop
    /// frees it (`cuMemFree`) and lets the owner free the allocation.
    ///
    /// # Errors
    ///
    /// As [`ImportedPool::open_fd`](crate::pool::ImportedPool::open_fd), then as
    /// [`ImportedPool::open`](crate::pool::ImportedPool::open) (a buffer of another pool is
    /// [`Error::CorruptHandle`], a freed one [`Error::StaleHandle`]); a pool handle marked
    /// read-only is [`Error::HandleTypeMismatch`] ([`TypeConflict::ReadOnly`]:
    /// [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only) opens it).
    #[doc(alias = "cuMemPoolImportPointer")]
    pub fn open_pooled(
        ctx: &GpuContext,
        pool: &IpcPoolHandle,
        fd: OwnedFd,
        buffer: &PoolHandle<T>,
    ) -> Result<Self> {
        pool.refuse_if_read_only()?;
        Self::open_pooled_any(ctx, pool, fd, buffer)
    }

    /// [`open`](Self::open), requiring exactly `len` elements.
    ///
    /// # Errors
    ///
    /// [`Error::LengthMismatch`], or as [`open`](Self::open).
    pub fn open_exact(ctx: &GpuContext, handle: &IpcMemHandle<T>, len: usize) -> Result<Self> {
        if handle.env.len != len as u64 {
            handle.check_structure()?;
            return Err(Error::LengthMismatch {
                expected: len,
                found: handle.env.len,
            });
        }
        Self::open(ctx, handle)
    }

    /// Open memory another process exported as a raw legacy IPC handle (PyTorch, CuPy, C/C++
    /// peers): `import.len` elements of `T` at byte `import.offset` of the allocation the
    /// handle maps, mapped with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`. A second open of the same
    /// handle in the same context (any range of it) shares the mapping, as for typed handles.
    ///
    /// Checked before the driver: the range is non-empty and does not overflow, the offset
    /// suits `T`'s alignment, the handle is not one this process exported, and a named
    /// exporter is alive. After mapping: the range lies inside the allocation
    /// (`cuPointerGetAttributes`), and the memory's device is this context's or one it reaches
    /// as a peer.
    ///
    /// # Safety
    ///
    /// A raw handle carries no type, length, exporter or export token, and takes no lease, so
    /// the caller vouches for what this crate cannot check:
    ///
    /// - the exporter keeps the memory allocated **for this use** until every view from this
    ///   open has dropped and all GPU work on them has completed: it must not free it, exit, or
    ///   (PyTorch's caching allocator) hand the block to another tensor meanwhile — the driver
    ///   would not stop it, and reads and writes through the view would then reach whatever
    ///   the memory holds next;
    /// - the range holds `T`s as the exporter lays them out (size, endianness), so that what is
    ///   read is what the exporter meant (any bytes are a valid `T`, since `T: Pod`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty, overflowing or misaligned range;
    /// [`Error::SameProcess`] for a handle this process exported; [`Error::PeerGone`] (the exporter) when
    /// the named exporter is dead; [`Error::Cuda`] naming `cuIpcOpenMemHandle` (a forged or
    /// stale handle, a dead exporter that was not named); [`Error::CorruptHandle`] naming
    /// `cuPointerGetAttributes` when the range reaches past the allocation;
    /// [`Error::DeviceNotReachable`] when the memory is on a device this context cannot reach.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, ImportedBuffer};
    /// use cuda_ipc::raw::{RawImport, RawMemHandle};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// # let (torch_handle, storage_offset_bytes, numel, pid) = (vec![0u8; 66], 0u64, 1usize, 1u32);
    /// let ctx = GpuContext::new(0)?;
    /// // From a PyTorch peer: untyped_storage()._share_cuda_()[1] and [3], the tensor's numel.
    /// let handle = RawMemHandle::from_torch(&torch_handle)?;
    /// let import = RawImport::new(handle, storage_offset_bytes, numel).exporter_pid(pid);
    /// // SAFETY: the PyTorch process keeps the tensor alive until we say we are done.
    /// let tensor = unsafe { ImportedBuffer::<f32>::open_raw(&ctx, &import)? };
    /// let mut host = vec![0.0; tensor.len()];
    /// tensor.copy_to_host(&mut host)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuIpcOpenMemHandle")]
    pub unsafe fn open_raw(ctx: &GpuContext, import: &RawImport) -> Result<Self> {
        // SAFETY: the caller's duties, forwarded unchanged.
        unsafe { Self::open_raw_with(ctx, import) }
    }

    /// Let the device of `ctx`, another context of this process, read and write this buffer
    /// — kernels launched there, copies enqueued there — for as long as the buffer lives.
    ///
    /// An import is accessible from the device of the context it was opened in. For a
    /// [`HandleType::PosixFd`] import, this grants `ctx`'s device read-write access to this
    /// process's mapping (`cuMemSetAccess`); peer access between contexts does not reach
    /// virtual memory, and without this, copies there fail with `CUDA_ERROR_INVALID_VALUE` and
    /// kernels fault. Views of one export in one process share the mapping: access granted
    /// through one is granted through all. Granting the mapping's own device, or a device
    /// granted before, does nothing.
    ///
    /// A legacy import cannot be granted to another context: `cuIpcOpenMemHandle` maps it for
    /// the context that opened it only, and peer access does not reach it (a kernel on another
    /// device faults). Open the handle in `ctx` as well — a mapping of its own, at another
    /// address. (Granting the context it was opened in does nothing.)
    ///
    /// # Errors
    ///
    /// [`Error::HandleTypeMismatch`] with [`TypeConflict::ImportMappedPerContext`] for a
    /// legacy import and another context; [`Error::DeviceNotReachable`] when `ctx`'s device
    /// cannot access the memory's device (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming
    /// `cuMemSetAccess`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::GpuContext;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let (gpu0, gpu1) = (GpuContext::new(0)?, GpuContext::new(1)?);
    /// # let (handle, fd): (cuda_ipc::IpcMemHandle<f32>, std::os::fd::OwnedFd) = todo!();
    /// let buf = cuda_ipc::ImportedBuffer::open_fd(&gpu0, &handle, fd)?;
    /// buf.grant_access(&gpu1)?; // kernels on GPU 1 may now take buf.as_raw_ptr()
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        match &self.import {
            Import::PoolHold(hold) => hold.grant(ctx),
            Import::Mapping(mapping) => match &mapping.vmm {
                Some(memory) => memory.grant(ctx),
                None if ctx.as_raw() == self.slice.ctx.as_raw() => Ok(()),
                None => Err(Error::HandleTypeMismatch {
                    handle: HandleType::Legacy,
                    conflict: TypeConflict::ImportMappedPerContext,
                }),
            },
        }
    }

    /// How the memory is shared: [`HandleType::Legacy`] (including raw handles) or
    /// [`HandleType::PosixFd`].
    #[must_use]
    pub fn handle_type(&self) -> HandleType {
        match &self.import {
            Import::PoolHold(_) => HandleType::Pool,
            Import::Mapping(m) if m.vmm.is_some() => HandleType::PosixFd,
            Import::Mapping(_) => HandleType::Legacy,
        }
    }

    /// The exporting process; `None` for a raw handle whose exporter was not named
    /// ([`RawImport::exporter_pid`]).
    #[must_use]
    pub fn exporter(&self) -> Option<ProcessIdentity> {
        match &self.import {
            Import::Mapping(m) => m.exporter,
            Import::PoolHold(hold) => hold.exporter(),
        }
    }
}

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

impl<T: Pod> crate::handle::sealed::Sealed for IpcBuffer<T> {}
impl<T: Pod> HandleKind for IpcBuffer<T> {
    const NAME: &'static str = "IpcMemHandle";
    const CODE: u16 = crate::handle::KIND_MEM;
    fn check_element(size: u32, align: u32, tag: u64) -> Result<()> {
        crate::handle::check_element::<T>(size, align, tag)
    }
    fn element_type() -> Option<&'static str> {
        Some(std::any::type_name::<T>())
    }
}
