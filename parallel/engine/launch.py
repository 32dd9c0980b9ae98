"""Launchers: the fast local one (import torch once, fork the ranks) and torchrun for one node.

`torchrun` stays the supported path for real clusters (multi-node, elastic agents, NCCL). On one
machine most of a short job's time under torchrun is every rank importing torch on its own; here the
parent imports torch and the engine once, then forks `world_size` workers that share those pages.
The parent runs no torch op before forking (no thread pools to inherit), rendezvous is a FileStore
in a private temporary directory (no ports to race for), and gloo binds to loopback.

Failure handling: each worker reports an exception's traceback to the parent over a pipe and
exits 1; the parent watches every worker, and at the first one that fails (or dies by a signal)
terminates the rest (SIGTERM, then SIGKILL after a grace period) and raises `RankFailure` naming
the rank and its error. Workers also die with the parent (PR_SET_PDEATHSIG), so nothing outlives it.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback


class RankFailure(RuntimeError):
    """A rank of a job failed: which one, how it ended, and its error."""

    def __init__(self, rank: int, message: str, exitcode: int | None = None):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank, self.message, self.exitcode = rank, message, exitcode


def _die_with_parent() -> None:
    try:  # Linux: SIGKILL this worker when the launcher exits, however it exits
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker(fn, rank: int, world_size: int, init_method: str, errors) -> None:
    _die_with_parent()
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: gloo over loopback
    try:
        fn(rank=rank, world_size=world_size, init_method=init_method)
    except BaseException as err:  # noqa: BLE001 - every failure goes to the parent
        errors.send((time.time(), f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        sys.stderr.write(f"[rank {rank}] {type(err).__name__}: {err}\n")
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def run_local(fn, *, world_size: int, grace_s: float = 3.0) -> None:
    """Run `fn(rank=, world_size=, init_method=)` in `world_size` forked workers; return when all
    succeed, raise RankFailure for the first that fails (the others are stopped). An exception in
    the parent while it waits (KeyboardInterrupt, a signal handler's) stops the workers too."""
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="parascope-rdzv-") as tmp:
        init_method = f"file://{tmp}/store"
        procs, pipes = [], []
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(fn, rank, world_size, init_method, send), name=f"rank{rank}")
            p.start()
            send.close()
            procs.append(p)
            pipes.append(recv)
        try:
            failure = _watch(procs, pipes)
        except BaseException:  # e.g. SystemExit from a SIGTERM handler: stop the workers, then go
            _stop(procs, grace_s)
            raise
        if failure is not None:
            _stop(procs, grace_s)
            raise failure


# Errors a rank gets because a *peer* failed: reported only when nothing else explains the job's end.
_PEER_FAILURE = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Timed out|timed out|remote process exit")


def _watch(procs, pipes, settle_s: float = 1.0) -> RankFailure | None:
    """Wait for every worker; at the first failure, give the others `settle_s` to report theirs and
    return the root cause: the earliest failure that is not a broken connection to a failed peer
    (a rank that raised or died), else the earliest of all (a hang ends in peers' timeouts)."""
    alive = {p.sentinel: rank for rank, p in enumerate(procs)}
    failures, deadline = [], None
    while alive:
        timeout = None if deadline is None else max(0.0, deadline - time.time())
        ready = mp.connection.wait(list(alive), timeout)
        if not ready:
            break
        for sentinel in ready:
            rank = alive.pop(sentinel)
            p = procs[rank]
            p.join()
            if p.exitcode != 0:
                when, message = _report(pipes[rank], p.exitcode)
                failures.append((when, rank, message.strip(), p.exitcode))
                deadline = deadline or time.time() + settle_s
    if not failures:
        return None
    _, _, rank, message, code = min((bool(_PEER_FAILURE.search(f[2].split("\n")[0])), *f) for f in failures)
    return RankFailure(rank, message, code)


def _report(pipe, exitcode: int) -> tuple[float, str]:
    """(time, message) a failed worker sent, or how it ended when it sent nothing (killed)."""
    try:
        if pipe.poll():
            return pipe.recv()
    except (EOFError, OSError):
        pass
    if exitcode < 0:
        return time.time(), f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
    return time.time(), f"exit code {exitcode}"


def _stop(procs, grace_s: float) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(grace_s)
        if p.is_alive():
            p.kill()
            p.join()


def run_torchrun(args: list[str], *, nproc: int) -> int:
    """`torchrun --standalone --nproc-per-node N -m parallel train ARGS` (one node); its exit code."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "parallel",
        "train",
        *args,
    ]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    return subprocess.call(cmd, env=env)
