"""Where method (d)'s time goes (``cuda_ipc.shared_weights``): the weight-sync
bench's model and protocol, with CLOCK_MONOTONIC marks in both processes (shared by them) and
CUDA events around the engine's copies; and the floor's copies, one process, with the same
events. The engine waits in ``pull_into`` when the trainer starts. Prints the medians (ms after
the trainer's start) of ``--repeat`` syncs after two untimed ones.

    python3 shared_weights_timeline.py [--repeat 12] [--json out.json]

Marks: the trainer's ``handle_in`` (its ``update`` reads the stream's handle), ``send_in``
(it reaches the channel's send), ``acquired`` (the send's ``fill`` is called: the slot taken,
its GPU wait enqueued), ``filled`` (``fill`` returned), ``published``
(the send returned), ``update_out``; the engine's ``enter`` (into ``pull_into``), ``item``
(its copies begin: the item is in hand), ``launched`` (the copies enqueued), ``pull_out``,
``t1`` (the weights complete); ``gpu_ms``: the engine's copies on the GPU.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weight_sync as bench  # noqa: E402

import cuda_ipc  # noqa: E402
from cuda_ipc import shared_weights as SW  # noqa: E402
from cuda_ipc import weights as W  # noqa: E402


class MarkedSender:
    """The trainer's channel end, marking when its send begins and returns."""

    def __init__(self, real, marks):
        self.real, self.marks = real, marks

    def send(self, fill, **kwargs):
        marks = self.marks

        def marked_fill(slot):
            marks["acquired"] = time.monotonic()
            n = fill(slot)
            marks["filled"] = time.monotonic()
            return n

        marks["send_in"] = time.monotonic()
        seq = self.real.send(marked_fill, **kwargs)
        marks["published"] = time.monotonic()
        return seq

    def __getattr__(self, name):
        return getattr(self.real, name)


def trainer(name, rounds, reports):
    torch.cuda.set_device(0)
    src = bench.model(1600, 400, 1)
    ctx = cuda_ipc.Context(0)
    peer = cuda_ipc.Listener(name).accept(timeout=120)
    tx = SW.SharedWeightSender(ctx, src, peer, timeout=120)
    marks = {}
    tx._tx = MarkedSender(tx._tx, marks)
    real_handle = SW._stream_handle

    def marked_handle(stream):
        marks["handle_in"] = time.monotonic()
        return real_handle(stream)

    SW._stream_handle = marked_handle
    for _ in range(rounds):
        assert peer.recv(timeout=120) == b"go"
        t0 = time.monotonic()
        tx.update()
        marks["update_out"] = time.monotonic()
        reports.put({"t0": t0, **marks})
    tx.close(120)


def floor(rounds):
    src, dst = bench.model(1600, 400, 1), bench.model(1600, 400, 2)
    groups = W._group([(dst[n], t) for n, t in src.items()])
    rows = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.monotonic()
        e0.record()
        W._copy(groups)
        e1.record()
        launched = time.monotonic()
        torch.cuda.synchronize()
        done = time.monotonic()
        rows.append({"launch_ms": (launched - t) * 1e3, "gpu_ms": e0.elapsed_time(e1), "total_ms": (done - t) * 1e3})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=12)
    ap.add_argument("--json")
    args = ap.parse_args()
    rounds = args.repeat + 2
    torch.cuda.set_device(0)
    floor_rows = floor(rounds)
    torch.cuda.empty_cache()
    name = f"cuda-ipc-sw-timeline-{os.getpid()}"
    spawn = mp.get_context("spawn")
    reports = spawn.Queue()
    proc = spawn.Process(target=trainer, args=(name, rounds, reports))
    proc.start()
    dst = bench.model(1600, 400, 2)
    ctx = cuda_ipc.Context(0)
    peer = cuda_ipc.connect(name, timeout=120)  # waits for the trainer's listener
    rx = SW.SharedWeightReceiver(ctx, peer, timeout=120)
    real_copy, marks = SW._copy, {}

    def marked_copy(groups):
        marks["item"] = time.monotonic()
        marks["e0"].record()
        real_copy(groups)
        marks["e1"].record()
        marks["launched"] = time.monotonic()

    SW._copy = marked_copy
    rows = []
    for _ in range(rounds):
        for t in dst.values():
            t.zero_()
        torch.cuda.synchronize()
        marks["e0"], marks["e1"] = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        peer.send(b"go")
        marks["enter"] = time.monotonic()
        rx.pull_into(dst)
        marks["pull_out"] = time.monotonic()
        torch.cuda.synchronize()
        t1 = time.monotonic()
        sent = reports.get(timeout=60)
        at = {**sent, **{k: marks[k] for k in ("enter", "item", "launched", "pull_out")}, "t1": t1}
        rows.append({k: (v - sent["t0"]) * 1e3 for k, v in at.items()} | {"gpu_ms": marks["e0"].elapsed_time(marks["e1"])})
    rx.close(60)
    proc.join(60)

    def medians(rs):
        return {k: statistics.median(r[k] for r in rs[2:]) for k in rs[0]}

    out = {"gpu": torch.cuda.get_device_name(0), "floor": medians(floor_rows), "d": medians(rows)}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**out, "floor_rows": floor_rows, "d_rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
