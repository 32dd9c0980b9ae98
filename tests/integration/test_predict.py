"""Predicted = measured, a small spread: calibrate from two real profiled runs, predict
two other plans with `parallel plan --calibration` before they run, then train them unprofiled. The
bound is loose -- within 10x -- so a loaded CI machine does not flake (calibration and held-back runs
meet different loads from the other test worker: 2.4x and 3.6x apart in two CI runs) while a broken
model (the analytic GPU model was ~100x off on this CPU) fails; bench/predict.py measures the goal
figures on 16 plans."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import subprocess
import sys

import pytest

from bench.plans import plan_model
from parallel.core.calibrated import collective_s, comm_calls, predict, read_calibration
from profiler.analyzers.calibrate import EFFICIENCY_FLOOR, _overhead, _unprofiled, fit, rank_series
from profiler.analyzers.run_inputs import measured_run
from profiler.cli import calibrate
from tests.conftest import ROOT
from tests.support import trace_samples as ts
from tests.ui.test_pages_runs import sample_run

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_calibrated_model_predicts_plans_it_was_not_fitted_on(tmp_path):
    cal_runs = {"pp2": ["--pp=2", "--global-batch=4"], "dp2": ["--dp=2", "--global-batch=4"]}
    for name, flags in cal_runs.items():
        _cli(
            "profiler", "run", "--model=tiny", *flags, "--steps=7", "--wait=3", "--warmup=1", f"--out={tmp_path / name}"
        )
    calib = tmp_path / "calib.json"
    _cli("profiler", "calibrate", *(str(tmp_path / n) for n in cal_runs), f"--out={calib}")
    cal = json.loads(calib.read_text())
    assert [s["overhead_removed"] for s in cal["sources"]] == [True, True]
    # the engine timed its communication calls: work and transfers each lose their own overhead
    assert all(
        s["overhead_split"] and s["work_overhead_factor"] > 0 < s["comm_overhead_factor"] for s in cal["sources"]
    )
    # the engine timed its CPU: work's wall over CPU time (> 1 where ranks waited for a core)
    assert all(s["work_stretch"] >= 1.0 for s in cal["sources"])
    _work_stretch_is_wall_over_cpu(tmp_path / "pp2")
    _contention_terms_of_a_shared_run(tmp_path / "pp2")
    _unprofiled_launches_set_the_level(tmp_path, cal_runs["pp2"])
    _commbench_links_give_the_inter_link(tmp_path, cal)
    for s in cal["sources"]:  # the factor removed is the run's own traced / unprofiled step; whether it
        # exceeds 1 depends on the load the other test worker puts on the untraced steps, so no bound here
        assert s["overhead_factor"] == pytest.approx(s["traced_step_s"] / s["unprofiled_step_s"], abs=1e-3), s
    for s in cal["sources"]:  # two runs met different loads (CI: one 2.6x off), so the pair's fit is bounded loosely
        assert 0.1 < s["fitted_step_s"] / s["unprofiled_step_s"] < 10.0, s
    for name in cal_runs:  # one run's fit gives that run back: its samples and f come from the same traced steps,
        # so a load on them divides out (+0..+13% on pp2, 0..1% on dp2 under a toggling load here)
        one = tmp_path / f"calib-{name}.json"
        _cli("profiler", "calibrate", str(tmp_path / name), f"--out={one}")
        (s,) = json.loads(one.read_text())["sources"]
        assert s["fitted_step_s"] == pytest.approx(s["unprofiled_step_s"], rel=0.25), s
    assert cal["assumptions"] and cal["cores"] >= 1
    for flags in (["--dp=1", "--global-batch=4"], ["--tp=2", "--global-batch=2"]):
        rep = json.loads(
            _cli(
                "parallel", "plan", "--model=tiny", *flags, "--cluster=local-cpu", f"--calibration={calib}", "--json"
            ).stdout
        )
        predicted = rep["step_time_s"]
        assert rep["calibration"]["sources"] == cal["sources"]
        parts = sum(v for k, v in rep["step_time"].items() if k.endswith("_s") and k != "step_time_s")
        assert parts == pytest.approx(predicted)  # the phases add up
        out = tmp_path / ("train" + "".join(flags))
        _cli("parallel", "train", "--model=tiny", *flags, "--steps=6", f"--out={out}")
        measured = statistics.median(json.loads((out / "metrics.json").read_text())["step_time_s"][1:])
        assert 0.1 < predicted / measured < 10.0, (flags, predicted, measured)


def test_a_ring_cp_runs_shifts_calibrate_as_exchanges_and_price_its_plan(tmp_path):
    """Ring CP's sends and receives (every rank sends and receives at once) are fitted as an op of their
    own, not as a pipeline's p2p; the plan that measured them is then priced by them: a send and a
    receive per shift on a CPU. Without such a run a shift is one ring all-gather step (test_calibrated)."""
    flags = ["--cp=2", "--cp-kind=ring", "--global-batch=2"]
    run = tmp_path / "ring"
    _cli("profiler", "run", "--model=tiny", *flags, "--steps=6", "--wait=2", "--warmup=1", f"--out={run}")
    calib = tmp_path / "calib.json"
    _cli("profiler", "calibrate", str(run), f"--out={calib}")
    cal = read_calibration(calib)
    assert "exchange" in cal.op_scale and "send_recv" not in cal.op_scale  # no pipeline: no other p2p
    rep = json.loads(
        _cli(
            "parallel", "plan", "--model=tiny", *flags, "--cluster=local-cpu", f"--calibration={calib}", "--json"
        ).stdout
    )
    model, plan = plan_model(flags)
    (shift,) = [r for r in comm_calls(model, plan) if r["exchange"]]
    assert cal.device == "cpu"
    expected = shift["calls"] * 2 * collective_s("exchange", 2, shift["bytes"], cal)
    assert rep["step_time"]["exposed_cp_s"] == pytest.approx(expected * rep["step_time"]["contention_factor"])


def _refused(error: str, *args: str) -> None:
    """`python -m profiler ARGS` exits 2 with `error` on stderr (bad input is refused before any output)."""
    done = subprocess.run(
        [sys.executable, "-m", "profiler", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and error in done.stderr, done.stderr


def _work_stretch_is_wall_over_cpu(path):
    """A run whose work took twice its CPU time (half of it waiting for a core) has a stretch of 2;
    without CPU clocks (another framework's run, an older metrics.json) none."""

    run = measured_run(str(path))
    m = run.metrics
    for r, steps in m["step_time_s_per_rank"].items():
        comm = m["comm_time_s_per_rank"][r]
        m["cpu_time_s_per_rank"][r] = [(t - c) / 2 + c / 4 for t, c in zip(steps, comm)]
        m["comm_cpu_time_s_per_rank"][r] = [c / 4 for c in comm]
    assert _overhead(run).stretch == pytest.approx(2.0)
    # the communication calls' CPU seconds: the ranks' mean of their median unprofiled step
    quarter = statistics.mean(_overhead_series(run, "comm_time_s_per_rank", r) / 4 for r in m["comm_time_s_per_rank"])
    assert _overhead(run).comm_cpu_s == pytest.approx(quarter)
    del m["cpu_time_s_per_rank"]
    assert _overhead(run).stretch is None and _overhead(run).comm_cpu_s is None


def _unprofiled_launches_set_the_level(tmp_path, flags):
    """A real unprofiled launch of pp2's plan joins its profiled run's level: the fit's unprofiled step
    is the median of the two, and every constant fitted from the run (a 2-rank run on 2 cores: no
    contention) scales by the run's own step over it. A launch of another plan is refused."""

    launch = tmp_path / "launch-pp2"
    _cli("parallel", "train", "--model=tiny", *flags, "--steps=6", f"--out={launch}")
    steady = statistics.median(json.loads((launch / "metrics.json").read_text())["step_time_s"][1:])
    out = tmp_path / "calib-launch.json"
    _cli("profiler", "calibrate", str(tmp_path / "pp2"), f"--unprofiled={launch}", f"--out={out}")
    (s,) = json.loads(out.read_text())["sources"]
    run = measured_run(str(tmp_path / "pp2"))
    own = _overhead(run).plain_step_s
    level_s = statistics.median([own, steady])
    assert s["unprofiled_launches"] == 1 and s["unprofiled_step_s"] == pytest.approx(level_s, abs=1e-6)
    assert s["level_factor"] == pytest.approx(own / level_s, abs=1e-4)
    base, leveled = fit([run], cores=2), fit([dataclasses.replace(run, launches_s=(steady,))], cores=2)
    for term in ("layer_fixed_s", "flop_s", "step_fixed_s", "alpha_s"):
        assert getattr(base, term) == pytest.approx(getattr(leveled, term) * own / level_s, rel=1e-6), term
    for bad, error in (
        (tmp_path / "dp2", "matches none of the runs calibrated"),
        (tmp_path / "nope", "no metrics.json"),
    ):
        _refused(error, "calibrate", str(tmp_path / "pp2"), f"--unprofiled={bad}", f"--out={out}.x")


def _overhead_series(run, key, rank):
    """The median of a rank's unprofiled steps of one metrics.json series."""
    return statistics.median(_unprofiled(rank_series(run.metrics, key, int(rank)), run.analysis.traces.steps))


def _contention_terms_of_a_shared_run(path):
    """The run fitted as if its two ranks had shared one core: gamma is its communication's measured CPU
    seconds over the communication the model gives it, and eta (the share of the core kept busy) then
    makes the model give the run its unprofiled step -- or stays 1 where the model is slower already.
    Without CPU clocks eta stays 1 and gamma is what gives the step."""

    run = measured_run(str(path))
    o = _overhead(run)
    cal = fit([run], cores=1)
    p = predict(run.model, run.plan, cal)
    comm = sum(v for k, v in p.items() if k.startswith("exposed_")) / p["contention_factor"]
    assert cal.gamma == pytest.approx(min(1.0, o.comm_cpu_s / comm), rel=1e-6)
    if EFFICIENCY_FLOOR < cal.core_efficiency < 1.0:
        assert p["step_time_s"] == pytest.approx(o.plain_step_s, rel=1e-3)
    else:
        assert cal.core_efficiency == 1.0 and p["step_time_s"] >= o.plain_step_s * (1 - 1e-3)
    del run.metrics["cpu_time_s_per_rank"]
    assert fit([run], cores=1).core_efficiency == 1.0


def test_calibrate_reads_a_trace_folders_plan_and_model_from_what_users_have(tmp_path):
    """A folder of traces without a run.json: its plan and model from a Megatron-LM launch script (the
    world size from the traces), from an uploaded set's plan.json, or from --plan JSON + --model as a
    model JSON file -- each the same calibration as the run directory's own."""
    run = json.loads((sample_run() / "run.json").read_text())
    bare = tmp_path / "bare"
    shutil.copytree(sample_run() / "traces", bare)
    script = tmp_path / "pretrain.sh"  # no --nproc_per_node: DP follows the traces' 4 ranks
    script.write_text(
        "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --sequence-parallel --num-layers 4 "
        "--hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256 --seq-length 64 "
        "--max-position-embeddings 64 --micro-batch-size 1 --global-batch-size 2 --vocab-size 512 "
        "--attention-dropout 0 --hidden-dropout 0\n"
    )
    upload = tmp_path / "upload"  # as the Upload page stores a set: its traces and plan.json
    shutil.copytree(sample_run() / "traces", upload / "traces")
    (upload / "plan.json").write_text(json.dumps({"plan": run["plan"], "model": "tiny"}))
    model_file = tmp_path / "model.json"
    model_file.write_text(json.dumps(run["model"]))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(run["plan"]))

    def fitted(*args):
        out = tmp_path / f"c{len(list(tmp_path.glob('c*.json')))}.json"
        assert calibrate.main([*args, f"--out={out}"]) == 0
        cal = json.loads(out.read_text())
        return cal["sources"][0]["plan"], cal["layer_fixed_s"], cal["flop_s"], cal["beta_s_per_byte"]

    own = fitted(str(bare), f"--plan={sample_run() / 'run.json'}")
    assert own[0] == "DP2 TP2+SP attn-unfused no-dropout"  # the plan as the engine ran it
    # the script says what a user would: no dropout, its framework's attention; the fit is the engine's
    from_script = fitted(str(bare), f"--plan={script}")
    assert from_script[0] == "DP2 TP2+SP no-dropout" and from_script[1:] == own[1:]
    assert fitted(str(upload)) == own
    assert fitted(str(bare), f"--plan={plan_file}", f"--model={model_file}") == own


def test_calibrate_takes_the_device_from_the_traces_and_refuses_a_mix(tmp_path, capsys):
    gpu = tmp_path / "gpu"  # two GPU ranks with a TP all-reduce kernel each
    gpu.mkdir()
    for rank, t in enumerate(ts.gpu_pair()):
        ts.write(gpu / f"rank{rank}_trace.json.gz", t)
    (gpu / "plan.json").write_text(json.dumps({"plan": {"tp": 2}, "model": "tiny"}))
    assert calibrate.main([str(gpu), f"--out={tmp_path / 'g.json'}"]) == 0
    cal = json.loads((tmp_path / "g.json").read_text())
    assert cal["device"] == "gpu" and cal["overlaps"]  # no --device: the traces' kernels say GPU
    assert calibrate.main([str(sample_run()), f"--out={tmp_path / 'c.json'}"]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["device"] == "cpu"
    capsys.readouterr()
    assert calibrate.main([str(sample_run()), str(gpu), f"--out={tmp_path / 'm.json'}"]) == 2
    err = capsys.readouterr().err
    assert "mix GPU ranks" in err and str(gpu) in err and not (tmp_path / "m.json").exists()


def test_calibrate_names_the_group_size_an_older_profilers_collectives_lack(tmp_path, capsys):
    old = tmp_path / "old"  # two ranks of four as older profilers wrote them: no group size, no process group
    old.mkdir()
    for rank, t in enumerate(ts.gpu_pair()):
        t["distributedInfo"].pop("pg_config")
        t["distributedInfo"]["world_size"] = 4
        for e in t["traceEvents"]:
            if e.get("name") == "record_param_comms":
                e["args"] = {k: v for k, v in e["args"].items() if not k.startswith(("Group", "Process Group"))}
        ts.write(old / f"rank{rank}_trace.json.gz", t)
    (old / "plan.json").write_text(json.dumps({"plan": {"dp": 2, "tp": 2}, "model": "tiny"}))
    capsys.readouterr()
    assert calibrate.main([str(old), f"--out={tmp_path / 'c.json'}"]) == 2
    err = capsys.readouterr().err
    assert "carry no group size" in err and "message size" not in err and not (tmp_path / "c.json").exists()


def test_calibrate_refuses_bad_input_with_one_line(tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(sample_run() / "traces", bare)  # traces without their run.json
    listed = tmp_path / "listed"  # a metrics.json that is not an object
    listed.mkdir()
    (listed / "metrics.json").write_text("[]")
    broken = tmp_path / "broken"  # a run directory whose run.json is cut short
    shutil.copytree(sample_run(), broken)
    (broken / "run.json").write_text('{"plan": {')
    bare_plan = tmp_path / "plan.json"  # a plan without a model
    bare_plan.write_text('{"dp": 2, "tp": 2, "sp": true}')
    for args, error in (
        ([str(tmp_path / "nope")], "no such file or directory"),
        ([str(bare)], "no run.json or plan.json; give --plan"),
        ([str(bare), f"--plan={bare_plan}"], "names no model: give --model"),
        ([str(bare), "--plan=/nope.json", "--model=tiny"], "cannot read it"),
        ([str(bare), f"--plan={sample_run() / 'run.json'}", "--model=gpt-9"], "not a preset"),
        ([str(sample_run()), "--cores=0"], "--cores 0"),
        ([str(sample_run()), f"--unprofiled={listed}"], "not a run's metrics.json"),
        ([str(broken)], "not a run's run.json"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "profiler", "calibrate", *args, f"--out={tmp_path / 'c.json'}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and error in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "c.json").exists()


def _commbench_links_give_the_inter_link(tmp_path, cal: dict):
    """Runs that stayed on one node and a commbench of both links (`--links`): the inter link is the
    traced intra one plus what commbench measured the inter link to add, and a plan whose DP spans two nodes pays it; a
    commbench without an inter link is refused."""
    cb = tmp_path / "commbench.json"
    cb.write_text(
        json.dumps(
            {
                "links": {
                    "intra": {"latency_s": 500e-6, "bandwidth_bytes_per_s": 1.0e9, "name": "loopback"},
                    "inter": {"latency_s": 1000e-6, "bandwidth_bytes_per_s": 0.1e9, "name": "shaped"},
                }
            }
        )
    )
    out = tmp_path / "calib-links.json"
    done = _cli("profiler", "calibrate", str(tmp_path / "pp2"), str(tmp_path / "dp2"), f"--links={cb}", f"--out={out}")
    assert "inter-node link from" in done.stdout
    linked = json.loads(out.read_text())
    assert linked["inter_source"] == "commbench" and cal["inter_source"] is None
    assert linked["inter_alpha_s"] == pytest.approx(linked["alpha_s"] + 500e-6)  # 500 us more a hop
    assert linked["inter_beta_s_per_byte"] == pytest.approx(linked["beta_s_per_byte"] + 9e-9)  # 10 - 1 ns a byte
    dp = {}
    for nodes in (1, 2):
        rep = _cli(
            "parallel", "plan", "--model=tiny", "--dp=2", "--global-batch=4", "--cluster=local-cpu",
            f"--nodes={nodes}", f"--gpus-per-node={2 // nodes}", f"--calibration={out}", "--json",
        )  # fmt: skip
        dp[nodes] = json.loads(rep.stdout)["step_time"]["exposed_dp_s"]
    assert dp[2] > dp[1] > 0
    intra_only = tmp_path / "commbench-intra.json"
    intra_only.write_text(json.dumps({"links": {"intra": {"latency_s": 5e-4, "bandwidth_bytes_per_s": 1e9}}}))
    _refused(
        "no fitted inter-node link",
        "calibrate",
        str(tmp_path / "pp2"),
        f"--links={intra_only}",
        f"--out={tmp_path / 'x.json'}",
    )
