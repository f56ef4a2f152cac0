"""What one GPU charges two processes for sharing it (the context of weight_sync.py's method (c)): the same
device-to-device copies done by one process, then split between two processes that run at the
same time. Two processes on one GPU are time-sliced (no MPS): the GPU runs one context at a
time and switches between them, so the pair's wall time over one process's is the price of the
switching alone — no cross-process protocol, no waiting on each other.

    python3 time_slicing.py [--mib 512] [--copies 16] [--repeat 9] [--json out.json]

Each process copies a ``--mib`` buffer ``--copies`` times (one ``copy_`` each, on its current
stream); "one process" does both halves back to back. Both clocks are CLOCK_MONOTONIC; the pair
starts together at a time set in the future and ends when the later one has synchronized.
"""

import argparse
import json
import statistics
import time

import torch
import torch.multiprocessing as mp


def work(mib, copies):
    src = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    torch.cuda.synchronize()

    def run():
        for _ in range(copies):
            dst.copy_(src)

    return run


def one_process(mib, copies, repeat):
    a, b = work(mib, copies), work(mib, copies)
    a(), b()
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.monotonic()
        a()
        b()
        torch.cuda.synchronize()
        times.append(time.monotonic() - t)
    return statistics.median(times)


def worker(mib, copies, repeat, starts, ends):
    torch.cuda.set_device(0)
    run = work(mib, copies)
    run()
    torch.cuda.synchronize()
    ends.put(("ready", 0.0))
    for _ in range(repeat):
        at = starts.get()
        while time.monotonic() < at:
            pass
        run()
        torch.cuda.synchronize()
        ends.put(("done", time.monotonic()))


def two_processes(mib, copies, repeat):
    ctx = mp.get_context("spawn")
    starts = [ctx.Queue() for _ in range(2)]
    ends = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(mib, copies, repeat, s, ends)) for s in starts]
    for p in procs:
        p.start()
    assert [ends.get(timeout=120)[0] for _ in procs] == ["ready", "ready"]
    times = []
    for _ in range(repeat):
        at = time.monotonic() + 0.05
        for s in starts:
            s.put(at)
        done = [ends.get(timeout=60) for _ in procs]
        times.append(max(t for _, t in done) - at)
    for p in procs:
        p.join(60)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--copies", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.cuda.set_device(0)
    one = one_process(args.mib, args.copies, args.repeat)
    two = two_processes(args.mib, args.copies, args.repeat)
    again = one_process(args.mib, args.copies, args.repeat)
    res = {
        "gpu": torch.cuda.get_device_name(0),
        "mib": args.mib,
        "copies_per_process": args.copies,
        "one_process_ms": [one * 1e3, again * 1e3],
        "two_processes_ms": two * 1e3,
        "ratio": two / min(one, again),
    }
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
