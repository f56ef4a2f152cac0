"""cuda-ipc for Python: GPU tensors shared between processes, safely.

An owner allocates tensors in an :class:`Arena` (memory another process can map), sends the
arena once over a :class:`Socket` and each tensor's ``handle()`` as bytes; a reader imports the
arena once (``Socket.recv_arena``, read-only if asked) and opens every tensor with
``ImportedArena.open`` — no driver call, microseconds each. Tensors go to PyTorch, CuPy or JAX
with no copy (``torch.from_dlpack(t)``, ``cupy.asarray(t)``). Handles are typed, checksummed
bytes (no pickle); every error is a :class:`CudaIpcError` subclass that keeps the reason.
Dropping a tensor never unmaps or frees memory under queued GPU work: its memory is given back
once the device has finished what was queued before the drop (:func:`wait_released` waits for
that).

A GPU channel (:class:`Sender`, :class:`Receiver`) streams slots of bytes from one process to
another (or to up to 8), ordered on the GPU with no host synchronize, each item with a header
of up to 4 KiB; :mod:`cuda_ipc.weights` syncs a PyTorch model's weights through it, in buckets;
:mod:`cuda_ipc.shared_weights` syncs them with one copy, the engine reading the trainer's own
tensors (``Socket.send_tensor``: PyTorch's memory shared as it is). A :class:`Pool`'s tensors
open in NVIDIA cuda.core processes, and cuda.core's pools open here (:class:`ForeignPool`;
:mod:`cuda_ipc.cuda_core`).

Built on the cuda-ipc Rust crate (https://docs.rs/cuda-ipc); see README.md.
"""

from ._native import (
    Arena,
    ArenaFull,
    ChannelClosed,
    Context,
    CorruptHandle,
    CudaIpcError,
    ForeignPool,
    HandleTypeMismatch,
    ImportedArena,
    Listener,
    NoDevice,
    PeerClosed,
    PeerGone,
    Pool,
    Receiver,
    Sender,
    Socket,
    StaleHandle,
    Tensor,
    Timeout,
    TooManyImporters,
    connect,
    leaked_releases,
    reclaim_stale_regions,
    wait_released,
)

__all__ = [
    "Arena",
    "ArenaFull",
    "ChannelClosed",
    "Context",
    "CorruptHandle",
    "CudaIpcError",
    "ForeignPool",
    "HandleTypeMismatch",
    "ImportedArena",
    "Listener",
    "NoDevice",
    "PeerClosed",
    "PeerGone",
    "Pool",
    "Receiver",
    "Sender",
    "Socket",
    "StaleHandle",
    "Tensor",
    "Timeout",
    "TooManyImporters",
    "connect",
    "leaked_releases",
    "reclaim_stale_regions",
    "wait_released",
    "inspect",
]
import atexit as _atexit  # noqa: E402
import json as _json  # noqa: E402

from . import _native  # noqa: E402
from . import aio, cuda_core, shared_weights, weights  # noqa: E402  (torch, cuda.core: when used)

# Tensors' memory is given back after the GPU's queued work (see `wait_released`): at exit,
# let what is queued (and what finalisation drops) be released before the process ends.
_atexit.register(_native.exiting)



def inspect() -> dict:
    """What this user's processes share on the machine, read without disturbing them: a dict
    with ``exporters`` (each a ``process`` — ``pid``, ``start_time``, ``alive``, ``command`` —
    and its ``tables``: ``kind`` registry / arena / pool, ``exports`` with ``generation``,
    ``live``, ``deferred``, ``kind`` (legacy / fd / pool / arena / channel / signal), ``device``
    (``GPU-`` and the first 8 hex digits of its UUID, as ``nvidia-smi -L`` prints it),
    ``read_only``, ``bytes`` and the lease ``holders``, ``importers`` by ``slot``),
    ``channels`` (``producer``, ``consumers`` with ``released`` and ``in_flight``), ``regions``,
    ``unreadable`` (tables that do not decode, with the reason) and ``unlinked`` (regions whose
    names are gone but which processes still map: ``name``, ``mapped_by``). ``python -m cuda_ipc
    inspect`` prints it as a tree. See the Rust crate's ``cuda_ipc::inspect`` for what each
    table tells."""
    return _json.loads(_native.inspect_snapshot()[1])


__all__ += ["aio", "cuda_core", "shared_weights", "weights"]
__version__ = "0.2.0"
