"""A peer for test_cuda_core_gpu.py: a cuda.core process that shares a buffer of an IPC-enabled
DeviceMemoryResource ("export") or opens a cuda_ipc Pool's ("import"), or a cuda_ipc process
whose Pool a cuda.core test process opens ("pool_export", killed by the test). The test listens
on a multiprocessing connection (AF_UNIX, abstract name); descriptors travel with
multiprocessing.reduction.send_handle, IPCBufferDescriptors pickled. Bytes are the pattern
(i * 7 + seed) % 251, written and checked with CuPy. Prints RESULT lines."""

import os
import sys
import time
from multiprocessing.connection import Client
from multiprocessing.reduction import recv_handle, send_handle

import cupy


def pattern(n, seed):
    return ((cupy.arange(n, dtype=cupy.uint64) * 7 + seed) % 251).astype(cupy.uint8)


def view(ptr, n, owner):
    mem = cupy.cuda.UnownedMemory(ptr, n, owner)
    return cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))


def result(line):
    print("RESULT " + line, flush=True)


def cuda_core():
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    return dev, dev.create_stream()


def export(conn, n, seed):
    from cuda.core import DeviceMemoryResource, DeviceMemoryResourceOptions

    dev, stream = cuda_core()
    mr = DeviceMemoryResource(dev, DeviceMemoryResourceOptions(ipc_enabled=True, max_size=1 << 28))
    buf = mr.allocate(n, stream=stream)
    stream.sync()
    view(int(buf.handle), n, buf)[:] = pattern(n, seed)
    cupy.cuda.runtime.deviceSynchronize()
    send_handle(conn, int(mr.allocation_handle), os.getppid())
    conn.send(buf.ipc_descriptor)
    while True:
        msg = conn.recv()
        if msg.startswith("verify "):
            ok = bool((view(int(buf.handle), n, buf) == pattern(n, int(msg.split()[1]))).all())
            conn.send("written " + ("exact" if ok else "WRONG"))
        elif msg == "hold":
            conn.send("holding")
            time.sleep(120)  # until killed
        else:
            buf.close(stream)
            stream.sync()
            mr.close()
            conn.send("closed")
            return


def import_(conn, n, seed, seed2):
    from cuda.core import Buffer, DeviceMemoryResource

    dev, stream = cuda_core()
    fd = recv_handle(conn)
    desc = conn.recv()  # cuda.core's own IPCBufferDescriptor, unpickled
    mr = DeviceMemoryResource.from_allocation_handle(dev, fd)
    os.close(fd)
    buf = Buffer.from_ipc_descriptor(mr, desc, stream=stream)
    ok = buf.size == n and bool((view(int(buf.handle), n, buf) == pattern(n, seed)).all())
    result(f"read {buf.size} " + ("exact" if ok else "WRONG"))
    view(int(buf.handle), n, buf)[:] = pattern(n, seed2)
    cupy.cuda.runtime.deviceSynchronize()
    buf.close(stream)
    stream.sync()
    mr.close()
    conn.send("closed")


def pool_export(conn, n, seed):
    import cuda_ipc

    ctx = cuda_ipc.Context(0)
    pool = cuda_ipc.Pool(ctx)
    t = pool.empty((n,), "uint8")
    cupy.asarray(t)[:] = pattern(n, seed)
    cupy.cuda.runtime.deviceSynchronize()
    fd = pool.allocation_handle()
    send_handle(conn, fd, os.getppid())
    os.close(fd)
    conn.send(cuda_ipc.cuda_core.ipc_descriptor(t.ipc_descriptor()))
    conn.recv()  # "hold"
    conn.send("holding")
    time.sleep(120)  # until killed


def main():
    role, address, n, seed, seed2 = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    conn = Client("\0" + address, family="AF_UNIX")
    if role == "export":
        export(conn, n, seed)
    elif role == "import":
        import_(conn, n, seed, seed2)
    elif role == "pool_export":
        pool_export(conn, n, seed)
    else:
        sys.exit(f"unknown role {role}")


main()
