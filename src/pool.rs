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

mod foreign;
mod import;
mod read_only;
mod view;
pub use foreign::{ForeignPool, PoolBufferDescriptor};
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
    Admitted, BufferHandle, Envelope, Handle, HandleType, KIND_POOL, check_element, type_tag_of,
};
use crate::ledger::Holdings;
use crate::ledger::Placed;
use crate::ledger::{Block, MAX_ARENA_BUFFERS};
use crate::ledger::{DeferredFrees, Pending, register_pending};
use crate::ledger::{Dying, Entry, ImportCache};
use crate::ledger::{Ledger, Reap};
use crate::os;
use crate::poll::Backoff;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;
use crate::stream::AsStream;

const MAX_POOL_BUFFERS: usize = MAX_ARENA_BUFFERS;

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
                generation: crate::memory::GENERATION.fetch_add(1, StdOrdering::Relaxed),
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

/// The pools [`HandleType::Pool`] buffers come from, by context: one while it has free blocks
/// (another once it is full). A pool is kept while it has a buffer or an allocation in
/// quarantine (a buffer dropped while an importer holds it), and destroyed when it has neither
/// — by the drop of its last buffer, or by a later [`collect_shared`] — so that it never keeps
/// a context (or its shared-memory tables) alive after its buffers. Who holds a pool changes
/// under this lock only.
static SHARED: Mutex<Vec<(usize, Arc<Owner>)>> = parking_lot::const_mutex(Vec::new());

/// Whether a shared pool's allocation went to quarantine (or a pool may have been left without
/// buffers) since [`collect_shared`] last looked (for [`SHARED_QUARANTINE`]).
static SHARED_PENDING: AtomicBool = AtomicBool::new(false);

/// After a shared pool's allocation was freed or quarantined, as it goes: if it was the pool's
/// last buffer and nothing waits in the pool's quarantine, destroy the pool (else a later
/// [`collect_shared`] does).
fn drop_shared(owner: &Arc<Owner>) {
    let mut shared = SHARED.lock();
    // The list's reference and the dropping allocation's only: no other buffer, and nobody
    // about to allocate from it (that takes a reference under this lock first). A third
    // reference may be another thread's, looking through the context's pools for room: if it
    // allocates elsewhere, this pool is left with no buffer, so the next pending scan (at an
    // allocation, an export or `collect_deferred`) must look at it.
    if Arc::strong_count(owner) != 2 {
        SHARED_PENDING.store(true, StdOrdering::Relaxed);
        return;
    }
    if owner.reclaim(Reap::IfHeld) != 0 {
        SHARED_PENDING.store(true, StdOrdering::Relaxed);
        return;
    }
    let gone = shared
        .iter()
        .position(|(_, o)| Arc::ptr_eq(o, owner))
        .map(|i| shared.swap_remove(i));
    drop(shared);
    drop(gone); // destroys the pool, after the lock (driver calls, shared-memory unlinks)
}

/// Free what the shared pools hold in quarantine once its importers let go (reaping importers
/// proven dead), and destroy the pools left with no buffer and nothing in quarantine. Returns
/// how many quarantined allocations still wait for live importers, and their bytes. Part of
/// [`collect_deferred`](crate::collect_deferred).
fn collect_shared() -> (usize, usize) {
    let mut shared = SHARED.lock();
    let (mut held, mut bytes) = (0, 0usize);
    let mut gone = Vec::new();
    let mut i = 0;
    while i < shared.len() {
        let owner = &shared[i].1;
        let left = owner.reclaim(Reap::Always);
        if left == 0 && Arc::strong_count(owner) == 1 {
            gone.push(shared.swap_remove(i));
            continue;
        }
        held += left;
        // Our own records of the sizes, summed without wrapping (each is a real allocation).
        bytes = bytes.saturating_add(owner.quarantined_bytes());
        i += 1;
    }
    SHARED_PENDING.store(held != 0, StdOrdering::Relaxed);
    drop(shared);
    drop(gone);
    (held, bytes)
}

/// Once per process: have `exit` remove from `/dev/shm` the tables of the shared pools still
/// listed — those whose quarantine still waited for importers (which keep what they opened;
/// an owner that exits is gone for new opens anyway). Not run when the process is killed: then
/// the next process's sweep removes them.
fn unlink_shared_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no arguments whose body cannot
        // panic (a `try_lock` and unlink system calls whose errors are ignored), so it never
        // unwinds across the C boundary, and it does not call `exit`. A failed registration
        // only leaves the names to the sweep.
        let _ = unsafe { libc::atexit(unlink_shared) };
    });
}

extern "C" fn unlink_shared() {
    // `try_lock`: an exit from inside an allocation must not deadlock (the names then stay).
    if let Some(shared) = SHARED.try_lock() {
        for (_, owner) in shared.iter().filter(|(_, o)| o.ledger.is_home()) {
            owner.ledger.unlink_names();
        }
    }
}

/// The shared pools' quarantine, collected with the deferred frees
/// ([`collect_deferred`](crate::collect_deferred), and at every allocation and export when
/// [`SHARED_PENDING`] says something may wait); registered at the first shared pool.
static SHARED_QUARANTINE: Pending = Pending {
    pending: || SHARED_PENDING.load(StdOrdering::Relaxed),
    collect: || {
        let (held, bytes) = collect_shared();
        DeferredFrees {
            pending: held,
            pending_bytes: bytes,
            ..DeferredFrees::default()
        }
    },
};

/// Allocate `bytes` for an [`IpcBuffer`](crate::IpcBuffer) of [`HandleType::Pool`] from a pool
/// of `ctx` this process shares between such buffers (created when none has a free block),
/// and wait until the allocation is complete: like `cuMemAlloc` memory, it is ready for any
/// stream when this returns.
pub(crate) fn alloc_shared(ctx: &GpuContext, bytes: usize) -> Result<PoolAlloc> {
    let got = alloc_shared_in(ctx, bytes);
    if got.is_err() {
        // A pool made or taken for it may be left without a buffer: a later scan looks.
        SHARED_PENDING.store(true, StdOrdering::Relaxed);
    }
    got
}

fn alloc_shared_in(ctx: &GpuContext, bytes: usize) -> Result<PoolAlloc> {
    let key = ctx.as_raw() as usize;
    loop {
        let pools: Vec<Arc<Owner>> = SHARED
            .lock()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, o)| o.clone())
            .collect();
        for owner in &pools {
            match alloc_ready(owner, bytes) {
                // A full pool: its last buffer may go while this call holds it, leaving it to
                // a later scan.
                Err(Error::TooManyBuffers { .. }) => {
                    SHARED_PENDING.store(true, StdOrdering::Relaxed);
                }
                other => return other,
            }
        }
        // Every pool of this context is full (or there is none): one more.
        let pool = IpcPool::new(ctx)?;
        SHARED.lock().push((key, pool.owner.clone()));
        unlink_shared_at_exit();
        register_pending(&SHARED_QUARANTINE);
        match alloc_ready(&pool.owner, bytes) {
            // Filled by other threads in between: look again.
            Err(Error::TooManyBuffers { .. }) => continue,
            other => return other,
        }
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
    let placed = owner
        .ledger
        .alloc(bytes as u64)
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

/// A typed allocation from an [`IpcPool`]; it dereferences to its [`GpuSlice`].
///
/// Dropping it frees the allocation (`cuMemFree`, which does not wait for queued work: see
/// [asynchronous work](GpuSlice#asynchronous-work)) once no importer holds it; until then it is
/// quarantined, and handles of it are stale at once. [`free_async`](Self::free_async) orders
/// the free on a stream instead.
pub struct PoolBuffer<T: Pod> {
    slice: GpuSlice<T>,
    alloc: PoolAlloc,
}

/// One allocation of a pool and its block in the pool's table, whatever its element type: the
/// memory of a [`PoolBuffer`], and of an [`IpcBuffer`](crate::IpcBuffer) of
/// [`HandleType::Pool`]. Freed (or quarantined while importers hold it) on drop.
pub(crate) struct PoolAlloc {
    owner: Arc<Owner>,
    ptr: sys::CUdeviceptr,
    /// Its block in the ledger: index, generation, and the bytes allocated (our record; the
    /// shared table's copy is for importers).
    placed: Placed,
    /// Recorded after the allocation on its stream.
    ready: sys::CUevent,
    freed: bool,
    /// From a pool of [`SHARED`] (an [`IpcBuffer`](crate::IpcBuffer) of [`HandleType::Pool`]).
    shared: bool,
}

// SAFETY: the event is an opaque driver handle used with the context pushed; the rest is Send.
unsafe impl Send for PoolAlloc {}
// SAFETY: `&self` methods only synchronise on the event (thread-safe in the driver) and read the
// shared table.
unsafe impl Sync for PoolAlloc {}

crate::slice::deref_to!(PoolBuffer<T> => slice: GpuSlice<T>);

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
    elem_size: u32,
    elem_align: u32,
    type_tag: u64,
    token: [u8; 16],
    index: u32,
    reserved1: u32,
    generation: u64,
    len: u64,
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

impl<T: Pod> PoolBuffer<T> {
    /// The handle a process that imported the pool opens with [`ImportedPool::open`]: the
    /// allocation's `cuMemPoolExportPointer` data with the pool's id, the buffer's block and
    /// generation, length and element type, checksummed. Waits first until the allocation has
    /// completed on its stream (`cuEventSynchronize`), since an importer must not touch it
    /// before.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventSynchronize` or `cuMemPoolExportPointer`.
    #[doc(alias = "cuMemPoolExportPointer")]
    pub fn handle(&self) -> Result<PoolHandle<T>> {
        self.alloc.handle(self.slice.len)
    }

    /// Wait until the allocation has completed on the stream it was made on, at most
    /// `timeout` (`cuEventQuery`, polled with a short back-off). [`handle`](Self::handle) and
    /// [`descriptor`](Self::descriptor) wait for it without a bound (`cuEventSynchronize`):
    /// call this first where a stream held up by a hung kernel or a dead peer's wait must not
    /// hold the caller for ever. Returns at once once it has completed.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::Cuda`] naming `cuEventQuery`; [`Error::InvalidState`]
    /// after the buffer was freed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext, RawStream};
    /// use cuda_ipc::pool::IpcPool;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let pool = IpcPool::new(&ctx)?;
    /// let buf = pool.alloc::<f32>(1 << 20, &RawStream::LEGACY)?;
    /// buf.wait_allocated(Duration::from_secs(5))?;
    /// let descriptor = buf.descriptor()?; // no wait left
    /// # let _ = descriptor;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuEventQuery")]
    pub fn wait_allocated(&self, timeout: std::time::Duration) -> Result<()> {
        self.alloc.wait_ready(timeout)
    }

    /// Whether a process (another, or an import in this one) holds this buffer now.
    #[must_use]
    pub fn is_viewed(&self) -> bool {
        self.alloc.is_viewed()
    }

    /// The buffer as a program that does not use this crate opens it — NVIDIA's cuda.core
    /// (`Buffer.from_ipc_descriptor`, given the pool from [`IpcPool::export_fd`]'s
    /// descriptor), or C/C++ (`cuMemPoolImportPointer`): the allocation's
    /// `cuMemPoolExportPointer` data and its size in bytes. Waits first until the allocation
    /// has completed on its stream, as [`handle`](Self::handle) does.
    ///
    /// A foreign importer takes no place in the pool's table, so nothing stops this buffer's
    /// drop from freeing the allocation under it: keep the buffer until the peer says it has
    /// freed its import (the CUDA guide's rule: importers free first). The pool's
    /// [`read_only_for_importers`](IpcPool::read_only_for_importers) binds this crate's
    /// importers only.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuEventSynchronize` or `cuMemPoolExportPointer`.
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
    /// let buf = pool.alloc::<f32>(1 << 20, &RawStream::LEGACY)?;
    /// let (_handle, fd) = pool.export_fd()?; // cuda.core: DeviceMemoryResource.from_allocation_handle
    /// let descriptor = buf.descriptor()?; // cuda.core: IPCBufferDescriptor(export_data, bytes)
    /// assert_eq!(descriptor.bytes, 4 << 20);
    /// # drop(fd);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolExportPointer")]
    pub fn descriptor(&self) -> Result<PoolBufferDescriptor> {
        let bytes = (self.slice.len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        self.alloc.descriptor(bytes)
    }

    /// Free the buffer ordered on `stream` (`cuMemFreeAsync`: after the work enqueued on
    /// `stream` before it), if no importer holds it; otherwise retire it as a drop does (handles
    /// stale at once, the allocation freed once importers let go).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemFreeAsync`.
    #[doc(alias = "cuMemFreeAsync")]
    pub fn free_async(mut self, stream: &(impl AsStream + ?Sized)) -> Result<()> {
        self.alloc.free(Some(stream.as_cu_stream()))
    }
}

impl PoolAlloc {
    /// The allocation's address.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The handle of this allocation as `len` elements of `T` (see [`PoolBuffer::handle`]).
    pub(crate) fn handle<T: Pod>(&self, len: usize) -> Result<PoolHandle<T>> {
        let export = self.export_data()?;
        Ok(PoolHandle::sealed(
            self.owner.ledger.token(),
            self.placed.index,
            self.placed.generation,
            len as u64,
            export,
        ))
    }

    /// See [`PoolBuffer::descriptor`]: the allocation's export data, as `bytes` bytes.
    pub(crate) fn descriptor(&self, bytes: u64) -> Result<PoolBufferDescriptor> {
        Ok(PoolBufferDescriptor {
            export_data: self.export_data()?,
            bytes,
        })
    }

    /// See [`PoolBuffer::wait_allocated`].
    pub(crate) fn wait_ready(&self, timeout: std::time::Duration) -> Result<()> {
        if self.freed {
            return Err(Error::InvalidState {
                call: "cuEventQuery",
                state: crate::error::ObjectState::Closing,
            });
        }
        let mut wait = crate::poll::Backoff::new(
            timeout,
            std::time::Duration::from_micros(1),
            std::time::Duration::from_millis(1),
        )
        .spinning_below(std::time::Duration::from_micros(50));
        let _g = self.owner.ctx.enter()?;
        loop {
            // SAFETY: our live event (not freed: checked above; `free` takes `&mut self`).
            if unsafe { driver::event::query(self.ready) }? {
                return Ok(());
            }
            if let Err(waited) = wait.pause() {
                return Err(Error::Timeout {
                    what: "pool allocation to complete on its stream",
                    waited,
                    waiting_for: None,
                });
            }
        }
    }

    /// The allocation's `cuMemPoolExportPointer` data, once the allocation has completed.
    fn export_data(&self) -> Result<[u8; 64]> {
        if self.freed {
            // Its event is destroyed and its block retired (an owner checks first; this keeps
            // the destroyed event from ever reaching the driver).
            return Err(Error::InvalidState {
                call: "cuMemPoolExportPointer",
                state: crate::error::ObjectState::Closing,
            });
        }
        let _g = self.owner.ctx.enter()?;
        // SAFETY: our live event.
        unsafe { driver::event::synchronize(self.ready) }?;
        // SAFETY: our live allocation from an exportable pool, complete (synchronised above).
        unsafe { driver::pool::export_pointer(self.ptr) }
    }

    /// Whether [`free`](Self::free) ran (whatever it returned).
    pub(crate) fn is_freed(&self) -> bool {
        self.freed
    }

    /// See [`IpcPool::grant_access`] (for the whole pool).
    pub(crate) fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.owner.grant(ctx)
    }

    /// The pool this allocation came from (its handle and descriptor travel to importers).
    pub(crate) fn pool(&self) -> IpcPool {
        IpcPool {
            owner: self.owner.clone(),
        }
    }

    /// Whether a process (another, or an import in this one) holds the allocation now.
    pub(crate) fn is_viewed(&self) -> bool {
        self.owner.ledger.is_viewed(&self.placed)
    }

    /// The pids of the live processes that hold the allocation now.
    pub(crate) fn importers(&self) -> Vec<u32> {
        self.owner.ledger.holders_of(self.placed.index)
    }

    /// Retire the allocation (new opens of its handles are stale from here on) without freeing
    /// it, and wait up to `timeout` until no importer holds it, reaping importers proven dead.
    /// The allocation stays ours: [`free`](Self::free) (or drop) gives it back.
    ///
    /// # Errors
    ///
    /// [`Error::LeasesOutstanding`] naming the importers still holding it.
    pub(crate) fn wait_unheld(&self, timeout: Duration) -> Result<()> {
        self.owner.ledger.retire(&self.placed);
        let unheld = || {
            if !self.is_viewed() {
                return true;
            }
            self.owner.reclaim(Reap::Always);
            !self.is_viewed()
        };
        Backoff::for_importers(timeout).until_unheld(unheld, || self.importers())
    }

    /// Free the allocation — ordered on `stream`, or now — if no importer holds it; otherwise
    /// quarantine it until they let go. Handles are stale from here on. Once only.
    pub(crate) fn free(&mut self, stream: Option<sys::CUstream>) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        self.freed = true;
        let owner = &self.owner;
        let _g = owner.ctx.enter()?;
        // SAFETY: our live event, destroyed once (`freed` guards).
        let _ = unsafe { driver::event::destroy(self.ready) };
        // Under the quarantine's lock (as a reclaim takes it, then the ledger's): a block the
        // ledger quarantines is on the list before any reclaim can look for it.
        let mut retired = owner.retired.lock();
        if owner.ledger.free(self.placed) {
            retired.push(Retired {
                placed: self.placed,
                ptr: self.ptr,
            });
            return Ok(());
        }
        drop(retired);
        match stream {
            // SAFETY: our allocation, retired with no importer holding it; freed once, ordered
            // on the caller's live stream.
            Some(s) => unsafe { driver::pool::free_async(self.ptr, s) },
            // SAFETY: as above, freed once, now (queued work on it is the caller's duty).
            None => unsafe { driver::mem::free(self.ptr) },
        }
    }
}

impl Drop for PoolAlloc {
    fn drop(&mut self) {
        if !self.owner.ledger.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        let _ = self.free(None);
        if self.shared {
            drop_shared(&self.owner);
        }
    }
}

impl<T: Pod> std::fmt::Debug for PoolBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("generation", &self.alloc.placed.generation)
            .finish_non_exhaustive()
    }
}

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

/// An exported [`IpcPool`]: the [`Handle`] that travels with the pool's file descriptor
/// ([`IpcPool::export_fd`]), 184 bytes. Without the descriptor it maps nothing.
pub type IpcPoolHandle = Handle<IpcPool>;

/// The pools this process imported, by export token: one [`Import`] per pool per process,
/// whatever the contexts it is opened in. An import being dropped is waited for: a new import
/// of the pool must not overlap the driver's destroy of the old one.
static IMPORTS: ImportCache<[u8; 16], Import> = ImportCache::new(Dying::WaitForIt);

/// A pool imported into this process. There is one per pool per process, shared by the
/// [`ImportedPool`]s of every context. The driver maps an imported allocation at one address
/// for the whole process (unified addressing), and does not count imports: measured on H200s
/// (driver 580), a second import of the same pool, in the same or another context, gets the
/// same address for the allocation, and the first `cuMemFree` unmaps it for both (the other's
/// free then fails, its copies fail with `CUDA_ERROR_INVALID_VALUE`, and a kernel would fault).
/// Two imports would free each other's views (`tests/two_contexts.rs`).
struct Import {
    /// The driver's pool, imported in the context of the first import: its driver calls
    /// (imports, frees, the destroy) run with it current. Destroyed first in `drop`.
    driver: ManuallyDrop<PoolImport>,
    token: [u8; 16],
    /// The ordinal, in this process, of the device that holds the pool's memory.
    holder: u32,
    exporter: ProcessIdentity,
    /// The pool's block table, our lease and bit in it, and per allocation we view its
    /// imported pointer and the size the driver reports for it. Dropped after the pool is
    /// destroyed (see Drop).
    holdings: Holdings<(sys::CUdeviceptr, u64)>,
}

impl Drop for Import {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.driver) };
        // Only now may the pool be imported again (see `IMPORTS`).
        IMPORTS.forget(&self.token);
    }
}

/// An [`IpcPool`] imported from another process: each of its buffers opens with
/// [`open`](Self::open) (`cuMemPoolImportPointer`). `ImportedPool` is `Send`, `Sync` and cheap
/// to clone; every [`PoolView`] keeps the import alive. A process imports a pool once: imports
/// in other contexts (devices) share it, and a buffer opened through several of them is one
/// import of the allocation, freed when its last view in the process drops.
#[derive(Clone)]
pub struct ImportedPool {
    import: Arc<Import>,
    /// The context this pool was opened for: its views' copies and memsets run in it.
    ctx: GpuContext,
}

impl Import {
    /// Import the pool `handle` names from `fd` in `ctx`.
    fn new(
        ctx: &GpuContext,
        handle: &IpcPoolHandle,
        fd: OwnedFd,
        exporter: ProcessIdentity,
        holder: u32,
    ) -> Result<Self> {
        let env = &handle.env;
        let holdings = Holdings::open_with_table(&env.token, 0, env.generation)?;
        let driver = PoolImport::from_fd(ctx, fd.as_fd())?;
        drop(fd);
        Ok(Self {
            driver: ManuallyDrop::new(driver),
            token: env.token,
            holder,
            exporter,
            holdings,
        })
    }

    /// Make sure `ctx`'s device can read and write the pool's memory (see
    /// [`PoolImport::reach`]).
    fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.driver.reach(ctx, self.holder)
    }
}

impl ImportedPool {
    /// Import a pool from its handle and the descriptor its owner sent with it
    /// (`cuMemPoolImportFromShareableHandle`), taking an importer slot in its lease table, and
    /// give `ctx`'s device access to its memory if the driver says it has none
    /// (`cuMemPoolGetAccess`, `cuMemPoolSetAccess`). `fd` is consumed. A pool this process has
    /// imported already, in any context, is shared: the call then checks the handle (and the
    /// exporter alive, as every open does), closes `fd` unused and gives `ctx`'s device access.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`]; [`Error::PeerGone`] (the exporter) (a pool of a dead process,
    /// before the descriptor is used); [`Error::DeviceNotReachable`]; [`Error::StaleHandle`] when
    /// the owner dropped the pool; [`Error::TooManyImporters`]; [`Error::Cuda`] naming
    /// `cuMemPoolImportFromShareableHandle` (a descriptor that is not a pool), `cuMemPoolGetAccess`
    /// or `cuMemPoolSetAccess`; [`Error::HandleTypeMismatch`]
    /// ([`TypeConflict::ReadOnly`](crate::error::TypeConflict::ReadOnly)) when the owner shares the
    /// pool read-only ([`ReadOnlyPool::open_fd`](crate::pool::ReadOnlyPool::open_fd) opens it).
    #[doc(alias = "cuMemPoolImportFromShareableHandle")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcPoolHandle, fd: OwnedFd) -> Result<Self> {
        handle.refuse_if_read_only()?;
        Self::open_fd_any(ctx, handle, fd)
    }

    /// [`open_fd`](Self::open_fd) whether or not the exporter shares the pool read-only (for
    /// [`ReadOnlyPool`]).
    pub(crate) fn open_fd_any(
        ctx: &GpuContext,
        handle: &IpcPoolHandle,
        fd: OwnedFd,
    ) -> Result<Self> {
        let Admitted {
            exporter,
            memory_device,
        } = handle.admit(ctx, true)?;
        let token = handle.env.token;
        let generation = handle.env.generation;
        // The owner dropped the pool: its handles are stale (the import lives on for the
        // views still held). Known and open: shared.
        let import = match IMPORTS.entry(&token) {
            Entry::Live(hit) if hit.holdings.is_closing() => {
                return Err(Error::StaleHandle { generation });
            }
            Entry::Live(hit) => hit,
            Entry::Vacant(vacancy) => vacancy.fill(Arc::new(Import::new(
                ctx,
                handle,
                fd,
                exporter,
                memory_device,
            )?)),
        };
        import.grant(ctx)?;
        Ok(Self {
            import,
            ctx: ctx.clone(),
        })
    }

    /// Open one buffer of the pool: checks the handle (checksum, element type, this pool),
    /// enters its block (stale once the owner freed it), imports the allocation
    /// (`cuMemPoolImportPointer`) and checks its size. Opening the same buffer again in this
    /// process shares the import.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for a damaged handle, one of another pool, or one whose length
    /// the allocation does not hold; [`Error::TypeMismatch`]; [`Error::StaleHandle`] when the
    /// buffer was freed; [`Error::PeerGone`] (the exporter) when the owner died (views opened
    /// before stay mapped); [`Error::HandleTypeMismatch`] with
    /// [`TypeConflict::ImportedTwice`](crate::error::TypeConflict::ImportedTwice) when this
    /// process holds the allocation through a [`ForeignPool`];
    /// [`Error::Cuda`] naming `cuMemPoolImportPointer`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    /// use cuda_ipc::pool::PoolHandle;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let name = SocketName::Abstract("pool".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let pool = socket.recv_pool(&ctx, Duration::from_secs(5))?; // once
    /// let bytes = socket.recv(Duration::from_secs(5))?.payload; // per buffer
    /// let view = pool.open(&PoolHandle::<u32>::from_bytes(&bytes)?)?;
    /// let mut host = vec![0u32; view.len()];
    /// view.copy_to_host(&mut host)?;
    /// drop(view); // frees our import; the owner may free the allocation after this
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolImportPointer")]
    pub fn open<T: Pod>(&self, handle: &PoolHandle<T>) -> Result<PoolView<T>> {
        let import = &self.import;
        // A `PoolHandle`'s structure was checked when it was made (`from_bytes`) or sealed by
        // this crate; the rest is checked here.
        let h = &handle.raw;
        check_element::<T>(h.elem_size, h.elem_align, h.type_tag)?;
        let corrupt = |detail: String| Error::corrupt_handle(HandleDefect::Layout { detail });
        let memory = |detail: String| Error::corrupt_handle(HandleDefect::Memory { detail });
        if h.token != import.token {
            return Err(Error::corrupt_handle(HandleDefect::Names {
                detail: "the handle names another pool".into(),
            }));
        }
        let bytes = h
            .len
            .checked_mul(u64::from(h.elem_size))
            .filter(|&b| b > 0 && b <= isize::MAX as u64)
            .ok_or_else(|| corrupt(format!("length {} × {} bytes", h.len, h.elem_size)))?;
        let len = h.len as usize;
        // Every open asks after the owner, as the pool's import did (a pinned pidfd's answer).
        crate::process::check_exporter_alive(&import.exporter, true)?;
        // A second handle of the allocation is held to the size the driver reported.
        let again = |&(ptr, size): &(sys::CUdeviceptr, u64)| {
            if size < bytes {
                return Err(memory(format!(
                    "the handle claims {bytes} bytes; the allocation holds {size} \
                     (cuPointerGetAttributes)"
                )));
            }
            Ok(ptr)
        };
        let ptr = import.holdings.enter(
            h.index,
            h.generation,
            || {},
            again,
            |block| import_pointer(import, block, h, bytes).map(|(ptr, size)| ((ptr, size), ptr)),
        )?;
        Ok(PoolView {
            slice: GpuSlice::new(self.ctx.clone(), ptr, len),
            hold: PoolHold(Box::new(LedgerHold {
                import: import.clone(),
                index: h.index,
            })),
        })
    }

    /// The process that owns the pool.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.import.exporter
    }

    /// The context this pool was opened for (its views' copies and memsets run in it).
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Let the device of `ctx`, another context of this process, read and write every buffer
    /// of the pool this process opens, now and later, from kernels and copies there (asked of
    /// the driver with `cuMemPoolGetAccess`, granted with `cuMemPoolSetAccess` where missing).
    /// Opening the pool in a context grants that context's device already, so this is for
    /// handing a view's pointer to another device without opening the pool there. A process
    /// imports a pool once, so access granted here holds for every [`ImportedPool`] of it in
    /// this process.
    ///
    /// # Errors
    ///
    /// [`Error::DeviceNotReachable`] when `ctx`'s device cannot access the pool's device
    /// (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming `cuMemPoolGetAccess` or
    /// `cuMemPoolSetAccess`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let (gpu0, gpu1) = (GpuContext::new(0)?, GpuContext::new(1)?);
    /// let name = SocketName::Abstract("pool".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let pool = socket.recv_pool(&gpu0, Duration::from_secs(5))?;
    /// pool.grant_access(&gpu1)?; // views' pointers may now go to kernels on GPU 1 too
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemPoolSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.import.grant(ctx)
    }
}

/// `cuMemPoolImportPointer` of `h`'s allocation, checked to hold `bytes`: the pointer and the
/// size the driver reports.
fn import_pointer(
    import: &Import,
    block: &Block,
    h: &RawPoolHandle,
    bytes: u64,
) -> Result<(sys::CUdeviceptr, u64)> {
    let (_, published) = block.range();
    if published < bytes {
        return Err(Error::corrupt_handle(HandleDefect::Memory {
            detail: format!("the handle claims {bytes} bytes; the owner allocated {published}"),
        }));
    }
    import.driver.import_pointer(h.export, |ptr| {
        crate::memory::claimed_bytes(ptr, format_args!("the handle claims {bytes} bytes"), bytes)
    })
}

impl std::fmt::Debug for ImportedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPool")
            .field("exporter", &self.import.exporter.pid())
            .field("device", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// A hold on an [`IpcPool`]'s allocation: our bit in its block.
struct LedgerHold {
    import: Arc<Import>,
    index: u32,
}

impl view::Hold for LedgerHold {
    fn is_live(&self) -> bool {
        self.import.holdings.is_live(self.index)
    }

    fn exporter(&self) -> Option<ProcessIdentity> {
        Some(self.import.exporter)
    }

    fn grant(&self, ctx: &GpuContext) -> Result<()> {
        self.import.grant(ctx)
    }

    fn block(&self) -> Option<u32> {
        Some(self.index)
    }
}

impl Drop for LedgerHold {
    fn drop(&mut self) {
        if !self.import.holdings.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        let driver = &self.import.driver;
        self.import.holdings.leave(self.index, |(ptr, _)| {
            // An import that could not be freed keeps the bit: the owner then never frees the
            // allocation under it (a leak, never a use-after-free).
            // SAFETY: imported with this pool's `import_pointer`, freed once, when its last
            // view goes; before the bit clears, as the guide requires.
            unsafe { driver.free_pointer(ptr) }
        });
    }
}

/// Hooks for the tests of the shared pools (`tests/pool_buffer.rs`, `tests/pool_import.rs`).
/// Not part of the API.
#[allow(missing_debug_implementations)] // test hooks, not API
#[cfg(any(test, fuzzing, feature = "__testing"))]
pub mod __testing;

impl crate::handle::sealed::Sealed for IpcPool {}
impl crate::handle::HandleKind for IpcPool {
    const NAME: &'static str = "IpcPoolHandle";
    const CODE: u16 = KIND_POOL;
    type Element = crate::handle::sealed::Untyped;
}
