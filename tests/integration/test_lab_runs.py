"""Jobs on the two-node lab: `profiler run --lab`, `profiler commbench --lab` and
`profiler tpsweep --lab` start their ranks in the lab's namespaces; run.json records the nodes and
the link; inter-node collectives are slower than intra-node ones in the run's own traces; the sweep's
JSON has its keys and the TP-scaling page shows it. Without a lab or without root: exit 2 and a
clear message.

Tests that build a lab need root (CI runs as root) and skip otherwise. They share tests/integration/test_lab.py's
machine-wide lock and prefix convention, and one lab per module (built once, removed at the end
whatever happened, and the machine checked to be as it was).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from parallel.core.specs import model_preset
from profiler import load_traces
from profiler.analyzers import collectives, per_rank_wait
from profiler.cli import tpsweep
from profiler.collect.spec import parse_run
from profiler.commbench.spec import parse_commbench
from profiler.lab import settings as lab
from profiler.lab import sweep_views as sweep_data
from profiler.lab.sweep_model import compare, predict_point
from tests.integration.test_lab import (
    ROOT,
    holding_lab_lock,
    lab_lock,  # noqa: F401 - the fixture, shared
    machine,
    needs_root,
    without_caps,
)
from tests.support.apptest import page_test, vega_charts

RATE = 6.25e6  # bytes/s = 50 Mbit/s: crossing stays far slower than loopback even when 2 cores run 4+ ranks
SMALL = ["--model=tiny", "--hidden=128", "--seq-len=256", "--layers=1", "--vocab=256"]  # TP: 128 KiB per call


def profiler(*args, env=None, timeout=240, run_as=()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*run_as, sys.executable, "-m", "profiler", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# ---- pure: the flags ----


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--tp=3", "--lab"], "not even"),
        (["--dp=2", "--tp=2", "--lab", "--nnodes=2"], "drop --nnodes"),
        (["--dp=2", "--tp=2", "--lab", "--rdzv-endpoint=x:1"], "drop --rdzv-endpoint"),
        (["--dp=2", "--tp=2", "--lab", "--nproc-per-node=4"], "--nproc-per-node 4"),
    ],
)
def test_run_lab_flags_are_checked(argv, error):
    spec, errors, _ = parse_run(argv)
    assert any(error in e for e in errors), errors


def test_run_lab_spec_is_two_torchrun_nodes():
    spec, errors, _ = parse_run(["--dp=2", "--tp=2", "--lab", "--lab-prefix=pslx-"])
    assert not errors
    assert (spec.lab, spec.launcher, spec.nnodes, spec.nproc_per_node) == ("pslx-", "torchrun", 2, 2)
    assert not spec.multinode  # one supervisor starts both nodes
    assert (spec.cluster.nodes, spec.cluster.gpus_per_node) == (2, 2)
    cb, errors = parse_commbench(["--lab", "--nproc=2", "--quick"])
    assert not errors and (cb.lab, cb.nnodes, cb.world_size, cb.launcher) == ("psl-", 2, 4, "torchrun")


# ---- no lab, no root: exit 2 with the reason ----


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--dp=2", "--tp=2", "--lab"],
        ["commbench", "--lab", "--nproc=2", "--quick"],
        ["tpsweep", "--lab", "--quick"],
    ],
)
def test_lab_down_or_no_root_exits_2(command, tmp_path):
    out = tmp_path / "out"
    if os.geteuid() == 0:  # root: the lab (a prefix nobody builds) is not up
        args, run_as, expect = [*command, "--lab-prefix=pslz9-"], (), "is not up"
    else:
        args, run_as, expect = command, (), "needs root"
    done = profiler(*args, f"--out={out}", run_as=run_as, timeout=60)
    assert done.returncode == 2, done.stderr
    assert expect in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()  # nothing claimed before the check


def test_lab_job_without_root_says_so():
    done = profiler("run", "--dp=2", "--tp=2", "--lab", timeout=60, run_as=without_caps())
    assert done.returncode == 2 and "needs root" in done.stderr and "CAP_SYS_ADMIN" in done.stderr, done.stderr


def test_quick_sweeps_commbench_sizes_are_transfer_bound_across_the_link():
    """The quick sweep fits the inter link from sizes whose transfer at the tests' rate dominates the
    few ms of scheduling on two busy cores (commbench's own quick sizes start at 1 KiB)."""
    spec, errors = tpsweep.parse(["--lab", "--quick", "--lab-prefix=pslx-"])
    assert not errors
    cb, errors = parse_commbench(["--lab", "--nproc=2", *spec.commbench_args])
    assert not errors and cb.quick
    assert cb.sizes == (128 * 2**10, 512 * 2**10, 2 * 2**20)
    assert min(cb.sizes) / RATE > 0.02  # seconds a transfer of the smallest size takes across the link


def test_tpsweep_needs_lab_flag():
    done = profiler("tpsweep", "--quick", timeout=60)
    assert done.returncode == 2 and "pass --lab" in done.stderr


# ---- with root: one lab for the module ----


@pytest.fixture(scope="module")
def lab_prefix():
    """A lab at RATE under this module's own prefix, built once; removed at the end even after a failure."""
    if lab.missing_privilege() is not None:
        pytest.skip(f"builds a lab: {lab.missing_privilege()}")
    prefix = f"pslr{os.getpid() % 0xFFFF:04x}-"
    with holding_lab_lock():  # tests/integration/test_lab.py's lock, held for the module
        try:
            lab.down(prefix)
            before = machine()
            lab.up(bandwidth_bytes_per_s=RATE, prefix=prefix)
            yield prefix
            lab.down(prefix)
            assert machine() == before
        finally:
            lab.down(prefix)


@pytest.mark.slow
@needs_root
def test_run_on_the_lab_crosses_the_link(lab_prefix, tmp_path):
    """DP2 × TP2 on 2 nodes × 2 ranks: TP groups stay inside a node, DP groups cross the link. The
    DP all-reduce's bus bandwidth in the run's own traces is far below the TP all-reduce's."""
    out = tmp_path / "run"
    done = profiler(
        "run", *SMALL, "--dp=2", "--tp=2", "--steps=3", "--lab", f"--lab-prefix={lab_prefix}", f"--out={out}"
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["nodes"] == 2 and run["world_size"] == 4
    hosts = {int(r): h for r, h in run["hosts"].items()}
    assert {r: (h["node"], h["lab_node"], h["namespace"]) for r, h in hosts.items()} == {
        0: (0, 0, f"{lab_prefix}node0"),
        1: (0, 0, f"{lab_prefix}node0"),
        2: (1, 1, f"{lab_prefix}node1"),
        3: (1, 1, f"{lab_prefix}node1"),
    }
    link = run["lab"]
    assert link["bandwidth_bytes_per_s"] == RATE and link["namespaces"] == [f"{lab_prefix}node0", f"{lab_prefix}node1"]
    assert link["addresses"] == ["10.213.0.1", "10.213.0.2"] and link["latency_requested_s"] == 0
    traces = load_traces(out)
    table = collectives(traces, run["plan"])
    assert {"0,1", "2,3"} <= set(table.loc[table["dim"] == "tp", "group"]) and {"0,2", "1,3"} <= set(
        table.loc[table["dim"] == "dp", "group"]
    )
    # Bytes per second of transfer (from the last rank's arrival to the end: what the link costs, not the
    # wait for a peer still computing on the shared cores) of the large all-reduces; both groups have 2
    # ranks, so this is busbw too.
    per = per_rank_wait(traces, run["plan"], table=table)
    big = per[(per["op"] == "all_reduce") & (per["bytes"] >= 64 << 10) & (per["transfer_ns"] > 0)]
    rate = big["bytes"] / big["transfer_ns"] * 1e9
    tp, dp = rate[big["dim"] == "tp"], rate[big["dim"] == "dp"]
    assert len(tp) and len(dp), per.groupby(["dim", "group"]).size()
    assert dp.median() < 1.2 * RATE  # across: the shaped link bounds it
    assert tp.median() > 3 * dp.median(), (tp.describe(), dp.describe())


@pytest.mark.slow
@needs_root
def test_tpsweep_quick_writes_its_json_and_the_page_shows_it(lab_prefix, tmp_path, monkeypatch):
    """The quick sweep (TP 2 inside a node, TP 4 across, commbench on the lab) in a runs dir: its JSON
    with the schema's keys, commbench's intra and inter links and the lab; then the TP-scaling page."""
    runs = tmp_path / "runs"
    out = runs / "sweep1"
    done = profiler("tpsweep", "--lab", "--quick", f"--lab-prefix={lab_prefix}", f"--out={out}", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    sweep = json.loads((out / "sweep.json").read_text())
    assert {
        "schema",
        "kind",
        "status",
        "lab",
        "model",
        "gpus_per_node",
        "commbench",
        "compute",
        "cluster",
        "points",
        "machine",
    } <= set(sweep)
    assert sweep["status"] == "completed" and sweep["gpus_per_node"] == 2
    assert [(p["tp"], p["sp"], p["link"], p["nodes"]) for p in sweep["points"]] == [
        (2, False, "intra", 1),
        (4, False, "inter", 2),
    ]
    # one untraced step after the first on each side of the traced one (--quick): the measured step is
    # theirs, as the model predicts an unprofiled step, and the fit removes the tracing overhead
    assert sweep["profile"] == {"wait": 2, "warmup": 1, "active": 1, "steps": 6}
    for p in sweep["points"]:
        assert p["status"] == "completed" and (out / p["run_dir"] / "run.json").is_file()
        m = p["measured"]
        assert m["tp_comm_s"] > 0 and m["busbw_bytes_per_s"] > 0 and m["step_time_s"] > 0
        metrics = json.loads((out / p["run_dir"] / "metrics.json").read_text())
        assert metrics["profile"]["profiled_steps"] == [3] and len(metrics["step_time_s"]) == 6
        steps = metrics["step_time_s"]
        assert m["step_unprofiled"] and m["step_time_s"] == pytest.approx(float(np.median([steps[1], steps[5]])))
        assert set(p["predicted"]) == {"tp_comm_s", "busbw_bytes_per_s", "step_s"}
        assert set(p["error_pct"]) == {"tp_comm", "busbw", "step"}
    intra, inter = (sweep["points"][i]["measured"]["busbw_bytes_per_s"] for i in (0, 1))
    assert intra > 2 * inter  # the TP group that spans the link is the slow one
    cb = json.loads((out / "commbench.json").read_text())
    assert set(cb["links"]) == {"intra", "inter"} and cb["lab"]["prefix"] == lab_prefix
    intra_bw, inter_bw = (cb["links"][k]["bandwidth_bytes_per_s"] for k in ("intra", "inter"))
    # what the shaped link guarantees: an all_reduce of S bytes with members on both nodes moves at least S
    # bytes each way across it, so its calls take S over the rate, however busy the machine is (half of
    # that asserted: a rank that enters a call late finds part of its bytes already across)
    burst, _ = lab.shaper_sizes(RATE)
    across = [r for r in cb["results"] if r["link"] == "inter" and r["op"] == "all_reduce"]
    assert {r["bytes"] for r in across} == {128 * 2**10, 512 * 2**10, 2 * 2**20}  # every size transfer-bound
    for r in across:
        if r["bytes"] >= 512 * 2**10:  # 0.5 x 64 ms and more, where loopback would take ~1 ms
            assert r["time_us"] * 1e-6 >= 0.5 * (r["bytes"] - burst) / RATE, r
    # fitted from those sizes (the sweep measures again when load swamped them: `attempts`)
    assert 1 <= sweep["commbench"]["attempts"] <= 3
    assert inter_bw is not None, cb["links"]
    # loopback on two busy cores can time flat over the quick sizes: no bandwidth fitted (the table says so)
    assert intra_bw is None or inter_bw < intra_bw
    assert sweep["commbench"]["links"] == cb["links"]
    assert (out / "sweep.csv").read_text().startswith("tp,sp,link,")
    # the step-time model calibrated on the sweep's own runs (one inside a node, one across: the inter
    # link's terms); the quick sweep has no third run to hold back, so each is a calibration run here
    cal = sweep["calibrated"]
    assert cal["calibration"]["inter_alpha_s"] is not None and cal["calibration"]["sources"]
    assert all(s["overhead_removed"] and s["unprofiled_step_s"] for s in cal["calibration"]["sources"])
    assert [(q["tp"], q["calibrated_on"]) for q in cal["points"]] == [(2, True), (4, True)]
    for q in cal["points"]:  # loose: another test worker's load stretched the 4-rank run 4x once
        assert 0.1 < q["predicted_step_s"] / q["measured_step_s"] < 2.0, q
    run4 = json.loads((out / "tp4" / "run.json").read_text())
    assert run4["lab"]["prefix"] == lab_prefix and {h["lab_node"] for h in run4["hosts"].values()} == {0, 1}

    monkeypatch.setenv("PARASCOPE_RUNS", str(runs))
    at = page_test("pages/tp_scaling.py")
    assert not at.exception, [e.value for e in at.exception]
    lab_chart = vega_charts(at)[-1]
    frame = lab_chart.frame()
    assert set(frame["source"]) == {"predicted", "measured", "calibrated"} and set(frame["tp"]) == {1, 2, 4}
    # the calibrated model on the step-time row: its points, with its error vs measured
    calibrated = frame[frame["source"] == "calibrated"]
    drawn = calibrated[calibrated["metric"] == "step time, s"].sort_values("tp")
    assert list(drawn["value"]) == pytest.approx([q["predicted_step_s"] for q in cal["points"]])
    assert list(drawn["error_pct"]) == pytest.approx([q["error_pct"] for q in cal["points"]])
    # and its TP communication per layer (ms), beside the measured one
    comm = calibrated[calibrated["metric"] == "TP comm, ms/layer"].sort_values("tp")
    assert list(comm["value"]) == pytest.approx([q["predicted_tp_comm_s"] * 1e3 for q in cal["points"]])
    for q in cal["points"]:
        assert q["predicted_tp_comm_s"] > 0 and q["tp_comm_error_pct"] is not None
        # compared with what an untraced step pays a layer, the quantity the fit models: each run here
        # is a calibration run, so the fit gives it back closely (loose: the other worker's load)
        assert q["measured_tp_comm_kind"] == "paid" and 0.5 < q["predicted_tp_comm_s"] / q["measured_tp_comm_s"] < 2
    for p in sweep["points"]:
        m = p["measured"]
        assert (
            m["tp_comm_paid_s"] == pytest.approx(sum(c["calls_per_layer"] * c["paid_s"] for c in m["calls"].values()))
            and m["tp_comm_paid_s"] > 0
        )
    assert "datum.source == 'calibrated'" in json.dumps(lab_chart.spec)
    measured = frame[frame["source"] == "measured"]
    assert set(measured["link"]) == {"inside a node (loopback)", "across nodes (shaped veth)"}
    assert measured["error_label"].str.endswith("%").all()
    assert "datum.tp > 2" in json.dumps(lab_chart.spec)  # the boundary band
    table = at.dataframe[-1].value
    assert list(table["TP"]) == [2, 4] and "TP comm error %" in table
    assert table["calibrated s"].gt(0).all() and list(table["calibrated on"]) == ["yes", "yes"]
    assert table["calibrated TP comm ms"].gt(0).all() and "calibrated TP comm error %" in table
    assert table["TP comm paid ms/layer"].gt(0).all()
    assert any("tpsweep --lab" in c.value for c in at.caption)


def test_tp_scaling_page_without_a_sweep_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_RUNS", str(tmp_path / "none"))
    at = page_test("pages/tp_scaling.py")
    assert not at.exception
    assert any("No TP sweep" in i.value and "tpsweep --lab" in i.value for i in at.info)


# ---- pure: the sweep's view without a lab ----


def _sweep(points) -> dict:
    model = {**model_preset("tiny").to_dict(), "hidden": 128, "seq_len": 256, "ffn_hidden": 512}
    links = {
        "intra": {"latency_s": 5e-4, "bandwidth_bytes_per_s": 4e8},
        "inter": {"latency_s": 1e-3, "bandwidth_bytes_per_s": 1e8},
    }
    return {
        "schema": 1,
        "kind": "parascope-tpsweep",
        "status": "failed",
        "model": model,
        "micro_batch": 1,
        "gpus_per_node": 2,
        "machine": {"cpus": 2},
        "lab": {"prefix": "psl-", "bandwidth_bytes_per_s": 1.25e8},
        "commbench": {"links": links},
        "points": points,
    }


def test_sweep_view_compares_and_names_failed_runs(tmp_path):
    done = {
        "tp": 2,
        "sp": False,
        "nodes": 1,
        "link": "intra",
        "status": "completed",
        "measured": {
            "step_time_s": 0.05,
            "tp_comm_s": 2e-3,
            "tp_comm_lo_s": 1e-3,
            "tp_comm_hi_s": 3e-3,
            "busbw_bytes_per_s": 1e8,
            "tp_comm_step_s": 0.01,
        },
    }
    failed = {"tp": 4, "sp": False, "nodes": 2, "link": "inter", "status": "failed", "error": "rank 3 died"}
    sweep = _sweep([done, failed])
    # ring α-β by hand: 4 all-reduces of b·s·h·4 bytes over 2 ranks on the intra link
    nbytes = 256 * 128 * 4
    assert predict_point(sweep, 2, False)["tp_comm_s"] == pytest.approx(4 * (nbytes / 4e8 + 2 * 5e-4))
    row = compare(sweep).set_index("tp").loc[2]
    assert row["tp_comm_error_pct"] == pytest.approx((2e-3 / row["predicted_tp_comm_s"] - 1) * 100)
    assert predict_point(sweep, 4, False)["link"] == "inter"
    view = sweep_data.sweep_view(sweep)
    assert any("TP 4 failed: rank 3 died" in n for n in view["notes"])
    measured = view["chart"][view["chart"]["source"] == "measured"]
    assert set(measured["tp"]) == {2} and set(view["table"]["status"]) == {"completed", "failed"}
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "sweep.json").write_text(json.dumps(sweep))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sweep.json").write_text("{}")  # not a sweep: skipped
    assert [s["name"] for s in sweep_data.find_sweeps(tmp_path)] == ["s1"]
    with pytest.raises(sweep_data.SweepError, match="parascope-tpsweep"):
        sweep_data.load_sweep(tmp_path / "other" / "sweep.json")
