"""A real `profiler run` of the tiny GPT (DP1 × TP2 × PP2 + SP, gloo): its traces record shapes, and the
job identified from them alone -- no run.json -- is the plan and the model that ran."""

from __future__ import annotations

import dataclasses

from parallel.core.specs import MODELS
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.identify import identify
from profiler.analyzers.split import COMPONENTS
from profiler.traces.loader import load_traces
from tests.conftest import run_module


def test_a_tiny_run_is_identified_from_its_shapes(tmp_path):
    out = tmp_path / "run"
    run_module(
        "profiler", "run", "--model", "tiny", "--dp", "1", "--tp", "2", "--pp", "2", "--sp",
        "--micro-batch", "1", "--global-batch", "4", "--steps", "4", "--wait", "1", "--warmup", "1",
        "--active", "2", "--out", str(out),
    )  # fmt: skip
    traces = load_traces(out, cache=False)
    assert len(traces.shapes) and set(traces.shapes["rank"]) == {0, 1, 2, 3}
    job = identify(dataclasses.replace(traces, run=None))  # the traces alone
    assert (job.plan.dp, job.plan.tp, job.plan.pp) == (1, 2, 2)
    tiny = MODELS["tiny"]
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "arch"):
        assert getattr(job.model, field) == getattr(tiny, field), field
    assert job.facts["microbatches"].value == 4 and job.facts["stage_layers"].value == [2, 2]
    with_run = identify(traces)
    assert with_run.facts["plan"].source == "run.json" and with_run.model.name == "tiny"
    split = TraceAnalysis(traces).step_split()
    parts = split.rows[[f"{c}_ns" for c in COMPONENTS]].sum(axis=1)
    assert (parts - split.rows["window_ns"]).abs().max() < 1
    c = split.to_dict()["components"]
    assert c["optimizer"] > 0 and c["gemm"] > 0 and c["exposed_tp"] + c["exposed_sp"] > 0 and c["bubble"] > 0
