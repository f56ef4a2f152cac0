"""Shared pieces of the Python tests: the GPU marker (fail loudly with CUDA_IPC_REQUIRE_GPU=1
when there is no GPU, skip otherwise), unique socket names, a peer process runner, and lines a
test reports at the end of the run (`report`)."""

import os
import subprocess
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def unique(what):
    return f"cuda-ipc-pytest-{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def has_gpu():
    import cuda_ipc

    try:
        cuda_ipc.Context(0)
        return True
    except cuda_ipc.NoDevice:
        return False


def pytest_collection_modifyitems(config, items):
    if any(item.get_closest_marker("gpu") for item in items) and not has_gpu():
        if os.environ.get("CUDA_IPC_REQUIRE_GPU"):
            raise pytest.UsageError("CUDA_IPC_REQUIRE_GPU is set and no CUDA device is usable")
        skip = pytest.mark.skip(reason="requires a CUDA device")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


#: Lines a test reports (what a stress did: its rounds, kills, versions), printed at the end of
#: the run even under -q (pytest shows a passing test's own output only with -s).
REPORT = []


def report(line):
    REPORT.append(line)


def pytest_terminal_summary(terminalreporter):
    for line in REPORT:
        terminalreporter.write_line(f"REPORT {line}")
    if SKIPPED_HOST_TESTS and os.environ.get(MUST_RUN):
        terminalreporter.write_line(f"{MUST_RUN} is set and host tests were skipped:")
        for line in SKIPPED_HOST_TESTS:
            terminalreporter.write_line(f"  {line}")


#: With this set (CI does), a host test that is skipped fails the run: a host test needs no
#: GPU, so a skip means something it needs (torch) is missing. The GPU tests, and the one
#: host test that needs a machine *without* a GPU, may still skip.
MUST_RUN = "CUDA_IPC_HOST_TESTS_MUST_RUN"
SKIPPED_HOST_TESTS = []


def _is_host_test(nodeid):
    return os.path.basename(nodeid.split("::")[0]).endswith("_host.py")


def pytest_collectreport(report):
    if report.skipped and _is_host_test(report.nodeid):
        SKIPPED_HOST_TESTS.append(f"{report.nodeid}: {report.longrepr}")


def pytest_runtest_logreport(report):
    if report.skipped and _is_host_test(report.nodeid) and "has a GPU" not in str(report.longrepr):
        SKIPPED_HOST_TESTS.append(f"{report.nodeid}: {report.longrepr}")


def pytest_sessionfinish(session, exitstatus):
    if SKIPPED_HOST_TESTS and os.environ.get(MUST_RUN):
        session.exitstatus = 1


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (and PyTorch)")


def spawn_peer(role, *args):
    """Start tests/peer.py as `role` in a new process (its stdout: RESULT lines)."""
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "peer.py"), role, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc, timeout=60):
    """Wait for a peer; its RESULT lines, its exit code and stderr."""
    out, err = proc.communicate(timeout=timeout)
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    return results, proc.returncode, err
