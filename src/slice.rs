//! [`GpuSlice<T>`]: typed device memory in one context — the view every buffer type of this
//! crate reaches (owned or imported, whole allocation or arena block), with its length,
//! address, host copies, device copies and memsets.
//!
//! A `GpuSlice` is never owned on its own: [`IpcBuffer`](crate::IpcBuffer),
//! [`ArenaBuffer`](crate::arena::ArenaBuffer) and [`ArenaView`](crate::arena::ArenaView) hold one
//! and dereference to it, so that these methods are written (and documented) once and every role
//! offers the same data operations.

use std::marker::PhantomData;

use bytemuck::Pod;

use crate::context::GpuContext;
use crate::driver::{self, sys};
use crate::error::{ArgumentDefect, Error, Result};
use crate::stream::AsStream;

/// `len` values of `T` at a device address, in a context: the data half of every buffer type
/// (they dereference to it). The memory belongs to whoever holds the slice (an exported or
/// imported [`IpcBuffer`](crate::IpcBuffer), an arena block), which keeps it mapped for as
/// long as the slice can be reached.
///
/// Device memory is not Rust memory: methods take `&self`, and concurrent writes from several
/// processes are a GPU data race for the caller to order (with [`IpcEvent`](crate::IpcEvent)s
/// and barriers), not undefined behaviour in this process.
///
/// # Asynchronous work
///
/// The synchronous methods ([`copy_from_host`](Self::copy_from_host),
/// [`copy_to_host`](Self::copy_to_host), [`memset_bytes`](Self::memset_bytes)) are done with the
/// memory when they return. The `*_async` methods, like kernels launched on
/// [`as_raw_ptr`](Self::as_raw_ptr), only *enqueue* work that touches the memory later; the slice's
/// owner does not track that work, and dropping it (unmapping an import, freeing an export, giving
/// an arena block back) does not wait for it. That is why they are `unsafe`: the caller keeps the
/// owner alive until the work has completed (synchronise the stream, or an event recorded after the
/// work, before dropping; [`GpuContext::synchronize`](crate::GpuContext::synchronize) when the work
/// went on streams the caller cannot name).
///
/// `GpuSlice<T>` is `Send` and `Sync` (a device address and a context handle).
///
/// # Examples
///
/// Code that only reads and writes device memory takes a `&GpuSlice<T>`, whatever kind of
/// buffer it came from:
///
/// ```no_run
/// use cuda_ipc::{GpuContext, GpuSlice, IpcBuffer};
///
/// fn checksum(data: &GpuSlice<u32>) -> cuda_ipc::Result<u64> {
///     let mut host = vec![0u32; data.len()];
///     data.copy_to_host(&mut host)?;
///     Ok(host.iter().map(|&x| u64::from(x)).sum())
/// }
///
/// # fn main() -> cuda_ipc::Result<()> {
/// let ctx = GpuContext::new(0)?;
/// let buf = IpcBuffer::<u32>::new(&ctx, 4)?; // an exported buffer; an import works the same
/// buf.copy_from_host(&[1, 2, 3, 4])?;
/// assert_eq!(checksum(&buf)?, 10);
/// # Ok(()) }
/// ```
pub struct GpuSlice<T: Pod> {
    pub(crate) ctx: GpuContext,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod> GpuSlice<T> {
    /// The slice of `len` elements at `ptr` in `ctx`; the caller owns the mapping and keeps it
    /// alive while the slice can be reached.
    pub(crate) fn new(ctx: GpuContext, ptr: sys::CUdeviceptr, len: usize) -> Self {
        Self {
            ctx,
            ptr,
            len,
            _elem: PhantomData,
        }
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice holds no elements (never, for buffers this crate hands out).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The context the memory is mapped in.
    #[must_use]
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The raw device address.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.ptr
    }

    fn check_len(&self, call: &'static str, n: usize) -> Result<()> {
        if n == self.len {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                call,
                defect: ArgumentDefect::LengthMismatch {
                    what: "host slice length",
                    expected: self.len as u64,
                    found: n as u64,
                },
            })
        }
    }

    /// Copy `src` (exactly [`len`](Self::len) elements) to the device (`cuMemcpyHtoD` on the
    /// legacy default stream, so after earlier work of this process's blocking streams), and
    /// wait until the data is on the device (`cuStreamSynchronize` of the legacy stream):
    /// `cuMemcpyHtoD` alone may return while its DMA is still in flight, before another
    /// process could see the data.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a length mismatch, [`Error::Cuda`] naming `cuMemcpyHtoD`
    /// or `cuStreamSynchronize`.
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        self.check_len("GpuSlice::copy_from_host", src.len())?;
        let _g = self.ctx.enter()?;
        // SAFETY: `src` is valid for `byte_len` bytes, the device range is this buffer's.
        unsafe { driver::mem::copy_htod(self.ptr, src.as_ptr().cast(), self.byte_len()) }?;
        sync_legacy_stream()
    }

    /// Copy the device contents into `dst` (exactly [`len`](Self::len) elements)
    /// (`cuMemcpyDtoH`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a length mismatch, [`Error::Cuda`] naming `cuMemcpyDtoH`.
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("GpuSlice::copy_to_host", dst.len())?;
        let _g = self.ctx.enter()?;
        // SAFETY: `dst` is valid for writes of `byte_len` bytes, and any bytes are a valid T.
        unsafe { driver::mem::copy_dtoh(dst.as_mut_ptr().cast(), self.ptr, self.byte_len()) }
    }

    /// Enqueue a host-to-device copy on `stream` (`cuMemcpyHtoDAsync`).
    ///
    /// # Safety
    ///
    /// `src` must stay alive and unmodified until the copy has completed on `stream` (for
    /// example, until the stream is synchronised). For a copy that overlaps other work,
    /// `src` should be page-locked memory.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a length mismatch, [`Error::Cuda`] naming
    /// `cuMemcpyHtoDAsync`.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub unsafe fn copy_from_host_async(
        &self,
        src: &[T],
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        self.check_len("GpuSlice::copy_from_host_async", src.len())?;
        let _g = self.ctx.enter()?;
        // SAFETY: lifetime of `src` until completion is the caller's duty (forwarded).
        unsafe {
            driver::mem::copy_htod_async(
                self.ptr,
                src.as_ptr().cast(),
                self.byte_len(),
                stream.as_cu_stream(),
            )
        }
    }

    /// Enqueue a device-to-host copy on `stream` (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    ///
    /// `dst` must stay alive and must not be read or written until the copy has completed on
    /// `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a length mismatch, [`Error::Cuda`] naming
    /// `cuMemcpyDtoHAsync`.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub unsafe fn copy_to_host_async(
        &self,
        dst: &mut [T],
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        self.check_len("GpuSlice::copy_to_host_async", dst.len())?;
        let _g = self.ctx.enter()?;
        // SAFETY: lifetime and exclusivity of `dst` until completion are the caller's duty.
        unsafe {
            driver::mem::copy_dtoh_async(
                dst.as_mut_ptr().cast(),
                self.ptr,
                self.byte_len(),
                stream.as_cu_stream(),
            )
        }
    }

    /// Copy another buffer's contents (same length) into this one, device to device
    /// (`cuMemcpyDtoDAsync` on `stream`): through an IPC mapping, this is a peer copy.
    ///
    /// # Safety
    ///
    /// The copy runs later, on the device, after this call returns: both `self` and `src`
    /// must stay alive until it has completed on `stream` (for example, until
    /// `stream.synchronize()` returns). Dropping the last view of an imported buffer unmaps
    /// it at once (`cuIpcCloseMemHandle`) and dropping an exported one frees it, whatever is
    /// still queued: a copy still in flight would then read or write memory that is no longer
    /// this buffer's (a device use-after-free). See [the type's docs](Self#asynchronous-work).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a length mismatch, [`Error::Cuda`] naming the call.
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub unsafe fn copy_from_device_async(
        &self,
        src: &GpuSlice<T>,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        self.check_len("GpuSlice::copy_from_device_async", src.len)?;
        let _g = self.ctx.enter()?;
        // SAFETY: both ranges are live device allocations of `byte_len` bytes now; that they
        // stay so until the copy completes is the caller's duty (forwarded).
        unsafe {
            driver::mem::copy_dtod_async(self.ptr, src.ptr, self.byte_len(), stream.as_cu_stream())
        }
    }

    /// Set every byte to `value` (`cuMemsetD8` on the legacy default stream, so after earlier
    /// work of this process's blocking streams), and wait until it is done
    /// (`cuStreamSynchronize` of the legacy stream): `cuMemsetD8` alone returns before the
    /// device has written, and another process could read the old bytes.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemsetD8` or `cuStreamSynchronize`.
    #[doc(alias = "cuMemsetD8")]
    pub fn memset_bytes(&self, value: u8) -> Result<()> {
        let _g = self.ctx.enter()?;
        // SAFETY: the device range is this buffer's `byte_len` bytes.
        unsafe { driver::mem::set_bytes(self.ptr, value, self.byte_len()) }?;
        sync_legacy_stream()
    }

    /// Enqueue setting every byte to `value` on `stream` (`cuMemsetD8Async`).
    ///
    /// # Safety
    ///
    /// The buffer must stay alive until the memset has completed on `stream`, as for
    /// [`copy_from_device_async`](Self::copy_from_device_async).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] naming `cuMemsetD8Async`.
    #[doc(alias = "cuMemsetD8Async")]
    pub unsafe fn memset_bytes_async(
        &self,
        value: u8,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        let _g = self.ctx.enter()?;
        // SAFETY: the range is this buffer's `byte_len` bytes, live now; that it stays so until
        // the memset completes is the caller's duty (forwarded).
        unsafe {
            driver::mem::set_bytes_async(self.ptr, value, self.byte_len(), stream.as_cu_stream())
        }
    }
}

/// Wait for the current context's legacy default stream (`cuStreamSynchronize(NULL)`).
fn sync_legacy_stream() -> Result<()> {
    // SAFETY: the null stream is the current context's legacy default stream, always valid
    // while a context is current (the callers hold a pushed context).
    unsafe { driver::stream::synchronize(std::ptr::null_mut()) }
}

impl<T: Pod> std::fmt::Debug for GpuSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSlice")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("device", &self.ctx.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

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
/// - **The GPU**, where the driver can map memory read-only:
///   [`ReadOnlyBuffer`](crate::ReadOnlyBuffer) (POSIX-fd buffers) and
///   [`ReadOnlyArena`](crate::arena::ReadOnlyArena) map with `CU_MEM_ACCESS_FLAGS_PROT_READ`.
///   Measured on an H200 (driver 580.159.04): kernel reads return the data; a kernel write through
///   the mapping faults (`CUDA_ERROR_ILLEGAL_ADDRESS`, in the writing process only — its context is
///   lost — and the owner's data stays intact); `cuMemsetD*` and `cuMemcpyHtoD` into it fail with
///   `CUDA_ERROR_INVALID_VALUE`. So a bug that writes through a raw address (a kernel given the
///   wrong pointer) cannot reach the shared data.
///
/// Where the driver cannot, only the type holds, and each type says so
/// ([`is_enforced_by_gpu`](crate::ReadOnlyBuffer::is_enforced_by_gpu)):
///
/// | memory | opened with | the GPU refuses writes |
/// | ------ | ----------- | ---------------------- |
/// | POSIX-fd buffer | [`ReadOnlyBuffer::open_fd`](crate::ReadOnlyBuffer::open_fd), [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only) | yes |
/// | arena and its buffers | [`ReadOnlyArena::open_fd`](crate::arena::ReadOnlyArena::open_fd), [`FdSocket::recv_arena_read_only`](crate::fd::FdSocket::recv_arena_read_only) | yes |
/// | pool and its buffers | [`ReadOnlyPool::open_fd`](crate::pool::ReadOnlyPool::open_fd), [`FdSocket::recv_pool_read_only`](crate::fd::FdSocket::recv_pool_read_only) | **no**: `cuMemPoolSetAccess` with `PROT_READ` answers `CUDA_ERROR_NOT_SUPPORTED` (measured, same GPU and driver, for the importer's device and the owner's) |
/// | pool buffer sent whole ([`HandleType::Pool`](crate::HandleType::Pool)) | [`FdSocket::recv_buffer_read_only`](crate::fd::FdSocket::recv_buffer_read_only) | **no**, as pools |
/// | legacy buffer | — | refused: `cuIpcOpenMemHandle` maps read-write only, so a read-only open of a legacy handle is [`Error::HandleTypeMismatch`] (`NoReadOnlyMapping`) rather than a guarantee in name only |
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
    /// [`Error::InvalidArgument`] on a length mismatch,
    /// [`Error::Cuda`] naming `cuMemcpyDtoH`.
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

/// `Deref` of a type to the field that holds the operations every role of it shares — its
/// memory ([`GpuSlice`]), event or signal — or, with `read_only`, to that memory's
/// [`ReadOnlySlice`]: written once here for every exported, imported and read-only type
/// (`with Debug`: and a `Debug` that shows that field).
macro_rules! deref_to {
    ($ty:ident<T> => $field:ident: GpuSlice<T>) => {
        impl<T: bytemuck::Pod> std::ops::Deref for $ty<T> {
            type Target = $crate::slice::GpuSlice<T>;
            fn deref(&self) -> &$crate::slice::GpuSlice<T> {
                &self.$field
            }
        }
    };
    ($ty:ident<T> => read_only $field:ident) => {
        impl<T: bytemuck::Pod> std::ops::Deref for $ty<T> {
            type Target = $crate::slice::ReadOnlySlice<T>;
            fn deref(&self) -> &$crate::slice::ReadOnlySlice<T> {
                $crate::slice::ReadOnlySlice::of(&self.$field)
            }
        }
    };
    ($ty:ident => $field:ident: $target:ty, with Debug) => {
        $crate::slice::deref_to!($ty => $field: $target);
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($ty)).field(&self.$field).finish()
            }
        }
    };
    ($ty:ident => $field:ident: $target:ty) => {
        impl std::ops::Deref for $ty {
            type Target = $target;
            fn deref(&self) -> &$target {
                &self.$field
            }
        }
    };
}
pub(crate) use deref_to;
