"""The GPU channel and weight sync from Python, on a GPU with real PyTorch: raw items and
headers arrive exactly and misuse is refused; a trainer's syncs reach an engine tensor for
tensor, bit for bit; either side SIGKILLed mid-sync leaves the other a PeerGone within a second,
its file descriptors as before, the device's memory back at its baseline and nothing in
/dev/shm; and over 10,000 syncs under random kills, this process the survivor of every round,
nothing stays behind in it (survivor.py)."""

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import cuda_ipc
from conftest import HERE, report, unique
from cuda_ipc import weights as W
from survivor import Peer, Stress, caught, free_memory, kill_plan, shm

pytestmark = pytest.mark.gpu

#: How long a survivor may take to report its peer's death (the crate checks every 10 ms).
BOUND_S = 1.0


def spawn(role, name, **opts):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "weights_peer.py"), role, name]
        + [f"{k}={v}" for k, v in opts.items()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.lines = queue.Queue()
    proc.results = []

    def read():
        for line in proc.stdout:
            if line.startswith("RESULT "):
                proc.results.append(line[7:].strip())
                proc.lines.put(line[7:].strip())
        proc.lines.put(None)

    proc.reader = threading.Thread(target=read, daemon=True)
    proc.reader.start()
    return proc


def wait_line(proc, prefix, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {prefix!r} from the peer: {proc.results}"
        try:
            line = proc.lines.get(timeout=left)
        except queue.Empty:
            continue
        assert line is not None, f"the peer ended before {prefix!r}: {proc.results} {proc.stderr.read()}"
        if line.startswith(prefix):
            return line


def finish(proc, timeout=90):
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    proc.reader.join(10)
    err = proc.stderr.read()
    return proc.results, rc, err


def assert_memory_back(baseline, what):
    """The device's free memory returns to `baseline` (other processes' contexts and channels
    gone) within 10 s, to 64 MiB."""
    deadline = time.monotonic() + 10
    while free_memory() < baseline - (64 << 20):
        assert time.monotonic() < deadline, (
            f"{what}: {(baseline - free_memory()) >> 20} MiB of device memory not returned"
        )
        time.sleep(0.1)


def gone(results, role):
    line = next((r for r in results if r.startswith("gone ")), None)
    assert line is not None, results
    _, cls, got_role, at = line.split()
    assert (cls, got_role) == ("PeerGone", role), line
    return float(at)


def test_raw_items_and_headers_arrive_exactly_and_misuse_is_refused():
    import torch

    ctx = cuda_ipc.Context(0)
    tx = cuda_ipc.Sender(ctx, 4096, slots=3)
    before = shm()  # with this process's own lease tables (made at its first export)
    assert (tx.slots, tx.slot_bytes, tx.sent) == (3, 4096, 0)
    name = unique("raw")
    listener = cuda_ipc.Listener(name)
    n = 20
    peer = spawn("raw_consumer", name, n=n)
    s = listener.accept(timeout=60)
    s.send(tx.handle())
    stream = torch.cuda.Stream()

    def filler(k):
        def fill(slot):
            assert slot.nbytes == 4096 and slot.dtype == "uint8"
            with torch.cuda.stream(stream):
                torch.from_dlpack(slot)[:k].fill_(k % 256)
            return k

        return fill

    with pytest.raises(ValueError, match="header of 4097 bytes"):
        tx.send(filler(1), header=b"x" * 4097, stream=stream)
    with pytest.raises(ZeroDivisionError):
        tx.send(lambda slot: 1 / 0, stream=stream)
    with pytest.raises(TypeError, match="number of bytes"):
        tx.send(lambda slot: "many", stream=stream)
    with pytest.raises(cuda_ipc.CudaIpcError, match="capacity"):
        tx.send(lambda slot: 4097, stream=stream)
    with pytest.raises(RuntimeError, match="in use by another call"):
        tx.send(lambda slot: tx.send(filler(1)), stream=stream)
    assert tx.sent == 0, "nothing of the refused calls was sent"
    kept = []
    for k in range(1, n + 2):
        fill = filler(k)
        if k == 5:
            def fill(slot, inner=fill):  # noqa: E306
                kept.append(slot)
                return inner(slot)
        assert tx.send(fill, header=f"item {k}".encode(), stream=stream) == k
    assert tx.consumers() == [peer.pid]
    with pytest.raises(RuntimeError, match="1 tensor"):
        tx.close()
    kept.clear()
    tx.close(60)
    results, rc, err = finish(peer)
    assert rc == 0, err
    assert results == [
        "slots 3 bytes 4096",
        "use raised, released",
        "closed",
        "close refused: True",
        "receiver closed",
    ], results
    assert len(shm() - before) == 0 and len(before - shm()) == 1, "the ring's name went at attach"


def test_a_trainers_syncs_reach_the_engine_bit_for_bit():
    before, baseline = shm(), free_memory()
    name = unique("sync")
    trainer = spawn("trainer", name, syncs=4, bucket=1 << 20, slots=2)
    engine = spawn("engine", name, syncs=4)
    t_results, t_rc, t_err = finish(trainer)
    e_results, e_rc, e_err = finish(engine)
    assert t_rc == 0 and e_rc == 0, (t_err, e_err)
    buckets = int(t_results[0].split()[1])
    assert buckets >= 3, t_results  # "embed" (2.4 MiB) split over 1 MiB buckets
    assert e_results == [f"sync {k} ok {buckets} buckets" for k in range(1, 5)] + [
        "closed pid=True role=producer"
    ], e_results
    assert t_results[1:] == ["sent 4", "closed"], t_results
    assert shm() == before
    assert_memory_back(baseline, "after a clean sync")


@pytest.mark.parametrize("victim", ["trainer", "engine"])
def test_a_peer_killed_mid_sync_is_peer_gone_promptly_and_leaves_nothing(victim):
    before, baseline = shm(), free_memory()
    name = unique(f"kill-{victim}")
    # The trainer stops before its 4th bucket; or the engine inside its 2nd bucket's copy,
    # holding it (the trainer then waits for a slot).
    trainer = spawn("trainer", name, syncs=2, slots=2, **({"pause": 3} if victim == "trainer" else {}))
    engine = spawn("engine", name, syncs=2, **({"hold": 2} if victim == "engine" else {}))
    dead, survivor = (trainer, engine) if victim == "trainer" else (engine, trainer)
    wait_line(dead, "paused")
    time.sleep(0.2)  # the survivor is waiting now
    killed_at = time.monotonic()
    os.kill(dead.pid, signal.SIGKILL)
    results, rc, err = finish(survivor)
    assert rc == 0, err
    finish(dead)
    took = gone(results, "exporter" if victim == "trainer" else "importer") - killed_at
    assert 0 <= took < BOUND_S, f"PeerGone {took:.3f} s after the kill"
    assert "fds 0" in results, results
    assert not any(r.startswith("close ") for r in results), results
    assert shm() == before
    assert_memory_back(baseline, f"after the {victim} was killed")


def engine_here(ctx, peer, syncs):
    """This process the engine: receive and check syncs from the trainer process; the syncs
    checked and the error that ended the round (None: `syncs` syncs and a clean end)."""
    import torch

    from weights_peer import model

    sock = cuda_ipc.connect(peer.name, timeout=60)  # waits for the trainer to listen
    handle = sock.recv(timeout=60)
    peer.arm()
    target = {n: torch.empty_like(t) for n, t in model(0, "small").items()}
    k, rx, error = 0, None, None
    try:
        rx = W.WeightReceiver(ctx, handle)
        while peer.kill_after is not None or k < syncs:
            stats = rx.recv_into(target, timeout=30)
            k += 1
            torch.cuda.synchronize()
            want = model(k, "small")
            bad = [n for n in want if not torch.equal(want[n], target[n])]
            assert not bad and stats.tensors == len(want), f"sync {k}: {bad} differ ({stats})"
    except (cuda_ipc.PeerGone, cuda_ipc.PeerClosed) as e:
        error = caught(e)
    if rx is not None:
        rx.close(10)  # releases a GPU wait the dead trainer left
    return k, error


def trainer_here(ctx, peer, syncs):
    """This process the trainer: send syncs to the engine process (which checks each); the
    syncs sent and the error that ended the round (None: `syncs` syncs and a clean end). The
    clock of the kill starts after the first sync: an engine killed before it opened the
    channel never attached, and a send then waits out its timeout (README, "Weight sync from
    Python": the trainer cannot tell an engine not yet attached from one that never will)."""
    from weights_peer import model

    listener = cuda_ipc.Listener(peer.name)
    sock = listener.accept(timeout=60)
    tx = W.WeightSender(ctx, bucket_bytes=32 << 10, slots=2)
    k, error = 0, None
    try:
        sock.send(tx.handle())
        tx.send(model(1, "small"), timeout=30)
        k = 1
        peer.arm()
        while peer.kill_after is not None or k < syncs:
            tx.send(model(k + 1, "small"), timeout=30)
            k += 1
    except (cuda_ipc.PeerGone, cuda_ipc.PeerClosed) as e:
        error = caught(e)
    tx.close(10)  # waits for the engine's close, or its death
    return k, error


def test_random_kills_over_10000_syncs_leave_the_survivor_nothing():
    """Rounds of a trainer and an engine, this process one of them and the other a new process
    SIGKILLed at a random moment (for a trainer here, once its first sync went through) or
    left to finish, until 10,000 syncs went through: every sync checked bit for bit (here, or
    in the engine process), the survivor's PeerGone naming the peer within BOUND_S of the kill,
    and after every round this process holds the file descriptors, /dev/shm names and device
    memory it held before (survivor.State) — its mappings of a dead trainer's ring included."""
    want = int(os.environ.get("WEIGHT_STRESS_SYNCS", "10000"))
    rng = random.Random(int(os.environ.get("WEIGHT_STRESS_SEED", str(os.getpid()))))
    ctx = cuda_ipc.Context(0)
    stress = Stress(BOUND_S)

    def one(role, kill_after, syncs):
        name = unique(f"w-stress-{role}")
        forever = 0 if kill_after is not None else syncs
        if role == "engine":
            args = ["trainer", name, "size=small", f"syncs={forever}", f"bucket={32 << 10}", "slots=2"]
            here, tail = engine_here, [f"sent {syncs}", "closed"]
        else:
            args = ["engine", name, "size=small", f"syncs={forever}"]
            here, tail = trainer_here, ["closed pid=True role=producer"]
        peer = Peer("weights_peer.py", name, args, kill_after)
        return stress.round(role, peer, lambda: here(ctx, peer, syncs), syncs, tail)

    def play():
        role = rng.choice(["engine", "trainer"])
        kind, kill_after = kill_plan(rng)
        return one(role, kill_after, 1500), f"{role}/{kind}"

    # Warm-up: this process's first channel of each side opens what it keeps for its life.
    done = one("engine", None, 20) + one("trainer", None, 20)
    report(f"weights stress, syncs: {stress.run(want, play, done)} (2 warm-up rounds)")
