//! The importing side of a buffer: what an [`ImportedBuffer`] is ([`Import`]: a mapping of
//! another process's export, or a hold on a pool buffer) and how one is opened — validate the
//! handle, look the export up in the import cache, take a lease, map.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use bytemuck::Pod;

use super::IpcMemHandle;
use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::{Error, HandleDefect, Result, TypeConflict};
use crate::handle::{Admitted, Handle, HandleKind, HandleType};
use crate::ledger::{self, Hold};
use crate::ledger::{Dying, Entry, ImportCache};
use crate::memory::{Expected, map_legacy};
use crate::pool::{IpcPoolHandle, PoolHandle, PoolHold};
use crate::process::ProcessIdentity;
use crate::raw::RawImport;
use crate::slice::GpuSlice;
use crate::vmm::{Access, VmmMemory};

/// Another process's [`IpcBuffer`](crate::IpcBuffer) (or memory a foreign peer exported), mapped
/// into this process: [`open`](Self::open) (legacy handles), [`open_fd`](Self::open_fd) (POSIX-fd
/// buffers, with the descriptor their exporter sent), [`open_raw`](Self::open_raw) (PyTorch, CuPy,
/// C/C++ peers). It reads and writes the memory as the exporter's buffer does (both dereference to
/// [`GpuSlice<T>`]), and cannot be exported again (CUDA cannot re-export a mapping).
///
/// Opening checks the envelope before the driver sees it (type, length, checksum, exporter
/// alive and not this process, device reachable, buffer not freed) and takes a lease, which
/// keeps the exporter from freeing the memory while it is mapped here; legacy handles map with
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`. Opening the same export again in the same context
/// returns another view of the same mapping without a driver call; the driver's close runs
/// once, when the last view drops, and then the lease is released.
///
/// `ImportedBuffer<T>` is `Send` and `Sync`; what holds for asynchronous work on an
/// [`IpcBuffer`](crate::IpcBuffer) holds here (see [asynchronous
/// work](crate::IpcBuffer#asynchronous-work)): dropping the last view unmaps the memory without
/// waiting for queued GPU work on it.
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
    pub(super) slice: GpuSlice<T>,
    pub(super) import: Import,
}

crate::slice::deref_to!(ImportedBuffer<T> => slice: GpuSlice<T>);

impl<T: Pod> ImportedBuffer<T> {
    /// Map a buffer exported by another process into `ctx`.
    ///
    /// # Errors
    ///
    /// Checked before the driver sees the handle: [`Error::CorruptHandle`],
    /// [`Error::TypeMismatch`], [`Error::HandleTypeMismatch`] (a POSIX-fd handle: it opens only
    /// with its descriptor, [`open_fd`](Self::open_fd)), [`Error::SameProcess`],
    /// [`Error::PeerGone`] (the exporter), [`Error::DeviceNotReachable`], [`Error::StaleHandle`]
    /// (the buffer was freed, even if a new one now sits at its address),
    /// [`Error::TooManyImporters`]. Then [`Error::Cuda`] naming `cuIpcOpenMemHandle`.
    #[doc(alias = "cuIpcOpenMemHandle")]
    pub fn open(ctx: &GpuContext, handle: &IpcMemHandle<T>) -> Result<Self> {
        Self::open_handle(ctx, handle, None)
    }

    /// Map a [`HandleType::PosixFd`] buffer from its handle and the file descriptor its exporter
    /// sent with it ([`export_fd`](crate::IpcBuffer::export_fd); received over a Unix socket):
    /// `cuMemImportFromShareableHandle`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess` for
    /// `ctx`'s device. `fd` is consumed (closed once imported, or on any error). Opening the same
    /// export again in the same context shares the mapping, as for legacy handles; unlike them, the
    /// exporting process may open its own handle.
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
    /// [`PoolHandle`] ([`IpcBuffer::export_pooled`](crate::IpcBuffer::export_pooled)): the pool is
    /// imported once per process (`cuMemPoolImportFromShareableHandle`; a pool imported before, in
    /// any context, is shared and `fd` closed unused, as
    /// [`ImportedPool::open_fd`](crate::pool::ImportedPool::open_fd) does), then the buffer
    /// (`cuMemPoolImportPointer`), its size checked against the driver's. `fd` is consumed. Opening
    /// the same buffer again shares the import; the last view's drop frees it (`cuMemFree`) and
    /// lets the owner free the allocation.
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
    /// exporter is alive (also when this process maps the handle already: the exporter named
    /// now and the one the first open named). After mapping: the range lies inside the allocation
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
    /// [`Error::SameProcess`] for a handle this process exported; [`Error::PeerGone`] (the
    /// exporter) when the named exporter is dead; [`Error::Cuda`] naming `cuIpcOpenMemHandle` (a
    /// forged or stale handle, a dead exporter that was not named); [`Error::CorruptHandle`] naming
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

impl<T: Pod> std::fmt::Debug for ImportedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len)
            .field("device", &self.slice.ctx.ordinal())
            .field("handle_type", &self.handle_type())
            .field("exporter", &self.exporter().map(|e| e.pid()))
            .finish_non_exhaustive()
    }
}

/// What an imported buffer maps.
pub(crate) enum Import {
    /// A legacy or POSIX-fd export (or a raw handle's memory), shared by every view of it in
    /// this process and context.
    Mapping(Arc<Mapping>),
    /// A [`HandleType::Pool`] buffer: a hold on this process's import of it.
    PoolHold(PoolHold),
}

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

/// One `cuIpcOpenMemHandle` mapping, shared by every [`ImportedBuffer`] view of it in this process.
pub(crate) struct Mapping {
    ctx: GpuContext,
    ptr: sys::CUdeviceptr,
    /// Bytes mapped from `ptr` on, as the driver reports the allocation
    /// (`cuPointerGetAttributes`): no view may reach past them, whatever an envelope says.
    mapped: usize,
    /// What the envelope that created the mapping described: element size, alignment, type
    /// tag and length. Every later open of the same export must describe the same.
    described: Described,
    /// Its entry in the import cache; `None` for a foreign mapping, which is never shared.
    key: Option<Key>,
    /// The exporting process (for a raw handle: only if the caller named it).
    pub(super) exporter: Option<ProcessIdentity>,
    /// For a POSIX-fd import: the imported allocation and its mapping (taken and torn down in
    /// `drop`); `None` for legacy handles, closed with `cuIpcCloseMemHandle`.
    pub(super) vmm: Option<VmmMemory>,
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
        if let Some(key) = &self.key {
            CACHE.forget(key);
        }
    }
}

impl<T: Pod> ImportedBuffer<T> {
    /// Validate → lease → map, for a handle of `T`s (a buffer's, a signal's counter, a
    /// channel's slots) of either handle type: `fd` is the descriptor that came with a POSIX-fd
    /// handle (and must be absent for a legacy one).
    pub(crate) fn open_handle<K: HandleKind<Element = T>>(
        ctx: &GpuContext,
        handle: &Handle<K>,
        fd: Option<OwnedFd>,
    ) -> Result<Self> {
        Self::open_handle_with(ctx, handle, fd, Access::ReadWrite)
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

    /// [`open_handle`](Self::open_handle), mapping with `access`. Read-only needs a POSIX-fd
    /// handle: `cuIpcOpenMemHandle` has no read-only mapping.
    pub(crate) fn open_handle_with<K: HandleKind<Element = T>>(
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
        // `admit` checks the envelope's element layout against `K::Element`, which is `T` (a
        // buffer's `T`, a signal's `u64`; `Pod`, so checked): what makes the view sound.
        let Admitted {
            exporter,
            memory_device,
            trace: _open,
        } = handle.admit(ctx, fd.is_some())?;
        let env = &handle.env;
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

        // Admitted: a hit is held to what only its entry knows — the export is not closing,
        // and the envelope describes the mapping as the first one did.
        let vacancy = match CACHE.entry(&key) {
            Entry::Live(hit) => {
                hit.check_reuse(described)?;
                return Ok(Self::view_at(hit, 0, len));
            }
            Entry::Vacant(vacancy) => vacancy,
        };
        let hold = ledger::enter(&env.token, env.generation, exporter)?;
        // On an error below the hold drops after the memory was unmapped again.
        let (ptr, mapped, vmm) = match fd {
            Some(fd) => {
                let bytes = usize::try_from(env.vmm_bytes()).unwrap_or(usize::MAX);
                let memory = VmmMemory::import(ctx, fd, bytes, memory_device, access)?;
                (memory.ptr(), memory.size(), Some(memory))
            }
            None => {
                let wanted = len.saturating_mul(std::mem::size_of::<T>());
                let (ptr, mapped) = map_legacy(ctx, env.cuda, Expected::Bytes(wanted))
                    .map_err(|e| judged_again(e, Some(&exporter)))?;
                (ptr, mapped, None)
            }
        };
        let mapping = vacancy.fill(Arc::new(Mapping {
            ctx: ctx.clone(),
            ptr,
            mapped,
            described,
            key: Some(key),
            exporter: Some(exporter),
            vmm,
            hold: Some(hold),
        }));
        Ok(Self::view_at(mapping, 0, len))
    }

    /// The work of [`ImportedBuffer::open_pooled`], whatever the pool's handle says of
    /// read-only (a [`ReadOnlyBuffer`](crate::ReadOnlyBuffer) opens one marked so).
    pub(crate) fn open_pooled_any(
        ctx: &GpuContext,
        pool: &IpcPoolHandle,
        fd: OwnedFd,
        buffer: &PoolHandle<T>,
    ) -> Result<Self> {
        let (slice, hold) = crate::pool::ImportedPool::open_fd_any(ctx, pool, fd)?
            .open(buffer)?
            .into_parts();
        Ok(Self {
            slice,
            import: Import::PoolHold(hold),
        })
    }

    /// The work of [`ImportedBuffer::open_raw`]: the checks a raw handle allows (the raw
    /// module's docs), then one mapping per handle and context, shared through the import
    /// cache.
    ///
    /// # Safety
    ///
    /// As [`ImportedBuffer::open_raw`].
    pub(crate) unsafe fn open_raw_with(ctx: &GpuContext, import: &RawImport) -> Result<Self> {
        let expected = Expected::Range(import.byte_range::<T>("ImportedBuffer::open_raw")?);
        let key: Key = (
            import.handle.0,
            ctx.as_raw() as usize,
            KIND_RAW,
            Access::ReadWrite,
        );
        let _open = crate::trace::scope!(
            "open",
            kind = "a raw legacy",
            bytes = import.len.saturating_mul(std::mem::size_of::<T>()),
            offset = import.offset
        );
        // Liveness before the cache: a re-open of a mapped handle must see the exporter's
        // death as the first open would (the one named now, and the one the mapping recorded).
        let exporter = import.live_exporter()?;
        let vacancy = match CACHE.entry(&key) {
            Entry::Live(hit) => {
                hit.check_reuse(Described::Raw)?;
                if let Some(first) = hit.exporter.filter(|&first| Some(first) != exporter) {
                    crate::process::check_exporter_alive(&first, false)?;
                }
                expected.check(hit.mapped)?;
                return Ok(Self::view_at(hit, import.offset, import.len));
            }
            Entry::Vacant(vacancy) => vacancy,
        };
        let mapped = map_legacy(ctx, import.handle.0, expected)
            .map_err(|e| judged_again(e, exporter.as_ref()))?;
        let mapping = vacancy.fill(Arc::new(Mapping::raw(
            ctx,
            mapped,
            Some(key),
            None,
            exporter,
        )));
        Ok(Self::view_at(mapping, import.offset, import.len))
    }

    /// A view of `len` elements at byte `offset` of foreign virtual memory this process
    /// imported (the caller checked the range): a mapping of its own, outside the cache.
    pub(crate) fn from_foreign(
        ctx: &GpuContext,
        memory: VmmMemory,
        offset: u64,
        len: usize,
        exporter: Option<ProcessIdentity>,
    ) -> Self {
        let (ptr, mapped) = (memory.ptr(), memory.size());
        let mapping = Mapping::raw(ctx, (ptr, mapped), None, Some(memory), exporter);
        Self::view_at(Arc::new(mapping), offset, len)
    }

    /// A view of `len` elements at byte `offset` of the mapping (the caller checked the range).
    fn view_at(mapping: Arc<Mapping>, offset: u64, len: usize) -> Self {
        Self {
            slice: GpuSlice::new(mapping.ctx.clone(), mapping.ptr + offset, len),
            import: Import::Mapping(mapping),
        }
    }

    /// Another process that holds the same export but died without letting go (for a
    /// signal's counter: a third party); nothing is reaped.
    pub(crate) fn dead_importer(&self) -> Option<u32> {
        match &self.import {
            Import::Mapping(m) => m.hold.as_ref()?.dead_importer(),
            Import::PoolHold(_) => None,
        }
    }
}

impl Mapping {
    /// A raw handle's mapping (cached under `key`, no `vmm`) or a foreign export's (its `vmm`,
    /// no key: never cached): described by its bytes alone, no ledger hold, the exporter only
    /// if known.
    fn raw(
        ctx: &GpuContext,
        (ptr, mapped): (sys::CUdeviceptr, usize),
        key: Option<Key>,
        vmm: Option<VmmMemory>,
        exporter: Option<ProcessIdentity>,
    ) -> Self {
        Self {
            ctx: ctx.clone(),
            ptr,
            mapped,
            described: Described::Raw,
            key,
            exporter,
            vmm,
            hold: None,
        }
    }

    /// The checks a cache hit must pass after its admission: the export is not closing (its
    /// exporter is waiting for importers to go: no new views), and the envelope describes
    /// what the first open of this export described (and so fits the mapping).
    fn check_reuse(&self, described: Described) -> Result<()> {
        if let Some(hold) = &self.hold
            && !hold.is_live()
        {
            return Err(Error::StaleHandle {
                generation: hold.generation(),
            });
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

/// A failed open of an exporter's memory, with the exporter judged again: one that died after
/// it was judged alive took its memory with it, and that death — [`Error::PeerGone`], the
/// exporter — is what the caller is told, not the driver's code for the memory it no longer
/// finds. Any other failure is returned as it is.
fn judged_again(e: Error, exporter: Option<&ProcessIdentity>) -> Error {
    match exporter {
        Some(id)
            if !matches!(e, Error::PeerGone { .. }) && !crate::process::is_alive_cached(id) =>
        {
            Error::exporter_gone(id.pid())
        }
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An open that failed after its exporter was judged alive: the exporter dead now is
    /// `PeerGone` (the exporter, its pid), alive or unnamed the error stays the driver's.
    #[test]
    fn a_failed_open_judges_the_exporter_again() {
        let driver_error = || Error::Cuda {
            call: "cuIpcOpenMemHandle",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        };
        let (mut child, id) = crate::process::sleeping_child();
        assert!(matches!(
            judged_again(driver_error(), Some(&id)),
            Error::Cuda { code: 1, .. }
        ));
        child.kill().unwrap();
        child.wait().unwrap();
        match judged_again(driver_error(), Some(&id)) {
            Error::PeerGone { pid, role } => {
                assert_eq!(pid, child.id());
                assert_eq!(role, crate::error::PeerRole::Exporter);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            judged_again(driver_error(), None),
            Error::Cuda { code: 1, .. }
        ));
    }
}
