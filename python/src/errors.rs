//! cuda-ipc's errors as Python exceptions: one class per reason a caller branches on, all
//! under `CudaIpcError`, each keeping the crate's full message (`str(e)`) and, where the crate
//! names a process, its pid (`e.pid`) and what it was (`e.role`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    cuda_ipc,
    CudaIpcError,
    PyException,
    "Any error of cuda-ipc."
);
create_exception!(
    cuda_ipc,
    PeerGone,
    CudaIpcError,
    "A process this one depends on is gone (`pid`, `role`: \"exporter\", \"importer\" or \"barrier party\")."
);
create_exception!(
    cuda_ipc,
    StaleHandle,
    CudaIpcError,
    "The handle names an export that no longer exists (freed, or its owner dropped it)."
);
create_exception!(
    cuda_ipc,
    Timeout,
    CudaIpcError,
    "A bounded wait ran out of time."
);
create_exception!(
    cuda_ipc,
    CorruptHandle,
    CudaIpcError,
    "Handle bytes that are damaged, forged, or of another kind, arena or element type."
);
create_exception!(
    cuda_ipc,
    NoDevice,
    CudaIpcError,
    "No usable CUDA device, or no CUDA driver library to load."
);
create_exception!(
    cuda_ipc,
    HandleTypeMismatch,
    CudaIpcError,
    "A handle without what its type needs, or a read-write open of memory shared read-only."
);
create_exception!(
    cuda_ipc,
    TooManyImporters,
    CudaIpcError,
    "Every importer slot of the export is held by a live process."
);
create_exception!(
    cuda_ipc,
    ArenaFull,
    CudaIpcError,
    "The arena has no free range (or block) for the allocation."
);
create_exception!(
    cuda_ipc,
    PeerClosed,
    CudaIpcError,
    "The socket's peer closed the connection (`pid`: the peer's, 0 where its pid namespace is not visible)."
);

create_exception!(
    cuda_ipc,
    ChannelClosed,
    CudaIpcError,
    "The channel's other end closed (`pid`, `role`): a consumer has received every item sent."
);

/// Add the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CudaIpcError", py.get_type::<CudaIpcError>())?;
    m.add("PeerGone", py.get_type::<PeerGone>())?;
    m.add("StaleHandle", py.get_type::<StaleHandle>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("CorruptHandle", py.get_type::<CorruptHandle>())?;
    m.add("NoDevice", py.get_type::<NoDevice>())?;
    m.add("HandleTypeMismatch", py.get_type::<HandleTypeMismatch>())?;
    m.add("TooManyImporters", py.get_type::<TooManyImporters>())?;
    m.add("ArenaFull", py.get_type::<ArenaFull>())?;
    m.add("PeerClosed", py.get_type::<PeerClosed>())?;
    m.add("ChannelClosed", py.get_type::<ChannelClosed>())?;
    Ok(())
}

/// cuda-ipc's error as the Python exception of its class, with `pid` and `role` set where the
/// crate names a process.
pub(crate) fn to_py(e: cuda_ipc::Error) -> PyErr {
    use cuda_ipc::Error as E;
    let message = e.to_string();
    let (err, pid, role) = match &e {
        E::PeerGone { pid, role } => {
            let role = match role {
                cuda_ipc::error::PeerRole::Exporter => "exporter",
                cuda_ipc::error::PeerRole::Importer(_) => "importer",
                _ => "barrier party",
            };
            (PeerGone::new_err(message), Some(*pid), Some(role))
        }
        E::StaleHandle { .. } => (StaleHandle::new_err(message), None, None),
        E::Timeout { waiting_for, .. } => (Timeout::new_err(message), *waiting_for, None),
        E::CorruptHandle { .. } | E::TypeMismatch { .. } | E::LengthMismatch { .. } => {
            (CorruptHandle::new_err(message), None, None)
        }
        E::NoDevice { .. } | E::DriverNotFound { .. } | E::DriverTooOld { .. } => {
            (NoDevice::new_err(message), None, None)
        }
        E::HandleTypeMismatch { .. } => (HandleTypeMismatch::new_err(message), None, None),
        E::TooManyImporters { .. } => (TooManyImporters::new_err(message), None, None),
        E::ArenaFull { .. } => (ArenaFull::new_err(message), None, None),
        E::PeerClosed { pid } => (PeerClosed::new_err(message), Some(*pid), None),
        E::ChannelClosed { pid, role } => {
            (ChannelClosed::new_err(message), Some(*pid), Some(*role))
        }
        E::SameProcess { pid } => (CudaIpcError::new_err(message), Some(*pid), None),
        _ => (CudaIpcError::new_err(message), None, None),
    };
    Python::attach(|py| {
        let value = err.value(py);
        let _ = value.setattr("pid", pid);
        let _ = value.setattr("role", role);
    });
    err
}
