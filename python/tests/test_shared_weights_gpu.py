"""cuda_ipc.shared_weights on a GPU with real PyTorch: versions of a mixed model (bf16, f32,
f16, i64, bool, an empty tensor, 200 small tensors) pulled bit for bit out of the trainer's own
memory, with PyTorch's default allocator and with expandable segments; either side SIGKILLed
leaves the other a PeerGone within a second (a trainer killed between publishing a version and
its verdict: PeerClosed, the socket's end of file), and a dead trainer's engine keeps a working
context."""

import os
import subprocess
import sys

import pytest

from conftest import HERE, report, unique
from survivor import Peer, Stress, caught, kill_plan

pytestmark = pytest.mark.gpu

BOUND_S = 1.0


def run(syncs, trainer_dies=0, engine_dies=0, expandable=False, before_verdict=False, streams=False):
    name = unique("shared-weights")
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("SW_DIE_BEFORE_VERDICT", None)
    env.pop("SW_STREAMS", None)
    if streams:
        env["SW_STREAMS"] = "1"
    if before_verdict:
        env["SW_DIE_BEFORE_VERDICT"] = "1"
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    script = os.path.join(HERE, "shared_weights_peer.py")

    def start(role, die):
        return subprocess.Popen(
            [sys.executable, script, role, name, str(syncs), str(die)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )

    trainer = start("trainer", trainer_dies)
    try:
        assert trainer.stdout.readline().strip() == "RESULT listening", trainer.stderr.read()
        engine = start("engine", engine_dies)
        e_out, e_err = engine.communicate(timeout=120)
        t_out, t_err = trainer.communicate(timeout=120)
    finally:
        for p in (trainer,):
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = lambda out: [l[7:] for l in out.splitlines() if l.startswith("RESULT ")]  # noqa: E731
    return (lines(t_out), trainer.returncode, t_err), (lines(e_out), engine.returncode, e_err)


@pytest.mark.parametrize("expandable", [False, True])
def test_every_version_arrives_bit_for_bit(expandable):
    (t, t_rc, t_err), (e, e_rc, e_err) = run(6, expandable=expandable)
    assert t_rc == 0 and e_rc == 0, t_err + e_err
    assert e == [f"ok {k}" for k in range(1, 7)] + ["done"], e_err
    assert t == ["done"], t_err


def test_versions_follow_the_streams_they_are_given():
    """`stream=` and torch's current stream, on both sides: each keeps its default stream busy,
    so a step or a copy that went there instead would be seen (see shared_weights_peer.py)."""
    (t, t_rc, t_err), (e, e_rc, e_err) = run(6, streams=True)
    assert t_rc == 0 and e_rc == 0, t_err + e_err
    assert e == [f"ok {k}" for k in range(1, 7)] + ["done"], e_err
    assert t == ["done"], t_err


def gone_after_kill(killed_lines, survivor_lines, role, cls_wanted="PeerGone"):
    kill = [float(l.split()[1]) for l in killed_lines if l.startswith("killing")]
    gone = [l.split() for l in survivor_lines if l.startswith("gone")]
    assert kill and gone, (killed_lines, survivor_lines)
    _, cls, who, when = gone[0]
    assert cls == cls_wanted and who == role, gone
    assert float(when) - kill[0] < BOUND_S, f"{float(when) - kill[0]:.3f} s after the kill"


def test_a_killed_trainer_is_peer_gone_in_the_engine_whose_context_survives():
    (t, t_rc, _), (e, e_rc, e_err) = run(6, trainer_dies=3)
    assert t_rc == -9
    assert e[:3] == ["ok 1", "ok 2", "ok 3"], e_err
    gone_after_kill(t, e, "exporter")
    assert e[-1] == "context ok", e
    assert e_rc == 0, e_err


def test_a_trainer_killed_between_publishing_and_its_verdict_is_peer_closed_in_the_engine():
    (t, t_rc, _), (e, e_rc, e_err) = run(6, trainer_dies=3, before_verdict=True)
    assert t_rc == -9
    assert e[:2] == ["ok 1", "ok 2"], e_err
    # Version 3's copies were enqueued; its verdict never came: the socket's end of file.
    gone_after_kill(t, e, "None", "PeerClosed")
    assert e[-1] == "context ok", e
    assert e_rc == 0, e_err


def test_a_killed_engine_is_peer_gone_in_the_trainer():
    (t, t_rc, t_err), (e, e_rc, _) = run(6, engine_dies=2)
    assert e_rc == -9
    gone_after_kill(e, t, "importer")
    assert t_rc == 0, t_err


# ---- 10,000 versions under random kills, this process the survivor of every round ----


def as_engine(ctx, peer, syncs, stream):
    """Pull and check versions from the trainer process; the versions checked and the error
    that ended the round (None: `syncs` versions and a clean end)."""
    import torch

    import cuda_ipc
    from cuda_ipc.shared_weights import SharedWeightReceiver
    from shared_weights_peer import model, step

    assert peer.proc.stdout.readline().strip() == "RESULT listening", peer.proc.stderr.read()
    want = model("small")
    target = {n: torch.zeros_like(t) for n, t in want.items()}
    k, rx, error = 0, None, None
    sock = cuda_ipc.connect(peer.name, 30)
    peer.arm()  # (after the connection: a trainer killed before it would be no peer at all)
    try:
        rx = SharedWeightReceiver(ctx, sock, timeout=30)
        while peer.kill_after is not None or k < syncs:
            stats = rx.pull_into(target, stream=stream, timeout=30)
            k += 1
            stream.synchronize()
            step(want, k)
            bad = [n for n in want if not torch.equal(want[n], target[n])]
            assert not bad and stats.sync == k, f"version {k}: {bad} differ ({stats})"
    except (cuda_ipc.PeerGone, cuda_ipc.PeerClosed) as e:
        error = caught(e)
    if rx is not None:
        rx.close(10)  # releases a GPU wait the dead trainer left, then synchronises
    return k, error


def as_trainer(ctx, peer, syncs):
    """Publish versions to the engine process (which checks each); the versions published
    and the error that ended the round (None: `syncs` versions and a clean end)."""
    import cuda_ipc
    from cuda_ipc.shared_weights import SharedWeightSender
    from shared_weights_peer import model, step

    sd = model("small")
    listener = cuda_ipc.Listener(peer.name)
    k, tx, error = 0, None, None
    sock = listener.accept(30)
    peer.arm()  # (after the connection: an engine killed before it would be no peer at all)
    try:
        tx = SharedWeightSender(ctx, sd, sock, timeout=30)
        while peer.kill_after is not None or k < syncs:
            tx.update(lambda: step(sd, k + 1), timeout=30)
            k += 1
    except (cuda_ipc.PeerGone, cuda_ipc.PeerClosed) as e:
        error = caught(e)
    if tx is not None:
        tx.close(10)  # waits for the engine's close, or its death
    return k, error


def test_random_kills_over_10000_versions_leave_the_survivor_nothing():
    """Rounds of a trainer and an engine, this process one of them (the other a new process,
    its allocator PyTorch's default or expandable segments), the other SIGKILLed at a random
    moment — during the setup or anywhere in the versions — or both ending cleanly, until
    10,000 versions went through. Every version is checked bit for bit (here, or in the engine
    process); the survivor's error comes within BOUND_S of the kill and is the peer's death
    (PeerGone naming the peer's role, or PeerClosed: its socket's end); and after every round
    this process holds the file descriptors, /dev/shm names and device memory it held before
    (survivor.State) — its mappings of a dead trainer's memory included."""
    import random

    import torch

    import cuda_ipc

    want = int(os.environ.get("SHARED_WEIGHT_STRESS_VERSIONS", "10000"))
    rng = random.Random(int(os.environ.get("SHARED_WEIGHT_STRESS_SEED", str(os.getpid()))))
    ctx = cuda_ipc.Context(0)
    stream = torch.cuda.Stream()
    stress = Stress(BOUND_S)

    def one(role, kill_after, syncs, expandable):
        other = "trainer" if role == "engine" else "engine"
        name = unique("sw-stress")
        forever = 0 if kill_after is not None else syncs
        peer = Peer("shared_weights_peer.py", name, [other, name, forever, 0, "small"],
                    kill_after, expandable)
        if role == "engine":
            here, tail = (lambda: as_engine(ctx, peer, syncs, stream)), ["done"]
        else:
            here, tail = (lambda: as_trainer(ctx, peer, syncs)), [f"checked {syncs}", "done"]
        k = stress.round(role, peer, here, syncs, tail)
        assert stream.query(), "the round left work on this process's stream"
        return k

    def play():
        role = rng.choice(["engine", "trainer"])
        expandable = rng.random() < 0.5
        kind, kill_after = kill_plan(rng)
        k = one(role, kill_after, 1500, expandable)
        return k, f"{role}/{kind}/{'expandable' if expandable else 'default'}"

    # Warm-up: this process's first export, first imports of each kind (legacy handles and
    # expandable segments' descriptors) open what they keep for the process's life.
    done = one("engine", None, 20, False) + one("engine", None, 20, True)
    done += one("trainer", None, 20, False)
    report(f"shared_weights stress, versions: {stress.run(want, play, done)} (3 warm-up rounds)")
