//! [`IpcBuffer<T>`]: device memory that another process can map, with typed handles, an import
//! cache, and leases that keep the exporter from freeing memory still mapped elsewhere.
//!
//! # The way a call goes
//!
//! Exporting (`IpcBuffer::handle`): this file asks the driver for the export
//! (`driver/ipc.rs`, `cuIpcGetMemHandle`; a POSIX-fd buffer's memory is `vmm.rs`'s), publishes
//! the export's block in this process's registry (`ledger/registry.rs`, which writes
//! `ledger/table.rs`'s block table) and seals the envelope (`handle.rs`, sealed by
//! `envelope.rs`).
//!
//! Opening (`ImportedBuffer::open`): this file has the handle admitted (`handle.rs`: its kind's
//! checks after `envelope.rs`'s, then the exporter, `process.rs`), looks the export up in the
//! import cache (`ledger/cache.rs`) and, on a miss, enters the export's block
//! (`ledger/registry.rs`: the exporter's lease table once per exporter, `ledger/lease.rs`, then
//! the block, `ledger/table.rs`), and only then maps it (`driver/ipc.rs` or `vmm.rs`). Each file
//! is left once; nothing calls back into this one.
//!
//! Dropping an exported buffer retires its block (`ledger/registry.rs`) and frees the memory at
//! once or hands it to the deferred frees (`ledger/deferred.rs`); dropping the last view of an
//! import unmaps it, then leaves the block.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::ledger::cache::{Dying, ImportCache};
use bytemuck::Pod;

use crate::context::GpuContext;
use crate::device;
use crate::driver::{self, sys};
use crate::error::{
    ArgumentDefect, Capability, CloseError, Error, HandleDefect, ObjectState, Result, StateDefect,
    TypeConflict,
};
use crate::handle::{
    Envelope, Handle, HandleKind, HandleType, IpcMemHandle, check_element, type_tag_of,
};
use crate::ledger::deferred;
use crate::ledger::registry::{self, Hold, Record};
use crate::poll::Backoff;
use crate::pool::{IpcPoolHandle, PoolAlloc, PoolHandle, PoolHold};
use crate::process::ProcessIdentity;
use crate::raw::{RawExport, RawImport, RawMemHandle};
use crate::slice::GpuSlice;
use crate::vmm::{Access, VmmMemory};

/// Export generations of this process, one per exported buffer or event.
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Import cache key: the export token, the importing context, and the envelope kind (a signal's
/// counter and a buffer never share a mapping record, whatever a forged envelope claims).
/// An export (its token padded to 64 bytes, or a raw handle's 64 bytes), the context, and the
/// kind of handle that opened it ([`KIND_RAW`] for raw handles).
/// A read-only import ([`ReadOnlyBuffer`](crate::ReadOnlyBuffer)) is a mapping of its own
/// (the last field), never shared with a read-write one.
type Key = ([u8; 64], usize, u16, Access);

/// The cache kind of raw handles (not an envelope kind: they have no envelope).
const KIND_RAW: u16 = u16::MAX;

/// What the first open of a mapping described, which every later open must match.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Described {
    /// From an envelope: element size, alignment, type tag and length.
    Envelope(u32, u32, u64, u64),
    /// From a raw handle: nothing beyond the bytes mapped (views may take any range of them).
    Raw,
}

/// Live imports of this process, so that opening a buffer again shares one mapping and the
/// driver's close runs once. A mapping being closed is waited for, never opened again beside
/// its close (the driver has one mapping of an export per context: the close would unmap both).
static CACHE: ImportCache<Key, Mapping> = ImportCache::new(Dying::WaitForIt);

/// One `cuIpcOpenMemHandle` mapping, shared by every [`IpcBuffer`] view of it in this process.
struct Mapping {
    ctx: GpuContext,
    ptr: sys::CUdeviceptr,
    /// Bytes mapped from `ptr` on, as the driver reports the allocation
    /// (`cuPointerGetAttributes`): no view may reach past them, whatever an envelope says.
    mapped: usize,
    /// What the envelope that created the mapping described: element size, alignment, type
    /// tag and length. Every later open of the same export must describe the same.
    described: Described,
    key: Key,
    /// The exporting process (for a raw handle: only if the caller named it).
    exporter: Option<ProcessIdentity>,
    /// When (ns since [`liveness_clock`]) a cache hit last found the exporter alive: hits
    /// within [`LIVENESS_REUSE_NS`] of it skip the `pidfd` poll (0: never checked by a hit).
    exporter_seen_alive: AtomicU64,
    /// For a POSIX-fd import: the imported allocation and its mapping (taken and torn down in
    /// `drop`); `None` for legacy handles, closed with `cuIpcCloseMemHandle`.
    vmm: Option<VmmMemory>,
    // Dropped after `drop` has unmapped: the exporter may free once the hold is gone. Raw
    // handles have none (a foreign exporter keeps no ledger).
    hold: Option<Hold>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(vmm) = self.vmm.take() {
            drop(vmm); // unmap, free the range, release the imported handle
        } else if let Ok(_g) = self.ctx.enter() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle in this context and is closed exactly
            // once, here, when the last view is gone. Drop cannot report a failure.
            let _ = unsafe { driver::ipc::close_mem_handle(self.ptr) };
        }
        // Closed: the export may be opened again (a lookup meanwhile waited for this).
        CACHE.forget(&self.key);
    }
}

struct Export {
    uuid: [u8; 16],
    /// The export's block in this process's registry, published at the first export (a
    /// buffer never exported has none); moved to the deferred-free list when the buffer is
    /// dropped while mapped elsewhere.
    record: parking_lot::Mutex<Option<Record>>,
    released: bool,
    /// For a POSIX-fd buffer: the allocation (released in `release`); `None`: `cuMemAlloc`.
    vmm: Option<VmmMemory>,
}

enum Origin {
    Exported(Export),
    Imported(Arc<Mapping>),
    /// A [`HandleType::Pool`] buffer: an allocation of a pool this process shares between such
    /// buffers (the pool's table holds its importers and generation).
    Pooled(PoolAlloc),
    /// An imported [`HandleType::Pool`] buffer: a hold on this process's import of it.
    PoolImported(PoolHold),
}

/// Device memory this process allocated, holding `len` values of `T`, that other processes can
/// map through a typed [`IpcMemHandle<T>`]: they open it as an [`ImportedBuffer<T>`].
///
/// - [`new`](Self::new) allocates with `cuMemAlloc` (never stream-ordered pool memory, which
///   legacy IPC rejects) in a [`GpuContext`]; [`handle`](Self::handle) exports it.
/// - [`ImportedBuffer::open`] maps it in another process, after validating the handle and
///   taking a lease (see there).
/// - Dropping an exported buffer never waits: new opens of its handle are refused from then
///   on, and the memory is freed as soon as no importer maps it — at once, or later (see
///   [below](#dropping-an-exported-buffer)). [`close`](Self::close) waits for importers, up
///   to a timeout, and reports what is left.
///
/// Use it from any CUDA crate: [`as_raw_ptr`](GpuSlice::as_raw_ptr) for kernel arguments (or
/// `device_ptr` with the `cust` feature, `.arg(&buf)` in cudarc's launch builder with the
/// `cudarc` feature), host copies (synchronous, or asynchronous on any [`AsStream`](crate::AsStream)), memset.
///
/// `IpcBuffer<T>` is `Send` and `Sync` (so is `ImportedBuffer<T>`). Device memory is not Rust memory: methods take `&self`,
/// and concurrent writes from several processes are a GPU data race for the caller to order
/// (with [`IpcEvent`](crate::IpcEvent)s and barriers), not undefined behaviour in this process.
///
/// # Asynchronous work
///
/// The synchronous methods ([`copy_from_host`](GpuSlice::copy_from_host),
/// [`copy_to_host`](GpuSlice::copy_to_host), [`memset_bytes`](GpuSlice::memset_bytes)) are done with
/// the memory when they return. The `*_async` methods, like kernels launched on
/// [`as_raw_ptr`](GpuSlice::as_raw_ptr), only *enqueue* work that touches the memory later; the
/// buffer does not track that work, and dropping the last view of an import unmaps the memory
/// (`cuIpcCloseMemHandle`) and dropping an export frees it (`cuMemFree`) without waiting for
/// it. That is why they are `unsafe`: the caller keeps the buffer alive until the work has
/// completed (synchronise the stream, or an event recorded after the work, before dropping).
/// The same holds for [`IpcSignal::signal`](crate::GpuSignal::signal) and
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
    core: BufferCore<T>,
    /// Set by [`read_only_for_importers`](IpcBuffer::read_only_for_importers): every handle
    /// says so, and importers must open it read-only.
    read_only: bool,
}

impl<T: Pod> std::ops::Deref for IpcBuffer<T> {
    type Target = GpuSlice<T>;

    /// The buffer's memory: length, address, copies and memsets.
    fn deref(&self) -> &GpuSlice<T> {
        &self.core.slice
    }
}

impl<T: Pod> IpcBuffer<T> {
    /// The most processes that can import from one exporting process at a time, across all its
    /// exported buffers and signals (a further process's open is [`Error::TooManyImporters`]);
    /// an arena or a pool has the same bound for its own importers.
    pub const MAX_IMPORTERS: usize = crate::ledger::lease::MAX_IMPORTERS;

    /// The most buffers and signals one process can have exported at a time (live, or dropped
    /// while importers still map them); a further first export is [`Error::TooManyBuffers`].
    pub const MAX_EXPORTS: usize = crate::ledger::registry::MAX_EXPORTS;

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
        BufferCore::new_with(ctx, len, handle_type).map(|core| Self {
            core,
            read_only: false,
        })
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
        BufferCore::zeroed_with(ctx, len, handle_type).map(|core| Self {
            core,
            read_only: false,
        })
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
    /// shared [read-only](Self::read_only_for_importers).
    #[doc(alias = "cuIpcGetMemHandle")]
    pub fn handle(&self) -> Result<IpcMemHandle<T>> {
        self.check_read_only_shareable()?;
        Ok(self.core.handle()?.marked_read_only_if(self.read_only))
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
        if self.read_only && self.core.handle_type() == HandleType::Legacy {
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
    /// `cuMemExportToShareableHandle`.
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
        let (handle, fd) = self.core.export_fd()?;
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
    /// `cuMemPoolExportPointer`.
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
        let (pool, fd, buffer) = self.core.export_pooled()?;
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
        self.core.grant_access(ctx)
    }

    /// How this buffer's memory is shared: [`HandleType::Legacy`] or [`HandleType::PosixFd`]
    /// (an `Auto` request resolved).
    pub fn handle_type(&self) -> HandleType {
        self.core.handle_type()
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
    /// [`Error::Cuda`] naming `cuIpcGetMemHandle`.
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
        self.check_read_only_shareable()?;
        self.core.raw_export()
    }

    /// For an exported buffer: the pids of the live processes that import it now (dead ones
    /// are left out).
    pub fn importers(&self) -> Vec<u32> {
        self.core.importers()
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
    /// `timeout`; [`Error::Cuda`] naming `cuMemFree`.
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
        let Self {
            mut core,
            read_only,
        } = self;
        match core.close_in_place(timeout) {
            Ok(()) => Ok(()),
            Err(error) => Err(CloseError::new(error, Self { core, read_only })),
        }
    }
}

/// Another process's [`IpcBuffer`] (or memory a foreign peer exported), mapped into this
/// process: [`open`](Self::open) (legacy handles), [`open_fd`](Self::open_fd) (POSIX-fd
/// buffers, with the descriptor their exporter sent), [`open_raw`](Self::open_raw) (PyTorch,
/// CuPy, C/C++ peers). It reads and writes the memory as the exporter's buffer does (both
/// dereference to [`GpuSlice<T>`]), and cannot be exported again (CUDA cannot re-export a
/// mapping).
///
/// Opening checks the envelope before the driver sees it (type, length, checksum, exporter
/// alive and not this process, device reachable, buffer not freed) and takes a lease, which
/// keeps the exporter from freeing the memory while it is mapped here; legacy handles map with
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`. Opening the same export again in the same context
/// returns another view of the same mapping without a driver call; the driver's close runs
/// once, when the last view drops, and then the lease is released.
///
/// `ImportedBuffer<T>` is `Send` and `Sync`; what holds for asynchronous work on an
/// [`IpcBuffer`] holds here (see [asynchronous work](IpcBuffer#asynchronous-work)): dropping
/// the last view unmaps the memory without waiting for queued GPU work on it.
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::{GpuContext, ImportedBuffer, IpcMemHandle};
/// use cuda_ipc::shm::ShmCell;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// # let cell: &ShmCell<IpcMemHandle<f32>> = unimplemented!();
/// let ctx = GpuContext::new(0)?;
/// let handle: IpcMemHandle<f32> = cell.load(); // published by the exporter
/// let peer = ImportedBuffer::open(&ctx, &handle)?;
/// let mut host = vec![0f32; peer.len()];
/// peer.copy_to_host(&mut host)?;
/// println!("{} values from process {:?}", host.len(), peer.exporter().map(|e| e.pid()));
/// # Ok(()) }
/// ```
///
/// An import has no way to export the memory again (this does not compile):
///
/// ```compile_fail,E0599
/// use cuda_ipc::{GpuContext, ImportedBuffer, IpcMemHandle};
///
/// fn reexport(ctx: &GpuContext, handle: &IpcMemHandle<f32>) -> cuda_ipc::Result<()> {
///     let peer = ImportedBuffer::open(ctx, handle)?;
///     let again: IpcMemHandle<f32> = peer.handle()?; // error: no method named `handle`
///     Ok(())
/// }
/// ```
pub struct ImportedBuffer<T: Pod> {
    core: BufferCore<T>,
}

impl<T: Pod> std::ops::Deref for ImportedBuffer<T> {
    type Target = GpuSlice<T>;

    /// The mapped memory: length, address, copies and memsets.
    fn deref(&self) -> &GpuSlice<T> {
        &self.core.slice
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
        BufferCore::open(ctx, handle).map(|core| Self { core })
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
        BufferCore::open_fd(ctx, handle, fd).map(|core| Self { core })
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
        BufferCore::open_pooled(ctx, pool, fd, buffer).map(|core| Self { core })
    }

    /// [`open`](Self::open), requiring exactly `len` elements.
    ///
    /// # Errors
    ///
    /// [`Error::LengthMismatch`], or as [`open`](Self::open).
    pub fn open_exact(ctx: &GpuContext, handle: &IpcMemHandle<T>, len: usize) -> Result<Self> {
        BufferCore::open_exact(ctx, handle, len).map(|core| Self { core })
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
        unsafe { BufferCore::open_raw(ctx, import) }.map(|core| Self { core })
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
        self.core.grant_access(ctx)
    }

    /// How the memory is shared: [`HandleType::Legacy`] (including raw handles) or
    /// [`HandleType::PosixFd`].
    pub fn handle_type(&self) -> HandleType {
        self.core.handle_type()
    }

    /// The exporting process; `None` for a raw handle whose exporter was not named
    /// ([`RawImport::exporter_pid`]).
    pub fn exporter(&self) -> Option<ProcessIdentity> {
        self.core.exporter()
    }
}

/// The memory of an [`IpcBuffer`] or an [`ImportedBuffer`] (and of a signal's counter and a
/// channel's ring, which serve both roles): what it is and how it goes away.
pub(crate) struct BufferCore<T: Pod> {
    pub(crate) slice: GpuSlice<T>,
    origin: Origin,
}

/// The error of a request for one handle (or one descriptor, or a raw handle) of a
/// [`HandleType::Pool`] buffer.
fn pooled() -> Error {
    Error::HandleTypeMismatch {
        handle: HandleType::Pool,
        conflict: TypeConflict::Pooled,
    }
}

/// The bytes of an allocation of `len` `T`s, for `call` (which allocates): more than 0 and at
/// most `isize::MAX`, else [`ArgumentDefect::AllocationSize`].
pub(crate) fn allocation_bytes<T>(call: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b > 0 && b <= isize::MAX as usize)
        .ok_or(Error::InvalidArgument {
            call,
            defect: ArgumentDefect::AllocationSize {
                len: len as u64,
                elem_size: std::mem::size_of::<T>() as u64,
            },
        })
}

impl<T: Pod> BufferCore<T> {
    /// The work of [`IpcBuffer::new`].
    pub(crate) fn new(ctx: &GpuContext, len: usize) -> Result<Self> {
        Self::new_with(ctx, len, HandleType::Legacy)
    }

    /// The work of [`IpcBuffer::new_with`].
    pub(crate) fn new_with(ctx: &GpuContext, len: usize, handle_type: HandleType) -> Result<Self> {
        let bytes = allocation_bytes::<T>("IpcBuffer::new", len)?;
        deferred::collect_if_pending();
        let vmm = match handle_type {
            HandleType::Pool => {
                let alloc = crate::pool::alloc_shared(ctx, bytes)?;
                return Ok(Self {
                    slice: GpuSlice::new(ctx.clone(), alloc.ptr(), len),
                    origin: Origin::Pooled(alloc),
                });
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
        let uuid = ctx.uuid();
        let (ptr, vmm) = if vmm {
            let memory = VmmMemory::create(ctx, bytes)?;
            (memory.ptr(), Some(memory))
        } else {
            let _g = ctx.enter()?;
            (driver::mem::alloc(bytes)?, None)
        };
        Ok(Self {
            slice: GpuSlice::new(ctx.clone(), ptr, len),
            origin: Origin::Exported(Export {
                uuid,
                record: parking_lot::Mutex::new(None),
                released: false,
                vmm,
            }),
        })
    }

    /// The work of [`IpcBuffer::zeroed_with`].
    pub(crate) fn zeroed_with(
        ctx: &GpuContext,
        len: usize,
        handle_type: HandleType,
    ) -> Result<Self> {
        let buf = Self::new_with(ctx, len, handle_type)?;
        buf.fill_fresh(0)?;
        Ok(buf)
    }

    /// Set every byte of a buffer nothing else uses yet, on a private non-blocking stream, and
    /// wait until it is done.
    fn fill_fresh(&self, value: u8) -> Result<()> {
        let bytes = match &self.origin {
            Origin::Exported(Export { vmm: Some(m), .. }) => m.size(),
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

    /// The work of [`IpcBuffer::handle`].
    pub(crate) fn handle(&self) -> Result<IpcMemHandle<T>> {
        self.export_handle("IpcBuffer::handle")
    }

    /// The work of [`IpcBuffer::export_fd`].
    pub(crate) fn export_fd(&self) -> Result<(IpcMemHandle<T>, OwnedFd)> {
        let call = "IpcBuffer::export_fd";
        let memory = match &self.origin {
            Origin::Exported(Export { vmm: Some(m), .. }) => m,
            Origin::Exported(_) => {
                return Err(Error::HandleTypeMismatch {
                    handle: HandleType::Legacy,
                    conflict: TypeConflict::Needs(HandleType::PosixFd),
                });
            }
            Origin::Pooled(_) => return Err(pooled()),
            Origin::Imported(_) | Origin::PoolImported(_) => {
                return Err(Error::InvalidState {
                    call,
                    state: ObjectState::Imported,
                });
            }
        };
        let handle = self.export_handle(call)?;
        let fd = memory.export_fd()?;
        Ok((handle, fd))
    }

    /// The work of [`IpcBuffer::grant_access`] and [`ImportedBuffer::grant_access`].
    pub(crate) fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        match &self.origin {
            Origin::Pooled(alloc) => alloc.grant(ctx),
            Origin::PoolImported(hold) => hold.grant(ctx),
            Origin::Exported(Export {
                vmm: Some(memory), ..
            }) => memory.grant(ctx),
            Origin::Exported(_) => {
                device::check_peer(ctx.ordinal(), self.slice.ctx.ordinal())?;
                ctx.enable_peer_access(&self.slice.ctx)
            }
            Origin::Imported(mapping) => match &mapping.vmm {
                Some(memory) => memory.grant(ctx),
                None if ctx.as_raw() == self.slice.ctx.as_raw() => Ok(()),
                None => Err(Error::HandleTypeMismatch {
                    handle: HandleType::Legacy,
                    conflict: TypeConflict::ImportMappedPerContext,
                }),
            },
        }
    }

    /// The work of [`IpcBuffer::handle_type`].
    pub(crate) fn handle_type(&self) -> HandleType {
        let vmm = match &self.origin {
            Origin::Exported(e) => e.vmm.is_some(),
            Origin::Imported(m) => m.vmm.is_some(),
            Origin::Pooled(_) | Origin::PoolImported(_) => return HandleType::Pool,
        };
        if vmm {
            HandleType::PosixFd
        } else {
            HandleType::Legacy
        }
    }

    /// The handle of kind `K` (whose elements are `T`s: a buffer's, a signal's counter) that
    /// exports this buffer (`call` names the public method in errors).
    pub(crate) fn export_handle<K: HandleKind>(&self, call: &'static str) -> Result<Handle<K>> {
        deferred::collect_if_pending();
        let export = match &self.origin {
            Origin::Exported(export) => export,
            Origin::Pooled(_) => return Err(pooled()),
            Origin::Imported(_) | Origin::PoolImported(_) => {
                return Err(Error::InvalidState {
                    call,
                    state: ObjectState::Imported,
                });
            }
        };
        // The block is published before any handle exists: every importer finds it.
        let (token, generation) = export.published()?;
        let (cuda, handle_type) = match &export.vmm {
            Some(memory) => {
                let mut cuda = [0u8; 64];
                cuda[..8].copy_from_slice(&(memory.size() as u64).to_le_bytes());
                (cuda, HandleType::PosixFd)
            }
            None => (self.legacy_ipc_handle()?.0, HandleType::Legacy),
        };
        let env = Envelope {
            elem_size: std::mem::size_of::<T>() as u32,
            elem_align: std::mem::align_of::<T>() as u32,
            type_tag: type_tag_of::<T>(),
            len: self.slice.len as u64,
            device_uuid: export.uuid,
            token,
            handle_type: handle_type.code(),
            ..Envelope::exported(K::CODE, generation, self.slice.ctx.ordinal(), cuda)
        };
        Ok(Handle::from_envelope(env.seal()))
    }

    /// The driver's legacy handle of this exported `cuMemAlloc` buffer (`cuIpcGetMemHandle`),
    /// remembered as this process's own (so that opening it here is refused before CUDA).
    fn legacy_ipc_handle(&self) -> Result<RawMemHandle> {
        let raw = {
            let _g = self.slice.ctx.enter()?;
            // SAFETY: a pointer this buffer allocated with cuMemAlloc in this context, live
            // while `self` is (the callers refuse imported and POSIX-fd buffers first).
            unsafe { driver::ipc::get_mem_handle(self.slice.ptr) }?
        };
        let handle = RawMemHandle(raw);
        crate::raw::remember_own(handle);
        Ok(handle)
    }

    /// The work of [`IpcBuffer::export_pooled`].
    pub(crate) fn export_pooled(&self) -> Result<(IpcPoolHandle, OwnedFd, PoolHandle<T>)> {
        match &self.origin {
            Origin::Pooled(alloc) => {
                let (pool, fd) = alloc.pool().export_fd()?;
                Ok((pool, fd, alloc.handle(self.slice.len)?))
            }
            Origin::Exported(_) => Err(Error::HandleTypeMismatch {
                handle: self.handle_type(),
                conflict: TypeConflict::Needs(HandleType::Pool),
            }),
            Origin::Imported(_) | Origin::PoolImported(_) => Err(Error::InvalidState {
                call: "IpcBuffer::export_pooled",
                state: ObjectState::Imported,
            }),
        }
    }

    /// The work of [`ImportedBuffer::open_pooled`].
    pub(crate) fn open_pooled(
        ctx: &GpuContext,
        pool: &IpcPoolHandle,
        fd: OwnedFd,
        buffer: &PoolHandle<T>,
    ) -> Result<Self> {
        let (slice, hold) = crate::pool::ImportedPool::open_fd(ctx, pool, fd)?
            .open(buffer)?
            .into_parts();
        Ok(Self {
            slice,
            origin: Origin::PoolImported(hold),
        })
    }

    /// The work of [`ImportedBuffer::open`].
    pub(crate) fn open(ctx: &GpuContext, handle: &IpcMemHandle<T>) -> Result<Self> {
        Self::open_handle(ctx, handle, None)
    }

    /// The work of [`ImportedBuffer::open_fd`].
    pub(crate) fn open_fd(ctx: &GpuContext, handle: &IpcMemHandle<T>, fd: OwnedFd) -> Result<Self> {
        Self::open_handle(ctx, handle, Some(fd))
    }

    /// The work of [`ReadOnlyBuffer::open_fd`](crate::ReadOnlyBuffer::open_fd): a mapping the
    /// GPU lets this process read only.
    pub(crate) fn open_fd_read_only(
        ctx: &GpuContext,
        handle: &IpcMemHandle<T>,
        fd: OwnedFd,
    ) -> Result<Self> {
        Self::open_handle_with(ctx, handle, Some(fd), Access::ReadOnly)
    }

    /// Validate → lease → map, for a handle of `T`s (a buffer's, a signal's counter, a
    /// channel's slots) of either handle type: `fd` is the descriptor that came with a POSIX-fd
    /// handle (and must be absent for a legacy one).
    pub(crate) fn open_handle<K: HandleKind>(
        ctx: &GpuContext,
        handle: &Handle<K>,
        fd: Option<OwnedFd>,
    ) -> Result<Self> {
        Self::open_handle_with(ctx, handle, fd, Access::ReadWrite)
    }

    /// [`open_handle`](Self::open_handle), mapping with `access`. Read-only needs a POSIX-fd
    /// handle: `cuIpcOpenMemHandle` has no read-only mapping.
    fn open_handle_with<K: HandleKind>(
        ctx: &GpuContext,
        handle: &Handle<K>,
        fd: Option<OwnedFd>,
        access: Access,
    ) -> Result<Self> {
        if access == Access::ReadOnly && fd.is_none() {
            return Err(Error::HandleTypeMismatch {
                handle: HandleType::Legacy,
                conflict: TypeConflict::NoReadOnlyMapping,
            });
        }
        // `admit` checks the element type `K` names, which is `T` for every caller (a buffer's
        // `T`, a signal's `u64`): what makes the view sound.
        let exporter = handle.admit(fd.is_some())?;
        let env = &handle.env;
        debug_assert!(check_element::<T>(env.elem_size, env.elem_align, env.type_tag).is_ok());
        let kind = K::CODE;
        let len = usize::try_from(env.len).map_err(|_| {
            Error::corrupt_handle(HandleDefect::Layout {
                detail: format!("length {} does not fit this platform", env.len),
            })
        })?;
        let described = Described::Envelope(env.elem_size, env.elem_align, env.type_tag, env.len);
        // The token names the exporter's ledger and block, the generation which export of
        // that block: together, one export for ever.
        let mut token = [0u8; 64];
        token[..16].copy_from_slice(&env.token);
        token[16..24].copy_from_slice(&env.generation.to_le_bytes());
        let key: Key = (token, ctx.as_raw() as usize, kind, access);

        // A hit is held to everything a first open checks that can have changed or been
        // forged since: the export is not closing, its exporter lives, and the envelope
        // describes the mapping as the first one did.
        let reuse = |mapping: &Arc<Mapping>| mapping.check_reuse(described).map(|()| true);
        let mapping = CACHE.get_or_create(&key, reuse, || {
            let memory_device = handle.admit_live(ctx, &exporter, fd.is_some())?;
            let hold = registry::enter(&env.token, env.generation, exporter)?;
            // On an error below the hold drops after the memory was unmapped again.
            let (ptr, mapped, vmm) = match fd {
                Some(fd) => {
                    let bytes = usize::try_from(env.vmm_bytes()).unwrap_or(usize::MAX);
                    let memory = VmmMemory::import(ctx, fd, bytes, memory_device, access)?;
                    (memory.ptr(), memory.size(), Some(memory))
                }
                None => {
                    let wanted = len.saturating_mul(std::mem::size_of::<T>());
                    let (ptr, mapped) = open_legacy(ctx, env.cuda, wanted)?;
                    (ptr, mapped, None)
                }
            };
            let mapping = Arc::new(Mapping {
                ctx: ctx.clone(),
                ptr,
                mapped,
                described,
                key,
                exporter: Some(exporter),
                exporter_seen_alive: AtomicU64::new(0),
                vmm,
                hold: Some(hold),
            });
            Ok(mapping)
        })?;
        Ok(Self::view(mapping, len))
    }

    /// The work of [`ImportedBuffer::open_exact`].
    pub(crate) fn open_exact(
        ctx: &GpuContext,
        handle: &IpcMemHandle<T>,
        len: usize,
    ) -> Result<Self> {
        if handle.env.len != len as u64 {
            handle.check_structure()?;
            return Err(Error::LengthMismatch {
                expected: len,
                found: handle.env.len,
            });
        }
        Self::open(ctx, handle)
    }

    fn view(mapping: Arc<Mapping>, len: usize) -> Self {
        Self::view_at(mapping, 0, len)
    }

    /// A view of `len` elements at byte `offset` of the mapping (the caller checked the range).
    fn view_at(mapping: Arc<Mapping>, offset: u64, len: usize) -> Self {
        Self {
            slice: GpuSlice::new(mapping.ctx.clone(), mapping.ptr + offset, len),
            origin: Origin::Imported(mapping),
        }
    }

    /// The work of [`IpcBuffer::raw_export`].
    pub(crate) fn raw_export(&self) -> Result<RawExport> {
        let export = match &self.origin {
            Origin::Exported(export) => export,
            Origin::Pooled(_) => {
                return Err(Error::HandleTypeMismatch {
                    handle: HandleType::Pool,
                    conflict: TypeConflict::Needs(HandleType::Legacy),
                });
            }
            Origin::Imported(_) | Origin::PoolImported(_) => {
                return Err(Error::InvalidState {
                    call: "IpcBuffer::raw_export",
                    state: ObjectState::Imported,
                });
            }
        };
        if export.vmm.is_some() {
            return Err(Error::HandleTypeMismatch {
                handle: HandleType::PosixFd,
                conflict: TypeConflict::Needs(HandleType::Legacy),
            });
        }
        Ok(RawExport {
            handle: self.legacy_ipc_handle()?,
            offset: 0,
            bytes: self.byte_len() as u64,
            device_uuid: export.uuid,
            device_ordinal: self.slice.ctx.ordinal(),
            exporter_pid: std::process::id(),
        })
    }

    /// The work of [`ImportedBuffer::open_raw`].
    pub(crate) unsafe fn open_raw(ctx: &GpuContext, import: &RawImport) -> Result<Self> {
        let call = "ImportedBuffer::open_raw";
        let invalid = |defect| Error::InvalidArgument { call, defect };
        let size = std::mem::size_of::<T>() as u64;
        let bytes = (import.len as u64)
            .checked_mul(size)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                invalid(ArgumentDefect::AllocationSize {
                    len: import.len as u64,
                    elem_size: size,
                })
            })?;
        let align = std::mem::align_of::<T>() as u64;
        if !import.offset.is_multiple_of(align) {
            return Err(invalid(ArgumentDefect::Misaligned {
                offset: import.offset,
                align,
            }));
        }
        let end = import.offset.checked_add(bytes).ok_or_else(|| {
            invalid(ArgumentDefect::RangeOverflow {
                offset: import.offset,
                bytes,
            })
        })?;
        if crate::raw::is_own(&import.handle) {
            return Err(Error::SameProcess {
                pid: std::process::id(),
            });
        }
        let in_range = |mapped: usize| {
            if end <= mapped as u64 {
                Ok(())
            } else {
                Err(Error::corrupt_handle(HandleDefect::Memory {
                    detail: format!(
                        "bytes {}..{end} reach past the allocation the handle maps, {mapped} \
                         bytes (cuPointerGetAttributes)",
                        import.offset
                    ),
                }))
            }
        };
        let key: Key = (
            import.handle.0,
            ctx.as_raw() as usize,
            KIND_RAW,
            Access::ReadWrite,
        );
        let reuse = |mapping: &Arc<Mapping>| {
            mapping.check_reuse(Described::Raw)?;
            in_range(mapping.mapped)?;
            Ok(true)
        };
        let mapping = CACHE.get_or_create(&key, reuse, || {
            // A named exporter: alive now? By pid alone (a pidfd, kept open for later checks):
            // a raw handle names no start time to tell a reused pid from the exporter.
            let exporter = match import.exporter_pid {
                None => None,
                Some(pid) => {
                    let id = ProcessIdentity::from_parts(pid, 0);
                    if !crate::process::is_alive_cached(&id) {
                        return Err(Error::exporter_gone(pid));
                    }
                    Some(id)
                }
            };
            let _g = ctx.enter()?;
            let ptr = driver::ipc::open_mem_handle(import.handle.0)?;
            let checked = mapped_bytes(ptr).and_then(|mapped| {
                in_range(mapped)?;
                check_memory_device(ctx, ptr)?;
                Ok(mapped)
            });
            let mapped = match checked {
                Ok(m) => m,
                Err(e) => {
                    // SAFETY: opened just above in this context, closed once, never handed out.
                    let _ = unsafe { driver::ipc::close_mem_handle(ptr) };
                    return Err(e);
                }
            };
            let mapping = Arc::new(Mapping {
                ctx: ctx.clone(),
                ptr,
                mapped,
                described: Described::Raw,
                key,
                exporter,
                exporter_seen_alive: AtomicU64::new(0),
                vmm: None,
                hold: None,
            });
            Ok(mapping)
        })?;
        Ok(Self::view_at(mapping, import.offset, import.len))
    }

    /// Whether this buffer maps another process's export.
    pub(crate) fn is_imported(&self) -> bool {
        matches!(self.origin, Origin::Imported(_) | Origin::PoolImported(_))
    }

    /// The work of [`ImportedBuffer::exporter`].
    pub(crate) fn exporter(&self) -> Option<ProcessIdentity> {
        match &self.origin {
            Origin::Imported(m) => m.exporter,
            Origin::PoolImported(hold) => Some(hold.exporter()),
            Origin::Exported(_) | Origin::Pooled(_) => None,
        }
    }

    /// The work of [`IpcBuffer::importers`].
    pub(crate) fn importers(&self) -> Vec<u32> {
        match &self.origin {
            Origin::Exported(e) => e
                .record
                .lock()
                .as_ref()
                .map_or_else(Vec::new, Record::importers),
            Origin::Pooled(alloc) => alloc.importers(),
            Origin::Imported(_) | Origin::PoolImported(_) => Vec::new(),
        }
    }

    /// A process other than this one that holds this export (has it mapped) but has died
    /// without letting go; nothing is reaped.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        match &self.origin {
            Origin::Exported(e) => e.record.lock().as_ref()?.dead_importer(),
            Origin::Imported(m) => m.hold.as_ref()?.dead_importer(),
            Origin::Pooled(_) | Origin::PoolImported(_) => None,
        }
    }

    /// Wait for importers up to `timeout` and free (or unmap); on an error the buffer drops
    /// (its free deferred) and the error is returned.
    pub(crate) fn close(mut self, timeout: Duration) -> Result<()> {
        self.close_in_place(timeout)
    }

    /// [`close`](Self::close), keeping the buffer (retired, or released) for a caller that
    /// hands it back on an error.
    pub(crate) fn close_in_place(&mut self, timeout: Duration) -> Result<()> {
        self.wait_for_importers(timeout)
            .and_then(|()| self.release())
    }

    /// For a `cuMemAlloc` export: retire it (new opens are stale) and wait up to `timeout`
    /// until no importer maps it (then it may be freed), reaping importers proven dead. Other
    /// buffers have nothing to wait for.
    pub(crate) fn wait_for_importers(&self, timeout: Duration) -> Result<()> {
        let export = match &self.origin {
            Origin::Exported(export) => export,
            Origin::Pooled(alloc) => return alloc.wait_unheld(timeout),
            Origin::Imported(_) | Origin::PoolImported(_) => return Ok(()),
        };
        if export.released || export.vmm.is_some() {
            return Ok(());
        }
        let mut record = export.record.lock();
        let Some(record) = record.as_mut() else {
            return Ok(()); // never exported with a handle: nobody can map it
        };
        if !record.retire() {
            return Ok(());
        }
        let mut wait = Backoff::new(
            timeout,
            Duration::from_micros(100),
            Duration::from_millis(20),
        );
        loop {
            registry::collect();
            if !record.is_held() {
                return Ok(());
            }
            if let Err(waited) = wait.pause() {
                return Err(Error::LeasesOutstanding {
                    pids: record.importers(),
                    waited,
                });
            }
        }
    }

    /// Give the memory back without waiting: an export is freed now, or deferred while
    /// importers map it; an import is unmapped when its last view drops (in `Drop`).
    pub(crate) fn release(&mut self) -> Result<()> {
        let export = match &mut self.origin {
            Origin::Exported(export) => export,
            Origin::Pooled(alloc) => return alloc.free(None),
            Origin::Imported(_) | Origin::PoolImported(_) => return Ok(()),
        };
        if export.released {
            return Ok(());
        }
        export.released = true;
        let record = export.record.lock().take();
        if let Some(memory) = export.vmm.take() {
            // Dropping the record retires the export: new opens fail from here on
            // (StaleHandle); existing importers keep their mappings, which hold the memory:
            // the driver frees it when the last one unmaps.
            drop(record);
            drop(memory);
            return Ok(());
        }
        let bytes = self.slice.len * std::mem::size_of::<T>();
        deferred::free_or_defer(&self.slice.ctx, self.slice.ptr, bytes, record)
    }
}

impl Export {
    /// The token and generation of the export's block, published now if this is the first
    /// export.
    fn published(&self) -> Result<([u8; 16], u64)> {
        let mut record = self.record.lock();
        let record = match &mut *record {
            Some(r) => r,
            None => record.insert(Record::publish()?),
        };
        Ok((record.token(), record.generation()))
    }
}

impl Mapping {
    /// The checks a cache hit must pass: the export is not closing (its exporter is waiting
    /// for importers to go: no new views), the exporter is alive, and the envelope describes
    /// what the first open of this export described (and so fits the mapping).
    fn check_reuse(&self, described: Described) -> Result<()> {
        if let Some(hold) = &self.hold
            && !hold.is_live()
        {
            return Err(Error::StaleHandle {
                generation: hold.generation(),
            });
        }
        // The exporter's liveness, polled at most once per LIVENESS_REUSE_NS per mapping: a
        // tight loop of re-opens pays a clock read, not a syscall, per hit. A death is then
        // reported by the first hit that starts LIVENESS_REUSE_NS after it. A view handed out
        // inside that window is in the position of one opened just before the death, which
        // no check can prevent (the exporter may die right after any check): this check
        // turns a known death into a clear error, it does not keep the memory alive.
        let now = liveness_clock();
        let seen = self.exporter_seen_alive.load(Ordering::Relaxed);
        if let Some(exporter) = &self.exporter
            && now.saturating_sub(seen) >= LIVENESS_REUSE_NS
        {
            if !crate::process::is_alive_cached(exporter) {
                return Err(Error::exporter_gone(exporter.pid()));
            }
            self.exporter_seen_alive.store(now, Ordering::Relaxed);
        }
        if described != self.described {
            let (
                Described::Envelope(size, _, _, len),
                Described::Envelope(first_size, _, _, first_len),
            ) = (described, self.described)
            else {
                return Err(Error::corrupt_handle(HandleDefect::Memory {
                    detail: "a raw handle and an envelope name the same mapping".into(),
                }));
            };
            return Err(Error::corrupt_handle(HandleDefect::Memory {
                detail: format!(
                    "the handle describes {len} elements of {size} bytes, but this process \
                     already maps the same export as {first_len} elements of {first_size} \
                     bytes ({} bytes mapped)",
                    self.mapped
                ),
            }));
        }
        Ok(())
    }
}

/// How long a cache hit trusts the last "exporter alive" answer for its mapping (100 µs).
const LIVENESS_REUSE_NS: u64 = 100_000;

/// Monotonic nanoseconds since this process first asked (for [`Mapping::exporter_seen_alive`]).
fn liveness_clock() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Map a legacy handle's memory in `ctx` (`cuIpcOpenMemHandle`) and hold the envelope's
/// `wanted` bytes — the peer's word — to what the driver mapped; returns the address and the
/// bytes mapped from it. On an error nothing stays mapped.
fn open_legacy(ctx: &GpuContext, handle: [u8; 64], wanted: usize) -> Result<(u64, usize)> {
    let _g = ctx.enter()?;
    let ptr = driver::ipc::open_mem_handle(handle)?;
    let mapped = mapped_bytes(ptr).and_then(|mapped| {
        if wanted <= mapped {
            Ok(mapped)
        } else {
            Err(Error::corrupt_handle(HandleDefect::Memory {
                detail: format!(
                    "the handle describes {wanted} bytes, but the memory it maps is {mapped} \
                     bytes (cuPointerGetAttributes)"
                ),
            }))
        }
    });
    if mapped.is_err() {
        // SAFETY: opened just above in this context, closed once, never handed out.
        let _ = unsafe { driver::ipc::close_mem_handle(ptr) };
    }
    Ok((ptr, mapped?))
}

/// Bytes of the allocation mapped at `ptr` from `ptr` on (`cuPointerGetAttributes`), in the
/// current context.
pub(crate) fn mapped_bytes(ptr: sys::CUdeviceptr) -> Result<usize> {
    let (base, size) = driver::mem::address_range(ptr)?;
    let offset = usize::try_from(ptr.wrapping_sub(base)).unwrap_or(usize::MAX);
    if ptr < base || offset > size {
        return Err(Error::Corrupt {
            what: "IPC mapping",
            defect: StateDefect::DriverAnswer {
                call: "cuPointerGetAttributes",
                value: i64::try_from(base).unwrap_or(i64::MAX),
            },
        });
    }
    Ok(size - offset)
}

/// Refuse a mapping the driver could only fail (or hang) on: the memory's device must be
/// visible and, if it is not the context's own device, reachable by peer access.
/// The device holding the memory mapped at `ptr` (`cuPointerGetAttribute`) is `ctx`'s, or one
/// `ctx` can reach as a peer. `ctx` is current.
fn check_memory_device(ctx: &GpuContext, ptr: sys::CUdeviceptr) -> Result<()> {
    let ordinal = driver::mem::device_ordinal_of(ptr)?;
    let Ok(ordinal) = u32::try_from(ordinal) else {
        return Err(Error::Corrupt {
            what: "IPC mapping",
            defect: StateDefect::DriverAnswer {
                call: "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)",
                value: ordinal.into(),
            },
        });
    };
    device::check_peer(ctx.ordinal(), ordinal)
}

impl<T: Pod> std::ops::Deref for BufferCore<T> {
    type Target = GpuSlice<T>;

    fn deref(&self) -> &GpuSlice<T> {
        &self.slice
    }
}

impl<T: Pod> Drop for BufferCore<T> {
    fn drop(&mut self) {
        if !self.slice.ctx.is_home() {
            // Inherited by a forked child: the parent's (see `process::Home`). Its parts
            // (records, leases, mappings) refuse to act here too.
            return;
        }
        // Never waits: freed now, or deferred while importers map it; an import is unmapped
        // when its mapping's last view goes. A failed cuMemFree cannot be reported from drop;
        // `IpcBuffer::close` reports it.
        let _ = self.release();
    }
}

impl<T: Pod> std::fmt::Debug for IpcBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.core.slice.len)
            .field("device", &self.core.slice.ctx.ordinal())
            .field("handle_type", &self.handle_type())
            .finish_non_exhaustive()
    }
}

impl<T: Pod> std::fmt::Debug for ImportedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.core.slice.len)
            .field("device", &self.core.slice.ctx.ordinal())
            .field("handle_type", &self.handle_type())
            .field("exporter", &self.exporter().map(|e| e.pid()))
            .finish_non_exhaustive()
    }
}
