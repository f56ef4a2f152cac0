#!/usr/bin/env python3
"""torch.multiprocessing sharing the tensors of examples/shared_weights.rs with R readers.

The same shapes (N tensors of a transformer, G GiB in all, each with one extra word), made by
an owner process and put on each reader's queue as one list: PyTorch pickles each CUDA tensor
as an IPC handle of its allocator segment plus an offset, and the reader's unpickling opens
each segment it has not seen (cudaIpcOpenMemHandle). Measured as examples/shared_weights.rs
measures: every reader ready first; then the time from serving the first reader to the last
having every tensor, the device memory the imports added (torch.cuda.mem_get_info), and per
reader the time from being served to having every tensor and to read them all (a sum each,
checked against the owner's).

    python3 examples/interop/torch_shared_weights.py [--tensors 2000] [--gib 8] [--readers 1]

Exit 0 when every reader read every tensor right, 2 without torch or a GPU, 1 on failure.
"""

import argparse
import sys
import time


def tensor_words(n, gib):
    """examples/shared_weights.rs's tensor_words, word for word."""
    layer = [1.0, 0.25, 0.25, 1.0, 3.0, 3.0, 3.0, 0.0, 0.0]
    norm = 1280
    layers = (n - 2) // len(layer)
    norms = n - 2 - layers * 7
    units = 2.0 * 4.0 + layers * sum(layer)
    total_words = gib * float(1 << 30) / 4.0
    unit = max((total_words - norms * norm) / units, 1.0)
    words = [int(4.0 * unit)] * 2
    for _ in range(layers):
        for share in layer:
            words.append(norm if share == 0.0 else int(share * unit))
    words += [norm] * (n - len(words))
    return words[:n]


def reader(k, inbox, outbox):
    import torch

    torch.zeros(1, device="cuda")  # the context, before the clock
    torch.cuda.synchronize()
    outbox.put(("ready", k))
    assert inbox.get() == "go"
    t = time.perf_counter()
    tensors, sums = inbox.get()
    opened = time.perf_counter() - t
    outbox.put(("opened", k))
    assert inbox.get() == "read"
    t = time.perf_counter()
    got = torch.stack([x[:-1].sum(dtype=torch.int64) for x in tensors])
    torch.cuda.synchronize()
    read = time.perf_counter() - t
    wrong = int((got.cpu() != torch.tensor(sums, dtype=torch.int64)).sum())
    outbox.put(("report", k, opened * 1e3, read * 1e3, wrong))
    inbox.get()  # "bye": keep the tensors open until the owner has every report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--readers", type=int, default=1)
    o = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"torch_shared_weights: waived: no torch ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_shared_weights: waived: no CUDA device", file=sys.stderr)
        return 2
    words = tensor_words(o.tensors, o.gib)
    t = time.perf_counter()
    tensors = []
    for i, w in enumerate(words):
        x = torch.empty(w + 1, dtype=torch.int32, device="cuda")
        x.fill_(i % 1000)
        tensors.append(x)
    torch.cuda.synchronize()
    sums = [(i % 1000) * w for i, w in enumerate(words)]
    total = sum((w + 1) * 4 for w in words)
    print(
        f"torch_shared_weights: {o.tensors} tensors, {total / (1 << 30):.2f} GiB, "
        f"filled in {(time.perf_counter() - t) * 1e3:.0f} ms"
    )
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(o.readers)]
    procs = [ctx.Process(target=reader, args=(k, inboxes[k], outbox)) for k in range(o.readers)]
    for p in procs:
        p.start()
    ready = 0
    while ready < o.readers:
        assert outbox.get(timeout=300)[0] == "ready"
        ready += 1
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    t = time.perf_counter()
    for q in inboxes:
        q.put("go")
        q.put((tensors, sums))
    opened = 0
    while opened < o.readers:
        assert outbox.get(timeout=300)[0] == "opened"
        opened += 1
    all_open = (time.perf_counter() - t) * 1e3
    after = torch.cuda.mem_get_info()[0]
    for q in inboxes:
        q.put("read")
    reports = {}
    while len(reports) < o.readers:
        _, k, took, read, wrong = outbox.get(timeout=300)
        reports[k] = (took, read, wrong)
        print(
            f"  reader {k}: every tensor open {took:.2f} ms after being served, read in "
            f"{read:.1f} ms, {wrong} wrong tensor(s)"
        )
    for q in inboxes:
        q.put("bye")
    bad = False
    for p in procs:
        p.join(timeout=120)
        bad |= p.exitcode != 0
    opens = [r[0] for r in reports.values()]
    ok = not bad and all(r[2] == 0 for r in reports.values())
    print(
        f"torch_shared_weights: {o.readers} reader(s), torch.multiprocessing: every reader had "
        f"every tensor open {all_open:.2f} ms after the first was served (each reader, from being "
        f"served: {min(opens):.2f} to {max(opens):.2f} ms); device memory the {o.readers} "
        f"import(s) added: {(before - after) / float(1 << 20):.0f} MiB; every tensor checked: "
        f"{'all right' if ok else 'ERRORS'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
