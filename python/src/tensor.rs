//! Tensors in arenas: the owner's [`Arena`] (`empty`/`zeros` by shape and dtype), the
//! importer's [`ImportedArena`] (`open(handle)`, read-only or read-write), and the [`Tensor`]
//! both hand out, which PyTorch, CuPy and JAX take with no copy through DLPack
//! (`__dlpack__`, `__dlpack_device__`) or `__cuda_array_interface__` (version 3).
//!
//! A tensor's handle is the crate's arena handle (80 bytes: checksum, element type, arena,
//! block, generation, range) followed by its dtype and shape (`TENSOR_HANDLE_VERSION`); the
//! importer checks the arena handle as the crate does and the shape against its byte length,
//! so forged bytes are `CorruptHandle`, never a view past the buffer.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyTuple};

use crate::Context;
use crate::errors::{CorruptHandle, to_py};

/// The element types a tensor can have: name, size, DLPack code and bits, CAI typestr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum DType {
    Bool = 1,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

const DTYPES: [DType; 13] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::U32,
    DType::I32,
    DType::U64,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

// DLPack's `DLDataTypeCode`.
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_BOOL: u8 = 6;
/// `kDLCUDA`.
const DL_CUDA: i32 = 2;

impl DType {
    fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::U8 => "uint8",
            Self::I8 => "int8",
            Self::U16 => "uint16",
            Self::I16 => "int16",
            Self::U32 => "uint32",
            Self::I32 => "int32",
            Self::U64 => "uint64",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::BF16 => "bfloat16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    /// From a name (`"float32"`), a torch dtype's string (`"torch.float32"`), a NumPy/CuPy
    /// dtype's (`"float32"`), or the usual aliases (`"half"`, `"float"`, ...).
    fn parse(name: &str) -> Option<Self> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        let name = match name {
            "half" => "float16",
            "float" => "float32",
            "double" => "float64",
            "int" => "int32",
            "long" => "int64",
            "short" => "int16",
            other => other,
        };
        DTYPES.into_iter().find(|d| d.name() == name)
    }

    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Option<Self> {
        DTYPES.into_iter().find(|d| d.code() == code)
    }

    fn itemsize(self) -> usize {
        match self {
            Self::Bool | Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// DLPack's (code, bits).
    fn dlpack(self) -> (u8, u8) {
        let bits = (self.itemsize() * 8) as u8;
        let code = match self {
            Self::Bool => DL_BOOL,
            Self::U8 | Self::U16 | Self::U32 | Self::U64 => DL_UINT,
            Self::I8 | Self::I16 | Self::I32 | Self::I64 => DL_INT,
            Self::F16 | Self::F32 | Self::F64 => DL_FLOAT,
            Self::BF16 => DL_BFLOAT,
        };
        (code, bits)
    }

    /// `__cuda_array_interface__`'s typestr; `None` for bfloat16, which it cannot express.
    fn typestr(self) -> Option<String> {
        let kind = match self {
            Self::Bool => 'b',
            Self::U8 | Self::U16 | Self::U32 | Self::U64 => 'u',
            Self::I8 | Self::I16 | Self::I32 | Self::I64 => 'i',
            Self::F16 | Self::F32 | Self::F64 => 'f',
            Self::BF16 => return None,
        };
        Some(format!("<{kind}{}", self.itemsize()))
    }
}

/// The dtype a Python object names and the bytes of `shape` of it (1 to [`MAX_DIMS`]
/// positive dimensions).
pub(crate) fn layout(shape: &[i64], dtype: &Bound<'_, PyAny>) -> PyResult<(DType, usize)> {
    let dtype = dtype_of(dtype)?;
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return Err(PyValueError::new_err(format!(
            "a shape of 1 to {MAX_DIMS} dimensions, not {}",
            shape.len()
        )));
    }
    let bytes = nbytes_of(shape, dtype)
        .ok_or_else(|| PyValueError::new_err(format!("invalid shape {shape:?}")))?;
    Ok((dtype, bytes))
}

fn dtype_of(dtype: &Bound<'_, PyAny>) -> PyResult<DType> {
    let name = dtype.str()?.to_string();
    DType::parse(&name).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "unsupported dtype {name:?} (one of: {})",
            DTYPES.map(DType::name).join(", ")
        ))
    })
}

/// Dimensions a tensor handle may carry.
const MAX_DIMS: usize = 8;
/// The layout version of a tensor handle's tail (after the arena handle).
const TENSOR_HANDLE_VERSION: u8 = 1;
/// Bytes of the arena handle at the head of a tensor handle.
const ARENA_HANDLE: usize = cuda_ipc::arena::ArenaHandle::<u8>::SIZE;
/// Bytes of the tail's fixed part: version, dtype, ndim, five zero bytes.
const TAIL_HEAD: usize = 8;

/// The bytes of `shape` × `dtype`, checked (every dimension ≥ 1, no overflow).
fn nbytes_of(shape: &[i64], dtype: DType) -> Option<usize> {
    shape.iter().try_fold(dtype.itemsize(), |n, &d| {
        usize::try_from(d).ok().filter(|&d| d > 0)?.checked_mul(n)
    })
}

/// A tensor's dtype and shape as bytes: the tail of a tensor handle, and the metadata of a
/// tensor sent with `Socket.send_tensor` (version, dtype code, dimensions, five zero bytes,
/// then each dimension as a little-endian `u64`).
fn tail_bytes(dtype: DType, shape: &[i64]) -> Vec<u8> {
    let mut bytes = vec![
        TENSOR_HANDLE_VERSION,
        dtype.code(),
        shape.len() as u8,
        0,
        0,
        0,
        0,
        0,
    ];
    for &d in shape {
        bytes.extend_from_slice(&(d as u64).to_le_bytes());
    }
    bytes
}

/// [`tail_bytes`] read back, every field checked (a peer's bytes): a known version and dtype,
/// 1 to [`MAX_DIMS`] dimensions, exactly their bytes, and a shape that makes exactly `nbytes`.
fn parse_tail(tail: &[u8], nbytes: usize) -> PyResult<(DType, Vec<i64>)> {
    let corrupt = |why: String| CorruptHandle::new_err(format!("tensor handle: {why}"));
    if tail.len() < TAIL_HEAD {
        return Err(corrupt(format!(
            "{} bytes of dtype and shape, too short",
            tail.len()
        )));
    }
    let (version, code, ndim) = (tail[0], tail[1], usize::from(tail[2]));
    if version != TENSOR_HANDLE_VERSION {
        return Err(corrupt(format!("layout version {version}, expected 1")));
    }
    if tail[3..TAIL_HEAD] != [0; 5] || ndim == 0 || ndim > MAX_DIMS {
        return Err(corrupt("reserved bytes or dimension count".into()));
    }
    if tail.len() != TAIL_HEAD + 8 * ndim {
        return Err(corrupt(format!(
            "{} bytes of dtype and shape for {ndim} dimensions",
            tail.len()
        )));
    }
    let dtype = DType::from_code(code).ok_or_else(|| corrupt(format!("dtype code {code}")))?;
    let shape: Vec<i64> = tail[TAIL_HEAD..]
        .chunks(8)
        .map(|c| {
            let mut d = [0u8; 8];
            d.copy_from_slice(c);
            i64::try_from(u64::from_le_bytes(d)).unwrap_or(-1)
        })
        .collect();
    // The shape must describe exactly the (checked) memory it comes with.
    if nbytes_of(&shape, dtype) != Some(nbytes) {
        return Err(corrupt(format!(
            "shape {shape:?} of {} does not fill the {nbytes} bytes of its buffer",
            dtype.name()
        )));
    }
    Ok((dtype, shape))
}

/// What a tensor of another library is: its address, dtype and shape, from a torch tensor
/// (`data_ptr()`, `dtype`, `shape`; contiguous) or any object with
/// `__cuda_array_interface__` (C-contiguous). Empty tensors are refused (nothing to share).
fn describe_foreign(obj: &Bound<'_, PyAny>) -> PyResult<(u64, DType, Vec<i64>)> {
    let (ptr, dtype, shape) = if obj.hasattr("data_ptr")? && obj.hasattr("is_contiguous")? {
        if !obj.call_method0("is_contiguous")?.extract::<bool>()? {
            return Err(PyValueError::new_err(
                "the tensor is not contiguous: send t.contiguous() (a copy) instead",
            ));
        }
        let ptr: u64 = obj.call_method0("data_ptr")?.extract()?;
        let shape: Vec<i64> = obj.getattr("shape")?.extract()?;
        (ptr, dtype_of(&obj.getattr("dtype")?)?, shape)
    } else if obj.hasattr("__cuda_array_interface__")? {
        let cai = obj.getattr("__cuda_array_interface__")?;
        let (ptr, _read_only): (u64, bool) = cai.get_item("data")?.extract()?;
        let shape: Vec<i64> = cai.get_item("shape")?.extract()?;
        let typestr: String = cai.get_item("typestr")?.extract()?;
        let dtype = DTYPES
            .into_iter()
            .find(|d| d.typestr().as_deref() == Some(typestr.as_str()))
            .ok_or_else(|| PyTypeError::new_err(format!("unsupported typestr {typestr:?}")))?;
        if let Ok(strides) = cai.get_item("strides")
            && !strides.is_none()
        {
            let strides: Vec<i64> = strides.extract()?;
            let mut want = dtype.itemsize() as i64;
            for (&d, &st) in shape.iter().zip(&strides).rev() {
                if d > 1 && st != want {
                    return Err(PyValueError::new_err(
                        "the array is not C-contiguous: send a contiguous copy instead",
                    ));
                }
                want = want.saturating_mul(d);
            }
        }
        (ptr, dtype, shape)
    } else {
        return Err(PyTypeError::new_err(
            "expected a torch tensor or an object with __cuda_array_interface__",
        ));
    };
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return Err(PyValueError::new_err(format!(
            "a tensor of 1 to {MAX_DIMS} dimensions (a 0-d tensor: send t.reshape(1))"
        )));
    }
    if shape.contains(&0) {
        return Err(PyValueError::new_err(
            "an empty tensor has no memory to share",
        ));
    }
    Ok((ptr, dtype, shape))
}

/// Send `obj`'s memory (a tensor of another allocator: PyTorch's, CuPy's) with its dtype and
/// shape over `socket`; returns how many descriptors went with it (0: a legacy handle).
pub(crate) fn send_foreign(
    py: Python<'_>,
    socket: &cuda_ipc::fd::FdSocket,
    ctx: &cuda_ipc::GpuContext,
    obj: &Bound<'_, PyAny>,
    timeout: std::time::Duration,
) -> PyResult<usize> {
    let (ptr, dtype, shape) = describe_foreign(obj)?;
    let nbytes = nbytes_of(&shape, dtype)
        .ok_or_else(|| PyValueError::new_err(format!("shape {shape:?} overflows")))?;
    let meta = tail_bytes(dtype, &shape);
    py.detach(|| {
        let export = cuda_ipc::foreign::ForeignExport::new(ctx, ptr, nbytes)?;
        socket.send_foreign(&export, &meta, timeout)?;
        Ok(export.chunks())
    })
    .map_err(to_py)
}

/// Receive what [`send_foreign`] sent, as a tensor of its dtype and shape.
pub(crate) fn recv_foreign(
    py: Python<'_>,
    socket: &cuda_ipc::fd::FdSocket,
    ctx: &cuda_ipc::GpuContext,
    timeout: std::time::Duration,
) -> PyResult<Tensor> {
    use cuda_ipc::foreign::ForeignMemory;
    let buffer = py
        .detach(|| {
            let received = socket.recv_foreign::<u8>(ctx, timeout)?;
            let buffer = match received.memory {
                ForeignMemory::Mapped(buffer) => buffer,
                // SAFETY: the contract of `Socket.recv_tensor` (its docs and the stubs'): the
                // sender keeps the tensor alive, its memory not reused, until this side says
                // it is done — what PyTorch's own CUDA IPC asks of a sender too.
                ForeignMemory::Raw(raw) => unsafe {
                    cuda_ipc::ImportedBuffer::<u8>::open_raw(ctx, &raw)?
                },
            };
            Ok((buffer, received.meta))
        })
        .map_err(to_py);
    let (buffer, meta) = buffer?;
    let (dtype, shape) = parse_tail(&meta, buffer.len())?;
    Ok(Tensor::in_context(
        Memory::Foreign(buffer),
        ctx,
        dtype,
        shape,
    ))
}

/// What backs a tensor, kept alive by every tensor and every DLPack capsule made of it.
pub(crate) enum Memory {
    /// The owner's buffer (its drop frees the range once no importer views it).
    Owned(cuda_ipc::arena::ArenaBuffer<u8>),
    /// A read-write view of another process's arena.
    View(cuda_ipc::arena::ArenaView<u8>),
    /// A read-only view (`PROT_READ`: the GPU refuses writes).
    ReadOnly(cuda_ipc::arena::ReadOnlyArenaView<u8>),
    /// Another allocator's memory in another process (`Socket.recv_tensor`): its virtual
    /// memory mapped here, or its legacy handle opened.
    Foreign(cuda_ipc::ImportedBuffer<u8>),
    /// The owner's buffer of a [`Pool`](crate::pool::Pool) (its drop frees it).
    Pooled(cuda_ipc::pool::PoolBuffer<u8>),
    /// A buffer of another program's pool ([`ForeignPool`](crate::pool::ForeignPool)).
    PoolView(cuda_ipc::pool::PoolView<u8>),
    /// A channel slot (`crate::channel`): its address, and the channel end that maps it.
    Slot {
        ptr: u64,
        _end: Arc<dyn std::any::Any + Send + Sync>,
    },
}

struct Inner {
    /// Taken (once) by `drop`.
    memory: ManuallyDrop<Memory>,
    /// The context whose queued work the memory's release waits for (`crate::release`);
    /// `None` for a channel slot, whose end tracks its own work and outlives the tensor.
    release_after: Option<cuda_ipc::GpuContext>,
    dtype: DType,
    shape: Vec<i64>,
    device: u32,
}

impl Inner {
    fn new(
        memory: Memory,
        release_after: Option<cuda_ipc::GpuContext>,
        dtype: DType,
        shape: Vec<i64>,
        device: u32,
    ) -> Arc<Self> {
        Arc::new(Self {
            memory: ManuallyDrop::new(memory),
            release_after,
            dtype,
            shape,
            device,
        })
    }
}

impl Drop for Inner {
    /// The last reference (a `Tensor`, a DLPack capsule, a consumer's tensor) went: give the
    /// memory back once the GPU has finished what was queued on it (`crate::release`).
    fn drop(&mut self) {
        // SAFETY: `memory` is taken here only, once, and not used after.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        match &self.release_after {
            Some(ctx) => crate::release::after_queued_work(ctx, memory),
            None => drop(memory),
        }
    }
}

impl Inner {
    fn ptr(&self) -> u64 {
        match &*self.memory {
            Memory::Owned(b) => b.as_raw_ptr(),
            Memory::View(v) => v.as_raw_ptr(),
            Memory::ReadOnly(v) => v.as_raw_ptr(),
            Memory::Foreign(b) => b.as_raw_ptr(),
            Memory::Pooled(b) => b.as_raw_ptr(),
            Memory::PoolView(v) => v.as_raw_ptr(),
            Memory::Slot { ptr, .. } => *ptr,
        }
    }

    fn read_only(&self) -> bool {
        matches!(*self.memory, Memory::ReadOnly(_))
    }
}

/// A tensor in an arena: the owner's, or a view of another process's; or a channel slot.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Tensor {
    inner: Arc<Inner>,
}

impl Tensor {
    /// A tensor of `memory` on `ctx`'s device, released once `ctx`'s queued work is done
    /// (`crate::release`).
    pub(crate) fn in_context(
        memory: Memory,
        ctx: &cuda_ipc::GpuContext,
        dtype: DType,
        shape: Vec<i64>,
    ) -> Self {
        Self {
            inner: Inner::new(memory, Some(ctx.clone()), dtype, shape, ctx.ordinal()),
        }
    }

    /// `nbytes` bytes (uint8, one dimension) of a channel slot at `ptr` on `device`, keeping
    /// `end` — the channel end that maps the slot — alive as long as the tensor or any DLPack
    /// capsule made of it.
    pub(crate) fn slot(
        ptr: u64,
        nbytes: usize,
        device: u32,
        end: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            inner: Inner::new(
                Memory::Slot { ptr, _end: end },
                None,
                DType::U8,
                vec![nbytes as i64],
                device,
            ),
        }
    }
}

#[pymethods]
impl Tensor {
    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.inner.shape)
    }

    /// The element type's name (`"float32"`, `"bfloat16"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype.name()
    }

    /// Bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        nbytes_of(&self.inner.shape, self.inner.dtype).unwrap_or(0)
    }

    /// The device address.
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.inner.ptr()
    }

    /// The device ordinal, in this process.
    #[getter]
    fn device(&self) -> u32 {
        self.inner.device
    }

    /// Whether this process maps the tensor read-only (the GPU refuses writes).
    #[getter]
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    /// The bytes another process opens this tensor with (`ImportedArena.open`): the arena
    /// handle, the dtype and the shape. Only the owner's tensors have one.
    fn handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let Memory::Owned(buffer) = &*self.inner.memory else {
            return Err(PyTypeError::new_err(
                "only an arena owner's tensors have a handle (a tensor opened from another \
                 process's arena, or a channel slot, has none): send the owner's",
            ));
        };
        let mut bytes = buffer.handle().as_bytes().to_vec();
        bytes.extend_from_slice(&tail_bytes(self.inner.dtype, &self.inner.shape));
        Ok(PyBytes::new(py, &bytes))
    }

    /// The 72 bytes another program opens this tensor of a `Pool` with: the allocation's
    /// `cuMemPoolExportPointer` data, then its size (little-endian `u64`);
    /// `cuda_ipc.cuda_core.ipc_descriptor` turns them into cuda.core's `IPCBufferDescriptor`.
    /// Waits until the allocation has completed, at most `timeout` seconds (`TimeoutError`
    /// past it), with the GIL released. The peer takes no lease: keep the tensor until it says
    /// it closed its buffer.
    #[pyo3(signature = (*, timeout = 30.0))]
    fn ipc_descriptor<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyBytes>> {
        let Memory::Pooled(buffer) = &*self.inner.memory else {
            return Err(PyTypeError::new_err(
                "only a Pool's own tensors have an IPC descriptor",
            ));
        };
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| PyValueError::new_err(format!("timeout {timeout} is not a duration")))?;
        let descriptor = py
            .detach(|| {
                buffer.wait_allocated(timeout)?;
                buffer.descriptor()
            })
            .map_err(to_py)?;
        Ok(PyBytes::new(py, &descriptor.to_bytes()))
    }

    /// `__cuda_array_interface__` (version 3): C-contiguous, `data` = (address, read-only),
    /// no stream to synchronise (the owner's writes are the caller's to order).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let typestr = self.inner.dtype.typestr().ok_or_else(|| {
            PyTypeError::new_err(
                "__cuda_array_interface__ has no bfloat16: use DLPack (torch.from_dlpack)",
            )
        })?;
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.inner.shape)?)?;
        d.set_item("typestr", typestr)?;
        d.set_item("data", (self.inner.ptr(), self.inner.read_only()))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    /// `(kDLCUDA, device)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DL_CUDA, self.inner.device as i32)
    }

    /// A DLPack capsule (`"dltensor"`) of this tensor, no copy: the consumer's tensor keeps
    /// the memory mapped (the capsule holds a reference) until its deleter runs. `stream` is
    /// accepted and not used: nothing of this package's is pending on the memory. A read-only
    /// tensor stays read-only on the GPU; DLPack's unversioned capsule cannot say so, so the
    /// consumer's tensor looks writable and a write through it faults.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = (stream, max_version);
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "cuda_ipc tensors are shared, not copied",
            ));
        }
        if let Some(device) = dl_device
            && device != self.__dlpack_device__()
        {
            return Err(PyBufferError::new_err(format!(
                "the tensor is on {:?}, not {device:?}",
                self.__dlpack_device__()
            )));
        }
        crate::tensor::dlpack::capsule(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "Tensor(shape={:?}, dtype={}, device={}{})",
            self.inner.shape,
            self.inner.dtype.name(),
            self.inner.device,
            if self.inner.read_only() {
                ", read_only"
            } else {
                ""
            }
        )
    }
}

/// Memory that another process can map, holding tensors: `empty`/`zeros` allocate, the arena
/// is sent once (`Socket.send_arena`), each tensor's `handle()` is sent as bytes.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Arena {
    pub(crate) arena: cuda_ipc::arena::IpcArena,
    ctx: cuda_ipc::GpuContext,
}

impl Arena {
    /// A tensor's range of the arena; with `zeroed`, its bytes set to 0 before it is handed
    /// out — on the legacy stream (after this process's earlier work on blocking streams),
    /// waited for at most `timeout` with the GIL released (a stream held up by a dead peer
    /// must not freeze every Python thread). On a time-out the range is given back only once
    /// the context's queued work is done (`crate::release`), never under the pending memset.
    fn alloc(
        &self,
        py: Python<'_>,
        shape: Vec<i64>,
        dtype: &Bound<'_, PyAny>,
        zeroed: Option<Duration>,
    ) -> PyResult<Tensor> {
        let (dtype, bytes) = layout(&shape, dtype)?;
        let buffer = py
            .detach(|| {
                let buffer = self.arena.alloc::<u8>(bytes)?;
                let Some(timeout) = zeroed else {
                    return Ok(buffer);
                };
                let stream = cuda_ipc::RawStream::LEGACY;
                // SAFETY: `buffer` stays allocated until the memset has completed: it is
                // returned after the wait below, or handed to the release thread, which
                // synchronises the context before it drops it.
                unsafe { buffer.memset_bytes_async(0, &stream) }?;
                let done = cuda_ipc::IpcEvent::new(&self.ctx)
                    .and_then(|event| event.record(&stream).map(|()| event))
                    .and_then(|event| event.synchronize(timeout));
                match done {
                    Ok(()) => Ok(buffer),
                    Err(e) => {
                        crate::release::after_queued_work(&self.ctx, buffer);
                        Err(e)
                    }
                }
            })
            .map_err(to_py)?;
        Ok(Tensor::in_context(
            Memory::Owned(buffer),
            &self.ctx,
            dtype,
            shape,
        ))
    }
}

#[pymethods]
impl Arena {
    /// An arena of at least `nbytes` on `ctx`'s device (rounded up to the allocation
    /// granularity). `read_only_for_importers`: every importer must open it read-only, and the
    /// GPU refuses their writes.
    #[new]
    #[pyo3(signature = (ctx, nbytes, *, read_only_for_importers = false, max_tensors = None))]
    fn new(
        py: Python<'_>,
        ctx: &Context,
        nbytes: usize,
        read_only_for_importers: bool,
        max_tensors: Option<usize>,
    ) -> PyResult<Self> {
        let gpu = ctx.ctx.clone();
        let arena = py
            .detach(|| match max_tensors {
                Some(n) => cuda_ipc::arena::IpcArena::with_max_buffers(&gpu, nbytes, n),
                None => cuda_ipc::arena::IpcArena::new(&gpu, nbytes),
            })
            .map_err(to_py)?;
        let arena = if read_only_for_importers {
            arena.read_only_for_importers()
        } else {
            arena
        };
        Ok(Self {
            arena,
            ctx: ctx.ctx.clone(),
        })
    }

    /// A tensor of `shape` and `dtype` (contents unspecified).
    #[pyo3(signature = (shape, dtype))]
    fn empty(&self, py: Python<'_>, shape: Vec<i64>, dtype: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        self.alloc(py, shape, dtype, None)
    }

    /// A tensor of `shape` and `dtype`, zeroed: the zeroing is waited for (at most `timeout`
    /// seconds, the GIL released; `Timeout` after that, the tensor not handed out), so that
    /// another process that maps it reads zeros.
    #[pyo3(signature = (shape, dtype, timeout = 30.0))]
    fn zeros(
        &self,
        py: Python<'_>,
        shape: Vec<i64>,
        dtype: &Bound<'_, PyAny>,
        timeout: f64,
    ) -> PyResult<Tensor> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| PyValueError::new_err(format!("timeout {timeout} is not a duration")))?;
        self.alloc(py, shape, dtype, Some(timeout))
    }

    /// Bytes the arena holds.
    #[getter]
    fn capacity(&self) -> usize {
        self.arena.capacity()
    }

    /// Bytes free for new tensors.
    #[getter]
    fn free_bytes(&self) -> usize {
        self.arena.free_bytes()
    }

    /// Whether importers must open the arena read-only.
    #[getter]
    fn read_only_for_importers(&self) -> bool {
        self.arena.is_read_only_for_importers()
    }

    /// The pids of the live processes that import the arena now.
    fn importers(&self) -> Vec<u32> {
        self.arena.importers()
    }

    /// Reuse the ranges of freed tensors that no live importer views any more, reaping
    /// importers that died holding views; returns how many freed tensors still wait for live
    /// importers.
    fn collect(&self) -> usize {
        self.arena.collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Arena(capacity={}, device={}, read_only_for_importers={})",
            self.arena.capacity(),
            self.ctx.ordinal(),
            self.arena.is_read_only_for_importers()
        )
    }
}

/// Another process's arena, imported once (`Socket.recv_arena`): its tensors open with
/// `open(handle)`, no driver call each.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct ImportedArena {
    pub(crate) arena: Imported,
    pub(crate) ctx: cuda_ipc::GpuContext,
    pub(crate) device: u32,
}

pub(crate) enum Imported {
    ReadWrite(cuda_ipc::arena::ImportedArena),
    ReadOnly(cuda_ipc::arena::ReadOnlyArena),
}

#[pymethods]
impl ImportedArena {
    /// Open one tensor from the bytes its owner's `Tensor.handle()` gave.
    fn open(&self, handle: &[u8]) -> PyResult<Tensor> {
        if handle.len() < ARENA_HANDLE + TAIL_HEAD {
            return Err(CorruptHandle::new_err(format!(
                "tensor handle: {} bytes, too short",
                handle.len()
            )));
        }
        let (arena_handle, tail) = handle.split_at(ARENA_HANDLE);
        let arena_handle =
            cuda_ipc::arena::ArenaHandle::<u8>::from_bytes(arena_handle).map_err(to_py)?;
        let (dtype, shape) = parse_tail(tail, arena_handle.len())?;
        let memory = match &self.arena {
            Imported::ReadWrite(a) => Memory::View(a.open(&arena_handle).map_err(to_py)?),
            Imported::ReadOnly(a) => Memory::ReadOnly(a.open(&arena_handle).map_err(to_py)?),
        };
        Ok(Tensor {
            inner: Inner::new(memory, Some(self.ctx.clone()), dtype, shape, self.device),
        })
    }

    /// Whether this process maps the arena read-only.
    #[getter]
    fn read_only(&self) -> bool {
        matches!(self.arena, Imported::ReadOnly(_))
    }

    /// The owner's pid.
    #[getter]
    fn exporter_pid(&self) -> u32 {
        match &self.arena {
            Imported::ReadWrite(a) => a.exporter().pid(),
            Imported::ReadOnly(a) => a.exporter().pid(),
        }
    }

    /// Bytes mapped.
    #[getter]
    fn capacity(&self) -> usize {
        match &self.arena {
            Imported::ReadWrite(a) => a.capacity(),
            Imported::ReadOnly(a) => a.capacity(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ImportedArena(capacity={}, device={}, read_only={}, exporter_pid={})",
            self.capacity(),
            self.device,
            self.read_only(),
            self.exporter_pid()
        )
    }
}

/// DLPack's C structures (dlpack.h, v0.8 "unversioned" capsule), built by hand.
mod dlpack {
    use super::*;

    #[repr(C)]
    struct DLDevice {
        device_type: i32,
        device_id: i32,
    }

    #[repr(C)]
    struct DLDataType {
        code: u8,
        bits: u8,
        lanes: u16,
    }

    #[repr(C)]
    struct DLTensor {
        data: *mut c_void,
        device: DLDevice,
        ndim: i32,
        dtype: DLDataType,
        shape: *mut i64,
        strides: *mut i64,
        byte_offset: u64,
    }

    #[repr(C)]
    struct DLManagedTensor {
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
    }

    /// What a capsule owns: the managed tensor (first, so that its address is the box's),
    /// the shape it points into, and a reference to the memory.
    #[repr(C)]
    struct Managed {
        tensor: DLManagedTensor,
        shape: Vec<i64>,
        _keep: Arc<Inner>,
    }

    const NAME: &std::ffi::CStr = c"dltensor";

    /// The deleter DLPack's consumer calls once it no longer needs the tensor (or the capsule
    /// destructor calls, for a capsule never consumed).
    unsafe extern "C" fn delete(tensor: *mut DLManagedTensor) {
        if tensor.is_null() {
            return;
        }
        // SAFETY: `tensor` is the first field of a `Managed` made by `Box::into_raw` in
        // `capsule` (its `manager_ctx` says so), freed once: DLPack's consumer calls the
        // deleter once, and the capsule destructor only for a capsule no consumer took.
        unsafe { drop(Box::from_raw((*tensor).manager_ctx.cast::<Managed>())) };
    }

    /// The capsule destructor: frees the tensor if no consumer took it (a consumer renames
    /// the capsule `used_dltensor` and calls the deleter itself).
    unsafe extern "C" fn destroy(capsule: *mut pyo3::ffi::PyObject) {
        // SAFETY: called by Python with the capsule being destroyed; the name check tells an
        // untaken capsule (ours to free) from a taken one.
        unsafe {
            if pyo3::ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
                let tensor = pyo3::ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr());
                delete(tensor.cast::<DLManagedTensor>());
            } else {
                pyo3::ffi::PyErr_Clear(); // IsValid sets no error; GetPointer might have
            }
        }
    }

    pub(super) fn capsule<'py>(
        py: Python<'py>,
        inner: &Arc<Inner>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let (code, bits) = inner.dtype.dlpack();
        let mut managed = Box::new(Managed {
            tensor: DLManagedTensor {
                dl_tensor: DLTensor {
                    data: inner.ptr() as *mut c_void,
                    device: DLDevice {
                        device_type: DL_CUDA,
                        device_id: inner.device as i32,
                    },
                    ndim: inner.shape.len() as i32,
                    dtype: DLDataType {
                        code,
                        bits,
                        lanes: 1,
                    },
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(), // C-contiguous
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete),
            },
            shape: inner.shape.clone(),
            _keep: inner.clone(),
        });
        managed.tensor.dl_tensor.shape = managed.shape.as_mut_ptr();
        let raw = Box::into_raw(managed);
        // SAFETY: `raw` is a live box; its first field is the managed tensor.
        unsafe { (*raw).tensor.manager_ctx = raw.cast::<c_void>() };
        let pointer = NonNull::new(raw.cast::<c_void>())
            .ok_or_else(|| PyBufferError::new_err("allocation failed"))?;
        // SAFETY: `pointer` is the managed tensor (a `Managed`'s first field), valid until
        // its deleter runs; `destroy` frees it only if no consumer took it.
        let made =
            unsafe { PyCapsule::new_with_pointer_and_destructor(py, pointer, NAME, Some(destroy)) };
        if made.is_err() {
            // SAFETY: the capsule was not made, so nobody else holds `raw`.
            unsafe { delete(raw.cast::<DLManagedTensor>()) };
        }
        made
    }
}
