//! cudarc (feature `cudarc`): contexts, streams and kernel arguments.
//!
//! Every kernel-argument impl pushes a reference to a `u64` device address that lives as long
//! as the borrow `'b`, which outlives the launch arguments `'a`; a `u64` is what the kernel's
//! pointer parameter reads. cudarc's launch is `unsafe`: its caller keeps the memory's owner
//! alive until the kernel has completed (see
//! [asynchronous work](crate::GpuSlice#asynchronous-work)).

use bytemuck::Pod;

use crate::buffer::{ImportedBuffer, IpcBuffer};
use crate::context::GpuContext;
use crate::driver::sys;
use crate::error::Result;
use crate::slice::GpuSlice;
use crate::slice::ReadOnlySlice;
use crate::stream::AsStream;

impl GpuContext {
    /// The same primary context as a cudarc [`CudaContext`](cudarc::driver::CudaContext)
    /// (which, like this crate, uses each device's primary context).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the cudarc context is not
    /// its device's primary context; [`Error::Cuda`](crate::Error::Cuda) from the driver calls.
    pub fn from_cudarc(ctx: &cudarc::driver::CudaContext) -> Result<Self> {
        // SAFETY: the CudaContext keeps its context retained while borrowed.
        unsafe { Self::from_primary(ctx.cu_ctx().cast(), "GpuContext::from_cudarc") }
    }
}

// SAFETY: a cudarc `CudaStream` owns its handle (or is the context's null stream) and destroys
// it only on drop.
unsafe impl AsStream for cudarc::driver::CudaStream {
    fn as_cu_stream(&self) -> sys::CUstream {
        self.cu_stream().cast()
    }
}

/// A `GpuSlice` is a kernel argument of cudarc launches: it passes the device address, as a
/// `CudaSlice` does.
// SAFETY: see the module docs (the address is the slice's own field, borrowed for `'b`).
unsafe impl<'a, 'b: 'a, T: Pod> cudarc::driver::PushKernelArg<&'b GpuSlice<T>>
    for cudarc::driver::LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b GpuSlice<T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

/// A `ReadOnlySlice` passes its device address by value, as a kernel's `const T*` parameter
/// expects.
// SAFETY: see the module docs (the address is the inner slice's field, borrowed for `'b`).
unsafe impl<'a, 'b: 'a, T: Pod> cudarc::driver::PushKernelArg<&'b ReadOnlySlice<T>>
    for cudarc::driver::LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b ReadOnlySlice<T>) -> &mut Self {
        self.arg(&arg.slice.ptr)
    }
}

/// An `IpcBuffer` or `ImportedBuffer` is a kernel argument as its [`GpuSlice`] is.
macro_rules! buffer_kernel_arg {
    ($ty:ident) => {
        // SAFETY: see the module docs (the address is the buffer's slice's field, reached
        // through `Deref` for the borrow `'b`).
        unsafe impl<'a, 'b: 'a, T: Pod> cudarc::driver::PushKernelArg<&'b $ty<T>>
            for cudarc::driver::LaunchArgs<'a>
        {
            #[inline(always)]
            fn arg(&mut self, arg: &'b $ty<T>) -> &mut Self {
                let slice: &'b GpuSlice<T> = arg;
                self.arg(&slice.ptr)
            }
        }
    };
}
buffer_kernel_arg!(IpcBuffer);
buffer_kernel_arg!(ImportedBuffer);
