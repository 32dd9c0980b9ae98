"""The run pages' data and charts without Streamlit: profiler.analyzers.aggregates and ui.run_tables on hand-made analyzer frames (exact
numbers), ui.timeline_charts specs via chart.to_dict(), and the purity of the run modules."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pandas as pd
import pytest

from profiler.analyzers import aggregates
from profiler.collect import uploads
from profiler.collect.trace_sets import read_upload
from tests.support import trace_samples as ts
from tests.support.apptest import ROOT
from ui import run_tables, timeline_charts
from ui.selection import rank_count_text

MS = 1_000_000


def _bd(rows):
    cols = [
        "rank",
        "step",
        "start_ns",
        "end_ns",
        "window_ns",
        "compute_ns",
        "comm_ns",
        "overlapped_comm_ns",
        "exposed_comm_ns",
        "memory_ns",
        "idle_ns",
    ]
    frame = pd.DataFrame(rows, columns=cols)
    return frame.assign(exposed_memory_ns=frame["memory_ns"])  # no copy under compute in these rows


BD = _bd(
    [
        # rank step start end   window compute comm  overlapped exposed memory idle  (ms, times MS below)
        (0, 1, 0, 10, 10, 6, 3, 1, 2, 0, 2),
        (1, 1, 1, 12, 11, 4, 6, 0, 6, 1, 0),
        (0, 2, 10, 20, 10, 5, 5, 5, 0, 0, 5),
        (1, 2, 12, 21, 9, 3, 3, 0, 3, 0, 3),
    ]
).assign(
    **{
        c: lambda d, c=c: d[c] * MS
        for c in [
            "start_ns",
            "end_ns",
            "window_ns",
            "compute_ns",
            "comm_ns",
            "overlapped_comm_ns",
            "exposed_comm_ns",
            "memory_ns",
            "exposed_memory_ns",
            "idle_ns",
        ]
    }
)


def test_breakdown_parts_stack_to_the_window():
    parts = run_tables.breakdown_parts(BD, 1)
    totals = parts.groupby("rank")["ms"].sum()
    assert totals.to_dict() == {0: 10.0, 1: 11.0}
    r1 = parts[parts["rank"] == 1].set_index("part")["ms"]
    assert r1["compute"] == 4 and r1["comm exposed"] == 6 and r1["memory copies"] == 1 and r1["idle"] == 0
    assert run_tables.breakdown_parts(BD, aggregates.ALL).groupby("rank")["ms"].sum().to_dict() == {0: 20.0, 1: 20.0}


def test_breakdown_table_and_rank_values():
    table = run_tables.breakdown_table(BD, 2)
    assert list(table["rank"]) == [0, 1] and list(table["exposed comm ms"]) == [0.0, 3.0]
    assert table["exposed share"].round(3).tolist() == [0.0, round(3 / 9, 3)]
    coll = pd.DataFrame({"rank": [0, 0, 1], "busbw_gbps": [1.0, 3.0, np.nan]})
    inst = pd.DataFrame({"late_rank": [1, 1, 0, -1]})
    values = run_tables.rank_values(BD, coll, inst)
    assert values.loc[1, "exposed_comm_ms"] == 4.5 and values.loc[0, "busbw_gbps"] == 2.0
    assert np.isnan(values.loc[1, "busbw_gbps"]) and values["late_count"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "step, offsets, span",
    [
        (1, None, (0, 12 * MS)),
        (aggregates.ALL, None, (0, 21 * MS)),
        (2, pd.DataFrame({"rank": [0, 1], "offset_ns": [0, -2 * MS]}), (10 * MS, 20 * MS)),  # rank 1: 10-19
    ],
)
def test_step_span_on_the_aligned_clock(step, offsets, span):
    assert run_tables.step_span(BD, offsets, step) == span


def test_gantt_frame_times_groups_and_busbw():
    rects = pd.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "lane": ["compute", "comm", "comm", "comm"],
            "start_ns": [5 * MS, 6 * MS, 6 * MS, 8 * MS],
            "end_ns": [6 * MS, 8 * MS, 9 * MS, 9 * MS],
            "name": ["aten::mm", "ps.comm dim=tp ...", "ps.comm dim=tp ...", "x"],
            "op": ["", "all_reduce", "all_reduce", "send"],
            "dim": ["", "tp", "tp", ""],
            "instance": ["", "0,1#3", "0,1#3", ""],
            "bytes": pd.array([pd.NA, 4096, 4096, pd.NA], dtype="Int64"),
            "n_events": [1, 1, 1, 5],
            "busy_ns": [MS, 2 * MS, 3 * MS, MS // 2],
            "merged": [False, False, False, True],
        }
    )
    table = pd.DataFrame({"rank": [0, 1], "instance": ["0,1#3", "0,1#3"], "busbw_gbps": [2.5, 1.5]})
    g = run_tables.gantt_frame(rects, table, t0_ns=5 * MS)
    assert g["start_ms"].tolist() == [0.0, 1.0, 1.0, 3.0] and g["end_ms"].tolist() == [1.0, 3.0, 4.0, 4.0]
    assert g["start_ms"].dtype == "float32" and g["rank"].dtype == "int32"  # narrow: this goes to the browser
    assert g["category"].astype(str).tolist() == ["compute", "tp", "tp", "unknown"]
    assert g["group"].astype(str).tolist() == ["", "0,1", "0,1", ""]
    assert g["busbw_gbps"].tolist()[1:3] == [2.5, 1.5]
    assert g["instance"].astype(str).tolist()[:3] == ["", "0,1#3", "0,1#3"]
    assert g["instance"].astype(str).iloc[3] == f"merged 1:{8 * MS}"  # a merged rectangle selects only itself
    assert g["busy_pct"].tolist()[3] == 50.0


def test_tp_measured_by_group_size_and_link():
    table = pd.DataFrame(
        {
            "dim": ["tp", "tp", "sp", "dp", "tp"],
            "op": ["all_reduce"] * 2 + ["all_gather", "all_reduce", "all_reduce"],
            "group": ["0,1", "0,1", "0,1", "0,2", "1,9"],
            "group_size": [2, 2, 2, 2, 2],
            "bytes": [100, 300, 50, 10, 100],
            "busbw_gbps": [1.0, 3.0, 2.0, 9.0, 0.5],
        }
    )
    node = {0: "a", 1: "a", 2: "a", 9: "b"}
    m = aggregates.tp_measured(table, node).set_index(["tp", "sp", "link", "op"])
    # links in the plan model's words: the page names them for its cluster (theme.link_names)
    assert m.loc[(2, False, "intra", "all_reduce"), "busbw_bytes_per_s"] == 2e9  # the median of 1 and 3 GB/s
    assert m.loc[(2, False, "inter", "all_reduce"), "n"] == 1
    assert m.loc[(2, True, "intra", "all_gather"), "busbw_bytes_per_s"] == 2e9
    assert len(m) == 3  # the DP all-reduce is not a TP point


def test_commbench_points_take_the_largest_all_reduce_message():
    data = {
        "results": [
            {"op": "all_reduce", "nranks": 4, "bytes": 1024, "busbw_gbps": 1.0},
            {"op": "all_reduce", "nranks": 4, "bytes": 1 << 24, "busbw_gbps": 7.0},
            {"op": "all_to_all", "nranks": 4, "bytes": 1 << 24, "busbw_gbps": 3.0},
        ]
    }
    points = aggregates.commbench_points(data)
    assert points[["tp", "link", "busbw_bytes_per_s"]].values.tolist() == [[4, "intra", 7e9]]
    assert aggregates.commbench_points({"results": []}).empty and aggregates.commbench_points({}).empty


def test_skew_table_and_metrics_summary():
    inst = pd.DataFrame(
        {
            "instance": ["a", "b", "c", "d"],
            "dim": ["tp", "tp", "dp", "tp"],
            "op": ["all_reduce"] * 4,
            "n_ranks": [2, 2, 4, 1],
            "skew_ns": [MS, 3 * MS, 5 * MS, 0],
            "late_rank": [1, 1, 3, -1],
        }
    )
    steps = pd.Series({"a": 1, "b": 1, "c": 2, "d": 1})
    skew = aggregates.skew_table(inst, steps, 1)
    assert skew.to_dict("records") == [
        {
            "dim": "tp",
            "op": "all_reduce",
            "instances": 2,
            "median_skew_ms": 2.0,
            "p95_skew_ms": pytest.approx(2.9),
            "max_skew_ms": 3.0,
            "most_often_late_rank": 1,
            "times_late": 2,
        }
    ]
    head = aggregates.metrics_summary(
        {
            "step_time_s": [5.0, 1.0, 2.0, 3.0],
            "loss": [6.0, 5.5],
            "activation_bytes": {"0": 110},
            "predicted_activation_bytes": {"0": 100},
        }
    )
    assert head == {
        "step_time_s": 2.0,
        "loss_first": 6.0,
        "loss_last": 5.5,
        "act_error_pct": pytest.approx(10.0),
        "state_error_pct": None,  # a run from before model-state measurement
    }
    state = {"params": 100, "grads": 100, "optimizer": 200}
    head = aggregates.metrics_summary(
        {
            "model_state_bytes": {"0": state, "1": {**state, "optimizer": 190}},
            "predicted_model_state_bytes": {"0": state, "1": state},
        }
    )
    assert head["state_error_pct"] == pytest.approx(5.0) and head["act_error_pct"] is None
    assert aggregates.metrics_summary(None)["step_time_s"] is None


def test_timeline_chart_specs():
    frame = pd.DataFrame(
        {
            "rank": [0, 1],
            "lane": pd.Categorical(["compute", "comm"], categories=["compute", "memory", "comm"]),
            "start_ms": [0.0, 1.0],
            "end_ms": [1.0, 2.0],
            "category": ["compute", "tp"],
            "label": ["aten::mm", "all_reduce"],
            "op": ["", "all_reduce"],
            "dim": ["", "tp"],
            "bytes": [np.nan, 64.0],
            "group": ["", "0,1"],
            "busbw_gbps": [np.nan, 1.0],
            "n_events": [1, 1],
            "busy_pct": [100.0, 100.0],
            "busy_ms": [1.0, 1.0],
            "instance": ["", "0,1#0"],
        }
    )
    over = timeline_charts.gantt_overview_chart(
        frame[run_tables.OVERVIEW_COLUMNS], span=(0.0, 2.0), window=(0.5, 1.5)
    ).to_dict()
    rects, box = over["layer"]
    fields = {t["field"] for t in rects["encoding"]["tooltip"]}
    assert fields <= set(run_tables.OVERVIEW_COLUMNS) | {"dur_ms"}  # computed in the browser
    assert box["mark"]["strokeDash"] == [4, 3]  # the detail window, outlined
    assert (
        "layer"
        not in timeline_charts.gantt_overview_chart(frame[run_tables.OVERVIEW_COLUMNS], span=(0.0, 2.0)).to_dict()
    )
    assert {k: v for k, v in over["params"][0].items() if k != "views"} == {
        "name": "brush",
        "select": {"type": "interval", "encodings": ["x"]},
        "value": {"x": [0.5, 1.5]},
    }
    assert rects["encoding"]["color"]["scale"]["domain"] == ["compute", "tp"]
    # a strip per class in each rank's row, and a merged span as opaque as it is busy
    assert rects["encoding"]["yOffset"]["scale"]["domain"] == ["compute", "tp"]
    assert rects["encoding"]["opacity"]["field"] == "busy_pct"
    assert rects["encoding"]["y"]["axis"]["labelOverlap"] is False  # every rank labelled (not every other)
    assert rects["encoding"]["opacity"]["scale"] == {"domain": [0, 100], "range": [0.12, 1.0]}
    detail = timeline_charts.gantt_detail_chart(frame, window=(0.5, 1.5), highlight="0,1#0").to_dict()
    comm = detail["layer"][1]
    assert {"filter": "datum.lane == 'comm'"} in comm["transform"]
    assert detail["params"][0]["value"] == [{"instance": "0,1#0"}] or comm["params"][0]["value"] == [
        {"instance": "0,1#0"}
    ]
    assert detail["layer"][0]["encoding"]["yOffset"]["scale"]["domain"] == ["compute", "comm"]
    hover = [{t["field"] for t in layer["encoding"]["tooltip"]} for layer in detail["layer"]]
    assert (
        "busbw_gbps" not in hover[0] and {"bytes", "group", "busbw_gbps"} <= hover[1]
    )  # no empty comm fields on compute
    parts = run_tables.breakdown_parts(BD, 1)
    bar = timeline_charts.breakdown_chart(parts).to_dict()
    assert bar["encoding"]["y"]["stack"] == "zero" and bar["mark"]["type"] == "bar"


def test_run_modules_import_neither_streamlit_nor_torch():
    pure = [
        "profiler.collect.jobs",
        "profiler.collect.trace_sets",
        "profiler.collect.uploads",
        "profiler.analyzers.aggregates",
        "ui.run_tables",
        "ui.timeline_charts",
        "ui.demo",
    ]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in pure)
        + "bad = [m for m in ('streamlit', 'torch') if m in sys.modules]\nprint(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_rank_counts_say_how_many_of_the_jobs_ranks_were_traced():
    assert rank_count_text(8, 1) == "1 of 8 ranks traced"
    assert rank_count_text(8, 8) == "8 ranks" and rank_count_text(1, 1) == "1 rank"
    assert rank_count_text(None, 3) == "3 ranks traced" and rank_count_text(None, 0) == "ranks unknown"


def test_an_archive_upload_counts_the_ranks_it_holds_not_its_files(tmp_path):
    """One zip of 12 rank files, stored by the Upload page's store: 12 ranks traced, not 1."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for r in range(12):
            zf.writestr(f"rank{r}_trace.json", json.dumps(ts.gloo_cpu(r, 12)))
    checked = uploads.check_files([("set.zip", buf.getvalue())])
    s = read_upload(uploads.store("zipped", checked.accepted, uploads=tmp_path))
    assert s.trace_files == 1 and s.ranks_traced == 12
    assert rank_count_text(s.world_size, s.ranks_traced) == "12 ranks"
