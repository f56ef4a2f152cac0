"""cuda_ipc.shared_weights without a GPU: the setup and each pull run on CPU tensors through
in-process stand-ins for the socket and the channel (the GPU tests run the real ones). Needs
torch; skipped (and says so) where torch is not installed."""

import struct
import threading

import pytest

import cuda_ipc

torch = pytest.importorskip("torch")

from cuda_ipc import shared_weights as SW  # noqa: E402
from test_weights_host import FakeChannel  # noqa: E402


class FakeWire:
    """An in-process socket pair: ``trainer`` and ``engine`` ends; ``q`` holds what the trainer
    sent and the engine has not received yet (tensors too), ``back`` the other way. A receive
    waits (the other end may be a thread); once either end is closed, sends, and receives with
    nothing left to read, raise PeerClosed."""

    def __init__(self):
        self.q, self.back = [], []
        self.cond = threading.Condition()
        self.closed = set()
        self.trainer = FakeEnd(self, "trainer")
        self.engine = FakeEnd(self, "engine")


class FakeEnd:
    def __init__(self, wire, who):
        self.wire, self.who = wire, who
        self.other = "engine" if who == "trainer" else "trainer"

    def _boxes(self):
        w = self.wire
        return (w.q, w.back) if self.who == "trainer" else (w.back, w.q)

    def _put(self, x):
        out, _ = self._boxes()
        with self.wire.cond:
            if self.wire.closed:
                raise cuda_ipc.PeerClosed("the peer closed the connection")
            out.append(x)
            self.wire.cond.notify_all()

    def _get(self, timeout):
        _, inbox = self._boxes()
        with self.wire.cond:
            self.wire.cond.wait_for(lambda: inbox or self.wire.closed, timeout)
            if inbox:
                return inbox.pop(0)
            if self.wire.closed:
                raise cuda_ipc.PeerClosed("the peer closed the connection")
            raise cuda_ipc.Timeout("nothing came")

    def send(self, payload, timeout=30.0):
        assert 1 <= len(payload) <= 65536
        self._put(bytes(payload))

    def recv(self, timeout=30.0):
        x = self._get(timeout)
        assert isinstance(x, bytes)
        return x

    def send_tensor(self, ctx, t, timeout=30.0):
        self._put(t)
        return 0

    def recv_tensor(self, ctx, timeout=30.0):
        t = self._get(timeout)
        assert isinstance(t, torch.Tensor)
        return t

    def close(self):
        with self.wire.cond:
            self.wire.closed.add(self.who)
            self.wire.cond.notify_all()


def start_sender(sd, end):
    """``SharedWeightSender(None, sd, end)`` in a thread (it waits for the engine's answer):
    ``join()`` returns the sender, or raises what its constructor raised."""
    out = {}

    def run():
        try:
            out["tx"] = SW.SharedWeightSender(None, sd, end, timeout=10)
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            out["error"] = e

    th = threading.Thread(target=run)
    th.start()

    def join():
        th.join(30)
        assert not th.is_alive(), "the sender's setup did not end"
        if "error" in out:
            raise out["error"]
        return out["tx"]

    return join


@pytest.fixture
def pair(monkeypatch):
    ch = FakeChannel(256, slots=1)
    ch.handle = lambda: b"channel"
    monkeypatch.setattr(SW, "Sender", lambda ctx, nbytes, slots: ch)
    monkeypatch.setattr(SW, "Receiver", lambda ctx, handle: ch)
    monkeypatch.setattr(SW, "_stream_context", lambda s: __import__("contextlib").nullcontext())
    monkeypatch.setattr(SW, "_stream_handle", lambda s: 0)
    monkeypatch.setattr(SW, "_synchronize", lambda: None)

    def make(sd):
        wire = FakeWire()
        join = start_sender(sd, wire.trainer)
        rx = SW.SharedWeightReceiver(None, wire.engine)
        tx = join()
        assert not wire.q and not wire.back
        return ch, wire, tx, rx

    return make


def model(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "a.bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "a.f32": torch.randn(1000, generator=g),
        "a.i64": torch.randint(-(2**40), 2**40, (129,), generator=g),
        "a.bool": torch.rand(77, generator=g) > 0.5,
        "a.empty": torch.zeros(0, 4),
    }


def test_each_update_is_pulled_exactly_and_in_order(pair):
    src = model(1)
    ch, _, tx, rx = pair(src)
    assert rx.names == list(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    for k in range(1, 4):
        with torch.no_grad():
            tx.update(lambda: [t.add_(1) for t in src.values() if t.dtype == torch.float32])
        stats = rx.pull_into(target)
        assert stats.sync == k and tx.version == k
        for n in src:
            assert torch.equal(target[n], src[n]), n
    assert not ch.items


def test_a_mismatched_engine_is_refused_before_anything_is_copied(pair):
    src = model(2)
    ch, _, tx, rx = pair(src)
    tx.update()
    for bad in (
        dict({n: torch.zeros_like(t) for n, t in src.items()}, **{"a.f32": torch.zeros(999)}),
        {n: torch.zeros_like(t) for n, t in src.items() if n != "a.i64"},
        dict({n: torch.zeros_like(t) for n, t in src.items()}, **{"a.bf16": torch.zeros(17, 33).t()}),
        dict({n: torch.zeros_like(t) for n, t in src.items()}, **{"a.empty": torch.zeros(1)}),
    ):
        with pytest.raises(ValueError):
            rx.pull_into(bad)
        assert all(not t.any() for t in bad.values() if t.dtype != torch.bool), "nothing copied"
    assert len(ch.items) == 1, "the version is still there for a good pull"


def test_a_trainer_tensor_that_moved_is_refused_on_both_ends(pair):
    src = model(3)
    ch, sock, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.update()
    rx.pull_into(target)
    src["a.f32"].data = torch.zeros(1000)  # a new storage under the same Parameter-like name
    # Published (the check runs while the engine copies), then refused on both ends.
    with pytest.raises(ValueError, match="a.f32: moved"):
        tx.update()
    assert len(ch.items) == 1 and len(sock.q) == 1
    with pytest.raises(ValueError, match="refused version 2: a.f32: moved"):
        rx.pull_into(target)
    with pytest.raises(ValueError, match="publishes no more"):
        tx.update()
    with pytest.raises(ValueError, match="pulls no more"):
        rx.pull_into(target)
    assert not ch.items and not sock.q


def queued(wire, n):
    """Wait until the trainer's end has queued `n` messages (its setup, sent from a thread)."""
    with wire.cond:
        assert wire.cond.wait_for(lambda: len(wire.q) >= n, 10), wire.q


#: The setup of model(): the setup message, the channel's handle, a name per tensor and a
#: tensor per non-empty one.
SETUP_MESSAGES = 2 + 5 + 4


def test_forged_setups_and_headers_are_value_errors(pair, monkeypatch):
    src = model(4)
    for forge in (
        lambda q: q.__setitem__(0, b"XXXX" + q[0][4:]),
        lambda q: q.__setitem__(0, q[0][:-1]),
        lambda q: q.__setitem__(0, struct.pack("<4sB3xI", b"CISW", SW._VERSION, (1 << 20) + 1)),
        lambda q: q.__setitem__(0, struct.pack("<4sB3xI", b"CISW", 1, 5)),  # the old setup
        lambda q: q.__setitem__(2, b"\x07a.bf16"),
        lambda q: q.__setitem__(2, b"\x01\xff\xfe"),
        lambda q: q.__setitem__(4, b"\x01a.bf16"),  # a name shared twice
        lambda q: q.__setitem__(2, b""),  # an empty name message
    ):
        wire = FakeWire()
        join = start_sender(src, wire.trainer)
        queued(wire, SETUP_MESSAGES)
        forge(wire.q)
        with pytest.raises(ValueError):
            SW.SharedWeightReceiver(None, wire.engine)
        # The engine's socket, dropped with its failed setup: the trainer's setup ends there.
        wire.engine.close()
        with pytest.raises(cuda_ipc.PeerClosed):
            join()
    # Forged answers to the setup: the trainer refuses them.
    for answer in (
        b"CISX\0\0\0\0" + struct.pack("<Q", 5),
        b"CISR\0\0\0\0" + struct.pack("<Q", 4),
        b"CISR\0\0\0\0",
        b"CISR\0\0\0\0" + struct.pack("<Q", 5) + b"x",
    ):
        wire = FakeWire()
        join = start_sender(src, wire.trainer)
        queued(wire, SETUP_MESSAGES)
        wire.engine.send(answer)
        with pytest.raises(ValueError, match="setup answer"):
            join()
    ch, _, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    ch.items.append((ch.bufs[0], 0, b"CISV\0\0\0\0" + struct.pack("<Q", 5)))
    with pytest.raises(ValueError, match="version 5 after 0"):
        rx.pull_into(target)
    # Forged verdicts: another version, another magic, too short, too long, a confirmation
    # with a tail.
    for verdict, match in (
        (b"CISC\0\0\0\0" + struct.pack("<Q", 7), "verdict on version 7"),
        (b"CISQ\0\0\0\0" + struct.pack("<Q", 1), "magic"),
        (b"CISC\0\0\0\0", "verdict of 8 bytes"),
        (b"CISX\0\0\0\0" + struct.pack("<Q", 1) + b"x" * 1025, "verdict of 1041 bytes"),
        (b"CISC\0\0\0\0" + struct.pack("<Q", 1) + b"x", "confirmation of 17 bytes"),
    ):
        ch, sock, tx, rx = pair(src)
        ch.items.append((ch.bufs[0], 0, b"CISV\0\0\0\0" + struct.pack("<Q", 1)))
        sock.q.append(verdict)
        with pytest.raises(ValueError, match=match):
            rx.pull_into(target)


def test_a_parameter_rebound_to_new_memory_is_refused_when_its_state_dict_is_passed(pair):
    src = model(5)
    ch, _, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.update(state_dict=dict(src))
    rx.pull_into(target)
    now = dict(src, **{"a.f32": torch.zeros(1000)})  # what model.state_dict() gives after p.data = ...
    with pytest.raises(ValueError, match="a.f32: moved"):
        tx.update(state_dict=now)
    with pytest.raises(ValueError, match="a.f32: moved"):
        rx.pull_into(target)
    ch, _, tx, rx = pair(src)
    with pytest.raises(ValueError, match="a.i64: shared, and not in the state_dict"):
        tx.update(state_dict={n: t for n, t in src.items() if n != "a.i64"})
    with pytest.raises(ValueError, match="a.i64: shared, and not in the state_dict"):
        rx.pull_into(target)


def test_a_new_dict_of_the_same_tensors_reuses_the_copies_and_new_tensors_are_checked(pair):
    src = model(6)
    ch, _, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.update()
    rx.pull_into(target)
    plan = rx._plan
    tx.update()
    rx.pull_into(dict(target))
    assert rx._plan is plan, "same objects: no new plan"
    tx.update()
    rx.pull_into(dict(reversed(list(target.items())), extra=torch.zeros(3)))
    assert rx._plan is plan, "same objects in another order, among others: no new plan"
    tx.update()
    with pytest.raises(ValueError, match="a.f32"):
        rx.pull_into(dict(target, **{"a.f32": torch.zeros(7)}))


def test_a_trainer_gone_between_publishing_and_its_verdict_is_an_error_in_the_pull(pair):
    """The interleaving of a trainer SIGKILLed after publishing a version, before its verdict
    (the GPU test kills a real one there): the engine's pull enqueues the copies, then its
    socket says the peer closed."""
    import cuda_ipc

    src = model(7)
    ch, sock, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.update()
    sock.q.clear()  # the verdict never came

    def closed(timeout=30.0):
        raise cuda_ipc.PeerClosed("the peer closed the connection")

    sock.engine.recv = closed
    with pytest.raises(cuda_ipc.PeerClosed):
        rx.pull_into(target)
    assert not ch.items, "the item was taken (and released)"


def test_a_verdict_the_socket_refuses_is_not_that_updates_error_but_two_in_a_row_are(pair):
    """An engine SIGKILLed after its pull returned: the trainer's next update publishes into
    the free slot and its verdict meets a closed socket — not that update's error (the one
    after it waits for the dead engine's release: PeerGone); a live engine that closed its
    socket makes the next verdict fail too, and that one is raised."""
    import cuda_ipc

    src = model(8)
    ch, sock, tx, rx = pair(src)

    def closed(payload, timeout=30.0):
        raise cuda_ipc.PeerClosed("the peer closed the connection")

    sock.trainer.send = closed
    assert tx.update() == 1
    ch.items.clear()  # (the fake ring has no back-pressure: let the next one publish)
    with pytest.raises(cuda_ipc.PeerClosed):
        tx.update()


def test_a_peer_gone_during_the_setup_fails_the_setup_on_the_other_end(pair):
    """The engine gone before its answer: the trainer's setup is PeerClosed — not a sender
    whose updates would wait for a consumer that never attached. The trainer gone midway: the
    engine's setup is PeerClosed, after receiving what came."""
    src = model(9)
    wire = FakeWire()
    join = start_sender(src, wire.trainer)
    queued(wire, 3)
    wire.engine.close()
    with pytest.raises(cuda_ipc.PeerClosed):
        join()
    wire = FakeWire()
    join = start_sender(src, wire.trainer)
    queued(wire, SETUP_MESSAGES)
    del wire.q[5:]  # the trainer died after its second tensor's name
    wire.trainer.close()
    with pytest.raises(cuda_ipc.PeerClosed):
        SW.SharedWeightReceiver(None, wire.engine)
    with pytest.raises(cuda_ipc.PeerClosed):
        join()  # (the "dead" trainer's thread: its own end closed under it)


def test_a_pull_that_timed_out_waiting_for_its_verdict_reads_it_before_anything_else(pair):
    """A trainer whose verdict comes after the pull's timeout (descheduled, or a short poll):
    the pull raises Timeout with its copies enqueued; the next pull reads that verdict first
    and then pulls the next version — and while it still has not come, a pull copies nothing
    and raises Timeout again."""
    src = model(10)
    ch, sock, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    with torch.no_grad():
        tx.update(lambda: src["a.f32"].add_(1))
    late = [sock.q.pop()]  # version 1's verdict, late
    with pytest.raises(cuda_ipc.Timeout):
        rx.pull_into(target, timeout=0.05)
    assert torch.equal(target["a.f32"], src["a.f32"]), "version 1's copies were enqueued"
    with torch.no_grad():
        tx.update(lambda: src["a.f32"].add_(1))
    late.append(sock.q.pop())  # version 2's verdict, late too
    before = {n: t.clone() for n, t in target.items()}
    with pytest.raises(cuda_ipc.Timeout):
        rx.pull_into(target, timeout=0.05)
    assert len(ch.items) == 1, "version 2 is still there: nothing was taken"
    assert all(torch.equal(target[n], before[n]) for n in target), "nothing was copied"
    sock.q.extend(late)
    stats = rx.pull_into(target, timeout=5)
    assert stats.sync == 2 and not sock.q and not ch.items
    for n in src:
        assert torch.equal(target[n], src[n]), n
    tx.update()
    assert rx.pull_into(target, timeout=5).sync == 3


def test_a_pull_whose_copy_failed_still_reads_its_verdict_next_time(pair, monkeypatch):
    """An exception between the item and its verdict (here: the copy itself) leaves the
    verdict due; the next pull reads it, then pulls the next version."""
    src = model(11)
    ch, sock, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.update()

    def broken(groups):
        raise RuntimeError("a copy failed")

    real = SW._copy
    monkeypatch.setattr(SW, "_copy", broken)
    with pytest.raises(RuntimeError, match="a copy failed"):
        rx.pull_into(target)
    monkeypatch.setattr(SW, "_copy", real)
    assert len(sock.q) == 1, "version 1's verdict is still unread"
    tx.update()
    assert rx.pull_into(target).sync == 2
    assert not sock.q and not ch.items
    for n in src:
        assert torch.equal(target[n], src[n]), n


def test_a_verdict_out_of_step_ends_the_receiver_with_one_clear_error(pair):
    src = model(12)
    ch, sock, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.update()
    sock.q[0] = b"CISC\0\0\0\0" + struct.pack("<Q", 7)
    with pytest.raises(ValueError, match="verdict on version 7"):
        rx.pull_into(target)
    tx.update()
    with pytest.raises(ValueError, match="pulls no more .*verdict on version 7"):
        rx.pull_into(target)
    assert len(ch.items) == 1, "nothing taken after the error"


def test_bool_bytes_other_than_0_and_1_arrive_as_0_and_1(pair):
    src = dict(model(13), **{"a.bool": torch.tensor([2, 0, 255, 1], dtype=torch.uint8).view(torch.bool)})
    ch, sock, tx, rx = pair(src)
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    for _ in range(2):
        tx.update()
        rx.pull_into(target)
        assert target["a.bool"].view(torch.uint8).tolist() == [1, 0, 1, 1]
        assert torch.equal(target["a.f32"], src["a.f32"])
