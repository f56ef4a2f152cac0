"""The two processes of test_foreign_gpu.py: `export NAME DIES` allocates tensors with PyTorch's
own allocator (the caller sets PYTORCH_CUDA_ALLOC_CONF) and sends them with
`Socket.send_tensor`, then PyTorch's own handle of one of them; `import NAME` receives and
checks every byte, writes one tensor, and tries PyTorch's own path. Each prints one RESULT
line of JSON."""

import hashlib
import json
import os
import pickle
import signal
import sys
import time

import torch

import cuda_ipc

T = 60.0


def digest(t):
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def tensors():
    g = torch.Generator(device="cuda").manual_seed(7)
    big = torch.randn(40 << 20, generator=g, device="cuda").to(torch.bfloat16)  # 80 MiB
    view = big[12345:]  # contiguous, starting inside a chunk
    small = torch.arange(1000, device="cuda", dtype=torch.float32).reshape(10, 100)
    ints = torch.arange(5000, device="cuda", dtype=torch.int64)
    return big, [view, small, ints]


def export(name, dies):
    ctx = cuda_ipc.Context(0)
    big, shared = tensors()
    torch.cuda.synchronize()
    listener = cuda_ipc.Listener(name)
    print("READY", flush=True)
    sock = listener.accept(T)
    chunks = []
    for t in shared:
        n = sock.send_tensor(ctx, t)
        chunks.append(n)
        sock.send(json.dumps({"digest": digest(t), "chunks": n}).encode())
    try:
        theirs = pickle.dumps(torch.multiprocessing.reductions.reduce_tensor(shared[1]))
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        theirs = pickle.dumps(("unavailable", repr(e)))
    sock.send(theirs)
    print("RESULT " + json.dumps({"chunks": chunks}), flush=True)
    if dies == "dies":
        os.kill(os.getpid(), signal.SIGKILL)
    done = sock.recv(T)
    after = torch.equal(shared[2], torch.arange(5000, device="cuda", dtype=torch.int64) + 1)
    print("RESULT " + json.dumps({"done": done.decode(), "importer_write_seen": after}), flush=True)
    del big


def gone(pid):
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def import_(name, exporter_dies):
    ctx = cuda_ipc.Context(0)
    sock = cuda_ipc.connect(name, T)
    got, keep = [], []
    for _ in range(3):
        t = sock.recv_tensor(ctx, T)
        info = json.loads(sock.recv(T))
        tt = torch.from_dlpack(t)
        keep.append((tt, info))
        got.append({"dtype": str(tt.dtype), "shape": list(tt.shape), "chunks": info["chunks"]})
    theirs = pickle.loads(sock.recv(T))
    if exporter_dies == "dies":
        pid = sock.peer_pid
        deadline = time.monotonic() + 20
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # A dead exporter's descriptors were in our hands: the mapping keeps its memory.
        torch.cuda.synchronize()
    for entry, (tt, info) in zip(got, keep):
        entry["exact"] = digest(tt) == info["digest"]
    torch_path = "not tried"
    if exporter_dies != "dies":
        keep[2][0].add_(1)
        torch.cuda.synchronize()
        try:
            if theirs[0] == "unavailable":
                torch_path = "unavailable in the exporter: " + theirs[1]
            else:
                fn, args = theirs
                r = fn(*args)
                ok = torch.equal(r, torch.arange(1000, device="cuda", dtype=torch.float32).reshape(10, 100))
                torch_path = "ok" if ok else "wrong data"
        except Exception as e:  # noqa: BLE001 - the outcome is the result
            torch_path = "failed: " + type(e).__name__ + ": " + str(e)[:300]
    print(
        "RESULT " + json.dumps({"tensors": got, "pid": os.getpid(), "torch_path": torch_path}),
        flush=True,
    )
    if exporter_dies != "dies":
        print("RESULT " + json.dumps({"queued_drop": drop_with_work_queued(keep)}), flush=True)
        sock.send(b"done", T)


def drop_with_work_queued(keep):
    """Drop the last reference to the imported bf16 tensor while a copy of it waits behind a
    ~150 ms kernel on another stream: the mapping must outlive the copy (the copy exact, no
    fault), its release must wait for it, and then happen."""
    tt, info = keep.pop(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(300_000_000)
        copy = tt.clone()
    del tt  # the last reference: its memory is unmapped once the GPU is done with it
    waited = not cuda_ipc.wait_released(0.02)
    side.synchronize()
    torch.cuda.synchronize()
    return {
        "waited": waited,
        "exact": digest(copy) == info["digest"],
        "released": cuda_ipc.wait_released(30),
        "leaked": cuda_ipc.leaked_releases(),
    }


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "export":
        export(*args)
    elif role == "import":
        import_(*args)
    else:
        sys.exit(f"unknown role {role}")
