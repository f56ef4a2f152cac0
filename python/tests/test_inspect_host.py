"""`cuda_ipc.inspect()` and `python -m cuda_ipc inspect` without a GPU: the snapshot's shape,
files that are not the crate's left out, the command's text, JSON and refusals."""

import json
import os
import signal
import subprocess
import sys

import cuda_ipc
from conftest import unique


def test_a_snapshot_has_its_five_lists_and_leaves_out_files_that_are_not_ours():
    # A file under a table's name with bytes of no header of ours is not the crate's: left out.
    path = f"/dev/shm/cuda-ipc-arena.{unique('inspect')}"
    with open(path, "wb") as f:
        f.write(os.urandom(4096))
    try:
        snap = cuda_ipc.inspect()
    finally:
        os.unlink(path)
    assert set(snap) == {"exporters", "channels", "regions", "unreadable", "unlinked"}, snap
    assert all(isinstance(snap[k], list) for k in snap)
    names = [u["name"] for u in snap["unreadable"]] + [r["name"] for r in snap["regions"]]
    assert os.path.basename(path) not in names
    for exporter in snap["exporters"]:
        assert {"pid", "start_time", "alive", "command"} <= set(exporter["process"])


def run(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "cuda_ipc", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_the_command_prints_the_tree_or_json_and_refuses_bad_arguments():
    text = run("inspect")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("cuda-ipc on this machine: "), text.stdout
    js = run("inspect", "--json")
    assert js.returncode == 0, js.stderr
    assert set(json.loads(js.stdout)) == {"exporters", "channels", "regions", "unreadable", "unlinked"}
    for bad in (["inspect", "--watch", "0"], ["inspect", "--frob"], []):
        r = run(*bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)


def test_watch_mode_refreshes_until_interrupted():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.Popen(
        [sys.executable, "-m", "cuda_ipc", "inspect", "--json", "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Python installs its KeyboardInterrupt only where SIGINT is not ignored, and a shell
        # starts background jobs with it ignored: the command starts with the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        lines = [p.stdout.readline() for _ in range(3)]
    finally:
        p.send_signal(signal.SIGINT)  # the command ends quietly
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    for line in lines:
        snap = json.loads(line)
        assert set(snap) == {"exporters", "channels", "regions", "unreadable", "unlinked"}, line
        # Under a watch every channel says how long it stood still.
        assert all(c["unchanged_for_s"] is not None for c in snap["channels"]), line
