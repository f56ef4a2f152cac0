//! cust (feature `cust`): contexts, streams and kernel arguments.

use bytemuck::Pod;

use crate::context::GpuContext;
use crate::driver::sys;
use crate::error::Result;
use crate::slice::GpuSlice;
use crate::stream::AsStream;

impl GpuContext {
    /// The same primary context as a cust [`Context`](cust::context::Context).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the cust context is not its
    /// device's primary context; [`Error::Cuda`](crate::Error::Cuda) from the driver calls.
    pub fn from_cust(ctx: &cust::context::Context) -> Result<Self> {
        // SAFETY: the cust Context keeps its context retained while borrowed.
        unsafe { Self::from_primary(ctx.as_raw().cast(), "GpuContext::from_cust") }
    }
}

// SAFETY: a cust `Stream` owns its handle and destroys it only on drop.
unsafe impl AsStream for cust::stream::Stream {
    fn as_cu_stream(&self) -> sys::CUstream {
        self.as_inner().cast()
    }
}

impl<T: Pod + cust::memory::DeviceCopy> GpuSlice<T> {
    /// The device pointer, for cust kernel launches (feature `cust`).
    #[must_use]
    pub fn device_ptr(&self) -> cust::memory::DevicePointer<T> {
        cust::memory::DevicePointer::from_raw(self.ptr)
    }
}
