"""AppTest of the run pages (Home, Collective timeline) and of the measured views on the plan pages
(Topology, Activation memory, TP scaling with `?run=`), over a real run directory.

The run is real: `python -m profiler run` of a 4-rank DP2 x TP2 + SP job of the tiny model (4 steps,
steps 2 and 3 traced) -- run.json, metrics.json, one Kineto trace and log per rank -- made once and
cached under .cache/test-runs/ (about 10 s the first time). Each test copies it into its own runs
folder (PARASCOPE_RUNS), edited where a test needs a failed or running run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import profiler.collect.demo
import profiler.collect.demo as demo_mod
from bench.scale import replicate
from parallel.core.calibrated import Calibration, predict
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, Model, cluster_preset
from parallel.review.document import NamedPlan
from parallel.review.urls import ReviewState, review_to_params
from profiler import TraceAnalysis, load_traces
from profiler.analyzers.steps import step_time_s
from profiler.cli import calibrate
from profiler.collect import jobs, trace_sets, uploads
from profiler.collect.trace_sets import TraceSet
from tests.support import trace_samples as ts
from tests.support.apptest import ROOT, page_test, vega_charts

SAMPLE = ROOT / ".cache" / "test-runs" / "profiler-dp2-tp2-sp-v3"  # v3: metrics.json with model_state_bytes
SAMPLE_PLAN = {
    "model": "tiny",
    "cluster": "local-cpu",
    "nodes": "1",
    "dp": "2",
    "tp": "2",
    "pp": "1",
    "cp": "1",
    "sp": "1",
    "mb": "1",
    "gb": "4",
}


def sample_run() -> Path:
    """The cached real run directory (made on first use; safe when two test workers race)."""
    if (SAMPLE / "metrics.json").is_file() and len(list((SAMPLE / "traces").glob("rank*_trace.json.gz"))) == 4:
        return SAMPLE
    tmp = SAMPLE.with_name(f"{SAMPLE.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "profiler",
            "run",
            "--model",
            "tiny",
            "--dp",
            "2",
            "--tp",
            "2",
            "--sp",
            "--steps",
            "4",
            "--out",
            str(tmp),
        ],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
        capture_output=True,
    )
    try:
        tmp.rename(SAMPLE)
    except OSError:  # another worker won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return SAMPLE


def install_run(runs: Path, name: str = "sample", *, traces: bool = True, **run_json) -> Path:
    """A copy of the sample run as runs/<name>, its run.json updated with `run_json` (a running one
    gets a live supervisor: this process)."""
    dest = runs / name
    shutil.copytree(sample_run(), dest, ignore=None if traces else shutil.ignore_patterns("traces"))
    if run_json:
        run = json.loads((dest / "run.json").read_text())
        run.update(run_json)
        if run.get("status") == "running":
            run["supervisor"] = {"pid": os.getpid(), "hostname": socket.gethostname(), "node_rank": 0}
        (dest / "run.json").write_text(json.dumps(run))
    return dest


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    monkeypatch.setenv("PARASCOPE_RUNS", str(folder))
    monkeypatch.setenv("PARASCOPE_UPLOADS", str(tmp_path / "uploads"))
    return folder


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def _text(at) -> str:
    parts = [
        e.value
        for kind in ("markdown", "caption", "info", "error", "warning", "success", "subheader", "title")
        for e in getattr(at, kind)
    ]
    return "\n".join(str(p) for p in parts)


# ----------------------------------------------------------------------------------------------- Home


def test_home_on_a_fresh_install_starts_the_demo_run(runs, monkeypatch):
    """profiler.collect.demo starts the demo in the background; here a stand-in writes its first run.json."""
    calls = []

    def fake_demo(runs_dir):
        calls.append(runs_dir)
        path = Path(runs_dir) / "demo"
        path.mkdir(parents=True, exist_ok=True)
        (path / "run.json").write_text(
            json.dumps(
                {
                    "status": "running",
                    "progress": {"step": 0, "steps": 4},
                    "plan": {"dp": 2, "tp": 2, "pp": 2, "sp": True, "global_batch": 8},
                    "world_size": 8,
                    "model": "tiny",
                }
            )
        )
        return path

    monkeypatch.setattr(profiler.collect.demo, "ensure_demo_run", fake_demo)
    at = _ok(page_test("pages/home.py"))
    assert calls == [runs] and at.query_params["run"] == "demo"
    assert at.selectbox(key="home_pick").value == "demo"
    (bar,) = at.get("progress")
    assert "step 0 of 4" in bar.proto.text


def test_home_lists_runs_and_keeps_the_choice_in_the_url(runs):
    install_run(runs, "alpha", started_at="2025-01-01T00:00:00+00:00")
    install_run(runs, "beta", started_at="2025-02-01T00:00:00+00:00")
    at = _ok(page_test("pages/home.py"))
    picker = at.selectbox(key="home_pick")
    labels = "DP2 TP2+SP attn-unfused no-dropout"  # the engine materialises attention scores; no dropout
    assert picker.options == [f"beta · {labels} · 4 ranks", f"alpha · {labels} · 4 ranks"]
    assert at.query_params["run"] == "beta"  # the newest, written into the URL
    rows = at.dataframe[0].value
    assert list(rows["name"]) == ["beta", "alpha"] and set(rows["status"]) == {"completed"}
    picker.set_value("alpha").run()
    _ok(at)
    assert at.query_params["run"] == "alpha" and at.subheader[0].value == "alpha"
    # a copied URL reopens the same set
    again = _ok(page_test("pages/home.py", {"run": "alpha"}))
    assert again.selectbox(key="home_pick").value == "alpha"
    assert "Steady step time" in [m.label for m in again.metric]
    # a link to a set that is not here says so, and which set it shows instead
    gone = _ok(page_test("pages/home.py", {"run": "deleted-run"}))
    assert [w.value for w in gone.warning] == [
        "There is no run or uploaded set called **deleted-run** here; showing **beta** instead."
    ]
    assert gone.query_params["run"] == "beta"


def test_home_links_open_the_run_on_every_page(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/home.py", {"run": "alpha"}))
    links = {link.proto.label: link.proto for link in at.get("page_link")}
    assert {"Collective timeline", "Topology, measured", "Activation memory", "TP scaling"} <= set(links)
    for label in ("Topology, measured", "Activation memory", "TP scaling"):
        assert "run=alpha" in links[label].query_string and "dp=2" in links[label].query_string
        assert not links[label].disabled
    assert links["Collective timeline"].query_string == "run=alpha"


def test_home_shows_a_failed_runs_rank_and_log(runs):
    run = install_run(
        runs, "broken", status="failed", error={"rank": 1, "message": "RuntimeError: injected failure at step 2"}
    )
    (run / "logs").mkdir(exist_ok=True)
    (run / "logs" / "rank1.log").write_text("step 1 ok\nTraceback (most recent call last):\nRuntimeError: injected\n")
    at = _ok(page_test("pages/home.py", {"run": "broken"}))
    assert any("failed on rank 1: RuntimeError: injected failure at step 2" in e.value for e in at.error)
    assert "RuntimeError: injected" in at.code[0].value
    assert list(at.dataframe[0].value["failing rank"]) == ["1"]


def test_home_shows_progress_of_a_running_run(runs):
    install_run(runs, "live", traces=False, status="running", progress={"step": 1, "steps": 4})
    at = _ok(page_test("pages/home.py", {"run": "live"}))
    (bar,) = at.get("progress")
    assert bar.proto.value == 25 and "step 1 of 4" in bar.proto.text
    assert at.dataframe[0].value["progress"].iloc[0] == 0.25


# -------------------------------------------------------------------------------- Collective timeline


def test_timeline_without_a_run_says_what_to_do(runs):
    at = _ok(page_test("pages/timeline.py"))
    assert "Pick a run on Home" in _text(at) and not vega_charts(at)
    at = _ok(page_test("pages/timeline.py", {"run": "nope"}))
    assert "There is no run or uploaded set called **nope**" in _text(at)
    hostile = "[Pick a run on Home](http://evil.example/x)"
    at = _ok(page_test("pages/timeline.py", {"run": hostile}))
    text = _text(at)
    # shown as text, never a link: the brackets escaped, the URL's autolink broken by a zero-width space
    assert "\\[Pick a run on Home\\](http:\u200b//" in text
    assert str(runs) not in text  # no server paths


def test_timeline_without_a_run_opens_the_latest_completed_one_and_says_so(runs):
    """A newcomer following a link without ?run= sees the latest completed run, not an empty page."""
    install_run(runs, "alpha")
    install_run(runs, "broken", status="failed", error={"rank": 1, "message": "x"})
    at = _ok(page_test("pages/timeline.py"))
    assert at.query_params["run"] == "alpha" and vega_charts(at)  # the failed run is not picked for you
    assert "the most recent completed run (the link named no run)" in _text(at)


def test_timeline_draws_every_rank_by_dimension(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/timeline.py", {"run": "alpha"}))
    overview, detail, parts, phases, heat = vega_charts(at)
    o = next(f for f in overview.datasets.values() if "busy_ms" in f)  # the Gantt's, not the path's layer
    d = detail.frame()
    assert sorted(o["rank"].unique()) == [0, 1, 2, 3] and sorted(d["rank"].unique()) == [0, 1, 2, 3]
    assert set(d["lane"]) == {"compute", "comm"}
    comm = d[d["lane"] == "comm"]
    assert {"sp", "dp"} <= set(comm["category"]) <= {"tp", "sp", "dp"}  # SP gathers/scatters, DP all-reduce
    unmerged = comm[~comm["instance"].astype(str).str.startswith("merged")]
    assert unmerged["group"].astype(str).isin(["0,1", "2,3", "0,2", "1,3"]).all()
    assert (unmerged["busbw_gbps"] > 0).all() and (unmerged["bytes"] > 0).all()
    assert (d["start_ms"] >= -1e-6).all() and (d["end_ms"] >= d["start_ms"]).all()
    # one instance of a 2-rank group: on both of its ranks
    inst = unmerged.groupby("instance", observed=True)["rank"].nunique()
    assert (inst == 2).any()
    assert "brush" in overview.text() and '"pick"' in detail.text()
    p = parts.frame()
    assert p.groupby("rank").size().eq(5).all()  # compute / overlapped / exposed / memory / idle
    assert {"Per rank", "Skew by dimension", "Stragglers", "By dimension"} == {t.label for t in at.tabs}
    assert len(at.dataframe[0].value) == 4  # one breakdown row per rank
    assert {"sp", "dp"} <= set(at.dataframe[3].value["dim"]) <= {"tp", "sp", "dp"}
    # the critical path: drawn over the overview, its time per category adds up to its length
    assert "rule" in overview.marks() and "#d6336c" in overview.text()
    on_path = at.dataframe[4].value
    assert set(on_path["category"]) <= {"compute", "host", "idle", "comm: sp", "comm: dp", "comm: tp"}
    assert on_path["ms"].gt(0).all()
    # ... to within 1 us: the path's ops are on aligned clocks (ns offsets per host), so consecutive ops
    # of two ranks may overlap by a few hundred ns (seen: 0.3 us of a 0.3 s path)
    length_ms = float(on_path["ms"].iloc[0] / on_path["share"].iloc[0])
    assert abs(on_path["ms"].sum() - length_ms) < 1e-3
    # the what-if with no change reproduces the measured step, and its phases chart has both
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Measured step"] == metrics["Predicted step"]
    assert set(phases.frame()["which"]) == {"measured", "predicted"}
    downloads = [b.proto.label for b in at.get("download_button")]
    assert downloads == ["Merged Perfetto trace (.json.gz)", "Collectives table (.csv)"]
    # all ranks x steps: one cell per (rank, traced step), its step time the breakdown's window
    h = heat.frame()
    assert sorted(h["rank"].unique()) == [0, 1, 2, 3] and sorted(h["step"].unique()) == [2, 3]
    assert len(h) == 8 and (h["step_ms"] > 0).all() and (h["late_ms"] >= 0).all()
    assert (h["exposed_ms"] <= h["step_ms"] + 1e-6).all()
    slow = at.dataframe[6].value
    assert slow["late ms (sum)"].is_monotonic_decreasing and len(slow) == 4


def test_timeline_of_a_set_too_big_for_one_gantt_shows_all_ranks_first(runs):
    replicate(sample_run() / "traces", runs / "big" / "traces", 20)  # 80 ranks: 20 shifted copies
    at = _ok(page_test("pages/timeline.py", {"run": "big"}))
    assert at.subheader[0].value == "All 80 ranks"
    heat, overview, detail, parts = vega_charts(at)
    h = heat.frame()
    assert h["rank"].nunique() == 80 and sorted(h["step"].unique()) == [2, 3]
    assert sorted(overview.frame()["rank"].unique()) == list(range(64))  # the first range of ranks
    slow = at.dataframe[0].value
    assert len(slow) == 20 and slow["late ms (sum)"].is_monotonic_decreasing
    at.radio(key="tl_heat").set_value("late_ms").run()
    assert vega_charts(_ok(at))[0].spec["encoding"]["color"]["field"] == "late_ms"


def test_timeline_says_when_no_evidence_names_the_dimension(runs):
    """A plain DDP job's whole-world all-reduce, no plan: 'world', and the page says what would label it
    (one collective, counted once across its two ranks)."""
    for rank in (0, 1):
        t = ts.gloo_cpu(rank, 2)
        t["traceEvents"].append(ts.cpu("autograd::engine::evaluate_function: MmBackward0", 700, 50))
        (runs / "ddp" / "traces").mkdir(parents=True, exist_ok=True)
        ts.write(runs / "ddp" / "traces" / f"rank{rank}_trace.json.gz", t)
    at = _ok(page_test("pages/timeline.py", {"run": "ddp"}))
    assert any(
        "tell the parallel dimension of 1 collective: 1 spans all ranks ('world')" in c.value for c in at.caption
    )
    detail = vega_charts(at)[1].frame()
    comm = detail[detail["lane"] == "comm"]
    assert set(comm["category"]) == {"world"} and (comm["busbw_gbps"] > 0).all()


def test_timeline_window_step_and_highlight_come_from_the_url(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/timeline.py", {"run": "alpha"}))
    assert at.selectbox(key="tl_step").options == ["2", "3", "all"]  # --wait 1 --warmup 1: steps 2, 3 traced
    # highlight the worst straggler: the picker lists them, the URL keeps the choice
    worst = at.dataframe[2].value["instance"].iloc[0]  # the stragglers table, worst first
    assert "skew" in at.selectbox(key="tl_inst").options[1]
    at.selectbox(key="tl_inst").set_value(worst).run()
    _ok(at)
    assert at.query_params["inst"] == worst
    detail = vega_charts(at)[1]
    assert f'"value": [{{"instance": "{worst}"}}]' in detail.text()
    # the picked instance also gets a fixed-size marker, visible at whole-step zoom where
    # a sub-pixel collective's outline is not: a point layer filtered by the pick, at its middle
    (marker,) = [la for la in detail.spec["layer"] if (la.get("mark") or {}).get("type") == "point"]
    assert {"param": "pick", "empty": False} in [t.get("filter") for t in marker["transform"]]
    assert marker["encoding"]["x"]["field"] == "mid_ms" and marker["mark"]["size"] >= 60
    shared = _ok(page_test("pages/timeline.py", {"run": "alpha", "inst": worst}))
    assert shared.selectbox(key="tl_inst").value == worst
    # a brushed window and another step, from a copied URL; the window inside step 3's own span (the
    # page clips a window to the step it shows, and step 3 may be shorter than the default view)
    over = vega_charts(_ok(page_test("pages/timeline.py", {"run": "alpha", "tl_step": "3"})))[0].spec
    span = (over["layer"][0] if "layer" in over else over)["encoding"]["x"]["scale"]["domain"]
    lo, hi = round(span[1] * 0.25, 3), round(span[1] * 0.5, 3)
    at = _ok(page_test("pages/timeline.py", {"run": "alpha", "win": f"{lo},{hi}", "tl_step": "3"}))
    assert at.selectbox(key="tl_step").value == "3"
    overview, detail, *_ = vega_charts(at)
    params = overview.spec.get("params") or overview.spec["layer"][0]["params"]
    assert params[0]["value"] == {"x": [lo, hi]}
    assert detail.spec["layer"][0]["encoding"]["x"]["scale"]["domain"] == [lo, hi]
    d = detail.frame()
    assert d["end_ms"].max() <= hi + 1e-6 and d["start_ms"].min() >= lo - 1e-6
    assert at.subheader[1].value.startswith(f"Detail: {lo:,.1f}")
    at.button(key="tl_reset").click().run()
    assert "win" not in at.query_params
    assert vega_charts(at)[1].spec["layer"][0]["encoding"]["x"]["scale"]["domain"][0] == 0


def test_timeline_of_a_failed_run_shows_its_traces_and_the_failure(runs):
    install_run(runs, "broken", status="failed", error={"rank": 3, "message": "killed by SIGKILL"})
    at = _ok(page_test("pages/timeline.py", {"run": "broken"}))
    assert any("failed on rank 3" in e.value for e in at.error)
    # traces already written are still shown (Gantt x2, breakdown, what-if phases, heat map)
    assert len(vega_charts(at)) == 5


def test_timeline_of_a_run_without_traces_waits_for_them(runs):
    install_run(runs, "live", traces=False, status="running", progress={"step": 3, "steps": 4})
    at = _ok(page_test("pages/timeline.py", {"run": "live"}))
    assert "No traces yet" in _text(at) and len(at.get("progress")) == 1 and not vega_charts(at)


# ------------------------------------------------------------------------- measured views, plan pages


def test_topology_colours_the_grid_by_measured_values(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/topology.py", {**SAMPLE_PLAN, "run": "alpha"}))
    grid, measured = vega_charts(at)
    cells = measured.frame()
    assert sorted(cells["rank"]) == [0, 1, 2, 3] and (cells["exposed_comm_ms"] > 0).all()
    assert at.subheader[-1].value == "Measured: per-rank values on alpha"
    at.segmented_control(key="topo_measure").set_value("busbw_gbps").run()
    _ok(at)
    assert (vega_charts(at)[1].frame()["busbw_gbps"] > 0).all()
    # without ?run= the page is pure planning
    assert len(vega_charts(_ok(page_test("pages/topology.py", SAMPLE_PLAN)))) == 1


def test_topology_with_a_run_of_another_size_offers_its_plan(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/topology.py", {**SAMPLE_PLAN, "dp": "4", "gb": "8", "run": "alpha"}))
    assert any("ran on 4 ranks" in i.value for i in at.info) and len(vega_charts(at)) == 1


def test_topology_of_a_set_without_a_plan_starts_from_its_inferred_layout(runs):
    """The traces of the sample run (DP2 TP2+SP) without its run.json: the layout comes from
    their process groups, and the page says so; with nothing to go on, a guess of the world size."""
    dest = runs / "noplan"
    shutil.copytree(sample_run() / "traces", dest / "traces")
    at = _ok(page_test("pages/topology.py", {"run": "noplan"}))
    assert at.query_params["dp"] == "2" and at.query_params["tp"] == "2" and at.query_params["pp"] == "1"
    assert any("came without a plan: the layout DP2 TP2" in i.value and "inferred from" in i.value for i in at.info)
    assert not any("ran on 4 ranks" in i.value for i in at.info)  # the plan fits the set: no size mismatch
    assert len(vega_charts(at)) == 2  # the plan's grid and the measured one
    # a plain 2-rank job whose groups say nothing (only the world): a guess, said to be one
    for rank in (0, 1):
        (runs / "ddp" / "traces").mkdir(parents=True, exist_ok=True)
        ts.write(runs / "ddp" / "traces" / f"rank{rank}_trace.json.gz", ts.gloo_cpu(rank, 2))
    at = _ok(page_test("pages/topology.py", {"run": "ddp"}))
    assert at.query_params["dp"] == "2" and at.query_params["tp"] == "1"
    assert any("this is a guess, DP2" in i.value for i in at.info)
    # no model named either: the page asks for it first and shows no preset's numbers as the job's
    assert "ddp names no model ParaScope knows" in at.warning[0].value and "model" not in at.query_params
    assert not any(m.label == "Memory per GPU" for m in at.metric)


def test_activation_memory_shows_measured_beside_predicted(runs):
    run = install_run(runs, "alpha")
    metrics = json.loads((run / "metrics.json").read_text())
    at = _ok(page_test("pages/activation_memory.py", {**SAMPLE_PLAN, "run": "alpha"}))
    *_, chart, state = vega_charts(at)
    assert {"bar"} == chart.marks() == state.marks()
    frame = chart.frame()
    assert sorted(frame["rank"].unique()) == [0, 1, 2, 3]
    per_rank = frame[frame["source"] == "measured"].set_index("rank")["MiB"] if "source" in frame else None
    if per_rank is not None:
        assert per_rank[0] == pytest.approx(metrics["activation_bytes"]["0"] / 2**20)
    # model state: each rank's parameters, gradients and optimizer states, measured and predicted
    held = state.frame().set_index(["rank", "kind", "source"])["MiB"]
    assert len(held) == 4 * 3 * 2
    for rank in range(4):
        for kind in ("params", "grads", "optimizer"):
            assert held[(rank, kind, "measured")] == pytest.approx(
                metrics["model_state_bytes"][str(rank)][kind] / 2**20
            )
            assert held[(rank, kind, "predicted")] == pytest.approx(held[(rank, kind, "measured")], rel=0.01)
    assert any("Model state" in m.value for m in at.markdown) and any("ZeRO-0" in c.value for c in at.caption)
    home = _ok(page_test("pages/home.py", {"run": "alpha"}))
    assert [m.value for m in home.metric if m.label == "Model state vs model"] == ["0.0 % off"]


def test_tp_scaling_overlays_the_runs_tp_group_busbw(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/tp_scaling.py", {**SAMPLE_PLAN, "run": "alpha"}))
    busbw = vega_charts(at)[2].frame()
    measured = busbw[busbw["source"] == "measured"]
    assert len(measured) >= 1 and set(measured["tp"]) == {2} and (measured["busbw_gbs"] > 0).all()
    assert set(measured["link"]) == {"loopback (intra-node)"}  # a CPU run's link, by its name


def test_tp_scaling_overlays_commbench_results(runs, tmp_path):
    # the shape of `python -m profiler commbench`'s JSON: results (one row per op, group size, link, bytes), fits, links
    bench = {
        "results": [
            {"op": "all_reduce", "group_size": 2, "bytes": 1 << 20, "busbw_gbps": 2.0, "link": "intra"},
            {"op": "all_reduce", "group_size": 2, "bytes": 1 << 24, "busbw_gbps": 3.0, "link": "intra"},
            {"op": "all_gather", "group_size": 4, "bytes": 1 << 24, "busbw_gbps": 9.0, "link": "intra"},
        ],
        "links": {"intra": {"latency_s": 5e-5, "bandwidth_bytes_per_s": 3.0e9}},
    }
    run = install_run(runs, "alpha")
    (run / "commbench.json").write_text(json.dumps(bench))
    at = _ok(page_test("pages/tp_scaling.py", {**SAMPLE_PLAN, "run": "alpha"}))
    measured = vega_charts(at)[2].frame().query("source == 'measured'")
    assert 3.0 in set(measured["busbw_gbs"].round(3))  # the largest all_reduce message of group size 2
    assert 9.0 not in set(measured["busbw_gbs"].round(3))  # all_gather rows are not the layer's all-reduce


@pytest.mark.parametrize("traces", [True, False])
def test_a_cancelled_run_says_what_it_kept_and_shows_it(runs, traces):
    """The page never says "Traces already written are kept" beside "No traces yet" on the same page."""
    install_run(runs, "stopped", traces=traces, status="running")
    job = jobs.start([sys.executable, "-c", "import time; time.sleep(60)"], name="stopped", runs_dir=runs)
    jobs.cancel(job, grace_s=1)  # cancelled from the dashboard, as the Home page's button does
    deadline = time.monotonic() + 20
    while jobs.alive(jobs.refresh(job)) and time.monotonic() < deadline:
        time.sleep(0.1)
    at = _ok(page_test("pages/timeline.py", {"run": "stopped"}))
    assert trace_sets.find_set("stopped").status == "cancelled"
    text = _text(at)
    assert "No traces yet" not in text
    if traces:
        assert "trace files written before it stopped are kept and shown below" in text and vega_charts(at)
    else:
        assert "nothing to show" in text and not vega_charts(at)


# ----------------------------------------------------------------------- calibrated prediction


def test_home_fits_a_calibration_and_shows_predicted_beside_measured(runs):
    install_run(runs, "alpha")
    at = _ok(page_test("pages/home.py", {"run": "alpha"}))
    assert "No calibrated step-time model yet" in _text(at)
    assert "Predicted step (calibrated)" not in {m.label for m in at.metric}
    # fit one from the run itself, in the page: the file is written, every run then shows its prediction
    at.multiselect[0].select("alpha")  # a form: the choice goes with the submit
    next(b for b in at.button if b.label == "Fit and save").click()
    _ok(at.run(timeout=120))
    cal = json.loads((runs / "calibration.json").read_text())
    assert [s["path"] for s in cal["sources"]] == [str(runs / "alpha")] and cal["layer_fixed_s"] >= 0
    at = _ok(page_test("pages/home.py", {"run": "alpha"}))
    metric = next(m for m in at.metric if m.label == "Predicted step (calibrated)")
    assert metric.value.endswith(" s") and "% vs measured" in metric.delta
    chart = next(c for c in vega_charts(at) if "rule" in c.marks())
    phases = next(f for f in chart.datasets.values() if "phase" in f.columns)
    assert phases["ms"].gt(0).all() and "compute" in set(phases["phase"])
    assert "profiler attached" in _text(at)  # the sample run traced every step after its first


def _upload(name: str, files: list[tuple[str, bytes]], plan, model) -> Path:
    """An uploaded set, stored as the Upload page stores one."""
    checked = uploads.check_files(files)
    return uploads.store(name, checked.accepted, uploads=trace_sets.uploads_dir(), plan=plan, model=model)


def test_home_fits_a_calibration_from_uploaded_sets_for_their_device(runs):
    """In the dashboard: an uploaded set with a plan and a model is something to fit from; a
    CPU job's traces give a CPU calibration equal to the CLI's from the same folder, a GPU job's a GPU one
    (a device per rank), and sets of both kinds are refused in one fit."""
    run = json.loads((sample_run() / "run.json").read_text())
    cpu_files = [(p.name, p.read_bytes()) for p in sorted((sample_run() / "traces").glob("rank*_trace.json.gz"))]
    cpu = _upload("cpu-job", cpu_files, Plan.from_dict(run["plan"]), MODELS["tiny"])
    gpu_files = [(f"rank{r}_trace.json", json.dumps(t).encode()) for r, t in enumerate(ts.gpu_pair())]
    _upload("gpu-job", gpu_files, Plan(tp=2, global_batch=1), "tiny")
    _upload("no-model", cpu_files, Plan.from_dict(run["plan"]), None)  # no model: nothing to fit

    def fit_from(*names):
        at = _ok(page_test("pages/home.py"))
        form = next(m for m in at.multiselect if "uploaded sets" in m.label)
        labels = " | ".join(form.options)
        assert "cpu-job" in labels and "gpu-job" in labels and "no-model" not in labels
        for n in names:
            form.select(f"upload:{n}")
        next(b for b in at.button if b.label == "Fit and save").click()
        return _ok(at.run(timeout=120))

    fit_from("cpu-job")
    cal = json.loads((runs / "calibration.json").read_text())
    assert cal["device"] == "cpu" and [s["path"] for s in cal["sources"]] == [str(cpu)]
    assert calibrate.main([str(cpu), f"--out={runs.parent / 'cli.json'}", f"--cores={cal['cores']}"]) == 0
    cli = json.loads((runs.parent / "cli.json").read_text())
    assert (cal["layer_fixed_s"], cal["flop_s"], cal["beta_s_per_byte"]) == (
        cli["layer_fixed_s"],
        cli["flop_s"],
        cli["beta_s_per_byte"],
    )
    fit_from("gpu-job")
    cal = json.loads((runs / "calibration.json").read_text())
    assert (cal["device"], cal["cores"], cal["overlaps"]) == ("gpu", 0, True)
    at = fit_from("cpu-job", "gpu-job")
    assert any("mix GPU ranks" in e.value for e in at.error)
    assert json.loads((runs / "calibration.json").read_text())["device"] == "gpu"  # the last good one kept


def test_home_says_when_the_calibration_is_unusable(runs):
    install_run(runs, "alpha")
    (runs / "calibration.json").write_text('{"layer_fixed_s": 1}')
    at = _ok(page_test("pages/home.py", {"run": "alpha"}))
    assert any("calibration lacks flop" in w.value for w in at.warning)  # the fields, markdown-escaped


def test_plan_review_shows_calibrated_and_measured_beside_the_analytic_step(runs):
    """A plan that a run here ran gets its measured step; the calibrated model's step sits
    beside the analytic one -- only when the calibration was measured on the cluster's kind of device."""
    run = json.loads((install_run(runs, "alpha") / "run.json").read_text())
    metrics = json.loads((runs / "alpha" / "metrics.json").read_text())
    model, plan = Model.from_dict(run["model"]), Plan.from_dict(run["plan"])
    other = Plan.from_dict({**run["plan"], "global_batch": run["plan"]["global_batch"] * 2})  # never ran
    bad = Plan.from_dict({**run["plan"], "tp": 1, "dp": 4})  # SP without TP: the plan model gives no step
    review = ReviewState(
        model=model,
        cluster="local-cpu",
        nodes=1,
        plans=(NamedPlan("ran", plan), NamedPlan("new", other), NamedPlan("bad", bad)),
    )
    params = review_to_params(review)
    cal = Calibration(1e-3, 1e-10, 2e-3, 5e-3, 1e-4, 1e-9, cores=2, device="cpu", sources=[{"plan": "hand-made"}])
    (runs / "calibration.json").write_text(json.dumps(cal.to_dict()))
    at = _ok(page_test("pages/plan_review.py", params))
    table = next(d.value for d in at.dataframe if "calibrated s" in d.value.columns).set_index("plan")
    expected = predict(model, plan, cal, ranks_here=plan.world_size, cluster=cluster_preset("local-cpu"))
    assert table.loc["ran", "calibrated s"] == pytest.approx(expected["step_time_s"], abs=1e-3)
    measured = float(pd.Series(metrics["step_time_s"][1:]).median())  # profiled after its first step
    assert table.loc["ran", "measured s"] == pytest.approx(measured, abs=1e-3)
    assert table.loc["ran", "measured by"] == "alpha"
    assert table.loc["ran", "calibrated error %"] == pytest.approx(
        (expected["step_time_s"] / measured - 1) * 100, abs=0.5
    )
    assert pd.isna(table.loc["new", "measured s"]) and table.loc["new", "calibrated s"] > 0
    assert pd.isna(table.loc["bad", "analytic s"]) and pd.isna(table.loc["bad", "calibrated s"])
    chart = next(c for c in vega_charts(at) if "yOffset" in c.text())
    assert set(chart.frame()["source"]) == {"analytic", "calibrated", "measured"}
    # the calibrated step's parts, stacked per plan: they add up to the calibrated step
    parts = next(c for c in vega_charts(at) if "Calibrated step time" in c.text()).frame()
    assert parts.groupby("plan")["seconds"].sum()["ran"] == pytest.approx(expected["step_time_s"])
    assert {"compute", "per-step fixed"} <= set(parts["part"])
    # the same calibration says nothing about an H100 cluster: no calibrated column, and the page says why
    at = _ok(page_test("pages/plan_review.py", {**params, "cluster": "dgx-h100"}))
    assert not any("calibrated s" in d.value.columns for d in at.dataframe)
    assert "measured on CPU ranks and this cluster runs on GPUs" in _text(at)


@pytest.mark.parametrize(
    ("gpu", "memory", "cluster", "gpumem"),
    [
        ("Tesla V100-SXM2-32GB", 34_089_730_048, "dgx-h100", "31.75"),  # no preset of it: the job's memory
        ("NVIDIA A100-SXM4-40GB", 42_314_694_656, "dgx-a100-40gb", None),  # its own cluster
    ],
)
def test_plan_pages_take_the_gpu_from_the_traces(runs, gpu, memory, cluster, gpumem):
    """An upload names no cluster: the plan pages take the GPU and its memory from the traces'
    deviceProperties, say so, and never check the job against a preset's 80 GiB."""
    (runs / "gpujob" / "traces").mkdir(parents=True)
    for rank, data in enumerate(ts.gpu_pair()):
        data["deviceProperties"] = [{"id": 0, "name": gpu, "totalGlobalMem": memory}]
        ts.write(runs / "gpujob" / "traces" / f"rank{rank}_trace.json.gz", data)
    at = _ok(page_test("pages/activation_memory.py", {"run": "gpujob"}))
    assert "gpujob names no model ParaScope knows" in at.warning[0].value  # asked first; then picked
    at.selectbox(key="plan_ask_model").select("gpt3-22b").run()
    assert at.query_params["cluster"] == cluster
    assert at.query_params.get("gpumem") == gpumem
    assert any(f"deviceProperties name the GPU: {gpu}, {memory / 2**30:,.1f} GiB" in i.value for i in at.info)
    shown = memory if gpumem else CLUSTERS[cluster].gpu_memory_bytes  # 39.4 GiB reported of a 40 GiB A100
    assert [m.value for m in at.metric if m.label == "GPU memory"] == [f"{shown / 2**30:,.0f} GiB"]
    if gpumem:
        assert any("ParaScope has no cluster of it" in i.value for i in at.info)
        assert any("the job's own (from its traces)" in c.value for c in at.sidebar.caption)


def test_timeline_counts_each_collective_once_across_its_ranks(runs):
    """The headline's Collectives and the per-dimension table count a collective once, however many
    ranks took part (an instance), not its calls times its ranks."""
    install_run(runs, "alpha")
    table = TraceAnalysis.load(runs / "alpha", cache=False).collectives
    at = _ok(page_test("pages/timeline.py", {"run": "alpha", "tl_step": "2"}))
    rows = table[table["step"] == 2]
    (shown,) = [m.value for m in at.metric if m.label == "Collectives"]
    assert shown == f"{rows['instance'].nunique():,}" and rows["instance"].nunique() < len(rows)
    dims = next(d.value for d in at.dataframe if "calls (all ranks)" in d.value.columns).set_index("dim")
    for dim, calls in rows.groupby(rows["dim"].astype(str)):
        assert dims.loc[dim, "collectives"] == calls["instance"].nunique()
        assert dims.loc[dim, "calls (all ranks)"] == len(calls)


def test_home_says_a_running_job_started_not_ran(runs):
    run = TraceSet(id="r", kind="run", name="r", path=runs, status="running", started_at="2026-01-02T07:53:06")
    assert run.when == "started 2026-01-02 07:53:06, still running"
    done = TraceSet(
        id="r",
        kind="run",
        name="r",
        path=runs,
        status="completed",
        started_at="2026-01-02T07:53:06",
        finished_at="2026-01-02T07:55:00",
    )
    assert done.when == "ran 2026-01-02 07:53:06 → 2026-01-02 07:55:00"
    install_run(runs, "live", status="running", started_at="2026-01-02T07:53:06")
    at = _ok(page_test("pages/home.py", {"run": "live"}))
    assert any(c.value.startswith("started 2026-01-02 07:53:06, still running") for c in at.caption)
    assert not any(c.value.startswith("ran ") for c in at.caption)


def test_timeline_measures_the_step_it_shows(runs):
    """One measured step on the page: the picked step's mean rank window, in the headline and in the
    what-if alike; a link to a step the set lacks says so instead of showing another."""
    install_run(runs, "alpha")
    windows = load_traces(runs / "alpha" / "traces", cache=False).step_windows
    for step in ("2", "3"):
        at = _ok(page_test("pages/timeline.py", {"run": "alpha", "tl_step": step}))
        shown = [m.value for m in at.metric if m.label == "Measured step"]
        want = f"{step_time_s(windows, int(step)) * 1e3:,.2f} ms"
        assert shown == [want, want]  # the headline and the what-if
        (predicted,) = [m for m in at.metric if m.label == "Predicted step"]
        assert predicted.value == want and not predicted.delta  # no change: no red "+0.0%"
        # the critical path's caption names the step's span, the same as the overview's axis
        assert any("of the step's" in c.value and "ms span (first start to last end" in c.value for c in at.caption)
    every = _ok(page_test("pages/timeline.py", {"run": "alpha", "tl_step": "all"}))
    assert [m.value for m in every.metric if m.label == "Measured step"][0] == f"{step_time_s(windows) * 1e3:,.2f} ms"
    # a plain `step=` works as tl_step does; a step the set lacks is said, not silently replaced
    assert _ok(page_test("pages/timeline.py", {"run": "alpha", "step": "3"})).selectbox(key="tl_step").value == "3"
    at = _ok(page_test("pages/timeline.py", {"run": "alpha", "step": "999"}))
    assert any(
        "asks for step 999, which these traces do not have (their steps: 2, 3); showing step 2" in w.value
        for w in at.warning
    )


def test_timeline_of_one_rank_of_a_larger_job_counts_it_once(runs):
    """Rank 3 of an 8-rank job: '1 of 8' ranks, never 'All 1 ranks' or the job's 8 as if traced."""
    (runs / "one" / "traces").mkdir(parents=True)
    ts.write(runs / "one" / "traces" / "rank3_trace.json.gz", ts.gloo_cpu(3, 8))
    at = _ok(page_test("pages/timeline.py", {"run": "one"}))
    assert [m.value for m in at.metric if m.label == "Ranks"] == ["1 of 8"]
    assert "The one rank traced" in [s.value for s in at.subheader]
    assert not any("All 1 ranks" in s.value for s in at.subheader)
    assert "1 rank traced" in _text(at) and "8 ranks" not in _text(at)


def test_home_shows_why_the_demo_job_cannot_start(runs, monkeypatch):
    """A demo job whose process exits before it claims its directory (here: a plan it refuses) shows
    its error and its log's tail on Home within seconds, instead of spinning."""
    real = demo_mod.ensure_demo_run
    monkeypatch.setattr(demo_mod, "ensure_demo_run", lambda runs_dir: real(runs_dir, flags=("--dp", "0")))
    started = time.monotonic()
    at = _ok(page_test("pages/home.py"))
    assert time.monotonic() - started < 60  # the process's own start; never the page's spin
    (error,) = [e.value for e in at.error]
    assert error.startswith("The demo job failed to start: the demo run exited with code 2 before it started")
    (log,) = at.code
    assert "dp" in log.value and "error" in log.value.lower()
    assert [b.label for b in at.button] == ["Try again"]
