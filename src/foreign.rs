//! Memory another allocator owns — PyTorch's caching allocator, CuPy's memory pool, a C++
//! peer's `cudaMalloc` or `cuMemCreate` — shared with another process without a copy and
//! without `ptrace`.
//!
//! [`ForeignExport::new`] takes an address and a byte count in this process and asks the
//! driver what the memory is:
//!
//! | The memory | How it is shared | What the importer gets |
//! |------------|------------------|------------------------|
//! | a `cudaMalloc` / `cuMemAlloc` allocation (PyTorch's default allocator, CuPy's pool) | its legacy IPC handle (`cuIpcGetMemHandle` on the allocation's base) and the data's offset: a [`RawExport`] | [`ForeignMemory::Raw`]: a [`RawImport`] to open with [`ImportedBuffer::open_raw`] (`unsafe`: see below) |
//! | virtual memory created with the POSIX-fd handle type, in one mapping or several side by side (PyTorch's `expandable_segments:True`: one allocation per 20 MiB or 2 MiB chunk) | one descriptor per mapping the range touches (`cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`), sent with [`FdSocket::send_foreign`] | [`ForeignMemory::Mapped`]: an [`ImportedBuffer`], every chunk mapped at its offset in one range of the importer's |
//! | anything else (stream-ordered pool memory, managed or host memory, another device's) | refused: [`ArgumentDefect::NotShareable`] | |
//!
//! **Virtual memory is shared as whole allocations, each mapped from its start.** A
//! descriptor carries an allocation, not the part of it a mapping shows: the importer maps
//! each chunk from the allocation's byte 0. The driver does not say at which offset of its
//! allocation a mapping begins (`cuMemMap`'s `offset`), so a range mapped from the middle of an
//! allocation cannot be refused here; it would be read at other bytes. PyTorch's expandable
//! segments and every allocator the crate knows map whole allocations at offset 0; an
//! application that maps at other offsets must not export those ranges.
//!
//! For expandable segments this replaces PyTorch's own path, which makes the importer copy each
//! descriptor out of the exporter with `pidfd_getfd` — refused in containers with the default
//! seccomp or Yama settings, and across pid namespaces, where the exporter's pid means nothing.
//! Here the exporter sends the descriptors itself over the crate's socket (`SCM_RIGHTS`), which
//! needs neither.
//!
//! # What the exporter must keep
//!
//! The memory belongs to its allocator, which knows nothing of importers: **keep the tensor (or
//! allocation) alive, and do not reuse its memory, until every importer says it is done** (a
//! message, a barrier, its exit). What happens otherwise differs by kind:
//!
//! - **Virtual memory** ([`ForeignMemory::Mapped`]): the importer's mapping holds its own
//!   reference to every chunk, so the physical memory outlives the exporter's free and its
//!   death — no access can fault or reach memory given to someone else. But an allocator that
//!   keeps a freed chunk mapped (PyTorch's caching allocator does) hands its bytes to the next
//!   tensor it allocates, which the importer then reads: wrong data, not a fault. That is why
//!   this path is safe Rust.
//! - **Legacy handles** ([`ForeignMemory::Raw`]): the importer maps the allocation itself; once
//!   the exporter's allocator frees it (`torch.cuda.empty_cache()`, the exporter's exit), the
//!   importer's accesses may fault or reach a new allocation at the same address. Opening one
//!   is therefore [`ImportedBuffer::open_raw`], whose caller vouches for the exporter.
//!
//! # The messages
//!
//! One export is one or more messages on an [`FdSocket`], laid out and parsed here:
//!
//! - the **head**: magic `cuipcfm2`, the kind (legacy or chunks), the number of chunks in all,
//!   the data's offset in the first chunk and its byte count, the memory's device UUID, the
//!   caller's metadata length, and the chunks this message carries; then either the 104-byte
//!   [`RawExport`] (legacy: no descriptors) or one size per descriptor that came with it; then
//!   the caller's metadata (at most [`MAX_META`] bytes: a tensor's shape and dtype, a name);
//! - for a range of more than [`FdSocket::MAX_FDS`] chunks, **continuations**: magic
//!   `cuipcfc2`, the index of their first chunk, and one size per descriptor.
//!
//! Each message ends in a checksum of its bytes, sealed and checked by `envelope.rs` (the one
//! module that seals what a peer sends), before any field is read.
//!
//! The receiver treats every field as a peer's: the magic, kind and counts are checked, the
//! descriptors of each message must match its sizes one for one, the chunks must arrive in
//! order and add up to a range that holds the data, each descriptor must be pinned memory on
//! the device the head names (checked as each one is imported), and the offset must suit the
//! element type. Anything else is [`Error::CorruptHandle`] with every descriptor received so
//! far closed.
//!
//! # Where the other side can stop
//!
//! - **The exporter dies or is preempted before the head is sent**: the receiver waits out its
//!   timeout ([`Error::Timeout`]) or sees [`Error::PeerClosed`] once the socket closes.
//! - **The exporter dies between continuations**: the receiver sees [`Error::PeerClosed`] (or
//!   [`Error::Timeout`]) and closes the descriptors it has; nothing was mapped yet (mapping
//!   starts once every chunk is in), so nothing is left.
//! - **The exporter dies after the last message**: the descriptors are in the receiver's hands;
//!   each holds a reference to its allocation, so the import still maps the memory (as the
//!   exporter left it) and the mapping keeps it alive. A legacy handle of a dead exporter fails
//!   to open (`cuIpcOpenMemHandle`).
//! - **The exporter frees the memory while the importer maps it**: see above.
//! - **The importer dies at any point**: its descriptors and mappings go with it; the exporter's
//!   memory is its allocator's as before (an export holds no lease).
//! - **The exporter forks**: a [`ForeignExport`] holds descriptors, which a child inherits like
//!   any other; the child's copy of the address space holds no CUDA memory, so a child that
//!   sends the descriptors sends the parent's memory, which is what they are.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_ipc::GpuContext;
//! use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
//! use cuda_ipc::foreign::{ForeignExport, ForeignMemory};
//!
//! # fn main() -> cuda_ipc::Result<()> {
//! # let (ptr, bytes) = (0u64, 0usize);
//! let ctx = GpuContext::new(0)?;
//! let name = SocketName::Abstract("weights".into());
//! // Exporter: `ptr` and `bytes` of a tensor PyTorch allocated (`t.data_ptr()`, `t.nbytes`).
//! let export = ForeignExport::new(&ctx, ptr, bytes)?;
//! let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid)?;
//! let peer = listener.accept(Duration::from_secs(5))?;
//! peer.send_foreign(&export, b"f32 [1024]", Duration::from_secs(5))?;
//!
//! // Importer (another process):
//! let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
//! let received = socket.recv_foreign::<f32>(&ctx, Duration::from_secs(5))?;
//! match received.memory {
//!     ForeignMemory::Mapped(buffer) => println!("{} floats", buffer.len()),
//!     // SAFETY: the exporter keeps the tensor alive until we tell it we are done.
//!     ForeignMemory::Raw(raw) => {
//!         let buffer = unsafe { cuda_ipc::ImportedBuffer::<f32>::open_raw(&ctx, &raw)? };
//!         println!("{} floats", buffer.len());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # PyTorch's own memory: `send_tensor` and `cuda_ipc::foreign`
//!
//! A tensor need not live in the crate's memory to be shared. `ForeignExport::new(&ctx, ptr,
//! bytes)` asks the driver what memory another allocator of this process owns is, and shares it
//! the one way it can: a `cudaMalloc` block (PyTorch's default caching allocator, CuPy's pool) as
//! its legacy IPC handle and offset; virtual memory — PyTorch's `expandable_segments:True`, one
//! allocation per 20 MiB (or 2 MiB) chunk mapped side by side — as one descriptor per chunk the
//! range touches (`cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`), which
//! `FdSocket::send_foreign` sends itself over the socket. `FdSocket::recv_foreign` maps every
//! chunk side by side in one range (an `ImportedBuffer`, safe: the mapping holds its own
//! reference to each chunk) or hands back the legacy handle to open with the `unsafe`
//! `open_raw`. PyTorch's own path for expandable segments makes the importer copy each descriptor
//! out of the exporter with `pidfd_getfd`, which containers' default seccomp and Yama settings
//! refuse and another pid namespace cannot name; this one needs neither. Stream-ordered pool
//! memory is refused by name (share its pool); so is a range that leaves its allocation or
//! crosses an unmapped gap.
//!
//! ```python
//! # exporter (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or not)
//! n = peer.send_tensor(ctx, weights)        # 0: a legacy handle; else descriptors, one per chunk
//! # importer (another process, container or pid namespace)
//! t = torch.from_dlpack(owner.recv_tensor(ctx))   # same dtype and shape, no copy, read-write
//! ```
//!
//! The allocator knows nothing of the importer: keep the tensor alive, and its memory unused for
//! anything else, until the importer says it is done (the module docs of `cuda_ipc::foreign` say
//! what happens otherwise, per kind). Tested on an H200 with PyTorch 2.11 (`tests/foreign.rs`, and
//! the Python package's `test_foreign_gpu.py`): a `cuMemAlloc` and a virtual-memory allocation
//! exported by address at an offset, every word checked in another process; caching-allocator
//! tensors and expandable-segment tensors (bf16 spanning ≥ 4 chunks from inside one, f32, i64) bit
//! for bit, writes seen by the exporter; an importer in its own pid namespace and /proc (`unshare
//! --pid --fork --mount-proc`, as a container has), where PyTorch's own path fails; a SIGKILLed
//! exporter whose chunks stay mapped and intact in the importer; forged messages refused with every
//! descriptor closed (unit tests).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use bytemuck::{Pod, Zeroable};

use crate::buffer::ImportedBuffer;
use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::envelope;
use crate::error::{ArgumentDefect, Error, HandleDefect, Result};
use crate::fd::FdSocket;
use crate::poll::Deadline;
use crate::raw::{RawExport, RawImport, RawMemHandle};
use crate::vmm::{Access, VmmMemory};

/// The most bytes of caller's metadata one export carries ([`FdSocket::send_foreign`]).
pub const MAX_META: usize = 4096;

/// The most chunks one export may have: 1 Mi chunks, 20 TiB of PyTorch's 20 MiB chunks.
pub const MAX_CHUNKS: usize = 1 << 20;

const HEAD_MAGIC: [u8; 8] = *b"cuipcfm2";
const MORE_MAGIC: [u8; 8] = *b"cuipcfc2";
const KIND_LEGACY: u32 = 1;
const KIND_CHUNKS: u32 = 2;

/// The fixed part of a head message, before its chunk sizes (or raw export) and metadata.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
struct Head {
    magic: [u8; 8],
    kind: u32,
    /// Chunks in all (0 for a legacy export).
    chunks: u32,
    /// Bytes from the first chunk's start to the data (legacy: the raw export's offset).
    offset: u64,
    /// Bytes of data.
    bytes: u64,
    device_uuid: [u8; 16],
    meta_len: u32,
    /// Chunks (and descriptors) in this message.
    here: u32,
}

/// The fixed part of a continuation message, before its chunk sizes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
struct More {
    magic: [u8; 8],
    /// The index of this message's first chunk.
    first: u32,
    /// Chunks (and descriptors) in this message.
    here: u32,
}

/// Memory of another allocator in this process, ready to send to another process (see the
/// [module docs](self)).
///
/// # Examples
///
/// ```no_run
/// use cuda_ipc::GpuContext;
/// use cuda_ipc::foreign::ForeignExport;
///
/// # fn main() -> cuda_ipc::Result<()> {
/// # let (ptr, bytes) = (0u64, 0usize);
/// let ctx = GpuContext::new(0)?;
/// let export = ForeignExport::new(&ctx, ptr, bytes)?;
/// match export.raw() {
///     Some(raw) => println!("legacy handle, offset {}", raw.offset),
///     None => println!("{} chunks of virtual memory", export.chunks()),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ForeignExport {
    shape: Shape,
}

#[derive(Debug)]
enum Shape {
    Legacy(RawExport),
    Chunks {
        /// One descriptor per mapping, with its bytes, in address order.
        chunks: Vec<(OwnedFd, u64)>,
        /// Bytes from the first chunk's start to the data.
        offset: u64,
        bytes: u64,
        device_uuid: [u8; 16],
    },
}

impl ForeignExport {
    /// Make `bytes` of device memory at `ptr`, which another allocator of this process owns,
    /// shareable: as a legacy IPC handle if the driver offers one, otherwise as one
    /// descriptor per virtual-memory mapping the range touches (see the [module docs](self)).
    /// The memory must be on `ctx`'s device. Nothing is read or written; the descriptors are
    /// taken now and closed when this drops.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] with [`ArgumentDefect::NotShareable`] for memory the driver
    /// does not know, memory of another device, a range that leaves its allocation (or runs
    /// over an unmapped gap), or memory with neither a legacy IPC handle nor the POSIX-fd
    /// handle type (stream-ordered pool memory: share its pool); with
    /// [`ArgumentDefect::AllocationSize`] for zero bytes, [`ArgumentDefect::RangeOverflow`]
    /// for a range past the address space; [`Error::Cuda`] naming the driver call that
    /// failed.
    #[doc(alias = "cuIpcGetMemHandle")]
    #[doc(alias = "cuMemRetainAllocationHandle")]
    #[doc(alias = "expandable_segments")]
    pub fn new(ctx: &GpuContext, ptr: u64, bytes: usize) -> Result<Self> {
        let call = "ForeignExport::new";
        crate::memory::allocation_bytes::<u8>(call, bytes)?;
        let end = ptr
            .checked_add(bytes as u64)
            .ok_or(Error::InvalidArgument {
                call,
                defect: ArgumentDefect::RangeOverflow {
                    offset: ptr,
                    bytes: bytes as u64,
                },
            })?;
        let _g = ctx.enter()?;
        let ordinal = driver::mem::device_ordinal_of(ptr).map_err(|e| {
            not_shareable(
                ptr,
                format!("the driver knows no device memory there ({e})"),
            )
        })?;
        if u32::try_from(ordinal).ok() != Some(ctx.ordinal()) {
            return Err(not_shareable(
                ptr,
                format!(
                    "it is on device {ordinal}, not the context's device {} (export it with \
                     that device's context)",
                    ctx.ordinal()
                ),
            ));
        }
        if driver::mem::attribute(ptr, sys::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)? != 0 {
            return Self::legacy(ctx, ptr..end);
        }
        if driver::mem::attribute(ptr, sys::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)? != 0 {
            return Err(not_shareable(
                ptr,
                "it is stream-ordered pool memory (cuMemAllocFromPoolAsync): share its pool \
                 (cuda_ipc::pool), whose descriptor maps every allocation of the pool, not one"
                    .into(),
            ));
        }
        let types = driver::mem::attribute(ptr, sys::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES)?;
        if types & u64::from(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0 {
            return Err(not_shareable(
                ptr,
                format!(
                    "it has no legacy IPC handle and its allocation allows no POSIX file \
                     descriptor (handle types {types:#x}): virtual memory must be created with \
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested"
                ),
            ));
        }
        Self::virtual_memory(ctx, ptr..end)
    }

    /// [`new`](Self::new) for `range` of a legacy-capable allocation: its handle and the data's
    /// offset in it. `ctx` is current.
    fn legacy(ctx: &GpuContext, range: std::ops::Range<u64>) -> Result<Self> {
        let (ptr, end) = (range.start, range.end);
        let (base, size) = driver::mem::address_range(ptr)?;
        if end > base.saturating_add(size as u64) {
            return Err(not_shareable(
                ptr,
                format!(
                    "{} bytes from there leave its allocation ({size} bytes at {base:#x})",
                    end - ptr
                ),
            ));
        }
        // SAFETY: `base` is the start of a live legacy-capable allocation of the current
        // context (asked just above).
        let handle = RawMemHandle(unsafe { crate::memory::legacy_handle(base) }?);
        Ok(Self {
            shape: Shape::Legacy(RawExport {
                handle,
                offset: ptr - base,
                bytes: end - ptr,
                device_uuid: ctx.uuid(),
                device_ordinal: ctx.ordinal(),
                exporter_pid: std::process::id(),
            }),
        })
    }

    /// [`new`](Self::new) for `range` of POSIX-fd virtual memory: one descriptor per mapping
    /// the range touches, side by side with no gap. `ctx` is current.
    fn virtual_memory(ctx: &GpuContext, range: std::ops::Range<u64>) -> Result<Self> {
        let (ptr, end) = (range.start, range.end);
        let bytes = end - ptr;
        let refuse = |detail: String| not_shareable(ptr, detail);
        let mapping_of = |at: u64| -> Result<(u64, u64)> {
            let base = driver::mem::attribute(at, sys::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR)?;
            let size = driver::mem::attribute(at, sys::CU_POINTER_ATTRIBUTE_MAPPING_SIZE)?;
            if size == 0 || base > at || at - base >= size {
                return Err(refuse(format!(
                    "the driver reports no mapping around {at:#x} (base {base:#x}, {size} bytes)"
                )));
            }
            Ok((base, size))
        };
        let (first_base, first_size) = mapping_of(ptr)?;
        let mut chunks = Vec::new();
        let (mut base, mut size) = (first_base, first_size);
        loop {
            chunks.push((export_mapping(base)?, size));
            let next = base.saturating_add(size);
            if next >= end {
                break;
            }
            if chunks.len() >= MAX_CHUNKS {
                return Err(refuse(format!("it spans more than {MAX_CHUNKS} mappings")));
            }
            (base, size) = mapping_of(next).map_err(|_| {
                refuse(format!(
                    "{bytes} bytes from there run past the mapped range at {next:#x}"
                ))
            })?;
            if base != next {
                return Err(refuse(format!(
                    "the mapping after {next:#x} starts at {base:#x}: the range has a gap"
                )));
            }
        }
        Ok(Self {
            shape: Shape::Chunks {
                chunks,
                offset: ptr - first_base,
                bytes,
                device_uuid: ctx.uuid(),
            },
        })
    }

    /// The bytes of data exported.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        match &self.shape {
            Shape::Legacy(raw) => raw.bytes,
            Shape::Chunks { bytes, .. } => *bytes,
        }
    }

    /// How many virtual-memory mappings (descriptors) the export has; 0 for a legacy handle.
    #[must_use]
    pub fn chunks(&self) -> usize {
        match &self.shape {
            Shape::Legacy(_) => 0,
            Shape::Chunks { chunks, .. } => chunks.len(),
        }
    }

    /// The legacy IPC handle and offset, for memory shared that way (a [`Pod`] struct a C,
    /// CuPy or PyTorch peer can read without this crate); `None` for virtual memory.
    #[must_use]
    pub fn raw(&self) -> Option<&RawExport> {
        match &self.shape {
            Shape::Legacy(raw) => Some(raw),
            Shape::Chunks { .. } => None,
        }
    }
}

/// The error of [`ForeignExport::new`] for memory at `ptr` that cannot be shared, and why.
fn not_shareable(ptr: u64, detail: String) -> Error {
    Error::InvalidArgument {
        call: "ForeignExport::new",
        defect: ArgumentDefect::NotShareable { ptr, detail },
    }
}

/// A new descriptor of the allocation mapped at `base` (`cuMemRetainAllocationHandle`, then
/// `cuMemExportToShareableHandle`; the retained reference is given back either way). A context
/// is current.
fn export_mapping(base: u64) -> Result<OwnedFd> {
    let handle = driver::vmm::retain(base)?;
    // SAFETY: a live allocation handle retained just above, whose allocation allows the POSIX-fd
    // type (checked by the caller); writes one int.
    let fd = unsafe { driver::vmm::export_fd(handle) };
    // SAFETY: retained above, released once; the mapping keeps its own reference.
    let _ = unsafe { driver::vmm::release(handle) };
    fd
}

/// What [`FdSocket::recv_foreign`] received: the memory, and the metadata the exporter sent
/// with it.
#[derive(Debug)]
#[non_exhaustive]
pub struct ForeignReceived<T: Pod> {
    /// The memory.
    pub memory: ForeignMemory<T>,
    /// The exporter's metadata ([`FdSocket::send_foreign`]'s `meta`), at most [`MAX_META`]
    /// bytes, as untrusted as any peer's bytes.
    pub meta: Vec<u8>,
}

/// Foreign memory as it arrives (see the [module docs](self) for why the two differ).
#[derive(Debug)]
pub enum ForeignMemory<T: Pod> {
    /// Virtual memory, mapped: usable at once, and safe whatever the exporter does (its bytes
    /// are only as current as the exporter keeps them).
    Mapped(ImportedBuffer<T>),
    /// A legacy handle, not opened: [`ImportedBuffer::open_raw`] maps it, with its safety
    /// contract. The exporter is named by the socket's peer pid when this process can see it.
    Raw(RawImport),
}

impl FdSocket {
    /// Send a [`ForeignExport`] and up to [`MAX_META`] bytes of `meta` (shape, dtype, a name:
    /// anything the receiver needs) to the peer, as one message — or, for more than
    /// [`MAX_FDS`](Self::MAX_FDS) chunks, one message per `MAX_FDS` descriptors (see the
    /// [module docs](crate::foreign)). `timeout` bounds the whole send.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for more than [`MAX_META`] bytes of metadata; then as
    /// [`send`](Self::send).
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send_foreign(
        &self,
        export: &ForeignExport,
        meta: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        ArgumentDefect::check_range(
            "FdSocket::send_foreign",
            "metadata bytes",
            meta.len() as u64,
            0,
            MAX_META as u64,
        )?;
        let deadline = Deadline::after(timeout);
        match &export.shape {
            Shape::Legacy(raw) => {
                let payload = encode_head(
                    Head {
                        magic: HEAD_MAGIC,
                        kind: KIND_LEGACY,
                        chunks: 0,
                        offset: raw.offset,
                        bytes: raw.bytes,
                        device_uuid: raw.device_uuid,
                        meta_len: meta.len() as u32,
                        here: 0,
                    },
                    bytemuck::bytes_of(raw),
                    meta,
                );
                self.send(&payload, &[], deadline.remaining())
            }
            Shape::Chunks {
                chunks,
                offset,
                bytes,
                device_uuid,
            } => {
                let mut batches = chunks.chunks(Self::MAX_FDS);
                let first = batches.next().unwrap_or(&[]);
                let head = Head {
                    magic: HEAD_MAGIC,
                    kind: KIND_CHUNKS,
                    chunks: chunks.len() as u32,
                    offset: *offset,
                    bytes: *bytes,
                    device_uuid: *device_uuid,
                    meta_len: meta.len() as u32,
                    here: first.len() as u32,
                };
                let payload = encode_head(head, &sizes_of(first), meta);
                self.send(&payload, &fds_of(first), deadline.remaining())?;
                let mut sent = first.len();
                for batch in batches {
                    let more = More {
                        magic: MORE_MAGIC,
                        first: sent as u32,
                        here: batch.len() as u32,
                    };
                    let payload = encode_more(more, &sizes_of(batch));
                    self.send(&payload, &fds_of(batch), deadline.remaining())?;
                    sent += batch.len();
                }
                Ok(())
            }
        }
    }

    /// Receive what [`send_foreign`](Self::send_foreign) sent, as elements of `T`: virtual
    /// memory mapped into `ctx` (every chunk imported, checked and mapped side by side), or a
    /// legacy handle to open. `timeout` bounds the whole receive.
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv) (a peer that stops half-way is [`Error::PeerClosed`] or
    /// [`Error::Timeout`], with every descriptor received closed); [`Error::CorruptHandle`] for
    /// messages that are not a foreign export, chunks out of order or that do not hold the
    /// data, descriptors that do not match, or memory that is not pinned on the device named;
    /// [`Error::InvalidArgument`] when the byte count is not a whole number of `T`s or the
    /// offset does not suit `T`'s alignment; [`Error::DeviceNotReachable`] for memory on a
    /// device `ctx` cannot reach; [`Error::Cuda`] naming the driver call that failed.
    #[doc(alias = "SCM_RIGHTS")]
    pub fn recv_foreign<T: Pod>(
        &self,
        ctx: &GpuContext,
        timeout: Duration,
    ) -> Result<ForeignReceived<T>> {
        let exporter = Some(self.peer_identity()).filter(|id| id.pid() != 0);
        let (head, arrived, meta) = self.receive_foreign(timeout)?;
        let chunks = match arrived {
            Arrived::Legacy(raw) => {
                // The pid the exporter wrote is its own namespace's; the socket's sender, with
                // its start time and pidfs inode, is ours (a reused pid reads as dead).
                let mut import = RawImport::from_export::<T>(&raw)?;
                import.exporter = exporter;
                return Ok(ForeignReceived {
                    memory: ForeignMemory::Raw(import),
                    meta,
                });
            }
            Arrived::Chunks(chunks) => chunks,
        };
        let len = elements::<T>(head.offset, head.bytes)?;
        let holder = crate::device::check_reachable(ctx, &head.device_uuid)?;
        let memory = VmmMemory::import_chunks(ctx, chunks, holder, Access::ReadWrite)?;
        Ok(ForeignReceived {
            memory: ForeignMemory::Mapped(ImportedBuffer::from_foreign(
                ctx,
                memory,
                head.offset,
                len,
                exporter,
            )),
            meta,
        })
    }

    /// The socket half of [`recv_foreign`](Self::recv_foreign): every message of one export
    /// received and checked (nothing imported yet); what failed closes what came.
    fn receive_foreign(&self, timeout: Duration) -> Result<(Head, Arrived, Vec<u8>)> {
        let deadline = Deadline::after(timeout);
        let first = self.recv(deadline.remaining())?;
        let (head, body, meta) = decode_head(&first.payload)?;
        if head.kind == KIND_LEGACY {
            check_fds(0, first.fds.len())?;
            return Ok((
                head,
                Arrived::Legacy(bytemuck::pod_read_unaligned(body)),
                meta,
            ));
        }
        // Capacity for what one message can bring, not for what a peer's count claims.
        let mut chunks: Vec<(OwnedFd, usize)> = Vec::with_capacity(Self::MAX_FDS);
        take_chunks(&mut chunks, decode_sizes(body)?, first.fds)?;
        while chunks.len() < head.chunks as usize {
            let message = self.recv(deadline.remaining())?;
            let sizes = decode_more(&message.payload, chunks.len(), head.chunks as usize)?;
            take_chunks(&mut chunks, sizes, message.fds)?;
        }
        let mapped = chunks
            .iter()
            .try_fold(0u64, |sum, &(_, s)| sum.checked_add(s as u64))
            .unwrap_or(u64::MAX);
        if head
            .offset
            .checked_add(head.bytes)
            .is_none_or(|end| end > mapped)
        {
            return Err(layout_detail(format!(
                "bytes {}..+{} reach past the {mapped} bytes its chunks map",
                head.offset, head.bytes
            )));
        }
        Ok((head, Arrived::Chunks(chunks), meta))
    }
}

/// What one export's messages brought, before anything is opened.
enum Arrived {
    Legacy(RawExport),
    Chunks(Vec<(OwnedFd, usize)>),
}

/// Add one message's chunks: its sizes, each with its descriptor.
fn take_chunks(
    chunks: &mut Vec<(OwnedFd, usize)>,
    sizes: Vec<u64>,
    fds: Vec<OwnedFd>,
) -> Result<()> {
    check_fds(sizes.len(), fds.len())?;
    for (size, fd) in sizes.into_iter().zip(fds) {
        let size = usize::try_from(size).map_err(|_| layout("a chunk size"))?;
        chunks.push((fd, size));
    }
    Ok(())
}

fn sizes_of(batch: &[(OwnedFd, u64)]) -> Vec<u8> {
    batch.iter().flat_map(|(_, s)| s.to_ne_bytes()).collect()
}

fn fds_of(batch: &[(OwnedFd, u64)]) -> Vec<BorrowedFd<'_>> {
    batch.iter().map(|(fd, _)| fd.as_fd()).collect()
}

fn encode_head(head: Head, body: &[u8], meta: &[u8]) -> Vec<u8> {
    envelope::seal_message(&[bytemuck::bytes_of(&head), body, meta])
}

fn encode_more(more: More, sizes: &[u8]) -> Vec<u8> {
    envelope::seal_message(&[bytemuck::bytes_of(&more), sizes])
}

fn corrupt(defect: HandleDefect) -> Error {
    Error::corrupt_handle(defect)
}

fn layout_detail(detail: String) -> Error {
    corrupt(HandleDefect::Layout { detail })
}

fn layout(what: &str) -> Error {
    layout_detail(format!(
        "{what} of the foreign export does not fit this platform"
    ))
}

/// The head's fields, its body (the raw export, or the chunk sizes) and the metadata, every
/// count checked against the bytes that came.
fn decode_head(message: &[u8]) -> Result<(Head, &[u8], Vec<u8>)> {
    let what = "a foreign export";
    let payload = envelope::open_message(HEAD_MAGIC, what, message)?;
    let fixed = std::mem::size_of::<Head>();
    let Some(fixed_bytes) = payload.get(..fixed) else {
        return Err(corrupt(HandleDefect::Size {
            what,
            expected: fixed + 8,
            found: message.len(),
        }));
    };
    let head: Head = bytemuck::pod_read_unaligned(fixed_bytes);
    let body_len = match head.kind {
        KIND_LEGACY if head.chunks == 0 && head.here == 0 => std::mem::size_of::<RawExport>(),
        KIND_CHUNKS
            if (1..=MAX_CHUNKS as u64).contains(&u64::from(head.chunks))
                && (1..=u64::from(head.chunks.min(FdSocket::MAX_FDS as u32)))
                    .contains(&u64::from(head.here)) =>
        {
            head.here as usize * 8
        }
        KIND_LEGACY | KIND_CHUNKS => {
            return Err(layout_detail(format!(
                "{} chunks in all, {} in the first message: not a valid count",
                head.chunks, head.here
            )));
        }
        _ => {
            return Err(corrupt(HandleDefect::Kind {
                expected: "a legacy handle or virtual-memory chunks",
                found: "an unknown kind",
            }));
        }
    };
    let meta_len = head.meta_len as usize;
    if meta_len > MAX_META || payload.len() != fixed + body_len + meta_len {
        return Err(corrupt(HandleDefect::Size {
            what,
            expected: fixed + body_len + meta_len.min(MAX_META) + 8,
            found: message.len(),
        }));
    }
    let body = &payload[fixed..fixed + body_len];
    if head.kind == KIND_LEGACY {
        let raw: RawExport = bytemuck::pod_read_unaligned(body);
        if raw.offset != head.offset
            || raw.bytes != head.bytes
            || raw.device_uuid != head.device_uuid
        {
            return Err(layout_detail(
                "the raw export disagrees with the head about its offset, bytes or device".into(),
            ));
        }
    }
    Ok((head, body, payload[fixed + body_len..].to_vec()))
}

/// Chunk sizes, 8 bytes each.
fn decode_sizes(body: &[u8]) -> Result<Vec<u64>> {
    let sizes: Vec<u64> = body
        .chunks_exact(8)
        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
        .collect();
    if sizes.contains(&0) {
        return Err(layout_detail("a chunk of 0 bytes".into()));
    }
    Ok(sizes)
}

/// A continuation's sizes, which must start at chunk `have` and stay within `total`.
fn decode_more(message: &[u8], have: usize, total: usize) -> Result<Vec<u64>> {
    let what = "a foreign export's continuation";
    let payload = envelope::open_message(MORE_MAGIC, what, message)?;
    let fixed = std::mem::size_of::<More>();
    let Some(fixed_bytes) = payload.get(..fixed) else {
        return Err(corrupt(HandleDefect::Size {
            what,
            expected: fixed + 8,
            found: message.len(),
        }));
    };
    let more: More = bytemuck::pod_read_unaligned(fixed_bytes);
    let here = more.here as usize;
    if more.first as usize != have
        || here == 0
        || here > FdSocket::MAX_FDS
        || have + here > total
        || payload.len() != fixed + 8 * here
    {
        return Err(layout_detail(format!(
            "a continuation of chunks {}..+{} ({} bytes) after {have} of {total}",
            more.first,
            more.here,
            payload.len()
        )));
    }
    decode_sizes(&payload[fixed..])
}

/// One descriptor per chunk size, no more, no fewer (what came is closed by the caller's drop).
fn check_fds(expected: usize, found: usize) -> Result<()> {
    if expected == found {
        return Ok(());
    }
    Err(corrupt(HandleDefect::Memory {
        detail: format!("{found} descriptors came with {expected} chunks"),
    }))
}

/// `bytes` at `offset` as a count of `T`s.
fn elements<T>(offset: u64, bytes: u64) -> Result<usize> {
    let call = "FdSocket::recv_foreign";
    let size = std::mem::size_of::<T>() as u64;
    let align = std::mem::align_of::<T>() as u64;
    if size == 0 || bytes == 0 || !bytes.is_multiple_of(size) {
        return Err(Error::InvalidArgument {
            call,
            defect: ArgumentDefect::NotWholeElements {
                bytes,
                elem_size: size,
            },
        });
    }
    if !offset.is_multiple_of(align) {
        return Err(Error::InvalidArgument {
            call,
            defect: ArgumentDefect::Misaligned { offset, align },
        });
    }
    usize::try_from(bytes / size).map_err(|_| layout("the element count"))
}

/// Hooks for the fuzz target `foreign_message` (not API).
#[cfg(any(test, fuzzing, cuda_ipc_test_hooks))]
pub mod __testing {
    use super::{FdSocket, MAX_CHUNKS, decode_head, decode_more};

    /// Parse `data` as a head message, then each of `more` as a continuation: every count the
    /// parsers accept must be consistent with the bytes (the fuzz target's invariant); an
    /// error is fine, a panic is not.
    pub fn parse(data: &[u8], more: &[&[u8]]) {
        // Resealed, so that mutated bytes reach the checks behind the checksum.
        let mut data = data.to_vec();
        crate::envelope::reseal_message(&mut data);
        let more: Vec<Vec<u8>> = more
            .iter()
            .map(|m| {
                let mut m = m.to_vec();
                crate::envelope::reseal_message(&mut m);
                m
            })
            .collect();
        let Ok((head, body, meta)) = decode_head(&data) else {
            return;
        };
        assert!(meta.len() <= super::MAX_META);
        assert!(head.chunks as usize <= MAX_CHUNKS);
        if head.kind == super::KIND_CHUNKS {
            assert_eq!(body.len(), head.here as usize * 8);
            assert!(head.here as usize <= FdSocket::MAX_FDS && head.here <= head.chunks);
        }
        let mut have = head.here as usize;
        for m in &more {
            match decode_more(m, have, head.chunks as usize) {
                Ok(sizes) => {
                    assert!(!sizes.is_empty() && sizes.len() <= FdSocket::MAX_FDS);
                    assert!(sizes.iter().all(|&s| s > 0));
                    have += sizes.len();
                    assert!(have <= head.chunks as usize);
                }
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
