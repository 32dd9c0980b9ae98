"""A training job identified from its own traces: the plan, the model, the device, the cluster, each
fact with where it came from, and what could not be told (never assumed).

    job = identify(TraceAnalysis.load("runs/demo"))               # or identify(traces)
    job = identify(traces, launch="train.sh")                     # a launch script / plan file / its text
    job = identify(traces, plan=Plan(...), model="llama3-8b")     # what the caller already knows
    job.plan, job.model, job.device, job.cluster, job.facts["hidden"].evidence, job.missing
    job.to_dict()    # {plan, model, device, cluster, kind, evidence, inferred, missing}

Sources, first found wins: the plan -- given, a launch script or plan file, the run directory's
run.json, an upload's plan.json, else the layout the process groups imply (analyzers.layout); the
model -- given (a Model or a preset name), the launch script, run.json, the upload's plan.json, else
the recorded GEMM and attention shapes (analyzers.shapes); the device and its memory -- the traces'
deviceProperties (aggregates.job_device); nodes -- host names (traces.hosts). Facts the shapes show are
reported in `inferred` even when the model came from a file, so the two can be compared.

A set whose recorded GEMMs have no attention beside them, or whose operators are a recommendation
model's (fbgemm's table-batched embeddings), is "not a transformer job", said plainly in `kind`.

Pure: stdlib, pandas and parallel/ (the importers read text, never execute it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parallel.core.devices import cluster_for_device
from parallel.core.plan import Plan
from parallel.core.specs import MODELS, Model, SpecError
from parallel.importers import ImportFailed, import_text
from profiler.analyzers.aggregates import job_device
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.layout import infer_layout
from profiler.analyzers.shapes import Fact, model_from_shapes
from profiler.traces.model import Traces, node_of_ranks

RECOMMENDER_OP = re.compile(r"fbgemm::.*embedding|embedding_bag|split_embedding", re.IGNORECASE)
ATTENTION_NAME = re.compile(r"attention|flash|fmha|sdpa|scaled_dot_product", re.IGNORECASE)
PYTHON_NAME = re.compile(r"^<built-in|\.py\(\d+\)")  # python_function events (with_stack) are no operators
# backward work by name: autograd's CPU operators (MmBackward0, evaluate_function) and backward kernels
BACKWARD_NAME = re.compile(r"Backward|autograd::engine|_bwd|bprop|dgrad|wgrad")
MODEL_FIELDS = ("layers", "hidden", "heads", "vocab", "seq_len")  # a Model needs these ...
OPTIONAL_FIELDS = ("kv_heads", "ffn_hidden", "arch")  # ... and takes these when known
TP_SCALED = ("heads", "kv_heads", "ffn_hidden", "vocab")  # a rank's shard × tp


class IdentifyError(ValueError):
    """What the caller gave cannot describe this job (a plan of another world size, an unknown preset)."""


@dataclass(frozen=True)
class Identified:
    plan: Plan | None
    model: Model | None
    device: dict  # {name, memory_bytes, ranks} or {name: "cpu"}
    cluster: dict  # {preset, nodes, gpus_per_node, hosts}
    kind: Fact  # "transformer" | "not a transformer" | "not training" | "unknown"
    facts: dict[str, Fact] = field(default_factory=dict)  # every fact: plan, model, device, nodes, ...
    inferred: dict[str, Fact] = field(default_factory=dict)  # what the recorded shapes show
    missing: dict[str, str] = field(default_factory=dict)  # fact -> why it could not be told

    def to_dict(self) -> dict:
        return {
            "plan": self.plan.to_dict() if self.plan else None,
            "model": self.model.to_dict() if self.model else None,
            "device": self.device,
            "cluster": self.cluster,
            "kind": self.kind.to_dict(),
            "evidence": {k: v.to_dict() for k, v in self.facts.items()},
            "inferred": {k: v.to_dict() for k, v in self.inferred.items()},
            "missing": dict(self.missing),
        }


def _text_of(launch: Any) -> tuple[str, str]:
    """(text, name) of a launch script / plan file given as a path or as its text."""
    if isinstance(launch, Path) or (isinstance(launch, str) and "\n" not in launch and Path(launch).is_file()):
        path = Path(launch)
        try:
            return path.read_text(encoding="utf-8"), path.name
        except (OSError, UnicodeDecodeError) as err:
            raise IdentifyError(f"{path}: cannot read it ({err})") from None
    if isinstance(launch, str):
        return launch, "launch script"
    raise IdentifyError(f"launch must be a path or the file's text, not {type(launch).__name__}")


def _model_of(value: Any, where: str) -> Model:
    if isinstance(value, Model):
        return value
    if isinstance(value, str):
        if value not in MODELS:
            raise IdentifyError(f"{where}: no model preset {value!r}; known: {', '.join(sorted(MODELS))}")
        return MODELS[value]
    if isinstance(value, dict):
        try:
            return Model.from_dict(value)
        except SpecError as err:
            raise IdentifyError(f"{where}: the model cannot be read: {err}") from None
    raise IdentifyError(f"{where}: a model is a Model, a preset name or its dict, not {type(value).__name__}")


def _upload_plan(traces: Traces) -> dict | None:
    """An upload's plan.json ({plan, model}) beside its traces, when the set was loaded from one."""
    try:
        folder = Path(traces.source)
        for where in (folder / "plan.json", folder.parent / "plan.json"):
            if where.is_file() and where.stat().st_size < 1 << 20:
                data = json.loads(where.read_text(encoding="utf-8"))
                return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    return None


def _kind(traces: Traces, inferred: dict[str, Fact], missing: dict[str, str]) -> Fact:
    names: set[str] = set()
    for rank in traces.rank_ids[:2]:  # the operator names of two ranks (their dictionaries only)
        names |= {str(n) for n in traces.rank_events(rank)["name"].cat.categories}
    rec = sorted(n for n in names if RECOMMENDER_OP.search(n))
    if rec:
        return Fact(
            "not a transformer",
            "operators",
            f"a recommendation model's table-batched embedding lookups ({rec[0]}, {len(rec)} such operators): "
            "not a transformer job, no transformer plan or model to identify",
        )
    ops = sum(1 for n in names if n.startswith("aten::"))
    if ops and not any(BACKWARD_NAME.search(n) for n in names):  # operators recorded, and none of a backward
        return Fact(
            "not training",
            "operators",
            f"{ops} aten operators recorded and no backward pass (no autograd or backward operator or kernel): "
            "an inference or evaluation job; re-planning prices training steps",
        )
    if "head_dim" in inferred:
        return Fact("transformer", "shapes", f"attention of head dim {inferred['head_dim'].value} beside the GEMMs")
    att = sorted(n for n in names if ATTENTION_NAME.search(n) and not PYTHON_NAME.search(n))
    if att:
        return Fact("transformer", "operators", f"attention operators or kernels ({att[0]})")
    if len(traces.shapes) and missing.get("heads", "").startswith("no attention"):
        return Fact("not a transformer", "shapes", "GEMMs were recorded, but no attention operator or kernel")
    return Fact("unknown", "operators", "no recorded shapes and no attention operator or kernel by name")


def identify(
    trace_set: Traces | TraceAnalysis, *, launch: Any = None, plan: Any = None, model: Any = None
) -> Identified:
    """The job of `trace_set` as identified (module docstring). `launch`: a Megatron-LM script, a
    torchtitan TOML or a plan JSON (a path or its text); `plan`: a Plan or its dict; `model`: a Model,
    a preset name or its dict. IdentifyError when one of them cannot describe this job."""
    analysis = trace_set if isinstance(trace_set, TraceAnalysis) else TraceAnalysis(trace_set)
    traces = analysis.traces
    world = traces.world_size
    facts: dict[str, Fact] = {}
    missing: dict[str, str] = {}
    given_plan, given_model = None, None
    if plan is not None:
        try:
            given_plan = plan if isinstance(plan, Plan) else Plan.from_dict(plan)
        except (SpecError, TypeError) as err:
            raise IdentifyError(f"the plan cannot be read: {err}") from None
        facts["plan"] = Fact(given_plan.label(), "given", "the plan passed in")
    if model is not None:
        given_model = _model_of(model, "model")
        facts["model"] = Fact(given_model.name, "given", "the model passed in")
    if launch is not None:
        text, name = _text_of(launch)
        try:
            imported = import_text(text, name)
            if world and imported.plan.world_size != world:
                imported = imported.with_world_size(world, "the traces' world size")
        except ImportFailed as err:
            raise IdentifyError(str(err)) from None
        if given_plan is None:
            given_plan = imported.plan
            facts["plan"] = Fact(given_plan.label(), f"launch:{imported.kind}", f"{name} ({imported.kind})")
        if given_model is None and imported.model is not None:
            given_model = imported.model
            facts["model"] = Fact(given_model.name, f"launch:{imported.kind}", f"{name} ({imported.kind})")
    for where, data in (("run.json", traces.run), ("upload plan.json", _upload_plan(traces))):
        if not isinstance(data, dict):
            continue
        if given_plan is None and isinstance(data.get("plan"), dict):
            try:
                given_plan = Plan.from_dict(data["plan"])
                facts["plan"] = Fact(given_plan.label(), where, f"the plan in the set's {where}")
            except SpecError:
                pass
        if given_model is None and data.get("model") is not None:
            try:
                given_model = _model_of(data["model"], where)
                facts["model"] = Fact(given_model.name, where, f"the model in the set's {where}")
            except IdentifyError:
                pass
    if given_plan is not None and world and given_plan.world_size != world:
        raise IdentifyError(
            f"the plan is dp×tp×pp×cp = {given_plan.dp}×{given_plan.tp}×{given_plan.pp}×{given_plan.cp} = "
            f"{given_plan.world_size} ranks, but the traces come from a job of world size {world}"
        )
    layout = given_plan
    if layout is None:
        guess = infer_layout(traces, analysis.collectives)
        layout = guess.plan
        if guess.inferred:
            facts["plan"] = Fact(layout.label(), "process groups", guess.evidence)
        else:
            missing["plan"] = f"{guess.evidence}; data parallelism over the {world} ranks is a guess"
    # the model's shape from the recorded GEMMs and attention
    topo = layout.topology(max(layout.world_size, 1))
    stage = {r: int(topo.coords_of(r)["pp"]) for r in traces.rank_ids if r < layout.world_size}
    steps = traces.step_windows.groupby("rank").size().to_dict() if len(traces.step_windows) else {}
    known_m = None
    if given_plan is not None and given_plan.global_batch > given_plan.dp:  # a plan that states its batch
        known_m = Fact(given_plan.microbatches, facts["plan"].source, "the plan's global batch ÷ (dp × micro batch)")
    inferred, shape_missing = model_from_shapes(
        traces.shapes,
        steps=steps,
        stage=stage,
        tp=layout.tp,
        cp=layout.cp,
        pp=layout.pp,
        microbatches=known_m,
        recompute=layout.recompute,
    )
    if "plan" in missing:  # shard sizes times an unknown TP degree: per rank only, never assumed whole
        for k in TP_SCALED:
            if k in inferred:
                shape_missing[k] = f"the TP degree is not known (no plan): {inferred.pop(k).evidence}"
    kind = _kind(traces, inferred, shape_missing)
    if given_model is None and kind.value != "not a transformer":
        if all(k in inferred for k in MODEL_FIELDS):
            extra = {k: inferred[k].value for k in OPTIONAL_FIELDS if k in inferred}
            if (
                "head_dim" in inferred
                and inferred["head_dim"].value * inferred["heads"].value != inferred["hidden"].value
            ):
                extra["attention_head_dim"] = inferred["head_dim"].value
            given_model = Model(name="identified", **{k: inferred[k].value for k in MODEL_FIELDS}, **extra)
            facts["model"] = Fact("identified", "shapes", "every field a model needs was read from the recorded shapes")
            missing["dtype_bytes"] = "the kept shapes carry no dtype: the model's default (2 bytes) stands in"
        else:
            missing["model"] = "the shapes do not give " + ", ".join(k for k in MODEL_FIELDS if k not in inferred)
    if given_model is None or facts["model"].source == "shapes":
        missing.update({k: v for k, v in shape_missing.items() if k in (*MODEL_FIELDS, *OPTIONAL_FIELDS)})
    for k in ("micro_batch", "microbatches", "stage_layers"):
        if k in shape_missing and given_plan is None:
            missing[k] = shape_missing[k]
    # the device, the nodes
    gpu = job_device(traces.ranks)
    if gpu is not None:
        device = {"name": gpu["name"], "memory_bytes": gpu["memory_bytes"], "ranks": gpu["ranks"]}
        facts["device"] = Fact(gpu["name"], "deviceProperties", f"the GPU {gpu['ranks']} ranks' kernels ran on")
        if gpu["memory_bytes"] is None:
            missing["device_memory"] = "deviceProperties has no totalGlobalMem"
    else:
        device = {"name": "cpu", "memory_bytes": None, "ranks": len(traces.rank_ids)}
        facts["device"] = Fact("cpu", "traces", "no rank ran a GPU kernel")
    nodes = node_of_ranks(traces.run, traces.hosts())
    hosts = sorted({str(h) for h in nodes.values() if h is not None})
    if hosts:
        per = [sum(1 for h in nodes.values() if str(h) == x) for x in hosts]
        traced_all = len(traces.rank_ids) == world
        facts["nodes"] = Fact(
            len(hosts), "host names", f"{len(hosts)} host name(s) over {len(traces.rank_ids)} traced ranks"
        )
        if not traced_all:
            missing["nodes_all"] = f"{len(traces.rank_ids)} of {world} ranks traced: nodes counted over those only"
    else:
        per = []
        missing["nodes"] = "no trace names its host"
    preset = cluster_for_device(gpu["name"]) if gpu else None
    cluster = {
        "preset": preset,
        "nodes": len(hosts) or None,
        "gpus_per_node": max(per) if per and len(traces.rank_ids) == world else None,
        "hosts": hosts[:64],
    }
    if gpu and preset is None:
        missing["cluster"] = f"no cluster preset is built of {gpu['name']}"
    if kind.value == "not a transformer":
        missing["model"] = kind.evidence
    for k, v in inferred.items():  # the shapes' facts stand as evidence where no file said otherwise
        if (
            given_model is None
            or facts["model"].source == "shapes"
            or k in ("micro_batch", "microbatches", "stage_layers")
        ):
            facts.setdefault(k, v)
    job_plan = given_plan or (layout if "plan" in facts else None)
    return Identified(job_plan, given_model, device, cluster, kind, facts, inferred, missing)
