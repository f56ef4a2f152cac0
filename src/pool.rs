//! [`IpcPool`]: a stream-ordered memory pool (`cuMemPoolCreate`) shared with other processes as
//! a file descriptor, whose allocations (`cuMemAllocFromPoolAsync`) are shared one by one as
//! [`PoolHandle<T>`]s (`cuMemPoolExportPointer` data) and opened by processes that imported the
//! pool ([`ImportedPool`], `cuMemPoolImportPointer`).
//!
//! This is the memory that stream-ordered code allocates (`cuMemAllocAsync`; cudarc's default
//! on devices with pools), which legacy IPC handles refuse.
//!
//! The CUDA guide's rules for pool IPC, and how the types keep them, are documented on
//! [`IpcPool`]; the shared block-table protocol is the arena's (`src/ledger/table.rs`). The
//! guide to arenas and pools, and to sharing them read-only, is on the [`arena`](crate::arena)
//! page.
//!
//! # With cuda.core and other programs
//!
//! NVIDIA's `cuda.core` shares memory through the same driver objects: an IPC-enabled
//! `DeviceMemoryResource` is a pool exported as a POSIX file descriptor, and each `Buffer`
//! travels as an `IPCBufferDescriptor` (the `cuMemPoolExportPointer` data and the size).
//! [`ForeignPool`] imports such a pool (or one a C/C++ program exported with
//! `cuMemPoolExportToShareableHandle`) and opens its buffers from their
//! [`PoolBufferDescriptor`]s; the other way, an [`IpcPool`]'s descriptor
//! ([`IpcPool::export_fd`]) and a [`PoolBuffer::descriptor`] are what cuda.core's
//! `DeviceMemoryResource.from_allocation_handle` and `Buffer.from_ipc_descriptor` take.
//!
//! ### Who frees first
//!
//! The CUDA guide's rule for pool IPC is that every importer frees an allocation before its
//! exporter does. Between two processes of this crate the pool's block table keeps it (see
//! [`IpcPool`]); a foreign peer keeps no such table, so here the rule is the caller's:
//!
//! - **Importing** ([`ForeignPool::open`], `unsafe`): the exporter must keep each allocation
//!   until every view of it here is dropped. Dropping the last view frees the import
//!   (`cuMemFree`, complete when it returns); tell the exporter after that.
//! - **Exporting** ([`PoolBuffer::descriptor`]): keep the [`PoolBuffer`] until the peer says
//!   it closed its `Buffer`.
//!
//! What each side sees when the other is `SIGKILL`ed: the driver keeps an imported pool and
//! its imported allocations mapped in the survivor until the survivor frees them, so views stay
//! readable; a [`ForeignPool`] whose exporter was named refuses new opens with
//! [`Error::PeerGone`], and [`PoolView::is_live`] turns false. When the survivor drops its
//! views and the pool, the dead process's memory goes back to the device. A killed importer's
//! imports die with it; the exporter frees as usual.
//!
//! The device's free-memory count (`cuMemGetInfo`, `nvidia-smi`) is no guide to a shared pool:
//! measured (H100, driver 580), once another process has imported a pool, the count does not
//! rise when the owner frees its buffers, trims the pool, or the importer destroys its import;
//! it rises when the owning process exits.
//!
//! What is refused, before any view exists: a descriptor that is not a pool exported as a file
//! descriptor ([`Error::Cuda`] naming `cuMemPoolImportFromShareableHandle`); export data that
//! is not an allocation of this pool (a forged or stale descriptor: [`Error::Cuda`] naming
//! `cuMemPoolImportPointer`); a size of zero, one that is not a whole number of `T`s, or one
//! past the allocation's own range ([`Error::CorruptHandle`]); memory on a device `ctx` cannot
//! reach ([`Error::DeviceNotReachable`]); an allocation this process holds already through
//! another import — an [`IpcPool`] buffer opened both through an [`ImportedPool`] (a crate
//! peer's handle) and a [`ForeignPool`] (its descriptor), in either order
//! ([`Error::HandleTypeMismatch`] with
//! [`TypeConflict::ImportedTwice`](crate::error::TypeConflict::ImportedTwice): the driver maps
//! an imported allocation once per process and counts no imports, so one free would unmap
//! both). A refused import is freed at once; the memory of the first stays mapped.
//!
//! ### Examples
//!
//! A cuda.core process shares a buffer; this one reads it. The exporter (Python):
//!
//! ```python
//! import os, socket
//! from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions
//!
//! dev = Device(0); dev.set_current(); stream = dev.create_stream()
//! mr = DeviceMemoryResource(dev, DeviceMemoryResourceOptions(ipc_enabled=True, max_size=1 << 26))
//! buf = mr.allocate(4096, stream=stream)
//! buf.fill(7, stream=stream); stream.sync()
//! _, (export_data, size) = buf.ipc_descriptor.__reduce__()
//! # FdSocket's wire: one SOCK_SEQPACKET record per message, a frame byte (1), the payload
//! sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
//! sock.connect("\0pool-from-cuda-core")
//! payload = b"\x01" + export_data + size.to_bytes(8, "little")
//! socket.send_fds(sock, [payload], [int(mr.allocation_handle)])
//! sock.recv(2)  # the importer is done: now buf may be closed
//! ```
//!
//! The importer (Rust):
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_ipc::GpuContext;
//! use cuda_ipc::fd::{FdListener, PeerPolicy, SocketName};
//! use cuda_ipc::pool::{ForeignPool, PoolBufferDescriptor};
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! let ctx = GpuContext::new(0)?;
//! let name = SocketName::Abstract("pool-from-cuda-core".into());
//! let listener = FdListener::bind(name, PeerPolicy::SameUid)?;
//! let peer = listener.accept(Duration::from_secs(30))?;
//! let mut message = peer.recv(Duration::from_secs(30))?;
//! let fd = message.fds.pop().expect("the pool's descriptor");
//! let pool = ForeignPool::open_fd(&ctx, fd, Some(peer.peer().pid))?;
//! let descriptor = PoolBufferDescriptor::from_bytes(&message.payload)?;
//! // SAFETY: the exporter keeps the buffer until we answer.
//! let view = unsafe { pool.open::<u8>(&descriptor)? };
//! let mut host = vec![0u8; view.len()];
//! view.copy_to_host(&mut host)?;
//! assert!(host.iter().all(|&b| b == 7));
//! drop(view);
//! peer.send(b"k", &[], Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! The other way, this crate's pool and a buffer go to a cuda.core process, which maps them
//! with its own calls:
//!
//! ```no_run
//! use std::os::fd::AsFd;
//! use std::time::Duration;
//! use cuda_ipc::{GpuContext, RawStream};
//! use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
//! use cuda_ipc::pool::IpcPool;
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! let ctx = GpuContext::new(0)?;
//! let pool = IpcPool::new(&ctx)?;
//! let buf = pool.alloc::<u32>(1024, &RawStream::LEGACY)?;
//! buf.memset_bytes(7)?;
//! let (_, fd) = pool.export_fd()?;
//! let name = SocketName::Abstract("pool-to-cuda-core".into());
//! let peer = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(30))?;
//! peer.send(&buf.descriptor()?.to_bytes(), &[fd.as_fd()], Duration::from_secs(30))?;
//! peer.recv(Duration::from_secs(30))?; // the peer closed its Buffer: `buf` may go now
//! # Ok(()) }
//! ```
//!
//! ```python
//! # The cuda.core process: a SOCK_SEQPACKET listener; accept, then
//! msg, fds, _, _ = socket.recv_fds(conn, 73, 1)  # a frame byte (1), then the descriptor
//! mr = DeviceMemoryResource.from_allocation_handle(dev, fds[0]); os.close(fds[0])
//! desc = IPCBufferDescriptor._init(msg[1:65], int.from_bytes(msg[65:], "little"))
//! buf = Buffer.from_ipc_descriptor(mr, desc, stream=stream)
//! # ... use buf ...; then buf.close(stream); stream.sync(); conn.send(b"\x01k")
//! ```
//!
//! The Python package does both with cuda.core's own objects (`cuda_ipc.ForeignPool`,
//! `cuda_ipc.Pool`; see its guide).

mod buffer;
mod foreign;
mod import;
mod imported;
mod read_only;
mod view;
pub(crate) use buffer::PoolAlloc;
pub use buffer::PoolBuffer;
pub(crate) use buffer::alloc_shared;
pub use foreign::{ForeignPool, PoolBufferDescriptor};
pub use imported::ImportedPool;
pub use read_only::{ReadOnlyPool, ReadOnlyPoolView};
pub(crate) use view::PoolHold;
pub use view::PoolView;

use import::PoolImport;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};
use std::time::Duration;

use bytemuck::{Pod, Zeroable};
use parking_lot::Mutex;

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::envelope;
use crate::error::{Capability, Error, HandleDefect, Result};
use crate::handle::{
    Admitted, BufferHandle, Envelope, Handle, HandleType, KIND_POOL, check_buffer_of, type_tag_of,
};
use crate::ledger::Holdings;
use crate::ledger::{Block, MAX_BLOCKS};
use crate::ledger::{DeferredFrees, Pending, register_pending};
use crate::ledger::{Dying, Entry, ImportCache};
use crate::ledger::{ExportKind, Label, Placed};
use crate::ledger::{Ledger, Reap};
use crate::os;
use crate::poll::Backoff;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;
use crate::stream::AsStream;

const MAX_POOL_BUFFERS: usize = MAX_BLOCKS;

/// An allocation the owner freed while importers held it: its block (quarantined in the
/// ledger) and its pointer, freed once the ledger has given the block back.
#[derive(Clone, Copy)]
struct Retired {
    placed: Placed,
    ptr: sys::CUdeviceptr,
}

struct Owner {
    ctx: GpuContext,
    pool: sys::CUmemoryPool,
    generation: u64,
    uuid: [u8; 16],
    /// Who holds which allocation: the block and lease tables, and books of block indexes
    /// (the driver places pool memory).
    ledger: Ledger,
    /// The allocations freed while held, until their blocks come back.
    retired: Mutex<Vec<Retired>>,
    /// Set by [`IpcPool::read_only_for_importers`]: every handle says so.
    read_only: AtomicBool,
}

// SAFETY: the pool handle is an opaque driver handle, usable from any thread once its context
// is current (every use pushes `ctx`); the rest is Send + Sync.
unsafe impl Send for Owner {}
// SAFETY: as above; shared use goes through the driver (thread-safe), the `retired` lock and
// the ledger's.
unsafe impl Sync for Owner {}

impl Owner {
    /// Free quarantined allocations whose importers are gone, reaping dead importers as `reap`
    /// says. Returns how many are still held.
    fn reclaim(&self, reap: Reap) -> usize {
        let mut retired = self.retired.lock();
        self.ledger.reclaim_with(reap);
        retired.retain(|r| {
            if self.ledger.is_quarantined(&r.placed) {
                return true;
            }
            if let Ok(_g) = self.ctx.enter() {
                // SAFETY: our allocation, retired; the ledger gave its block back, which it does
                // only once every importer has left it (each leaves after its cuMemFree, or was
                // reaped dead); freed once, here, as it leaves the list.
                let _ = unsafe { driver::mem::free(r.ptr) };
            }
            false
        });
        retired.len()
    }

    /// The bytes of the allocations still in quarantine, from our own records.
    fn quarantined_bytes(&self) -> usize {
        self.retired.lock().iter().fold(0usize, |sum, r| {
            sum.saturating_add(usize::try_from(r.placed.bytes).unwrap_or(usize::MAX))
        })
    }
}

/// The sealed envelope of pool `token` (on the device with `uuid`, ordinal `ordinal` here),
/// export generation `generation`: what travels with the pool's descriptor.
fn pool_envelope(token: [u8; 16], uuid: [u8; 16], generation: u64, ordinal: u32) -> Envelope {
    Envelope {
        elem_size: 1,
        elem_align: 1,
        type_tag: type_tag_of::<u8>(),
        len: 1,
        device_uuid: uuid,
        token,
        handle_type: HandleType::PosixFd.code(),
        ..Envelope::exported(KIND_POOL, generation, ordinal, [0; 64])
    }
    .seal()
}

/// Well-formed handles of a pool and of one of its buffers (`T`s) that name nothing, for host
/// tests of what parses them.
#[cfg(test)]
pub(crate) fn made_up_handles<T: Pod>() -> (IpcPoolHandle, PoolHandle<T>) {
    let token = [7; 16];
    (
        Handle::from_envelope(pool_envelope(token, [9; 16], 1, 0)),
        PoolHandle::sealed(token, 3, 1, 16, [0; 64]),
    )
}

impl Owner {
    /// The work of [`IpcPool::grant_access`].
    fn grant(&self, ctx: &GpuContext) -> Result<()> {
        if ctx.device() == self.ctx.device() {
            return Ok(());
        }
        crate::device::check_peer(ctx.ordinal(), self.ctx.ordinal())?;
        let _g = self.ctx.enter()?;
        // SAFETY: our pool, live while `self` is; adding a device's access leaves every other
        // device's as it was.
        unsafe { driver::pool::set_access(self.pool, &crate::vmm::read_write(ctx.device())) }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if !self.ledger.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // What live importers still hold stays allocated (leaked, not freed under them).
        self.reclaim(Reap::Always);
        self.ledger.begin_close();
        if let Ok(_g) = self.ctx.enter() {
            // SAFETY: created in this context, destroyed once; the driver defers the release
            // while allocations (the leaked ones) are outstanding.
            let _ = unsafe { driver::pool::destroy(self.pool) };
        }
    }
}

/// A stream-ordered memory pool whose allocations other processes can open.
///
/// Created with [`new`](Self::new), sent to each peer once with
/// [`FdSocket::send_pool`](crate::fd::FdSocket::send_pool) (or [`export_fd`](Self::export_fd)),
/// allocated from with [`alloc`](Self::alloc) on a stream; each [`PoolBuffer`]'s
/// [`handle`](PoolBuffer::handle) is 136 bytes of plain data that a peer opens with
/// [`ImportedPool::open`]. `IpcPool` is `Send` and `Sync`.
///
/// # The CUDA guide's rules, and how the types keep them
///
/// - *An importer must not access the memory before the allocation has completed in the
///   exporter*: [`PoolBuffer::handle`] waits for the allocation (an event recorded after it on
///   the allocating stream) before exporting, so no handle exists before that.
/// - *Every importer must free an allocation before its exporter frees it*: each open takes the
///   importer's bit in the pool's block table (the protocol of `src/ledger/table.rs`), and a
///   view's drop frees the import (`cuMemFree`, complete when it returns) before clearing the
///   bit. The owner's free ([`PoolBuffer`]'s drop, [`PoolBuffer::free_async`]) retires the
///   block first — new opens are [`Error::StaleHandle`] — and frees only once no bit is set;
///   until then the allocation is quarantined, and freed by the next [`IpcPool::alloc`] or
///   [`IpcPool::collect`] after the importers let go (`collect`, and an `alloc` that finds every
///   block slot taken, also reap importers proven dead: their imports died with them).
/// - *A pool is destroyed only when no allocation is outstanding*: the driver defers a
///   `cuMemPoolDestroy` until then; an owner dropped while importers still hold views leaks
///   those allocations rather than free them under the importers (as an exported
///   [`IpcBuffer`](crate::IpcBuffer) does).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext, RawStream};
/// use cuda_ipc::fd::{FdListener, PeerPolicy, SocketName};
/// use cuda_ipc::pool::IpcPool;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let pool = IpcPool::new(&ctx)?;
/// let listener = FdListener::bind(SocketName::Abstract("pool".into()), PeerPolicy::SameUid)?;
/// let peer = listener.accept(Duration::from_secs(5))?;
/// peer.send_pool(&pool, Duration::from_secs(5))?;
///
/// let stream = RawStream::LEGACY;
/// let buf = pool.alloc::<f32>(1 << 20, &stream)?; // cuMemAllocFromPoolAsync
/// peer.send(buf.handle()?.as_bytes(), &[], Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
pub struct IpcPool {
    owner: Arc<Owner>,
}

impl IpcPool {
    /// The most buffers one pool tracks at a time (live, or freed while importers hold them):
    /// the size of its shared block table.
    pub const MAX_BUFFERS: usize = MAX_POOL_BUFFERS;

    /// Create a pool on `ctx`'s device whose memory can be exported as POSIX file descriptors
    /// (`cuMemPoolCreate`), tracking up to [`MAX_BUFFERS`](Self::MAX_BUFFERS) buffers.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the device has no pools that export file descriptors;
    /// [`Error::Cuda`] naming `cuMemPoolCreate`; a shared-memory error creating the tables.
    #[doc(alias = "cuMemPoolCreate")]
    pub fn new(ctx: &GpuContext) -> Result<Self> {
        let dev = ctx.device();
        let supported =
            crate::driver::device::attribute(dev, sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
        let types = crate::driver::device::attribute(
            dev,
            sys::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
        )?;
        if supported == 0 || (types as u32) & sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0 {
            return Err(Error::Unsupported {
                device: ctx.ordinal(),
                what: "hold an IpcPool (a stream-ordered pool exported as POSIX file descriptors)",
                missing: Capability::PoolPosixFd,
            });
        }
        let mut token = [0u8; 16];
        token[..8].copy_from_slice(&os::random_u64()?.to_le_bytes());
        token[8..].copy_from_slice(&os::random_u64()?.to_le_bytes());
        let uuid = ctx.uuid();
        let ledger = Ledger::create_indexed(&token, MAX_POOL_BUFFERS)?;
        let props = crate::vmm::pool_props(dev);
        let pool = {
            let _g = ctx.enter()?;
            driver::pool::create(&props)?
        };
        let pool = Self {
            owner: Arc::new(Owner {
                ctx: ctx.clone(),
                pool,
                generation: crate::envelope::GENERATION.fetch_add(1, StdOrdering::Relaxed),
                uuid,
                ledger,
                retired: Mutex::new(Vec::new()),
                read_only: AtomicBool::new(false),
            }),
        };
        // The driver exports pointers only of a pool that has been shared
        // (cuMemPoolExportPointer is CUDA_ERROR_INVALID_VALUE before the first
        // cuMemPoolExportToShareableHandle, measured on an H200): share it once now, so that
        // every buffer's handle works whether or not a peer has been sent the pool yet.
        drop(pool.export_fd()?);
        Ok(pool)
    }

    /// Allocate `len` elements of `T` from the pool, ordered on `stream`
    /// (`cuMemAllocFromPoolAsync`): the memory may be used by work enqueued on `stream` after
    /// this call (on other streams, after they wait for `stream`). Contents unspecified.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for zero elements or an overflowing size;
    /// [`Error::TooManyBuffers`] when [`MAX_BUFFERS`](Self::MAX_BUFFERS) are live or quarantined
    /// (after reclaiming); [`Error::Cuda`] naming `cuMemAllocFromPoolAsync`, `cuEventCreate` or
    /// `cuEventRecord`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, RawStream};
    /// use cuda_ipc::pool::IpcPool;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let pool = IpcPool::new(&ctx)?;
    /// let stream = RawStream::LEGACY; // or any AsStream: a cust or cudarc stream
    /// let buf = pool.alloc::<u32>(1 << 20, &stream)?;
    /// // ... enqueue work on `stream` that fills `buf` ...
    /// let handle = buf.handle()?; // waits for the allocation, not for the work
    /// # let _ = handle;
    /// buf.free_async(&stream)?; // after the work on `stream`, once no importer holds it
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemAllocFromPoolAsync")]
    pub fn alloc<T: Pod>(
        &self,
        len: usize,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<PoolBuffer<T>> {
        let bytes = crate::memory::allocation_bytes::<T>("IpcPool::alloc", len)?;
        let alloc = alloc_from(&self.owner, bytes, stream.as_cu_stream())?;
        Ok(PoolBuffer {
            slice: GpuSlice::new(self.owner.ctx.clone(), alloc.ptr, len),
            alloc,
        })
    }

    /// The pool's handle and a new descriptor of the pool (`cuMemPoolExportToShareableHandle`), for
    /// a peer's [`ImportedPool::open_fd`]. [`FdSocket::send_pool`](crate::fd::FdSocket::send_pool)
    /// does this and sends both.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemPoolExportToShareableHandle`.
    #[doc(alias = "cuMemPoolExportToShareableHandle")]
    pub fn export_fd(&self) -> Result<(IpcPoolHandle, OwnedFd)> {
        let owner = &self.owner;
        let env = pool_envelope(
            owner.ledger.token(),
            owner.uuid,
            owner.generation,
            owner.ctx.ordinal(),
        );
        let _g = owner.ctx.enter()?;
        // SAFETY: our live pool, created with the POSIX-fd handle type.
        let fd = unsafe { driver::pool::export_fd(owner.pool) }?;
        let read_only = owner.read_only.load(StdOrdering::Relaxed);
        Ok((
            Handle::from_envelope(env).marked_read_only_if(read_only),
            fd,
        ))
    }

    /// Share this pool **read-only**: every handle it exports from now on says so
    /// ([`Handle::is_read_only`]), and importers must open it with
    /// [`ReadOnlyPool`] (or
    /// [`FdSocket::recv_pool_read_only`](crate::fd::FdSocket::recv_pool_read_only)); a read-write
    /// open is refused ([`TypeConflict::ReadOnly`](crate::error::TypeConflict::ReadOnly)). Only the
    /// importers' types are read-only: the driver cannot map pool memory read-only
    /// (`cuMemPoolSetAccess` answers `CUDA_ERROR_NOT_SUPPORTED` for `PROT_READ`), so a kernel
    /// handed an importer's address can still write. Use an arena where the GPU must refuse
    /// writes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::pool::IpcPool;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let pool = IpcPool::new(&ctx)?.read_only_for_importers();
    /// let (handle, _fd) = pool.export_fd()?;
    /// assert!(handle.is_read_only());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn read_only_for_importers(self) -> Self {
        self.owner.read_only.store(true, StdOrdering::Relaxed);
        self
    }

    /// Whether [`read_only_for_importers`](Self::read_only_for_importers) was called.
    #[must_use]
    pub fn is_read_only_for_importers(&self) -> bool {
        self.owner.read_only.load(StdOrdering::Relaxed)
    }

    /// Free the allocations of freed buffers that no importer holds any more, reaping importers
    /// proven dead; returns how many freed buffers still wait for live importers.
    #[allow(
        clippy::must_use_candidate,
        reason = "it frees what it can; the count is information"
    )]
    pub fn collect(&self) -> usize {
        self.owner.reclaim(Reap::Always)
    }

    /// The pids of live processes that imported the pool.
    #[must_use]
    pub fn importers(&self) -> Vec<u32> {
        self.owner.ledger.holders()
    }

    /// The context the pool lives in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.owner.ctx
    }

    /// Let the device of `ctx`, another context of this process, read and write every
    /// allocation of the pool, now and later, from kernels and copies there
    /// (`cuMemPoolSetAccess`). A pool's memory is accessible from its own device only: peer
    /// access between contexts does not reach pool memory, and without this, copies from
    /// another device fail and kernels fault. Granting the pool's own device does nothing;
    /// granting a device again is harmless. (Importers grant their own devices: this is for
    /// this process.)
    ///
    /// # Errors
    ///
    /// [`Error::DeviceNotReachable`] when `ctx`'s device cannot access the pool's device
    /// (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming `cuMemPoolSetAccess`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext, RawStream};
    /// use cuda_ipc::pool::IpcPool;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let (gpu0, gpu1) = (GpuContext::new(0)?, GpuContext::new(1)?);
    /// let pool = IpcPool::new(&gpu0)?;
    /// pool.grant_access(&gpu1)?;
    /// let buf = pool.alloc::<f32>(1 << 20, &RawStream::LEGACY)?; // kernels on GPU 1 may use it
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.owner.grant(ctx)
    }
}

impl std::fmt::Debug for IpcPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcPool")
            .field("device", &self.owner.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// [`alloc_from`] on a private stream, synchronised before it returns.
fn alloc_ready(owner: &Arc<Owner>, bytes: usize) -> Result<PoolAlloc> {
    let _g = owner.ctx.enter()?;
    let stream = driver::stream::create_non_blocking()?;
    let alloc = alloc_from(owner, bytes, stream).map(|mut a| {
        a.shared = true;
        a
    });
    let synced = match &alloc {
        // SAFETY: a live stream of this context.
        Ok(_) => unsafe { driver::stream::synchronize(stream) },
        Err(_) => Ok(()),
    };
    // SAFETY: created above and destroyed once; its work is done (synchronised), or it has
    // none.
    let _ = unsafe { driver::stream::destroy(stream) };
    synced.and(alloc)
}

/// Allocate `bytes` from `owner`'s pool ordered on `stream` and publish it in a free block of the
/// table as a new live generation. The work of [`IpcPool::alloc`].
fn alloc_from(owner: &Arc<Owner>, bytes: usize, stream: sys::CUstream) -> Result<PoolAlloc> {
    // Quarantined allocations hold device memory: free the released ones at every allocation
    // (a pass over the quarantine), and reap the dead when out of blocks.
    owner.reclaim(if owner.ledger.is_full() {
        Reap::IfHeld
    } else {
        Reap::Never
    });
    // The block is published before the memory exists; no handle names it until `handle`,
    // which waits for the allocation.
    let label = Label::new(
        ExportKind::Pool,
        &owner.uuid,
        owner.read_only.load(StdOrdering::Relaxed),
    );
    let placed = owner
        .ledger
        .alloc(bytes as u64, label)
        .map_err(|_| Error::TooManyBuffers {
            max: MAX_POOL_BUFFERS,
        })?;
    let (ptr, ready) = alloc_on(&owner.ctx, owner.pool, bytes, stream).inspect_err(|_| {
        owner.ledger.free(placed); // never handed out: nobody holds it
    })?;
    Ok(PoolAlloc {
        owner: owner.clone(),
        ptr,
        placed,
        ready,
        freed: false,
        shared: false,
    })
}

/// `cuMemAllocFromPoolAsync` of `bytes` on `stream`, and an event recorded after it.
fn alloc_on(
    ctx: &GpuContext,
    pool: sys::CUmemoryPool,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(sys::CUdeviceptr, sys::CUevent)> {
    let _g = ctx.enter()?;
    // SAFETY: the pool is live, the stream the caller's (AsStream guarantees a live stream
    // of this context or the legacy stream).
    let ptr = unsafe { driver::pool::alloc_async(bytes, pool, stream) }?;
    let free = |e: Error| {
        // SAFETY: allocated above, never handed out; freed once, ordered on the same stream.
        let _ = unsafe { driver::pool::free_async(ptr, stream) };
        e
    };
    let event = driver::event::create(sys::CU_EVENT_DISABLE_TIMING).map_err(free)?;
    // SAFETY: a live event of this context and the caller's live stream.
    if let Err(e) = unsafe { driver::event::record(event, stream) } {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { driver::event::destroy(event) };
        return Err(free(e));
    }
    Ok((ptr, event))
}

/// An exported [`IpcPool`]: the [`Handle`] that travels with the pool's file descriptor
/// ([`IpcPool::export_fd`]), 184 bytes. Without the descriptor it maps nothing.
pub type IpcPoolHandle = Handle<IpcPool>;

/// Hooks for the tests of the shared pools (`tests/pool_buffer.rs`, `tests/pool_import.rs`).
/// Not part of the API.
#[allow(missing_debug_implementations)] // test hooks, not API
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __testing;

impl crate::handle::sealed::Sealed for IpcPool {}
impl crate::handle::HandleKind for IpcPool {
    const NAME: &'static str = "IpcPoolHandle";
    const CODE: u16 = KIND_POOL;
    type Element = crate::handle::sealed::Untyped;
}

/// The bytes of a [`PoolHandle`] (its fields are this crate's; the type is named only by
/// [`BufferKind`](crate::handle::BufferKind)).
#[doc(hidden)]
#[allow(missing_debug_implementations)] // its BufferHandle prints what may be printed
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct RawPoolHandle {
    magic: u32,
    version: u16,
    reserved0: u16,
    /// The element type: its size, alignment and type tag.
    elem_size: u32,
    elem_align: u32,
    type_tag: u64,
    /// The pool's export token (its ledger's tables).
    token: [u8; 16],
    /// The allocation's block in the pool's ledger.
    index: u32,
    reserved1: u32,
    /// The block's generation when the allocation was exported.
    generation: u64,
    /// Elements of `T`.
    len: u64,
    /// The driver's export data (`cuMemPoolExportPointer`).
    export: [u8; 64],
    checksum: u64,
}

const _: () = assert!(std::mem::size_of::<RawPoolHandle>() == 136);

// "CIPP" little-endian, layout version 1.
envelope::sealed_format!(
    RawPoolHandle,
    envelope::Format {
        magic: u32::from_le_bytes(*b"CIPP"),
        version: 1,
        versions: &[1],
        what: "a pool handle",
    },
    |raw| raw.reserved0 == 0 && raw.reserved1 == 0
);

/// An allocation of an [`IpcPool`], as another process names it (136 bytes of plain data:
/// [`as_bytes`](BufferHandle::as_bytes) / [`from_bytes`](BufferHandle::from_bytes)). Only a
/// process that imported the pool (which took its descriptor) can open it, with
/// [`ImportedPool::open`].
pub type PoolHandle<T> = BufferHandle<IpcPool, T>;

impl crate::handle::BufferKind for IpcPool {
    type Raw = RawPoolHandle;
    const NAME: &'static str = "PoolHandle";
    fn open(bytes: &[u8]) -> Result<RawPoolHandle> {
        envelope::open(bytes)
    }
    fn len_and_generation(raw: &RawPoolHandle) -> (u64, u64) {
        (raw.len, raw.generation)
    }
    fn describe(raw: &RawPoolHandle, d: &mut std::fmt::DebugStruct<'_, '_>) {
        // The export data is left out: with the pool's descriptor it maps the memory.
        d.field("block", &raw.index);
    }
}

impl<T: Pod> BufferHandle<IpcPool, T> {
    /// The checksummed handle of `len` `T`s in block `index`, generation `generation`, of pool
    /// `token`, with the driver's export data `export`.
    fn sealed(token: [u8; 16], index: u32, generation: u64, len: u64, export: [u8; 64]) -> Self {
        let raw = envelope::seal(RawPoolHandle {
            elem_size: std::mem::size_of::<T>() as u32,
            elem_align: std::mem::align_of::<T>() as u32,
            type_tag: type_tag_of::<T>(),
            token,
            index,
            generation,
            len,
            export,
            ..Zeroable::zeroed()
        });
        Self::from_raw(raw)
    }
}
