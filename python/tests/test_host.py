"""What runs without a GPU: the package imports, every exception class is a CudaIpcError,
a missing device is NoDevice (never a crash), and sockets carry bytes with bounded waits."""

import os
import threading
import time

import pytest

import cuda_ipc
from conftest import has_gpu, unique


def test_the_package_exports_its_api_and_exception_hierarchy():
    for name in cuda_ipc.__all__:
        assert hasattr(cuda_ipc, name), name
    for module in ("cuda_core", "shared_weights", "weights"):
        assert module in cuda_ipc.__all__, module
    for exc in (
        cuda_ipc.PeerGone,
        cuda_ipc.StaleHandle,
        cuda_ipc.Timeout,
        cuda_ipc.CorruptHandle,
        cuda_ipc.NoDevice,
        cuda_ipc.HandleTypeMismatch,
        cuda_ipc.TooManyImporters,
        cuda_ipc.ArenaFull,
        cuda_ipc.PeerClosed,
        cuda_ipc.ChannelClosed,
    ):
        assert issubclass(exc, cuda_ipc.CudaIpcError)
        assert issubclass(cuda_ipc.CudaIpcError, Exception)


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU")
def test_without_a_device_a_context_is_no_device_with_the_drivers_reason():
    with pytest.raises(cuda_ipc.NoDevice) as e:
        cuda_ipc.Context(0)
    assert "cu" in str(e.value) or "driver" in str(e.value), str(e.value)


def test_a_socket_carries_bytes_both_ways():
    name = unique("bytes")
    listener = cuda_ipc.Listener(name)
    got = {}

    def peer():
        s = cuda_ipc.connect(name, timeout=10)
        got["first"] = s.recv(timeout=10)
        s.send(b"pong" * 1000)

    t = threading.Thread(target=peer)
    t.start()
    s = listener.accept(timeout=10)
    s.send(b"ping")
    assert s.recv(timeout=10) == b"pong" * 1000
    t.join()
    assert got["first"] == b"ping"
    assert s.peer_pid > 0


def test_a_receive_with_nothing_coming_is_a_bounded_timeout():
    name = unique("timeout")
    listener = cuda_ipc.Listener(name)
    c = cuda_ipc.connect(name, timeout=10)
    s = listener.accept(timeout=10)
    t = time.monotonic()
    with pytest.raises(cuda_ipc.Timeout):
        s.recv(timeout=0.2)
    assert time.monotonic() - t < 5
    del c


def test_a_peer_that_closes_is_peer_closed():
    name = unique("closed")
    listener = cuda_ipc.Listener(name)
    c = cuda_ipc.connect(name, timeout=10)
    s = listener.accept(timeout=10)
    del c
    with pytest.raises(cuda_ipc.PeerClosed) as e:
        s.recv(timeout=5)
    assert "closed" in str(e.value)
    assert e.value.pid == os.getpid(), "the peer's pid, as the crate's error names it"


def test_bad_arguments_are_python_errors_not_crashes():
    with pytest.raises(ValueError):
        cuda_ipc.connect(unique("nobody"), timeout=-1.0)
    with pytest.raises(cuda_ipc.Timeout):  # nobody listened within the timeout
        cuda_ipc.connect(unique("nobody"), timeout=0.05)


def test_connect_waits_for_a_listener_that_comes_up_later():
    name = unique("late")
    got = {}

    def late_listener():
        time.sleep(0.3)
        s = cuda_ipc.Listener(name).accept(timeout=10)
        s.send(b"here now")
        got["sock"] = s  # kept open until the test ends

    t = threading.Thread(target=late_listener)
    t.start()
    start = time.monotonic()
    c = cuda_ipc.connect(name, timeout=10)
    assert time.monotonic() - start >= 0.15
    assert c.recv(timeout=10) == b"here now"
    t.join()


def test_a_pool_buffer_descriptor_parses_from_every_form_and_refuses_the_rest():
    data, size = bytes(range(64)), (1 << 40) + 3
    raw = data + size.to_bytes(8, "little")
    assert cuda_ipc.cuda_core.descriptor_bytes(raw) == raw
    assert cuda_ipc.cuda_core.descriptor_bytes((data, size)) == raw

    class LikeCudaCores:  # what IPCBufferDescriptor.__reduce__ gives
        def __reduce__(self):
            return (object, (data, size))

    assert cuda_ipc.cuda_core.descriptor_bytes(LikeCudaCores()) == raw
    assert cuda_ipc.cuda_core.descriptor_bytes((bytearray(data), size)) == raw
    bad_forms = [raw[:71], raw + b"\0", (data[:63], size), (data, size, 0)]
    # A size that is no byte count, and export data that is not bytes: corrupt descriptors.
    bad_forms += [(data, -1), (data, 1 << 64), (data, -(1 << 70)), (data, 4.0), (data, True)]
    bad_forms += [(list(data), size), (data.decode("latin-1"), size), (None, size)]
    for bad in bad_forms:
        with pytest.raises(cuda_ipc.CorruptHandle):
            cuda_ipc.cuda_core.descriptor_bytes(bad)
    assert cuda_ipc.cuda_core.descriptor_bytes((data, (1 << 64) - 1))[64:] == b"\xff" * 8
    with pytest.raises(TypeError):
        cuda_ipc.cuda_core.descriptor_bytes(3.5)
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="cuda.core"):
            cuda_ipc.cuda_core.ipc_descriptor(raw)
    else:
        assert cuda_ipc.cuda_core.ipc_descriptor(raw).__reduce__()[1] == (data, size)
