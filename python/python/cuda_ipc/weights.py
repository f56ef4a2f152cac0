"""Weight sync between PyTorch processes over cuda-ipc's GPU channel.

A trainer packs its ``state_dict`` into buckets — each a slot of the channel, filled on the
trainer's stream with one multi-tensor copy per word size (``torch._foreach_copy_``), not one
copy per tensor — and sends each with a header naming what it holds (names, dtypes, shapes,
byte ranges; at most 4 KiB, so a bucket also ends when its header is full). An inference engine
receives each bucket on its own stream, which waits on the GPU for the trainer's copies;
unpacks it into its own weights with the same few copies; and releases it, which the trainer's
stream waits for before the slot is filled again. The ring of slots is opened once; no bucket
costs a handle open, a host synchronize or a socket round trip.

::

    # trainer
    ctx = cuda_ipc.Context(0)
    sender = cuda_ipc.weights.WeightSender(ctx, bucket_bytes=512 << 20, slots=4)
    peer = cuda_ipc.Listener("weights").accept()
    peer.send(sender.handle())                # once
    for step in ...:
        train_step()
        sender.send(model.state_dict())       # returns once every bucket is enqueued

    # engine
    ctx = cuda_ipc.Context(0)
    receiver = cuda_ipc.weights.WeightReceiver(ctx, cuda_ipc.connect("weights").recv())
    weights = model.state_dict()
    while True:
        receiver.recv_into(weights)           # one sync, every bucket, on the current stream

Every header is parsed as untrusted: a name, dtype or shape that does not match the receiving
tensor, or a byte range outside the bucket or the tensor, is a ``ValueError`` before anything
is copied from that bucket. Either process dying mid-sync is an exception in the other
(``PeerGone``, within the crate's 10 ms liveness check once it waits); a receiver that lost a
sync midway skips that sync's remaining buckets at its next ``recv_into``.

The way a bucket goes, file by file. The trainer: this file (the plan, the header, the copies
into the slot on the trainer's stream) → the native ``Sender`` (``python/src/channel.rs``: the
stream read, the slot acquired and sent with the GIL released; the context from
``python/src/lib.rs``, errors mapped by ``python/src/errors.rs``) → the crate's channel, whose module docs count its
20 files for a send. The engine: this file (``recv_into``) → the native ``Receiver`` (the same
three files) → the crate's channel (the same 20 for a receive and release) → this file again
(the header parsed as untrusted, then the copies out): 24 files each way.
"""

from __future__ import annotations

import struct
from contextlib import nullcontext as _nullcontext
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ._native import Receiver, Sender

__all__ = ["WeightSender", "WeightReceiver", "Chunk", "Bucket", "plan_buckets", "SyncStats"]

#: Header layout: magic, version, flags (bit 0: last bucket of the sync), entry count, sync
#: number, bucket index; then one entry per chunk, in varints (LEB128): how many leading bytes
#: its name shares with the previous entry's, the rest of the name's length and bytes, the
#: dtype code and dimension count (a byte each), the dimensions, the byte start in the tensor,
#: the byte count, the byte offset in the bucket. A bucket of a typical model's weights holds
#: ~200 entries in 4 KiB.
_MAGIC = b"CIWS"
_VERSION = 1
_HEAD = struct.Struct("<4sBBHQI")
_LAST = 1
_MAX_DIMS = 8
_HEADER_BYTES = 4096
#: Every chunk starts on this many bytes in its bucket.
_ALIGN = 256
#: A tensor larger than a bucket is split; no chunk of it is made smaller than this to fill
#: the end of a bucket.
_MIN_CHUNK = 1 << 20

_DTYPE_NAMES = (
    "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float16", "bfloat16", "float32", "float64",
)


def _torch():
    import torch  # imported on first use: the package itself needs no torch

    return torch


def _dtype_codes():
    torch = _torch()
    codes = {}
    for i, name in enumerate(_DTYPE_NAMES):
        dt = getattr(torch, name, None)
        if dt is not None:
            codes[dt] = i + 1
    return codes


@dataclass(frozen=True)
class Chunk:
    """A byte range of one tensor in a bucket."""

    name: str
    dtype_code: int
    shape: Tuple[int, ...]
    start: int
    """Byte offset in the tensor."""
    nbytes: int
    offset: int
    """Byte offset in the bucket."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("a number past the header's end")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a number of more than 64 bits")


def _entry(prev: bytes, c: Chunk) -> bytes:
    """A chunk's header entry, its name coded against the previous entry's."""
    name = c.name.encode()
    shared = 0
    for x, y in zip(prev, name):
        if x != y:
            break
        shared += 1
    return b"".join(
        [_varint(shared), _varint(len(name) - shared), name[shared:], bytes([c.dtype_code, len(c.shape)])]
        + [_varint(d) for d in c.shape]
        + [_varint(c.start), _varint(c.nbytes), _varint(c.offset)]
    )


@dataclass
class Bucket:
    """What one channel item carries: chunks, the bytes they take (aligned), their header
    entries."""

    chunks: List[Chunk] = field(default_factory=list)
    nbytes: int = 0
    entries: List[bytes] = field(default_factory=list)
    header_len: int = _HEAD.size

    def entry_for(self, c: Chunk) -> bytes:
        return _entry(self.chunks[-1].name.encode() if self.chunks else b"", c)

    def add(self, c: Chunk, entry: Optional[bytes] = None) -> None:
        entry = self.entry_for(c) if entry is None else entry
        self.chunks.append(c)
        self.entries.append(entry)
        self.header_len += len(entry)
        self.nbytes = max(self.nbytes, c.offset + c.nbytes)

    def header(self, sync: int, index: int, last: bool) -> bytes:
        head = _HEAD.pack(_MAGIC, _VERSION, _LAST if last else 0, len(self.chunks), sync, index)
        return head + b"".join(self.entries)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def plan_buckets(
    tensors: Iterable[Tuple[str, object]], bucket_bytes: int
) -> List[Bucket]:
    """Split named tensors, in order, into buckets of at most ``bucket_bytes`` bytes whose
    headers fit in 4 KiB: a tensor goes whole into a bucket where it fits, and one larger than
    a bucket is split into bucket-sized chunks. Raises ``ValueError`` for a tensor that is not
    contiguous, of a dtype the header cannot name, of more than 8 dimensions, or with a name so
    long that no header holds it."""
    if bucket_bytes < _ALIGN:
        raise ValueError(f"bucket_bytes {bucket_bytes} is under {_ALIGN}")
    codes = _dtype_codes()
    buckets: List[Bucket] = []
    cur = Bucket()
    for name, t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"{name}: not contiguous (call .contiguous() first)")
        code = codes.get(t.dtype)
        if code is None:
            raise ValueError(f"{name}: dtype {t.dtype} is not one a header can carry")
        shape = tuple(int(d) for d in t.shape)
        if len(shape) > _MAX_DIMS:
            raise ValueError(f"{name}: {len(shape)} dimensions (at most {_MAX_DIMS})")
        total = t.numel() * t.element_size()
        start = 0
        while True:
            offset = _align(cur.nbytes)
            room = max(bucket_bytes - offset, 0)
            remaining = total - start
            # Close the bucket when the rest does not fit here and would fit a fresh bucket
            # whole (or too little room is left to be worth a chunk), or its header is full.
            if cur.chunks and remaining > room and (remaining <= bucket_bytes or room < _MIN_CHUNK):
                buckets.append(cur)
                cur = Bucket()
                continue
            n = min(remaining, room)
            if n < remaining:
                n -= n % 8  # chunk boundaries on whole words of every dtype
            chunk = Chunk(name, code, shape, start, n, offset)
            entry = cur.entry_for(chunk)
            if cur.header_len + len(entry) > _HEADER_BYTES:
                if not cur.chunks:
                    raise ValueError(f"{name}: a name of {len(name.encode())} bytes fits no header")
                buckets.append(cur)
                cur = Bucket()
                continue
            cur.add(chunk, entry)
            start += n
            if start >= total:
                break
    if cur.chunks:
        buckets.append(cur)
    return buckets


def _word(nbytes: int, *offsets: int):
    """The widest integer dtype whose size divides ``nbytes`` and every offset (callers pass
    every byte offset the reinterpreted views start at: in the bucket, in the tensor, and the
    tensor's own place in its storage and in memory — see ``_tensor_offsets``)."""
    torch = _torch()
    for size, dt in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if nbytes % size == 0 and all(o % size == 0 for o in offsets):
            return dt
    return torch.uint8


def _group(pairs: Sequence[Tuple[object, object]]) -> List[Tuple[list, list]]:
    """(dst, src) pairs grouped by dtype, for one multi-tensor copy per group."""
    groups: Dict[object, Tuple[list, list]] = {}
    for dst, src in pairs:
        d, s = groups.setdefault(dst.dtype, ([], []))
        d.append(dst)
        s.append(src)
    return list(groups.values())


def _copy(groups: List[Tuple[list, list]]) -> None:
    """One ``torch._foreach_copy_`` per group (a ``copy_`` per pair where torch has none)."""
    foreach = getattr(_torch(), "_foreach_copy_", None)
    for d, s in groups:
        if foreach is not None:
            foreach(d, s)
        else:
            for a, b in zip(d, s):
                a.copy_(b)


def _as_bools(byte_views: List[object]) -> None:
    """Make the bytes of received ``bool`` tensors 0 or 1 (each a uint8 view): they are the
    peer's bytes, and PyTorch's kernels assume nothing else of a ``bool`` (one clamp each)."""
    for b in byte_views:
        b.clamp_(max=1)


def _same_layout(t, dtype, shape) -> bool:
    """Whether ``t`` is a contiguous tensor of ``dtype`` and ``shape``: what a bucket's cached
    copies assume of each tensor, checked on both sides at every bucket (a tensor re-bound to
    a transposed view of the same storage keeps its address, dtype and square shape)."""
    return t.dtype == dtype and tuple(t.shape) == tuple(shape) and t.is_contiguous()


def _tensor_offsets(t) -> Tuple[int, int]:
    """Where a tensor's bytes start: its byte offset in its storage (what ``view(dtype)``
    checks: a view of one flat buffer, a ``chunk`` of a fused weight) and its address."""
    return t.storage_offset() * t.element_size(), t.data_ptr()


def _bytes_of(t):
    """A contiguous tensor's bytes, as a 1-D uint8 view (no copy)."""
    return t.detach().reshape(-1).view(_torch().uint8)


@dataclass
class SyncStats:
    """What one sync moved."""

    sync: int
    buckets: int
    tensors: int
    nbytes: int
    skipped: int = 0
    """Buckets of an interrupted earlier sync that the receiver discarded first."""


def _current_stream(stream):
    return _torch().cuda.current_stream() if stream is None else stream


def _stream_context(stream):
    """Make ``stream`` torch's current stream (its copies go there); ``None`` leaves the
    current stream as it is (entering ``torch.cuda.stream`` costs ~20 µs, even for the
    stream that is already current)."""
    if stream is None:
        return _nullcontext()
    return _torch().cuda.stream(stream)


def _raw(stream) -> int:
    """The ``CUstream`` of a ``torch.cuda.Stream``."""
    return stream.cuda_stream


def _stream_handle(stream) -> int:
    """The ``CUstream`` of ``stream``, or of torch's current stream if it is ``None`` — read
    without making a ``torch.cuda.Stream`` (``torch._C._cuda_getCurrentRawStream``, what
    torch's own generated code calls, where this torch has it: ~1 µs instead of ~8)."""
    if stream is not None:
        return _raw(stream)
    torch = _torch()
    current = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if current is None:
        return _raw(torch.cuda.current_stream())
    return current(torch.cuda.current_device())


class WeightSender:
    """The trainer's end: a channel of ``slots`` buckets of ``bucket_bytes`` bytes (one
    allocation, made once), for one engine or — with ``consumers`` > 1 — up to 8 (a broadcast:
    each bucket is filled once and read by every engine)."""

    def __init__(self, ctx, *, bucket_bytes: int = 512 << 20, slots: int = 4, consumers: int = 1):
        self._tx = Sender(ctx, bucket_bytes, slots=slots, consumers=consumers)
        self.bucket_bytes = bucket_bytes
        self._plan_key = None
        self._plan: List[Bucket] = []
        self._views: Dict[tuple, tuple] = {}
        self._headers: List[bytes] = []
        self._sync = 0

    def handle(self) -> bytes:
        """The bytes an engine opens the channel with (``WeightReceiver(ctx, handle)``)."""
        return self._tx.handle()

    @property
    def sender(self) -> Sender:
        """The underlying channel end."""
        return self._tx

    def plan(self, state_dict: Mapping[str, object]) -> List[Bucket]:
        """The buckets ``state_dict`` is sent in: made again when its names (in order) differ
        from the last sync's; each bucket checks its own tensors' dtypes and shapes as it is
        filled (a per-sync check of all of them, before the first bucket, would cost the GPU
        milliseconds of idle)."""
        key = tuple(state_dict)
        if key != self._plan_key:
            self._plan = plan_buckets(state_dict.items(), self.bucket_bytes)
            self._plan_key = key
            self._views.clear()
            last = len(self._plan) - 1
            self._headers = [b.header(0, i, i == last) for i, b in enumerate(self._plan)]
        return self._plan

    def send(
        self, state_dict: Mapping[str, object], *, stream=None, timeout: float = 30.0
    ) -> SyncStats:
        """Send every tensor of ``state_dict`` (contiguous CUDA tensors on the channel's
        device), packed on ``stream`` (default: the current stream), which must be the stream
        that last wrote them or one ordered after it. Returns once every bucket is enqueued;
        later writes to the weights on that stream queue behind the packing."""
        torch = _torch()
        stream = _current_stream(stream)
        plan = self.plan(state_dict)
        self._sync += 1
        sync = self._sync
        views = self._views
        dtypes = {code: dt for dt, code in _dtype_codes().items()}
        nbytes = 0
        with _stream_context(stream):
            for i, bucket in enumerate(plan):
                template = self._headers[i]
                header = template[:8] + struct.pack("<Q", sync) + template[16:]

                def fill(slot, i=i, bucket=bucket):
                    # The copies' views, made once per (bucket, slot) and kept while the
                    # weights stay where they were (a view keeps its storage alive, so the
                    # same address is the same storage).
                    srcs = [state_dict[c.name] for c in bucket.chunks]
                    for c, t in zip(bucket.chunks, srcs):
                        if not _same_layout(t, dtypes[c.dtype_code], c.shape):
                            self._plan_key = None  # the next sync plans again
                            layout = "" if t.is_contiguous() else " (not contiguous)"
                            raise ValueError(
                                f"{c.name}: {t.dtype}{list(t.shape)}{layout} where the plan (made "
                                f"at an earlier sync) has {dtypes[c.dtype_code]}{list(c.shape)}; "
                                f"buckets 0..{i - 1} of sync {sync} were sent (the engine drops "
                                f"them when the next sync begins)"
                            )
                    ptrs = tuple(t.data_ptr() for t in srcs)
                    key = (i, slot.data_ptr)
                    hit = views.get(key)
                    if hit is None or hit[0] != ptrs:
                        buf = torch.from_dlpack(slot)
                        pairs = []
                        for c, t in zip(bucket.chunks, srcs):
                            word = _word(c.nbytes, c.offset, c.start, *_tensor_offsets(t))
                            src = _bytes_of(t)[c.start : c.start + c.nbytes].view(word)
                            pairs.append((buf[c.offset : c.offset + c.nbytes].view(word), src))
                        hit = views[key] = (ptrs, _group(pairs))
                    _copy(hit[1])
                    return bucket.nbytes

                self._tx.send(fill, header=header, stream=_raw(stream), timeout=timeout)
                nbytes += sum(c.nbytes for c in bucket.chunks)
        return SyncStats(sync, len(plan), len(state_dict), nbytes)

    def close(self, timeout: float = 30.0) -> None:
        """Close the channel: engines receive what was sent, then ``ChannelClosed``; waits
        (at most ``timeout`` seconds) until every engine closed its end or died."""
        self._views.clear()  # views of the slots keep the channel mapped
        self._tx.close(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _parse(header: bytes, item_len: int):
    """Header bytes from the other process → (flags, sync, index, chunks); ``ValueError`` for
    anything malformed."""
    if len(header) < _HEAD.size:
        raise ValueError(f"a weight-sync header of {len(header)} bytes")
    magic, version, flags, count, sync, index = _HEAD.unpack_from(header, 0)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a weight-sync header (magic {magic!r}, version {version})")
    pos = _HEAD.size
    chunks = []
    prev = b""
    try:
        for _ in range(count):
            shared, pos = _read_varint(header, pos)
            n, pos = _read_varint(header, pos)
            if shared > len(prev) or pos + n > len(header):
                raise ValueError("a name past the header's end")
            raw = prev[:shared] + header[pos : pos + n]
            pos += n
            name = raw.decode()
            prev = raw
            if pos + 2 > len(header):
                raise ValueError(f"{name}: its entry past the header's end")
            code, ndim = header[pos], header[pos + 1]
            pos += 2
            if not 1 <= code <= len(_DTYPE_NAMES) or ndim > _MAX_DIMS:
                raise ValueError(f"{name}: dtype code {code}, {ndim} dimensions")
            shape = []
            for _ in range(ndim):
                d, pos = _read_varint(header, pos)
                shape.append(d)
            start, pos = _read_varint(header, pos)
            nbytes, pos = _read_varint(header, pos)
            offset, pos = _read_varint(header, pos)
            if offset + nbytes > item_len:
                raise ValueError(
                    f"{name}: bytes {offset}..{offset + nbytes} of a bucket of {item_len}"
                )
            chunks.append(Chunk(name, code, tuple(shape), start, nbytes, offset))
    except UnicodeDecodeError as e:
        raise ValueError(f"a malformed weight-sync header: {e}") from None
    if pos != len(header):
        raise ValueError(f"{len(header) - pos} bytes after the header's last entry")
    return flags, sync, index, chunks


class WeightReceiver:
    """The engine's end, opened from the trainer's ``WeightSender.handle()`` bytes."""

    def __init__(self, ctx, handle: bytes):
        self._rx = Receiver(ctx, handle)
        self._codes = None
        self._views: Dict[tuple, tuple] = {}

    @property
    def receiver(self) -> Receiver:
        """The underlying channel end."""
        return self._rx

    def recv_into(
        self,
        weights,
        *,
        stream=None,
        strict: bool = True,
        timeout: float = 30.0,
    ) -> SyncStats:
        """Receive one sync into ``weights`` (a name → tensor mapping, such as
        ``model.state_dict()``, or a ``torch.nn.Module``), copying on ``stream`` (default: the
        current stream), whose later work sees the new weights. Returns when every bucket's
        copies are enqueued. With ``strict``, a name the trainer sent that ``weights`` lacks,
        or one of ``weights`` the sync did not carry, is a ``ValueError``; a dtype or shape
        that differs always is (before anything of that bucket is copied)."""
        torch = _torch()
        if isinstance(weights, torch.nn.Module):
            weights = weights.state_dict()
        stream = _current_stream(stream)
        seen = set()
        state = {"sync": None, "next": 0, "last": False, "skipped": 0, "bytes": 0}

        def unpack(item, header):
            flags, sync, index, plan = self._plan_of(bytes(header), item, weights, strict)
            if state["sync"] is None:
                if index != 0:
                    state["skipped"] += 1  # the rest of a sync this receiver lost midway
                    return
                state["sync"] = sync
            elif index == 0 and sync != state["sync"]:
                # The trainer abandoned the sync midway (its send raised): this one replaces it.
                state.update(sync=sync, next=0, bytes=0, skipped=state["skipped"] + state["next"])
                seen.clear()
            elif sync != state["sync"] or index != state["next"]:
                raise ValueError(
                    f"bucket {index} of sync {sync} where bucket {state['next']} of sync "
                    f"{state['sync']} was due"
                )
            _, names, nbytes, (groups, bools), _ = plan
            _copy(groups)
            _as_bools(bools)
            seen.update(names)
            state["bytes"] += nbytes
            state["next"] = index + 1
            state["last"] = bool(flags & _LAST)

        with _stream_context(stream):
            while not state["last"]:
                self._rx.recv(unpack, stream=_raw(stream), timeout=timeout)
        if strict and len(seen) != len(weights):
            missing = [n for n in weights if n not in seen]
            raise ValueError(f"the sync did not carry {len(missing)} tensor(s): {missing[:5]}")
        return SyncStats(state["sync"], state["next"], len(seen), state["bytes"], state["skipped"])

    def _plan_of(self, header: bytes, item, weights, strict: bool):
        """The parsed header and the copies' views for a bucket: made once per (header
        layout, slot, ``strict``) and reused while every receiving tensor is where it was, with
        its dtype and shape (a view keeps its storage alive, so the same address is the same
        storage), and every name the plan skipped (``strict=False``) is still absent from
        ``weights`` — everything the plan depends on."""
        torch = _torch()
        if len(header) < _HEAD.size:
            raise ValueError(f"a weight-sync header of {len(header)} bytes")
        (sync,) = struct.unpack_from("<Q", header, 8)
        key = (header[:8], header[16:], item.data_ptr, item.nbytes, strict)
        hit = self._views.get(key)
        if hit is not None:
            flags, index, plan = hit
            checks, skipped = plan[0], plan[4]
            if all(
                (t := weights.get(n)) is not None
                and t.data_ptr() == p
                and _same_layout(t, dt, shape)
                for n, p, dt, shape in checks
            ) and not any(n in weights for n in skipped):
                return flags, sync, index, plan
        if self._codes is None:
            self._codes = {code: dt for dt, code in _dtype_codes().items()}
        flags, sync, index, chunks = _parse(header, item.nbytes)
        buf = torch.from_dlpack(item) if chunks else None
        pairs, checks, names, skipped, bools, nbytes = [], [], [], [], [], 0
        for c in chunks:
            t = weights.get(c.name)
            if t is None:
                if strict:
                    raise ValueError(f"{c.name}: sent by the trainer, not in the weights")
                skipped.append(c.name)
                continue
            if self._codes.get(c.dtype_code) != t.dtype or tuple(t.shape) != c.shape:
                raise ValueError(
                    f"{c.name}: the trainer sent {_DTYPE_NAMES[c.dtype_code - 1]}"
                    f"{list(c.shape)}, the weights hold {t.dtype}{list(t.shape)}"
                )
            if not t.is_contiguous():
                raise ValueError(f"{c.name}: the receiving tensor is not contiguous")
            whole = t.numel() * t.element_size()
            if c.start + c.nbytes > whole:
                raise ValueError(
                    f"{c.name}: bytes {c.start}..{c.start + c.nbytes} of a tensor of {whole}"
                )
            word = _word(c.nbytes, c.offset, c.start, *_tensor_offsets(t))
            dst = _bytes_of(t)[c.start : c.start + c.nbytes].view(word)
            pairs.append((dst, buf[c.offset : c.offset + c.nbytes].view(word)))
            if t.dtype == torch.bool:
                bools.append(_bytes_of(t)[c.start : c.start + c.nbytes])
            checks.append((c.name, t.data_ptr(), t.dtype, t.shape))
            names.append(c.name)
            nbytes += c.nbytes
        plan = (checks, names, nbytes, (_group(pairs), bools), skipped)
        if len(self._views) > 4096:
            self._views.clear()  # a bound on what stale layouts can hold
        self._views[key] = (flags, index, plan)
        return flags, sync, index, plan

    def close(self, timeout: float = 30.0) -> None:
        """Close the receiver (the trainer's next send raises ``ChannelClosed``)."""
        self._views.clear()  # views of the slots keep the channel mapped
        self._rx.close(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
