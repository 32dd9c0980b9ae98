"""What a run directory or a folder of traces says about its job, read bounded, for the analyses that
fit or compare models to it (`profiler calibrate`, the dashboard's calibration, `profiler analyze
--plan`):

    plan, model = plan_file("llama.sh", world_size=64)   # a plan JSON, a Megatron-LM launch script,
                                                         # a torchtitan TOML; model None when unnamed
    run = measured_run("runs/cal-a")                     # calibrate.Measured: traces, metrics, plan,
                                                         # model, the nodes it ran on
    cluster = run_cluster(Path("runs/cal-a"), plan)      # its nodes as a Cluster, None on one node

A run directory's run.json names its plan and model; a trace folder's come from a --plan file or its
own plan.json (an uploaded set's) and a --model. Each error is a PlanMismatchError or NoTracesError
in one line.

Pure: stdlib, orjson, parallel.core, parallel.importers, profiler.traces and the analyzers' front.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson

from parallel.core.files import NotARegularFile, TooLarge, read_bounded
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, Cluster, Model, SpecError
from parallel.importers import Imported, ImportFailed, beside, import_text
from profiler.analyzers.calibrate import Measured
from profiler.analyzers.front import TraceAnalysis
from profiler.traces.errors import NoTracesError, PlanMismatchError
from profiler.traces.loader import load_traces
from runfiles.rundir import MAX_RUN_JSON_BYTES, load_json_object


def plan_file(path: str, world_size: int | None = None) -> tuple[dict, Any]:
    """(the plan dict, the model the file names or None) in a --plan file, read bounded
    (MAX_RUN_JSON_BYTES): a plan JSON (bare, or a run's / report's / uploaded set's {"plan": ...,
    "model": ...}), or a Megatron-LM launch script or torchtitan TOML (imported_plan: its DP follows
    `world_size`, the traces'); PlanMismatchError in one line when it cannot be used."""
    try:
        raw = read_bounded(path, MAX_RUN_JSON_BYTES)
    except NotARegularFile:
        raise PlanMismatchError(f"--plan {path}: not a regular file") from None
    except OSError as err:
        raise PlanMismatchError(f"--plan {path}: cannot read it ({err.strerror or err})") from None
    except TooLarge:
        raise PlanMismatchError(f"--plan {path}: larger than {MAX_RUN_JSON_BYTES >> 20} MiB: not a plan file") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        if str(path).lower().endswith(".json"):
            raise PlanMismatchError(f"--plan {path}: not valid JSON ({err})") from None
        imported = imported_plan(path, world_size, raw)
        return imported.plan.to_dict(), imported.model
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("plan"), dict):
        data = data["plan"]
    if not isinstance(data, dict):
        raise PlanMismatchError(f"--plan {path}: expected a JSON object with dp, tp, pp, cp")
    return data, model


def imported_plan(path: str | Path, world_size: int | None, raw: bytes) -> Imported:
    """The Megatron-LM launch script or torchtitan TOML `raw` read from `path`, imported
    (parallel.importers.Imported; files it sources are read beside it), its data-parallel size following
    `world_size` (the ranks the job ran on, whatever its launcher line says; as Upload does);
    PlanMismatchError with the importer's one line when it cannot be imported."""
    try:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ImportFailed(f"{Path(path).name}: neither JSON nor a text file") from None
        imported = import_text(text, Path(path).name, read=beside(Path(path).parent))
        if world_size and imported.plan.world_size != world_size:
            imported = imported.with_world_size(world_size, "the traces' world size")
    except ImportFailed as err:
        raise PlanMismatchError(f"--plan {path}: {err}") from None
    return imported


def read_run_json(path: Path) -> dict:
    """A run's metrics.json or run.json, read bounded (rundir.load_json_object); one line naming it when
    it is too large, not JSON or not an object."""
    try:
        return load_json_object(path)
    except ValueError as err:
        raise PlanMismatchError(f"{path}: not a run's {path.name} ({err})") from None


def measured_run(path: str, plan_path: str | None = None, model_name: str | None = None) -> Measured:
    """A run directory (or a trace folder: folder_plan_model) as profiler.analyzers.calibrate.Measured."""
    folder = Path(path)
    if not folder.exists():
        raise NoTracesError(f"{path}: no such file or directory")
    run = folder / "run.json"
    metrics = {}
    if (folder / "metrics.json").is_file():
        metrics = read_run_json(folder / "metrics.json")
    traces = load_traces(folder)  # once: a trace folder's imported plan takes its world size from them
    if run.is_file():
        data = read_run_json(run)
        plan, model = Plan.from_dict(data["plan"]), Model.from_dict(data["model"])
    else:
        plan, model = folder_plan_model(folder, plan_path, model_name, traces.world_size)
    analysis = TraceAnalysis(traces, plan.to_dict())
    return Measured(
        analysis=analysis, metrics=metrics, plan=plan, model=model, path=str(folder), cluster=run_cluster(folder, plan)
    )


def folder_plan_model(
    folder: Path, plan_path: str | None, model_arg: str | None, world_size: int | None
) -> tuple[Plan, Model]:
    """(Plan, Model) of a trace folder without a run.json. The plan: --plan FILE (plan_file: a plan
    JSON, bare or {"plan": ..., "model": ...} as a run's, a report's or an uploaded set's plan.json; a
    Megatron-LM launch script or a torchtitan TOML, which name the model too, its DP following
    `world_size`, the traces') -- else the folder's own plan.json (an uploaded set's). The model:
    --model, a preset name or a model JSON file, else the plan file's. PlanMismatchError naming what
    is missing or wrong."""
    source = Path(plan_path) if plan_path else folder / "plan.json"
    if not plan_path and not source.is_file():
        raise PlanMismatchError(
            f"{folder}: no run.json or plan.json; give --plan (a plan JSON, a Megatron-LM launch script or a "
            "torchtitan TOML) and --model (a preset or a model JSON) for a trace folder"
        )
    plan_data, model_data = plan_file(str(source), world_size)
    try:
        plan = Plan.from_dict(plan_data)
    except (SpecError, TypeError, ValueError, KeyError) as err:
        raise PlanMismatchError(f"--plan {source}: not a plan ({err})") from None
    model = model_from(model_arg) if model_arg else model_from(model_data, source) if model_data is not None else None
    if model is None:
        raise PlanMismatchError(f"{source} names no model: give --model (a preset or a model JSON)")
    return plan, model


def model_from(value: Model | dict | str, source: Path | None = None) -> Model:
    """A Model from a preset name, a model JSON file's path (its object, or its "model"), a Model, or
    a model's dict."""
    where = f"the model in {source}" if source else "--model"
    if isinstance(value, Model):
        return value
    if isinstance(value, str):
        if value in MODELS:
            return MODELS[value]
        path = Path(value)
        if source is not None or not path.is_file():
            raise PlanMismatchError(
                f"{where} {value!r}: not a preset ({', '.join(sorted(MODELS))}) or a model JSON file"
            )
        try:
            doc = load_json_object(path)
        except OSError as err:
            raise PlanMismatchError(f"--model {value}: cannot read it ({err.strerror or err})") from None
        except json.JSONDecodeError:
            raise PlanMismatchError(f"--model {value}: not JSON (a model JSON file, or a preset name)") from None
        except ValueError as err:  # too large, or JSON but not an object
            raise PlanMismatchError(f"--model {value}: {err}") from None
        value, where = (doc["model"] if isinstance(doc.get("model"), dict) else doc), f"--model {value}"
    try:
        return Model.from_dict(value)
    except (SpecError, TypeError, ValueError, KeyError) as err:
        raise PlanMismatchError(f"{where}: not a model ({err})") from None


def run_cluster(folder: Path, plan: Plan) -> Cluster | None:
    """The nodes a run directory's job ran on, as a Cluster (None for one node or no run.json)."""
    try:
        nodes = int(load_json_object(folder / "run.json").get("nodes") or 1)
    except (OSError, ValueError, TypeError):
        return None
    if nodes <= 1 or plan.world_size % nodes:
        return None
    return dataclasses.replace(CLUSTERS["local-cpu"], nodes=nodes, gpus_per_node=plan.world_size // nodes)
