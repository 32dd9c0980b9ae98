"""Analyzers on hand-written traces with exact expected numbers (collectives, matching, clocks,
breakdown, per-dim totals, level of detail, exports)."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pandas as pd
import pytest

from profiler import load_traces
from profiler.analyzers import collectives
from profiler.analyzers.breakdown import breakdown, comm_by_dim
from profiler.analyzers.export import export_collectives, export_perfetto
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.matching import clock_offsets, instances, per_rank_wait, stragglers
from profiler.analyzers.replay import Scenario
from profiler.analyzers.timeline import timeline
from profiler.analyzers.whatif import whatif
from profiler.traces.errors import PlanMismatchError
from profiler.traces.intervals import running_max
from tests.conftest import ROOT
from tests.support import trace_samples as ts
from ui import run_tables as sm
from ui.whatif_tables import op_label

US = 1000  # ns


def _load(tmp_path, traces, **kw):
    for rank, t in enumerate(traces):
        ts.write(tmp_path / f"rank{rank}_trace.json.gz", t)
    return load_traces(tmp_path, cache=False, **kw)


@pytest.fixture
def pair(tmp_path):
    return _load(tmp_path, ts.gpu_pair())


def test_gpu_collective_row_borrows_its_launch_metadata(pair):
    table = collectives(pair)
    assert len(table) == 2 and table.attrs["not_collectives"] == {}
    row = table[table["rank"] == 0].iloc[0]
    assert (row["source"], row["op"], row["dim"], row["dim_source"]) == ("kernel", "all_reduce", "tp", "group_desc")
    assert (row["bytes"], row["bytes_source"], row["group"], row["group_size"]) == (4000, "msg_nelems", "0,1", 2)
    assert row["dur_ns"] == 300 * US and row["step"] == 1 and row["seq"] == 0 and row["seq_source"] == "order"
    assert row["algbw_gbps"] == pytest.approx(4000 / (300 * US))  # bytes per ns = GB/s
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)
    for rank in (0, 1):  # event and cpu_event are rows of that rank's events
        row, ev = table[table["rank"] == rank].iloc[0], pair.rank_events(rank)
        assert ev.loc[row["event"], "kind"] == "comm" and ev.loc[row["cpu_event"], "name"] == "c10d::allreduce_"
    assert set(table["instance"]) == {"0,1#0"}


@pytest.mark.parametrize(
    "plan, dim, source", [({"tp": 2}, "tp", "plan"), ({"dp": 2}, "dp", "plan"), (None, "tp", "group_desc")]
)
def test_dimension_from_plan_then_group_description(pair, plan, dim, source):
    row = collectives(pair, plan).iloc[0]
    assert (row["dim"], row["dim_source"]) == (dim, source)


def test_plan_of_another_world_size_is_a_typed_error(pair):
    with pytest.raises(PlanMismatchError, match=r"= 4 ranks, but the traces come from a job of world size 2"):
        collectives(pair, {"tp": 4})


def test_matching_skew_wait_and_late_rank(pair):
    inst = instances(pair)
    assert len(inst) == 1
    one = inst.iloc[0]
    assert (one["n_ranks"], one["skew_ns"], one["late_rank"], one["early_rank"]) == (2, 50 * US, 1, 0)
    waits = per_rank_wait(pair).set_index("rank")
    assert waits.loc[0, "wait_ns"] == 50 * US and waits.loc[0, "transfer_ns"] == 250 * US
    assert waits.loc[1, "wait_ns"] == 0 and waits.loc[1, "transfer_ns"] == 250 * US
    assert bool(waits.loc[1, "late"]) and not bool(waits.loc[0, "late"])
    assert stragglers(pair).iloc[0]["late_rank"] == 1


def test_clocks_of_other_hosts_are_aligned_on_collective_ends(tmp_path):
    a, b = ts.gpu_pair()
    for e in b["traceEvents"]:
        if "ts" in e:
            e["ts"] += 1000  # rank 1's host clock runs 1 ms ahead
    b["host_name"] = "h1"
    traces = _load(tmp_path, [a, b])
    off = clock_offsets(traces).set_index("rank")
    assert off.loc[0, "offset_ns"] == 0 and off.loc[1, "offset_ns"] == -1000 * US
    assert off.loc[1, "method"] == "collective ends" and off.loc[1, "instances"] == 1
    assert instances(traces).iloc[0]["skew_ns"] == 50 * US  # as if the clocks agreed
    assert instances(traces, align="none").iloc[0]["skew_ns"] == 1050 * US
    (tmp_path / "same").mkdir()
    same = clock_offsets(_load(tmp_path / "same", ts.gpu_pair()))
    assert set(same["offset_ns"]) == {0} and set(same["method"]) == {"one clock (same host)"}


def test_gpu_breakdown_exact(pair):
    bd = breakdown(pair).set_index("rank")
    assert bd.loc[0, "step"] == 1 and bd.loc[0, "device"] == "gpu"
    want0 = dict(
        window_ns=600,
        compute_ns=300,
        comm_ns=300,
        overlapped_comm_ns=100,
        exposed_comm_ns=200,
        memory_ns=50,
        exposed_memory_ns=50,  # the copy [650, 700) runs after compute and comm
        idle_ns=50,
    )
    want1 = dict(want0, comm_ns=250, overlapped_comm_ns=50)
    for rank, want in ((0, want0), (1, want1)):
        assert {k: bd.loc[rank, k] for k in want} == {k: v * US for k, v in want.items()}
    by_dim = comm_by_dim(pair).set_index("rank")
    assert by_dim.loc[0, "dim"] == "tp" and by_dim.loc[0, "bytes"] == 4000
    assert by_dim.loc[0, "comm_ns"] == 300 * US and by_dim.loc[0, "exposed_comm_ns"] == 200 * US


@pytest.mark.parametrize("annotated", [False, True])
def test_cpu_only_gloo_counts_each_collective_once(tmp_path, annotated):
    traces = _load(tmp_path, [ts.gloo_cpu(annotated=annotated)])
    table = collectives(traces)
    assert len(table) == 1  # the c10d call, its nested ops and the gloo worker event are one collective
    row = table.iloc[0]
    if annotated:
        assert (row["op"], row["dim"], row["bytes"], row["bytes_source"]) == ("reduce_scatter", "dp", 800, "annotation")
        assert (row["start_ns"], row["group"], row["seq_source"]) == (
            traces.events["ts_ns"].min() + 195 * US,
            "0,1",
            "annotation",
        )
    else:
        assert (row["op"], row["bytes"], row["bytes_source"]) == ("all_reduce", 400, "input_dims")
        assert row["dim"] == "unknown"
    assert row["dur_ns"] == (600 - (195 if annotated else 200)) * US  # until the gloo worker finished
    bd = breakdown(traces).iloc[0]
    compute = 480 if annotated else 490
    comm = 405 if annotated else 400
    assert (bd["step"], bd["device"], bd["window_ns"]) == (3, "cpu", 1000 * US)
    assert bd["compute_ns"] == compute * US and bd["comm_ns"] == comm * US
    assert bd["overlapped_comm_ns"] == (285 if annotated else 290) * US
    assert bd["exposed_comm_ns"] == bd["comm_ns"] - bd["overlapped_comm_ns"]
    assert bd["idle_ns"] == 400 * US


def test_breakdown_never_nan_without_steps_or_collectives(tmp_path):
    t = ts.trace(0, 1, [ts.cpu("aten::mm", 0, 10), ts.cpu("aten::add", 20, 10)], backend="gloo")
    traces = _load(tmp_path, [t])
    bd = breakdown(traces)
    assert len(bd) == 1 and bd.iloc[0]["step"] == -1
    assert not bd.isna().any().any()
    assert (bd.iloc[0]["compute_ns"], bd.iloc[0]["comm_ns"], bd.iloc[0]["idle_ns"]) == (20 * US, 0, 10 * US)
    assert collectives(traces).empty and instances(traces).empty and comm_by_dim(traces).empty


def test_timeline_level_of_detail(tmp_path):
    events = [ts.annotation("ProfilerStep#1", 0, 100_000)]
    for i in range(1000):  # 1000 kernels of 5 us; every 100th gap is long
        start = i * 10 + (i // 100) * 500
        events += [ts.runtime(start, 1, corr=i + 1), ts.kernel(f"k{i % 3}", start, 5, corr=i + 1)]
    traces = _load(tmp_path, [ts.trace(0, 1, events)])
    full = timeline(traces, max_rects=5000)
    assert len(full) == 1000 and not full["merged"].any()
    lod = timeline(traces, max_rects=10)
    assert len(lod) == 10 and lod["n_events"].sum() == 1000 and lod["busy_ns"].sum() == 1000 * 5 * US
    assert (lod["end_ns"].iloc[:-1].to_numpy() < lod["start_ns"].iloc[1:].to_numpy()).all()  # gaps kept
    t0 = int(full["start_ns"].min())
    window = timeline(traces, start_ns=t0, end_ns=t0 + 2000 * US, max_rects=3)
    assert len(window) <= 3 and window["n_events"].sum() == 150 and window["end_ns"].max() <= t0 + 2000 * US


def test_timeline_caps_every_rank_and_keeps_instances(pair):
    tl = timeline(pair, max_rects=2)
    assert tl.groupby("rank").size().max() <= 2
    comm = timeline(pair, max_rects=100)
    assert set(comm.loc[comm["lane"] == "comm", "instance"]) == {"0,1#0"}
    assert set(comm["lane"]) == {"compute", "comm", "memory"}


def test_timeline_cpu_compute_is_the_outermost_operators_per_thread(tmp_path):
    events = [
        ts.annotation("ProfilerStep#1", 0, 1000),
        ts.cpu("aten::mm", 0, 60),
        ts.cpu("aten::linear", 0, 100),  # same start, the shorter listed first
        ts.cpu("aten::add", 100, 20),
        ts.cpu("aten::relu", 110, 5),  # relu nested in add
        ts.cpu("aten::copy_", 50, 30, tid=2),
        ts.cpu("aten::fill_", 60, 10, tid=2),
    ]  # another thread
    tl = timeline(_load(tmp_path, [ts.trace(0, 1, events, backend="gloo")]), max_rects=100)
    compute = tl[tl["lane"] == "compute"].sort_values("start_ns")
    assert list(compute["name"]) == ["aten::linear", "aten::copy_", "aten::add"]
    assert (compute["n_events"] == 1).all() and list(compute["end_ns"] - compute["start_ns"]) == [
        100 * US,
        30 * US,
        20 * US,
    ]


@pytest.mark.parametrize(
    "x, new, want",
    [
        ([3, 1, 5, 2, 0, 4], [1, 0, 0, 1, 0, 0], [3, 3, 5, 2, 2, 4]),
        ([5, 1, 2], [0, 0, 0], [5, 5, 5]),  # the first row always starts a segment
        ([2**61, -(2**61), 0, 7], [1, 0, 1, 0], [2**61, 2**61, 0, 7]),  # too wide to lift: the loop
        ([], [], []),
    ],
)
def test_running_max_restarts_per_segment(x, new, want):
    assert running_max(np.array(x, dtype=np.int64), np.array(new, dtype=bool)).tolist() == want


def test_exports(pair, tmp_path):
    out = export_perfetto(pair, tmp_path / "merged.json.gz", table=collectives(pair))
    doc = json.loads(gzip.decompress(out.read_bytes()))
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(pair.events) and min(e["ts"] for e in xs) == 0
    comm = [e for e in xs if e["args"].get("op") == "all_reduce"]
    assert {e["args"]["instance"] for e in comm} == {"0,1#0"} and all(e["args"]["bytes"] == 4000 for e in comm)
    table = collectives(pair)
    csv = pd.read_csv(export_collectives(table, tmp_path / "c.csv"))
    parquet = pd.read_parquet(export_collectives(table, tmp_path / "c.parquet"))
    assert len(csv) == len(parquet) == len(table)
    np.testing.assert_array_equal(parquet["dur_ns"].to_numpy(), table["dur_ns"].to_numpy())


def test_analyzers_do_not_mutate_their_input(pair):
    before = {n: getattr(pair, n).copy() for n in ("events", "comm_args", "ranks", "pg_config")}
    table = collectives(pair)
    table_copy = table.copy()
    for fn in (instances, per_rank_wait, breakdown, comm_by_dim, timeline):
        fn(pair, table=table)
    for n, frame in before.items():
        pd.testing.assert_frame_equal(getattr(pair, n), frame)
    pd.testing.assert_frame_equal(table, table_copy)


def test_p2p_pairs_by_peers_not_by_the_groups_seq(tmp_path):
    """NCCL p2p: record_param_comms says Src/Dst Rank; its Seq counts the whole group's p2p ops on
    each rank (different on sender and receiver), so the pair's order of issue is what matches."""
    out = []
    for rank, (op, seq) in enumerate((("send", 7), ("recv", 3))):
        meta = {
            "Collective name": op,
            "In msg nelems": 256,
            "Out msg nelems": 256,
            "dtype": "BFloat16",
            "Group size": 4,
            "Process Group Name": "2",
            "Process Group Ranks": "[0, 1, 2, 3]",
            "Seq": seq,
            "Src Rank": 0,
            "Dst Rank": 1,
        }
        events = [
            ts.annotation("ProfilerStep#1", 0, 1000),
            ts.cpu(f"c10d::{op}", 10, 20),
            ts.cpu("record_param_comms", 11, 18, **meta),
            ts.runtime(12, 2, corr=5),
            ts.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 100 + 10 * rank, 50, corr=5),
        ]
        out.append(ts.trace(rank, 4, events))
    traces = _load(tmp_path, out)
    table = collectives(traces, {"pp": 2, "dp": 2, "order": "tp-cp-pp-dp"})  # pp groups: (0, 1), (2, 3)
    assert list(table["op"]) == ["send", "recv"] and set(table["group"]) == {"0,1"}
    assert set(table["instance"]) == {"0,1#0"} and set(table["seq_source"]) == {"order"}
    assert set(table["dim"]) == {"pp"} and set(table["dim_source"]) == {"plan"}
    assert set(table["bytes"]) == {512} and set(table["busbw_gbps"] == table["algbw_gbps"]) == {True}
    one = instances(traces).iloc[0]
    assert (one["n_ranks"], one["skew_ns"], one["late_rank"]) == (2, 10 * US, 1)


def test_p2p_group_beside_a_collective_without_peers(tmp_path):
    """A send (Src/Dst Rank) and an all-reduce (none) on one rank: the send's group is '0,1', not the
    '0.0,1.0' a float column of peers would give."""
    send = {
        "Collective name": "send",
        "In msg nelems": 256,
        "Out msg nelems": 256,
        "dtype": "Float",
        "Group size": 2,
        "Process Group Name": "2",
        "Process Group Ranks": "[0, 1]",
        "Seq": 1,
        "Src Rank": 0,
        "Dst Rank": 1,
    }
    reduce = {k: v for k, v in send.items() if k not in ("Src Rank", "Dst Rank")} | {"Collective name": "allreduce"}
    events = [
        ts.annotation("ProfilerStep#1", 0, 1000),
        ts.cpu("c10d::send", 10, 20),
        ts.cpu("record_param_comms", 11, 18, **send),
        ts.runtime(12, 2, corr=5),
        ts.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 100, 50, corr=5),
        ts.cpu("c10d::allreduce_", 200, 20),
        ts.cpu("record_param_comms", 201, 18, **reduce),
        ts.runtime(202, 2, corr=6),
        ts.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 300, 50, corr=6),
    ]
    table = collectives(_load(tmp_path, [ts.trace(0, 2, events)]))
    assert list(zip(table["op"], table["group"])) == [("send", "0,1"), ("all_reduce", "0,1")]


def _gloo_job(tmp_path, *, world=2, train=True):
    """`world` CPU ranks that each all-reduce 100 floats with no group recorded (a plain DDP step)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = []
    for rank in range(world):
        t = ts.gloo_cpu(rank, world)
        if train:  # autograd's node, as a training step's trace has it
            t["traceEvents"].append(ts.cpu("autograd::engine::evaluate_function: MmBackward0", 700, 50))
        out.append(t)
    return _load(tmp_path, out)


def test_group_size_from_instances_gives_busbw(tmp_path):
    """Every rank of the job is in the set, so an instance's ranks are its group."""
    table = collectives(_gloo_job(tmp_path))
    assert list(table["group_size"]) == [2, 2] and table["busbw_gbps"].notna().all()
    # bus factor of a 2-rank all-reduce: 2 (n - 1) / n = 1
    assert (table["busbw_gbps"] == table["algbw_gbps"]).all()
    # one rank of a 2-rank job: the instance says nothing about the group
    (tmp_path / "one").mkdir()
    partial = collectives(_load(tmp_path / "one", [ts.gloo_cpu(0, 2)]))
    assert partial["group_size"].isna().all() and partial["busbw_gbps"].isna().all()


def test_whole_world_collectives_without_evidence_are_world_not_a_dimension(tmp_path):
    table = collectives(_gloo_job(tmp_path))
    assert set(table["dim"]) == {"world"} and set(table["dim_source"]) == {"group_size"}
    serving = collectives(_gloo_job(tmp_path / "serve", train=False))
    assert set(serving["dim"]) == {"world"}  # training or serving: the group says which ranks, not why
    planned = collectives(_gloo_job(tmp_path / "plan"), {"dp": 1, "tp": 2, "global_batch": 1})
    assert set(planned["dim"]) == {"tp"} and set(planned["dim_source"]) == {"plan"}


def test_analyze_json_carries_what_the_run_pages_show(pair):
    """The per-rank-per-step heat, the skew table and the measured TP cost are the front's, not the UI's:
    `profiler analyze --json` holds them as records."""
    summary = TraceAnalysis(pair).summary()
    heat = summary["rank_step_heat"]
    assert {(h["rank"], h["step"]) for h in heat} == {(0, 1), (1, 1)}  # every rank x step
    late = {h["rank"]: h["late_ms"] for h in heat}
    assert late[1] == pytest.approx(0.05) and late[0] == pytest.approx(0.0)  # rank 1 arrives 50 us late
    (skew,) = summary["skew"]
    assert (skew["dim"], skew["op"], skew["instances"]) == ("tp", "all_reduce", 1)
    assert skew["max_skew_ms"] == pytest.approx(0.05) and skew["most_often_late_rank"] == 1
    (tp,) = summary["tp_measured"]
    assert (tp["tp"], tp["op"]) == (2, "all_reduce") and tp["busbw_bytes_per_s"] > 0
    json.dumps(summary)  # plain JSON throughout


def test_a_collective_without_a_group_is_named_by_its_op(tmp_path):
    """A gloo all-reduce whose trace names no group: its instance is 'all_reduce#0' on both ranks (no
    placeholder), its group reads 'unknown' in the Gantt, the picker and the critical path."""
    for rank in (0, 1):
        ts.write(tmp_path / f"rank{rank}_trace.json", ts.gloo_cpu(rank, 2))
    a = TraceAnalysis.load(tmp_path, cache=False)
    assert list(a.collectives["instance"]) == ["all_reduce#0", "all_reduce#0"]
    groups = sm._group_of(pd.Series(["0,1#3", "pg:5#2", "all_to_all#1", "merged 0:12"]))
    assert list(groups) == ["0,1", "pg:5", "unknown", "unknown"]
    labels = op_label(pd.Series(["all_to_all", "all_reduce"]), pd.Series(["all_to_all#1", "0,1#3"]))
    assert list(labels) == ["all_to_all#1", "all_reduce 0,1#3"]
    worst = pd.DataFrame(
        {
            "instance": ["all_to_all#1"],
            "dim": ["world"],
            "op": ["all_to_all"],
            "group": [""],
            "seq": [1],
            "skew ms": [0.5],
            "late rank": [3],
        }
    )
    assert sm.straggler_labels(worst) == {
        "all_to_all#1": "world all_to_all · group unknown · #1 · skew 0.50 ms · late rank 3"
    }


SNAKE_WITH_UNITS = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def _keys(value, seen: set, *, skip: tuple[str, ...] = ()) -> set:
    """Every key of every object in a JSON value (the keys under `skip` are data, not schema)."""
    if isinstance(value, dict):
        for k, v in value.items():
            seen.add(k)
            if k not in skip:
                _keys(v, seen, skip=skip)
    elif isinstance(value, list):
        for v in value:
            _keys(v, seen, skip=skip)
    return seen


def test_profiler_json_keys_are_snake_case_and_documented(pair):
    """`profiler analyze --json` and `profiler whatif --json`: one key style, every key listed in
    docs/json-output.md's profiler section."""
    a = TraceAnalysis(pair)
    keys = _keys(a.summary(), set())
    keys |= _keys(
        whatif(a.graph, Scenario(rank_speed={1: "median"})),
        set(),
        skip=("by_category", "transfer_s", "work_factor_by_step"),
    )
    assert {k for k in keys if not SNAKE_WITH_UNITS.fullmatch(k)} == set()
    doc = (ROOT / "docs" / "json-output.md").read_text()
    section = doc.split("## profiler", 1)[1].split("\n## ", 1)[0]
    assert {k for k in keys if f"`{k}`" not in section} == set()
