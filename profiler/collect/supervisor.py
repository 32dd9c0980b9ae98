"""The one writer of run.json: the `profiler run` process that launched the ranks (node 0's).

While the job runs, every `tick` reads the ranks' status files (status/rank{r}.json, each written by
its rank) and rewrites run.json atomically when something changed: progress from rank 0's completed
steps, hosts as ranks start, torch version and backend. When the job ends it records the outcome:
`completed`, or `failed` with the failing rank, its error and the last lines of its log.

run.json (a contract the dashboard and the analyzer read; keys always present unless noted):

    schema          1
    run_id          unique id of the run (multi-node: --rdzv-id, the same on every node)
    status          running | completed | failed
    progress        {step: optimizer steps completed (rank 0), steps: total}
    plan, model, cluster     the Plan, Model and Cluster as JSON (parallel.core.specs / plan)
    world_size, nodes        ranks and nodes of the job
    hosts           {rank: {hostname, node, local_rank}} (filled in as the ranks start); on the lab
                    (`--lab`) also lab_node and namespace (both lab nodes share the hostname)
    lab             only with --lab: the link as shaped and the nodes (profiler.lab.settings.LabSettings.record)
    torch_version, backend   from the ranks (null until the first rank reports)
    launcher        local | torchrun
    profile         {wait, warmup, active, profiled_steps: [step indices recorded]}
    command         the argv of `python -m profiler run`
    supervisor      {pid, hostname, node_rank} of this process
    started_at, finished_at  ISO-8601 UTC (finished_at null while running)
    traces          [{rank, path (relative), bytes}] of complete trace files, at the end
    error           only when failed: {rank (null when no rank is to blame, e.g. a job timeout),
                    message, exitcode, log (relative path), log_tail (its last lines)}

Multi-node runs where each node runs its own `profiler run`: node 0's supervisor writes run.json;
node k's writes nodes/node{k}.json (the same keys, for the ranks it sees). On a shared filesystem
node 0's run.json sees every rank's status file, so hosts and progress cover the whole job, and at
the end it reads the other nodes' records to name a failing rank on another node. Without a shared
filesystem each node's directory holds its own ranks' traces and logs and its node record: copy
the directories together (traces/, logs/, status/, nodes/) to analyse the whole job.

Pure: stdlib only (the launchers do the process work).
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from pathlib import Path

from profiler.collect.launchers import JobStopped, Outcome
from profiler.collect.spec import RunSpec
from runfiles import rundir

# Errors a rank gets because a *peer* failed (as parallel.engine.launch): never the root cause when another exists.
PEER_FAILURE = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|Timed out|timed out|remote process exit|"
    r"stopped by signal"
)
TIMEOUT = re.compile(r"Timed out|timed out")
LOG_TAIL_LINES = 30


def initial_record(spec: RunSpec, *, run_id: str | None = None, torch_version: str | None = None) -> dict:
    plan = spec.plan
    return {
        "schema": 1,
        "run_id": run_id or (spec.rdzv_id if spec.multinode else uuid.uuid4().hex),
        "status": "running",
        "progress": {"step": 0, "steps": spec.cfg.steps},
        "plan": plan.to_dict(),
        "model": spec.cfg.model.to_dict(),
        "cluster": spec.cluster.to_dict(),
        "world_size": plan.world_size,
        "nodes": spec.nnodes,
        "hosts": {},
        "torch_version": torch_version,
        "backend": None,
        "launcher": spec.launcher,
        "profile": {
            "wait": spec.wait,
            "warmup": spec.warmup,
            "active": spec.active,
            "profiled_steps": spec.profiled_steps,
        },
        "command": ["python", "-m", "profiler", "run", *spec.argv],
        "supervisor": {"pid": os.getpid(), "hostname": socket.gethostname(), "node_rank": spec.node_rank},
        "started_at": rundir.now_iso(),
        "finished_at": None,
        "traces": [],
    }


class Supervisor:
    """Keeps run.json (or, on node k > 0, nodes/node{k}.json) in step with the job."""

    def __init__(self, spec: RunSpec, run_dir: Path, record: dict):
        self.spec, self.run_dir, self.record = spec, Path(run_dir), record
        self.path = (
            self.run_dir / rundir.RUN_JSON if spec.node_rank == 0 else rundir.node_path(self.run_dir, spec.node_rank)
        )
        self.deadline = time.monotonic() + spec.job_timeout_s if spec.job_timeout_s else None
        self.statuses: dict[int, dict] = {}
        self.write_error: str | None = None  # why the last write of the record failed, if it did

    def write(self) -> None:
        """Rewrite the record; on a failure (a full disk) keep going and say why at the end."""
        try:
            rundir.write_json_atomic(self.path, self.record)
            self.write_error = None
        except OSError as err:
            self.write_error = rundir.os_error_text(err, self.path)

    def tick(self) -> None:
        """Fold the ranks' status files into the record; rewrite it if it changed. Raises JobStopped
        past the job timeout."""
        self.statuses = rundir.read_statuses(self.run_dir)
        before = repr(self.record)
        self._fold(self.statuses)
        if repr(self.record) != before:
            self.write()
        if self.deadline is not None and time.monotonic() > self.deadline:
            # a hung job: every live rank dumps its Flight Recorder before the stop
            rundir.request_flight_dumps(rundir.flight_dir(self.run_dir), self.spec.plan.world_size)
            raise JobStopped(f"the job ran past --job-timeout {self.spec.job_timeout_s:g} s and was stopped")

    def _fold(self, statuses: dict[int, dict]) -> None:
        rec = self.record
        for rank, s in sorted(statuses.items()):
            rec["hosts"][str(rank)] = {
                "hostname": s.get("hostname"),
                "node": s.get("node"),
                "local_rank": s.get("local_rank"),
                **{k: s[k] for k in ("lab_node", "namespace") if k in s},
            }
            rec["torch_version"] = rec["torch_version"] or s.get("torch_version")
            rec["backend"] = rec["backend"] or s.get("backend")
        rec["hosts"] = dict(sorted(rec["hosts"].items(), key=lambda kv: int(kv[0])))
        if statuses:
            steps = statuses[0]["step"] if 0 in statuses else min(s.get("step", 0) for s in statuses.values())
            rec["progress"] = {"step": int(steps), "steps": self.spec.cfg.steps}

    def finish(self, outcome: Outcome) -> dict:
        """The final record: completed, or failed with the root cause. Written, and returned."""
        self.statuses = rundir.read_statuses(self.run_dir)
        self._fold(self.statuses)
        rec = self.record
        rec["traces"] = [
            {"rank": r, "path": str(p.relative_to(self.run_dir)), "bytes": p.stat().st_size}
            for r, p in _traces(self.run_dir)
        ]
        rec["finished_at"] = rundir.now_iso()
        full = rundir.disk_full(self.run_dir)
        self._remove_partials()
        if outcome.ok:
            rec["status"] = "completed"
        else:
            rec["status"] = "failed"
            rec["error"] = self._error(root_cause(outcome, self.statuses, self._other_nodes()))
            if full and "no space left" not in rec["error"]["message"]:
                rec["error"]["message"] = f"no space left on device ({self.run_dir}); {rec['error']['message']}"
        self.write()
        if self.write_error:
            rec["write_error"] = self.write_error
        return rec

    def _remove_partials(self) -> None:
        """This node's ranks have all ended, so nothing of theirs in .partial/ will be completed:
        remove it (and the space it holds); another node's files on a shared directory stay."""
        partial = rundir.partial_dir(self.run_dir)
        mine = {r for r, s in self.statuses.items() if s.get("node", 0) == self.spec.node_rank}
        for path in partial.glob("rank*"):
            m = re.match(r"rank(\d+)_", path.name)
            if not self.spec.multinode or (m and int(m.group(1)) in mine):
                path.unlink(missing_ok=True)
        try:
            partial.rmdir()  # gone once empty
        except OSError:
            pass

    def _other_nodes(self) -> list[dict]:
        if not self.spec.multinode or self.spec.node_rank != 0:
            return []
        deadline = time.monotonic() + 5.0  # give the other nodes' supervisors a moment to record their end
        while True:
            records = [rundir.read_json(p) for p in sorted((self.run_dir / "nodes").glob("node*.json"))]
            records = [r for r in records if r and r.get("run_id") == self.record["run_id"]]
            if all(r.get("status") != "running" for r in records) or time.monotonic() > deadline:
                return records
            time.sleep(0.25)

    def _error(self, cause: Outcome) -> dict:
        message = (cause.message or "the job failed").strip()
        first = message.split("\n")[0]
        if TIMEOUT.search(first):
            quiet = sorted(r for r, s in self.statuses.items() if s.get("state") in ("starting", "running", "stopped"))
            first += (
                f" (a collective waited past the process-group timeout, --timeout {self.spec.cfg.timeout_s:g} s: "
                "a peer hung, died, or issued a different collective"
                + (f"; ranks stopped without an error of their own: {', '.join(map(str, quiet))}" if quiet else "")
                + ")"
            )
        err = {"rank": cause.rank, "message": first, "exitcode": cause.exitcode}
        if cause.rank is not None:
            log = rundir.log_path(self.run_dir, cause.rank)
            err["log"] = str(log.relative_to(self.run_dir))
            err["log_tail"] = rundir.log_tail(log, LOG_TAIL_LINES)
        return err


def _traces(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for p in (run_dir / "traces").glob("rank*_trace.json.gz"):
        r = p.name[4:].split("_")[0]
        if r.isdigit():
            found.append((int(r), p))
    return sorted(found)


def root_cause(outcome: Outcome, statuses: dict[int, dict], other_nodes=()) -> Outcome:
    """Which rank to blame: the launcher's answer when it names a rank whose error is not a peer's
    failure (the local launcher already chose the earliest such; torchrun's "first observed failure"
    may be a rank that raised or died by a signal); else the earliest error a rank recorded itself
    that is not a peer's failure; else another node's own root cause; else the earliest of all."""

    def is_peer(msg) -> bool:
        return bool(PEER_FAILURE.search(str(msg or "").split("\n")[0]))

    if outcome.rank is not None and not is_peer(outcome.message):
        return outcome
    failed = sorted(
        (s.get("time", 0), r, s["error"]) for r, s in statuses.items() if s.get("state") == "failed" and s.get("error")
    )
    own = [f for f in failed if not is_peer(f[2])]
    if own:
        return Outcome(False, own[0][1], own[0][2], 1)
    for rec in other_nodes:
        err = rec.get("error") or {}
        if err.get("rank") is not None and not is_peer(err.get("message")):
            return Outcome(False, err["rank"], err.get("message"), err.get("exitcode"))
    if outcome.rank is None and failed:
        return Outcome(False, failed[0][1], failed[0][2], 1)
    return outcome
