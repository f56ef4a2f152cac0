"""How long one CUDA driver call takes in a process that was busy, against one that waited a
few milliseconds first (sleeping, or spinning in Python): the stream memory operations the
crate's channel enqueues, an event record, torch's current-stream look-up. Development
measurement behind the channel's publish-before-record order (CHANGELOG); needs a GPU.

    python3 cold_driver_calls.py
"""

import ctypes
import statistics
import time

import torch

torch.cuda.init()
torch.cuda.set_device(0)
lib = ctypes.CDLL("libcuda.so.1")
x = torch.zeros(4, dtype=torch.int64, device="cuda")
torch.cuda.synchronize()
s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
side = torch.cuda.Stream()
ss = ctypes.c_void_p(side.cuda_stream)
addr = ctypes.c_uint64(x.data_ptr())
memop = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
wait = lib.cuStreamWaitValue64_v2
wait.argtypes = memop
write = lib.cuStreamWriteValue64_v2
write.argtypes = memop
ev = ctypes.c_void_p()
lib.cuEventCreate(ctypes.byref(ev), 2)  # CU_EVENT_DISABLE_TIMING
rec = lib.cuEventRecord
rec.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


def cur():
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


calls = {
    "noop": lambda st: None,
    "torch current raw stream": lambda st: cur(),
    "cuStreamWaitValue64 (satisfied)": lambda st: wait(st, addr.value, 0, 0),
    "cuStreamWriteValue64": lambda st: write(st, addr.value, 1, 0),
    "cuEventRecord": lambda st: rec(ev, st),
}


def hot(f, st, n=2000):
    """Mean µs per call, back to back (after 50 untimed)."""
    for _ in range(50):
        f(st)
    t = time.perf_counter()
    for _ in range(n):
        f(st)
    return (time.perf_counter() - t) / n * 1e6


def cold(f, st, n=60, nap=0.003):
    """Median µs of one call made right after sleeping ``nap`` seconds."""
    d = []
    for _ in range(n):
        time.sleep(nap)
        t = time.perf_counter()
        f(st)
        d.append((time.perf_counter() - t) * 1e6)
    return statistics.median(d)


def cold_spin(f, st, n=60, nap=0.003):
    """Median µs of one call made right after spinning ``nap`` seconds in Python."""
    d = []
    for _ in range(n):
        end = time.perf_counter() + nap
        while time.perf_counter() < end:
            pass
        t = time.perf_counter()
        f(st)
        d.append((time.perf_counter() - t) * 1e6)
    return statistics.median(d)


for label, st in (("default stream", s), ("side stream", ss)):
    for name, f in calls.items():
        print(
            f"{label:15s} {name:34s} hot {hot(f, st):7.2f} us   "
            f"after 3 ms sleep {cold(f, st):7.2f} us   after 3 ms spin {cold_spin(f, st):7.2f} us",
            flush=True,
        )
    torch.cuda.synchronize()
