"""The trace sets the dashboard can open -- local runs and uploaded sets -- with their plan, status and
progress, by id. An id is what the `run` query parameter holds, so a copied URL reopens the same set.

    sets = list_sets()                 # newest first: TraceSet(id, kind, name, path, status, ...)
    s = find_set("demo")               # a run: its directory under the runs dir
    s = find_set("upload:ours-64")     # an uploaded set: upload:<name> under the uploads dir

Where: runs under $PARASCOPE_RUNS (default ./runs), uploads under $PARASCOPE_UPLOADS (default
./uploads). A run's state is runfiles.runs.read_run's (its run.json, written by `python -m profiler
run`), corrected by its job record (profiler.collect.jobs) when the dashboard started it: a process that is gone
while run.json still says running (or never wrote one) is a failed run, or a cancelled one.

Pure: stdlib, parallel/ and runfiles.runs (no streamlit, no torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from parallel.core.devices import cluster_for_device
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.review.urls import DEFAULT_PARAMS, plan_to_params
from profiler.collect import jobs as jobs_mod
from runfiles.rundir import read_json, runs_root
from runfiles.runs import read_run as read_run_dir

UPLOAD = "upload:"
STATUSES = (
    "starting",
    "running",
    "completed",
    "failed",
    "cancelled",
    "uploaded",
    "unknown",
)  # unknown: traces, no run.json


def runs_dir() -> Path:
    return runs_root()  # $PARASCOPE_RUNS or ./runs, as `python -m profiler run` has it


def uploads_dir() -> Path:
    return Path(os.environ.get("PARASCOPE_UPLOADS") or "uploads")


@dataclass(frozen=True)
class TraceSet:
    id: str
    kind: str  # 'run' | 'upload'
    name: str
    path: Path
    status: str  # one of STATUSES
    step: int | None = None
    steps: int | None = None
    plan: dict | None = None
    model: str | None = None  # preset name, or the run's model name
    cluster: str | None = None
    world_size: int | None = None
    nodes: int | None = None
    error_rank: int | None = None
    error: str | None = None
    started_at: str = ""
    finished_at: str = ""
    trace_files: int = 0
    ranks_traced: int = 0  # ranks in the trace files (an archive holds many)
    has_metrics: bool = False
    job: jobs_mod.Job | None = None
    run: dict = field(default_factory=dict)  # run.json or the upload's manifest, as read

    @property
    def progress(self) -> float | None:
        if self.status in ("completed", "uploaded"):
            return 1.0
        if self.steps:
            return max(0.0, min(1.0, (self.step or 0) / self.steps))
        return None

    @property
    def plan_obj(self) -> Plan | None:
        try:
            return Plan.from_dict(self.plan) if isinstance(self.plan, dict) else None
        except (SpecError, TypeError):
            return None

    @property
    def plan_label(self) -> str:
        plan = self.plan_obj
        return plan.label() if plan is not None else "no plan"

    @property
    def when(self) -> str:
        """When it ran, in words that fit its state: 'uploaded T', 'ran T → T', and 'started T, still
        running' for a job that has not ended (it has not 'ran')."""
        start, end = (t.replace("T", " ")[:19] for t in (self.started_at, self.finished_at))
        if self.kind == "upload":
            return f"uploaded {start}" if start else ""
        if self.status in ("starting", "running"):
            return f"started {start}, still {self.status}" if start else f"still {self.status}"
        return f"ran {' → '.join(t for t in (start, end) if t)}" if start or end else ""

    @property
    def label(self) -> str:
        """The picker's line (no status: it changes while the picker is open; the badge shows it)."""
        ranks = f"{self.world_size} ranks" if self.world_size else "ranks unknown"
        return f"{self.name} · {self.plan_label} · {ranks}" + (" · uploaded" if self.kind == "upload" else "")

    @property
    def has_traces(self) -> bool:
        return self.trace_files > 0

    @property
    def traces_path(self) -> Path:
        return self.path

    def rank_log(self, rank: int) -> Path:
        return self.path / "logs" / f"rank{rank}.log"


def _trace_count(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(
        1
        for p in folder.iterdir()
        if p.name.endswith((".json", ".json.gz", ".zip", ".tar.gz", ".tgz"))
        and not p.name.startswith(".")
        and p.name not in ("manifest.json", "plan.json")
    )


def _name_of(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return value["name"]
    return None


def _job_status(status: str | None, job: jobs_mod.Job | None) -> tuple[str, str | None]:
    """(status, error) from the run directory's status (runfiles.runs) and the job's process."""
    if job is None:
        return status or "unknown", None
    running = jobs_mod.alive(job)
    early = status in (None, "starting")
    # run.json may already say failed ("stopped by signal 15") while the process still cleans up
    if job.cancelled and (not running or early or status in ("running", "failed")):
        return "cancelled", "cancelled from the dashboard"
    if (early or status == "running") and not running:
        code = f"exit code {job.returncode}" if job.returncode is not None else "its process is gone"
        said = "before writing run.json" if early else "while run.json still said running"
        return "failed", f"the job ended ({code}) {said}; see its log below"
    return status or "starting", None


def read_run(path: Path, job: jobs_mod.Job | None = None) -> TraceSet | None:
    """A run directory (runfiles.runs.read_run), or a job of ours still starting, as a TraceSet; None
    when it is neither."""
    info = read_run_dir(path)
    if info is None and job is None:
        return None
    status, job_error = _job_status(info.status if info else None, job)
    error = (info.error if info else None) or {}
    return TraceSet(
        id=path.name,
        kind="run",
        name=path.name,
        path=path,
        status=status,
        step=info.step if info else None,
        steps=info.steps if info else None,
        plan=info.plan if info else None,
        model=info.model if info else None,
        cluster=info.cluster if info else None,
        world_size=info.world_size if info else None,
        nodes=info.nodes if info else None,
        error_rank=info.error_rank if info else None,
        error=error.get("message") or job_error,
        started_at=(info.started_at if info else "") or (job.started_at if job else ""),
        finished_at=info.finished_at if info else "",
        trace_files=info.traces if info else 0,
        ranks_traced=info.traces if info else 0,  # a run writes one file per rank
        has_metrics=bool(info and info.has_metrics),
        job=job,
        run=info.run if info else {},
    )


def read_upload(path: Path) -> TraceSet | None:
    manifest = read_json(path / "manifest.json")
    if manifest is None:
        return None
    plan_file = read_json(path / "plan.json") or {}
    return TraceSet(
        id=UPLOAD + path.name,
        kind="upload",
        name=path.name,
        path=path,
        status="uploaded",
        plan=plan_file.get("plan") if isinstance(plan_file.get("plan"), dict) else None,
        model=_name_of(plan_file.get("model")),
        cluster=_name_of(plan_file.get("cluster")),
        world_size=manifest.get("world_size"),
        started_at=str(manifest.get("created_at") or ""),
        trace_files=(files := _trace_count(path / "traces")),
        ranks_traced=len(ranks) if isinstance(ranks := manifest.get("ranks"), list) and ranks else files,
        run=manifest,
    )


def _runs(folder: Path) -> list[TraceSet]:
    out: dict[str, TraceSet] = {}
    job_of = {j.name: j for j in jobs_mod.jobs(folder)}
    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_dir() and not p.name.startswith("."):
                found = read_run(p, job_of.get(p.name))
                if found is not None:
                    out[p.name] = found
    for name, job in job_of.items():  # started, no run directory yet
        if name not in out and job.pid:
            found = read_run(folder / name, job)
            if found is not None:
                out[name] = found
    return list(out.values())


def list_sets(runs: Path | None = None, uploads: Path | None = None) -> list[TraceSet]:
    """Every local run and uploaded set, newest first."""
    runs, uploads = runs or runs_dir(), uploads or uploads_dir()
    found = _runs(runs)
    if uploads.is_dir():
        found += [
            s
            for p in uploads.iterdir()
            if p.is_dir() and not p.name.startswith(".")
            if (s := read_upload(p)) is not None
        ]
    return sorted(found, key=lambda s: (s.started_at, s.name), reverse=True)


def find_set(set_id: str | None, runs: Path | None = None, uploads: Path | None = None) -> TraceSet | None:
    """The set an id names, or None (no id, an unknown name, or a name that tries to leave its folder)."""
    if not set_id:
        return None
    if set_id.startswith(UPLOAD):
        name, folder = set_id[len(UPLOAD) :], uploads or uploads_dir()
    else:
        name, folder = set_id, runs or runs_dir()
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        return None
    path = folder / name
    if set_id.startswith(UPLOAD):
        return read_upload(path) if path.is_dir() else None
    return read_run(path, jobs_mod.load(folder, name))


MEMORY_SAME = 0.05  # a GPU's reported memory this close to its cluster preset's is the preset's


def plan_params(s: TraceSet, plan: Plan | None = None, device: dict | None = None) -> dict[str, str] | None:
    """Query params that open the set's plan (or `plan`, e.g. the layout inferred from its traces) on
    the plan pages (Topology, Activation memory, TP scaling): its model and cluster when they are
    presets (else the dashboard's defaults), nodes from its hosts. `device` (aggregates.job_device: the
    GPU its traces report) picks the cluster built of that GPU when the set names none, and its memory
    per GPU. None when the set has no plan."""
    plan = plan or s.plan_obj
    if plan is None:
        return None
    model = s.model if s.model in MODELS else ("tiny" if s.kind == "run" else DEFAULT_PARAMS["model"])
    by_device = cluster_for_device(device["name"]) if device else None
    cluster = (
        s.cluster
        if s.cluster in CLUSTERS
        else by_device or ("local-cpu" if s.kind == "run" and not device else DEFAULT_PARAMS["cluster"])
    )
    memory = device.get("memory_bytes") if device and s.cluster not in CLUSTERS else None
    if memory and abs(memory / CLUSTERS[cluster].gpu_memory_bytes - 1) < MEMORY_SAME:
        memory = None  # the preset's GPU as sold (80 GiB), not the ~79.2 GiB CUDA reports of it
    ran_on = (s.run or {}).get("cluster") or {}
    gpn = int(ran_on.get("gpus_per_node") or 0) or CLUSTERS[cluster].gpus_per_node
    if s.nodes and plan.world_size % s.nodes == 0 and not ran_on:  # an upload: spread its ranks evenly
        gpn = plan.world_size // s.nodes
    nodes = max(s.nodes or 1, -(-plan.world_size // gpn))
    return plan_to_params(model, cluster, nodes, plan, gpn, memory)


def table_rows(sets: list[TraceSet]) -> list[dict]:
    """The picker's table: one plain row per set."""
    return [
        {
            "name": s.name,
            "kind": s.kind,
            "status": s.status,
            "progress": s.progress,
            "plan": s.plan_label,
            "ranks": s.world_size,
            "failing rank": "" if s.error_rank is None else str(s.error_rank),
            "started": s.started_at.replace("T", " ")[:19],
        }
        for s in sets
    ]
