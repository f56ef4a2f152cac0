//! Unix sockets between processes of one user (cuda-ipc's `FdListener`/`FdSocket`, abstract
//! names, the peer's uid checked): plain bytes, and arenas (their descriptor, `SCM_RIGHTS`).
//! Every wait releases the GIL and is bounded by its `timeout` (seconds).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::Context;
use crate::errors::to_py;
use crate::tensor::{Arena, Imported, ImportedArena, Tensor};

fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout)
        .map_err(|_| PyValueError::new_err(format!("timeout {timeout} is not a duration")))
}

fn name(name: &str) -> cuda_ipc::fd::SocketName {
    cuda_ipc::fd::SocketName::Abstract(name.to_owned())
}

/// A listening socket at an abstract name; peers of this user only.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Listener {
    listener: cuda_ipc::fd::FdListener,
}

#[pymethods]
impl Listener {
    #[new]
    fn new(socket_name: &str) -> PyResult<Self> {
        let listener =
            cuda_ipc::fd::FdListener::bind(name(socket_name), cuda_ipc::fd::PeerPolicy::SameUid)
                .map_err(to_py)?;
        Ok(Self { listener })
    }

    /// Wait for one peer, at most `timeout` seconds.
    #[pyo3(signature = (timeout = 30.0))]
    fn accept(&self, py: Python<'_>, timeout: f64) -> PyResult<Socket> {
        let timeout = seconds(timeout)?;
        let socket = py.detach(|| self.listener.accept(timeout)).map_err(to_py)?;
        Ok(Socket { socket })
    }

    /// The next peer if one is connecting now, else `None` (no wait): for an event loop that
    /// watches `fileno()` (`cuda_ipc.aio.accept`).
    fn try_accept(&self) -> PyResult<Option<Socket>> {
        let socket = self.listener.try_accept().map_err(to_py)?;
        Ok(socket.map(|socket| Socket { socket }))
    }

    /// The listening socket's descriptor: readable when a peer connects (`loop.add_reader`).
    fn fileno(&self) -> i32 {
        use std::os::fd::{AsFd, AsRawFd};
        self.listener.as_fd().as_raw_fd()
    }
}

/// A connection to a peer.
#[pyclass(module = "cuda_ipc", frozen)]
pub(crate) struct Socket {
    socket: cuda_ipc::fd::FdSocket,
}

/// Connect to the listener at `socket_name` (a process of this uid), waiting at most
/// `timeout` seconds for one to listen there (`Timeout` if none did).
#[pyfunction]
#[pyo3(signature = (socket_name, timeout = 30.0))]
pub(crate) fn connect(py: Python<'_>, socket_name: &str, timeout: f64) -> PyResult<Socket> {
    let timeout = seconds(timeout)?;
    let n = name(socket_name);
    let socket = py
        .detach(|| cuda_ipc::fd::FdSocket::connect(&n, &cuda_ipc::fd::PeerPolicy::SameUid, timeout))
        .map_err(to_py)?;
    Ok(Socket { socket })
}

#[pymethods]
impl Socket {
    /// Send `payload` (1 to 65,536 bytes) as one message.
    #[pyo3(signature = (payload, timeout = 30.0))]
    fn send(&self, py: Python<'_>, payload: &[u8], timeout: f64) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        py.detach(|| self.socket.send(payload, &[], timeout))
            .map_err(to_py)
    }

    /// Receive one message's bytes, waiting at most `timeout` seconds.
    #[pyo3(signature = (timeout = 30.0))]
    fn recv<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyBytes>> {
        let timeout = seconds(timeout)?;
        let message = py.detach(|| self.socket.recv(timeout)).map_err(to_py)?;
        Ok(PyBytes::new(py, &message.payload))
    }

    /// The next message's bytes if one is there now, else `None` (no wait): for an event
    /// loop that watches `fileno()` (`cuda_ipc.aio.recv`). A message is taken whole or not
    /// at all.
    fn try_recv<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let message = self.socket.try_recv().map_err(to_py)?;
        Ok(message.map(|m| PyBytes::new(py, &m.payload)))
    }

    /// The socket's descriptor: readable when a message or the peer's close is there
    /// (`loop.add_reader`).
    fn fileno(&self) -> i32 {
        use std::os::fd::{AsFd, AsRawFd};
        self.socket.as_fd().as_raw_fd()
    }

    /// Send `arena` (its descriptor and handle): once per peer; then each tensor's handle.
    #[pyo3(signature = (arena, timeout = 30.0))]
    fn send_arena(&self, py: Python<'_>, arena: &Arena, timeout: f64) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        py.detach(|| self.socket.send_arena(&arena.arena, timeout))
            .map_err(to_py)
    }

    /// Receive an arena and import it in `ctx`: read-only when `read_only` (the GPU refuses
    /// writes; required when the owner shares it read-only).
    #[pyo3(signature = (ctx, *, read_only = false, timeout = 30.0))]
    fn recv_arena(
        &self,
        py: Python<'_>,
        ctx: &Context,
        read_only: bool,
        timeout: f64,
    ) -> PyResult<ImportedArena> {
        let timeout = seconds(timeout)?;
        let gpu = ctx.ctx.clone();
        let arena = py
            .detach(|| {
                if read_only {
                    self.socket
                        .recv_arena_read_only(&gpu, timeout)
                        .map(Imported::ReadOnly)
                } else {
                    self.socket
                        .recv_arena(&gpu, timeout)
                        .map(Imported::ReadWrite)
                }
            })
            .map_err(to_py)?;
        Ok(ImportedArena {
            arena,
            ctx: ctx.ctx.clone(),
            device: ctx.ctx.ordinal(),
        })
    }

    /// Send a tensor another allocator owns — PyTorch's caching allocator (also with
    /// `expandable_segments:True`), CuPy's pool — with its dtype and shape, no copy: a legacy
    /// IPC handle, or one descriptor per virtual-memory chunk it spans, sent over this socket
    /// (no `pidfd_getfd`, so it works across containers and pid namespaces). Returns how many
    /// descriptors went (0: a legacy handle). Keep `tensor` alive and its memory unused for
    /// anything else until the peer says it is done (its allocator knows nothing of the peer).
    #[pyo3(signature = (ctx, tensor, timeout = 30.0))]
    fn send_tensor(
        &self,
        py: Python<'_>,
        ctx: &Context,
        tensor: &Bound<'_, PyAny>,
        timeout: f64,
    ) -> PyResult<usize> {
        let timeout = seconds(timeout)?;
        crate::tensor::send_foreign(py, &self.socket, &ctx.ctx, tensor, timeout)
    }

    /// Receive a tensor sent with `send_tensor` and map it in `ctx` (read-write: writes are
    /// seen by the sender). Valid while the sender keeps its tensor alive (see `send_tensor`).
    /// Its bytes are the sender's, live: a `bool` tensor may hold bytes other than 0 and 1,
    /// which PyTorch's kernels assume it does not — from a sender you do not trust, read it
    /// as `t.view(torch.uint8) != 0`.
    #[pyo3(signature = (ctx, timeout = 30.0))]
    fn recv_tensor(&self, py: Python<'_>, ctx: &Context, timeout: f64) -> PyResult<Tensor> {
        let timeout = seconds(timeout)?;
        crate::tensor::recv_foreign(py, &self.socket, &ctx.ctx, timeout)
    }

    /// The peer's pid (0 when it is in a pid namespace this process cannot see).
    #[getter]
    fn peer_pid(&self) -> u32 {
        self.socket.peer().pid
    }
}
