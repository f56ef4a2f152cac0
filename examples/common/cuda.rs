//! Kernels and streams for the examples, tests and benches, with nothing CUDA needed to build:
//! PTX loaded at run time and kernels launched through cudarc's driver calls (a dev-dependency
//! that loads `libcuda` at run time, as cuda-ipc does), on the context current on the calling
//! thread (a [`cuda_ipc::GpuContext`] makes its context current when created, and
//! [`make_current`](cuda_ipc::GpuContext::make_current) makes it so again).
//!
//! The names follow cust's (`Stream`, `Module`, `launch!`), which these programs used before
//! cust became an optional feature of cuda-ipc. A [`Stream`] is a stream cuda-ipc accepts
//! ([`cuda_ipc::AsStream`]). Applications would use their own CUDA crate here: cudarc's
//! `CudaStream` and launch builder (cuda-ipc's `cudarc` feature), cust (its `cust` feature),
//! or any raw `CUstream` ([`cuda_ipc::RawStream`]).
#![allow(dead_code, unused_macros, unused_imports, non_camel_case_types)]

use std::ffi::{CString, c_void};

use cudarc::driver::result;
use cudarc::driver::sys;

/// What a driver call here returned instead of success.
pub type Error = cudarc::driver::DriverError;

/// The error for an argument the driver would refuse (a NUL inside a name, say).
fn invalid_value() -> Error {
    cudarc::driver::DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// How a stream synchronises with the legacy default stream (cust's names).
#[derive(Clone, Copy, Debug)]
pub enum StreamFlags {
    /// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy stream.
    NON_BLOCKING,
}

/// A stream of the current context, destroyed on drop.
#[derive(Debug)]
pub struct Stream(sys::CUstream);

// SAFETY: a CUstream handle may be used from any thread; it is only passed to the driver.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// `cuStreamCreate` in the current context (the priority is not used).
    pub fn new(flags: StreamFlags, _priority: Option<i32>) -> Result<Self, Error> {
        let kind = match flags {
            StreamFlags::NON_BLOCKING => result::stream::StreamKind::NonBlocking,
        };
        result::stream::create(kind).map(Self)
    }

    /// Wait until the stream's work is done (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        // SAFETY: the stream is live (destroyed only on drop).
        unsafe { result::stream::synchronize(self.0) }
    }

    /// The raw handle.
    pub fn as_inner(&self) -> sys::CUstream {
        self.0
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; the driver finishes queued work first.
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

// SAFETY: the handle stays valid while the `Stream` lives (destroyed only on drop).
unsafe impl cuda_ipc::AsStream for Stream {
    fn as_cu_stream(&self) -> cuda_ipc::driver::sys::CUstream {
        self.0.cast()
    }
}

/// A module loaded from PTX into the current context (`cuModuleLoadData`), unloaded on drop.
#[derive(Debug)]
pub struct Module(sys::CUmodule);

impl Module {
    /// Load `ptx` (the driver JIT-compiles it for the current device). The options are
    /// cust's; none is used.
    pub fn from_ptx(ptx: &str, _options: &[()]) -> Result<Self, Error> {
        let image = CString::new(ptx).map_err(|_| invalid_value())?;
        // SAFETY: a NUL-terminated PTX image, read during the call.
        unsafe { result::module::load_data(image.as_ptr().cast()) }.map(Self)
    }

    /// The kernel called `name`.
    pub fn get_function(&self, name: &str) -> Result<Function<'_>, Error> {
        let name = CString::new(name).map_err(|_| invalid_value())?;
        // SAFETY: the module is loaded (until drop, which the borrow outlives).
        let f = unsafe { result::module::get_function(self.0, name) }?;
        Ok(Function(f, std::marker::PhantomData))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `from_ptx`, unloaded once.
        let _ = unsafe { result::module::unload(self.0) };
    }
}

/// A kernel of a [`Module`].
#[derive(Debug, Clone, Copy)]
pub struct Function<'m>(sys::CUfunction, std::marker::PhantomData<&'m Module>);

/// A block shape, as cust names it (only `x` is used here).
#[derive(Debug, Clone, Copy)]
pub struct BlockSize(u32);

impl BlockSize {
    /// `x` threads per block.
    pub fn x(x: u32) -> Self {
        Self(x)
    }
}

impl Function<'_> {
    /// How many blocks of `block` threads fit on one multiprocessor at once.
    pub fn max_active_blocks_per_multiprocessor(
        &self,
        block: BlockSize,
        dynamic_smem: usize,
    ) -> Result<u32, Error> {
        let threads = i32::try_from(block.0).map_err(|_| invalid_value())?;
        // SAFETY: the function belongs to a live module (the borrow).
        let n = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(self.0, threads, dynamic_smem)
        }?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// Launch with `args` (each the address of one kernel parameter) on `stream`.
    ///
    /// # Safety
    ///
    /// `args` must match the kernel's parameters in number, order and size, and every
    /// memory the kernel touches must outlive its execution.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        shared: u32,
        stream: &Stream,
        args: &mut [*mut c_void],
    ) -> Result<(), Error> {
        // SAFETY: forwarded to the caller.
        unsafe {
            result::launch_kernel(self.0, (grid, 1, 1), (block, 1, 1), shared, stream.0, args)
        }
    }
}

/// `launch!(kernel<<<grid, block, shared, stream>>>(arg, ...))`: cust's launch syntax over
/// [`Function::launch`]. Each argument is evaluated once, in order, into a local of its own
/// (the `@bind` steps: one hygienic `arg` per step), and passed by address from an array on
/// the stack: a launch allocates nothing (benches launch inside their timed loops). The call
/// is `unsafe` for the same reasons as [`Function::launch`].
macro_rules! launch {
    ($f:ident <<< $grid:expr, $block:expr, $shared:expr, $stream:ident >>> ( $($arg:expr),* $(,)? )) => {
        launch!(@bind [$f, $grid, $block, $shared, $stream] [] $($arg,)*)
    };
    (@bind $call:tt [$($bound:ident)*] $head:expr, $($rest:expr,)*) => {{
        let mut arg = $head;
        launch!(@bind $call [$($bound)* arg] $($rest,)*)
    }};
    (@bind [$f:ident, $grid:expr, $block:expr, $shared:expr, $stream:ident] [$($bound:ident)*]) => {{
        let params: &mut [*mut std::ffi::c_void] =
            &mut [$(std::ptr::addr_of_mut!($bound).cast::<std::ffi::c_void>()),*];
        let grid: u32 = ($grid) as u32;
        let block: u32 = ($block) as u32;
        $f.launch(grid, block, $shared, &$stream, params)
    }};
}
pub(crate) use launch;

/// Device memory of the current context (`cuMemAlloc`), freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

impl<T: Copy> DeviceBuffer<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Result<Self, Error> {
        let bytes = len * std::mem::size_of::<T>();
        // SAFETY: a plain allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }?;
        // SAFETY: `bytes` of the allocation just made.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }?;
        Ok(Self {
            ptr,
            len,
            _elem: std::marker::PhantomData,
        })
    }

    /// The device address.
    pub fn as_raw_ptr(&self) -> u64 {
        self.ptr
    }

    /// Copy the whole buffer to `host` (`cuMemcpyDtoH`).
    pub fn copy_to(&self, host: &mut [T]) -> Result<(), Error> {
        if host.len() != self.len {
            return Err(invalid_value());
        }
        // SAFETY: `host` holds `len` elements; the allocation is live.
        unsafe { result::memcpy_dtoh_sync(host, self.ptr) }
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed`, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}
