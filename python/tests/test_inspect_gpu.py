"""`cuda_ipc.inspect()` on a GPU: an arena this process exports shows under this process with
its capacity, and a tensor in it as a live export of its size, freed once released."""

import os
import re

import pytest

import cuda_ipc

pytestmark = pytest.mark.gpu


def my_arenas(snap):
    me = [e for e in snap["exporters"] if e["process"]["pid"] == os.getpid()]
    assert len(me) == 1, snap
    assert me[0]["process"]["alive"] and "python" in (me[0]["process"]["command"] or ""), me
    return [t for t in me[0]["tables"] if t["kind"] == "arena"]


def test_an_arena_and_its_tensor_show_under_this_process():
    import torch

    ctx = cuda_ipc.Context(0)
    arena = cuda_ipc.Arena(ctx, 16 << 20)
    t = arena.empty((1 << 20,), torch.int32)
    arenas = [a for a in my_arenas(cuda_ipc.inspect()) if a["capacity"] == 16 << 20]
    assert len(arenas) == 1, arenas
    live = [x for x in arenas[0]["exports"] if x["live"]]
    assert len(live) == 1 and live[0]["bytes"] >= 4 << 20, arenas[0]
    assert live[0]["kind"] == "arena" and not live[0]["read_only"], live[0]
    device = live[0]["device"]
    assert re.fullmatch(r"GPU-[0-9a-f]{8}", device), device
    uuid = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
    assert uuid.replace("-", "").startswith(device[4:]), (device, uuid)
    assert live[0]["holders"] == [] and arenas[0]["importers"] == []
    del t
    assert cuda_ipc.wait_released(30)
    arenas = [a for a in my_arenas(cuda_ipc.inspect()) if a["capacity"] == 16 << 20]
    assert not any(x["live"] for x in arenas[0]["exports"]), arenas[0]
    del arena
