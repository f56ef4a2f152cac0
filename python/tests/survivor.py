"""The random-kill stresses' common part (test_weights_gpu.py, test_shared_weights_gpu.py): this
process is the survivor of every round — a peer process is started, killed at a random moment
or left to finish — and after each round holds what it held before: its file descriptors, the
package's names in /dev/shm, and the device's free memory (its own mappings of a dead peer's
memory included, which a survivor in a process of its own would take with it on exit)."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time

from conftest import HERE

#: What /proc/self/fd shows for a pidfd.
PIDFD = "anon_inode:[pidfd]"


def _descriptors():
    """The targets of this process's descriptors."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # (the listing's own descriptor, closed by now)
    return out


def fds():
    """This process's descriptors (their targets), but for pidfds: the crate's liveness cache
    pins the processes it checks with one each (`is_alive_cached`), those that exited let go
    at its next pin — a round's dead peer's until the next round's."""
    return sorted(t for t in _descriptors() if t != PIDFD)


def pidfds():
    return sum(t == PIDFD for t in _descriptors())



def shm():
    """This package's names in /dev/shm, once what dead processes left is reclaimed (their
    export tables, and the channel of a peer killed before this process attached to it)."""
    import cuda_ipc

    cuda_ipc.reclaim_stale_regions()
    return {n for n in os.listdir("/dev/shm") if n.startswith("cuda-ipc")}


def free_memory():
    """The device's free memory, this process's queued work done and torch's cache emptied."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def _gpu_holders():
    """Who holds device memory now, for a failed check: every compute process nvidia-smi lists
    (pid, MiB, alive or not) and this process's torch allocator."""
    import torch

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        out = [f"(nvidia-smi: {e})"]
    procs = []
    for line in out:
        pid = line.split(",")[0].strip()
        alive = pid.isdigit() and os.path.exists(f"/proc/{pid}")
        me = " (this process)" if pid == str(os.getpid()) else ""
        procs.append(f"{line.strip()} MiB{me}{'' if alive else ' (no such process)'}")
    return (
        f"compute processes: {procs}; this process's torch: "
        f"{torch.cuda.memory_allocated() >> 20} MiB allocated, "
        f"{torch.cuda.memory_reserved() >> 20} MiB reserved"
    )


#: How long a check waits for the device's memory to come back: a SIGKILLed or exited peer's
#: context is freed by the driver after the process is reaped, not always at once.
MEMORY_WAIT_S = 30


class State:
    """What this process holds now; `check(what)` asserts it holds the same again (the device's
    memory within 4 MiB, waiting up to MEMORY_WAIT_S for a peer's context to be freed — the
    longest such wait is in the summary)."""

    def __init__(self):
        self.fds, self.shm, self.memory = fds(), shm(), free_memory()
        self.longest_wait = 0.0

    def check(self, what):
        now = fds()
        assert len(now) == len(self.fds), (
            f"{what}: descriptors {sorted(set(now) - set(self.fds))} new, "
            f"{sorted(set(self.fds) - set(now))} gone ({len(now) - len(self.fds):+d})"
        )
        assert pidfds() <= 4, f"{what}: {pidfds()} pidfds (the liveness cache pins live processes)"
        assert shm() == self.shm, f"{what} left {shm() - self.shm}"
        start = time.monotonic()
        while free_memory() < self.memory - (4 << 20):
            assert time.monotonic() - start < MEMORY_WAIT_S, (
                f"{what}: {(self.memory - free_memory()) >> 20} MiB of device memory not returned "
                f"after {MEMORY_WAIT_S} s; {_gpu_holders()}"
            )
            time.sleep(0.1)
        self.longest_wait = max(self.longest_wait, time.monotonic() - start)

    def summary(self):
        return (
            f"this process: {len(self.fds)} descriptors (+{pidfds()} pidfds), device free "
            f"memory {self.memory >> 20} -> {free_memory() >> 20} MiB (the longest wait for it "
            f"{self.longest_wait:.1f} s)"
        )


class Peer:
    """The other process of a round: `script` (in this directory) with `args`, meeting this
    process at the socket `name`, PyTorch's allocator set by `expandable`; SIGKILLed
    `kill_after` seconds after `arm()` when that is not None."""

    def __init__(self, script, name, args, kill_after, expandable=False):
        self.name = name
        env = dict(os.environ)
        for var in ("SW_STREAMS", "SW_DIE_BEFORE_VERDICT", "PYTORCH_CUDA_ALLOC_CONF"):
            env.pop(var, None)
        if expandable:
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        self.kill_after = kill_after
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.killed_at = None
        self.timer = None
        self.err = ""

    def arm(self):
        """Start the clock of this round's kill, if it has one."""
        if self.kill_after is None:
            return

        def kill():
            self.killed_at = time.monotonic()
            self.proc.send_signal(signal.SIGKILL)

        self.timer = threading.Timer(self.kill_after, kill)
        self.timer.start()

    def finish(self):
        """The peer's RESULT lines and exit code (waited for, at most 120 s; a peer still
        running that was to be killed is killed)."""
        if self.timer is not None:
            self.timer.join(30)
        if self.kill_after is not None and self.proc.poll() is None:
            self.proc.kill()  # (a round that failed before its kill: never leave the peer)
        try:
            out, self.err = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        return [l[7:] for l in out.splitlines() if l.startswith("RESULT ")], self.proc.returncode

    def check_death(self, error, role, bound):
        """The round's peer was killed and this side's error — (class, role, monotonic time)
        — is its death: PeerGone naming `role`, or PeerClosed (its socket's end), within
        `bound` seconds of the kill. Returns the delay."""
        assert self.proc.returncode == -signal.SIGKILL and self.killed_at is not None, (
            self.proc.returncode, self.err
        )
        assert error is not None, "no error after the kill"
        cls, who, at = error
        assert (cls, who) in (("PeerGone", role), ("PeerClosed", None)), error
        took = at - self.killed_at
        assert 0 <= took < bound, f"{cls} {took:.3f} s after the kill"
        return took


def caught(e):
    """An error of the peer's death as a check_death tuple."""
    return (type(e).__name__, getattr(e, "role", None), time.monotonic())


def kill_plan(rng):
    """A round's kind and its kill, in seconds after the connection: "early" (within 30 ms:
    the setup, the first syncs), "late" (30 ms to 1.5 s: anywhere in the syncs; twice as
    often), or "clean" (None: no kill)."""
    kind = rng.choice(["early", "late", "late", "clean"])
    return kind, {
        "early": rng.uniform(0, 0.03),
        "late": rng.uniform(0.03, 1.5),
        "clean": None,
    }[kind]


class Stress:
    """Rounds of a random-kill stress, this process the survivor of every one; the survivors'
    errors by role and class, and the slowest, for the report."""

    def __init__(self, bound):
        self.bound = bound
        self.seen, self.slowest = {}, 0.0

    def round(self, role, peer, here, syncs, tail):
        """One round: `here()` — this process's side, as `role` ("engine" or "trainer"),
        returning the syncs it did and the error that ended them — against `peer`. The peer
        printed no "wrong" line; a clean round did `syncs` syncs, the peer exited 0 and its
        last lines are `tail`; a killed peer's death is this side's error (`check_death`).
        Returns the syncs done."""
        import cuda_ipc

        try:
            k, error = here()
        finally:
            results, rc = peer.finish()
        assert not any("wrong" in r for r in results), results
        if peer.kill_after is None:
            assert error is None and k == syncs, (error, k)
            assert rc == 0, peer.err
            assert results[-len(tail):] == tail, results
        else:
            took = peer.check_death(error, "exporter" if role == "engine" else "importer", self.bound)
            key = f"{role}:{error[0]}"
            self.seen[key] = self.seen.get(key, 0) + 1
            self.slowest = max(self.slowest, took)
        gc.collect()
        assert cuda_ipc.wait_released(30)
        return k

    def run(self, want, play, done=0):
        """Rounds of `play()` — returning the syncs it did and its key for the tally — until
        `want` syncs (`done` already) and at least 12 rounds, within 80 rounds and 300 s; this
        process's State checked after each. Returns the report's line."""
        before = State()
        rounds, tally, t0 = 0, {}, time.monotonic()
        while done < want or rounds < 12:
            assert rounds < 80 and time.monotonic() - t0 < 300, f"{done} syncs in {rounds} rounds"
            rounds += 1
            k, key = play()
            done += k
            tally[key] = tally.get(key, 0) + 1
            before.check(f"round {rounds} ({key})")
        return (
            f"{done} in {rounds} rounds ({tally}), {time.monotonic() - t0:.0f} s; errors "
            f"{self.seen}, the slowest {self.slowest * 1e3:.1f} ms after its kill; "
            f"{before.summary()}"
        )
