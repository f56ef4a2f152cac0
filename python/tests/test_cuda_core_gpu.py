"""Pools shared with NVIDIA's cuda.core (1.2 on the GPU machines), both ways, between real
processes: a cuda.core buffer opened here as a tensor from cuda.core's own objects (and from
its raw parts), every byte checked both ways; a Pool tensor opened by a cuda.core process;
forged and oversized descriptors refused; a killed exporter on either side leaves the survivor
its views readable, a clear error for new opens, and its device memory back at its baseline."""

import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Listener
from multiprocessing.reduction import recv_handle, send_handle

import pytest

import cuda_ipc
from conftest import HERE, unique

pytestmark = pytest.mark.gpu

N = (1 << 20) + 12  # not a whole number of pages


def have_cuda_core():
    try:
        import cuda.core  # noqa: F401
        import cupy  # noqa: F401
    except ImportError as e:
        if os.environ.get("CUDA_IPC_REQUIRE_CUDA_CORE"):
            raise
        pytest.skip(f"SKIPPED: needs cuda.core and CuPy ({e})")


def pattern(n, seed):
    import torch

    return ((torch.arange(n, dtype=torch.int64, device="cuda") * 7 + seed) % 251).to(torch.uint8)


T = 60  # seconds any one step of a peer may take


class Peer:
    """tests/cuda_core_peer.py as `role`, connected to this process's listener. Every wait on
    the peer is bounded (`T`): a peer that dies or stalls fails the test at once, naming its
    exit status and what it wrote to stderr, instead of hanging the suite."""

    def __init__(self, role, n, seed, seed2=0):
        name = unique("cuda-core")
        self.listener = Listener("\0" + name, family="AF_UNIX")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "cuda_core_peer.py"), role, name, str(n), str(seed), str(seed2)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.conn = self._accept(T)

    def _fail(self, what):
        """End the peer and fail the test with `what`, its exit status and its stderr."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            _, err = self.proc.communicate(timeout=T)
        except subprocess.TimeoutExpired:
            err = "(its stderr could not be read)"
        self.listener.close()
        pytest.fail(f"cuda.core peer: {what} (exit status {self.proc.returncode}); stderr:\n{err}")

    def _accept(self, timeout):
        """The peer's connection, within `timeout` s (Listener.accept has no timeout: it runs
        on a daemon thread, watched)."""
        got = []
        t = threading.Thread(target=lambda: got.append(self.listener.accept()), daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        while True:
            t.join(0.05)
            if got:
                return got[0]
            if not t.is_alive():
                self._fail("accepting its connection failed")
            if self.proc.poll() is not None:
                self._fail("exited before it connected")
            if time.monotonic() > deadline:
                self._fail(f"did not connect within {timeout} s")

    def _next(self, read, what, timeout):
        """What `read` takes from the connection (the peer's next `what`), within `timeout` s."""
        if not self.conn.poll(timeout):
            self._fail(f"sent no {what} within {timeout} s")
        try:
            return read(self.conn)
        except (EOFError, OSError, RuntimeError) as e:
            self._fail(f"sent no {what}: the connection closed or broke ({e!r})")

    def recv_fd(self, timeout=T):
        """A file descriptor the peer sends, within `timeout` s."""
        return self._next(recv_handle, "descriptor", timeout)

    def recv(self, timeout=T):
        """The peer's next message, within `timeout` s."""
        return self._next(lambda conn: conn.recv(), "message", timeout)

    def finish(self, timeout=60):
        out, err = self.proc.communicate(timeout=timeout)
        self.listener.close()
        assert self.proc.returncode == 0, err
        return [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]

    def kill(self):
        self.proc.kill()
        self.proc.communicate(timeout=60)
        self.listener.close()


def free_memory():
    """The device's free memory, PyTorch's and CuPy's caches given back to the driver first."""
    import cupy
    import torch

    torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
    return torch.cuda.mem_get_info()[0]


def wait_for_memory(baseline, what):
    """The device's free memory back within 32 MiB of `baseline`, within 20 s."""
    deadline = time.monotonic() + 20
    while True:
        if free_memory() + (32 << 20) >= baseline:
            return
        assert time.monotonic() < deadline, f"{what}: {(baseline - free_memory()) >> 20} MiB not back"
        time.sleep(0.05)


def test_a_cuda_core_buffer_opens_as_a_tensor_from_cuda_cores_own_objects():
    have_cuda_core()
    import torch
    from cuda.core._memory._ipc import IPCAllocationHandle

    ctx = cuda_ipc.Context(0)
    peer = Peer("export", N, 3)
    fd = peer.recv_fd()
    desc = peer.recv()  # cuda.core's IPCBufferDescriptor
    assert desc.size == N
    # cuda.core's own handle object (what its multiprocessing pickling rebuilds).
    pool = cuda_ipc.ForeignPool(ctx, IPCAllocationHandle._init(fd, None), exporter_pid=peer.proc.pid)
    assert pool.exporter_pid == peer.proc.pid
    t = pool.open(desc, (N,), torch.uint8)
    assert torch.equal(torch.from_dlpack(t), pattern(N, 3)), "every byte cuda.core wrote"
    # The raw parts open the same import: 72 bytes, and (export_data, size).
    raw = cuda_ipc.cuda_core.descriptor_bytes(desc)
    words = pool.open(raw, (N // 4,), torch.int32)
    parts = pool.open((raw[:64], N), (16,), "uint8")
    assert words.data_ptr == t.data_ptr == parts.data_ptr
    del words, parts
    torch.from_dlpack(t).copy_(pattern(N, 5))
    torch.cuda.synchronize()
    peer.conn.send("verify 5")
    assert peer.recv() == "written exact"
    # Refused: more bytes than the buffer, a size past the allocation (though the tensor
    # fits), a forged export, malformed descriptors.
    with pytest.raises(cuda_ipc.CorruptHandle):
        pool.open(desc, (N + 1,), "uint8")
    with pytest.raises(cuda_ipc.CorruptHandle, match="claims"):
        pool.open((raw[:64], 1 << 40), (16,), "uint8")
    forged = bytes(b ^ 0x5A for b in raw[:64]) + raw[64:]
    with pytest.raises(cuda_ipc.CudaIpcError, match="cuMemPoolImportPointer"):
        pool.open(forged, (16,), "uint8")
    with pytest.raises(cuda_ipc.CorruptHandle):
        pool.open(raw[:71], (16,), "uint8")
    with pytest.raises(TypeError):
        pool.open(object(), (16,), "uint8")
    with open("/dev/null") as f:
        with pytest.raises(cuda_ipc.CudaIpcError, match="cuMemPoolImportFromShareableHandle"):
            cuda_ipc.ForeignPool(ctx, f.fileno())
    del t
    assert cuda_ipc.wait_released(30)
    peer.conn.send("done")
    assert peer.recv() == "closed"
    peer.finish()


def test_a_pool_tensor_opens_in_cuda_core():
    have_cuda_core()
    import torch

    ctx = cuda_ipc.Context(0)
    pool = cuda_ipc.Pool(ctx)
    t = pool.empty((N,), torch.uint8)
    torch.from_dlpack(t).copy_(pattern(N, 11))
    torch.cuda.synchronize()
    peer = Peer("import", N, 11, 13)
    fd = pool.allocation_handle()
    send_handle(peer.conn, fd, peer.proc.pid)
    os.close(fd)
    peer.conn.send(cuda_ipc.cuda_core.ipc_descriptor(t.ipc_descriptor()))
    assert peer.recv() == "closed"
    assert peer.finish() == [f"read {N} exact"]
    assert torch.equal(torch.from_dlpack(t), pattern(N, 13)), "every byte cuda.core wrote"
    with pytest.raises(TypeError):
        cuda_ipc.Arena(ctx, 1 << 20).empty((4,), "uint8").ipc_descriptor()


def test_a_killed_cuda_core_exporter_leaves_this_process_its_memory_back():
    have_cuda_core()
    import torch

    ctx = cuda_ipc.Context(0)
    torch.cuda.init()
    baseline = free_memory()
    n = 64 << 20
    peer = Peer("export", n, 17)
    fd = peer.recv_fd()
    desc = peer.recv()
    pool = cuda_ipc.ForeignPool(ctx, fd, exporter_pid=peer.proc.pid)
    os.close(fd)
    t = pool.open(desc, (n,), torch.uint8)
    peer.conn.send("hold")
    assert peer.recv() == "holding"
    peer.kill()
    # The driver keeps this process's import: the tensor still reads what was there.
    assert torch.equal(torch.from_dlpack(t), pattern(n, 17))
    with pytest.raises(cuda_ipc.PeerGone):
        pool.open(cuda_ipc.cuda_core.descriptor_bytes(desc), (16,), "uint8")
    del t, pool
    assert cuda_ipc.wait_released(30)
    wait_for_memory(baseline, "after the cuda.core exporter's death")


def reads_pattern(buf, n, seed):
    """Whether a cuda.core buffer holds the peer's pattern (CuPy's temporaries gone after)."""
    import cupy

    mem = cupy.cuda.UnownedMemory(int(buf.handle), n, buf)
    got = cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
    expected = ((cupy.arange(n, dtype=cupy.uint64) * 7 + seed) % 251).astype(cupy.uint8)
    return bool((got == expected).all())


def test_a_killed_pool_exporter_leaves_a_cuda_core_importer_its_memory_back():
    have_cuda_core()
    import torch
    from cuda.core import Buffer, Device, DeviceMemoryResource

    torch.cuda.init()
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    baseline = free_memory()
    n = 64 << 20
    peer = Peer("pool_export", n, 19)
    fd = peer.recv_fd()
    desc = peer.recv()
    mr = DeviceMemoryResource.from_allocation_handle(dev, fd)
    os.close(fd)
    buf = Buffer.from_ipc_descriptor(mr, desc, stream=stream)
    peer.conn.send("hold")
    assert peer.recv() == "holding"
    peer.kill()
    assert reads_pattern(buf, n, 19), "cuda.core's import reads the dead exporter's bytes"
    buf.close(stream)
    stream.sync()
    mr.close()
    wait_for_memory(baseline, "after the cuda_ipc exporter's death")


def test_ipc_descriptor_waits_for_its_allocation_within_its_timeout():
    """`Tensor.ipc_descriptor` waits for the allocation on its stream, at most `timeout`: a
    stream held up (here by a spin kernel of about a second) is a `Timeout` within the bound,
    not a wait without end; once the stream moves on, the descriptor comes."""
    import torch

    ctx = cuda_ipc.Context(0)
    pool = cuda_ipc.Pool(ctx)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))  # on the legacy stream, which the pool allocates on
    t = pool.empty((4096,), "uint8")
    start = time.monotonic()
    with pytest.raises(cuda_ipc.Timeout):
        t.ipc_descriptor(timeout=0.05)
    assert time.monotonic() - start < 0.5, "the wait outran its bound"
    with pytest.raises(ValueError):
        t.ipc_descriptor(timeout=-1.0)
    torch.cuda.synchronize()
    assert len(t.ipc_descriptor(timeout=5.0)) == 72
