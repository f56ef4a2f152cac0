//! Read-only sharing: imports through which this process can only read — one copy of model
//! weights, KV-cache blocks or a dataset that many reader processes map, where a stray write
//! in one reader must not corrupt everyone's data.
//!
//! What is guaranteed where is documented once, on [`ReadOnlySlice`] (public docs: this
//! module is private), under "What the GPU enforces".

use std::os::fd::OwnedFd;

use bytemuck::Pod;

use crate::buffer::ImportedBuffer;
use crate::context::GpuContext;
use crate::error::Result;
use crate::handle::IpcMemHandle;
use crate::process::ProcessIdentity;
use crate::slice::GpuSlice;
use crate::stream::AsStream;

/// Typed device memory this process may only read: the read half of [`GpuSlice<T>`] —
/// length, address, copies out. Every read-only import dereferences to one, and
/// [`GpuSlice::as_read_only`] gives one for any buffer, so that code which only reads takes
/// `&ReadOnlySlice<T>` and accepts all of them.
///
/// `ReadOnlySlice<T>` is `Send` and `Sync`. The guide to sharing read-only is on the
/// [`arena`](crate::arena#sharing-read-only) page.
///
/// # What the GPU enforces
///
/// Two guarantees, one per layer:
///
/// - **The type.** [`ReadOnlySlice<T>`] has no method that writes: no `copy_from_host`, no
///   memset, no copy into it, and kernels receive its address as a `const T*`
///   ([`as_raw_ptr`](ReadOnlySlice::as_raw_ptr), or the slice itself as a cudarc kernel
///   argument). Every read-only type here dereferences to it.
/// - **The GPU**, where the driver can map memory read-only: [`ReadOnlyBuffer`] (POSIX-fd
///   buffers) and [`ReadOnlyArena`] map with `CU_MEM_ACCESS_FLAGS_PROT_READ`. Measured on an
///   H200 (driver 580.159.04): kernel reads return the data; a kernel write through the
///   mapping faults (`CUDA_ERROR_ILLEGAL_ADDRESS`, in the writing process only — its context
///   is lost — and the owner's data stays intact); `cuMemsetD*` and `cuMemcpyHtoD` into it
///   fail with `CUDA_ERROR_INVALID_VALUE`. So a bug that writes through a raw address (a
///   kernel given the wrong pointer) cannot reach the shared data.
///
/// Where the driver cannot, only the type holds, and each type says so
/// ([`is_enforced_by_gpu`](ReadOnlyBuffer::is_enforced_by_gpu)):
///
/// | memory | opened with | the GPU refuses writes |
/// | ------ | ----------- | ---------------------- |
/// | POSIX-fd buffer | [`ReadOnlyBuffer::open_fd`], [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only) | yes |
/// | arena and its buffers | [`ReadOnlyArena::open_fd`], [`FdSocket::recv_arena_read_only`](crate::fd::FdSocket::recv_arena_read_only) | yes |
/// | pool and its buffers | [`ReadOnlyPool::open_fd`], [`FdSocket::recv_pool_read_only`](crate::fd::FdSocket::recv_pool_read_only) | **no**: `cuMemPoolSetAccess` with `PROT_READ` answers `CUDA_ERROR_NOT_SUPPORTED` (measured, same GPU and driver, for the importer's device and the owner's) |
/// | pool buffer sent whole ([`HandleType::Pool`](crate::HandleType::Pool)) | [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only) | **no**, as pools |
/// | legacy buffer | — | refused: `cuIpcOpenMemHandle` maps read-write only, so a read-only open of a legacy handle is [`Error::HandleTypeMismatch`](crate::Error::HandleTypeMismatch) (`NoReadOnlyMapping`) rather than a guarantee in name only |
///
/// A read-only import of an export is a mapping of its own: a process that opens the same
/// arena or buffer both read-only and read-write holds two mappings (and two importer slots),
/// so that neither view is ever backed by the other's access.
///
/// An owner that wants no read-write importer at all says so before exporting:
/// [`IpcBuffer::read_only_for_importers`](crate::IpcBuffer::read_only_for_importers),
/// [`IpcArena::read_only_for_importers`](crate::arena::IpcArena::read_only_for_importers),
/// [`IpcPool::read_only_for_importers`](crate::pool::IpcPool::read_only_for_importers). Its handles
/// then carry the mark ([`Handle::is_read_only`](crate::Handle::is_read_only), sealed under
/// the checksum) and read-write opens are refused
/// ([`TypeConflict::ReadOnly`](crate::error::TypeConflict::ReadOnly)).
///
/// **What this protects against:** bugs in cooperating readers. It does not protect against a
/// hostile one: whoever holds the file descriptor can import the memory again itself, read-write
/// (see SECURITY.md).
///
/// # Examples
///
/// It has no method that writes:
///
/// ```compile_fail,E0599
/// fn scribble(weights: &cuda_ipc::ReadOnlySlice<f32>) -> cuda_ipc::Result<()> {
///     weights.copy_from_host(&[0.0]) // error: no method named `copy_from_host`
/// }
/// ```
///
/// ```no_run
/// use cuda_ipc::{GpuContext, IpcBuffer, ReadOnlySlice};
///
/// fn checksum(data: &ReadOnlySlice<u32>) -> cuda_ipc::Result<u64> {
///     let mut host = vec![0u32; data.len()];
///     data.copy_to_host(&mut host)?;
///     Ok(host.iter().map(|&x| u64::from(x)).sum())
/// }
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let buf = IpcBuffer::<u32>::new(&ctx, 4)?;
/// buf.copy_from_host(&[1, 2, 3, 4])?;
/// assert_eq!(checksum(buf.as_read_only())?, 10);
/// # Ok(()) }
/// ```
#[repr(transparent)]
pub struct ReadOnlySlice<T: Pod> {
    pub(crate) slice: GpuSlice<T>,
}

impl<T: Pod> GpuSlice<T> {
    /// This memory as a [`ReadOnlySlice`]: for code that only reads, whatever kind of buffer
    /// it was handed.
    #[must_use]
    pub fn as_read_only(&self) -> &ReadOnlySlice<T> {
        ReadOnlySlice::of(self)
    }
}

impl<T: Pod> ReadOnlySlice<T> {
    pub(crate) fn of(slice: &GpuSlice<T>) -> &Self {
        // SAFETY: `ReadOnlySlice<T>` is `repr(transparent)` over `GpuSlice<T>`, so the two have
        // one layout and the reference cast keeps the borrow's lifetime.
        unsafe { &*std::ptr::from_ref(slice).cast::<Self>() }
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether the slice holds no elements (never, for buffers this crate hands out).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// Size in bytes.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.slice.byte_len()
    }

    /// The context the memory is mapped in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        self.slice.context()
    }

    /// The raw device address, for a kernel parameter declared `const T*`.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.slice.as_raw_ptr()
    }

    /// Copy the memory to `dst` (exactly [`len`](Self::len) elements), as
    /// [`GpuSlice::copy_to_host`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) on a length mismatch,
    /// [`Error::Cuda`](crate::Error::Cuda) naming `cuMemcpyDtoH`.
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.slice.copy_to_host(dst)
    }

    /// Enqueue a device-to-host copy on `stream`, as [`GpuSlice::copy_to_host_async`].
    ///
    /// # Safety
    ///
    /// As [`GpuSlice::copy_to_host_async`]: `dst` stays alive and untouched, and this memory's
    /// owner alive, until the copy has completed on `stream`.
    ///
    /// # Errors
    ///
    /// As [`GpuSlice::copy_to_host_async`].
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub unsafe fn copy_to_host_async(
        &self,
        dst: &mut [T],
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { self.slice.copy_to_host_async(dst, stream) }
    }

    /// Copy this memory into `dst` (same length), device to device on `stream`
    /// (`cuMemcpyDtoDAsync`): a reader's own, writable copy.
    ///
    /// # Safety
    ///
    /// As [`GpuSlice::copy_from_device_async`]: both owners stay alive until the copy has
    /// completed on `stream`.
    ///
    /// # Errors
    ///
    /// As [`GpuSlice::copy_from_device_async`].
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub unsafe fn copy_to_device_async(
        &self,
        dst: &GpuSlice<T>,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { dst.copy_from_device_async(&self.slice, stream) }
    }
}

impl<T: Pod> std::fmt::Debug for ReadOnlySlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlySlice")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.slice.len())
            .field("device", &self.slice.context().ordinal())
            .field("ptr", &format_args!("{:#x}", self.slice.as_raw_ptr()))
            .finish()
    }
}

/// A buffer another process exported, mapped so that this process can only read it (see
/// [`ReadOnlySlice`](ReadOnlySlice#what-the-gpu-enforces)): a [`HandleType::PosixFd`](crate::HandleType::PosixFd) buffer mapped
/// `PROT_READ` (the GPU refuses writes), or a [`HandleType::Pool`](crate::HandleType::Pool)
/// buffer received with [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only)
/// (the type alone: pools cannot be mapped read-only). It dereferences to its
/// [`ReadOnlySlice`]; otherwise it is an [`ImportedBuffer`] (a lease
/// on the export, the mapping kept alive after the exporter drops its buffer).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cuda_ipc::{GpuContext};
/// use cuda_ipc::fd::{FdSocket, PeerPolicy, SocketName};
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let name = SocketName::Abstract("weights".into());
/// let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, Duration::from_secs(5))?;
/// let weights = socket.recv_buffer_read_only::<f32>(&ctx, Duration::from_secs(5))?;
/// assert!(weights.is_enforced_by_gpu()); // a POSIX-fd buffer
/// let mut host = vec![0f32; weights.len()];
/// weights.copy_to_host(&mut host)?;
/// # Ok(()) }
/// ```
pub struct ReadOnlyBuffer<T: Pod> {
    inner: ImportedBuffer<T>,
    enforced: bool,
}

impl<T: Pod> std::ops::Deref for ReadOnlyBuffer<T> {
    type Target = ReadOnlySlice<T>;

    fn deref(&self) -> &ReadOnlySlice<T> {
        ReadOnlySlice::of(&self.inner)
    }
}

impl<T: Pod> ReadOnlyBuffer<T> {
    /// Map a [`HandleType::PosixFd`](crate::HandleType::PosixFd) buffer read-only from its
    /// handle and descriptor: as [`ImportedBuffer::open_fd`](crate::ImportedBuffer::open_fd),
    /// with `cuMemSetAccess` granting `CU_MEM_ACCESS_FLAGS_PROT_READ`. `fd` is consumed.
    ///
    /// # Errors
    ///
    /// As [`ImportedBuffer::open_fd`](crate::ImportedBuffer::open_fd); a legacy handle is
    /// [`Error::HandleTypeMismatch`](crate::Error::HandleTypeMismatch) (`NoReadOnlyMapping`:
    /// the driver has no read-only legacy mapping).
    #[doc(alias = "CU_MEM_ACCESS_FLAGS_PROT_READ")]
    pub fn open_fd(ctx: &GpuContext, handle: &IpcMemHandle<T>, fd: OwnedFd) -> Result<Self> {
        ImportedBuffer::open_fd_read_only(ctx, handle, fd).map(|inner| Self {
            inner,
            enforced: true,
        })
    }

    /// A pool buffer, read-only by type only (pools cannot be mapped read-only).
    pub(crate) fn pooled(inner: ImportedBuffer<T>) -> Self {
        Self {
            inner,
            enforced: false,
        }
    }

    /// Whether the GPU refuses writes through this mapping (true for POSIX-fd buffers), or
    /// only the type does (pool buffers: see the [`ReadOnlySlice`](ReadOnlySlice#what-the-gpu-enforces)).
    #[must_use]
    pub fn is_enforced_by_gpu(&self) -> bool {
        self.enforced
    }

    /// The exporting process.
    #[must_use]
    pub fn exporter(&self) -> Option<ProcessIdentity> {
        self.inner.exporter()
    }

    /// Give `ctx`'s device read access to the mapping (as
    /// [`ImportedBuffer::grant_access`](crate::ImportedBuffer::grant_access), read-only).
    ///
    /// # Errors
    ///
    /// As [`ImportedBuffer::grant_access`](crate::ImportedBuffer::grant_access).
    pub fn grant_access(&self, ctx: &GpuContext) -> Result<()> {
        self.inner.grant_access(ctx)
    }
}

impl<T: Pod> std::fmt::Debug for ReadOnlyBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyBuffer")
            .field("slice", &**self)
            .field("enforced_by_gpu", &self.enforced)
            .finish_non_exhaustive()
    }
}
