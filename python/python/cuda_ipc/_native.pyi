"""Type stubs of cuda_ipc's extension module (python/src/*.rs)."""

from typing import Any, Callable, Optional, Sequence, Tuple, TypeVar

_R = TypeVar("_R")

class CudaIpcError(Exception):
    """Any error of cuda-ipc; ``str(e)`` is the crate's full reason."""

    pid: Optional[int]
    """The process the error names, if any."""
    role: Optional[str]
    """For PeerGone: "exporter", "importer" or "barrier party"."""

class PeerGone(CudaIpcError): ...
class StaleHandle(CudaIpcError): ...
class Timeout(CudaIpcError): ...
class CorruptHandle(CudaIpcError): ...
class NoDevice(CudaIpcError): ...
class HandleTypeMismatch(CudaIpcError): ...
class TooManyImporters(CudaIpcError): ...
class ArenaFull(CudaIpcError): ...
class PeerClosed(CudaIpcError):
    """The socket's peer closed the connection; ``pid`` is the peer's (0 where its pid
    namespace is not visible)."""
class ChannelClosed(CudaIpcError):
    """The channel's other end closed; a consumer gets it once every item sent was received."""

class Context:
    """A device's primary CUDA context (the one PyTorch and CuPy use)."""

    def __init__(self, device: int = 0) -> None: ...
    @property
    def device(self) -> int: ...

class Tensor:
    """A tensor in an arena: the owner's, or a view of another process's (no copy); another
    process's tensor (``Socket.recv_tensor``); a channel slot.

    Dropping the last reference to it (this object, a DLPack capsule, the torch/CuPy tensor
    made of it) never unmaps or frees the memory under GPU work queued on it: the memory is
    given back once the device has finished everything queued before the drop, on any stream
    (``wait_released`` waits for that). A slot's memory is its channel end's."""

    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def read_only(self) -> bool:
        """Mapped read-only here: the GPU refuses writes (a kernel write faults)."""
    def handle(self) -> bytes:
        """The bytes another process opens this tensor with (owner's tensors only)."""
    def ipc_descriptor(self) -> bytes:
        """A ``Pool`` tensor's 72-byte descriptor (export data, size) for cuda.core or C/C++
        (``cuda_ipc.cuda_core.ipc_descriptor`` makes cuda.core's object of it)."""
    @property
    def __cuda_array_interface__(self) -> dict: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class Arena:
    """Memory another process can map, holding tensors."""

    def __init__(
        self,
        ctx: Context,
        nbytes: int,
        *,
        read_only_for_importers: bool = False,
        max_tensors: Optional[int] = None,
    ) -> None: ...
    def empty(self, shape: Sequence[int], dtype: Any) -> Tensor: ...
    def zeros(self, shape: Sequence[int], dtype: Any, timeout: float = 30.0) -> Tensor: ...
    @property
    def capacity(self) -> int: ...
    @property
    def free_bytes(self) -> int: ...
    @property
    def read_only_for_importers(self) -> bool: ...
    def importers(self) -> list[int]: ...
    def collect(self) -> int:
        """Reuse freed tensors' ranges no live importer views; reap dead importers."""

class Pool:
    """A stream-ordered pool whose tensors cuda.core (and C/C++) processes open."""

    def __init__(self, ctx: Context) -> None: ...
    def empty(self, shape: Sequence[int], dtype: Any) -> Tensor: ...
    def allocation_handle(self) -> int:
        """A new POSIX file descriptor of the pool (yours to send and close)."""
    def importers(self) -> list[int]: ...

class ForeignPool:
    """Another program's pool (cuda.core's IPC-enabled DeviceMemoryResource), imported."""

    def __init__(
        self, ctx: Context, allocation_handle: Any, *, exporter_pid: Optional[int] = None
    ) -> None: ...
    def open(self, descriptor: Any, shape: Sequence[int], dtype: Any) -> Tensor:
        """A buffer as a tensor, from cuda.core's IPCBufferDescriptor, (export_data, size) or
        72 bytes; a size past the allocation, or a tensor past the size, is CorruptHandle. The
        exporter keeps the buffer until this tensor is released."""
    @property
    def exporter_pid(self) -> Optional[int]: ...

def descriptor_bytes(descriptor: Any) -> bytes:
    """A pool buffer descriptor's 72 bytes, from any form ``ForeignPool.open`` takes."""

class ImportedArena:
    """Another process's arena, mapped once; its tensors open without a driver call."""

    def open(self, handle: bytes) -> Tensor: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def exporter_pid(self) -> int: ...
    @property
    def capacity(self) -> int: ...

class Sender:
    """The producing end of a GPU channel: ``slots`` slots of ``slot_bytes`` bytes, for one
    consumer or (``consumers`` > 1) a broadcast to up to that many. One call at a time."""

    def __init__(
        self, ctx: Context, slot_bytes: int, *, slots: int = 4, consumers: int = 1
    ) -> None: ...
    def handle(self) -> bytes:
        """What a consumer opens the channel with (send it over a Socket)."""
    def send(
        self,
        fill: Callable[[Tensor], int],
        *,
        header: Optional[bytes] = None,
        stream: Any = None,
        timeout: float = 30.0,
    ) -> int:
        """Wait for a free slot, call ``fill(slot)`` (enqueue writes on ``stream``; return
        the bytes written), enqueue the send and publish with ``header`` (<= 4096 bytes).
        Returns the item's number. ``stream``: None (legacy default), an int CUstream, or a
        torch/CuPy stream."""
    def consumers(self) -> list[int]: ...
    @property
    def sent(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    def close(self, timeout: float = 30.0) -> None:
        """Wait (within ``timeout``) for the device to finish the work queued in this
        context — on any stream, the slots' tensors' included —, for this side's GPU work and
        for the consumers to close; refused while tensors of the slots are alive."""
    def __enter__(self) -> "Sender": ...
    def __exit__(self, *exc: Any) -> None: ...

class Receiver:
    """The consuming end of a GPU channel, opened from ``Sender.handle()``."""

    def __init__(self, ctx: Context, handle: bytes) -> None: ...
    def recv(
        self,
        use: Callable[[Tensor, bytes], _R],
        *,
        stream: Any = None,
        timeout: float = 30.0,
    ) -> _R:
        """Wait for the next item, call ``use(item, header)`` (enqueue reads on ``stream``),
        then release it there; returns what ``use`` returned."""
    def try_recv(
        self, use: Callable[[Tensor, bytes], _R], *, stream: Any = None
    ) -> Optional[_R]:
        """As ``recv``, without waiting: ``None`` when no item is there yet (then
        ``fileno()`` turns readable when the producer sends, closes or dies)."""
    def fileno(self) -> int:
        """A descriptor that turns readable when ``try_recv`` may find something
        (``loop.add_reader``; ``cuda_ipc.aio.recv_item``). Starts readable."""
    @property
    def received(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def producer_pid(self) -> int: ...
    def close(self, timeout: float = 30.0) -> None:
        """Wait (within ``timeout``) for the device to finish the work queued in this
        context — on any stream, the items' tensors' included — and for this side's GPU work,
        then unmap; refused while tensors of the slots are alive."""
    def __enter__(self) -> "Receiver": ...
    def __exit__(self, *exc: Any) -> None: ...

class Listener:
    """A Unix socket at an abstract name, for peers of this user."""

    def __init__(self, socket_name: str) -> None: ...
    def accept(self, timeout: float = 30.0) -> Socket: ...
    def try_accept(self) -> Optional[Socket]:
        """The next peer if one is connecting now, else ``None``."""
    def fileno(self) -> int:
        """Readable when a peer connects (``cuda_ipc.aio.accept``)."""

class Socket:
    """A connection to a peer: bytes, arenas (their descriptor), and tensors of other
    allocators (``send_tensor``)."""

    def send(self, payload: bytes, timeout: float = 30.0) -> None: ...
    def recv(self, timeout: float = 30.0) -> bytes: ...
    def try_recv(self) -> Optional[bytes]:
        """The next message if one is there now, else ``None`` (taken whole or not at all)."""
    def fileno(self) -> int:
        """Readable when a message or the peer's close is there (``cuda_ipc.aio.recv``)."""
    def send_arena(self, arena: Arena, timeout: float = 30.0) -> None: ...
    def recv_arena(
        self, ctx: Context, *, read_only: bool = False, timeout: float = 30.0
    ) -> ImportedArena: ...
    def send_tensor(self, ctx: Context, tensor: Any, timeout: float = 30.0) -> int:
        """Send a contiguous tensor PyTorch's or CuPy's allocator owns (a torch tensor, or any
        object with ``__cuda_array_interface__``), no copy: its legacy IPC handle, or for
        ``expandable_segments:True`` one descriptor per chunk it spans, sent over this socket
        (no ``pidfd_getfd``: works across containers and pid namespaces). Returns the number
        of descriptors sent (0: a legacy handle). Keep ``tensor`` alive, its memory not reused,
        until the peer says it is done: its allocator knows nothing of the peer."""
    def recv_tensor(self, ctx: Context, timeout: float = 30.0) -> Tensor:
        """A tensor sent with ``send_tensor``, mapped read-write in ``ctx`` (the sender sees
        writes). Valid while the sender keeps its tensor (see ``send_tensor``). Its bytes are
        the sender's: a ``bool`` tensor may hold bytes other than 0 and 1 — from a sender you
        do not trust, read it as ``t.view(torch.uint8) != 0``."""
    @property
    def peer_pid(self) -> int: ...

def connect(socket_name: str, timeout: float = 30.0) -> Socket:
    """Connect to the listener at ``socket_name`` (a process of this uid), waiting at most
    ``timeout`` seconds for one to listen there (``Timeout`` if none did)."""
def reclaim_stale_regions() -> int:
    """Remove the shared-memory regions (export tables, channels) that processes which died
    left behind; how many."""

def inspect_snapshot() -> tuple[str, str]:
    """What this user's processes share on the machine, from one read: the tree as text and
    the same as JSON (``cuda_ipc.inspect`` parses it)."""

class InspectWatch:
    """Snapshots one after another: ``snapshot()`` is ``inspect_snapshot()``'s (tree, JSON) with each
    channel's time without progress (``unchanged_for_s``) since this watch last saw it move."""

    def __init__(self) -> None: ...
    def snapshot(self) -> tuple[str, str]: ...


def wait_released(timeout: float = 10.0) -> bool:
    """Wait (at most ``timeout`` seconds) until the memory of every tensor dropped so far is
    given back — after the GPU finished the work queued before each drop. ``True`` if it was,
    ``False`` if the time ran out first (a stream still busy, or waiting on the GPU for a peer).
    Dropping never waits; call this where the release must be seen (device memory counted, a
    freed arena tensor's handle refused, ``/dev/shm`` names gone). At exit it is waited for
    (at most 5 s)."""

def leaked_releases() -> int:
    """Releases given up because the device's synchronisation failed (a queued kernel
    faulted and the context is unusable): their memory stays mapped until the process exits."""

def exiting() -> None:
    """The package's ``atexit`` hook (see ``wait_released``); not for direct use."""
