"""Weight sync with no staging copy: the engine copies straight out of the trainer's own tensors.

:mod:`cuda_ipc.weights` packs a model into buckets of a ring and unpacks them: two copies of
every byte, done by two processes — which one GPU time-slices between their contexts. Here the
trainer shares its weights once (``Socket.send_tensor``: PyTorch's own memory, legacy handles or
expandable segments' chunks, no copy), and each sync is one small channel item: the engine's
stream waits on the GPU for the trainer's update, copies every tensor out of the trainer's
memory into its own with one multi-tensor copy per dtype, and releases; the trainer's next
update waits on the GPU for that release before it writes the weights again. One copy of every
byte, all of it in the engine's context.

::

    # trainer
    ctx = cuda_ipc.Context(0)
    peer = cuda_ipc.Listener("weights").accept()
    sender = cuda_ipc.shared_weights.SharedWeightSender(ctx, model.state_dict(), peer)
    for batch in data:
        model(batch).sum().backward()
        sender.update(optimizer.step)     # waits for the engine's last read, steps, publishes

    # engine
    ctx = cuda_ipc.Context(0)
    receiver = cuda_ipc.shared_weights.SharedWeightReceiver(ctx, cuda_ipc.connect("weights"))
    weights = model.state_dict()
    while True:
        receiver.pull_into(weights)       # one version, on the current stream

The two run in lockstep: every version the trainer publishes is pulled once before the next
``update`` runs its step (``update`` waits at most ``timeout`` for it). The trainer's tensors
must stay where they were shared: ``update`` checks, after ``step``, that every one still has
its address and is contiguous (pass ``state_dict=`` to have the model's current tensors checked
too). The check runs on the host while the engine's copies already run on the GPU — it costs
~0.3 µs per tensor, which would otherwise delay every sync —, and its verdict follows each
version over the setup socket: ``pull_into`` returns only once the trainer confirmed the
version, and raises ``ValueError`` (as ``update`` does) if a tensor had moved — the weights
then hold an unknown mix of old and new bytes, and both ends refuse further versions: share
again. The socket belongs to the pair from then on. Every byte from the peer is untrusted: the
setup's names and counts are checked, and each tensor's dtype and shape against the engine's
before its first pull into those tensors (and whenever they are other tensor objects). Either process
dying is an exception in the other (``PeerGone``); the engine's mappings of the trainer's
tensors keep virtual memory (expandable segments) alive after the trainer's death; a dead
trainer's legacy handles are never read after its death is seen (the pull fails first).

Where either side can die (SIGKILL, a crash) and what the other then sees. A forked child acts
for neither: the channel ends it inherits refuse use there (their context is the parent's);
the socket is an ordinary descriptor, which a child must leave to its parent (a verdict read
or sent by it would be taken from or added to the pair's stream).

=========================================  =================================================
trainer dies ...                            engine
=========================================  =================================================
during the setup                            ``SharedWeightReceiver(...)``: ``PeerClosed`` (the
                                            socket's end of file), or ``PeerGone`` (role
                                            ``exporter``) from opening the channel or a tensor
                                            of the dead trainer; what it had mapped is let go
before publishing version v                 ``pull_into`` of v: ``PeerGone`` (role
                                            ``exporter``), within the channel's death check
after publishing v, before its verdict      ``pull_into`` of v: its copies are enqueued, then
                                            the verdict's receive is ``PeerClosed`` (the
                                            socket's end-of-file); the verdict stays due, so
                                            every later pull is ``PeerClosed`` before it
                                            copies anything
after the verdict                           ``pull_into`` of v returns; the next is
                                            ``PeerGone``
=========================================  =================================================

A pull that gives up between its copies and their verdict — its ``timeout`` ran out (a
descheduled trainer, a short poll), or an exception interrupted it — leaves the verdict due:
the next ``pull_into`` reads it before anything else, then pulls the next version as usual; if
it still has not come, that call raises ``Timeout`` again having copied nothing. A verdict that
is not the due version's confirmation ends the receiver (``ValueError``, then on every pull).

A trainer killed after publishing v on the host but before its GPU wrote v's signal leaves the
stream of the pull of v waiting on the GPU (the channel's rule: its host waits notice a dead
peer, a GPU wait cannot): after either exception, ``close`` the receiver — it releases that
wait and then synchronises — before using that stream again.

=========================================  =================================================
engine dies ...                             trainer
=========================================  =================================================
during the setup                            ``SharedWeightSender(...)``: ``PeerClosed`` (a send
                                            refused, or the end of file where the engine's
                                            answer was due) — never an ``update`` that waits
                                            for an engine that never attached
before or during ``pull_into`` of v         ``update`` v + 1 waits for v's slot: ``PeerGone``
                                            (role ``importer``); a verdict its socket refused
                                            (``EPIPE``) is not ``update`` v's error (a second
                                            in a row is ``PeerClosed``)
with v's copies in flight                   as above; the trainer's stream holds no wait
                                            for v's release (``update`` v + 1 fails on the
                                            host before it would enqueue one)
=========================================  =================================================
"""

from __future__ import annotations

import operator
import struct
from typing import Dict, List, Mapping, Optional, Tuple

from ._native import PeerClosed, Receiver, Sender
from .weights import (
    SyncStats,
    _copy,
    _group,
    _same_layout,
    _stream_context,
    _stream_handle,
    _torch,
)

__all__ = ["SharedWeightSender", "SharedWeightReceiver"]

#: The setup's first message: magic, version, the number of tensors.
_SETUP = struct.Struct("<4sB3xI")
_SETUP_MAGIC = b"CISW"
_VERSION = 2
#: The setup's answer (engine to trainer, once every tensor is mapped and the channel open):
#: magic, the number of tensors mapped.
_READY = struct.Struct("<4sxxxxQ")
_READY_MAGIC = b"CISR"
#: Each version's item header: magic, version number.
_ITEM = struct.Struct("<4sxxxxQ")
_ITEM_MAGIC = b"CISV"
#: Each version's verdict (over the setup socket, after the item): magic, version number; a
#: refusal's magic is followed by its reason (UTF-8, at most _MAX_REASON bytes).
_VERDICT = struct.Struct("<4sxxxxQ")
_CONFIRMED, _REFUSED = b"CISC", b"CISX"
_MAX_REASON = 1024
#: At most this many tensors are shared (a bound on what a peer's count can make us wait for).
_MAX_TENSORS = 1 << 20
#: A tensor's name message: this byte, then the name (UTF-8); a tensor follows it
#: (``Socket.send_tensor``) unless the tensor is empty (nothing to share).
_HAS_MEMORY, _EMPTY = 1, 0


class SharedWeightSender:
    """The trainer's end: shares the tensors of ``state_dict`` (contiguous CUDA tensors on
    ``ctx``'s device, as PyTorch allocated them) with one engine over ``peer``, once; then
    publishes each version with :meth:`update`. Returns once the engine answered that it holds
    the channel and mapped every tensor (each wait at most ``timeout``): ``PeerClosed`` if its
    end of ``peer`` closed first (it died, or refused the setup), ``Timeout`` if it never
    answered, ``ValueError`` for an answer that is not one."""

    def __init__(self, ctx, state_dict: Mapping[str, object], peer, *, timeout: float = 30.0):
        items = list(state_dict.items())
        if len(items) > _MAX_TENSORS:
            raise ValueError(f"{len(items)} tensors (at most {_MAX_TENSORS})")
        for name, t in items:
            if not t.is_contiguous():  # (CPU memory is refused by send_tensor)
                raise ValueError(f"{name}: not contiguous (call .contiguous())")
        self._tx = Sender(ctx, 256, slots=1)
        peer.send(_SETUP.pack(_SETUP_MAGIC, _VERSION, len(items)), timeout)
        peer.send(self._tx.handle(), timeout)
        for name, t in items:
            flag = _HAS_MEMORY if t.numel() else _EMPTY
            peer.send(bytes([flag]) + name.encode(), timeout)
            if flag == _HAS_MEMORY:
                peer.send_tensor(ctx, t, timeout)
        # The engine's answer: it holds the channel's consumer end (so its death is seen by
        # `update`) and mapped every tensor.
        magic, mapped = _unpack(_READY, peer.recv(timeout), "setup answer")
        if magic != _READY_MAGIC or mapped != len(items):
            raise ValueError(f"a setup answer of {mapped} tensors for {len(items)} (magic {magic!r})")
        # What the engine mapped: these objects (held, so their memory stays allocated), at
        # these addresses.
        self._names = [name for name, _ in items]
        self._tensors = [t for _, t in items]
        self._ptrs = tuple(t.data_ptr() for t in self._tensors)
        self._peer = peer
        self._version = 0
        #: Why this sender publishes no more (a shared tensor moved), once one did.
        self._refused: Optional[str] = None
        #: The last verdict could not be sent (see `_send_verdict`).
        self._verdict_lost = False

    @property
    def version(self) -> int:
        """The last version published (0: none yet)."""
        return self._version

    def update(
        self, step=None, *, state_dict=None, stream=None, timeout: float = 30.0
    ) -> int:
        """Publish a new version of the weights: wait (on the host for the engine's pull of the
        last version to be enqueued, on ``stream``'s GPU queue for its copies to finish), run
        ``step()`` — the optimizer step, writing the weights on ``stream`` (default: the current
        stream) —, publish on ``stream``, then check that every shared tensor is where it was
        and contiguous and tell the engine (see the module docs). Pass ``state_dict`` (the
        model's, now) to have its tensors' addresses checked too: a parameter re-bound to new
        memory (``p.data = ...``) is then an error instead of an engine reading the old memory,
        which these tensors keep. Returns the version number; ``ValueError`` if a tensor moved
        (the engine's pull of this version raises too, and this sender publishes no more)."""
        if self._refused is not None:
            raise ValueError(f"this sender publishes no more ({self._refused})")
        version = self._version + 1
        header = _ITEM.pack(_ITEM_MAGIC, version)
        raw = _stream_handle(stream)
        if step is None:
            self._tx.send(_nothing, header=header, stream=raw, timeout=timeout)
        else:

            def fill(slot):
                step()
                return 0

            # `step` writes on `stream`: make it torch's current one (it is, unless passed).
            with _stream_context(stream):
                self._tx.send(fill, header=header, stream=raw, timeout=timeout)
        self._version = version
        # Checked while the engine's copies run; the engine's pull waits for the verdict.
        moved = self._moved(state_dict)
        if moved is None:
            self._send_verdict(_VERDICT.pack(_CONFIRMED, version), timeout)
            return version
        self._refused = moved
        reason = moved.encode()[:_MAX_REASON]
        self._send_verdict(_VERDICT.pack(_REFUSED, version) + reason, timeout)
        raise ValueError(moved)

    def _send_verdict(self, verdict: bytes, timeout: float) -> None:
        """Send a verdict. One the engine's socket refuses (``PeerClosed``) is not this
        update's error: the engine died — the next ``update`` is ``PeerGone``, which names it —
        or closed the socket, and its pull failed on its own; a second in a row is raised."""
        try:
            self._peer.send(verdict, timeout)
        except PeerClosed:
            if self._verdict_lost:
                raise
            self._verdict_lost = True
        else:
            self._verdict_lost = False

    def _moved(self, state_dict) -> Optional[str]:
        """Why a shared tensor is not where the engine reads it, if one is not: every shared
        tensor still at its address and contiguous (what the engine's copies assume of the
        memory it maps); ``state_dict``'s tensors, if given, at the same addresses. One pass of
        C-level calls: ~0.3 ms for 2,000 tensors."""
        tensor = _torch().Tensor
        now = tuple(map(tensor.data_ptr, self._tensors))
        ok = now == self._ptrs and all(map(tensor.is_contiguous, self._tensors))
        if ok and state_dict is not None:
            try:
                ok = tuple(state_dict[n].data_ptr() for n in self._names) == self._ptrs
            except KeyError as e:
                return f"{e.args[0]}: shared, and not in the state_dict"
        if ok:
            return None
        for name, t, ptr in zip(self._names, self._tensors, self._ptrs):
            s = t if state_dict is None else state_dict[name]
            if t.data_ptr() != ptr or s.data_ptr() != ptr or not t.is_contiguous():
                return (
                    f"{name}: moved or no longer contiguous since it was shared (the engine maps "
                    f"its old memory); share the weights again with a new SharedWeightSender"
                )
        return "a shared tensor moved"  # (not reached: some tensor differs)

    def close(self, timeout: float = 30.0) -> None:
        """Close: waits (at most ``timeout``) until the engine closed its end or died, then lets
        go of the weights."""
        self._tx.close(timeout)
        self._tensors = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SharedWeightReceiver:
    """The engine's end: maps the trainer's tensors once (over ``peer``, a :class:`Socket`
    connected to the trainer) and answers the setup — the trainer's constructor returns then —,
    then copies each version out of them with :meth:`pull_into`. ``PeerClosed`` or
    ``PeerGone`` (the exporter) if the trainer died during the setup (what was mapped is let
    go), ``ValueError`` for a setup that is not one."""

    def __init__(self, ctx, peer, *, timeout: float = 30.0):
        torch = _torch()
        magic, version, count = _unpack(_SETUP, peer.recv(timeout), "setup message")
        if magic != _SETUP_MAGIC or version != _VERSION:
            raise ValueError(f"not a shared-weights setup (magic {magic!r}, version {version})")
        if count > _MAX_TENSORS:
            raise ValueError(f"a setup of {count} tensors (at most {_MAX_TENSORS})")
        self._rx = Receiver(ctx, peer.recv(timeout))
        self._sources: Dict[str, Optional[object]] = {}
        for _ in range(count):
            message = peer.recv(timeout)
            if not message:
                raise ValueError("an empty tensor name message")
            flag = message[0]
            try:
                name = message[1:].decode()
            except UnicodeDecodeError:
                raise ValueError("a tensor name that is not UTF-8") from None
            if flag not in (_HAS_MEMORY, _EMPTY) or name in self._sources:
                raise ValueError(f"{name!r}: flag {flag}, or shared twice")
            tensor = None
            if flag == _HAS_MEMORY:
                tensor = torch.from_dlpack(peer.recv_tensor(ctx, timeout))
            self._sources[name] = tensor
        peer.send(_READY.pack(_READY_MAGIC, count), timeout)
        self._names = list(self._sources)
        self._plan: Optional[Tuple[list, list, int]] = None
        self._peer = peer
        self._version = 0
        #: Why this receiver pulls no more (the trainer refused a version), once it did.
        self._refused: Optional[str] = None
        #: The version whose copies were enqueued and whose verdict has not been read yet (a
        #: pull that timed out or failed waiting for it): the next pull reads it first.
        self._verdict_due: Optional[int] = None

    @property
    def names(self) -> List[str]:
        """The names the trainer shared, in its order."""
        return list(self._sources)

    def _check(self, weights: Mapping[str, object]):
        """The copies for ``weights``: every shared name must be there, contiguous, of the
        trainer's dtype and shape (an empty tensor empty). Checked in full whenever ``weights``
        holds other tensor objects than the last pull's (the same objects cost one identity
        pass: ~0.09 ms for 2,000 tensors when ``weights`` holds just the shared names in the
        trainer's order, ~0.13 ms otherwise); the copies write into those objects, so
        a change made to one in place since (``t.data = ...``, a resize) is torch's to handle
        (``copy_`` semantics: a shape it cannot copy is an error, a dtype is converted)."""
        if self._plan is not None:
            targets = self._plan[0]
            if len(weights) == len(targets) and list(weights) == self._names:
                # The shared names, in order (`==` on the same str objects is an identity test).
                same = all(map(operator.is_, weights.values(), targets))
            else:
                try:
                    same = all(map(operator.is_, map(weights.__getitem__, self._names), targets))
                except KeyError:
                    same = False
            if same:
                return self._plan
        targets, pairs, bools, nbytes = [], [], [], 0
        for name, src in self._sources.items():
            t = weights.get(name)
            if t is None:
                raise ValueError(f"{name}: shared by the trainer, not in the weights")
            targets.append(t)
            if src is None:
                if t.numel() != 0:
                    raise ValueError(f"{name}: empty in the trainer, {list(t.shape)} here")
                continue
            if not _same_layout(t, src.dtype, src.shape):
                raise ValueError(
                    f"{name}: the trainer shares {src.dtype}{list(src.shape)}, the weights hold "
                    f"{t.dtype}{list(t.shape)}" + ("" if t.is_contiguous() else " (not contiguous)")
                )
            if src.dtype == _torch().bool:
                # The trainer's bytes: PyTorch assumes 0 or 1 of a bool, so compare, not copy.
                bools.append((t, src.view(_torch().uint8)))
            else:
                pairs.append((t, src))
            nbytes += src.numel() * src.element_size()
        self._plan = (targets, (_group(pairs), bools), nbytes)
        return self._plan

    def pull_into(
        self, weights: Mapping[str, object], *, stream=None, timeout: float = 30.0
    ) -> SyncStats:
        """Copy the trainer's next version into ``weights`` on ``stream`` (default: the current
        stream), which waits on the GPU for the trainer's update and then for nothing else;
        returns once the copies are enqueued and the trainer confirmed the version (see the
        module docs: ``ValueError`` if it refused it — a tensor of its had moved, and
        ``weights`` now hold an unknown mix). ``weights`` is checked first (see the class).
        A verdict an earlier pull left due (it timed out waiting) is read before anything is
        copied: ``Timeout`` if it still does not come within ``timeout``."""
        if self._refused is not None:
            raise ValueError(f"this receiver pulls no more ({self._refused})")
        if self._verdict_due is not None:
            # The last pull enqueued its copies and gave up waiting for their verdict: read it
            # before anything else (a Timeout again copies nothing and leaves it due).
            self._take_verdict(self._verdict_due, timeout)
        _, groups, nbytes = self._check(weights)
        raw = _stream_handle(stream)
        last = self._version

        def use(item, header):
            try:
                magic, version = _unpack(_ITEM, header, "version header")
                if magic != _ITEM_MAGIC or version != last + 1:
                    raise ValueError(f"version {version} after {last} (magic {magic!r})")
            except ValueError as e:
                self._refused = str(e)  # out of step with the trainer: no later pull can be
                raise
            # The item is this version's: from here its verdict is due until read, whatever
            # interrupts this call (a failed copy, a Timeout waiting for the verdict, a
            # signal's exception).
            self._version = version
            self._verdict_due = version
            copies, bools = groups
            _copy(copies)
            ne = _torch().ne
            for t, raw in bools:
                ne(raw, 0, out=t)
            return version

        # The copies go to torch's current stream: `stream`'s, made current if it was passed.
        with _stream_context(stream):
            version = self._rx.recv(use, stream=raw, timeout=timeout)
        self._take_verdict(version, timeout)
        return SyncStats(version, 1, len(self._sources), nbytes)

    def _take_verdict(self, version: int, timeout: float) -> None:
        """Read the trainer's verdict on ``version`` (due, see ``_verdict_due``). Until one
        arrives it stays due (the socket's ``Timeout`` or ``PeerClosed`` is raised); once
        read, it is no longer due, and one that is not a confirmation of ``version`` ends
        this receiver (``ValueError``, as every later pull): the pair's stream of verdicts
        cannot be trusted after it."""
        verdict = self._peer.recv(timeout)
        self._verdict_due = None
        try:
            if len(verdict) < _VERDICT.size or len(verdict) > _VERDICT.size + _MAX_REASON:
                raise ValueError(f"a verdict of {len(verdict)} bytes")
            magic, number = _VERDICT.unpack(verdict[: _VERDICT.size])
            if number != version or magic not in (_CONFIRMED, _REFUSED):
                raise ValueError(
                    f"a verdict on version {number} (magic {magic!r}) after {version}"
                )
            if magic == _REFUSED:
                reason = verdict[_VERDICT.size :].decode("utf-8", "replace")
                raise ValueError(
                    f"the trainer refused version {version}: {reason} — the weights hold an "
                    f"unknown mix of versions; share again"
                )
            if len(verdict) != _VERDICT.size:
                raise ValueError(f"a confirmation of {len(verdict)} bytes")
        except ValueError as e:
            self._refused = str(e)
            raise

    def close(self, timeout: float = 30.0) -> None:
        """Close the receiver (the trainer's next ``update`` raises ``ChannelClosed``) and let
        go of the trainer's tensors, once the device has finished every copy out of them (a
        device-wide synchronize: a pull's copies may be on any stream). A receiver dropped
        without ``close`` is safe too: the trainer's memory is unmapped only after the GPU has
        finished the copies queued on it (see ``cuda_ipc.wait_released``); ``close`` tells the
        trainer at once."""
        self._plan = None
        self._rx.close(timeout)
        _synchronize()
        self._sources = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _nothing(slot) -> int:
    """A version's fill when there is no step: nothing written in the slot."""
    return 0


def _synchronize() -> None:
    """Wait for the device's queued work (the host tests stand in for it)."""
    _torch().cuda.synchronize()


def _unpack(layout: struct.Struct, data: bytes, what: str):
    if len(data) != layout.size:
        raise ValueError(f"a {what} of {len(data)} bytes (expected {layout.size})")
    return layout.unpack(data)
