//! `cuda_ipc._native`: the Python package's extension module, a client of cuda-ipc's public
//! Rust API (no second implementation of any protocol). The Python-facing docs are the type
//! stubs (`python/python/cuda_ipc/_native.pyi`) and `python/README.md`.
//!
//! What it offers (this release): a [`Context`] per device; [`Arena`]s that hold tensors in
//! memory another process can map (`arena.empty(shape, dtype)`), shared read-only or
//! read-write; sockets that carry an arena's descriptor once ([`Listener`], [`connect`]); on
//! the other side an [`ImportedArena`] whose `open(handle)` gives a tensor with no driver
//! call. A GPU channel ([`channel::Sender`], [`channel::Receiver`]): slots of bytes streamed
//! between two processes (or to up to 8 consumers), ordered on the GPU, each item with a small
//! host-readable header — what `cuda_ipc.weights` syncs a model's weights through. Tensors go to PyTorch, CuPy or JAX with no copy through DLPack (`__dlpack__`) and
//! `__cuda_array_interface__`; the memory behind a dropped tensor is given back only after
//! the GPU's queued work ([`release`]). Every error of the crate is a Python exception of a matching
//! class that keeps the crate's reason (`str(e)`) and, where there is one, the peer's pid.

mod channel;
mod errors;
mod pool;
mod release;
mod socket;
mod tensor;

use pyo3::prelude::*;

use crate::errors::to_py;

/// A CUDA context on one device (its primary context, as PyTorch and CuPy use), made current
/// on the calling thread when created.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Context {
    pub(crate) ctx: cuda_ipc::GpuContext,
}

#[pymethods]
impl Context {
    #[new]
    #[pyo3(signature = (device = 0))]
    fn new(py: Python<'_>, device: u32) -> PyResult<Self> {
        let ctx = py
            .detach(|| cuda_ipc::GpuContext::new(device))
            .map_err(to_py)?;
        Ok(Self { ctx })
    }

    /// The device ordinal, in this process.
    #[getter]
    fn device(&self) -> u32 {
        self.ctx.ordinal()
    }

    fn __repr__(&self) -> String {
        format!("Context(device={})", self.ctx.ordinal())
    }
}

/// Remove the shared-memory regions (`/dev/shm/cuda-ipc-lease.*`, `cuda-ipc-arena.*`,
/// `cuda-ipc-chan.*`) that processes which died left behind; returns how many were removed.
/// Every process does this once, at its first export or channel.
#[pyfunction]
fn reclaim_stale_regions() -> usize {
    cuda_ipc::shm::reclaim_stale_regions()
}

/// What this user's processes share on the machine, from one read
/// (`cuda_ipc::inspect::snapshot`): the tree as text and the same as JSON. The GIL is
/// released while the tables are read.
#[pyfunction]
fn inspect_snapshot(py: Python<'_>) -> PyResult<(String, String)> {
    let snap = py.detach(cuda_ipc::inspect::snapshot).map_err(to_py)?;
    Ok((snap.to_string(), snap.to_json()))
}

/// Snapshots one after another (`cuda_ipc::inspect::Watch`): `snapshot()` is
/// [`inspect_snapshot`]'s pair with each channel's time without progress.
#[pyclass(module = "cuda_ipc._native", frozen)]
struct InspectWatch(std::sync::Mutex<cuda_ipc::inspect::Watch>);

#[pymethods]
impl InspectWatch {
    #[new]
    fn new() -> Self {
        Self(std::sync::Mutex::new(cuda_ipc::inspect::Watch::new()))
    }

    /// The next snapshot as (tree, JSON).
    fn snapshot(&self, py: Python<'_>) -> PyResult<(String, String)> {
        let snap = py
            .detach(|| {
                // A panic mid-`next` leaves nothing half-done worth refusing for.
                let mut watch = self
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                watch.snapshot()
            })
            .map_err(to_py)?;
        Ok((snap.to_string(), snap.to_json()))
    }
}

/// The extension module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Context>()?;
    m.add_class::<tensor::Arena>()?;
    m.add_class::<tensor::ImportedArena>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<pool::Pool>()?;
    m.add_class::<pool::ForeignPool>()?;
    m.add_function(wrap_pyfunction!(pool::descriptor_bytes, m)?)?;
    m.add_class::<channel::Sender>()?;
    m.add_class::<channel::Receiver>()?;
    m.add_class::<socket::Listener>()?;
    m.add_class::<socket::Socket>()?;
    m.add_function(wrap_pyfunction!(socket::connect, m)?)?;
    m.add_function(wrap_pyfunction!(reclaim_stale_regions, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_snapshot, m)?)?;
    m.add_class::<InspectWatch>()?;
    m.add_function(wrap_pyfunction!(release::wait_released, m)?)?;
    m.add_function(wrap_pyfunction!(release::leaked_releases, m)?)?;
    m.add_function(wrap_pyfunction!(release::exiting, m)?)?;
    errors::register(m)?;
    Ok(())
}
