"""cuda_ipc.weights without a GPU: bucket planning, headers and unpacking, run on CPU tensors
through an in-process stand-in for the channel (the GPU tests run the real one). Needs torch;
where torch is not installed these tests are skipped (and say so)."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from cuda_ipc import weights as W  # noqa: E402


class Slot:
    """What the channel hands `fill`/`use`: a tensor of bytes with `data_ptr` and DLPack."""

    def __init__(self, t):
        self.t = t

    @property
    def data_ptr(self):
        return self.t.data_ptr()

    @property
    def nbytes(self):
        return self.t.numel()

    def __dlpack__(self, **kw):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class FakeChannel:
    """A ring of `slots` CPU byte buffers between a fake sender and receiver in one process
    (the sender runs a whole sync before the receiver starts: the ring must hold it)."""

    def __init__(self, slot_bytes, slots=2):
        self.bufs = [torch.zeros(slot_bytes, dtype=torch.uint8) for _ in range(slots)]
        self.items = []
        self.sent = 0
        self.slot_bytes = slot_bytes

    def send(self, fill, *, header=None, stream=None, timeout=30.0):
        assert len(header or b"") <= 4096
        buf = self.bufs[self.sent % len(self.bufs)]
        assert all(b is not buf for b, _, _ in self.items), "the ring is full (no back-pressure here)"
        n = fill(Slot(buf))
        assert 0 <= n <= self.slot_bytes
        self.sent += 1
        self.items.append((buf, n, bytes(header or b"")))
        return self.sent

    def recv(self, use, *, stream=None, timeout=30.0):
        buf, n, header = self.items.pop(0)
        return use(Slot(buf[:n]), header)

    def close(self, timeout=30.0):
        pass


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(W, "_current_stream", lambda s: s)
    monkeypatch.setattr(W, "_stream_context", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(W, "_raw", lambda s: 0)

    def make(bucket_bytes, slots=64):
        ch = FakeChannel(bucket_bytes, slots)
        tx = W.WeightSender.__new__(W.WeightSender)
        tx._tx, tx.bucket_bytes, tx._plan_key, tx._plan = ch, bucket_bytes, None, []
        tx._views, tx._headers, tx._sync = {}, [], 0
        rx = W.WeightReceiver.__new__(W.WeightReceiver)
        rx._rx, rx._codes, rx._views = ch, None, {}
        return ch, tx, rx

    return make


def model(seed, long_names=False):
    g = torch.Generator().manual_seed(seed)
    pre = "model.layers.0.self_attn.very_long_module_name_" * 3 if long_names else "w"
    sd = {
        f"{pre}.bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        f"{pre}.f32": torch.randn(1000, generator=g),
        f"{pre}.big": torch.randn(70_001, generator=g),  # 280 KB: split over buckets
        f"{pre}.i64": torch.randint(-(2**40), 2**40, (129,), generator=g),
        f"{pre}.bool": torch.rand(77, generator=g) > 0.5,
        f"{pre}.u8": torch.randint(0, 255, (5, 3), generator=g).to(torch.uint8),
        f"{pre}.f16": torch.randn(2, 3, 4, generator=g).half(),
        f"{pre}.empty": torch.zeros(0, 4),
    }
    for i in range(40):
        sd[f"{pre}.many.{i}"] = torch.full((i + 1,), float(seed * 100 + i))
    return sd


def assert_same(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, n
        assert torch.equal(a[n], b[n]), n


@pytest.mark.parametrize("long_names", [False, True])
def test_syncs_arrive_exactly_and_views_are_reused_until_the_weights_move(fake, long_names):
    ch, tx, rx = fake(64 << 10)
    target = {n: torch.empty_like(t) for n, t in model(0, long_names).items()}
    for seed in (1, 2, 3):
        src = model(seed, long_names)
        stats = tx.send(src)
        got = rx.recv_into(target)
        assert_same(target, src)
        assert (stats.buckets, got.buckets) == (len(tx.plan(src)), stats.buckets)
        assert got.tensors == len(src) and got.nbytes == stats.nbytes
    # Moved weights (new tensors) are picked up, not written through stale views.
    target2 = {n: torch.empty_like(t) for n, t in target.items()}
    src = model(9, long_names)
    tx.send(src)
    rx.recv_into(target2)
    assert_same(target2, src)
    assert not ch.items


def test_plans_respect_the_bucket_and_the_header_bounds():
    sd = model(0, long_names=True)
    for bucket_bytes in (4096, 64 << 10, 1 << 20):
        plan = W.plan_buckets(sd.items(), bucket_bytes)
        covered = {}
        for b in plan:
            assert b.nbytes <= bucket_bytes
            assert len(b.header(7, 0, False)) <= 4096
            ends = sorted((c.offset, c.offset + c.nbytes) for c in b.chunks)
            assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:])), "overlap"
            assert all(c.offset % 256 == 0 for c in b.chunks)
            for c in b.chunks:
                covered[c.name] = covered.get(c.name, 0) + c.nbytes
        for n, t in sd.items():
            assert covered[n] == t.numel() * t.element_size(), n
    with pytest.raises(ValueError, match="fits no header"):
        W.plan_buckets([("x" * 5000, torch.zeros(1))], 1 << 20)
    with pytest.raises(ValueError, match="not contiguous"):
        W.plan_buckets([("t", torch.zeros(4, 4).t())], 1 << 20)
    with pytest.raises(ValueError, match="dtype"):
        W.plan_buckets([("c", torch.zeros(2, dtype=torch.complex64))], 1 << 20)


def test_a_mismatched_receiver_is_refused_before_anything_is_copied(fake):
    ch, tx, rx = fake(1 << 20)
    src = {"a": torch.ones(8), "b": torch.ones(4, 4)}
    wrong = {"a": torch.zeros(8), "b": torch.zeros(16)}
    tx.send(src)
    with pytest.raises(ValueError, match="b: the trainer sent float32\\[4, 4\\]"):
        rx.recv_into(wrong)
    assert torch.equal(wrong["a"], torch.zeros(8)), "nothing of that bucket copied"
    tx.send(src)
    with pytest.raises(ValueError, match="not in the weights"):
        rx.recv_into({"a": torch.zeros(8)})
    tx.send(src)
    got = rx.recv_into({"a": torch.zeros(8)}, strict=False)
    assert got.tensors == 1
    tx.send({"a": src["a"]})
    with pytest.raises(ValueError, match="did not carry 1"):
        rx.recv_into({"a": torch.zeros(8), "b": torch.zeros(4, 4)})


def test_a_receiver_that_lost_a_sync_midway_skips_its_rest(fake):
    ch, tx, rx = fake(4096)
    src = {f"t{i}": torch.full((900,), float(i)) for i in range(6)}  # 6 buckets
    tx.send(src)
    ch.items.pop(0)  # bucket 0 of sync 1 lost (the receiver failed on it)
    tx.send(src)
    target = {n: torch.zeros(900) for n in src}
    got = rx.recv_into(target)
    assert got.skipped == 5 and got.sync == 2
    assert_same(target, src)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda h: h[:10],
        lambda h: b"XXXX" + h[4:],
        lambda h: h[:4] + bytes([9]) + h[5:],
        lambda h: h + b"\0",
        lambda h: h[:-1],
        lambda h: h[:20] + b"\xff\xff" + h[22:],  # a name sharing more than there was
        lambda h: h[:20] + b"\x00\x7f" + h[22:],  # a name past the end
        lambda h: h[:20] + b"\xff" * 12,  # a number of more than 64 bits
        lambda h: offset_past_the_bucket(),
    ],
)
def test_malformed_headers_are_value_errors(mangle):
    b = W.plan_buckets([("w", torch.zeros(16)), ("w2", torch.zeros(4))], 4096)[0]
    header = b.header(1, 0, True)
    assert [c.name for c in W._parse(header, 4096)[3]] == ["w", "w2"]  # the original parses
    with pytest.raises(ValueError):
        W._parse(mangle(header), 4096)


def offset_past_the_bucket():
    b = W.Bucket()
    b.add(W.Chunk("w", 12, (16,), 0, 64, 1 << 40))
    return b.header(1, 0, True)


def test_random_damage_to_a_header_is_a_value_error_or_stays_in_bounds():
    import random

    rng = random.Random(7)
    sd = model(0, long_names=True)
    header = W.plan_buckets(sd.items(), 1 << 20)[0].header(3, 0, False)
    for _ in range(3000):
        h = bytearray(header)
        for _ in range(rng.randint(1, 4)):
            h[rng.randrange(len(h))] = rng.randrange(256)
        h = bytes(h[: rng.randint(0, len(h))]) if rng.random() < 0.3 else bytes(h)
        try:
            chunks = W._parse(h, 1 << 20)[3]
        except ValueError:
            continue
        assert all(c.offset + c.nbytes <= 1 << 20 and len(c.shape) <= 8 for c in chunks)


def test_headers_are_compact():
    sd = {f"model.layers.{i // 10}.mlp.w{i % 10}": torch.empty(1 << 18, dtype=torch.bfloat16, device="meta") for i in range(400)}
    plan = W.plan_buckets(sd.items(), 512 << 20)
    assert len(plan[0].chunks) >= 150, [len(b.chunks) for b in plan]


def test_a_layout_change_fails_the_sync_and_the_engine_drops_its_partial_buckets(fake):
    ch, tx, rx = fake(4096)
    src = {f"t{i}": torch.full((900,), float(i)) for i in range(6)}  # a bucket each
    target = {n: torch.zeros(900) for n in src}
    tx.send(src)
    rx.recv_into(target)
    changed = dict(src, t3=torch.zeros(30, 30))
    with pytest.raises(ValueError, match=r"t3: torch.float32\[30, 30\] where the plan"):
        tx.send(changed)
    assert len(ch.items) == 3, "buckets 0..2 went before the check of bucket 3"
    src2 = {n: t + 10 for n, t in src.items()}
    tx.send(src2)  # planned again
    got = rx.recv_into(target)
    assert got.skipped == 3 and got.buckets == 6
    assert_same(target, src2)


def test_a_tensor_that_becomes_a_transposed_view_is_refused_on_either_side(fake):
    """A square matrix re-bound to its transpose keeps its address, dtype and shape: the cached
    copies would move its storage's bytes, not the tensor's. Both sides check contiguity at
    every bucket, not only when they plan or first build a bucket's copies."""
    ch, tx, rx = fake(64 << 10)
    g = torch.Generator().manual_seed(5)
    src = {"w": torch.randn(32, 32, generator=g), "b": torch.randn(32, generator=g)}
    target = {n: torch.zeros_like(t) for n, t in src.items()}
    tx.send(src)
    rx.recv_into(target)
    assert_same(target, src)
    # The trainer's side.
    moved = dict(src, w=src["w"].t())
    assert moved["w"].data_ptr() == src["w"].data_ptr() and moved["w"].shape == src["w"].shape
    with pytest.raises(ValueError, match=r"w: .*\(not contiguous\)"):
        tx.send(moved)
    assert not ch.items, "nothing went"
    # The engine's side: its cached copies for this layout would write the storage.
    tx.send(src)
    before = target["w"].clone()
    flipped = dict(target, w=target["w"].t())
    with pytest.raises(ValueError, match="w: the receiving tensor is not contiguous"):
        rx.recv_into(flipped)
    assert torch.equal(target["w"], before), "nothing was written through the stale copies"


def test_a_strict_receive_after_a_lenient_one_of_the_same_layout_refuses_a_missing_name(fake):
    """The cached copies of a bucket depend on ``strict`` and on which names the weights lack:
    a lenient receive that skipped ``b`` must not let a strict one pass without it, and a
    name added to the weights since is received, not skipped."""
    ch, tx, rx = fake(1 << 20, slots=1)  # one slot: every sync's bucket hits the same cache entry
    src = {"a": torch.full((8,), 3.0), "b": torch.full((4, 4), 5.0)}
    only_a = {"a": torch.zeros(8)}
    tx.send(src)
    assert rx.recv_into(only_a, strict=False).tensors == 1
    tx.send(src)
    with pytest.raises(ValueError, match="b: sent by the trainer, not in the weights"):
        rx.recv_into(only_a, strict=True)
    both = dict(only_a, b=torch.zeros(4, 4))
    tx.send(src)
    rx.recv_into(only_a, strict=False)  # the lenient plan again, cached
    tx.send(src)
    got = rx.recv_into(both, strict=False)
    assert got.tensors == 2
    assert_same(both, src)
    assert not ch.items


def test_contiguous_tensors_at_any_storage_offset_are_sent_and_received(fake):
    """Views of one flat buffer, ``parameters_to_vector``-style packing and a fused QKV
    weight split with ``chunk``: contiguous tensors whose bytes start at an offset in their
    storage that no wide word divides, on both sides."""
    ch, tx, rx = fake(64 << 10)
    g = torch.Generator().manual_seed(11)
    flat = torch.randn(4099, generator=g)
    qkv = torch.randn(3 * 7, 5, generator=g)
    q, k, v = qkv.chunk(3)
    raw = torch.randint(0, 255, (301,), generator=g).to(torch.uint8)
    half = torch.randn(257, generator=g).to(torch.bfloat16)
    src = {
        "flat.a": flat[1:10],  # 4 bytes in
        "flat.b": flat[10:1033].view(31, 33),  # 40 bytes in
        "qkv.q": q, "qkv.k": k, "qkv.v": v,  # 140 and 280 bytes in
        "raw.odd": raw[3:300],  # 3 bytes in
        "half.odd": half[1:],  # 2 bytes in
        "flag": torch.rand(9, generator=g)[1:] > 0.5,
    }
    assert all(t.is_contiguous() for t in src.values())
    # The engine's weights: views at other odd offsets of its own buffers.
    mine = torch.zeros(5000)
    mine_raw = torch.zeros(400, dtype=torch.uint8)
    target = {
        "flat.a": mine[3:12],
        "flat.b": mine[13:1036].view(31, 33),
        "qkv.q": mine[1100:1135].view(7, 5),
        "qkv.k": mine[1137:1172].view(7, 5),
        "qkv.v": torch.zeros(7, 5),
        "raw.odd": mine_raw[1:298],
        "half.odd": torch.zeros(257, dtype=torch.bfloat16)[1:],
        "flag": torch.zeros(9, dtype=torch.bool)[1:],
    }
    for _ in range(2):  # planned, then from the cached copies
        tx.send(src)
        rx.recv_into(target)
        assert_same(target, src)
    assert not ch.items


def test_bool_bytes_other_than_0_and_1_arrive_as_0_and_1(fake):
    """A peer's bool bytes may be anything; PyTorch's kernels assume 0 or 1."""
    ch, tx, rx = fake(1 << 20)
    raw = torch.tensor([2, 0, 255, 1, 0, 7], dtype=torch.uint8)
    src = {"mask": raw.view(torch.bool), "w": torch.ones(3)}
    target = {"mask": torch.zeros(6, dtype=torch.bool), "w": torch.zeros(3)}
    for _ in range(2):
        tx.send(src)
        rx.recv_into(target)
        assert target["mask"].view(torch.uint8).tolist() == [1, 0, 1, 1, 0, 1]
