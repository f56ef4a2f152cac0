//! [`IpcArena`]: one virtual-memory region shared once, many typed buffers inside it, each
//! with its own handle, generation and holders, opened without a driver call.
//!
//! Opening an [`IpcBuffer`](crate::IpcBuffer) costs one driver import and mapping per buffer
//! (80–140 µs on an H200, whatever the handle type). An arena pays that once: the owner
//! creates one [`HandleType::PosixFd`] region, sends it to each peer over an
//! [`FdSocket`](crate::fd::FdSocket), and then sub-allocates [`ArenaBuffer`]s from it. Each buffer
//! has an [`ArenaHandle<T>`] (arena id, block, generation, offset, length, element type) that a
//! peer which imported the arena ([`ImportedArena`]) turns into an [`ArenaView<T>`] with a few
//! atomic operations on a shared block table — no mapping, no system call.
//!
//! Freeing, reuse and lifetimes are documented on [`IpcArena`]; the shared protocol in
//! `ledger/table.rs`.
//!
//! # Many buffers, one import: arenas and pools
//!
//! Each `IpcBuffer` open maps memory (58 µs legacy, 100 µs POSIX-fd on an H200). When a peer needs
//! many buffers — KV-cache blocks, weight shards, batches — share one arena instead and send each
//! buffer's handle:
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{GpuContext};
//! use cuda_ipc::arena::{ArenaHandle, IpcArena};
//! use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
//!
//! fn owner(ctx: &GpuContext) -> cuda_ipc::Result<()> {
//!     let arena = IpcArena::new(ctx, 256 << 20)?;
//!     let listener = FdListener::bind(SocketName::Abstract("kv".into()), PeerPolicy::SameUid)?;
//!     let peer = listener.accept(Duration::from_secs(5))?;
//!     peer.send_arena(&arena, Duration::from_secs(5))?; // once: the region's descriptor
//!     for _ in 0..1000 {
//!         let block = arena.alloc_zeroed::<f32>(4096)?;
//!         peer.send(block.handle().as_bytes(), &[], Duration::from_secs(5))?; // 80 bytes
//!         // ... drop `block` when done: its handle goes stale at once, and its range is reused
//!         // only after the peer drops its view.
//!     }
//!     Ok(())
//! }
//!
//! fn peer(ctx: &GpuContext) -> cuda_ipc::Result<()> {
//!     let name = SocketName::Abstract("kv".into());
//!     let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
//!     let arena = socket.recv_arena(ctx, Duration::from_secs(5))?;
//!     for _ in 0..1000 {
//!         let msg = socket.recv(Duration::from_secs(5))?;
//!         let view = arena.open(&ArenaHandle::<f32>::from_bytes(&msg.payload)?)?; // no driver call
//!         let mut host = vec![0.0; view.len()];
//!         view.copy_to_host(&mut host)?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! For stream-ordered memory — what `cuMemAllocAsync` and cudarc allocate — pick
//! `HandleType::Pool` and nothing else changes: `IpcBuffer::new_with(&ctx, len,
//! HandleType::Pool)` allocates from a pool the process shares between such buffers (one per
//! context, kept while any of its buffers lives), and `send_buffer` / `recv_buffer` carry the
//! pool's descriptor with each buffer; a peer imports the pool once and then opens each buffer
//! with `cuMemPoolImportPointer` (1.1 µs once the pool is imported, against 60–70 µs for a
//! mapping). The same code passes all three kinds:
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{GpuContext, HandleType, IpcBuffer};
//! use cuda_ipc::fd::FdSocket;
//!
//! fn share(ctx: &GpuContext, peer: &FdSocket, how: HandleType) -> cuda_ipc::Result<()> {
//!     let buf = IpcBuffer::<f32>::zeroed_with(ctx, 1 << 20, how)?; // Legacy, PosixFd, Pool, Auto
//!     peer.send_buffer(&buf, Duration::from_secs(5))?; // the peer: recv_buffer::<f32>(&ctx, ..)
//!     Ok(())
//! }
//! ```
//!
//! An `IpcPool` gives the pool itself to the caller: `FdSocket::send_pool` once,
//! `pool.alloc::<T>(len, &stream)` (`cuMemAllocFromPoolAsync`), `buf.handle()?` per buffer,
//! `imported.open(&handle)?` on the other side (`cuMemPoolImportPointer`, ~1 µs for an allocation
//! in a chunk the peer has mapped before). A process imports a pool once: `recv_pool` in the
//! contexts of other devices shares that import (and grants those devices access), because the
//! driver maps an imported allocation at one address per process and one `cuMemFree` unmaps it
//! for every import of it.
//!
//! | | `IpcBuffer` | `IpcArena` | `IpcPool` |
//! |-|-------------|------------|-----------|
//! | per-buffer open (H200) | 61 µs legacy, 70 µs fd | **0.10 µs** (no driver call) | 0.71 µs (raw import 0.54 µs); 1.1 µs as a `HandleType::Pool` buffer |
//! | what a peer imports once | nothing | the region (one descriptor) | the pool (one descriptor) |
//! | sizes | any | carved from a fixed region (256-byte grid) | any, from the driver's pool |
//! | allocation | `cuMemAlloc` / `cuMemCreate` | a lock and a first-fit search, no driver call | `cuMemAllocFromPoolAsync`, ordered on a stream |
//! | freeing while a peer holds it | at once; legacy: the free is deferred, fd: the driver holds the memory | at once; the range waits in quarantine | at once; the allocation waits in quarantine |
//! | trust | per buffer | per arena: an importer can reach every buffer in it | per pool |
//!
//! Freed buffers' ranges (arena) and allocations (pool) are reused (freed) only when no live
//! importer holds a view; `collect()` also reaps importers that died holding one — call it now and
//! then where importers come and go. Importer slots (64 per export registry, arena or pool) never
//! run out on dead importers: an importer that finds them all taken takes over the slot of one
//! proven dead (clearing what it held), so an idle exporter need not call anything. `simple_ipc
//! --handles pool` runs NVIDIA's flow with pools. The shared protocol (`src/ledger/table.rs`) lists
//! what each side sees when the other is killed at each step; it is model-checked with loom and
//! stress-tested across processes with random `SIGKILL`s.
//!
//! # Sharing read-only
//!
//! One process holds model weights, KV-cache blocks or a dataset on the GPU; several reader
//! processes map them, and a stray write in one reader must not corrupt everyone's copy. Open
//! read-only: the types have no method that writes (`ReadOnlySlice<T>`: length, address, copies
//! out), and where the driver can, the GPU refuses writes too. POSIX-fd buffers and arenas are
//! mapped with `CU_MEM_ACCESS_FLAGS_PROT_READ`: measured on an H200, a kernel write through the
//! mapping faults in the writer only (`CUDA_ERROR_ILLEGAL_ADDRESS`), `cuMemsetD*` and
//! `cuMemcpyHtoD` fail `CUDA_ERROR_INVALID_VALUE`, and the owner's data stays intact
//! (`tests/read_only.rs` tries each). Pools cannot be mapped read-only (`cuMemPoolSetAccess`
//! refuses `PROT_READ` with `CUDA_ERROR_NOT_SUPPORTED`), so a `ReadOnlyPool` is read-only by type
//! only, and says so (`is_enforced_by_gpu()`); legacy handles cannot be opened read-only at all
//! (an error, not a guarantee in name only). The owner can refuse read-write importers outright:
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use cuda_ipc::{GpuContext};
//! use cuda_ipc::arena::{ArenaHandle, IpcArena};
//! use cuda_ipc::fd::FdSocket;
//!
//! fn owner(ctx: &GpuContext, reader: &FdSocket) -> cuda_ipc::Result<()> {
//!     let weights = IpcArena::new(ctx, 8 << 30)?.read_only_for_importers();
//!     let tensor = weights.alloc::<u16>(4096 * 4096)?; // fill it, then share it
//!     reader.send_arena(&weights, Duration::from_secs(5))?; // a read-write open is refused
//!     reader.send(tensor.handle().as_bytes(), &[], Duration::from_secs(5))?;
//!     Ok(())
//! }
//!
//! fn reader(ctx: &GpuContext, owner: &FdSocket) -> cuda_ipc::Result<()> {
//!     let weights = owner.recv_arena_read_only(ctx, Duration::from_secs(5))?; // PROT_READ
//!     let msg = owner.recv(Duration::from_secs(5))?;
//!     let tensor = weights.open(&ArenaHandle::<u16>::from_bytes(&msg.payload)?)?;
//!     // `tensor.as_raw_ptr()` is a kernel's `const T*`; there is no copy_from_host on it.
//!     println!("{} values, read-only", tensor.len());
//!     Ok(())
//! }
//! ```
//!
//! | memory | read-only open | the GPU refuses writes |
//! |--------|----------------|------------------------|
//! | POSIX-fd buffer | `ReadOnlyBuffer::open_fd`, `recv_buffer_read_only` | yes |
//! | arena | `ReadOnlyArena::open_fd`, `recv_arena_read_only` | yes |
//! | pool, `HandleType::Pool` buffer | `ReadOnlyPool::open_fd`, `recv_pool_read_only`, `recv_buffer_read_only` | no (type only) |
//! | legacy buffer | refused (`TypeConflict::NoReadOnlyMapping`) | — |
//!
//! `cargo run --release --example shared_weights -- --readers 8` shares 2,000 tensors (8 GiB, a
//! transformer's shapes) this way with 8 reader processes that check every word with kernels.
//! On one H200 a reader has all 2,000 tensors open about 2 ms after receiving the arena (61×
//! faster than 2,000 legacy handles, 130 ms; `cargo bench --bench shared_weights`); 8 readers
//! all have them 4.8–5.1 ms after the first is served, against 918–937 ms with legacy handles and
//! 0.71–1.27 s with `torch.multiprocessing` on the same shapes
//! (`examples/interop/torch_shared_weights.py`; two runs),
//! and the imports add no device memory: one copy of the weights whatever the number of readers
//! (BENCHMARKS.md).
//!
//! This protects against bugs in cooperating readers, not against a hostile one: whoever holds
//! the descriptor can import the memory read-write itself (SECURITY.md).

mod read_only;
pub use read_only::{ReadOnlyArena, ReadOnlyArenaView};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};

use bytemuck::{Pod, Zeroable};

use crate::context::GpuContext;
use crate::envelope;
use crate::error::{ArgumentDefect, Capability, Error, HandleDefect, Result};
use crate::handle::{
    Admitted, BufferHandle, Envelope, Handle, HandleType, KIND_ARENA, check_buffer_of, type_tag_of,
};
use crate::ledger::Ledger;
use crate::ledger::{Dying, Entry, ImportCache};
use crate::ledger::{ExportKind, Label, Placed};
use crate::ledger::{Holding, Holdings};
use crate::os;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;
use crate::vmm::{Access, VmmMemory};

use crate::ledger::ALIGN as ARENA_ALIGN;
use crate::ledger::MAX_BLOCKS;

/// The owner's shared state: the region, its lease table (one slot per importing process),
/// the block table, and the books.
struct Owner {
    ctx: GpuContext,
    generation: u64,
    uuid: [u8; 16],
    /// Who holds which buffer: the block table, the lease table and the books.
    ledger: Ledger,
    /// Set by [`IpcArena::read_only_for_importers`]: every handle says so.
    read_only: AtomicBool,
    // Last: released after the tables are marked closed (see Drop).
    memory: VmmMemory,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if !self.ledger.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // Every buffer is gone (each holds the owner), so every block is retired. Refuse new
        // imports; the memory is released below, and the driver keeps it while importers map it.
        self.ledger.begin_close();
    }
}

/// A region of device memory shared with other processes once, from which typed buffers are
/// allocated and shared each for the price of a handle.
///
/// Opening an [`IpcBuffer`](crate::IpcBuffer) maps memory every time (58 µs for a legacy
/// handle, 100 µs for a POSIX-fd one, on an H200); a peer that imported an arena opens each of
/// its buffers without a driver call (161 ns, open + drop, measured in the same run).
///
/// Created with [`new`](Self::new) (a [`HandleType::PosixFd`] allocation, `cuMemCreate`),
/// sent to peers with [`FdSocket::send_arena`](crate::fd::FdSocket::send_arena) (or
/// [`export_fd`](Self::export_fd) and any `SCM_RIGHTS` channel), carved with
/// [`alloc`](Self::alloc). `IpcArena` is `Send` and `Sync`; it can be shared between threads
/// (allocation takes a lock).
///
/// # Freeing and reuse
///
/// A handle opens only while its buffer is live: freeing moves the block to a new generation,
/// so the handle is [`Error::StaleHandle`] from then on, even after the range holds another
/// buffer. A freed buffer's range is reused only once no importer holds a view of it: until
/// then it is *quarantined*. Dropping an [`ArenaBuffer`] never waits; the range comes back at a
/// later [`IpcArena::alloc`] or [`IpcArena::collect`] once its views are gone, or once the
/// processes holding them are proven dead. The protocol, and what each side sees when the other
/// is killed at each step, is in `src/ledger/table.rs`.
///
/// # Lifetime
///
/// The region is driver memory shared by file descriptor: the driver keeps it while any
/// process maps it. An [`ImportedArena`] (and every view of it) stays valid after the owner
/// drops its arena or dies; views of buffers the owner freed stay valid too (their range is not
/// reused while they exist). Only new opens fail.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::arena::IpcArena;
/// use cuda_ipc::fd::{FdListener, PeerPolicy, SocketName};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let arena = IpcArena::new(&ctx, 256 << 20)?;
/// let listener = FdListener::bind(SocketName::Abstract("kv".into()), PeerPolicy::SameUid)?;
/// let peer = listener.accept(Duration::from_secs(5))?;
/// peer.send_arena(&arena, Duration::from_secs(5))?; // once per peer
///
/// let block = arena.alloc_zeroed::<f32>(4096)?;
/// peer.send(block.handle().as_bytes(), &[], Duration::from_secs(5))?; // per buffer: bytes only
/// # Ok(()) }
/// ```
pub struct IpcArena {
    owner: Arc<Owner>,
}

impl IpcArena {
    /// The most buffers one arena holds at a time (live ones, and freed ones whose importers
    /// still hold views): the size of its shared block table.
    pub const MAX_BUFFERS: usize = MAX_BLOCKS;

    /// Every buffer starts on a multiple of this many bytes and takes a multiple of it (what
    /// `cuMemAlloc` guarantees; element types aligned to more are refused).
    pub const ALIGN: u64 = ARENA_ALIGN;

    /// Allocate a region of at least `bytes` on `ctx`'s device (`cuMemCreate` with POSIX-fd
    /// export, rounded up to the allocation granularity, mapped read-write for that device),
    /// with a block table for up to [`MAX_BUFFERS`](Self::MAX_BUFFERS) buffers at a time.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for zero bytes; [`Error::Unsupported`] when the device cannot
    /// export virtual memory as file descriptors; [`Error::Cuda`] naming the failing call of
    /// the allocation; a shared-memory error creating the tables.
    #[doc(alias = "cuMemCreate")]
    pub fn new(ctx: &GpuContext, bytes: usize) -> Result<Self> {
        Self::with_max_buffers(ctx, bytes, MAX_BLOCKS)
    }

    /// [`new`](Self::new) with at most `max_buffers` (1 to [`MAX_BUFFERS`](Self::MAX_BUFFERS))
    /// buffers live or quarantined at a time.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::InvalidArgument`] for `max_buffers` out of range.
    pub fn with_max_buffers(ctx: &GpuContext, bytes: usize, max_buffers: usize) -> Result<Self> {
        let call = "IpcArena::new";
        crate::memory::allocation_bytes::<u8>(call, bytes)?;
        ArgumentDefect::check_range(
            call,
            "max_buffers",
            max_buffers as u64,
            1,
            MAX_BLOCKS as u64,
        )?;
        if !crate::vmm::supports_posix_fd(ctx.device())? {
            return Err(Error::Unsupported {
                device: ctx.ordinal(),
                what: "hold an IpcArena (virtual memory exported as POSIX file descriptors)",
                missing: Capability::VmmPosixFd,
            });
        }
        let mut token = [0u8; 16];
        token[..8].copy_from_slice(&os::random_u64()?.to_le_bytes());
        token[8..].copy_from_slice(&os::random_u64()?.to_le_bytes());
        let uuid = ctx.uuid();
        let memory = VmmMemory::create(ctx, bytes)?;
        let capacity = memory.size() as u64;
        let ledger = Ledger::create(&token, capacity, max_buffers)?;
        Ok(Self {
            owner: Arc::new(Owner {
                ctx: ctx.clone(),
                generation: crate::envelope::GENERATION.fetch_add(1, StdOrdering::Relaxed),
                uuid,
                ledger,
                read_only: AtomicBool::new(false),
                memory,
            }),
        })
    }

    /// Allocate `len` elements of `T` from the arena (contents unspecified: whatever the range
    /// last held), placed at a multiple of [`ALIGN`](Self::ALIGN) bytes. Ranges freed earlier whose
    /// views are all gone are reused first.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for zero elements, an overflowing size, or a `T` aligned to
    /// more than [`ALIGN`](Self::ALIGN); [`Error::ArenaFull`] when no free range holds it or every
    /// block index is in use (after reclaiming what importers released or died holding).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::arena::IpcArena;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let arena = IpcArena::new(&ctx, 64 << 20)?;
    /// let block = arena.alloc::<f32>(4096)?;
    /// block.copy_from_host(&vec![1.0; 4096])?;
    /// let handle = block.handle(); // 80 bytes for any peer that imported the arena
    /// drop(block); // the handle is stale from here on; the range waits for peers' views
    /// # let _ = handle;
    /// # Ok(()) }
    /// ```
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<ArenaBuffer<T>> {
        let call = "IpcArena::alloc";
        let align = std::mem::align_of::<T>() as u64;
        ArgumentDefect::check_range(call, "element alignment", align, 1, ARENA_ALIGN)?;
        let bytes = crate::memory::allocation_bytes::<T>(call, len)? as u64;
        let owner = &self.owner;
        let label = Label::new(
            ExportKind::Arena,
            &owner.uuid,
            owner.read_only.load(StdOrdering::Relaxed),
        );
        let placed = owner
            .ledger
            .alloc(bytes, label)
            .map_err(|full| Error::ArenaFull {
                requested: bytes,
                free: full.free,
                quarantined: full.quarantined,
                buffers: full.buffers,
                max_buffers: owner.ledger.max_buffers(),
            })?;
        Ok(ArenaBuffer {
            slice: GpuSlice::new(owner.ctx.clone(), owner.memory.ptr() + placed.offset, len),
            owner: owner.clone(),
            placed,
        })
    }

    /// [`alloc`](Self::alloc), then set every byte of the buffer's range to zero (on the
    /// device when this returns), so a peer never sees what the range held before.
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc) and [`GpuSlice::memset_bytes`].
    pub fn alloc_zeroed<T: Pod>(&self, len: usize) -> Result<ArenaBuffer<T>> {
        let buf = self.alloc(len)?;
        buf.memset_bytes(0)?;
        Ok(buf)
    }

    /// The arena's handle and a new descriptor of its memory (`cuMemExportToShareableHandle`), for
    /// a peer's [`ImportedArena::open_fd`].
    /// [`FdSocket::send_arena`](crate::fd::FdSocket::send_arena) does this and sends both.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemExportToShareableHandle`.
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export_fd(&self) -> Result<(IpcArenaHandle, OwnedFd)> {
        let owner = &self.owner;
        let mut cuda = [0u8; 64];
        cuda[..8].copy_from_slice(&(owner.memory.size() as u64).to_le_bytes());
        let env = Envelope {
            elem_size: 1,
            elem_align: 1,
            type_tag: type_tag_of::<u8>(),
            len: owner.memory.size() as u64,
            device_uuid: owner.uuid,
            token: owner.ledger.token(),
            handle_type: HandleType::PosixFd.code(),
            ..Envelope::exported(KIND_ARENA, owner.generation, owner.ctx.ordinal(), cuda)
        }
        .seal();
        let fd = owner.memory.export_fd()?;
        let read_only = owner.read_only.load(StdOrdering::Relaxed);
        Ok((
            Handle::from_envelope(env).marked_read_only_if(read_only),
            fd,
        ))
    }

    /// Share this arena **read-only**: every handle it exports from now on says so
    /// ([`Handle::is_read_only`]), and importers must open it with [`ReadOnlyArena`] (or
    /// [`FdSocket::recv_arena_read_only`](crate::fd::FdSocket::recv_arena_read_only)), whose
    /// mapping is `PROT_READ`: the GPU refuses their writes. A read-write open is refused
    /// ([`TypeConflict::ReadOnly`](crate::error::TypeConflict::ReadOnly)). The owner still
    /// allocates and writes as before.
    ///
    /// This protects the data against bugs in cooperating readers, not against a hostile
    /// process: whoever holds the descriptor could import the memory read-write itself
    /// (SECURITY.md).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::arena::IpcArena;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let weights = IpcArena::new(&ctx, 1 << 30)?.read_only_for_importers();
    /// let (handle, _fd) = weights.export_fd()?;
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

    /// The arena's size in bytes (the request rounded up to the allocation granularity).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.owner.memory.size()
    }

    /// Bytes free now (not necessarily contiguous; not counting quarantined ranges).
    #[must_use]
    pub fn free_bytes(&self) -> usize {
        self.owner.ledger.free_bytes() as usize
    }

    /// Give back the ranges of freed buffers whose views are all gone, and reap every importer
    /// proven dead (its views, and its slot among the
    /// [`MAX_IMPORTERS`](crate::IpcBuffer::MAX_IMPORTERS) an arena tracks); returns the bytes still
    /// waiting for live importers. [`alloc`](Self::alloc) does the first part itself when it runs
    /// short; call this now and then where importers come and go (each one that dies keeps its slot
    /// until reaped).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn tick(arena: &cuda_ipc::arena::IpcArena) {
    /// // Now and then, where importers come and go:
    /// let waiting = arena.collect();
    /// println!("{waiting} bytes of freed buffers still viewed by live importers");
    /// # }
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "it frees what it can; the count is information"
    )]
    pub fn collect(&self) -> usize {
        usize::try_from(self.owner.ledger.collect()).unwrap_or(usize::MAX)
    }

    /// The pids of live processes that imported the arena.
    #[must_use]
    pub fn importers(&self) -> Vec<u32> {
        self.owner.ledger.holders()
    }

    /// The context the arena lives in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.owner.ctx
    }

    /// Let the device of `ctx`, another context of this process, read and write the whole
    /// arena — every buffer in it, now and later — from kernels and copies there
    /// (`cuMemSetAccess` on the region's mapping). The arena is mapped for its own context's
    /// device only: peer access between contexts does not reach virtual memory, and without
    /// this, copies from another device fail with `CUDA_ERROR_INVALID_VALUE` and kernels fault.
    /// Granting the arena's own device, or a device granted before, does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::DeviceNotReachable`] when `ctx`'s device cannot access the arena's device
    /// (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming `cuMemSetAccess`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::arena::IpcArena;
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let (gpu0, gpu1) = (GpuContext::new(0)?, GpuContext::new(1)?);
    /// let arena = IpcArena::new(&gpu0, 64 << 20)?;
    /// arena.grant_access(&gpu1)?; // kernels on GPU 1 may now touch every buffer in it
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.owner.memory.grant(ctx)
    }
}

impl std::fmt::Debug for IpcArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcArena")
            .field("capacity", &self.capacity())
            .field("device", &self.owner.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// A typed buffer allocated from an [`IpcArena`]; it dereferences to its [`GpuSlice`] (copies,
/// memsets, the device address) and shares itself through [`handle`](Self::handle).
///
/// Dropping it frees its range in the arena without waiting: handles of it are stale from then
/// on, and the range is reused once no importer holds a view of it. As for every buffer of this
/// crate, work enqueued on it must complete before it is dropped (see
/// [asynchronous work](GpuSlice#asynchronous-work)).
pub struct ArenaBuffer<T: Pod> {
    slice: GpuSlice<T>,
    owner: Arc<Owner>,
    placed: Placed,
}

crate::slice::deref_to!(ArenaBuffer<T> => slice: GpuSlice<T>);

impl<T: Pod> ArenaBuffer<T> {
    /// The handle a process that imported the arena opens with [`ImportedArena::open`]: 80
    /// bytes of plain data ([`ArenaHandle::as_bytes`]), no descriptor.
    #[must_use]
    pub fn handle(&self) -> ArenaHandle<T> {
        ArenaHandle::from_raw(envelope::seal(RawArenaHandle {
            elem_size: std::mem::size_of::<T>() as u32,
            elem_align: std::mem::align_of::<T>() as u32,
            type_tag: type_tag_of::<T>(),
            token: self.owner.ledger.token(),
            index: self.placed.index,
            generation: self.placed.generation,
            offset: self.placed.offset,
            len: self.slice.len as u64,
            ..Zeroable::zeroed()
        }))
    }

    /// Byte offset of the buffer in its arena.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.placed.offset as usize
    }

    /// Whether another process (or an import in this one) holds a view of this buffer now.
    #[must_use]
    pub fn is_viewed(&self) -> bool {
        self.owner.ledger.is_viewed(&self.placed)
    }
}

impl<T: Pod> Drop for ArenaBuffer<T> {
    fn drop(&mut self) {
        if !self.owner.ledger.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        self.owner.ledger.free(self.placed);
    }
}

impl<T: Pod> std::fmt::Debug for ArenaBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("offset", &self.placed.offset)
            .field("generation", &self.placed.generation)
            .finish_non_exhaustive()
    }
}

/// The bytes of an [`ArenaHandle`] (its fields are this crate's; the type is named only by
/// [`BufferKind`](crate::handle::BufferKind)).
#[doc(hidden)]
#[allow(missing_debug_implementations)] // its BufferHandle prints what may be printed
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct RawArenaHandle {
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
    offset: u64,
    len: u64,
    checksum: u64,
}

const _: () = assert!(std::mem::size_of::<RawArenaHandle>() == 80);

// "CIPA" little-endian, layout version 1.
envelope::sealed_format!(
    RawArenaHandle,
    envelope::Format {
        magic: u32::from_le_bytes(*b"CIPA"),
        version: 1,
        versions: &[1],
        what: "an arena handle",
    },
    |raw| raw.reserved0 == 0 && raw.reserved1 == 0
);

/// A buffer of an [`IpcArena`], as another process names it: arena id, block index, generation,
/// byte offset, length and the element type's size, alignment and tag, checksummed; 80 bytes of
/// plain data ([`as_bytes`](BufferHandle::as_bytes) / [`from_bytes`](BufferHandle::from_bytes)).
/// It maps nothing by itself: only a process that imported the arena (which took its
/// descriptor) can open it, with [`ImportedArena::open`].
pub type ArenaHandle<T> = BufferHandle<IpcArena, T>;

impl crate::handle::BufferKind for IpcArena {
    type Raw = RawArenaHandle;
    const NAME: &'static str = "ArenaHandle";
    fn open(bytes: &[u8]) -> Result<RawArenaHandle> {
        envelope::open(bytes)
    }
    fn len_and_generation(raw: &RawArenaHandle) -> (u64, u64) {
        (raw.len, raw.generation)
    }
    fn describe(raw: &RawArenaHandle, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("block", &raw.index).field("offset", &raw.offset);
    }
}

/// An exported [`IpcArena`]: the [`Handle`] that travels with its file descriptor
/// ([`IpcArena::export_fd`]), 184 bytes. Without the descriptor it maps nothing.
pub type IpcArenaHandle = Handle<IpcArena>;

impl Handle<IpcArena> {
    /// The arena's size in bytes.
    #[must_use]
    pub fn capacity(&self) -> usize {
        usize::try_from(self.env.len).unwrap_or(usize::MAX)
    }
}

/// Imported arenas of this process by (token, context, access), so that a second import
/// shares the mapping, the lease and the importer bit of the first. A read-only import and a
/// read-write one of the same arena are two mappings (and two importer slots): a read-write
/// view must never be handed a mapping the GPU refuses writes through, nor a read-only one a
/// mapping it allows them through.
type ImportKey = ([u8; 16], usize, Access);
/// An import whose arena is closing (or that is being dropped) is not shared: a new import maps
/// a range of its own beside it.
static IMPORTS: ImportCache<ImportKey, Import> = ImportCache::new(Dying::Coexist);

struct Import {
    ctx: GpuContext,
    key: ImportKey,
    base: u64,
    capacity: u64,
    exporter: ProcessIdentity,
    // Held for the mapping (`base`), unmapped before the holdings and their lease go (field
    // order is drop order).
    memory: VmmMemory,
    /// The arena's block table, our lease and bit in it, and per block we view the range its
    /// first open checked, (offset, published bytes).
    holdings: Holdings<(u64, u64)>,
}

impl Drop for Import {
    fn drop(&mut self) {
        IMPORTS.forget(&self.key);
    }
}

/// An [`IpcArena`] imported from another process (or this one): the whole region mapped once;
/// each of its buffers opens with [`open`](Self::open) without a driver call.
///
/// `ImportedArena` is `Send` and `Sync`, cheap to clone (one shared import), and every
/// [`ArenaView`] keeps the import alive.
#[derive(Clone)]
pub struct ImportedArena {
    import: Arc<Import>,
}

impl ImportedArena {
    /// Map an arena from its handle and the descriptor its owner sent with it
    /// (`cuMemImportFromShareableHandle`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`
    /// for `ctx`'s device) and take an importer slot in its lease table. `fd` is consumed.
    /// Importing the same arena again in the same context shares the first import.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`]; [`Error::PeerGone`] (the exporter); [`Error::DeviceNotReachable`];
    /// [`Error::StaleHandle`] when the owner dropped the arena; [`Error::TooManyImporters`]; then
    /// as [`ImportedBuffer::open_fd`](crate::ImportedBuffer::open_fd) for the descriptor;
    /// [`Error::HandleTypeMismatch`]
    /// ([`TypeConflict::ReadOnly`](crate::error::TypeConflict::ReadOnly)) when the owner shares the
    /// arena read-only ([`ReadOnlyArena::open_fd`](crate::arena::ReadOnlyArena::open_fd) opens it).
    #[doc(alias = "cuMemImportFromShareableHandle")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcArenaHandle, fd: OwnedFd) -> Result<Self> {
        handle.refuse_if_read_only()?;
        Self::open_fd_with(ctx, handle, fd, Access::ReadWrite)
    }

    /// [`open_fd`](Self::open_fd), mapping with `access` (read-only for
    /// [`ReadOnlyArena`]).
    pub(crate) fn open_fd_with(
        ctx: &GpuContext,
        handle: &IpcArenaHandle,
        fd: OwnedFd,
        access: Access,
    ) -> Result<Self> {
        let Admitted {
            exporter,
            memory_device,
            trace: _open,
        } = handle.admit(ctx, true)?;
        let env = &handle.env;
        let key: ImportKey = (env.token, ctx.as_raw() as usize, access);
        // A hit whose arena is closing is not shared: a new import is made beside it.
        let vacancy = match IMPORTS.entry(&key) {
            Entry::Live(hit) if !hit.closing() => return Ok(Self { import: hit }),
            Entry::Live(_) => IMPORTS.vacancy(&key),
            Entry::Vacant(vacancy) => vacancy,
        };
        let holdings = Holdings::open_with_table(&env.token, env.vmm_bytes(), env.generation)?;
        let bytes = usize::try_from(env.vmm_bytes()).unwrap_or(usize::MAX);
        let memory = VmmMemory::import(ctx, fd, bytes, memory_device, access)?;
        let import = vacancy.fill(Arc::new(Import {
            ctx: ctx.clone(),
            key,
            base: memory.ptr(),
            capacity: memory.size() as u64,
            exporter,
            holdings,
            memory,
        }));
        Ok(Self { import })
    }

    /// Open one buffer of the arena: checks the handle (checksum, element type, this arena,
    /// bounds), then enters the block in the shared table (two atomic read-modify-writes) —
    /// no driver call, no mapping. Views of one buffer in one process share the block's entry.
    ///
    /// # Errors
    ///
    /// [`Error::CorruptHandle`] for a damaged handle, one of another arena, or one whose range
    /// does not match what the owner published; [`Error::TypeMismatch`];
    /// [`Error::StaleHandle`] when the buffer was freed (even if its range or block now holds
    /// another buffer); [`Error::PeerGone`] (the exporter) when the owner died (views opened
    /// before stay mapped).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_ipc::{GpuContext};
    /// use cuda_ipc::arena::ArenaHandle;
    /// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
    ///
    /// # fn main() -> cuda_ipc::Result<()> {
    /// let ctx = GpuContext::new(0)?;
    /// let name = SocketName::Abstract("kv".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let arena = socket.recv_arena(&ctx, Duration::from_secs(5))?; // once
    /// let bytes = socket.recv(Duration::from_secs(5))?.payload; // per buffer
    /// match arena.open(&ArenaHandle::<f32>::from_bytes(&bytes)?) {
    ///     Ok(view) => println!("{} floats at {:#x}", view.len(), view.as_raw_ptr()),
    ///     Err(cuda_ipc::Error::StaleHandle { .. }) => println!("freed before we got to it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn open<T: Pod>(&self, handle: &ArenaHandle<T>) -> Result<ArenaView<T>> {
        let import = &self.import;
        // A `ArenaHandle`'s structure was checked when it was made (`from_bytes`) or sealed by
        // this crate; the rest is checked here.
        let h = &handle.raw;
        let (bytes, len) = check_buffer_of::<T>(
            (h.elem_size, h.elem_align, h.type_tag),
            h.len,
            (&h.token, &import.key.0),
            "arena",
        )?;
        let corrupt = |detail: String| Error::corrupt_handle(HandleDefect::Layout { detail });
        let memory = |detail: String| Error::corrupt_handle(HandleDefect::Memory { detail });
        let end = h.offset.checked_add(bytes);
        if !h.offset.is_multiple_of(ARENA_ALIGN) || end.is_none_or(|e| e > import.capacity) {
            return Err(corrupt(format!(
                "bytes {}..+{bytes} do not lie on the arena's {}-byte grid inside its {} bytes",
                h.offset, ARENA_ALIGN, import.capacity
            )));
        }
        // Every open asks after the owner, as the arena's import did (a pinned pidfd's answer).
        crate::process::check_exporter_alive(&import.exporter, true)?;
        let range_mismatch = |offset: u64, published: u64| {
            memory(format!(
                "the handle says bytes {}..+{bytes}; the owner published {offset}..+{published}",
                h.offset
            ))
        };
        // A second handle of a block we view is held to the range the first open checked.
        let fits = |offset: u64, published: u64| {
            if offset != h.offset || published < bytes {
                return Err(range_mismatch(offset, published));
            }
            Ok(())
        };
        match import.holdings.enter(h.index, h.generation, || {})? {
            Holding::Held(view) => {
                let &(offset, published) = view.kept();
                fits(offset, published)?;
                view.count();
            }
            Holding::Entered(first) => {
                let (offset, published) = first.block().range();
                fits(offset, published)?;
                first.fill((offset, published));
            }
        }
        Ok(ArenaView {
            slice: GpuSlice::new(import.ctx.clone(), import.base + h.offset, len),
            import: import.clone(),
            index: h.index,
        })
    }

    /// The arena's size in bytes.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.import.capacity as usize
    }

    /// The process that owns the arena.
    #[must_use]
    pub fn exporter(&self) -> ProcessIdentity {
        self.import.exporter
    }

    /// The context the arena is mapped in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.import.ctx
    }

    /// Let the device of `ctx`, another context of this process, read and write the whole
    /// imported arena — every view of it, now and later — from kernels and copies there
    /// (`cuMemSetAccess` on this process's mapping). The import is mapped for the device of the
    /// context it was opened in only, as [`IpcArena::grant_access`] explains; imports of the
    /// arena in other contexts are mappings of their own. Granting the mapping's own device,
    /// or a device granted before, does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::DeviceNotReachable`] when `ctx`'s device cannot access the arena's device
    /// (`cuDeviceCanAccessPeer`); [`Error::Cuda`] naming `cuMemSetAccess`.
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
    /// let name = SocketName::Abstract("kv".into());
    /// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
    /// let arena = socket.recv_arena(&gpu0, Duration::from_secs(5))?;
    /// arena.grant_access(&gpu1)?; // views' pointers may now go to kernels on GPU 1 too
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.import.memory.grant(ctx)
    }
}

impl Import {
    fn closing(&self) -> bool {
        self.holdings.is_closing()
    }
}

impl std::fmt::Debug for ImportedArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedArena")
            .field("capacity", &self.import.capacity)
            .field("exporter", &self.import.exporter.pid())
            .field("device", &self.import.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// A buffer of an imported arena, opened from its [`ArenaHandle`]; it dereferences to its
/// [`GpuSlice`]. While it (or another view of the same buffer in this process) exists, the
/// owner does not reuse the buffer's range, even after freeing the buffer; dropping the last
/// view lets it. Work enqueued on it must complete before it is dropped (see
/// [asynchronous work](GpuSlice#asynchronous-work)).
pub struct ArenaView<T: Pod> {
    slice: GpuSlice<T>,
    import: Arc<Import>,
    index: u32,
}

crate::slice::deref_to!(ArenaView<T> => slice: GpuSlice<T>);

impl<T: Pod> ArenaView<T> {
    /// Whether the owner still has the buffer (false once it was freed: the view stays valid,
    /// but nobody else will write it for this buffer's purpose any more).
    #[must_use]
    pub fn is_live(&self) -> bool {
        self.import.holdings.is_live(self.index)
    }
}

impl<T: Pod> Drop for ArenaView<T> {
    fn drop(&mut self) {
        if !self.import.holdings.is_home() {
            return; // inherited by a forked child: the parent's (see `process::Home`)
        }
        // The whole arena stays mapped: nothing to unmap for one buffer.
        self.import.holdings.leave(self.index, |_| true);
    }
}

impl<T: Pod> std::fmt::Debug for ArenaView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaView")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("block", &self.index)
            .finish_non_exhaustive()
    }
}

/// The arena's protocol without a GPU, for the multi-process stress test
/// (`tests/arena_stress.rs`: the ledger's, `ledger/testing.rs`), and the handles' reseals for
/// forgery tests. Not part of the API.
#[doc(hidden)]
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __testing;

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests;

impl crate::handle::sealed::Sealed for IpcArena {}
impl crate::handle::HandleKind for IpcArena {
    const NAME: &'static str = "IpcArenaHandle";
    const CODE: u16 = KIND_ARENA;
    type Element = crate::handle::sealed::Untyped;
}
