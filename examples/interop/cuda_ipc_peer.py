"""Share CUDA memory between PyTorch / CuPy processes and cuda-ipc (Rust) with raw legacy IPC
handles: the 64 bytes of a ``cudaIpcMemHandle_t``, an offset and a size.

Use it as a module::

    from cuda_ipc_peer import torch_export, cupy_open

    export = torch_export(tensor)        # dict: handle (hex), offset, bytes, device, pid
    # ... send it to the Rust process, which opens it with
    #     ImportedBuffer::<f32>::open_raw(&ctx, &RawImport::new(
    #         RawMemHandle::from_torch(&hex_decode(handle))?, offset, bytes / 4).exporter_pid(pid))
    # and keep `tensor` alive until the Rust side is done with it.

    array, base = cupy_open(rust_export, "int32")  # a CuPy view of a Rust IpcBuffer's memory
    torch.as_tensor(array, device="cuda")          # ... and a PyTorch one (no copy)
    cupy_close(base)                               # then tell the Rust side you are done

or as a script, which cuda-ipc's tests and benches run (``python3 cuda_ipc_peer.py ROLE ...``).

What PyTorch sends for a CUDA tensor (``torch.multiprocessing``): the storage's
``_share_cuda_()`` tuple — device, the handle (66 bytes: a version byte, ``b'c'`` for a
``cudaMalloc`` block, then the 64 handle bytes), the storage's size in bytes, the storage's
byte offset inside the caching allocator's block, a ref-counter file name and offset, an event
handle and an event-sync flag. The handle maps the whole block: the tensor's data starts at the
storage offset plus ``tensor.storage_offset() * element_size``. Tensors from an allocator with
``expandable_segments:True`` have a ``b'e'`` handle, which is not legacy IPC (cuda-ipc refuses
it with a clear error).
"""

import os
import sys
import time


def torch_export(tensor):
    """What a peer needs to open a contiguous CUDA tensor by its raw handle."""
    if not tensor.is_cuda or not tensor.is_contiguous():
        raise ValueError("share a contiguous CUDA tensor")
    shared = tensor.untyped_storage()._share_cuda_()
    device, handle, block_bytes, storage_offset = shared[0], shared[1], shared[2], shared[3]
    return {
        "handle": bytes(handle).hex(),
        "offset": storage_offset + tensor.storage_offset() * tensor.element_size(),
        "bytes": tensor.numel() * tensor.element_size(),
        "device": device,
        "pid": os.getpid(),
        "storage_bytes": block_bytes,
    }


def cupy_open(export, dtype):
    """A CuPy array over memory exported as a raw handle (a dict like ``torch_export``'s, or
    cuda-ipc's ``RawExport`` fields), and the mapping's base: close it with
    ``cupy_close(base)`` once nothing uses the array."""
    import cupy

    handle = bytes.fromhex(export["handle"])
    if len(handle) == 66:  # PyTorch's form: version, type, then the 64 bytes
        handle = handle[2:]
    base = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    memory = cupy.cuda.UnownedMemory(base + export["offset"], export["bytes"], owner=None)
    itemsize = cupy.dtype(dtype).itemsize
    array = cupy.ndarray((export["bytes"] // itemsize,), dtype, cupy.cuda.MemoryPointer(memory, 0))
    return array, base


def cupy_close(base):
    import cupy

    cupy.cuda.runtime.ipcCloseMemHandle(base)


def _line(*fields):
    print(*fields, flush=True)


def _export_line(export):
    _line("EXPORT", export["handle"], export["offset"], export["bytes"], export["device"],
          export["pid"], export["storage_bytes"])


def _torch_export(n, value, mode):
    """Export an int32 tensor of n values set to `value`, then answer `check V` lines from stdin
    (all elements equal V?) until EOF."""
    import torch

    keep = []
    if mode == "offset":
        # A small tensor first: the next one is carved from the same caching-allocator block,
        # at a non-zero offset; and a view into it adds a tensor storage offset on top.
        keep.append(torch.zeros(1000, dtype=torch.int32, device="cuda"))
        base = torch.full((n + 16,), value, dtype=torch.int32, device="cuda")
        keep.append(base)
        tensor = base[16:]
    else:
        tensor = torch.full((n,), value, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    _export_line(torch_export(tensor))
    if mode == "exit":
        return 0
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["check"]:
            want = int(words[1])
            torch.cuda.synchronize()
            bad = int((tensor != want).sum().item())
            _line("OK" if bad == 0 else f"BAD {bad} of {tensor.numel()} elements differ from {want}")
    return 0


def _cupy_import(handle, offset, nbytes, want, write):
    """Open a Rust export with CuPy, check every int32 is `want`, view it in PyTorch, write
    `write` through PyTorch, close."""
    import cupy
    import torch

    array, base = cupy_open({"handle": handle, "offset": offset, "bytes": nbytes}, "int32")
    bad = int((array != want).sum())
    tensor = torch.as_tensor(array, device="cuda")
    torch_bad = int((tensor != want).sum().item())
    tensor.fill_(write)
    torch.cuda.synchronize()
    del tensor, array
    cupy_close(base)
    _line("OK" if bad == 0 and torch_bad == 0 else f"BAD cupy {bad} torch {torch_bad}")
    return 0


def _mp_receiver(inbox, outbox):
    import torch

    while True:
        tensor = inbox.get()
        if tensor is None:
            return
        outbox.put(tensor.data_ptr())  # the tensor is rebuilt (handle opened or cache hit)
        del tensor


def _torch_mp_bench(iterations, numel):
    """torch.multiprocessing's own hand-off: a CUDA tensor put on a queue, rebuilt by the
    receiver (which replies with its data pointer), p10/p50/p90 µs per hand-off round trip with
    the receiver's cache warm (the same tensor each time)."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_mp_receiver, args=(inbox, outbox))
    receiver.start()
    tensor = torch.ones(numel, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    for _ in range(50):  # warm: the receiver's IPC cache holds the block after the first
        inbox.put(tensor)
        outbox.get()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        inbox.put(tensor)
        outbox.get()
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    inbox.put(None)
    receiver.join()
    times.sort()
    pick = lambda p: times[int(round((len(times) - 1) * p))]
    _line("TORCH_MP", f"{pick(0.1):.2f}", f"{pick(0.5):.2f}", f"{pick(0.9):.2f}")
    return 0


def main(argv):
    role = argv[1] if len(argv) > 1 else ""
    if role == "torch-export":
        return _torch_export(int(argv[2]), int(argv[3]), argv[4])
    if role == "cupy-import":
        return _cupy_import(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6]))
    if role == "torch-mp-bench":
        return _torch_mp_bench(int(argv[2]), int(argv[3]))
    if role == "versions":
        import cupy
        import torch

        _line("VERSIONS", torch.__version__, cupy.__version__, torch.cuda.device_count())
        return 0
    print(__doc__)
    print("roles: torch-export N VALUE plain|offset|exit, cupy-import HANDLE OFFSET BYTES WANT WRITE,"
          " torch-mp-bench ITERATIONS NUMEL, versions", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
