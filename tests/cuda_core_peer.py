"""A cuda.core process for tests/cuda_core.rs: it shares an IPC-enabled DeviceMemoryResource's
buffer with the test ("export"), or opens one of the test's IpcPool buffers ("import"), over a
SOCK_SEQPACKET Unix socket, and prints RESULT lines. cuda_ipc's FdSocket sends one record per
message, its payload after one frame-version byte (1).

Bytes are the pattern (i * 7 + seed) % 251, written and checked with CuPy.
"""
import os
import socket
import sys
import time

import cupy
from cuda.core import Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions
from cuda.core._memory._ipc import IPCBufferDescriptor


def view(buf, n):
    mem = cupy.cuda.UnownedMemory(int(buf.handle), n, buf)
    return cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))


def pattern(n, seed):
    return ((cupy.arange(n, dtype=cupy.uint64) * 7 + seed) % 251).astype(cupy.uint8)


FRAME = b"\x01"


def send(sock, payload, fds=()):
    socket.send_fds(sock, [FRAME + payload], list(fds))


def recv(sock, size=128):
    msg, fds, _, _ = socket.recv_fds(sock, size + 1, 1)
    if not msg:
        return b"", fds
    assert msg[:1] == FRAME, msg
    return msg[1:], fds


def result(line):
    print("RESULT " + line, flush=True)


def main():
    role, name, nbytes, seed, seed2 = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    if role == "export":
        mr = DeviceMemoryResource(dev, DeviceMemoryResourceOptions(ipc_enabled=True, max_size=1 << 28))
        buf = mr.allocate(nbytes, stream=stream)
        stream.sync()
        view(buf, nbytes)[:] = pattern(nbytes, seed)
        cupy.cuda.runtime.deviceSynchronize()
        _, (export_data, size) = buf.ipc_descriptor.__reduce__()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect("\0" + name)
        send(sock, export_data + size.to_bytes(8, "little"), [int(mr.allocation_handle)])
        while True:
            msg, _ = recv(sock)
            if msg == b"verify":
                ok = bool((view(buf, nbytes) == pattern(nbytes, seed2)).all())
                result("written " + ("exact" if ok else "WRONG"))
                send(sock, b"checked")
            elif msg == b"hold":
                send(sock, b"holding")
                time.sleep(120)  # until killed
            else:  # b"done" or the test went away: free
                buf.close(stream)
                stream.sync()
                mr.close()
                result("closed")
                return
    elif role == "import":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind("\0" + name)
        listener.listen(1)
        conn, _ = listener.accept()
        msg, fds = recv(conn)
        mr = DeviceMemoryResource.from_allocation_handle(dev, fds[0])
        os.close(fds[0])
        desc = IPCBufferDescriptor._init(bytes(msg[:64]), int.from_bytes(msg[64:72], "little"))
        buf = Buffer.from_ipc_descriptor(mr, desc, stream=stream)
        ok = buf.size == nbytes and bool((view(buf, nbytes) == pattern(nbytes, seed)).all())
        result(f"read {buf.size} " + ("exact" if ok else "WRONG"))
        view(buf, nbytes)[:] = pattern(nbytes, seed2)
        cupy.cuda.runtime.deviceSynchronize()
        buf.close(stream)
        stream.sync()
        mr.close()
        send(conn, b"closed")
        result("closed")
    else:
        sys.exit(f"unknown role {role}")


main()
