"""parallel.core.calibrated: the calibrated step-time model's arithmetic, by hand, and its JSON checks;
profiler.analyzers.calibrate's exact non-negative least squares."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from parallel.core.calibrated import (
    MAX_CALIBRATION_BYTES,
    Calibration,
    CalibrationError,
    collective_s,
    comm_calls,
    contention,
    contention_line,
    predict,
    read_calibration,
)
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS
from profiler.analyzers.calibrate import (
    Overhead,
    _fit_links,
    _fit_work,
    _leveled,
    call_weights,
    nnls,
    op_cost_ns,
    rank_series,
    unprofiled_step_s,
)
from tests.conftest import ROOT
from tests.support.work_samples import work_sample

TINY = MODELS["tiny"]
CAL = Calibration(
    layer_fixed_s=1e-3, flop_s=0.0, head_fixed_s=2e-3, step_fixed_s=5e-3, alpha_s=1e-4, beta_s_per_byte=0.0, cores=8
)


def test_one_rank_is_layers_head_and_fixed():
    # 4 layers x 4 microbatches x 1 ms + 4 x 2 ms head + 5 ms, nothing else
    out = predict(TINY, Plan(global_batch=4), CAL)
    assert out["step_time_s"] == pytest.approx(16e-3 + 8e-3 + 5e-3)
    assert out["bubble_s"] == 0 and out["contention_factor"] == 1.0


def test_pipeline_adds_p_minus_1_over_v_slots_of_the_slowest_stage():
    plan = Plan(pp=2, global_batch=4)  # 4 microbatches; stage 1: 2 layers + the head = 4 ms a slot
    out = predict(TINY, plan, CAL)
    rows = comm_calls(TINY, plan)
    sends = sum(r["calls"] for r in rows if r["scope"] == "microbatch") * 1e-4 / 4  # per microbatch
    # once a step, after the last backward: the tied embedding's two copies summed (2 ring steps)
    (tied,) = [r for r in rows if r["scope"] == "step"]
    assert (tied["op"], tied["n"], tied["calls"]) == ("all_reduce", 2, 1)
    slot = 4e-3 + sends
    assert out["compute_s"] == pytest.approx(4 * 4e-3)
    assert out["bubble_s"] == pytest.approx(1 * slot)
    assert out["step_time_s"] == pytest.approx(4 * slot + slot + 2e-4 + 5e-3)


def test_collectives_cost_alpha_per_ring_step_and_overlapped_rows_block_on_our_engine():
    plan = Plan(tp=2, sp=True, global_batch=1)
    blocking = comm_calls(TINY, plan, overlaps=False)
    hidden = comm_calls(TINY, plan, overlaps=True)
    assert sum(r["calls"] for r in blocking) > sum(r["calls"] for r in hidden)  # the backward re-gathers
    out = predict(TINY, plan, CAL)
    sp = [r for r in blocking if r["dim"] == "sp"]
    assert {r["scope"] for r in sp} == {"layer", "first", "last", "step"}  # layers, embedding, output, weights
    # all-gather / reduce-scatter: n-1 ring steps; the once-a-step all-reduce of the SP weights: 2(n-1)
    steps = sum(r["calls"] * (r["n"] - 1) * (2 if r["op"] == "all_reduce" else 1) for r in sp)
    assert out["exposed_sp_s"] == pytest.approx(steps * 1e-4)


def test_contention_counts_the_cores_ranks_keep_busy():
    cal = Calibration(**{**CAL.to_dict(), "cores": 2, "gamma": 0.5, "assumptions": CAL.assumptions})
    assert contention(2, cal, busy_s=1.0, step_s=1.0) == 1.0  # a core each
    assert contention(8, cal, busy_s=1.0, step_s=1.0) == pytest.approx(4.0)  # always busy: time-slicing
    assert contention(8, cal, busy_s=0.2, step_s=1.0) == 1.0  # mostly blocked: the cores suffice
    gpu = Calibration(**{**CAL.to_dict(), "cores": 0, "assumptions": CAL.assumptions})
    assert contention(1024, gpu, busy_s=1.0, step_s=1.0) == 1.0
    # ranks that keep only 80% of the cores busy (woken on a taken core while another idles) take longer
    idle = Calibration(**{**cal.to_dict(), "core_efficiency": 0.8, "assumptions": CAL.assumptions})
    assert contention(8, idle, busy_s=1.0, step_s=1.0) == pytest.approx(5.0)
    assert contention(2, idle, busy_s=1.0, step_s=1.0) == 1.0  # a core each: nothing to share
    slow, fast = (predict(TINY, Plan(pp=4, global_batch=8), c, ranks_here=4) for c in (idle, cal))
    assert slow["step_time_s"] > fast["step_time_s"] and slow["contention_factor"] > fast["contention_factor"]
    # the line calibrate and Home print: only when a calibration run shared cores; a hand-edited source
    # without its ranks is not one (and does not raise)
    shared = Calibration(**{**idle.to_dict(), "sources": [{"ranks": 4, "comm_cpu_s": 0.1}, {"plan": "x"}, 3]})
    assert "keep 80% of them busy" in contention_line(shared) and "CPU clocks" in contention_line(shared)
    assert contention_line(Calibration(**{**idle.to_dict(), "sources": [{"ranks": 2}, {"plan": "x"}]})) is None
    # a calibration written before eta was fitted reads as every core busy
    old = {k: v for k, v in cal.to_dict().items() if k != "core_efficiency"}
    assert Calibration.from_dict(old).core_efficiency == 1.0


@pytest.mark.parametrize(
    "data, error",
    [
        ([], "a JSON object"),
        ({"layer_fixed_s": 1}, "lacks flop_s"),
        ({**CAL.to_dict(), "alpha_s": -1}, "alpha_s must be a finite number >= 0"),
        ({**CAL.to_dict(), "gamma": "x"}, "gamma must be"),
        ({**CAL.to_dict(), "cores": 1.5}, "cores must be an integer"),
        ({**CAL.to_dict(), "core_efficiency": 0}, r"core_efficiency must be a number in \(0, 1\]"),
        ({**CAL.to_dict(), "core_efficiency": 1.5}, r"core_efficiency must be a number in \(0, 1\]"),
        ({**CAL.to_dict(), "inter_source": "datasheet"}, "inter_source must be traces, commbench or null"),
    ],
)
def test_bad_calibration_json_is_refused_with_a_reason(data, error):
    with pytest.raises(CalibrationError, match=error):
        Calibration.from_dict(data)


def test_a_calibration_file_is_read_bounded_with_a_reason(tmp_path):
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(CAL.to_dict()))
    assert read_calibration(path) == CAL
    for content, error in (
        (b"{" + b" " * MAX_CALIBRATION_BYTES + b"}", "larger than 4 MiB"),  # not decoded: refused by its size
        (b"\xff\xfe{", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),  # nesting Python's json cannot follow
    ):
        path.write_bytes(content)
        with pytest.raises(CalibrationError, match=error):
            read_calibration(path)
    with pytest.raises(CalibrationError, match="cannot read it"):
        read_calibration(tmp_path / "missing.json")


def test_each_collective_gets_its_measured_cost_over_the_shared_fit():
    """A backend whose reduce-scatter costs twice the ring model's (gloo runs it as an all-reduce):
    the shared call/alpha/beta come from the other ops, op_scale carries the 2x, predictions follow."""
    true = Calibration(0, 0, 0, 0, alpha_s=50e-6, beta_s_per_byte=2e-9, call_s=20e-6)
    rows = []
    for op, factor in (("all_reduce", 1.0), ("all_gather", 1.0), ("send", 1.0), ("reduce_scatter", 2.0)):
        for n in (2, 4):
            for nbytes in (1e4, 1e5, 1e6):
                t = factor * collective_s(op, n, nbytes, true)
                rows.append({"op": op, "n": n, "bytes": nbytes, "tier": "intra", "transfer_s": t, "count": 4})
    call, alpha, beta, op_scale = _fit_links([pd.DataFrame(rows)])
    assert (call, alpha, beta) == pytest.approx((20e-6, 50e-6, 2e-9), rel=1e-3)
    assert op_scale == pytest.approx({"all_gather": 1, "all_reduce": 1, "reduce_scatter": 2, "send_recv": 1}, rel=1e-3)
    fitted = Calibration(0, 0, 0, 0, alpha_s=alpha, beta_s_per_byte=beta, call_s=call, op_scale=op_scale)
    assert collective_s("reduce_scatter", 4, 1e6, fitted) == pytest.approx(
        2 * collective_s("reduce_scatter", 4, 1e6, true)
    )
    assert collective_s("all_to_all", 4, 1e6, fitted) == pytest.approx(collective_s("all_to_all", 4, 1e6, true))
    assert Calibration.from_dict(fitted.to_dict()) == fitted
    with pytest.raises(CalibrationError, match="op_scale"):
        Calibration.from_dict({**fitted.to_dict(), "op_scale": {"all_reduce": 0}})


def test_latency_is_alpha_per_ring_step_unless_one_op_was_seen_at_two_group_sizes():
    """Only 2-rank groups measured: a per-call cost and alpha x hops cannot be told apart (each op has
    one hop count; op_scale absorbs the ops' differences), so alpha carries the latency and a 4-rank
    all-reduce costs its 6 ring steps to the 2-rank one's 2."""
    true = Calibration(0, 0, 0, 0, alpha_s=0.5e-3, beta_s_per_byte=2e-9)
    rows = [
        {"op": op, "n": 2, "bytes": b, "tier": "intra", "transfer_s": collective_s(op, 2, b, true), "count": 8}
        for op in ("all_reduce", "all_gather", "reduce_scatter", "send")
        for b in (4e3, 16e3, 64e3, 1e6)
    ]
    call, alpha, beta, op_scale = _fit_links([pd.DataFrame(rows)])
    assert call == 0.0
    fitted = Calibration(0, 0, 0, 0, alpha_s=alpha, beta_s_per_byte=beta, op_scale=op_scale)
    for op in ("all_reduce", "all_gather"):  # given back at 2 ranks, and 3x the steps at 4
        assert collective_s(op, 2, 16e3, fitted) == pytest.approx(collective_s(op, 2, 16e3, true), rel=1e-6)
    small = collective_s("all_reduce", 4, 16, fitted) / collective_s("all_reduce", 2, 16, fitted)
    assert small == pytest.approx(3.0, rel=1e-3)


def test_extras_no_run_tells_apart_are_split_by_the_calls_each_dimension_adds():
    """A run without TP/SP/CP gives the per-layer cost; the one run with all three on gives their sum,
    which is split by the blocking calls per layer each adds (call_weights: TP 4 all-reduces, SP 6
    calls beyond them, all-gather CP 4)."""
    a, lump = 1e-3, 0.7e-3
    plain = Plan(pp=2, global_batch=4)
    everything = Plan(tp=2, sp=True, cp=2, global_batch=4, attention="unfused")  # the engine's attention
    assert call_weights(TINY, everything) == (4.0, 6.0, 4.0)
    assert call_weights(TINY, Plan(cp=2, cp_kind="ring", global_batch=2)) == (0.0, 0.0, 8.0)  # send + recv
    samples = []
    for plan, extra in ((plain, 0.0), (everything, lump)):
        on = [plan.tp > 1, plan.sp, plan.cp > 1]
        for layers in (8.0, 16.0):
            samples.append(
                work_sample(
                    layers_mb=layers,
                    **{c: layers * f for c, f in zip(("tp_layers_mb", "sp_layers_mb", "cp_layers_mb"), on)},
                    call_weights=call_weights(TINY, plan),
                    pipeline_work_s=layers * (a + extra),
                    work_s=layers * (a + extra),
                    microbatches=4,
                )
            )
    w = _fit_work(samples)
    assert w.a == pytest.approx(a)
    assert (w.a_tp, w.a_sp, w.a_cp) == pytest.approx((lump * 4 / 14, lump * 6 / 14, lump * 4 / 14))


def test_work_outside_forward_backward_is_the_optimizer_per_step_and_the_rest_per_microbatch():
    """With the engine's optim ranges, w0 is the optimizer's time and the rest of the work outside
    forward/backward goes per microbatch (a 1-microbatch step pays it once, an 8-microbatch one 8 times);
    without them (another framework's traces) all of it stays once per step."""
    optim, glue, a = 1.5e-3, 0.8e-3, 1e-3

    def sample(m: int, with_optim: bool) -> dict:
        fb = 4 * m * a
        return work_sample(
            layers_mb=4.0 * m,
            pipeline_work_s=fb,
            work_s=fb + optim + m * glue,
            optim_s=optim if with_optim else 0.0,
            microbatches=m,
        )

    w = _fit_work([sample(1, True), sample(4, True), sample(8, True)])
    assert (w.w0, w.a_mb, w.a) == pytest.approx((optim, glue, a))
    cal = Calibration(w.a, w.k, w.a_head, w.w0, 0.0, 0.0, microbatch_fixed_s=w.a_mb)
    for m in (1, 8):
        assert predict(TINY, Plan(global_batch=m), cal)["step_time_s"] == pytest.approx(optim + m * (glue + 4 * a))
    w = _fit_work([sample(1, False), sample(8, False)])
    assert w.a_mb == 0.0 and w.w0 == pytest.approx(optim + 4.5 * glue)


def test_unprofiled_launches_set_the_level_by_their_median():
    own = Overhead(work=1.5, comm=1.2, plain_step_s=0.040, traced_step_s=0.060, split=True, comm_cpu_s=0.004)
    assert _leveled(own, ()) == own  # no launches: the run's own level
    # a slow run (40 ms) among launches at 30, 32, 34, 50 ms: the median of all five, 34 ms, is its level
    o = _leveled(own, (0.030, 0.032, 0.034, 0.050))
    level = 0.040 / 0.034
    assert o.plain_step_s == pytest.approx(0.034) and o.level == pytest.approx(level) and o.launches == 4
    # both factors grow by it (the samples they divide shrink to the launches' speed), and so does the
    # communication's CPU time per step that gamma is measured from
    assert o.work == pytest.approx(1.5 * level) and o.comm == pytest.approx(1.2 * level)
    assert o.comm_cpu_s == pytest.approx(0.004 / level) and o.split and o.stretch == own.stretch
    # a run without unprofiled steps of its own: its traced step over the launches' median, one factor
    bare = Overhead(work=1.0, comm=1.0, plain_step_s=None, traced_step_s=0.060, split=False)
    o = _leveled(bare, (0.030, 0.050, 0.040, 0.0))  # a launch without a step is ignored
    assert o.plain_step_s == pytest.approx(0.040) and o.work == o.comm == pytest.approx(1.5) and not o.split


def test_round_trip():
    assert Calibration.from_dict(json.loads(json.dumps(CAL.to_dict()))) == CAL


def test_nnls_is_exact_and_non_negative():
    rng = np.random.default_rng(0)
    A = rng.random((30, 3))
    x, _ = nnls(A, A @ np.array([2.0, 0.0, 0.5]))
    assert x == pytest.approx([2.0, 0.0, 0.5], abs=1e-9)
    x, _ = nnls(A, A @ np.array([1.0, -3.0, 1.0]))  # the unconstrained fit is negative: clamped
    assert (x >= 0).all()


def test_unprofiled_steps_bracket_the_traced_ones():
    # wait 3, warm-up 1, active 2 of 9 steps: 1, 2 are unprofiled and steady; 0 is the first; 3 the
    # warm-up; 4, 5 traced; 6 the profiler's teardown and export; 7, 8 unprofiled again
    metrics = {"step_time_s": [1.0, 0.10, 0.12, 0.5, 0.2, 0.2, 0.9, 0.14, 0.16]}
    assert unprofiled_step_s(metrics, [4, 5]) == pytest.approx(0.13)  # the median of 0.10, 0.12, 0.14, 0.16
    assert unprofiled_step_s(metrics, [2, 3, 4, 5, 6, 7, 8]) is None  # --wait 1, every step after traced


@pytest.mark.parametrize(
    "metrics, series",
    [
        ({"comm_time_s_per_rank": {"0": [0.1, 0.2]}}, [0.1, 0.2]),
        ({}, []),  # a run before the engine timed its communication
        ({"comm_time_s_per_rank": [0.1, 0.2]}, []),  # not keyed by rank
        ({"comm_time_s_per_rank": {"0": 5}}, []),  # not a list
        ({"comm_time_s_per_rank": {"1": [0.1]}}, []),  # another rank's
    ],
)
def test_a_rank_series_of_the_wrong_shape_reads_as_none(metrics, series):
    assert rank_series(metrics, "comm_time_s_per_rank", 0) == series


def test_plan_cli_with_a_calibration(tmp_path):
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps({**CAL.to_dict(), "sources": [{"path": "runs/a", "plan": "DP1 TP1 PP2 mb1"}]}))
    run = [sys.executable, "-m", "parallel", "plan", "--model", "tiny", "--global-batch", "4", "--cluster", "local-cpu"]
    out = json.loads(
        subprocess.run([*run, f"--calibration={calib}", "--json"], cwd=ROOT, capture_output=True, text=True).stdout
    )
    assert out["step_time_s"] == pytest.approx(29e-3) and out["step_time"]["fixed_s"] == pytest.approx(5e-3)
    assert out["calibration"]["sources"][0]["path"] == "runs/a" and out["calibration"]["assumptions"]
    assert out["analytic_step_time"]["step_time_s"] != out["step_time_s"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"layer_fixed_s": 1}')
    done = subprocess.run([*run, f"--calibration={bad}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "lacks flop_s" in done.stderr and "Traceback" not in done.stderr
    # a GPU job's calibration says nothing about this CPU cluster, nor a CPU one about an H100 cluster
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({**CAL.to_dict(), "device": "gpu", "cores": 0}))
    done = subprocess.run([*run, f"--calibration={gpu}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "measured on GPU ranks, but cluster local-cpu runs on CPUs" in done.stderr
    h100 = [a if a != "local-cpu" else "dgx-h100" for a in run]
    done = subprocess.run([*h100, f"--calibration={calib}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "measured on CPU ranks" in done.stderr
    out = json.loads(
        subprocess.run([*h100, f"--calibration={gpu}", "--json"], cwd=ROOT, capture_output=True, text=True).stdout
    )
    assert out["calibration"]["device"] == "gpu" and out["step_time"]["contention_factor"] == 1.0


def test_the_plan_cli_takes_the_inter_link_across_the_clusters_nodes(tmp_path):
    # TP 8 inside a node, DP 2 across two: with a slow inter-node link, the calibrated DP time grows
    base = {**CAL.to_dict(), "device": "gpu", "cores": 0}
    run = [sys.executable, "-m", "parallel", "plan", "--model", "tiny", "--dp", "2", "--tp", "4", "--global-batch", "2"]
    run += ["--cluster", "dgx-h100", "--nodes", "2", "--gpus-per-node", "4", "--json"]
    dp = {}
    for name, extra in (("same", {}), ("slow", {"inter_alpha_s": 1.0, "inter_beta_s_per_byte": 1e-6})):
        calib = tmp_path / f"{name}.json"
        calib.write_text(json.dumps({**base, **extra}))
        done = subprocess.run([*run, f"--calibration={calib}"], cwd=ROOT, capture_output=True, text=True)
        dp[name] = json.loads(done.stdout)["step_time"]["exposed_dp_s"]
    assert dp["slow"] > dp["same"] + 1.0  # the DP all-reduce's latency steps at 1 s each


def test_groups_across_nodes_take_the_inter_link():
    cal = Calibration(**{**CAL.to_dict(), "inter_alpha_s": 1e-2, "assumptions": CAL.assumptions})
    plan = Plan(dp=2, tp=2, global_batch=2)
    two_nodes = dataclasses.replace(CLUSTERS["local-cpu"], nodes=2, gpus_per_node=2)  # TP inside, DP across
    rows = {r["dim"]: r["inter"] for r in comm_calls(TINY, plan, cluster=two_nodes)}
    assert rows == {"tp": False, "dp": True}
    one = predict(TINY, plan, cal)
    across = predict(TINY, plan, cal, cluster=two_nodes)
    assert across["exposed_tp_s"] == one["exposed_tp_s"]  # TP stayed inside a node
    dp_calls = sum(r["calls"] for r in comm_calls(TINY, plan) if r["dim"] == "dp")
    assert across["exposed_dp_s"] == pytest.approx(dp_calls * 2 * 1e-2)  # an all-reduce of 2 ranks: 2(n-1) hops
    assert across["exposed_dp_s"] > one["exposed_dp_s"]


def test_a_ring_shift_costs_an_all_gather_step_unless_exchanges_were_measured():
    plan = Plan(cp=2, cp_kind="ring", global_batch=1)
    (ring,) = [r for r in comm_calls(TINY, plan) if r["dim"] == "cp"]
    assert ring["exchange"] and ring["op"] == "send_recv"
    assert ring["calls"] == 4 * 4  # 4 layers x (1 forward K/V shift + 1 backward + 2 dK/dV shifts)
    base = {**dataclasses.replace(CAL, beta_s_per_byte=1e-9).to_dict(), "assumptions": CAL.assumptions}
    gpu = {"device": "gpu", "cores": 0}
    # never measured: one step of a ring all-gather of the same blocks (its op scale), CPU or GPU alike
    scaled = {"op_scale": {"all_gather": 1.5, "send_recv": 0.25}}
    step = 1.5 * (CAL.call_s + CAL.alpha_s + ring["bytes"] * 1e-9)
    for extra in ({}, gpu):
        cal = Calibration(**{**base, **scaled, **extra})
        assert predict(TINY, plan, cal)["exposed_cp_s"] == pytest.approx(ring["calls"] * step)
    # measured (a calibration run's CP sends and receives): its own scale, a send and a receive on a CPU
    measured = {"op_scale": {"all_gather": 1.5, "exchange": 0.5}}
    each = 0.5 * (CAL.call_s + CAL.alpha_s + ring["bytes"] * 1e-9)
    cpu = Calibration(**{**base, **measured})
    assert predict(TINY, plan, cpu)["exposed_cp_s"] == pytest.approx(2 * ring["calls"] * each)
    on_gpu = Calibration(**{**base, **measured, **gpu})
    assert predict(TINY, plan, on_gpu)["exposed_cp_s"] == pytest.approx(ring["calls"] * each)
    # the pipeline's sends and receives are ops of their own: one each
    (pp,) = [r for r in comm_calls(TINY, Plan(pp=2, global_batch=1)) if r["op"] == "send_recv"]
    assert not pp["exchange"]


def test_an_eager_send_costs_its_issue_and_a_late_peer_is_no_link_time():
    """per_rank_wait rows (ns) of two p2p pairs, a collective one rank always reaches early (a pipeline's
    drain before the gradients' all-reduce: the schedule's wait, not the link's) and one the ranks
    reach in turn (lock-step jitter: paid every call): the link cost of each."""
    rows = [  # instance, op, group, rank, start, end, wait (min(last start - start, dur))
        ("a", "send", "pp", 0, 0, 300, 300),  # ended before its peer came at 1000: an eager issue, 300 of host time
        ("a", "recv", "pp", 1, 1000, 1100, 0),  # came last: all transfer
        ("b", "send", "pp", 0, 0, 2000, 1500),  # blocked until the peer came at 1500, then 500 of transfer
        ("b", "recv", "pp", 1, 1500, 2000, 0),
        # rank 0 waits 1000 for rank 1 at every step (1400 once): 3000 of transfer, +400 of jitter once
        ("c1", "all_reduce", "dp", 0, 0, 4000, 1000),
        ("c1", "all_reduce", "dp", 1, 1000, 4000, 0),
        ("c2", "all_reduce", "dp", 0, 0, 4000, 1000),
        ("c2", "all_reduce", "dp", 1, 1000, 4000, 0),
        ("c3", "all_reduce", "dp", 0, 0, 4400, 1400),
        ("c3", "all_reduce", "dp", 1, 1400, 4400, 0),
        # now one rank late, now the other: each one's typical wait is none, so its waits stay
        ("j1", "all_reduce", "tp", 0, 0, 3500, 500),
        ("j1", "all_reduce", "tp", 1, 500, 3500, 0),
        ("j2", "all_reduce", "tp", 0, 500, 3500, 0),
        ("j2", "all_reduce", "tp", 1, 0, 3500, 500),
        ("j3", "all_reduce", "tp", 0, 0, 3000, 0),
        ("j3", "all_reduce", "tp", 1, 0, 3000, 0),
    ]
    per = pd.DataFrame(rows, columns=["instance", "op", "group", "rank", "start_ns", "end_ns", "wait_ns"])
    per["bytes"] = 64
    per["dur_ns"] = per["end_ns"] - per["start_ns"]
    per["transfer_ns"] = per["dur_ns"] - per["wait_ns"]
    cost = op_cost_ns(per).tolist()
    assert cost[:4] == [300, 100, 500, 500]
    assert cost[4:10] == [3000, 3000, 3000, 3000, 3400, 3000]
    assert cost[10:] == [3500, 3000, 3000, 3500, 3000, 3000]
