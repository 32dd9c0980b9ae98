"""profiler.analyzers.replan and `profiler replan`: a GPU job's traces (written by the test, as
test_device_fit writes them: a 4-rank TP2 x PP2 Llama-3 8B on H100s whose kernels take the model's
own times, each class slowed by a known factor) re-planned on the same GPUs and on more; the gaps,
the verdict and the exports checked on what they must say."""

from __future__ import annotations

import dataclasses
import json

import pytest

from parallel.cli.train import parser, plan_of_args
from parallel.core.plan import Plan
from parallel.core.specs import SpecError
from parallel.importers import import_text
from profiler import TraceAnalysis
from profiler.analyzers import replan_gaps
from profiler.analyzers.replan import ReplanError, gap_lines, replan, verdict
from profiler.analyzers.split import COMPONENTS
from profiler.cli import replan as replan_cli
from profiler.cli.run import plan_file_flags
from tests.unit.test_device_fit import MODEL, PLAN, SLOWER, gpu_job

KEYS = {
    "job": {"plan", "model", "device", "cluster", "evidence", "inferred"},
    "measured": {"step_s", "components"},
    "modelled": {"step_s", "components", "error"},
    "plan": {"label", "plan", "step_s", "gain", "memory_gib", "why"},
    "export": {"megatron", "torchtitan"},
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return gpu_job(tmp_path_factory.mktemp("replan") / "job", SLOWER)


@pytest.fixture(scope="module")
def result(job):
    return replan(TraceAnalysis.load(job, cache=False))


def test_the_json_has_exactly_its_keys(result):
    d = json.loads(json.dumps(result.to_dict()))
    assert set(d) == {"job", "measured", "modelled", "device_fit", "plans", "export"}
    for key in ("job", "measured", "modelled", "export"):
        assert set(d[key]) == KEYS[key], key
    assert all(set(p) == KEYS["plan"] for p in d["plans"]) and d["plans"]
    assert set(d["measured"]["components"]) == set(COMPONENTS) == set(d["modelled"]["components"])
    assert d["job"]["evidence"]["plan"]["source"] == "upload plan.json"
    assert d["job"]["evidence"]["device_memory"]["source"] == "missing"  # the trace gave no totalGlobalMem


def test_the_modelled_job_uses_the_device_fitted_to_its_kernels(result):
    assert result.device_fit["device"] == "h100-sxm"
    m, p = result.measured["components"], result.modelled["components"]
    for part in ("gemm", "attention", "elementwise"):  # the fit gives each class its measured time back
        assert p[part] == pytest.approx(m[part], rel=0.15), part
    assert result.measured["step_s"] == pytest.approx(sum(m.values()))


def test_each_plan_gains_over_the_measured_step_and_says_why(result):
    measured = result.measured["step_s"]
    for row in result.plans:
        plan = Plan.from_dict(row["plan"])
        assert plan.world_size == PLAN.world_size and plan.global_batch == PLAN.global_batch
        assert plan != PLAN and row["label"] == plan.label()
        assert row["gain"] == pytest.approx(1 - row["step_s"] / measured)
        assert row["why"] and row["memory_gib"] < 80
    # the job's pipeline bubble is what its better plans lose
    assert result.plans[0]["gain"] > result.modelled["error"] and "bubble" in result.plans[0]["why"]
    assert result.verdict.startswith(result.plans[0]["label"])


def test_the_best_plan_exports_and_reads_back(result):
    best = Plan.from_dict(result.plans[0]["plan"])
    back = import_text(result.export["megatron"], "best.sh")
    assert (back.plan.dp, back.plan.tp, back.plan.pp, back.plan.cp) == (best.dp, best.tp, best.pp, best.cp)
    assert back.plan.micro_batch == best.micro_batch and back.plan.zero == best.zero
    assert back.model.name == MODEL.name
    assert "[parallelism]" in result.export["torchtitan"] and 'flavor = "8B"' in result.export["torchtitan"]


def test_more_gpus_are_searched_when_asked(job):
    r = replan(TraceAnalysis.load(job, cache=False), gpus=8)
    assert {Plan.from_dict(p["plan"]).world_size for p in r.plans} == {8}


def test_a_gap_beyond_the_error_names_the_part_and_its_usual_meaning():
    comps = dict.fromkeys(COMPONENTS, 0.0)
    measured = {"step_s": 10.0, "components": {**comps, "gemm": 6.0, "exposed_dp": 3.1, "idle": 0.9}}
    modelled = {**comps, "gemm": 6.2, "exposed_dp": 0.2}
    gaps = replan_gaps.gaps(measured, modelled, 0.07)
    assert [g["component"] for g in gaps] == ["exposed_dp", "idle"]  # gemm's 0.2 s is inside 7% of 10 s
    lines = gap_lines(gaps)
    assert lines[0].startswith("exposed dp 3.1 s measured vs 0.2 s modelled: gradient reduction did not overlap")


@pytest.mark.parametrize(
    "gain,said",
    [(0.30, "runs this job 30% faster"), (0.05, "no better plan by more than the model's error (7%)")],
)
def test_the_verdict(gain, said):
    row = {"label": "DP8", "gain": gain, "why": "bubble 2 → 0 ms"}
    assert said in verdict([row], 0.07)
    assert verdict([], 0.07) == "no other plan fits these GPUs"


def test_what_cannot_be_replanned_is_one_line(tmp_path, job, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in job.glob("rank*_trace.json"):
        (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ReplanError, match="plan is not known .* give --launch or --plan"):  # asked for, never guessed
        replan(TraceAnalysis.load(bare, cache=False))
    assert replan_cli.main([str(bare), "--gpus", "0"]) == 2
    assert replan_cli.main([str(tmp_path / "nowhere")]) == 2
    assert replan_cli.main([str(job), "--cluster", "nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)


def test_the_command_prints_the_gap_and_the_plans(job, capsys):
    assert replan_cli.main([str(job), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "deviceProperties" in out and "re-planned: " in out and "measured ms" in out
    assert replan_cli.main([str(job), "--json", "--top", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["plans"]) == 2


def test_a_recommendation_model_is_told_plainly(shared_traces):
    folder = shared_traces / "hta_trace_filter_sampled"
    if not folder.is_dir():
        pytest.skip("hta_trace_filter_sampled is not present")
    with pytest.raises(ReplanError, match="not a transformer job"):
        replan(TraceAnalysis.load(folder, cache=False))


def test_run_plan_file_becomes_the_plan_flags(tmp_path):
    plan = Plan(dp=2, tp=2, sp=True, micro_batch=2, global_batch=8, zero=1, recompute="selective")
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"plan": plan.to_dict(), "model": "tiny"}))
    flags = plan_file_flags(str(path), model_given=False)
    assert flags[-2:] == ["--model", "tiny"] and "--sp" in flags and "--no-tp-overlap" in flags
    ran = plan_of_args(parser().parse_args(flags))  # what `profiler run --plan` trains: the engine's attention
    assert ran == dataclasses.replace(plan, attention="unfused", dropout=False)
    assert "--model" not in plan_file_flags(str(path), model_given=True)
    path.write_text(json.dumps({"plan": plan.to_dict(), "model": {**MODEL.to_dict(), "name": "mine", "layers": 2}}))
    with pytest.raises(SpecError, match="no preset; give --model"):
        plan_file_flags(str(path), model_given=False)


def test_a_model_that_does_not_describe_the_traces_is_said_so(job):
    r = replan(TraceAnalysis.load(job, cache=False), model="gpt3-175b")  # the kernels are Llama-3 8B's
    assert r.modelled["mismatch"] and r.verdict.startswith("the model puts this job at")
    assert r.to_dict()["modelled"]["error"]["mismatch"] == r.modelled["mismatch"]
    assert r.plans == [] and r.verdict.endswith("no other plan fits these GPUs")  # 175B does not fit 4 H100s


def test_the_job_that_matches_has_no_mismatch(result):
    assert result.modelled["mismatch"] is None
