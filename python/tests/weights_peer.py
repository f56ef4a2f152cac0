"""The processes of the weight-sync GPU tests (tests/test_weights_gpu.py):
`python3 weights_peer.py ROLE NAME [key=value ...]`. Prints RESULT lines for the test.

Roles: `trainer` (listens at NAME, sends the channel's handle, then `syncs` syncs of
`model(k)`), `engine` (connects, receives into its own weights and checks every tensor of
every sync exactly), `raw_consumer` (the channel without the weights layer). `pause=N` makes
the trainer stop after sending N buckets, `hold=N` the engine stop inside its N-th bucket's
unpack (each prints `RESULT paused` and waits to be killed). A survivor whose peer died
prints `gone CLASS ROLE MONOTONIC` and, after closing, `fds DELTA`."""

import os
import sys
import time

import cuda_ipc
from cuda_ipc import weights as W


def result(line):
    print(f"RESULT {line}", flush=True)


def fds():
    return len(os.listdir("/proc/self/fd"))


class Pausing:
    """A channel sender that stops (to be killed) before its bucket number `at` + 1."""

    def __init__(self, inner, at):
        self.inner, self.at, self.sent = inner, at, 0

    def send(self, fill, **kw):
        if self.sent == self.at:
            import torch

            torch.cuda.synchronize()
            result("paused")
            time.sleep(600)
        self.sent += 1
        return self.inner.send(fill, **kw)

    def close(self, timeout=30.0):
        self.inner.close(timeout)

    def handle(self):
        return self.inner.handle()


def model(k, size):
    """The weights of sync `k`: mixed dtypes, a tensor larger than a bucket, an empty one,
    long names (headers fill before buckets do). `size`: "small" (the stress) or "mixed"."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(k)
    dev = "cuda"
    if size == "small":
        return {
            "a": torch.randn(300, 100, generator=g, device=dev).to(torch.bfloat16),
            "b": torch.randn(10_000, generator=g, device=dev),
            "c": torch.randint(0, 1 << 30, (777,), generator=g, device=dev),
        }
    long = "model.layers.{}.mlp.experts.{}.down_proj_with_a_long_name.weight"
    sd = {
        "embed": torch.randn(2_500, 512, generator=g, device=dev).to(torch.bfloat16),  # 2.4 MiB
        "f32": torch.randn(1000, 3, generator=g, device=dev),
        "i64": torch.randint(-(2**40), 2**40, (129,), generator=g, device=dev),
        "mask": torch.rand(77, generator=g, device=dev) > 0.5,
        "u8": torch.randint(0, 255, (5, 3), generator=g, device=dev).to(torch.uint8),
        "f16": torch.randn(2, 3, 4, generator=g, device=dev).half(),
        "empty": torch.zeros(0, 4, device=dev),
    }
    for i in range(120):
        sd[long.format(i // 8, i % 8)] = torch.randn(
            64 + i, generator=g, device=dev
        ).to(torch.bfloat16)
    return sd


def main():
    role, name = sys.argv[1], sys.argv[2]
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    import torch

    ctx = cuda_ipc.Context(0)
    size = opts.get("size", "mixed")
    syncs = int(opts.get("syncs", "3"))
    torch.zeros(1, device="cuda")  # torch's own CUDA set-up, before the descriptors are counted
    torch.cuda.synchronize()
    if role == "trainer":
        peer = cuda_ipc.Listener(name).accept(timeout=60)
        fds_before = fds()
        tx = W.WeightSender(
            ctx, bucket_bytes=int(opts.get("bucket", str(1 << 20))), slots=int(opts.get("slots", "2"))
        )
        pause = int(opts.get("pause", "0"))
        if pause:
            tx._tx = Pausing(tx._tx, pause)
        peer.send(tx.handle())
        k = 0
        try:
            while syncs == 0 or k < syncs:
                sd = model(k + 1, size)
                stats = tx.send(sd, timeout=30)
                k += 1
                if k == 1:
                    result(f"buckets {stats.buckets}")
        except cuda_ipc.CudaIpcError as e:
            result(f"gone {type(e).__name__} {e.role} {time.monotonic()}")
            result(f"sent {k}")
            del sd
            try:
                tx.close(5)
            except cuda_ipc.CudaIpcError as e2:
                result(f"close {type(e2).__name__}")
            del tx
            torch.cuda.synchronize()
            result(f"fds {fds() - fds_before}")
            return
        result(f"sent {k}")
        tx.close(60)
        result("closed")
        return
    peer = cuda_ipc.connect(name, timeout=60)  # waits for the trainer to listen
    handle = peer.recv(timeout=60)
    fds_before = fds()
    if role == "raw_consumer":
        raw_consumer(ctx, handle, opts)
        return
    rx = W.WeightReceiver(ctx, handle)
    hold = int(opts.get("hold", "0"))
    if hold:
        copies = [0]
        inner = W._copy

        def holding(groups):
            copies[0] += 1
            if copies[0] == hold:
                torch.cuda.synchronize()
                result("paused")
                time.sleep(600)
            inner(groups)

        W._copy = holding
    target = {n: torch.empty_like(t) for n, t in model(0, size).items()}
    k = 0
    try:
        while syncs == 0 or k < syncs:
            stats = rx.recv_into(target, timeout=30)
            k += 1
            torch.cuda.synchronize()
            want = model(k, size)
            bad = [n for n in want if not torch.equal(want[n], target[n])]
            if bad or stats.tensors != len(want):
                result(f"sync {k} wrong: {bad[:3]} {stats}")
                return
            if size != "small":
                result(f"sync {k} ok {stats.buckets} buckets")
    except cuda_ipc.ChannelClosed:
        result(f"closed after {k}")
        rx.close(30)
        return
    except cuda_ipc.CudaIpcError as e:
        result(f"gone {type(e).__name__} {e.role} {time.monotonic()}")
        result(f"received {k}")
        try:
            rx.close(5)
        except cuda_ipc.CudaIpcError as e2:
            result(f"close {type(e2).__name__}")
        del rx
        torch.cuda.synchronize()
        result(f"fds {fds() - fds_before}")
        return
    # Every sync received: the producer's close ends the channel.
    try:
        rx.receiver.recv(lambda item, header: None, timeout=60)
        result("an item after the last sync")
    except cuda_ipc.ChannelClosed as e:
        result(f"closed pid={e.pid == rx.receiver.producer_pid} role={e.role}")
    rx.close(30)


def raw_consumer(ctx, handle, opts):
    """Items 1..n: item k is k bytes of value k with header b"item k"; check each exactly,
    then ChannelClosed; misuse refused."""
    import torch

    rx = cuda_ipc.Receiver(ctx, handle)
    result(f"slots {rx.slots} bytes {rx.slot_bytes}")
    stream = torch.cuda.Stream()
    n = int(opts["n"])
    kept = []
    for k in range(1, n + 1):

        def use(item, header, k=k):
            t = torch.from_dlpack(item)
            with torch.cuda.stream(stream):
                ok = t.numel() == k and bool((t == k % 256).all())
            if k == 2:
                kept.append(item)  # a slot's tensor kept past its release
            return ok, header

        ok, header = rx.recv(use, stream=stream, timeout=30)
        if not ok or header != f"item {k}".encode():
            result(f"item {k} wrong {header!r}")
            return
    # A failing `use` still releases (the producer's last items need the slots).
    try:
        rx.recv(lambda item, header: 1 / 0, stream=stream, timeout=30)
    except ZeroDivisionError:
        result("use raised, released")
    try:
        rx.recv(lambda item, header: None, timeout=30)
        result("an item after the last")
    except cuda_ipc.ChannelClosed:
        result("closed")
    try:
        rx.close()
        result("closed with a slot tensor alive")
    except RuntimeError as e:
        result(f"close refused: {'tensor' in str(e)}")
    kept.clear()
    rx.close()
    result("receiver closed")


if __name__ == "__main__":
    main()
