//! The crate's GPU channel from Python: [`Sender`] and [`Receiver`] (`IpcSender<u8>` /
//! `IpcReceiver<u8>`), slots of bytes handed out as [`Tensor`]s (DLPack, no copy), each item
//! with up to 4 KiB of header the other side reads on the host.
//!
//! A call takes the item's stream (`None` for the legacy default stream, a raw `CUstream` as
//! an int, a `torch.cuda.Stream`, or anything with `.cuda_stream` or `.ptr`), waits on the
//! host with the GIL released, enqueues the channel's GPU wait on that stream, and calls the
//! user's function with the slot: `send(fill, ...)` then enqueues the send after whatever
//! `fill` enqueued; `recv(use)` enqueues the release after whatever `use` enqueued. Nothing
//! synchronises the host with the GPU.
//!
//! A slot's tensor keeps the channel end alive (its memory stays mapped) as long as it or a
//! tensor made of it lives; `close` refuses while one does, rather than unmap memory a tensor
//! still points at. Using a slot's tensor after its item was sent (or released) is a data race
//! on the GPU with the other process — wrong data. The end never unmaps its slots under work
//! queued on them, whatever stream it is on: `close` first waits (within its time-out) for the
//! device to finish everything queued in the end's context, and an end dropped with its last
//! tensor goes to the package's release thread, which synchronises the context before
//! dropping it (`release.rs`).

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use cuda_ipc::channel::{IpcChannelHandle, IpcReceiver, IpcSender};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::Context;
use crate::errors::to_py;
use crate::tensor::Tensor;

fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout)
        .map_err(|_| PyValueError::new_err(format!("timeout {timeout} is not a duration")))
}

/// The `CUstream` a Python object stands for: `None` (the legacy default stream, 0), an int,
/// or an object with `cuda_stream` (PyTorch) or `ptr` (CuPy).
fn stream_of(stream: Option<&Bound<'_, PyAny>>) -> PyResult<cuda_ipc::RawStream> {
    let raw: u64 = match stream {
        None => 0,
        Some(s) if s.is_none() => 0,
        Some(s) => {
            if let Ok(v) = s.extract::<u64>() {
                v
            } else if let Ok(v) = s.getattr("cuda_stream").and_then(|v| v.extract::<u64>()) {
                v
            } else if let Ok(v) = s.getattr("ptr").and_then(|v| v.extract::<u64>()) {
                v
            } else {
                return Err(PyTypeError::new_err(
                    "stream: None, an int (a CUstream), or a torch.cuda.Stream / cupy Stream",
                ));
            }
        }
    };
    // SAFETY: the caller hands over a stream of this context that it keeps alive during the
    // call (as with any CUDA library taking a stream); the channel uses the handle only during
    // this call (its waits and writes are enqueued here; what it tracks afterwards are events).
    Ok(unsafe { cuda_ipc::RawStream::from_raw(raw as usize as cuda_ipc::driver::sys::CUstream) })
}

/// A value made on this thread inside `py.detach` and moved back to it when `detach` returns.
struct SameThread<T>(T);
// SAFETY: `Python::detach` runs its closure on the calling thread and returns its value to that
// same thread; the value never reaches another thread.
unsafe impl<T> Send for SameThread<T> {}

/// Lock a channel end for one call: one call at a time drives an end (a second thread, or a
/// `fill`/`use` that calls back into the same end, gets an error instead of a deadlock).
fn lock<'a, T>(end: &'a Mutex<Option<T>>, what: &str) -> PyResult<MutexGuard<'a, Option<T>>> {
    match end.try_lock() {
        Ok(guard) => Ok(guard),
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(PyRuntimeError::new_err(format!(
            "the {what} is in use by another call (one call at a time drives a channel end)"
        ))),
    }
}

fn closed(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("the {what} is closed"))
}

/// Refuse to close an end while tensors of its slots live (they point into its memory).
fn check_no_tensors<T>(end: &Arc<T>, what: &str) -> PyResult<()> {
    let others = Arc::strong_count(end) - 1;
    if others == 0 {
        return Ok(());
    }
    Err(PyRuntimeError::new_err(format!(
        "the {what} cannot close while {others} tensor(s) of its slots are alive (they point \
         into its memory): delete them first, or drop the {what} and let the last one close it"
    )))
}

/// Close a channel end (`what`), refused while tensors of its slots live, the GIL released
/// while `close` waits: first (within `timeout`) for the device to finish everything queued in
/// the end's context — work on the slots from streams the end never saw (see [`End`]) —, then
/// for the end's own. An end whose close failed is put back, to be closed again or dropped.
fn close_end<E: ChannelEnd>(
    py: Python<'_>,
    end: &Arc<End<E>>,
    what: &str,
    timeout: f64,
    close: fn(E, Duration) -> Result<(), cuda_ipc::CloseError<E>>,
) -> PyResult<()> {
    let timeout = seconds(timeout)?;
    let mut guard = lock(&end.0, what)?;
    check_no_tensors(end, what)?;
    let Some(e) = guard.take() else {
        return Ok(());
    };
    let e = SameThread(e);
    let closed = py.detach(move || {
        let e = e; // the whole wrapper moves, not its (maybe !Send) field
        let start = std::time::Instant::now();
        if !crate::release::synchronized(e.0.context(), timeout) {
            return SameThread(Err((None, e.0)));
        }
        let left = timeout.saturating_sub(start.elapsed());
        SameThread(close(e.0, left).map_err(|failed| {
            let (error, e) = failed.into_parts();
            (Some(error), e)
        }))
    });
    match closed.0 {
        Ok(()) => Ok(()),
        Err((error, e)) => {
            *guard = Some(e);
            Err(match error {
                Some(error) => to_py(error),
                None => to_py(cuda_ipc::Error::Timeout {
                    what: "closing a channel end (waiting for the device's queued work on its \
                           slots)",
                    waited: timeout,
                    waiting_for: None,
                }),
            })
        }
    }
}

/// A channel end as the crate has it: its context tells whose queued work to wait for.
trait ChannelEnd: Send + 'static {
    fn context(&self) -> &cuda_ipc::GpuContext;
}

impl ChannelEnd for IpcSender<u8> {
    fn context(&self) -> &cuda_ipc::GpuContext {
        IpcSender::context(self)
    }
}

impl ChannelEnd for IpcReceiver<u8> {
    fn context(&self) -> &cuda_ipc::GpuContext {
        IpcReceiver::context(self)
    }
}

/// A channel end shared by its Python object and the slot tensors made of it. The slots are
/// unmapped only once the device has finished the work queued on them, on any stream (a slot
/// tensor's kernels on a stream the end never saw, queued before the tensor was deleted): the
/// last owner to go hands the end to `crate::release`, which synchronises the context first,
/// and `close` waits for the same synchronisation (within its time-out) before closing.
struct End<E: ChannelEnd>(Mutex<Option<E>>);

impl<E: ChannelEnd> End<E> {
    fn new(end: E) -> Arc<Self> {
        Arc::new(Self(Mutex::new(Some(end))))
    }
}

impl<E: ChannelEnd> Drop for End<E> {
    fn drop(&mut self) {
        let end = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(end) = end {
            let ctx = end.context().clone();
            crate::release::after_queued_work(&ctx, end);
        }
    }
}

type SenderEnd = Arc<End<IpcSender<u8>>>;
type ReceiverEnd = Arc<End<IpcReceiver<u8>>>;

/// Hand `item` to `use_` as a tensor with its header, then release it (also when `use_`
/// raised); what `use_` returned.
fn deliver<'py>(
    end: &ReceiverEnd,
    device: u32,
    py: Python<'py>,
    item: cuda_ipc::channel::Received<'_, u8>,
    use_: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let keep: Arc<dyn std::any::Any + Send + Sync> = end.clone();
    let tensor = Tensor::slot(item.as_raw_ptr(), item.len(), device, keep);
    let header = PyBytes::new(py, item.header());
    let used = use_.call1((tensor, header));
    // Released either way (a failed `use` still hands the slot back).
    let released = item.release().map_err(to_py);
    let used = used?;
    released?;
    Ok(used)
}

/// The producing end of a GPU channel: `slots` slots of `slot_bytes` bytes each, for one
/// consumer or — with `consumers` > 1 — up to that many (a broadcast).
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Sender {
    end: SenderEnd,
    device: u32,
    slots: usize,
    slot_bytes: usize,
    handle: Vec<u8>,
}

#[pymethods]
impl Sender {
    #[new]
    #[pyo3(signature = (ctx, slot_bytes, *, slots = 4, consumers = 1))]
    fn new(
        py: Python<'_>,
        ctx: &Context,
        slot_bytes: usize,
        slots: usize,
        consumers: usize,
    ) -> PyResult<Self> {
        let gpu = ctx.ctx.clone();
        let tx = py
            .detach(|| {
                if consumers == 1 {
                    IpcSender::<u8>::new(&gpu, slots, slot_bytes)
                } else {
                    IpcSender::<u8>::broadcast(&gpu, slots, slot_bytes, consumers)
                }
            })
            .map_err(to_py)?;
        let handle = tx.handle().as_bytes().to_vec();
        Ok(Self {
            end: End::new(tx),
            device: ctx.ctx.ordinal(),
            slots,
            slot_bytes,
            handle,
        })
    }

    /// The bytes a consumer opens the channel with (`Receiver(ctx, handle)`): send them over
    /// a `Socket` (typed, checksummed; no pickle).
    fn handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.handle)
    }

    /// Send one item. Waits on the host (at most `timeout` seconds, GIL released) for a free
    /// slot, enqueues on `stream` the GPU wait for the consumer's release of it, then calls
    /// `fill(slot)` with the slot as a uint8 `Tensor` of `slot_bytes`: `fill` enqueues its
    /// writes on `stream` and returns how many bytes it wrote. Then the send is enqueued on
    /// `stream` and the item, with `header` (up to 4,096 bytes), published. Returns the item's
    /// number (from 1). If `fill` raises, nothing is sent (the slot is kept for the next call).
    #[pyo3(signature = (fill, *, header = None, stream = None, timeout = 30.0))]
    fn send(
        &self,
        py: Python<'_>,
        fill: &Bound<'_, PyAny>,
        header: Option<&[u8]>,
        stream: Option<&Bound<'_, PyAny>>,
        timeout: f64,
    ) -> PyResult<u64> {
        let timeout = seconds(timeout)?;
        let header = header.unwrap_or(&[]);
        if header.len() > cuda_ipc::channel::HEADER_BYTES {
            return Err(PyValueError::new_err(format!(
                "a header of {} bytes (at most {})",
                header.len(),
                cuda_ipc::channel::HEADER_BYTES
            )));
        }
        let stream = stream_of(stream)?;
        let mut guard = lock(&self.end.0, "sender")?;
        let tx = guard.as_mut().ok_or_else(|| closed("sender"))?;
        let slot = py
            .detach(|| tx.acquire(&stream, timeout).map(SameThread))
            .map_err(to_py)?
            .0;
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.end.clone();
        let tensor = Tensor::slot(slot.as_raw_ptr(), slot.capacity(), self.device, keep);
        let written = fill.call1((tensor,))?;
        let n: usize = written.extract().map_err(|_| {
            PyTypeError::new_err("fill(slot) must return the number of bytes it wrote (an int)")
        })?;
        let seq = slot.seq();
        slot.send_with_header(n, header).map_err(to_py)?;
        Ok(seq)
    }

    /// The consumers attached now (their pids).
    fn consumers(&self) -> PyResult<Vec<u32>> {
        let guard = lock(&self.end.0, "sender")?;
        let tx = guard.as_ref().ok_or_else(|| closed("sender"))?;
        Ok(tx.consumers().iter().map(|c| c.pid()).collect())
    }

    /// Items sent so far.
    #[getter]
    fn sent(&self) -> PyResult<u64> {
        let guard = lock(&self.end.0, "sender")?;
        Ok(guard.as_ref().map_or(0, IpcSender::sent))
    }

    /// Slots in the ring.
    #[getter]
    fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes one slot holds.
    #[getter]
    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Close the channel: wait (at most `timeout` seconds, in all) for the device to finish the
    /// work queued in this context (on any stream: work on the slots' tensors included), for
    /// the channel's GPU work here and for the consumer to finish with the items it holds, then
    /// unmap. The consumer receives every
    /// item sent, then `ChannelClosed`. Refused while tensors of its slots are alive. A close
    /// that does not finish keeps the sender (closing: it sends nothing more) for another
    /// `close`.
    #[pyo3(signature = (timeout = 30.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        close_end(py, &self.end, "sender", timeout, IpcSender::close)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py, 30.0)
    }

    fn __repr__(&self) -> String {
        format!(
            "Sender(slots={}, slot_bytes={}, device={})",
            self.slots, self.slot_bytes, self.device
        )
    }
}

/// The consuming end of a GPU channel, opened from the producer's `handle()` bytes.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Receiver {
    end: ReceiverEnd,
    device: u32,
    slots: usize,
    slot_bytes: usize,
    producer_pid: u32,
}

#[pymethods]
impl Receiver {
    #[new]
    fn new(py: Python<'_>, ctx: &Context, handle: &[u8]) -> PyResult<Self> {
        let handle = IpcChannelHandle::<u8>::from_bytes(handle).map_err(to_py)?;
        let gpu = ctx.ctx.clone();
        let rx = py
            .detach(|| IpcReceiver::<u8>::open(&gpu, &handle))
            .map_err(to_py)?;
        Ok(Self {
            device: ctx.ctx.ordinal(),
            slots: rx.slots(),
            slot_bytes: rx.capacity(),
            producer_pid: handle.producer().pid(),
            end: End::new(rx),
        })
    }

    /// Receive one item. Waits on the host (at most `timeout` seconds, GIL released) for the
    /// next item, enqueues on `stream` the GPU wait for the producer's writes of it, then
    /// calls `use(item, header)` with the item as a uint8 `Tensor` of the bytes sent and its
    /// header (`bytes`, from the other process: parse it as untrusted). `use` enqueues its
    /// reads on `stream`; then the release is enqueued there and published. Returns what
    /// `use` returned. If `use` raises, the item is released all the same.
    ///
    /// Raises `ChannelClosed` once the producer closed and every item was received,
    /// `PeerGone` when it died, `Timeout`.
    #[pyo3(signature = (use_, *, stream = None, timeout = 30.0))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        use_: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = seconds(timeout)?;
        let stream = stream_of(stream)?;
        let mut guard = lock(&self.end.0, "receiver")?;
        let rx = guard.as_mut().ok_or_else(|| closed("receiver"))?;
        let item = py
            .detach(|| rx.recv(&stream, timeout).map(SameThread))
            .map_err(to_py)?
            .0;
        deliver(&self.end, self.device, py, item, use_)
    }

    /// As `recv`, without waiting: `None` when no item is there yet (then `fileno()` turns
    /// readable when the producer sends, closes or dies: `cuda_ipc.aio.recv_item`).
    #[pyo3(signature = (use_, *, stream = None))]
    fn try_recv<'py>(
        &self,
        py: Python<'py>,
        use_: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let stream = stream_of(stream)?;
        let mut guard = lock(&self.end.0, "receiver")?;
        let rx = guard.as_mut().ok_or_else(|| closed("receiver"))?;
        match rx.try_recv(&stream).map_err(to_py)? {
            Some(item) => deliver(&self.end, self.device, py, item, use_).map(Some),
            None => Ok(None),
        }
    }

    /// A descriptor that turns readable when `try_recv` may find something: an item, the
    /// producer's close or death (`loop.add_reader`). The first call binds it (a socket in
    /// `/dev/shm`, removed with the receiver); it starts readable.
    fn fileno(&self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        let mut guard = lock(&self.end.0, "receiver")?;
        let rx = guard.as_mut().ok_or_else(|| closed("receiver"))?;
        Ok(rx.listen().map_err(to_py)?.as_raw_fd())
    }

    /// Items received so far.
    #[getter]
    fn received(&self) -> PyResult<u64> {
        let guard = lock(&self.end.0, "receiver")?;
        Ok(guard.as_ref().map_or(0, IpcReceiver::received))
    }

    /// Slots in the ring.
    #[getter]
    fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes one slot holds.
    #[getter]
    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// The producer's pid, as its handle names it.
    #[getter]
    fn producer_pid(&self) -> u32 {
        self.producer_pid
    }

    /// Close the receiver: wait (at most `timeout` seconds, in all) for the device to finish the
    /// work queued in this context (on any stream: work on the items' tensors included) and for
    /// the channel's GPU work here, then unmap; the
    /// producer's next send raises `ChannelClosed` (a broadcast producer stops waiting for
    /// this consumer). Refused while tensors of its slots are alive.
    #[pyo3(signature = (timeout = 30.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        close_end(py, &self.end, "receiver", timeout, IpcReceiver::close)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py, 30.0)
    }

    fn __repr__(&self) -> String {
        format!(
            "Receiver(slots={}, slot_bytes={}, device={}, producer_pid={})",
            self.slots, self.slot_bytes, self.device, self.producer_pid
        )
    }
}
