"""The two processes of test_shared_weights_gpu.py. `trainer NAME SYNCS DIE_AFTER [SIZE]` shares a
mixed model with cuda_ipc.shared_weights and publishes SYNCS versions (each adds its number to
the floating tensors), SIGKILLing itself right after version DIE_AFTER when that is not 0 (with
SW_DIE_BEFORE_VERDICT set: after publishing it, before sending its verdict);
`engine NAME SYNCS DIE_AFTER` pulls each and checks it bit for bit, SIGKILLing itself right
after enqueueing pull DIE_AFTER. SYNCS 0: versions until killed (the random-kill stress). SIZE
`small` (the stress): a model of a few tensors, and only failures and the count are printed
(`checked N` once SYNCS versions were checked). With SW_STREAMS set, both sides pass a side
stream, `stream=` on odd versions and as torch's current stream (`with torch.cuda.stream`) on
even ones, and from version 2 on (the first loads the kernels: a first launch may wait for the
device) keep their default stream busy with a ~0.5 s kernel before each version: a step or a
copy that went to the default stream instead would run after the version's hand-off (the engine
reads old bytes) or not be done when the side stream is. Both print RESULT lines: `ok K`,
`wrong K NAMES`, `gone CLASS ROLE MONOTONIC`, `killing MONOTONIC`, `done`."""

import os
import signal
import sys
import time

import torch

import cuda_ipc
from cuda_ipc.shared_weights import SharedWeightReceiver, SharedWeightSender

T = 60.0
#: SM cycles of the kernel that keeps a default stream busy (~0.5 s on an H200).
BUSY = 1_000_000_000
STREAMS = bool(os.environ.get("SW_STREAMS"))


def result(line):
    print("RESULT " + line, flush=True)


def model(size="mixed"):
    g = torch.Generator(device="cuda").manual_seed(11)
    if size == "small":
        return {
            "a": torch.randn(300, 100, generator=g, device="cuda").to(torch.bfloat16),
            "b": torch.randn(10_000, generator=g, device="cuda"),
            "c": torch.randint(0, 1 << 30, (777,), generator=g, device="cuda"),
            "empty": torch.zeros(0, 4, device="cuda"),
        }
    sd = {
        "emb": torch.randn(5000, 512, generator=g, device="cuda").to(torch.bfloat16),
        "w": torch.randn(3 << 20, generator=g, device="cuda"),
        "half": torch.randn(777, 3, generator=g, device="cuda").half(),
        "steps": torch.arange(129, device="cuda", dtype=torch.int64),
        "mask": torch.rand(77, generator=g, device="cuda") > 0.5,
        "empty": torch.zeros(0, 4, device="cuda"),
    }
    for i in range(200):
        sd[f"layers.{i}.bias"] = torch.full((i + 1,), float(i), device="cuda")
    return sd


def step(sd, k):
    with torch.no_grad():
        for t in sd.values():
            if t.is_floating_point() or t.dtype == torch.int64:
                t.add_(k)


def on_side(k, side, call):
    """``call`` on the side stream: passed as ``stream=`` on odd versions, made torch's current
    stream on even ones."""
    if k % 2:
        return call(stream=side)
    with torch.cuda.stream(side):
        return call()


def die():
    result(f"killing {time.monotonic()}")
    os.kill(os.getpid(), signal.SIGKILL)


def versions(syncs):
    """1, 2, ... SYNCS; with SYNCS 0, without end."""
    k = 0
    while syncs == 0 or k < syncs:
        k += 1
        yield k


def trainer(name, syncs, die_after, size):
    ctx = cuda_ipc.Context(0)
    sd = model(size)
    torch.cuda.synchronize()
    listener = cuda_ipc.Listener(name)
    result("listening")
    peer = listener.accept(T)
    tx = SharedWeightSender(ctx, sd, peer)
    check = tx._moved
    side = torch.cuda.Stream()
    try:
        for k in versions(syncs):
            if k == die_after and os.environ.get("SW_DIE_BEFORE_VERDICT"):
                # Published, its verdict not yet sent: die where the check would run.
                tx._moved = lambda state_dict: (torch.cuda.synchronize(), die())
            else:
                tx._moved = check
            if STREAMS:
                if k > 1:  # (version 1 loads the kernels: a first launch may wait for the device)
                    torch.cuda._sleep(BUSY)  # on the default stream: a step there would be late
                on_side(k, side, lambda **s: tx.update(lambda: step(sd, k), timeout=T, **s))
            else:
                tx.update(lambda: step(sd, k), timeout=T)
            if k == die_after:
                torch.cuda.synchronize()
                die()
    except cuda_ipc.CudaIpcError as e:
        result(f"gone {type(e).__name__} {getattr(e, 'role', None)} {time.monotonic()}")
        return
    tx.close(T)
    result("done")


def engine(name, syncs, die_after, size):
    ctx = cuda_ipc.Context(0)
    rx = SharedWeightReceiver(ctx, cuda_ipc.connect(name, T), timeout=T)
    target = {n: torch.zeros_like(t) for n, t in model(size).items()}
    want = model(size)
    side = torch.cuda.Stream()
    quiet = size == "small"
    try:
        for k in versions(syncs):
            bad = []
            if STREAMS:
                if k > 1:  # (version 1 loads the kernels: a first launch may wait for the device)
                    torch.cuda._sleep(BUSY)  # on the default stream: copies there would be late
                stats = on_side(k, side, lambda **s: rx.pull_into(target, timeout=T, **s))
                side.synchronize()
                if k > 1 and torch.cuda.default_stream().query():
                    bad.append("default stream idle: the check proves nothing")
                # What the side stream's copies wrote, taken while the default stream is busy.
                with torch.cuda.stream(side):
                    snapshot = {n: t.clone() for n, t in target.items()}
                side.synchronize()
            else:
                stats = rx.pull_into(target, timeout=T)
                snapshot = target
            if k == die_after:
                die()  # copies in flight
            torch.cuda.synchronize()
            step(want, k)
            bad += [n for n in want if not torch.equal(want[n], snapshot[n])]
            if bad or stats.sync != k:
                result(f"wrong {k} {bad[:3]}")
            elif not quiet:
                result(f"ok {k}")
    except cuda_ipc.CudaIpcError as e:
        result(f"gone {type(e).__name__} {getattr(e, 'role', None)} {time.monotonic()}")
        # The context survives: new work runs and completes.
        x = torch.ones(1000, device="cuda").sum().item()
        result(f"context {'ok' if x == 1000 else 'broken'}")
        return
    if quiet:
        result(f"checked {syncs}")
    rx.close(T)
    result("done")


if __name__ == "__main__":
    role, name, syncs, die_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    size = sys.argv[5] if len(sys.argv) > 5 else "mixed"
    {"trainer": trainer, "engine": engine}[role](name, syncs, die_after, size)
