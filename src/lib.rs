//! Safe, fast CUDA inter-process communication.
//!
//! Processes on one machine share GPU memory and GPU events through the driver's 64-byte IPC
//! handles, pass those handles through POSIX shared memory, and keep in step with a
//! cross-process barrier: the flow of NVIDIA's `simpleIPC` sample. This crate turns that flow
//! into typed RAII wrappers that report errors instead of hanging, crashing or handing back
//! wrong data — each handle a checksummed envelope checked before the driver sees it — and
//! adds what grew from it: memory as file descriptors, arenas and pools, a GPU channel, and
//! peers that do not use this crate (PyTorch, CuPy, cuda.core, C++).
//!
//! | Concept | Type | Underlying calls |
//! | ------- | ---- | ---------------- |
//! | A device's context | [`GpuContext`] | `cuDevicePrimaryCtxRetain`, `cuCtxPushCurrent`/`PopCurrent` |
//! | Shared GPU memory | [`IpcBuffer`] (this process's), [`ImportedBuffer`] (another's), [`IpcMemHandle`] | `cuMemAlloc`, `cuIpcGetMemHandle`, `cuIpcOpenMemHandle(LAZY_ENABLE_PEER_ACCESS)`, `cuIpcCloseMemHandle`, `cuMemFree` |
//! | Shared GPU events | [`IpcEvent`], [`ImportedEvent`], [`GpuEvent`] (what both do), [`IpcEventHandle`] | `cuEventCreate(INTERPROCESS\|DISABLE_TIMING)`, `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`, `cuEventRecord`, `cuStreamWaitEvent`, `cuEventQuery` |
//! | GPU-side signalling (counters) | [`IpcSignal`], [`ImportedSignal`], [`GpuSignal`] (what both do), [`IpcSignalHandle`] | `cuMemAlloc` + IPC as for buffers, `cuStreamWriteValue64`, `cuStreamWaitValue64(GEQ)`, `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS` |
//! | A GPU queue between two processes | [`IpcSender`](crate::channel::IpcSender), [`IpcReceiver`](crate::channel::IpcReceiver), [`IpcChannelHandle`](crate::channel::IpcChannelHandle) | an [`IpcBuffer`] of slots, two [`IpcSignal`]s (`cuStreamWaitValue64`/`cuStreamWriteValue64`), a shared-memory ring, `cuEventRecord` |
//! | Device selection | [`PeerGroup`](crate::device::PeerGroup), [`DeviceInfo`](crate::device::DeviceInfo) | `cuDeviceGetAttribute`, `cuDeviceGetUuid`, `cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess` |
//! | Raw driver calls | [`driver::sys`] | integer `CUresult`s, never a Rust enum; the library loaded at run time |
//! | Streams from any CUDA crate | [`AsStream`], [`RawStream`] | cust's `Stream`, cudarc's `CudaStream`, a raw `CUstream` |
//! | Raw handles for foreign peers (PyTorch, CuPy, C/C++) | [`RawMemHandle`](crate::raw::RawMemHandle), [`RawExport`](crate::raw::RawExport), [`RawImport`](crate::raw::RawImport), [`ImportedBuffer::open_raw`] | `cuIpcGetMemHandle`, `cuIpcOpenMemHandle`, `cuPointerGetAttributes`, `cuPointerGetAttribute` |
//! | Memory another allocator owns (PyTorch's caching allocator and expandable segments, CuPy) | [`ForeignExport`](crate::foreign::ForeignExport), [`FdSocket::send_foreign`](crate::fd::FdSocket::send_foreign), [`FdSocket::recv_foreign`](crate::fd::FdSocket::recv_foreign) | `cuIpcGetMemHandle`, `cuMemRetainAllocationHandle`, `cuMemExportToShareableHandle`, `cuPointerGetAttribute` |
//! | Finding and authenticating a peer on another host (TCP, a shared secret) | [`BootstrapListener`](crate::bootstrap::BootstrapListener), [`bootstrap::connect`], [`Bootstrapped`](crate::bootstrap::Bootstrapped) | — (HMAC-SHA256 over `std::net`) |
//! | NCCL communicators between processes, every wait bounded | [`nccl::Communicator`], [`nccl::UniqueId`] | `ncclCommInitRankConfig` (non-blocking), `ncclSend`, `ncclRecv`, `ncclCommGetAsyncError`, `ncclCommAbort` |
//! | Shared GPU memory as file descriptors (capabilities) | [`HandleType::PosixFd`], [`IpcBuffer::new_with`], [`IpcBuffer::export_fd`], [`ImportedBuffer::open_fd`] | `cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`, `cuMemExportToShareableHandle`, `cuMemImportFromShareableHandle`, `cuMemUnmap`, `cuMemAddressFree`, `cuMemRelease` |
//! | Many buffers through one import | [`IpcArena`](crate::arena::IpcArena), [`ArenaBuffer`](crate::arena::ArenaBuffer), [`ArenaHandle`](crate::arena::ArenaHandle), [`ImportedArena`](crate::arena::ImportedArena), [`ArenaView`](crate::arena::ArenaView) | one `cuMemCreate` region exported once; buffers sub-allocated and opened through a shared block table (no driver call) |
//! | Stream-ordered pools between processes | [`IpcPool`](crate::pool::IpcPool), [`PoolBuffer`](crate::pool::PoolBuffer), [`PoolHandle`](crate::pool::PoolHandle), [`ImportedPool`](crate::pool::ImportedPool), [`PoolView`](crate::pool::PoolView); as buffers: [`HandleType::Pool`], [`IpcBuffer::export_pooled`], [`ImportedBuffer::open_pooled`] | `cuMemPoolCreate`, `cuMemPoolExportToShareableHandle`, `cuMemPoolImportFromShareableHandle`, `cuMemPoolSetAccess`, `cuMemAllocFromPoolAsync`, `cuMemPoolExportPointer`, `cuMemPoolImportPointer`, `cuMemFree(Async)` |
//! | Typed device memory, whoever owns it | [`GpuSlice`] | `cuMemcpy*`, `cuMemsetD8*` |
//! | Another device of the process touching shared memory | `grant_access` on [`IpcBuffer`](IpcBuffer::grant_access), [`ImportedBuffer`](ImportedBuffer::grant_access), [`IpcArena`](crate::arena::IpcArena::grant_access), [`ImportedArena`](crate::arena::ImportedArena::grant_access), [`IpcPool`](crate::pool::IpcPool::grant_access), [`ImportedPool`](crate::pool::ImportedPool::grant_access) | `cuMemSetAccess`, `cuMemPoolSetAccess`, `cuMemPoolGetAccess`, `cuCtxEnablePeerAccess` |
//! | A handle of any export, every check in one place | [`Handle<K>`](Handle) ([`HandleKind`]: `IpcBuffer<T>`, `IpcEvent`, `IpcSignal`, `IpcArena`, `IpcPool`), with the short names [`IpcMemHandle`], [`IpcEventHandle`], [`IpcSignalHandle`], [`IpcArenaHandle`](crate::arena::IpcArenaHandle), [`IpcPoolHandle`](crate::pool::IpcPoolHandle) | a checksummed 184-byte envelope around the driver's 64-byte handle |
//! | A buffer of an arena or a pool, as a peer names it | [`BufferHandle<K, T>`](BufferHandle) ([`BufferKind`]: `IpcArena`, `IpcPool`), with the short names [`ArenaHandle`](crate::arena::ArenaHandle), [`PoolHandle`](crate::pool::PoolHandle) | a checksummed 80- or 136-byte record; no driver call to open |
//! | Pools shared with NVIDIA's cuda.core (and C/C++) | [`ForeignPool`](crate::pool::ForeignPool) (its pool imported, its buffers opened), [`PoolBufferDescriptor`](crate::pool::PoolBufferDescriptor), [`PoolBuffer::descriptor`](crate::pool::PoolBuffer::descriptor) | `cuMemPoolImportFromShareableHandle`, `cuMemPoolImportPointer`, `cuMemPoolExportPointer` |
//! | Passing file descriptors (and buffers) | [`FdListener`](crate::fd::FdListener), [`FdSocket`](crate::fd::FdSocket), [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer), [`FdSocket::recv_buffer`](crate::fd::FdSocket::recv_buffer) | `socket(AF_UNIX, SOCK_SEQPACKET)`, `sendmsg`/`recvmsg` with `SCM_RIGHTS`, `SO_PEERCRED`, `poll` |
//! | Named shared memory | [`ShmRegion`](crate::shm::ShmRegion), [`ShmOptions`](crate::shm::ShmOptions) | `open("/dev/shm/..", O_CREAT\|O_EXCL\|O_NOFOLLOW, 0600)`, `fchmod`, `fallocate`, `fstat`, `mmap`, `unlink` |
//! | What may live there | [`ShmSafe`], [`ShmCell`](crate::shm::ShmCell) | atomics only |
//! | Barrier across processes | [`ProcessBarrier`](crate::barrier::ProcessBarrier), [`BarrierState`](crate::barrier::BarrierState) | atomics, shared `futex(FUTEX_WAIT/WAKE)`, `/proc/<pid>/stat` |
//! | A process that survives pid reuse | [`ProcessIdentity`] | `/proc/<pid>/stat` (pid + start time) |
//!
//! # Layout
//!
//! The crate root holds what every user of the crate touches: [`GpuContext`], [`GpuSlice`], the
//! three shared objects and their roles ([`IpcBuffer`]/[`ImportedBuffer`],
//! [`IpcEvent`]/[`ImportedEvent`], [`IpcSignal`]/[`ImportedSignal`]), [`Handle`] and its short
//! names, [`ReadOnlyBuffer`], [`Error`], [`ProcessIdentity`], [`AsStream`], [`collect_deferred`]
//! and [`ShmSafe`]. Each subsystem is a module named after it: [`arena`], [`pool`], [`channel`],
//! [`fd`] (descriptor passing), [`shm`] (named shared memory), [`barrier`], [`raw`] (foreign
//! peers' handles), [`foreign`] (memory another allocator owns), [`bootstrap`] and [`nccl`]
//! (across hosts), [`device`], [`probe`], [`inspect`] (who holds what now), [`error`] (the
//! reasons an [`Error`] carries) and [`driver`] (raw driver calls).
//!
//! # Guides
//!
//! Each module's page carries its guide: [`fd`] (the three handle kinds, memory shared as file
//! descriptors), [`arena`] (many buffers through one import, sharing read-only), [`pool`]
//! (stream-ordered pools, also with NVIDIA's cuda.core), [`channel`] (the GPU channel and
//! broadcast), [`raw`] and [`foreign`] (PyTorch, CuPy and C++
//! peers), [`bootstrap`] and [`nccl`] (across machines), [`shm`] and [`barrier`] (the host
//! side), [`error`] (freeing, and what errors say), [`probe`] (what a machine allows),
//! [`inspect`] (what is holding my memory?).
//!
//! # Lifetime model
//!
//! - A [`ShmRegion`](crate::shm::ShmRegion) created by this process **owns its name** and
//!   unlinks it on drop; an opened one does not. Unlinking removes the name; mappings stay
//!   valid until dropped.
//! - A [`ProcessBarrier`](crate::barrier::ProcessBarrier) borrows the
//!   [`BarrierState`](crate::barrier::BarrierState) it joined (so it cannot outlive the region)
//!   and gives up its participant slot on drop.
//! - Nothing read from shared memory is trusted: the region header is checksummed and
//!   validated field by field before the payload is mapped, and the barrier validates its
//!   state on every read that could index or loop.
//! - Every GPU resource holds its [`GpuContext`] and tears down in it. Each shared object has
//!   one type per role: the exporter's ([`IpcBuffer`], [`IpcEvent`], [`IpcSignal`],
//!   [`IpcArena`](crate::arena::IpcArena), [`IpcPool`](crate::pool::IpcPool)) and the
//!   importer's ([`ImportedBuffer`], [`ImportedEvent`], [`ImportedSignal`],
//!   [`ImportedArena`](crate::arena::ImportedArena), [`ImportedPool`](crate::pool::ImportedPool)),
//!   so exporting an import or closing what another process owns does not compile. An
//!   [`IpcBuffer`] is freed only when no live process maps it (leases): dropping it never
//!   waits — the free is deferred until its last importer unmaps or dies, then done at the
//!   next allocation, export or [`collect_deferred`] —; an [`ImportedBuffer`] is one view of a
//!   per-process mapping that is closed when the last view drops. A handle names one
//!   export: once that buffer is freed, opening the handle fails with [`Error::StaleHandle`],
//!   even if a new buffer sits at the same address. A [`HandleType::PosixFd`] buffer's memory is
//!   reference-counted by the driver across processes: the exporter's drop returns at once, and
//!   each importer's mapping keeps the memory until it is dropped.
//! - An [`IpcArena`](crate::arena::IpcArena) or [`IpcPool`](crate::pool::IpcPool) is shared
//!   once; its buffers are opened by handle. Freeing a buffer never waits: its handles are
//!   stale at once, and its range (or pool allocation) is reused (freed) only once no importer
//!   holds a view of it — until then it is quarantined, and importers proven dead are reaped.
//!   Views stay valid after their owner frees or exits.
//!
//! # Threading
//!
//! [`ShmRegion`](crate::shm::ShmRegion), [`ProcessBarrier`](crate::barrier::ProcessBarrier),
//! [`GpuContext`], [`IpcBuffer`], [`IpcEvent`], [`IpcSignal`] (and their imported
//! counterparts), [`IpcArena`](crate::arena::IpcArena), [`IpcPool`](crate::pool::IpcPool) and
//! their buffers and views, [`FdListener`](crate::fd::FdListener),
//! [`FdSocket`](crate::fd::FdSocket) and [`Error`] are `Send` and `Sync`.
//! [`IpcSender`](crate::channel::IpcSender) and [`IpcReceiver`](crate::channel::IpcReceiver) are
//! `Send` but not `Sync`: each end of a channel is driven by one thread at a time (move it,
//! don't share it), and so is a [`Listening`](crate::channel::Listening) end; a
//! [`WaitSet`](crate::wait::WaitSet) is `Send` and `Sync`. Each of these statements is a
//! compile-time assertion in the crate (`src/threading.rs`), so the docs cannot drift from
//! the types. Shared memory is reached only through atomics ([`ShmSafe`]), so it can be read
//! and written from any thread of any process.
//!
//! # Platform
//!
//! Linux: `/dev/shm`, futexes, pidfds and `/proc` are Linux interfaces, as is CUDA's legacy IPC.
//! The crate links nothing CUDA: it loads the driver library (`libcuda.so.1`) the first time a
//! GPU entry point runs ([`driver::library_path`]). The host-side types work without a driver or
//! a GPU; without a driver library every GPU entry point reports [`Error::DriverNotFound`],
//! without a GPU [`Error::NoDevice`]. CUDA contexts are current per thread: every GPU method
//! pushes its own context for its driver calls and pops it.
//!
//! # Features
//!
//! - `cust` (opt-in): interop with cust 0.3 — its streams are [`AsStream`],
//!   `GpuContext::from_cust`, `IpcBuffer::device_ptr` for cust's `launch!`. cust links
//!   `libcuda` at build time; without this feature nothing CUDA is needed to build.
//! - `cudarc`: interop with cudarc 0.19 — its streams are [`AsStream`],
//!   `GpuContext::from_cudarc`, and an [`IpcBuffer`] is a kernel argument of its launch builder.
//!   It enables no cudarc CUDA-version or linking feature: as cudarc asks, the application
//!   picks them in its own `cudarc` dependency (`cuda-12080` and `dynamic-loading`, say).
//! - `async`: `async` waits for any runtime — a listening channel end's `recv_async` /
//!   `acquire_async`, `FdSocket::recv_async`, `FdListener::accept_async` — woken by one reactor
//!   thread per process; no runtime dependency. Without it, every waiting object still exposes
//!   its descriptor (`AsFd`) for tokio's `AsyncFd`, smol's `Async` or a
//!   [`WaitSet`](crate::wait::WaitSet): see the channel guide.
//! - `tracing`: a `tracing` span or event at `DEBUG` level for every export, open (cache hit or
//!   miss, bytes, exporter), close, deferred free, wait (what, how long, how it ended) and
//!   peer death seen — listed in the [`inspect`] guide. Off, they compile to nothing.
//!
//! # Examples
//!
//! GPU memory shared between two processes (what `examples/hello_ipc.rs` runs): the exporter
//! writes, hands over the handle's bytes any way it likes, and keeps the buffer alive; the
//! importer opens the same memory and reads it.
//!
//! ```no_run
//! use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle};
//!
//! // In the exporting process:
//! fn export(ctx: &GpuContext) -> cuda_ipc::Result<(IpcBuffer<f32>, Vec<u8>)> {
//!     let buf = IpcBuffer::<f32>::new(ctx, 1 << 20)?;
//!     buf.copy_from_host(&vec![1.5; 1 << 20])?;
//!     let bytes = buf.handle()?.as_bytes().to_vec(); // 184 bytes: a socket, a region, a file...
//!     Ok((buf, bytes)) // keep `buf` while the importer uses it
//! }
//!
//! // In the importing process:
//! fn import(ctx: &GpuContext, bytes: &[u8]) -> cuda_ipc::Result<f32> {
//!     let handle = IpcMemHandle::<f32>::from_bytes(bytes)?; // checked: size, kind, checksum
//!     let buf = ImportedBuffer::open(ctx, &handle)?; // maps the exporter's memory
//!     let mut host = vec![0.0f32; buf.len()];
//!     buf.copy_to_host(&mut host)?;
//!     Ok(host[0])
//! }
//! # fn main() {}
//! ```
//!
//! A parent creates a region holding a barrier and a value; children open it by name, join the
//! barrier, and read the value after the barrier (no GPU needed):
//!
//! ```no_run
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use cuda_ipc::{ShmSafe};
//! use cuda_ipc::barrier::{BarrierState, ProcessBarrier};
//! use cuda_ipc::shm::ShmOptions;
//!
//! #[derive(ShmSafe)]
//! #[repr(C)]
//! struct Shared {
//!     barrier: BarrierState,
//!     value: AtomicU64,
//! }
//!
//! fn parent(children: u32) -> cuda_ipc::Result<String> {
//!     let region = ShmOptions::new("demo")
//!         .random_suffix(true)
//!         .create_with(|s: &Shared| s.barrier.init(children))?;
//!     // ...start the children with `region.name()`, keep `region` alive until they exit...
//!     Ok(region.name().to_owned())
//! }
//!
//! fn child(name: &str, id: u64) -> cuda_ipc::Result<()> {
//!     let region = ShmOptions::new(name).open::<Shared>()?;
//!     let barrier = ProcessBarrier::join(&region.barrier)?;
//!     region.value.fetch_add(id, Ordering::AcqRel);
//!     barrier.wait()?; // every child has added its id
//!     println!("sum = {}", region.value.load(Ordering::Acquire));
//!     Ok(())
//! }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
// docs.rs (nightly, `--cfg docsrs`): a badge on every item behind a feature, and none for the
// model checker's internal `cfg(cuda_ipc_loom)`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(docsrs, doc(auto_cfg(hide(cuda_ipc_loom))))]
#![warn(missing_docs)]

pub mod arena;
pub mod barrier;
pub mod bootstrap;
mod buffer;
pub mod channel;
mod context;
pub mod device;
pub mod driver;
mod envelope;
pub mod error;
mod event;
pub mod fd;
pub mod foreign;
mod handle;
mod handle_type;
pub mod inspect;
mod interop;
mod ledger;
mod memory;
pub mod nccl;
mod os;
mod owned_slot;
mod poll;
pub mod pool;
pub mod probe;
mod process;
pub mod raw;
#[cfg(feature = "async")]
mod reactor;
mod read_only;
pub mod shm;
mod shm_safe;
mod signal;
mod slice;
mod socket_objects;
mod stream;
mod sync;
#[cfg(not(cuda_ipc_loom))]
mod threading;
mod trace;
mod vmm;
pub mod wait;

pub use buffer::{ImportedBuffer, IpcBuffer, IpcMemHandle};
pub use context::GpuContext;
pub use error::{CloseError, Error, Result};
pub use event::{GpuEvent, ImportedEvent, IpcEvent, IpcEventHandle};
pub use handle::{BufferHandle, BufferKind, Handle, HandleKind, HandleType};
pub use ledger::{DeferredFrees, collect_deferred};
pub use process::ProcessIdentity;
pub use read_only::ReadOnlyBuffer;
pub use shm_safe::ShmSafe;
pub use signal::{GpuSignal, ImportedSignal, IpcSignal, IpcSignalHandle};
pub use slice::{GpuSlice, ReadOnlySlice};
pub use stream::{AsStream, RawStream};

/// The `bytemuck` this crate's element bounds (`T: Pod`) are written against, re-exported so
/// that an application derives [`Pod`](bytemuck::Pod) and [`Zeroable`](bytemuck::Zeroable)
/// for its element types from the same version, whatever `bytemuck` it depends on itself
/// (or without depending on it: the derives then name this path with
/// `#[bytemuck(crate = "cuda_ipc::bytemuck")]`).
///
/// # Examples
///
/// ```
/// use cuda_ipc::bytemuck::{Pod, Zeroable};
///
/// #[derive(Clone, Copy, Pod, Zeroable)]
/// #[bytemuck(crate = "cuda_ipc::bytemuck")]
/// #[repr(C)]
/// struct Particle {
///     position: [f32; 3],
///     mass: f32,
/// }
///
/// fn element<T: Pod>() {}
/// element::<Particle>(); // fit for an `IpcBuffer<Particle>`
/// ```
pub use bytemuck;

/// Hooks for this crate's own tests, fuzz targets and benches: the shared-memory protocols
/// without a GPU, and handle forgers. Not part of the API: no stability, no documentation
/// promises.
#[doc(hidden)]
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __private {
    pub use crate::arena::__testing as arena;
    pub use crate::channel::__testing as channel;
    #[cfg(fuzzing)]
    pub use crate::channel::fuzz_reseal_channel as reseal_channel;
    pub use crate::foreign::__testing as foreign;
    pub use crate::handle::reseal;
    pub use crate::inspect::parse::parse_for_fuzzing as inspect_region;
    pub use crate::ledger::lease_testing as lease;
    pub use crate::ledger::registry_testing as registry;
    pub use crate::pool::__testing as pool;
    /// A subscriber that keeps what it is shown, for the tracing tests.
    #[cfg(feature = "tracing")]
    pub use crate::trace::catch as trace;
    /// The liveness cache, for the tests of the liveness rule.
    pub mod process {
        pub use crate::process::is_alive_cached;
    }
}

/// The README's Rust examples, compiled as doc tests (so the README cannot drift from the API).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
