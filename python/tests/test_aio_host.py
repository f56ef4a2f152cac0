"""The asyncio waits (``cuda_ipc.aio``) on sockets, without a GPU: messages arrive whole and in
order while the event loop keeps running other tasks, a cancelled wait takes nothing, a
peer's close ends a wait, and the GIL is free while a peer thread sends."""

import asyncio
import threading

import pytest

import cuda_ipc
from cuda_ipc import aio
from conftest import unique


def test_accept_and_recv_are_awaited_while_the_loop_runs_other_tasks():
    name = unique("aio")
    listener = cuda_ipc.Listener(name)

    def peer():
        s = cuda_ipc.connect(name, timeout=10)
        for i in range(200):
            s.send(i.to_bytes(4, "little"))
        s.recv(timeout=10)

    t = threading.Thread(target=peer)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        t.start()
        s = await asyncio.wait_for(aio.accept(listener), 10)
        got = [int.from_bytes(await asyncio.wait_for(aio.recv(s), 10), "little") for _ in range(200)]
        s.send(b"bye")
        tick.cancel()
        return got, ticks

    got, ticks = asyncio.run(main())
    t.join()
    assert got == list(range(200))
    assert ticks > 0, "the loop ran nothing else while waiting"


def test_a_cancelled_recv_takes_nothing():
    name = unique("aio-cancel")
    listener = cuda_ipc.Listener(name)
    c = cuda_ipc.connect(name, timeout=10)
    s = listener.accept(timeout=10)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(aio.recv(s), 0.05)  # cancelled while waiting
        c.send(b"one")
        c.send(b"two")
        return [await asyncio.wait_for(aio.recv(s), 10) for _ in range(2)]

    assert asyncio.run(main()) == [b"one", b"two"]


def test_a_peer_that_closes_ends_a_pending_recv():
    name = unique("aio-closed")
    listener = cuda_ipc.Listener(name)
    peer = [cuda_ipc.connect(name, timeout=10)]
    s = listener.accept(timeout=10)

    async def main():
        task = asyncio.create_task(asyncio.wait_for(aio.recv(s), 10))
        await asyncio.sleep(0.05)  # the task waits on the socket
        peer.clear()  # the only reference: the connection closes
        return await task

    with pytest.raises(cuda_ipc.PeerClosed):
        asyncio.run(main())


def test_try_calls_do_not_wait():
    name = unique("aio-try")
    listener = cuda_ipc.Listener(name)
    assert listener.try_accept() is None
    c = cuda_ipc.connect(name, timeout=10)
    s = listener.accept(timeout=10)
    assert s.try_recv() is None
    c.send(b"x")
    for _ in range(1000):
        m = s.try_recv()
        if m is not None:
            break
    assert m == b"x"
    assert isinstance(s.fileno(), int) and isinstance(listener.fileno(), int)
