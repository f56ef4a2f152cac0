"""The other process of the GPU tests (tests/test_gpu.py): `python3 peer.py ROLE NAME [ARGS]`.
Prints RESULT lines for the test to check."""

import gc
import sys

import cuda_ipc


def result(line):
    print(f"RESULT {line}", flush=True)


def main():
    role, name = sys.argv[1], sys.argv[2]
    import torch

    ctx = cuda_ipc.Context(0)
    owner = cuda_ipc.connect(name, timeout=30)
    if role == "producer":
        # A channel's producer: its handle, then (once the test opened it) one item of
        # 0..2^20 as int32, then (once the test closed its end) close.
        tx = cuda_ipc.Sender(ctx, 4 << 20, slots=2)
        owner.send(tx.handle())
        assert owner.recv(timeout=60) == b"opened"
        want = torch.arange(1 << 20, dtype=torch.int32, device="cuda")

        def fill(slot):
            torch.from_dlpack(slot).view(torch.int32).copy_(want)
            return 4 << 20

        tx.send(fill, timeout=30)
        assert owner.recv(timeout=60) == b"done"
        tx.close(30)
        result("closed")
        return
    if role == "owner":
        # The owner, in this process: an arena with one tensor, sent; then wait to be killed.
        arena = cuda_ipc.Arena(ctx, 8 << 20, read_only_for_importers=True)
        w = arena.empty((1 << 20,), torch.int32)
        torch.from_dlpack(w).copy_(torch.arange(1 << 20, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        owner.send_arena(arena)
        owner.send(w.handle())
        result("sent")
        owner.recv(timeout=600)  # until killed
        return
    if role == "holder":
        # A reader that opens the tensor, says so, and waits to be killed holding it.
        arena = owner.recv_arena(ctx, read_only=True)
        t = arena.open(owner.recv())
        owner.send(b"opened")
        owner.recv(timeout=600)
        del t
        return
    if role == "rw_of_ro":
        try:
            owner.recv_arena(ctx, read_only=False)
            result("opened")
        except cuda_ipc.HandleTypeMismatch as e:
            result(f"refused: {e}")
        return
    read_only = role in ("reader", "scribbler", "forged", "keepalive", "stale")
    arena = owner.recv_arena(ctx, read_only=read_only)
    result(f"arena read_only={arena.read_only} exporter={arena.exporter_pid}")
    handle = owner.recv()
    if role == "forged":
        for what, bad in [
            ("flipped", handle[:20] + bytes([handle[20] ^ 1]) + handle[21:]),
            ("short", handle[:-1]),
            ("shape", handle[:-8] + (2**40).to_bytes(8, "little")),
            ("dtype", handle[:81] + bytes([200]) + handle[82:]),
        ]:
            try:
                arena.open(bad)
                result(f"{what}: opened")
            except cuda_ipc.CorruptHandle:
                result(f"{what}: corrupt")
        return
    if role == "stale":
        assert owner.recv() == b"freed"
        try:
            arena.open(handle)
            result("opened")
        except cuda_ipc.StaleHandle:
            result("stale")
        return
    t = arena.open(handle)
    view = torch.from_dlpack(t)
    result(f"tensor {tuple(view.shape)} {view.dtype} read_only={t.read_only}")
    if role == "keepalive":
        del t, arena
        gc.collect()
        torch.cuda.synchronize()
    if role in ("reader", "keepalive"):
        result(f"sum {int(view.to(torch.int64).sum())}")
        try:
            import cupy

            result(f"cupy sum {int(cupy.asarray(arena.open(handle) if role == 'reader' else view).sum())}")
        except ImportError:
            result("cupy absent")
    elif role == "writer":
        view.add_(1)
        torch.cuda.synchronize()
        result("wrote")
    elif role == "scribbler":
        try:
            view.fill_(0)
            torch.cuda.synchronize()
            result("wrote")
        except RuntimeError as e:
            result(f"fault {'illegal memory access' in str(e) or 'illegal address' in str(e)}")
    owner.send(b"done")


if __name__ == "__main__":
    main()
