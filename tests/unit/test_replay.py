"""The dependency-graph replay (profiler.analyzers.replay), critical path, what-if and pipeline bubble,
on small hand-written CPU traces whose answers are worked out by hand, and on the real shared sets.

Two gloo ranks, one ProfilerStep [0, 1000) us each, one dp all-reduce (ps.comm annotation):
    rank 0: work [0, 300), all-reduce [300, 700) (it waits for rank 1 until 600), work [700, 1000)
    rank 1: work [0, 600), all-reduce [600, 700), work [700, 1000)
"""

from __future__ import annotations

import pytest

from parallel.core.plan import Plan
from profiler.analyzers import bubble
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.replay import Scenario, critical_path, phases, replay, step_windows
from profiler.analyzers.steps import measured_step_s, steady_step_s, step_time_s
from profiler.analyzers.whatif import StepNotTraced, whatif
from profiler.cli.whatif import main as whatif_cli
from tests.conftest import SHARED_TRACES
from tests.support import trace_samples as ts
from ui.whatif_tables import path_extent, path_frame


def _comm(dim, op, ranks, seq, start, dur, nbytes=800, tid=1):
    return ts.annotation(f"ps.comm dim={dim} op={op} bytes={nbytes} ranks={ranks} seq={seq}", start, dur, tid=tid)


def _set(tmp_path, per_rank: dict[int, list], ends: dict[int, int] | None = None) -> TraceAnalysis:
    world = len(per_rank)
    for rank, events in per_rank.items():
        steps = [ts.annotation("ProfilerStep#2", 0, (ends or {}).get(rank, 1000))]
        ts.write(tmp_path / f"rank{rank}_trace.json", ts.trace(rank, world, steps + events, backend="gloo"))
    return TraceAnalysis.load(tmp_path, cache=False)


@pytest.fixture
def pair(tmp_path):
    return _set(
        tmp_path,
        {
            0: [
                ts.cpu("aten::mm", 0, 300),
                _comm("dp", "all_reduce", "0,1", 0, 300, 400),
                ts.cpu("aten::add", 700, 300),
            ],
            1: [
                ts.cpu("aten::mm", 0, 600),
                _comm("dp", "all_reduce", "0,1", 0, 600, 100),
                ts.cpu("aten::add", 700, 300),
            ],
        },
    )


def _step_us(a, scenario=Scenario()) -> float:
    return steady_step_s(step_windows(a.graph, replay(a.graph, scenario))) * 1e6


def test_no_scenario_reproduces_the_trace_exactly(pair):
    g = pair.graph
    rp = replay(g)
    for rank, ch in g.chains.items():
        assert (rp.a[rank] == ch.a).all() and (rp.e[rank] == ch.e).all()
    assert _step_us(pair) == pytest.approx(1000)
    ph = phases(g).set_index("rank")
    assert ph.loc[0, "wait_ns"] == 300_000 and ph.loc[1, "wait_ns"] == 0  # rank 0 waited 300 us for rank 1
    assert (ph["transfer_dp_ns"] == 100_000).all() and list(ph["work_ns"]) == [600_000, 900_000]
    assert (ph["work_ns"] + ph["wait_ns"] + ph["transfer_dp_ns"] == ph["window_ns"]).all()


def test_scenarios_by_hand(pair):
    # rank 1 at its peer's speed: its 900 us of work scaled to rank 0's 600; arrives at 400, both leave
    # the all-reduce at 500; then 300 vs 200 us of work: windows 800 and 700
    assert _step_us(pair, Scenario(rank_speed={1: "median"})) == pytest.approx(750)
    # rank 1 3x as fast: arrives at 200, rank 0 (at 300) is now last; both leave at 400; windows 700, 500
    assert _step_us(pair, Scenario(rank_speed={1: 3.0})) == pytest.approx((700 + 500) / 2)
    assert _step_us(pair, Scenario(link={"dp": 2.0})) == pytest.approx(950)  # the 100 us transfer halves
    assert _step_us(pair, Scenario(link={"tp": 2.0})) == pytest.approx(1000)  # no tp op: nothing moves
    assert _step_us(pair, Scenario(overlap=frozenset({"dp"}))) == pytest.approx((600 + 900) / 2)


def test_overlapping_ops_on_one_rank_are_counted_once(tmp_path):
    # two async all-reduces that overlap on each rank, each on its own thread (as gloo's workers run
    # them): rank 0 [200, 600) and [400, 800), rank 1 [100, 600) and [150, 800), rank 1 first at both.
    # Rank 0's ops cover [200, 800) once: 600 us of transfer and 400 of work, not 800 + 400. Rank 1
    # waits 100 us for rank 0's first; the second's wait (until 400) lies under the first: not again.
    a = _set(
        tmp_path,
        {
            0: [
                ts.cpu("aten::mm", 0, 200),
                _comm("dp", "all_reduce", "0,1", 0, 200, 400),
                _comm("dp", "all_reduce", "0,1", 1, 400, 400, tid=2),
                ts.cpu("aten::add", 800, 200),
            ],
            1: [
                ts.cpu("aten::mm", 0, 100),
                _comm("dp", "all_reduce", "0,1", 0, 100, 500),
                _comm("dp", "all_reduce", "0,1", 1, 150, 650, tid=2),
                ts.cpu("aten::add", 800, 200),
            ],
        },
    )
    ph = phases(a.graph).set_index("rank")
    assert ph.loc[0, "transfer_dp_ns"] == 600_000 and ph.loc[0, "work_ns"] == 400_000
    assert ph.loc[1, "wait_ns"] == 100_000 and ph.loc[1, "transfer_dp_ns"] == 600_000
    assert (ph["work_ns"] + ph["wait_ns"] + ph["transfer_dp_ns"] == ph["window_ns"]).all()


def test_a_ranks_speed_scales_only_the_time_its_ops_do_not_cover(tmp_path):
    # both ranks: an async all-reduce [200, 600) with a second one [300, 500) nested in it on another
    # thread, then work to 1000. Rank 0's work is [0, 200) and [600, 1000): 600 us. At 2x speed it
    # reaches the first all-reduce at 100, waits for rank 1 (200), leaves at 600, and works 200 more:
    # its window is 800 (counting the time under the outer op after the inner one ends as work would
    # give 750).
    ops = [
        _comm("dp", "all_reduce", "0,1", 0, 200, 400),
        _comm("dp", "all_reduce", "0,1", 1, 300, 200, tid=2),
        ts.cpu("aten::add", 600, 400),
    ]
    a = _set(tmp_path, {0: [ts.cpu("aten::mm", 0, 200), *ops], 1: [ts.cpu("aten::mm", 0, 200), *ops]})
    ph = phases(a.graph).set_index("rank")
    assert list(ph["work_ns"]) == [600_000, 600_000] and list(ph["transfer_dp_ns"]) == [400_000, 400_000]
    w = step_windows(a.graph, replay(a.graph, Scenario(rank_speed={0: 2.0}))).set_index("rank")
    assert (w["end_ns"] - w["start_ns"]).to_dict() == {0: 800_000, 1: 1_000_000}


def test_a_scenario_that_touches_no_op_says_so(pair):
    out = whatif(pair.graph, Scenario(overlap=frozenset({"dp", "tp"}), link={"inter": 2.0}))
    by = {(s["kind"], s.get("dim") or s.get("link")): s for s in out["scenarios"]}
    assert by["overlap", "dp"]["ops"] == 2 and "note" not in by["overlap", "dp"]  # one all-reduce on each rank
    assert (
        by["overlap", "tp"]["ops"] == 0
        and "no tp op in these traces (their dimensions: dp)" in by["overlap", "tp"]["note"]
    )
    assert by["link", "inter"]["ops"] == 0 and "inter-node link" in by["link", "inter"]["note"]


def test_critical_path_follows_the_last_arrival(pair):
    path = critical_path(pair.graph, replay(pair.graph), 2)
    # rank 1 arrived last: its compute, the transfer after its arrival, its compute after
    assert list(zip(path["rank"], path["kind"], path["dur_ns"] // 1000)) == [
        (1, "compute", 600),
        (1, "comm", 100),
        (1, "compute", 300),
    ]
    # with rank 1 fast, rank 0's work is on the path before the transfer
    fast = replay(pair.graph, Scenario(rank_speed={1: 10.0}))
    path = critical_path(pair.graph, fast, 2)
    assert path["dur_ns"].sum() == path["end_ns"].max() - path["start_ns"].min()
    assert (path["start_ns"].iloc[1:].to_numpy() >= path["end_ns"].iloc[:-1].to_numpy()).all()  # no overlap
    assert 0 in set(path["rank"])


def test_whatif_object(pair):
    out = whatif(pair.graph, Scenario(rank_speed={1: "median"}), plan=pair.layout_plan)
    assert out["measured_step_time_s"] == pytest.approx(1e-3) and out["predicted_step_time_s"] == pytest.approx(7.5e-4)
    assert out["change_pct"] == pytest.approx(-25.0)
    assert out["scenarios"][0]["work_factor_by_step"] == {"2": pytest.approx(2 / 3, abs=1e-4)}
    assert out["critical_path"]["measured"]["by_category"] == {"compute": 9e-4, "comm:dp": 1e-4}
    assert out["pipeline"] == [] and out["cut_dependencies"] == 0


def _gpipe_pair(tmp_path, late: int) -> TraceAnalysis:
    """Two stages, two microbatches, GPipe: forward 100 us, backward 200 us, every transfer 10 us;
    stage 0's first forward takes `late` us longer (a slow stage 0)."""
    f0 = 100 + late
    r0 = [  # stage 0: F0 send F1 send | recv B0 recv B1
        ts.cpu("fwd", 0, f0),
        _comm("pp", "send", "0,1", 0, f0, 10),
        ts.cpu("fwd", f0 + 10, 100),
        _comm("pp", "send", "0,1", 1, f0 + 110, 10),
        _comm("pp", "recv", "1,0", 0, f0 + 120, 310),  # stage 1's send of dB0 starts at f0 + 420
        ts.cpu("bwd", f0 + 430, 200),
        _comm("pp", "recv", "1,0", 1, f0 + 630, 10),
        ts.cpu("bwd", f0 + 640, 200),
    ]
    r1 = [  # stage 1: recv F0 recv F1 B0 send B1 send
        _comm("pp", "recv", "0,1", 0, 0, f0 + 10),
        ts.cpu("fwd", f0 + 10, 100),
        _comm("pp", "recv", "0,1", 1, f0 + 110, 10),
        ts.cpu("fwd", f0 + 120, 100),
        ts.cpu("bwd", f0 + 220, 200),
        _comm("pp", "send", "1,0", 0, f0 + 420, 10),
        ts.cpu("bwd", f0 + 430, 200),
        _comm("pp", "send", "1,0", 1, f0 + 630, 10),
    ]
    return _set(tmp_path, {0: r0, 1: r1}, ends={0: f0 + 840, 1: f0 + 640})


@pytest.mark.parametrize(
    "late, expect",
    [
        # uniform: stage 0 idles 300 us for the first gradient -- exactly its schedule bubble
        # (p-1)/m x work = 1/2 x 600; stage 1 idles 100 us for the first activation
        (0, {0: (600, 300, 300, 0), 1: (600, 100, 100, 0)}),
        # stage 0 slow by 300 us: stage 1 waits 400 us, 100 more than its bubble -- a late peer
        (300, {0: (900, 300, 300, 0), 1: (600, 400, 300, 100)}),
    ],
)
def test_pipeline_bubble_vs_p2p_wait_by_hand(tmp_path, late, expect):
    t = bubble.pipeline_phases(_gpipe_pair(tmp_path, late).graph, pp=2, vpp=1, microbatches=2).set_index("stage")
    got = {
        s: tuple(int(t.loc[s, c]) // 1000 for c in ("work_ns", "pipeline_idle_ns", "bubble_ns", "p2p_wait_ns"))
        for s in (0, 1)
    }
    assert got == expect
    assert (t["theory_fraction"] == 0.5).all() and (t["p2p_transfer_ns"] == 40_000).all()  # 4 ops x 10 us
    assert t.loc[0, "bubble_fraction"] == pytest.approx(expect[0][1] / expect[0][0])
    for s in (0, 1):  # the bubble and the P2P wait apart, each over the stage's work
        work, idle, bubble_us, wait = expect[s]
        assert t.loc[s, "bubble_fraction"] == pytest.approx(bubble_us / work)
        assert t.loc[s, "p2p_wait_fraction"] == pytest.approx(wait / work)
        assert t.loc[s, "idle_fraction"] == pytest.approx(idle / work)
    stage = bubble.per_stage(t.reset_index()).set_index("stage")
    assert stage.loc[1, "bubble_fraction"] * stage.loc[1, "work_ms"] == pytest.approx(stage.loc[1, "bubble_ms"])
    assert stage.loc[1, "p2p_wait_fraction"] * stage.loc[1, "work_ms"] == pytest.approx(stage.loc[1, "p2p_wait_ms"])


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="needs ../shared/traces")
@pytest.mark.parametrize(
    "name", sorted(p.name for p in SHARED_TRACES.iterdir() if p.is_dir()) if SHARED_TRACES.is_dir() else []
)
def test_real_sets_replay_exactly_and_their_paths_add_up(name):
    try:
        a = TraceAnalysis.load(SHARED_TRACES / name, cache=False)
        g = a.graph
    except Exception as err:  # a set the loader refuses (no rank in the name): its error is tested elsewhere
        pytest.skip(f"{name}: {err}")
    out = whatif(g, plan=a.layout_plan)
    assert out["predicted_step_time_s"] == pytest.approx(out["measured_step_time_s"], rel=1e-9)
    for which in ("measured", "predicted"):
        path = out["critical_path"][which]
        assert sum(path["by_category"].values()) == pytest.approx(path["length_s"], rel=1e-4, abs=2e-6)
        assert path["length_s"] <= 1.05 * max(a.breakdown["window_ns"]) / 1e9
    # the phases partition each window, also where a rank's ops overlap (gloo's async collectives)
    ph = phases(g)
    parts = ph["work_ns"] + ph["wait_ns"] + ph.filter(like="transfer_").sum(axis=1)
    assert (parts == ph["window_ns"]).all()


def test_more_microbatches_shrink_the_schedules_bubble(tmp_path):
    a = _gpipe_pair(tmp_path, 0)  # windows 940 and 740 us; bubbles 300 and 100 us
    out = whatif(a.graph, plan=Plan(pp=2, global_batch=2), microbatches=4)
    assert out["measured_step_time_s"] == pytest.approx(840e-6)
    # the same global batch in 4 microbatches: the mean bubble (200 us) x (1 - 2/4) saved
    assert out["predicted_step_time_s"] == pytest.approx(740e-6)
    (sc,) = out["scenarios"]
    assert sc["kind"] == "microbatches" and (sc["from"], sc["to"]) == (2, 4) and "optimistic" in sc["assumes"]
    assert [r["stage"] for r in out["pipeline"]] == [0, 1]


def test_whatif_of_one_step_measures_that_step(tmp_path):
    """Two steps of different lengths: the what-if of a step measures and replays that step's windows;
    a step the traces lack is refused with their steps."""
    for rank in (0, 1):
        events = [
            ts.annotation("ProfilerStep#4", 0, 1000 + 200 * rank),
            ts.cpu("aten::mm", 0, 300),
            _comm("dp", "all_reduce", "0,1", 0, 300, 400),
            ts.annotation("ProfilerStep#5", 2000, 3000),
            ts.cpu("aten::mm", 2000, 2000),
            _comm("dp", "all_reduce", "0,1", 1, 4000, 500),
        ]
        ts.write(tmp_path / f"rank{rank}_trace.json", ts.trace(rank, 2, events, backend="gloo"))
    a = TraceAnalysis.load(tmp_path, cache=False)
    windows = step_windows(a.graph)
    assert step_time_s(windows, 4) == pytest.approx(1.1e-3) and step_time_s(windows, 5) == pytest.approx(3e-3)
    assert step_time_s(windows) == pytest.approx((1.1e-3 + 3e-3) / 2) and step_time_s(windows, 9) is None
    for step, want in ((4, 1.1e-3), (5, 3e-3)):
        out = whatif(a.graph, step=step)
        assert out["step"] == step and out["measured_step_time_s"] == pytest.approx(want)
        assert out["predicted_step_time_s"] == pytest.approx(want)
        assert out["critical_path"]["measured"]["step"] == step
    with pytest.raises(StepNotTraced, match="step 9 is not in these traces; their steps: 4, 5"):
        whatif(a.graph, step=9)
    # the path's extent against the step's span: rank 1 finishes step 4 last, 200 us after rank 0
    path = critical_path(a.graph, replay(a.graph), 4)
    x = path_extent(path_frame(path, int(path["start_ns"].min())), span_ms=1.2)
    assert x["last_rank"] == 1 and x["end_ms"] == pytest.approx(1.2) and x["past_ms"] == 0
    assert x["length_ms"] == pytest.approx(path["dur_ns"].sum() / 1e6)
    # the CLI: --step N, and a clear refusal of a step the traces lack
    assert whatif_cli([str(tmp_path), "--step", "5", "--no-cache"]) == 0
    assert whatif_cli([str(tmp_path), "--step", "9", "--no-cache"]) == 2


def test_the_measured_step_is_the_files_profilerstep_range_not_the_kernel_span(tmp_path):
    """GPU ranks whose kernels fill 600 us of a 1,000 us ProfilerStep: the measured step is the files'
    range on the headline and in the what-if alike, and an empty scenario predicts it unchanged."""
    for rank, t in enumerate(ts.gpu_pair()):
        ts.write(tmp_path / f"rank{rank}_trace.json", t)
    a = TraceAnalysis.load(tmp_path, cache=False)
    assert (a.breakdown["end_ns"] - a.breakdown["start_ns"] < 1_000_000).all()  # the kernels' span inside it
    assert measured_step_s(a.traces.step_windows, a.breakdown) == pytest.approx(1e-3)
    out = whatif(a.graph)
    assert out["measured_step_time_s"] == pytest.approx(1e-3)
    assert out["predicted_step_time_s"] == pytest.approx(1e-3)


def test_idle_and_host_time_on_the_path_are_not_compute(tmp_path):
    """GPU ranks (ts.gpu_pair): a compute kernel [100, 400), the all-reduce kernel to 600, a copy
    [650, 700). Between the all-reduce and the copy the GPU runs nothing: idle, not work. A host-only
    stretch (CPU operators, no kernel) is 'host'. The what-if's phases split the same way."""
    pairs = ts.gpu_pair()
    for rank, t in enumerate(pairs):
        t["traceEvents"].append(ts.cpu("aten::index_select", ts.EPOCH_US + 605, 20))  # host code, the GPU idle
        ts.write(tmp_path / f"rank{rank}_trace.json", t)
    a = TraceAnalysis.load(tmp_path, cache=False)
    path = critical_path(a.graph, replay(a.graph), 1)
    own = path[path["kind"] != "comm"]
    assert set(own["kind"]) == {"compute", "host", "idle"}
    assert (own["dur_ns"] > 0).all() and path["dur_ns"].sum() == path["end_ns"].max() - path["start_ns"].min()
    by = path.groupby("kind")["dur_ns"].sum() // 1000
    assert by["host"] == 20 and by["idle"] == 30  # [605, 625) host, [600, 605) and [625, 650) idle
    ph = phases(a.graph).set_index("rank")
    assert (ph["compute_ns"] + ph["host_ns"] + ph["idle_ns"] == ph["work_ns"]).all()
    assert (ph["idle_ns"] >= 30_000).all() and (ph["host_ns"] == 20_000).all()
    out = whatif(a.graph)
    cats = out["critical_path"]["measured"]["by_category"]
    assert "work" not in cats and cats["idle"] == pytest.approx(30e-6)
    m = out["measured_phases"]
    assert m["compute_s"] + m["host_s"] + m["idle_s"] == pytest.approx(m["work_s"])
