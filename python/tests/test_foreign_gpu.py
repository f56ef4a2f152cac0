"""PyTorch's own memory shared with `Socket.send_tensor` / `recv_tensor` between real processes:
the caching allocator's blocks as legacy handles, expandable segments as one
descriptor per chunk sent by the exporter itself — also to an importer in another pid
namespace (`unshare --pid --fork --mount-proc`, as root), where PyTorch's own path (`pidfd_getfd`) fails.
Every byte checked, writes seen both ways, an imported tensor dropped with GPU work still queued
on it unmapped only after that work (the work exact, no fault), and a killed exporter leaves the
importer's mapped tensors intact."""

import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, unique

pytestmark = pytest.mark.gpu


def run(mode, unshared=False, dies="lives"):
    if unshared and os.geteuid() != 0:
        pytest.skip("SKIPPED: a pid namespace of its own needs root (unshare --pid --fork)")
    name = unique("foreign")
    env = dict(os.environ)
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    script = os.path.join(HERE, "foreign_peer.py")
    exporter = subprocess.Popen(
        [sys.executable, script, "export", name, dies],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert exporter.stdout.readline().strip() == "READY", exporter.stderr.read()
        # A pid namespace of its own with its own /proc, as a container has (the driver's
        # cuInit fails with OPERATING_SYSTEM under the host's /proc as pid 1 of a new namespace).
        wrapper = ["unshare", "--pid", "--fork", "--mount-proc"] if unshared else []
        importer = subprocess.run(
            [*wrapper, sys.executable, script, "import", name, dies],
            capture_output=True, text=True, timeout=120, env=env,
        )
        if importer.returncode != 0:
            exporter.kill()  # it may wait for a peer that never came
        out, err = exporter.communicate(timeout=60)
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()
    assert importer.returncode == 0, importer.stderr
    imported = [json.loads(l[7:]) for l in importer.stdout.splitlines() if l.startswith("RESULT ")]
    exported = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
    if dies == "lives":
        # The last line: a tensor dropped with GPU work queued on it (foreign_peer.py).
        assert len(imported) == 2, importer.stdout + importer.stderr
        queued = imported.pop()["queued_drop"]
        assert queued == {"waited": True, "exact": True, "released": True, "leaked": 0}, queued
    assert len(imported) == 1, importer.stdout + importer.stderr
    if dies == "dies":
        assert exporter.returncode == -9, err
        assert len(exported) == 1, out + err
    else:
        assert exporter.returncode == 0, err
        assert len(exported) == 2, out + err
    return imported[0], exported


def check_tensors(imported):
    tensors = imported["tensors"]
    assert [t["dtype"] for t in tensors] == ["torch.bfloat16", "torch.float32", "torch.int64"]
    assert [t["shape"] for t in tensors] == [[(40 << 20) - 12345], [10, 100], [5000]]
    assert all(t["exact"] for t in tensors), tensors


def test_caching_allocator_tensors_travel_as_legacy_handles():
    imported, exported = run("default")
    check_tensors(imported)
    assert exported[0]["chunks"] == [0, 0, 0]
    assert exported[1] == {"done": "done", "importer_write_seen": True}
    print("torch's own path:", imported["torch_path"])


def test_expandable_segments_travel_as_one_descriptor_per_chunk():
    imported, exported = run("expandable")
    check_tensors(imported)
    chunks = exported[0]["chunks"]
    # 80 MiB of bf16 from inside a chunk: at least 4 of PyTorch's 20 MiB chunks.
    assert chunks[0] >= 4 and chunks[1] >= 1 and chunks[2] >= 1, chunks
    assert exported[1] == {"done": "done", "importer_write_seen": True}
    print("torch's own path:", imported["torch_path"])


def test_expandable_segments_reach_an_importer_in_another_pid_namespace():
    imported, exported = run("expandable", unshared=True)
    assert imported["pid"] == 1, "the importer runs as pid 1 of its own pid namespace"
    check_tensors(imported)
    assert exported[0]["chunks"][0] >= 4
    assert exported[1] == {"done": "done", "importer_write_seen": True}
    # PyTorch's own path copies the descriptors with pidfd_getfd on the exporter's pid, which
    # names nothing in the importer's namespace.
    assert imported["torch_path"].startswith("failed"), imported["torch_path"]
    print("torch's own path:", imported["torch_path"])


def test_a_killed_exporter_leaves_the_mapped_tensors_intact():
    imported, _ = run("expandable", dies="dies")
    check_tensors(imported)
