"""Speak NVIDIA cuda.core's IPC: pools and buffers shared with ``cuda.core`` processes both ways.

cuda.core shares an IPC-enabled ``DeviceMemoryResource`` as a POSIX file descriptor (its
``allocation_handle``) and each ``Buffer`` as an ``IPCBufferDescriptor`` (the allocation's
``cuMemPoolExportPointer`` data and its size) — the driver objects of this package's
:class:`~cuda_ipc.Pool`:

- **From cuda.core**: ``cuda_ipc.ForeignPool(ctx, mr.allocation_handle, exporter_pid=pid)``
  imports its pool (a descriptor received with ``multiprocessing.reduction.recv_handle`` or
  ``socket.recv_fds`` works as well), and ``pool.open(buffer.ipc_descriptor, shape, dtype)``
  opens a buffer as a tensor.
- **To cuda.core**: ``Pool.allocation_handle()`` is what
  ``DeviceMemoryResource.from_allocation_handle(device, fd)`` takes, and
  :func:`ipc_descriptor` turns ``tensor.ipc_descriptor()`` into the ``IPCBufferDescriptor``
  that ``Buffer.from_ipc_descriptor`` takes (it pickles, so it travels over a
  ``multiprocessing`` connection to a process that has only cuda.core).

Who frees first: the importer, always (the CUDA guide's rule for pool memory) — keep a tensor
or ``Buffer`` until the other side says it closed its import.
"""

from ._native import descriptor_bytes

__all__ = ["descriptor_bytes", "ipc_descriptor"]


def ipc_descriptor(descriptor):
    """cuda.core's ``IPCBufferDescriptor`` for a pool buffer's descriptor
    (``Tensor.ipc_descriptor()``'s 72 bytes, or ``(export_data, size)``).

    cuda.core has no public constructor from the raw parts: this uses the one its own pickling
    uses (``IPCBufferDescriptor._init``), checked to exist.
    """
    raw = descriptor_bytes(descriptor)
    try:
        from cuda.core._memory._ipc import IPCBufferDescriptor
    except ImportError as e:  # no cuda.core, or one laid out otherwise
        raise ImportError(f"cuda.core's IPCBufferDescriptor is not importable here: {e}") from e
    init = getattr(IPCBufferDescriptor, "_init", None)
    if init is None:
        raise TypeError("this cuda.core's IPCBufferDescriptor has no _init(reserved, size)")
    return init(raw[:64], int.from_bytes(raw[64:], "little"))
