"""How `profiler run` and `profiler commbench` start their ranks: agent processes, one small interface.

    launcher = AgentLauncher(commands, log=..., env=..., outcome=...)
    outcome = launcher.run(on_tick=poll, tick_s=0.25)    # blocks until the job ends: Outcome(ok, rank, message, exitcode)

The supervisor (the `profiler run` / `commbench` process, which never imports torch) starts one
agent per command and watches them. Agents, by launcher:

    local_commands(module, args, nproc)      `python -m profiler.collect.local_agent`: imports torch once and
                                             forks the ranks (fast; one node); its outcome file names
                                             the failing rank
    torchrun_commands(module, args, ...)     one `torchrun` agent for this node: --standalone, or this
                                             node of a multi-node job (--nnodes/--node-rank/--rdzv-*;
                                             every node runs its own supervisor); the failing rank is
                                             torchrun's "Root Cause" in its output
    the lab (--lab)                          two commands from one supervisor, `lab.for_job().
                                             torchrun_command(node, nproc, worker)` for nodes 0 and 1,
                                             each inside its network namespace (run_cli.py, commbench.py)

`on_tick()` runs in the supervisor every `tick_s` while the job runs (it rewrites run.json); if it
raises (JobStopped: a job timeout or a cancel; KeyboardInterrupt), every agent is stopped and the
exception propagates. When one agent fails the others are stopped too.

Stopping an agent: SIGTERM (both kinds stop their ranks: SIGTERM, then SIGKILL after a grace
period), then SIGKILL after `grace_s`. Agents are started with PR_SET_PDEATHSIG=SIGTERM, so they
never outlive the supervisor, and with RUN_MARKER=<run id> in their environment, inherited by every
rank, so `kill_leftovers` can find and end anything of the run that survived its agent.

Pure: stdlib only.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runfiles.rundir import read_json

RUN_MARKER = "PARASCOPE_RUN_ID"  # in the environment of every process a run starts


class JobStopped(Exception):
    """Raised by a supervisor's tick (or its signal handler) to stop the job: a timeout, a cancel."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    rank: int | None = None
    message: str | None = None
    exitcode: int | None = None


def local_commands(module: str, args: list[str], *, nproc: int, outcome: Path) -> list[list[str]]:
    """The local agent that forks `nproc` ranks of `module` (see profiler/collect/local_agent.py)."""
    return [
        [
            sys.executable,
            "-m",
            "profiler.collect.local_agent",
            f"--nproc={nproc}",
            f"--outcome={outcome}",
            module,
            "--",
            *args,
        ]
    ]


def torchrun_commands(
    module: str,
    args: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_backend: str = "c10d",
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "parascope",
) -> list[list[str]]:
    """The torchrun agent this node runs for `python -m module args` per rank: `--standalone` on one
    node, else the multi-node flags. The ranks' args follow a `--` (torchrun's argparse would
    otherwise take a flag like --nproc for an abbreviation of its own); worker_args() drops it."""
    base = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}", "--max-restarts=0"]
    worker = ["-m", module, "--", *args]
    if nnodes == 1:
        return [[*base, "--standalone", *worker]]
    return [
        [
            *base,
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            f"--rdzv-backend={rdzv_backend}",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id}",
            *worker,
        ]
    ]


def worker_args(argv: list[str]) -> list[str]:
    """A rank's own arguments, without the `--` torchrun_commands puts before them."""
    return argv[1:] if argv[:1] == ["--"] else argv


def local_outcome(path: Path):
    """Outcome reader for a local agent: its outcome file."""

    def read(log_text: str, codes: list[int]) -> Outcome | None:
        data = read_json(path)
        if data is None:
            return None
        return Outcome(bool(data.get("ok")), data.get("rank"), data.get("message"), data.get("exitcode"))

    return read


_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)"
    r".*?traceback\s*:\s*(.*?)\n(?:=|-{5}|\[\d+\]:)",
    re.S,
)


def torchrun_root_cause(log_text: str, codes: list[int] | None = None) -> Outcome | None:
    """The failing rank torchrun reports ("Root Cause (first observed failure)"), from its output."""
    matches = list(_ROOT_CAUSE.finditer(log_text))
    if not matches:
        return None
    m = matches[-1]  # the last report is the final restart's
    lines = [ln.strip() for ln in m.group(3).strip().split("\n") if ln.strip()]
    return Outcome(False, int(m.group(1)), lines[-1] if lines else f"exit code {m.group(2)}", int(m.group(2)))


def _pdeathsig_term() -> None:
    try:  # Linux: SIGTERM this agent when the supervisor exits, however it exits
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class AgentLauncher:
    """Run agent processes (one per command) as children; their output is appended to `log`."""

    def __init__(
        self,
        name: str,
        commands: list[list[str]],
        *,
        log: Path,
        env: dict | None = None,
        outcome=torchrun_root_cause,
        grace_s: float = 10.0,
    ):
        self.name, self.commands, self.log, self.env = name, commands, Path(log), env
        self.outcome, self.grace_s = outcome, grace_s

    def run(self, *, on_tick=None, tick_s: float = 0.25) -> Outcome:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(self.env or {})}
        with open(self.log, "ab") as log:
            procs = [
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_pdeathsig_term,
                )
                for cmd in self.commands
            ]
            try:
                while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
                    time.sleep(tick_s)
                    if on_tick is not None:
                        on_tick()
            except BaseException:
                self._stop(procs)
                raise
            self._stop(procs)  # one agent failed: stop the others (they would wait for its ranks)
        codes = [p.returncode for p in procs]
        found = self.outcome(self.log.read_text(errors="replace"), codes)
        if all(c == 0 for c in codes):
            return Outcome(True)
        code = next(c for c in codes if c != 0)
        if found is not None and not found.ok:
            return found
        return Outcome(False, None, f"{self.name} agent exited with code {code} (see {self.log.name})", code)

    def _stop(self, procs) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def processes_with_env(needle: str) -> list[int]:
    """PIDs (other than this one) whose environment holds `needle` (e.g. 'NAME=value'), read from
    /proc: a job's processes, wherever they were forked or whoever their parent is now."""
    raw = needle.encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if raw in (proc / "environ").read_bytes() + b"\0":
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def tagged_processes(run_id: str) -> list[int]:
    """PIDs whose environment carries RUN_MARKER=run_id: the run's processes."""
    return processes_with_env(f"{RUN_MARKER}={run_id}\0")


def kill_leftovers(run_id: str) -> list[int]:
    """SIGKILL whatever of the run is still alive after its agents have ended (e.g. a rank blocked
    in a collective when a torchrun agent was killed); returns their PIDs."""
    pids = tagged_processes(run_id)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return pids
