"""Weight sync between two processes on one GPU, six ways, in one run:

(a) ``torch.multiprocessing`` Queue, one tensor per message, the engine copying each into its
    own weights;
(b) flattened buckets, one CUDA IPC handle per bucket (``torch.multiprocessing`` reductions),
    a synchronize and an ack per bucket (the fastest published method);
(c) this package: ``cuda_ipc.weights`` over the crate's GPU channel, the ring opened once;
(d) this package: ``cuda_ipc.shared_weights``, the trainer's tensors shared once
    (``Socket.send_tensor``) and each version copied straight out of them by the engine (one
    copy per byte, all in the engine's context), a channel item per version;
(e) (d)'s sync on PyTorch's own primitives, without this package: the trainer's tensors shared
    once through ``torch.multiprocessing`` (CUDA IPC handles), each version an interprocess
    event the engine's stream waits on and a message over a pipe, the same multi-tensor copies,
    and an interprocess event back that the trainer's next version waits on (what (d)'s
    channel item and release do) — the same work as (d) on raw primitives;
(f) the least a sync between two processes on one GPU can cost, no package and no protocol
    beyond one message each way: the engine's tensors shared once with the trainer
    (``torch.multiprocessing``), and each version the floor's very copies done by the trainer,
    in its own context, straight into the engine's tensors (after a GPU wait for the engine's
    interprocess event saying it is done with them), an interprocess event recorded after
    them and a pipe message; the engine waits for that event on the host. What (f) spends
    beyond the floor is what one time-sliced GPU charges for a second process — (d)'s time
    beyond (f)'s is its protocol's own.

Each is timed end to end: from the trainer's first call to the engine's weights complete on
the GPU (both clocks are CLOCK_MONOTONIC, which processes share); (c)'s to (f)'s trainers
report their start after the sync (for (f): once its copies are enqueued), (a)'s and (b)'s in
the queue's first message (their engines need its count), and every engine waits for the
trainer's first message when the sync starts. Each has its floor: the same copies, done in one
process with no second process (for (c): the same multi-tensor pack and unpack of the same
buckets; for (b): the same flatten and per-tensor unpack; for (a): one copy per tensor; for
(d), (e) and (f): the same multi-tensor copies, trainer's tensors to engine's). Per-bucket
overhead = (end to end - floor) / buckets. (d) also times its floor's copies out of the
trainer's memory once its syncs are done, the trainer alive and idle: the share of (d)'s time
beyond the floor that one GPU charges for a second process holding a context. Every run's
weights are checked word for word on the engine.

    python3 weight_sync.py [--big 1600] [--small 400] [--repeat 9] [--methods abcdef] [--json out.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

BIG = 5 << 20  # bytes of bf16: 1600 of these ...
SMALL = 10 << 10  # ... and 400 of these: 7.82 GiB
BUCKET = 512 << 20
#: Untimed runs first: (c)'s views of each (bucket, slot) pair are made once, in the first
#: `slots` syncs (each sync's buckets start one slot further round the ring of 4), then
#: reused; the first run's time is reported on its own.
WARM = 5
#: (c)'s bucket and ring (--bucket, --slots); (b) keeps 512 MiB.
BUCKET_C, SLOTS_C = BUCKET, 4


def model(big, small, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    sd = {}
    for i in range(big + small):
        n = (BIG if i < big else SMALL) // 2
        layer = i // 10
        sd[f"model.layers.{layer}.w{i % 10}"] = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    # Distinct contents per seed, cheaply: one random value per tensor plus a ramp.
    vals = torch.rand(len(sd), generator=g, device="cuda")
    ramp = torch.arange(BIG // 2, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    for j, t in enumerate(sd.values()):
        t.copy_(ramp[: t.numel()]).add_(vals[j].to(torch.bfloat16))
    torch.cuda.synchronize()
    return sd


def checksum(sd):
    """One float64 per tensor, summed with weights by position (order and contents count)."""
    flat = torch.stack([t.float().sum(dtype=torch.float64) for t in sd.values()])
    w = torch.arange(1, len(flat) + 1, device=flat.device, dtype=torch.float64)
    torch.cuda.synchronize()
    return float((flat * w).sum())


def buckets_b(sd):
    """(b)'s buckets: consecutive tensors up to 512 MiB each."""
    out, cur, size = [], [], 0
    for n, t in sd.items():
        nb = t.numel() * t.element_size()
        if cur and size + nb > BUCKET:
            out.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += nb
    if cur:
        out.append(cur)
    return out


def sync_time(fn):
    torch.cuda.synchronize()
    t = time.monotonic()
    fn()
    torch.cuda.synchronize()
    return time.monotonic() - t


# ---- floors (one process) ----


def floors(src, dst, repeat):
    from cuda_ipc import weights as W

    # (a): every tensor copied once.
    def once():
        for n, t in src.items():
            dst[n].copy_(t)

    # (b): flatten each bucket (torch.cat), unflatten and copy per tensor.
    plan_b = buckets_b(src)

    def flat():
        for names in plan_b:
            bucket = torch.cat([src[n].view(-1) for n in names])
            off = 0
            for n in names:
                k = src[n].numel()
                dst[n].view(-1).copy_(bucket[off : off + k])
                off += k

    # (c): the same buckets and multi-tensor copies cuda_ipc.weights makes, into one of four
    # slot buffers in turn, then out of it.
    plan_c = W.plan_buckets(src.items(), BUCKET_C)
    slots = [torch.empty(BUCKET_C, dtype=torch.uint8, device="cuda") for _ in range(SLOTS_C)]
    groups = []
    for i, b in enumerate(plan_c):
        buf = slots[i % SLOTS_C]
        pack, unpack = [], []
        for c in b.chunks:
            word = W._word(c.nbytes, c.offset, c.start)
            s = W._bytes_of(src[c.name])[c.start : c.start + c.nbytes].view(word)
            d = W._bytes_of(dst[c.name])[c.start : c.start + c.nbytes].view(word)
            v = buf[c.offset : c.offset + c.nbytes].view(word)
            pack.append((v, s))
            unpack.append((d, v))
        groups.append((W._group(pack), W._group(unpack)))

    def multi():
        for pack, unpack in groups:
            W._copy(pack)
            W._copy(unpack)

    # (d): one multi-tensor copy per dtype, every tensor from the source into the destination.
    direct_groups = W._group([(dst[n], t) for n, t in src.items()])

    def direct():
        W._copy(direct_groups)

    out = {}
    for name, fn in (("once", once), ("flat", flat), ("multi", multi), ("direct", direct)):
        fn()
        out[name] = statistics.median(sync_time(fn) for _ in range(repeat))
    del slots, groups, direct_groups
    return out, len(plan_b), len(plan_c)


# ---- the trainer, in its own process ----


def trainer(method, big, small, repeat, ctl, data, name, geometry, pipe):
    global BUCKET_C, SLOTS_C
    BUCKET_C, SLOTS_C = geometry
    torch.cuda.set_device(0)
    src = model(big, small, 1)
    if method == "c":
        import cuda_ipc
        from cuda_ipc import weights as W

        ctx = cuda_ipc.Context(0)
        tx = W.WeightSender(ctx, bucket_bytes=BUCKET_C, slots=SLOTS_C)
        peer = cuda_ipc.Listener(name).accept(timeout=120)
        peer.send(tx.handle())
    elif method == "d":
        import cuda_ipc
        from cuda_ipc.shared_weights import SharedWeightSender

        ctx = cuda_ipc.Context(0)
        peer = cuda_ipc.Listener(name).accept(timeout=120)
        tx = SharedWeightSender(ctx, src, peer, timeout=120)
    elif method == "e":
        version = torch.cuda.Event(interprocess=True)
        data.put((src, bytes(version.ipc_handle())))  # the tensors' CUDA IPC handles, once
        released = torch.cuda.Event.from_ipc_handle(0, pipe.recv_bytes())
    elif method == "f":
        from cuda_ipc import weights as W  # its dtype grouping and `_foreach_copy_` only

        targets = ctl.get()  # the engine's tensors (CUDA IPC handles), once
        free = torch.cuda.Event.from_ipc_handle(0, pipe.recv_bytes())
        done = torch.cuda.Event(interprocess=True)
        pipe.send_bytes(bytes(done.ipc_handle()))
        groups = W._group([(targets[n], t) for n, t in src.items()])
    ctl.put(("ready", checksum(src)))
    for r in range(repeat + WARM):
        if method in "cd":
            assert peer.recv(timeout=120) == b"go"
        elif method in "ef":
            assert pipe.recv_bytes() == b"go"
        else:
            assert ctl.get() == "go"
        t0 = time.monotonic()
        if method == "a":
            data.put(("start", t0, len(src)))
            for n, t in src.items():
                data.put((n, t))
            assert ctl.get() == "done"
        elif method == "b":
            plan = buckets_b(src)
            data.put(("start", t0, len(plan)))
            for names in plan:
                bucket = torch.cat([src[n].view(-1) for n in names])
                torch.cuda.synchronize()
                data.put((names, bucket))
                assert ctl.get() == "ack"
                del bucket
        elif method == "c":
            tx.send(src)
            peer.send(repr(t0).encode())  # after the sync: the report is not timed
        elif method == "d":
            tx.update()  # the weights as they are: no step (the bench times the sync alone)
            peer.send(repr(t0).encode())
        elif method == "e":
            stream = torch.cuda.current_stream()
            if r:
                stream.wait_event(released)  # the engine's copies of the last version done
            version.record(stream)
            pipe.send_bytes(b"v")
            pipe.send_bytes(repr(t0).encode())
        else:
            stream = torch.cuda.current_stream()
            stream.wait_event(free)  # the engine is done with its weights
            W._copy(groups)
            done.record(stream)
            pipe.send_bytes(repr(t0).encode())
    if method in "cd":
        tx.close(120)
    if method == "e":
        assert pipe.recv_bytes() == b"closed"  # the engine let go of the tensors
    if method == "f":
        assert pipe.recv_bytes() == b"done"  # the engine's last check read its weights
        del groups, targets
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        pipe.send_bytes(b"closed")  # this process let go of the engine's tensors
    ctl.put("exit")


def engine(method, big, small, repeat, name):
    ctx_mp = mp.get_context("spawn")
    ctl, data = ctx_mp.Queue(), ctx_mp.Queue()
    # The engine's own queue back to the trainer for (a)/(b) acks; (e)'s pipe.
    back = ctx_mp.Queue()
    pipe, trainer_pipe = ctx_mp.Pipe()
    proc = ctx_mp.Process(
        target=trainer_entry,
        args=(method, big, small, repeat, back, data, name, ctl, (BUCKET_C, SLOTS_C), trainer_pipe),
    )
    proc.start()
    dst = model(big, small, 2)
    if method in "cd":
        import cuda_ipc
        from cuda_ipc import weights as W
        from cuda_ipc.shared_weights import SharedWeightReceiver

        ctx = cuda_ipc.Context(0)
        peer = cuda_ipc.connect(name, timeout=120)  # waits for the trainer's listener
        if method == "c":
            rx = W.WeightReceiver(ctx, peer.recv(timeout=120))
        else:
            rx = SharedWeightReceiver(ctx, peer, timeout=120)
    elif method == "e":
        from cuda_ipc import weights as W

        sources, handle = data.get(timeout=300)
        version = torch.cuda.Event.from_ipc_handle(0, handle)
        released = torch.cuda.Event(interprocess=True)
        pipe.send_bytes(bytes(released.ipc_handle()))
        groups = W._group([(dst[n], sources[n]) for n in dst])
    elif method == "f":
        back.put(dst)  # the engine's own tensors, to the trainer, once
        free = torch.cuda.Event(interprocess=True)
        pipe.send_bytes(bytes(free.ipc_handle()))
        done = torch.cuda.Event.from_ipc_handle(0, pipe.recv_bytes())
    tag, want = ctl.get(timeout=300)
    assert tag == "ready"
    times, cold = [], None
    for r in range(repeat + WARM):
        for t in dst.values():
            t.zero_()
        if method == "f":
            free.record()  # what the trainer's copies wait for on the GPU
        torch.cuda.synchronize()
        if method in "cd":
            peer.send(b"go")
            stats = rx.recv_into(dst) if method == "c" else rx.pull_into(dst)
            torch.cuda.synchronize()
            t1 = time.monotonic()
            t0 = float(peer.recv(timeout=120))
            buckets = stats.buckets
        elif method == "e":
            pipe.send_bytes(b"go")
            assert pipe.recv_bytes() == b"v"
            stream = torch.cuda.current_stream()
            stream.wait_event(version)
            W._copy(groups)
            released.record(stream)
            torch.cuda.synchronize()
            t1 = time.monotonic()
            t0 = float(pipe.recv_bytes())
            buckets = 1
        elif method == "f":
            pipe.send_bytes(b"go")
            t0 = float(pipe.recv_bytes())  # sent once the trainer's copies are enqueued
            done.synchronize()  # the host waits: the engine's context stays idle
            t1 = time.monotonic()
            buckets = 1
        else:
            back.put("go")
            tag, t0, count = data.get(timeout=300)
            assert tag == "start"
            if method == "a":
                for _ in range(count):
                    n, t = data.get(timeout=300)
                    dst[n].copy_(t)
                    del t
                torch.cuda.synchronize()
                t1 = time.monotonic()
                back.put("done")
                buckets = count
            else:
                for _ in range(count):
                    names, bucket = data.get(timeout=300)
                    off = 0
                    for n in names:
                        k = dst[n].numel()
                        dst[n].view(-1).copy_(bucket[off : off + k])
                        off += k
                    torch.cuda.synchronize()
                    del bucket
                    back.put("ack")
                t1 = time.monotonic()
                buckets = count
        got = checksum(dst)
        assert got == want, f"({method}) run {r}: checksum {got} != {want}"
        if r == 0:
            cold = t1 - t0
        if r >= WARM:
            times.append(t1 - t0)
    peer_idle = None
    if method == "d":
        # The floor's copies again, out of the trainer's memory, with the trainer alive and
        # idle (waiting in its close): what one GPU charges for a second process that merely
        # holds a context, measured apart from the protocol.
        groups = W._group([(dst[n], rx._sources[n]) for n in dst])
        W._copy(groups)
        peer_idle = statistics.median(sync_time(lambda: W._copy(groups)) for _ in range(repeat))
        del groups
    if method in "cd":
        rx.close(60)  # the trainer's close waits for it
    if method == "e":
        del groups, sources
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        pipe.send_bytes(b"closed")
    if method == "f":
        pipe.send_bytes(b"done")
        assert pipe.recv_bytes() == b"closed"
    assert ctl.get(timeout=300) == "exit"
    proc.join(120)
    return statistics.median(times), min(times), buckets, cold, peer_idle


def trainer_entry(method, big, small, repeat, back, data, name, ctl, geometry, pipe):
    # `ctl` carries the trainer's reports to the engine; `back` the engine's go/acks to it.
    class Both:
        def put(self, v):
            ctl.put(v)

        def get(self):
            return back.get(timeout=300)

    trainer(method, big, small, repeat, Both(), data, name, geometry, pipe)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", type=int, default=1600)
    ap.add_argument("--small", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--methods", default="abcdef")
    ap.add_argument("--bucket", type=int, default=512, help="MiB per bucket, (c) and its floor")
    ap.add_argument("--slots", type=int, default=4, help="(c)'s ring")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.cuda.set_device(0)
    global BUCKET_C, SLOTS_C
    BUCKET_C, SLOTS_C = args.bucket << 20, args.slots
    src, dst = model(args.big, args.small, 1), model(args.big, args.small, 2)
    floor, nb, nc = floors(src, dst, args.repeat)
    gib = sum(t.numel() * t.element_size() for t in src.values()) / (1 << 30)
    del src, dst
    torch.cuda.empty_cache()
    res = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "tensors": args.big + args.small,
        "gib": round(gib, 3),
        "floor_once_ms": floor["once"] * 1e3,
        "floor_flat_ms": floor["flat"] * 1e3,
        "floor_multi_ms": floor["multi"] * 1e3,
        "floor_direct_ms": floor["direct"] * 1e3,
        "bucket_mib_c": args.bucket,
        "slots_c": args.slots,
    }
    floors_of = {
        "a": floor["once"],
        "b": floor["flat"],
        "c": floor["multi"],
        "d": floor["direct"],
        "e": floor["direct"],
        "f": floor["direct"],
    }
    for m in args.methods:
        med, best, buckets, cold, peer_idle = engine(
            m, args.big, args.small, args.repeat, f"cuda-ipc-bench-ws-{os.getpid()}"
        )
        res[m] = {
            "median_ms": med * 1e3,
            "min_ms": best * 1e3,
            "first_ms": cold * 1e3,
            "buckets": buckets,
            "floor_ms": floors_of[m] * 1e3,
            "per_bucket_overhead_us": (med - floors_of[m]) / buckets * 1e6,
        }
        if peer_idle is not None:
            res[m]["floor_peer_idle_ms"] = peer_idle * 1e3
            res[m]["beyond_floor_peer_idle_us"] = (med - peer_idle) * 1e6
        print(f"({m}) {med * 1e3:8.2f} ms median ({best * 1e3:.2f} min), {buckets} buckets/messages, "
              f"floor {floors_of[m] * 1e3:.2f} ms, overhead {(med - floors_of[m]) / buckets * 1e6:.1f} us each",
              flush=True)
        if peer_idle is not None:
            print(f"    the floor's copies with the trainer alive and idle: {peer_idle * 1e3:.2f} ms; "
                  f"({m}) {(med - peer_idle) * 1e6:.0f} us beyond them", flush=True)
    if "a" in res and "c" in res:
        res["c_vs_a"] = res["a"]["median_ms"] / res["c"]["median_ms"]
    if "b" in res and "c" in res:
        res["c_vs_b"] = res["b"]["median_ms"] / res["c"]["median_ms"]
    if "c" in res:
        res["c_vs_floor"] = res["c"]["median_ms"] / res["floor_multi_ms"]
    for m in "abc":
        if m in res and "d" in res:
            res[f"d_vs_{m}"] = res[m]["median_ms"] / res["d"]["median_ms"]
    if "d" in res:
        res["d_vs_floor"] = res["d"]["median_ms"] / res["floor_direct_ms"]
    if "d" in res and "e" in res:
        # (d) against the same sync on PyTorch's own primitives: below 1 is faster.
        res["d_over_e"] = res["d"]["median_ms"] / res["e"]["median_ms"]
    if "e" in res:
        res["e_vs_floor"] = res["e"]["median_ms"] / res["floor_direct_ms"]
    if "f" in res:
        # What one GPU charges for a second process, with no protocol: the least any
        # two-process sync can spend beyond the floor.
        res["f_vs_floor"] = res["f"]["median_ms"] / res["floor_direct_ms"]
    if "d" in res and "f" in res:
        # (d)'s time beyond (f)'s: its protocol's own (≤ 0 is within the spread).
        res["d_minus_f_ms"] = res["d"]["median_ms"] - res["f"]["median_ms"]
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
