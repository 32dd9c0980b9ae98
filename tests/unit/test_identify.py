"""The job identified from its traces: plan, model shape and what is missing, on synthetic traces of
known models under known plans, on the public traces in ../shared/traces, and the measured step split."""

from __future__ import annotations

import dataclasses

import pytest

from parallel.core.plan import Plan
from parallel.core.specs import Model
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.identify import IdentifyError, identify
from profiler.analyzers.replan import ReplanError, replan
from profiler.analyzers.split import COMPONENTS
from profiler.traces.loader import load_traces
from tests.support.shape_traces import write_job

GPT = Model(name="g", layers=4, hidden=256, heads=8, vocab=1024, seq_len=128, arch="gpt")
LLAMA = Model(name="l", layers=6, hidden=256, heads=8, kv_heads=4, ffn_hidden=704, vocab=2048, seq_len=64, arch="llama")


@pytest.mark.parametrize(
    "model, plan, attention",
    [
        (GPT, Plan(dp=2, tp=2, pp=2, micro_batch=2, global_batch=16), "sdpa"),
        (LLAMA, Plan(dp=1, tp=2, pp=3, micro_batch=1, global_batch=6), "flash"),
        (LLAMA, Plan(dp=2, tp=2, pp=1, micro_batch=4, global_batch=16), "eager"),
        (GPT, Plan(dp=2, tp=4, pp=1, micro_batch=1, global_batch=4), "eager"),
    ],
)
def test_plan_and_shapes_equal_the_truth(tmp_path, model, plan, attention):
    traces = load_traces(write_job(tmp_path, model, plan, attention=attention), cache=False)
    job = identify(traces)
    assert (job.plan.dp, job.plan.tp, job.plan.pp) == (plan.dp, plan.tp, plan.pp)
    assert job.facts["plan"].source == "process groups"
    got = job.model
    assert got is not None, job.missing
    truth = dataclasses.asdict(model)
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "arch"):
        assert getattr(got, field) == truth[field] or (field == "kv_heads" and got.kv_heads == model.heads), field
    assert job.inferred["micro_batch"].value == plan.micro_batch
    assert job.inferred["microbatches"].value == plan.microbatches
    assert job.inferred["stage_layers"].value == [model.layers // plan.pp] * plan.pp
    assert job.inferred["head_dim"].value == model.hidden // model.heads
    assert job.kind.value == "transformer"
    assert "dtype_bytes" in job.missing  # the kept shapes carry no dtype: said, not assumed
    d = job.to_dict()
    assert set(d) >= {"plan", "model", "device", "cluster", "evidence", "inferred", "missing"}
    assert d["evidence"]["hidden"]["source"] == "shapes"


def test_the_plan_given_wins_and_a_wrong_one_is_refused(tmp_path):
    plan = Plan(dp=2, tp=2, pp=1, micro_batch=1, global_batch=8)
    traces = load_traces(write_job(tmp_path, GPT, plan), cache=False)
    job = identify(traces, plan=plan, model="tiny")
    assert job.facts["plan"].source == "given" and job.model.name == "tiny"
    assert job.facts["microbatches"].value == 4 and job.facts["microbatches"].source == "given"
    assert job.inferred["hidden"].value == GPT.hidden  # the shapes still speak, beside the given model
    with pytest.raises(IdentifyError, match="world size 4"):
        identify(traces, plan=Plan(dp=8, global_batch=8))
    with pytest.raises(IdentifyError, match="no model preset"):
        identify(traces, model="no-such-model")


def test_a_launch_script_gives_plan_and_model(tmp_path):
    plan = Plan(dp=1, tp=2, pp=2, micro_batch=1, global_batch=4)
    traces = load_traces(write_job(tmp_path / "t", GPT, plan), cache=False)
    script = (
        "torchrun --nproc_per_node 4 pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --max-position-embeddings 128 "
        "--micro-batch-size 1 --global-batch-size 4\n"
    )
    job = identify(traces, launch=script)
    assert job.facts["plan"].source == "launch:megatron" and job.facts["model"].source == "launch:megatron"
    assert (job.plan.tp, job.plan.pp, job.model.hidden, job.model.layers) == (2, 2, 256, 4)


def test_missing_facts_are_reported_missing(tmp_path):
    plan = Plan(dp=1, tp=2, pp=1, micro_batch=1, global_batch=1)
    # no attention op at all: GEMMs alone are not a transformer
    traces = load_traces(write_job(tmp_path / "a", GPT, plan, attention="none"), cache=False)
    job = identify(traces)
    assert job.kind.value == "not a transformer" and job.model is None
    assert "model" in job.missing
    # no shapes recorded: nothing about the model is assumed
    bare = dataclasses.replace(traces, shapes=traces.shapes.iloc[:0])
    job = identify(bare)
    assert job.model is None and job.kind.value == "unknown"
    for fact in ("layers", "hidden", "heads", "vocab", "seq_len"):
        assert "record_shapes" in job.missing[fact], fact
    # data parallelism alone: its one group is the world, which no layout is told by; a rank's shard
    # sizes are then not multiplied by a TP degree nobody knows
    traces = load_traces(write_job(tmp_path / "dp", GPT, Plan(dp=2, global_batch=2)), cache=False)
    job = identify(traces)
    assert job.plan is None and "guess" in job.missing["plan"]
    assert job.inferred["hidden"].value == GPT.hidden and job.inferred["layers"].value == GPT.layers
    assert "TP degree is not known" in job.missing["heads"] and job.model is None
    # K/V heads hidden by TP: one replicated K/V head per rank could be any count up to tp
    mqa = dataclasses.replace(LLAMA, kv_heads=2)
    traces = load_traces(
        write_job(tmp_path / "b", mqa, Plan(dp=2, tp=2, global_batch=2), attention="sdpa"), cache=False
    )
    job = identify(traces)
    assert "kv_heads" not in job.inferred and "up to 2" in job.missing["kv_heads"]


def test_step_split_adds_up_to_the_window(tmp_path):
    plan = Plan(dp=1, tp=2, pp=2, micro_batch=1, global_batch=4)
    a = TraceAnalysis(load_traces(write_job(tmp_path, GPT, plan), cache=False))
    split = a.step_split()
    rows = split.rows
    parts = rows[[f"{c}_ns" for c in COMPONENTS]].sum(axis=1)
    assert (parts - rows["window_ns"]).abs().max() < 1
    d = split.to_dict()
    assert set(d["components"]) == set(COMPONENTS) and d["steps"] == 2 and d["ranks"] == 4
    assert d["components"]["gemm"] > 0  # the aten::linear operators of a CPU rank


@pytest.mark.parametrize("name", ["hta_trace_filter_sampled", "hta_distributed_info_unavailable"])
def test_a_recommendation_model_is_not_a_transformer(shared_traces, name):
    folder = shared_traces / name
    if not folder.is_dir():
        pytest.skip(f"{name} is not present")
    traces = load_traces(folder, ranks=0 if name == "hta_distributed_info_unavailable" else None, cache=False)
    job = identify(traces)
    assert job.kind.value == "not a transformer" and "not a transformer job" in job.kind.evidence
    assert job.model is None and "recommendation" in job.missing["model"]


def test_a_real_gpu_trace_names_its_device(shared_traces):
    folder = shared_traces / "hta_nccl_parser_config"
    if not folder.is_dir():
        pytest.skip("hta_nccl_parser_config is not present")
    job = identify(load_traces(folder, cache=False))
    assert job.device["name"].startswith("NVIDIA A100") and job.device["memory_bytes"] > 40e9
    assert job.facts["device"].source == "deviceProperties"
    assert job.cluster["preset"] is not None
    assert job.model is None and job.kind.value == "unknown"  # no shapes recorded, no attention by name


def test_an_inference_trace_is_not_a_training_job(shared_traces, tmp_path):
    """Operators recorded and not one of a backward pass: an inference or evaluation job (vLLM on a
    B200), said plainly; the same job with autograd's backward operators is a transformer job."""
    folder = shared_traces / "tracelens_b200_vllm"
    if not folder.is_dir():
        pytest.skip("tracelens_b200_vllm is not present")
    job = identify(load_traces(folder, cache=False))
    assert job.kind.value == "not training" and "no backward pass" in job.kind.evidence
    with pytest.raises(ReplanError, match="not a training job"):
        replan(TraceAnalysis(load_traces(folder, cache=False)), plan=Plan(dp=8).to_dict(), model="llama3-8b")
    trained = identify(load_traces(write_job(tmp_path, GPT, Plan(tp=2, global_batch=1)), cache=False))
    assert trained.kind.value == "transformer"
