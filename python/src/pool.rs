//! Pools shared with NVIDIA's cuda.core (and C/C++ programs): [`Pool`], a stream-ordered pool
//! whose tensors a cuda.core process opens (`DeviceMemoryResource.from_allocation_handle` with
//! the pool's descriptor, `Buffer.from_ipc_descriptor` with a tensor's), and [`ForeignPool`], a
//! cuda.core pool imported here, whose buffers open as tensors. The crate's `pool` module docs
//! give the rules; `python/README.md` the Python guide.

use std::os::fd::{BorrowedFd, IntoRawFd};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyTuple};

use crate::Context;
use crate::errors::{CorruptHandle, to_py};
use crate::tensor::{Memory, Tensor, layout};
use cuda_ipc::pool::PoolBufferDescriptor;

/// A stream-ordered memory pool on one device whose tensors other programs open: cuda.core
/// (`DeviceMemoryResource.from_allocation_handle(device, pool.allocation_handle())`, then
/// `Buffer.from_ipc_descriptor(mr, cuda_ipc.cuda_core.ipc_descriptor(t.ipc_descriptor()))`) or
/// C/C++ (`cuMemPoolImportFromShareableHandle`, `cuMemPoolImportPointer`).
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Pool {
    pool: cuda_ipc::pool::IpcPool,
    ctx: cuda_ipc::GpuContext,
}

#[pymethods]
impl Pool {
    /// A pool on `ctx`'s device, exportable as a POSIX file descriptor.
    #[new]
    fn new(py: Python<'_>, ctx: &Context) -> PyResult<Self> {
        let gpu = ctx.ctx.clone();
        let pool = py
            .detach(|| cuda_ipc::pool::IpcPool::new(&gpu))
            .map_err(to_py)?;
        Ok(Self {
            pool,
            ctx: ctx.ctx.clone(),
        })
    }

    /// A tensor of `shape` and `dtype` from the pool (contents unspecified), allocated on the
    /// legacy stream.
    #[pyo3(signature = (shape, dtype))]
    fn empty(&self, py: Python<'_>, shape: Vec<i64>, dtype: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        let (dtype, bytes) = layout(&shape, dtype)?;
        let buffer = py
            .detach(|| self.pool.alloc::<u8>(bytes, &cuda_ipc::RawStream::LEGACY))
            .map_err(to_py)?;
        Ok(Tensor::in_context(
            Memory::Pooled(buffer),
            &self.ctx,
            dtype,
            shape,
        ))
    }

    /// A new POSIX file descriptor of the pool (`cuMemPoolExportToShareableHandle`), yours to
    /// send (`multiprocessing.reduction.send_handle`, `socket.send_fds`) and to close: what
    /// cuda.core's `DeviceMemoryResource.from_allocation_handle` takes.
    fn allocation_handle(&self, py: Python<'_>) -> PyResult<i32> {
        let (_, fd) = py.detach(|| self.pool.export_fd()).map_err(to_py)?;
        Ok(fd.into_raw_fd())
    }

    /// The pids of processes of this package that import the pool (cuda.core importers keep no
    /// record here).
    fn importers(&self) -> Vec<u32> {
        self.pool.importers()
    }

    fn __repr__(&self) -> String {
        format!("Pool(device={})", self.ctx.ordinal())
    }
}

/// Another program's pool (cuda.core's IPC-enabled `DeviceMemoryResource`, or C/C++'s
/// `cuMemPoolExportToShareableHandle`), imported from its POSIX file descriptor: its buffers
/// open as tensors with `open`.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct ForeignPool {
    pool: cuda_ipc::pool::ForeignPool,
    ctx: cuda_ipc::GpuContext,
}

#[pymethods]
impl ForeignPool {
    /// Import the pool from `allocation_handle`: a file descriptor (an `int`; it is duplicated,
    /// yours stays yours) or cuda.core's `IPCAllocationHandle`. `exporter_pid`, if given, is
    /// checked alive now and at each `open` (`PeerGone` once it died).
    #[new]
    #[pyo3(signature = (ctx, allocation_handle, *, exporter_pid = None))]
    fn new(
        py: Python<'_>,
        ctx: &Context,
        allocation_handle: &Bound<'_, PyAny>,
        exporter_pid: Option<u32>,
    ) -> PyResult<Self> {
        let fd = fd_of(allocation_handle)?;
        if fd < 0 {
            return Err(PyValueError::new_err(format!("file descriptor {fd}")));
        }
        // SAFETY: only borrowed for the duplication below; the caller keeps its descriptor.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let owned = borrowed
            .try_clone_to_owned()
            .map_err(|e| PyValueError::new_err(format!("file descriptor {fd}: {e}")))?;
        let gpu = ctx.ctx.clone();
        let pool = py
            .detach(|| cuda_ipc::pool::ForeignPool::open_fd(&gpu, owned, exporter_pid))
            .map_err(to_py)?;
        Ok(Self {
            pool,
            ctx: ctx.ctx.clone(),
        })
    }

    /// Open one buffer as a tensor of `shape` and `dtype`, from its descriptor: cuda.core's
    /// `IPCBufferDescriptor` (`buffer.ipc_descriptor`), a tuple `(export_data, size)`, or the
    /// 72 bytes `Tensor.ipc_descriptor()` gives; a size past the allocation, or a tensor past
    /// the size, is `CorruptHandle`. The exporter must keep the buffer until this tensor (and
    /// every DLPack consumer of it) is gone and released (`wait_released`): no record of a
    /// foreign exporter can hold it to that.
    #[pyo3(signature = (descriptor, shape, dtype))]
    fn open(
        &self,
        py: Python<'_>,
        descriptor: &Bound<'_, PyAny>,
        shape: Vec<i64>,
        dtype: &Bound<'_, PyAny>,
    ) -> PyResult<Tensor> {
        let descriptor = descriptor_of(descriptor)?;
        let (dtype, bytes) = layout(&shape, dtype)?;
        if bytes as u64 > descriptor.bytes {
            return Err(CorruptHandle::new_err(format!(
                "a tensor of {bytes} bytes does not fit the {}-byte buffer",
                descriptor.bytes
            )));
        }
        // The whole buffer is opened, so that a descriptor claiming more than its allocation
        // is refused even when the tensor would fit.
        // SAFETY: the rule above is the caller's, as the docs say (cuda.core's own importers
        // are under the same one).
        let view = py
            .detach(|| unsafe { self.pool.open::<u8>(&descriptor) })
            .map_err(to_py)?;
        Ok(Tensor::in_context(
            Memory::PoolView(view),
            &self.ctx,
            dtype,
            shape,
        ))
    }

    /// The exporter's pid, if it was named.
    #[getter]
    fn exporter_pid(&self) -> Option<u32> {
        self.pool.exporter().map(|e| e.pid())
    }

    fn __repr__(&self) -> String {
        format!(
            "ForeignPool(device={}, exporter_pid={:?})",
            self.ctx.ordinal(),
            self.exporter_pid()
        )
    }
}

/// The 72 bytes of a pool buffer descriptor given as `ForeignPool.open` takes it (cuda.core's
/// `IPCBufferDescriptor`, `(export_data, size)`, or the bytes themselves, checked).
#[pyfunction]
pub(crate) fn descriptor_bytes<'py>(
    py: Python<'py>,
    descriptor: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let d = descriptor_of(descriptor)?;
    Ok(PyBytes::new(py, &d.to_bytes()))
}

/// The descriptor number of an `int` or of an object `int()` takes (cuda.core's
/// `IPCAllocationHandle`).
fn fd_of(handle: &Bound<'_, PyAny>) -> PyResult<i32> {
    if let Ok(fd) = handle.extract::<i32>() {
        return Ok(fd);
    }
    let int = handle
        .py()
        .import("builtins")?
        .getattr("int")?
        .call1((handle,))
        .map_err(|_| {
            PyTypeError::new_err(
                "an allocation handle: a file descriptor or an IPCAllocationHandle",
            )
        })?;
    int.extract::<i32>()
}

/// A descriptor from its 72 bytes, an `(export_data, size)` tuple, or an object whose
/// `__reduce__` gives `(constructor, (export_data, size))` (cuda.core's `IPCBufferDescriptor`).
fn descriptor_of(d: &Bound<'_, PyAny>) -> PyResult<PoolBufferDescriptor> {
    let corrupt = |why: String| CorruptHandle::new_err(format!("pool buffer descriptor: {why}"));
    if d.is_instance_of::<PyBytes>() || d.is_instance_of::<PyByteArray>() {
        return PoolBufferDescriptor::from_bytes(&d.extract::<Vec<u8>>()?).map_err(to_py);
    }
    let parts = match d.cast::<PyTuple>() {
        Ok(t) => t.clone(),
        Err(_) => reduced_parts(d).ok_or_else(|| {
            PyTypeError::new_err(
                "a descriptor: cuda.core's IPCBufferDescriptor, (export_data, size) or 72 bytes",
            )
        })?,
    };
    if parts.len() != 2 {
        return Err(corrupt(format!(
            "{} parts, not (export_data, size)",
            parts.len()
        )));
    }
    // Bytes only (a list of ints is not export data), and a size that is a byte count: a
    // negative one, or one past 2**64 - 1, is a corrupt descriptor (not an OverflowError).
    let data = parts.get_item(0)?;
    if !(data.is_instance_of::<PyBytes>() || data.is_instance_of::<PyByteArray>()) {
        return Err(corrupt(format!(
            "export data must be bytes, not {}",
            data.get_type().name()?
        )));
    }
    let data: Vec<u8> = data.extract()?;
    let size = parts.get_item(1)?;
    if !size.is_instance_of::<PyInt>() || size.is_instance_of::<PyBool>() {
        return Err(corrupt(format!(
            "a size must be an int, not {}",
            size.get_type().name()?
        )));
    }
    let size: u64 = size
        .extract()
        .map_err(|_| corrupt(format!("size {size} is not a byte count (0 to 2**64 - 1)")))?;
    let export_data: [u8; 64] = data
        .as_slice()
        .try_into()
        .map_err(|_| corrupt(format!("export data of {} bytes, not 64", data.len())))?;
    Ok(PoolBufferDescriptor {
        export_data,
        bytes: size,
    })
}

/// The `(export_data, size)` an object's `__reduce__` rebuilds it from, as cuda.core's
/// `IPCBufferDescriptor` gives them: a pair of bytes and an int, or nothing.
fn reduced_parts<'py>(d: &Bound<'py, PyAny>) -> Option<Bound<'py, PyTuple>> {
    let reduced = d.call_method0("__reduce__").ok()?;
    let args = reduced.cast::<PyTuple>().ok()?.get_item(1).ok()?;
    let args = args.cast_into::<PyTuple>().ok()?;
    let shaped = args.len() == 2
        && args.get_item(0).ok()?.is_instance_of::<PyBytes>()
        && args
            .get_item(1)
            .ok()?
            .is_instance_of::<pyo3::types::PyInt>();
    shaped.then_some(args)
}
