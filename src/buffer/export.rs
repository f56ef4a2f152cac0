//! The exporting side of a buffer: what an [`IpcBuffer`] is ([`Export`]: a `cuMemAlloc`
//! allocation, a POSIX-fd allocation, or a pool's) and the work only an exporter does —
//! allocate, seal a handle, wait for importers, free or defer the free.

use std::os::fd::OwnedFd;
use std::time::Duration;

use bytemuck::Pod;

use crate::context::GpuContext;
use crate::device;
use crate::driver;
use crate::error::{Capability, CloseError, Error, ObjectState, Result, TypeConflict};
use crate::handle::{Envelope, Handle, HandleKind, HandleType, type_tag_of};
use crate::ledger::{self, ExportKind, Label, Record};
use crate::memory::allocation_bytes;
use crate::poll::Backoff;
use crate::pool::{IpcPoolHandle, PoolAlloc, PoolHandle};
use crate::raw::{RawExport, RawMemHandle};
use crate::slice::GpuSlice;
use crate::vmm::VmmMemory;

/// A handle of an [`IpcBuffer<T>`](IpcBuffer), opened with
/// [`ImportedBuffer::open`](crate::ImportedBuffer::open) (or
/// [`open_fd`](crate::ImportedBuffer::open_fd) with its descriptor).
pub type IpcMemHandle<T> = Handle<IpcBuffer<T>>;

/// Device memory this process allocated, holding `len` values of `T`, that other processes can map
/// through a typed [`IpcMemHandle<T>`](crate::IpcMemHandle): they open it as an
/// [`ImportedBuffer<T>`](crate::ImportedBuffer).
///
/// - [`new`](Self::new) allocates with `cuMemAlloc` (never stream-ordered pool memory, which
///   legacy IPC rejects) in a [`GpuContext`]; [`handle`](Self::handle) exports it.
/// - [`ImportedBuffer::open`](crate::ImportedBuffer::open) maps it in another process, after
///   validating the handle and taking a lease (see there).
/// - Dropping an exported buffer never waits: new opens of its handle are refused from then
///   on, and the memory is freed as soon as no importer maps it — at once, or later (see
///   [below](#dropping-an-exported-buffer)). [`close`](Self::close) waits for importers, up
///   to a timeout, and reports what is left.
///
/// Use it from any CUDA crate: [`as_raw_ptr`](GpuSlice::as_raw_ptr) for kernel arguments (or
/// `device_ptr` with the `cust` feature, `.arg(&buf)` in cudarc's launch builder with the `cudarc`
/// feature), host copies (synchronous, or asynchronous on any [`AsStream`](crate::AsStream)),
/// memset.
///
/// `IpcBuffer<T>` is `Send` and `Sync` (so is `ImportedBuffer<T>`). Device memory is not Rust
/// memory: methods take `&self`, and concurrent writes from several processes are a GPU data race
/// for the caller to order (with [`IpcEvent`](crate::IpcEvent)s and barriers), not undefined
/// behaviour in this process.
///
/// # Asynchronous work
///
/// The synchronous methods ([`copy_from_host`](GpuSlice::copy_from_host),
/// [`copy_to_host`](GpuSlice::copy_to_host), [`memset_bytes`](GpuSlice::memset_bytes)) are done
/// with the memory when they return. The `*_async` methods, like kernels launched on
/// [`as_raw_ptr`](GpuSlice::as_raw_ptr), only *enqueue* work that touches the memory later; the
/// buffer does not track that work, and dropping the last view of an import unmaps the memory
/// (`cuIpcCloseMemHandle`) and dropping an export frees it (`cuMemFree`) without waiting for it.
/// That is why they are `unsafe`: the caller keeps the buffer alive until the work has completed
/// (synchronise the stream, or an event recorded after the work, before dropping). The same holds
/// for [`IpcSignal::signal`](crate::GpuSignal::signal) and
/// [`IpcSignal::wait`](crate::GpuSignal::wait).
///
/// Safe code cannot enqueue work on a buffer and then drop it (this does not compile):
///
/// ```compile_fail,E0133
/// use cuda_ipc::{AsStream, IpcBuffer};
///
/// fn copy_then_drop(dst: IpcBuffer<u32>, src: &IpcBuffer<u32>, stream: &(impl AsStream + ?Sized)) {
///     dst.copy_from_device_async(src, stream).ok(); // error: call to unsafe function
///     drop(dst); // would unmap or free `dst` while the copy may still be queued
/// }
/// ```
///
/// # Dropping an exported buffer
///
/// Drop marks the export *closing* (every later open of its handle is refused with
/// [`Error::StaleHandle`]) and frees the memory if no live importer maps it. If one does, the
/// free is deferred: the memory stays allocated, on a per-process list, until a scan finds that
/// its last importer has unmapped it or died; scans run when this process allocates or exports
/// again and when [`collect_deferred`](crate::collect_deferred) is called. Nothing is freed
/// under an importer, and nothing is kept after its importers are gone (beyond the next scan).
/// POSIX-fd buffers need none of this: the driver keeps their memory while any process maps it.
/// A [`HandleType::Pool`] buffer's allocation waits in its pool's quarantine instead, freed at
/// the pool's next allocation or by the same scans (the pool itself goes when it has no buffer
/// and nothing in quarantine).
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// // Exporter:
/// let ctx = GpuContext::new(0)?;
/// let buf = IpcBuffer::<f32>::zeroed(&ctx, 1 << 20)?;
/// let handle: IpcMemHandle<f32> = buf.handle()?; // put it in a ShmCell for the peer
///
/// // Importer, in another process:
/// let peer = ImportedBuffer::open(&ctx, &handle)?;
/// let mut host = vec![0f32; peer.len()];
/// peer.copy_to_host(&mut host)?;
/// # Ok(()) }
/// ```
pub struct IpcBuffer<T: Pod> {
    pub(super) slice: GpuSlice<T>,
    pub(super) export: Export,
    /// Set by [`read_only_for_importers`](IpcBuffer::read_only_for_importers): every handle
    /// says so, and importers must open it read-only.
    pub(super) read_only: bool,
}

crate::slice::deref_to!(IpcBuffer<T> => slice: GpuSlice<T>);

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
    /// For a [`HandleType::PosixFd`] buffer the handle describes the memory but cannot map it: use
    /// [`export_fd`](Self::export_fd) or
    /// [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer), which send a descriptor with
    /// it.
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
        let handle: IpcMemHandle<T> = self.export_handle(None)?;
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

    /// Export a [`HandleType::PosixFd`] buffer: its handle and a new file descriptor for the memory
    /// (`cuMemExportToShareableHandle`), to send together over a Unix socket (`SCM_RIGHTS`;
    /// [`FdSocket::send`](crate::fd::FdSocket::send) or any other). The receiver opens them with
    /// [`open_fd`](crate::ImportedBuffer::open_fd). Each call makes a new descriptor; dropping it
    /// after sending is right (the receiver has its own).
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
        let handle: IpcMemHandle<T> = self.export_handle(None)?;
        let fd = memory.export_fd()?;
        Ok((handle.marked_read_only_if(self.read_only), fd))
    }

    /// Export a [`HandleType::Pool`] buffer: its pool's handle and a new descriptor of the pool
    /// (`cuMemPoolExportToShareableHandle`), and the buffer's [`PoolHandle`]
    /// (`cuMemPoolExportPointer` data), for a peer's
    /// [`ImportedBuffer::open_pooled`](crate::ImportedBuffer::open_pooled).
    /// [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer) does this and sends all three in
    /// one message; this is for other channels. A peer that imported the pool before (for an
    /// earlier buffer) shares that import and closes the new descriptor unused.
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

impl<T: Pod> std::fmt::Debug for IpcBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("device", &self.slice.ctx.ordinal())
            .field("handle_type", &self.handle_type())
            .finish_non_exhaustive()
    }
}

/// The error of a request for one handle (or one descriptor, or a raw handle) of a
/// [`HandleType::Pool`] buffer.
pub(crate) fn pooled() -> Error {
    Error::HandleTypeMismatch {
        handle: HandleType::Pool,
        conflict: TypeConflict::Pooled,
    }
}

/// What an exported buffer's memory is, with the bookkeeping of its exports.
pub(crate) enum Export {
    /// `cuMemAlloc`, exported as legacy handles (`cuIpcGetMemHandle`).
    Legacy {
        published: Published,
        /// Freed, or its free deferred: nothing is left to do.
        released: bool,
    },
    /// `cuMemCreate` + a mapping, exported as POSIX file descriptors; the memory is `None`
    /// once released (the driver frees it when the last importer unmaps).
    Vmm {
        published: Published,
        memory: Option<VmmMemory>,
    },
    /// An allocation of a pool this process shares between such buffers (the pool's table
    /// holds its importers and generation).
    Pooled(PoolAlloc),
}

/// The export's block in this process's registry and the device it names.
pub(crate) struct Published {
    uuid: [u8; 16],
    /// Published at the first export (a buffer never exported has none); moved to the
    /// deferred-free list when the buffer is dropped while mapped elsewhere.
    record: parking_lot::Mutex<Option<Record>>,
}

impl Published {
    fn new(ctx: &GpuContext) -> Self {
        Self {
            uuid: ctx.uuid(),
            record: parking_lot::Mutex::new(None),
        }
    }

    /// The device's UUID, as handles name it.
    pub(crate) fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// The token and generation of the export's block, published now (`bytes` bytes of
    /// `kind`) if this is the first export, else relabelled if it became read-only since.
    fn token(&self, bytes: u64, kind: ExportKind, read_only: bool) -> Result<([u8; 16], u64)> {
        let label = Label::new(kind, &self.uuid, read_only);
        let mut record = self.record.lock();
        let record = match &mut *record {
            Some(r) => {
                r.relabel(label);
                r
            }
            None => record.insert(Record::publish(bytes, label)?),
        };
        Ok((record.token(), record.generation()))
    }

    /// The processes mapping the export now.
    pub(crate) fn importers(&self) -> Vec<u32> {
        self.record
            .lock()
            .as_ref()
            .map_or_else(Vec::new, Record::importers)
    }

    /// A process that holds the export but died without letting go; nothing is reaped.
    fn dead_importer(&self) -> Option<u32> {
        self.record.lock().as_ref()?.dead_importer()
    }
}

impl<T: Pod> IpcBuffer<T> {
    /// The work of [`IpcBuffer::new_with`].
    pub(crate) fn allocate(ctx: &GpuContext, len: usize, handle_type: HandleType) -> Result<Self> {
        let bytes = allocation_bytes::<T>("IpcBuffer::new", len)?;
        crate::ledger::collect_if_pending();
        let posix_fd = match handle_type {
            HandleType::Pool => {
                let alloc = crate::pool::alloc_shared(ctx, bytes)?;
                return Ok(Self::from_parts(
                    GpuSlice::new(ctx.clone(), alloc.ptr(), len),
                    Export::Pooled(alloc),
                ));
            }
            HandleType::Legacy => false,
            HandleType::Auto => crate::vmm::supports_posix_fd(ctx.device())?,
            HandleType::PosixFd => {
                if !crate::vmm::supports_posix_fd(ctx.device())? {
                    return Err(Error::Unsupported {
                        device: ctx.ordinal(),
                        what: "export virtual memory as POSIX file descriptors",
                        missing: Capability::VmmPosixFd,
                    });
                }
                true
            }
        };
        let published = Published::new(ctx);
        let (ptr, export) = if posix_fd {
            let memory = VmmMemory::create(ctx, bytes)?;
            let ptr = memory.ptr();
            let memory = Some(memory);
            (ptr, Export::Vmm { published, memory })
        } else {
            let _g = ctx.enter()?;
            let ptr = driver::mem::alloc(bytes)?;
            let released = false;
            (
                ptr,
                Export::Legacy {
                    published,
                    released,
                },
            )
        };
        Ok(Self::from_parts(
            GpuSlice::new(ctx.clone(), ptr, len),
            export,
        ))
    }

    /// The work of [`IpcBuffer::zeroed_with`].
    pub(crate) fn allocate_zeroed(
        ctx: &GpuContext,
        len: usize,
        handle_type: HandleType,
    ) -> Result<Self> {
        let buf = Self::allocate(ctx, len, handle_type)?;
        buf.fill_fresh(0)?;
        Ok(buf)
    }

    fn from_parts(slice: GpuSlice<T>, export: Export) -> Self {
        Self {
            slice,
            export,
            read_only: false,
        }
    }

    /// Set every byte of a buffer nothing else uses yet, on a private non-blocking stream, and
    /// wait until it is done.
    fn fill_fresh(&self, value: u8) -> Result<()> {
        let bytes = match &self.export {
            Export::Vmm {
                memory: Some(m), ..
            } => m.size(),
            _ => self.byte_len(),
        };
        let _g = self.slice.ctx.enter()?;
        let stream = driver::stream::create_non_blocking()?;
        // SAFETY: the device range is this buffer's `bytes` bytes (its mapping, for a POSIX-fd
        // buffer), which nothing else uses yet; the stream is live, and synchronised before
        // the call returns.
        let mut rc = unsafe { driver::mem::set_bytes_async(self.slice.ptr, value, bytes, stream) };
        if rc.is_ok() {
            // SAFETY: a live stream of this context.
            rc = unsafe { driver::stream::synchronize(stream) };
        }
        // SAFETY: created above and destroyed once; its work is done (or never started).
        let _ = unsafe { driver::stream::destroy(stream) };
        rc
    }

    /// The handle of kind `K` (whose elements are `T`s: a buffer's, a signal's counter, a
    /// channel's slots) that exports this buffer; `shared_as` says what the inspector calls
    /// it where `K` does not (a channel's slots are an `IpcBuffer` handle).
    pub(crate) fn export_handle<K: HandleKind>(
        &self,
        shared_as: Option<ExportKind>,
    ) -> Result<Handle<K>> {
        let published = match &self.export {
            Export::Pooled(_) => return Err(pooled()),
            Export::Vmm { published, .. } | Export::Legacy { published, .. } => published,
        };
        let kind = shared_as.unwrap_or(match (&self.export, K::CODE) {
            (_, crate::handle::KIND_SIGNAL) => ExportKind::Signal,
            (Export::Vmm { .. }, _) => ExportKind::PosixFd,
            _ => ExportKind::Legacy,
        });
        // The ledger first (deferred frees collected, the block published before any handle
        // exists: every importer finds it), then the driver.
        crate::ledger::collect_if_pending();
        let (token, generation) = published.token(self.byte_len() as u64, kind, self.read_only)?;
        let (cuda, handle_type) = match &self.export {
            Export::Vmm { memory, .. } => {
                let mut cuda = [0u8; 64];
                let size = memory.as_ref().map_or(0, VmmMemory::size);
                cuda[..8].copy_from_slice(&(size as u64).to_le_bytes());
                (cuda, HandleType::PosixFd)
            }
            _ => (self.legacy_ipc_handle()?.0, HandleType::Legacy),
        };
        let env = Envelope {
            elem_size: std::mem::size_of::<T>() as u32,
            elem_align: std::mem::align_of::<T>() as u32,
            type_tag: type_tag_of::<T>(),
            len: self.slice.len as u64,
            device_uuid: published.uuid,
            token,
            handle_type: handle_type.code(),
            ..Envelope::exported(K::CODE, generation, self.slice.ctx.ordinal(), cuda)
        };
        Ok(Handle::from_envelope(env.seal()))
    }

    /// The driver's legacy handle of this exported `cuMemAlloc` buffer (`cuIpcGetMemHandle`),
    /// remembered as this process's own (so that opening it here is refused before CUDA).
    pub(crate) fn legacy_ipc_handle(&self) -> Result<RawMemHandle> {
        let raw = {
            let _g = self.slice.ctx.enter()?;
            // SAFETY: a pointer this buffer allocated with cuMemAlloc in this context, live
            // while `self` is (the callers match `Export::Legacy` first).
            unsafe { crate::memory::legacy_handle(self.slice.ptr) }?
        };
        Ok(RawMemHandle(raw))
    }

    /// A process other than this one that holds this export (has it mapped) but has died
    /// without letting go; nothing is reaped.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        match &self.export {
            Export::Legacy { published, .. } | Export::Vmm { published, .. } => {
                published.dead_importer()
            }
            Export::Pooled(_) => None,
        }
    }

    /// Wait for importers up to `timeout` and free, keeping the buffer (retired, or released)
    /// for a caller that hands it back on an error.
    pub(crate) fn close_in_place(&mut self, timeout: Duration) -> Result<()> {
        self.wait_for_importers(timeout)
            .and_then(|()| self.release())
    }

    /// Refuse `call` once the memory was released (by a `close` that handed the buffer back
    /// because the driver refused the free, the only way a released buffer stays reachable):
    /// its record is gone, so a new export would publish a fresh one for memory this buffer no
    /// longer owns, and a pool allocation's event is destroyed.
    pub(crate) fn check_unreleased(&self, call: &'static str) -> Result<()> {
        let released = match &self.export {
            Export::Legacy { released, .. } => *released,
            Export::Vmm { memory, .. } => memory.is_none(),
            Export::Pooled(alloc) => alloc.is_freed(),
        };
        if released {
            return Err(Error::InvalidState {
                call,
                state: ObjectState::Closing,
            });
        }
        Ok(())
    }

    /// For a `cuMemAlloc` export: retire it (new opens are stale) and wait up to `timeout`
    /// until no importer maps it (then it may be freed), reaping importers proven dead. A pool
    /// buffer waits until no importer holds it; a POSIX-fd buffer has nothing to wait for (the
    /// driver keeps its memory while anyone maps it).
    pub(crate) fn wait_for_importers(&self, timeout: Duration) -> Result<()> {
        let record = match &self.export {
            Export::Pooled(alloc) => return alloc.wait_unheld(timeout),
            Export::Vmm { .. } | Export::Legacy { released: true, .. } => return Ok(()),
            Export::Legacy { published, .. } => &published.record,
        };
        let mut record = record.lock();
        let Some(record) = record.as_mut() else {
            return Ok(()); // never exported with a handle: nobody can map it
        };
        if !record.retire() {
            return Ok(());
        }
        let unheld = || {
            ledger::collect_exports();
            !record.is_held()
        };
        Backoff::for_importers(timeout).until_unheld(unheld, || record.importers())
    }

    /// Give the memory back without waiting: freed now, or deferred while importers map it.
    pub(crate) fn release(&mut self) -> Result<()> {
        let bytes = self.byte_len();
        match &mut self.export {
            Export::Pooled(alloc) => alloc.free(None),
            Export::Vmm { published, memory } => {
                // Dropping the record retires the export: new opens fail from here on
                // (StaleHandle); existing importers keep their mappings, which hold the
                // memory: the driver frees it when the last one unmaps.
                drop(published.record.lock().take());
                drop(memory.take());
                Ok(())
            }
            Export::Legacy { released: true, .. } => Ok(()),
            Export::Legacy {
                published,
                released,
            } => {
                *released = true;
                let record = published.record.lock().take();
                ledger::free_or_defer(&self.slice.ctx, self.slice.ptr, bytes, record)
            }
        }
    }
}

impl<T: Pod> Drop for IpcBuffer<T> {
    fn drop(&mut self) {
        if !self.slice.ctx.is_home() {
            // Inherited by a forked child: the parent's (see `process::Home`). Its parts
            // (records, leases, pools) refuse to act here too.
            return;
        }
        // Never waits: freed now, or deferred while importers map it. A failed cuMemFree
        // cannot be reported from drop; `IpcBuffer::close` reports it.
        let _ = self.release();
    }
}

impl<T: Pod> crate::handle::sealed::Sealed for IpcBuffer<T> {}
impl<T: Pod> HandleKind for IpcBuffer<T> {
    const NAME: &'static str = "IpcMemHandle";
    const CODE: u16 = crate::handle::KIND_MEM;
    type Element = T;
}

impl<T: Pod> Handle<IpcBuffer<T>> {
    /// Number of elements of the exported buffer (as the envelope says).
    #[must_use]
    pub fn len(&self) -> usize {
        usize::try_from(self.env.len).unwrap_or(usize::MAX)
    }

    /// Whether the envelope claims zero elements (never true for a valid handle).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.env.len == 0
    }

    /// How the memory is shared: [`HandleType::Legacy`] or [`HandleType::PosixFd`] (never
    /// `Auto`).
    #[must_use]
    pub fn handle_type(&self) -> HandleType {
        self.env.handle_type()
    }
}

#[cfg(test)]
mod tests {
    use crate::error::{Error, ObjectState};
    use crate::{GpuContext, HandleType, IpcBuffer};

    fn closing(r: crate::Result<impl Sized>) -> Option<&'static str> {
        match r {
            Err(Error::InvalidState {
                call,
                state: ObjectState::Closing,
            }) => Some(call),
            _ => None,
        }
    }

    /// What a `close` hands back when the driver refused its free: a buffer whose `release`
    /// ran. The refusal cannot be caused on purpose, so `release` runs here as the close runs
    /// it (and succeeds): every export of the released buffer is refused, naming its call.
    #[test]
    #[ignore = "requires a CUDA device"]
    fn a_released_buffer_exports_nothing_more() {
        let ctx = GpuContext::new(0).expect("a CUDA device (this test runs on a GPU machine)");
        for kind in [HandleType::Legacy, HandleType::PosixFd, HandleType::Pool] {
            let mut buf = IpcBuffer::<u32>::new_with(&ctx, 4096, kind).unwrap();
            // Exported once before, as a buffer handed back by a close would have been.
            match kind {
                HandleType::Legacy => drop(buf.handle().unwrap()),
                HandleType::PosixFd => drop(buf.export_fd().unwrap()),
                _ => drop(buf.export_pooled().unwrap()),
            }
            buf.release().unwrap();
            assert_eq!(closing(buf.handle()), Some("IpcBuffer::handle"), "{kind:?}");
            assert_eq!(
                closing(buf.export_fd()),
                Some("IpcBuffer::export_fd"),
                "{kind:?}"
            );
            assert_eq!(
                closing(buf.export_pooled()),
                Some("IpcBuffer::export_pooled"),
                "{kind:?}"
            );
            assert_eq!(
                closing(buf.raw_export()),
                Some("IpcBuffer::raw_export"),
                "{kind:?}"
            );
            // Its drop finds nothing left to free.
            drop(buf);
        }
    }
}
