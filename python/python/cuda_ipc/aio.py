"""``asyncio`` waits for the package's sockets and channel receivers: the task awaits, not a
thread, and the event loop keeps running.

Each object has a non-blocking call (``try_recv``, ``try_accept``) and a descriptor
(``fileno()``) that turns readable when that call may find something; these helpers watch the
descriptor with ``loop.add_reader`` and call it again. Every helper is cancel-safe: cancelled
(``asyncio.wait_for``, ``asyncio.timeout``), it has taken nothing — the next call gets the same
message, connection or item. None has a time limit of its own: bound it with asyncio's; a
peer that closes or dies ends it with ``PeerClosed`` / ``PeerGone``.

.. code-block:: python

    import asyncio, cuda_ipc
    from cuda_ipc import aio

    async def serve(listener):
        sock = await aio.accept(listener)
        while True:
            msg = await asyncio.wait_for(aio.recv(sock), 30)
            ...
"""

import asyncio
from typing import Any, Callable, Optional, TypeVar

_R = TypeVar("_R")

__all__ = ["accept", "recv", "recv_item", "readable"]


async def readable(fd: int) -> None:
    """Return once ``fd`` is readable (or hung up)."""
    loop = asyncio.get_running_loop()
    ready: "asyncio.Future[None]" = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _until(fd: int, attempt: Callable[[], Optional[_R]]) -> _R:
    """``attempt()`` until it finds something (not ``None``), awaiting ``fd`` between tries."""
    while True:
        found = attempt()
        if found is not None:
            return found
        await readable(fd)


async def recv(socket: Any) -> bytes:
    """The next message of ``socket`` (a ``cuda_ipc.Socket``)."""
    return await _until(socket.fileno(), socket.try_recv)


async def accept(listener: Any) -> Any:
    """The next peer of ``listener`` (a ``cuda_ipc.Listener``), as a ``cuda_ipc.Socket``."""
    return await _until(listener.fileno(), listener.try_accept)


async def recv_item(
    receiver: Any, use: Callable[[Any, bytes], _R], *, stream: Optional[Any] = None
) -> _R:
    """The next item of ``receiver`` (a ``cuda_ipc.Receiver``), handed to ``use(item,
    header)`` as ``Receiver.recv`` does; what ``use`` returned."""
    def attempt() -> Optional[list]:
        # ``try_recv`` returns None only when nothing was there; ``use`` may return None too.
        got: list = []
        receiver.try_recv(lambda item, header: got.append(use(item, header)), stream=stream)
        return got or None

    found = await _until(receiver.fileno(), attempt)
    return found[0]
