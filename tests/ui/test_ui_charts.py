"""UI data preparation (ui.*_data, pure) and chart builders (ui.*_charts), without Streamlit.

Chart specs are checked through `chart.to_dict()` (Altair validates them against Vega-Lite's
schema on the way); data through the frames the builders receive.
"""

import json
import subprocess
import sys

import pandas as pd
import pytest

from parallel.core import memory_sweeps as memory_data
from parallel.core import rank_grid as topology_data
from parallel.core.memory import ActivationOptions, activation_bytes_per_stage
from parallel.core.plan import Plan
from parallel.core.rank_grid import node_overview
from parallel.core.scaling import tp_scaling
from parallel.core.specs import CLUSTERS, MODELS
from parallel.core.topology import Topology
from ui import memory_charts, scaling_charts, topology_charts
from ui.text import bytes_text

GPT175, H100 = MODELS["gpt3-175b"], CLUSTERS["dgx-h100"]
PLAN = Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536)


def _datasets(chart) -> list[list[dict]]:
    return list(chart.to_dict()["datasets"].values())


# ---------------------------------------------------------------- measured vs predicted (runs, later)

METRICS = {  # what `python -m parallel train` writes to metrics.json (JSON keys are strings)
    "activation_bytes": {"0": 1_100 * 2**20, "1": 950 * 2**20},
    "predicted_activation_bytes": {"0": 1_000 * 2**20, "1": 1_000 * 2**20},
    "activation_breakdown": {"0": {"attention.scores": 600 * 2**20, "mlp.fc1_input": 500 * 2**20}},
}


def test_measured_vs_predicted_frame():
    df = memory_data.measured_vs_predicted(METRICS)
    assert list(df["rank"]) == [0, 1]
    assert list(df["error_pct"].round(6)) == [10.0, -5.0]
    assert list(df["error_bytes"]) == [100 * 2**20, -50 * 2**20]
    parts = memory_data.measured_breakdown(METRICS)
    assert set(parts["group"]) == {"attention", "mlp"} and parts["bytes"].sum() == 1_100 * 2**20


def test_measured_vs_predicted_needs_both_keys():
    with pytest.raises(memory_data.MetricsError, match="no 'predicted_activation_bytes'"):
        memory_data.measured_vs_predicted({"activation_bytes": {"0": 1}})


def test_measured_vs_predicted_chart_shows_both_and_the_error():
    chart = memory_charts.measured_vs_predicted_chart(memory_data.measured_vs_predicted(METRICS))
    spec = chart.to_dict()
    assert len(spec["vconcat"]) == 2
    bars, errors = (pd.DataFrame(d) for d in _datasets(chart))
    if "source" not in bars:
        bars, errors = errors, bars
    assert set(bars["source"]) == {"measured", "predicted"} and len(bars) == 4
    assert sorted(errors["error_pct"].round(6)) == [-5.0, 10.0]


def test_model_state_frame_and_chart():
    state = {"params": 4 * 2**20, "grads": 2 * 2**20, "optimizer": 8 * 2**20}
    metrics = {
        "model_state_bytes": {"1": {**state, "grads": 3 * 2**20}, "0": state},
        "predicted_model_state_bytes": {"0": state, "1": state},
    }
    df = memory_data.model_state_vs_predicted(metrics)
    assert list(zip(df["rank"], df["kind"])) == [(r, k) for r in (0, 1) for k in ("params", "grads", "optimizer")]
    assert list(df["error_pct"]) == [0.0, 0.0, 0.0, 0.0, 50.0, 0.0]
    chart = memory_charts.model_state_chart(df)
    spec = chart.to_dict()
    assert spec["facet"]["column"]["field"] == "kind"
    (data,) = (pd.DataFrame(d) for d in _datasets(chart))
    assert len(data) == 12 and set(data["source"]) == {"measured", "predicted"}
    with pytest.raises(memory_data.MetricsError, match="predates model-state measurement"):
        memory_data.model_state_vs_predicted({"activation_bytes": {"0": 1}})
    with pytest.raises(memory_data.MetricsError, match="must map ranks"):
        memory_data.model_state_vs_predicted({**metrics, "predicted_model_state_bytes": {"0": state}})


def test_an_exact_match_keeps_a_readable_error_axis():
    exact = {"activation_bytes": {"0": 2**20, "1": 2**20}, "predicted_activation_bytes": {"0": 2**20, "1": 2**20}}
    spec = memory_charts.measured_vs_predicted_chart(memory_data.measured_vs_predicted(exact)).to_dict()
    y = spec["vconcat"][1]["encoding"]["y"]
    assert y["scale"]["domain"] == [-1.0, 1.0] and y["axis"]["format"] == "+.2~f"


@pytest.mark.parametrize(
    "n, text",
    [
        (552 * 2**20, "552 MiB"),
        (74.1 * 2**30, "74.1 GiB"),
        (204 * 2**10, "204 KiB"),
        (12.5 * 2**20, "12.5 MiB"),
        (10, "10 B"),
    ],
)
def test_bytes_text(n, text):
    assert bytes_text(n) == text


def test_a_tiny_model_stage_chart_is_in_mib_without_the_capacity_line():
    tiny = memory_data.stage_memory(
        MODELS["tiny"], Plan(dp=2, tp=2, pp=2, sp=True, global_batch=8), ActivationOptions(), H100.gpu_memory_bytes
    )
    spec = memory_charts.stage_chart(tiny).to_dict()["spec"]
    assert len(spec["layer"]) == 1 and spec["layer"][0]["encoding"]["y"]["title"] == "MiB per GPU"
    sweep = memory_data.components_sweep(
        MODELS["tiny"], Plan(dp=2, tp=2, pp=2, sp=True, global_batch=8), ActivationOptions(), axis="tp"
    )
    tp_chart = memory_charts.sweep_chart(sweep, axis="tp").to_dict()
    labels = tp_chart["spec"]["layer"][1]["transform"]
    assert {"calculate": "format(datum.total, ',.2f')", "as": "label"} in labels  # 0.24 MiB, not '0'
    # SP needs TP > 1: each panel has its own TP axis, so the with-SP one has no empty TP = 1 column
    assert 1 in set(sweep[sweep["sp"] == "without SP"]["x"]) and 1 not in set(sweep[sweep["sp"] == "with SP"]["x"])
    assert tp_chart["resolve"]["scale"]["x"] == "independent"
    by_mode = memory_charts.recompute_chart(
        memory_data.layer_components(MODELS["tiny"], Plan(tp=2, global_batch=1), ActivationOptions())
    )
    totals = by_mode.to_dict()["spec"]["layer"][1]["transform"]  # each mode's bar labelled with its total
    assert {"aggregate": [{"op": "sum", "field": "bytes_MiB", "as": "total"}], "groupby": ["sp", "recompute"]} in totals
    big = memory_charts.stage_chart(memory_data.stage_memory(GPT175, PLAN, ActivationOptions(), H100.gpu_memory_bytes))
    assert len(big.to_dict()["spec"]["layer"]) == 2  # the dashed GPU memory line


# ---------------------------------------------------------------- activation memory


def test_layer_components_cover_every_recompute_mode_and_sp():
    df = memory_data.layer_components(GPT175, PLAN, ActivationOptions())
    assert set(df["recompute"]) == {"none", "selective", "full"}
    assert set(df["sp"]) == {"without SP", "with SP"}
    full = df[df["recompute"] == "full"]
    assert set(full["component"]) == {"layer_input"}
    no_sp = memory_data.layer_components(GPT175, Plan(tp=1, global_batch=1), ActivationOptions())
    assert set(no_sp["sp"]) == {"without SP"}  # SP needs TP > 1


L70 = MODELS["llama3-70b"]
MIXTRAL = MODELS["mixtral-8x7b"]
STAGED = dict(dp=4, tp=8, pp=4, sp=True, global_batch=256)


@pytest.mark.parametrize(
    "model, plan",
    [
        (GPT175, PLAN),
        (GPT175, Plan(dp=8, tp=8, pp=8, sp=True, first_stage_layers=9, last_stage_layers=15, global_batch=64)),
        (GPT175, Plan(dp=8, tp=8, pp=8, sp=True, pp_layout="E" + "tttt|" * 23 + "ttttL", global_batch=64)),
        (GPT175, Plan(dp=8, tp=8, pp=8, vpp=2, sp=True, global_batch=1536)),  # embedding: 2 pp microbatches
        (L70, Plan(**STAGED, recompute="full", recompute_layers=2)),  # 2 of 20 layers recomputed
        (L70, Plan(**STAGED, vpp=2, first_stage_layers=18, last_stage_layers=18, recompute="full", recompute_layers=3)),
        (L70, Plan(**STAGED, offload_modules="qkv_linear+core_attn+attn_proj", recompute="full", recompute_layers=2)),
        (MIXTRAL, Plan(dp=4, tp=2, pp=4, ep=4, sp=True, global_batch=256, offload_modules="expert_fc1+mlp_norm")),
    ],
    ids=["even", "uneven", "layout", "interleaved", "partial-recompute", "uneven-partial", "offload", "moe-offload"],
)
def test_gpu_scope_adds_up_to_the_first_stage_activations(model, plan):
    """The page's per-GPU breakdown sums to the plan model's first-stage activations (the stage chart's,
    the headline's): its own layers in flight (uneven stages and pipeline layouts included), its
    embedding's microbatches, a partial recompute's kept layers, offloaded modules kept for one layer."""
    opts = ActivationOptions()
    df = memory_data.layer_components(model, plan, opts, scope="gpu")
    rows = df[(df["sp"] == "with SP") & (df["recompute"] == plan.recompute)]
    assert rows["bytes"].sum() == pytest.approx(activation_bytes_per_stage(model, plan, 0, opts))
    assert ("embedding/output" in set(rows["group"])) == (model is GPT175)  # GPT-3's embedding dropout mask


def test_sweeps_leave_out_what_the_model_cannot_split():
    tp = memory_data.components_sweep(GPT175, PLAN, ActivationOptions(), axis="tp")
    assert set(tp["x"]) == {1, 2, 4, 8, 16, 32} and tp.loc[tp["x"] == 8, "current"].all()
    seq = memory_data.components_sweep(GPT175, PLAN, ActivationOptions(), axis="seq_len", values=(100, 2048))
    assert set(seq.loc[seq["sp"] == "with SP", "x"]) == {2048}  # 100 tokens do not split over TP 8


@pytest.mark.parametrize(
    "builder",
    [
        lambda: memory_charts.recompute_chart(memory_data.layer_components(GPT175, PLAN, ActivationOptions())),
        lambda: memory_charts.sweep_chart(
            memory_data.components_sweep(GPT175, PLAN, ActivationOptions(), axis="tp"), axis="tp"
        ),
        lambda: memory_charts.stage_chart(
            memory_data.stage_memory(GPT175, PLAN, ActivationOptions(), H100.gpu_memory_bytes)
        ),
    ],
)
def test_memory_charts_facet_without_and_with_sp(builder):
    spec = builder().to_dict()
    assert spec["facet"]["column"]["field"] == "sp"
    assert spec["facet"]["column"]["sort"] == ["without SP", "with SP"]


# ---------------------------------------------------------------- TP scaling with measured overlays

MEASURED = pd.DataFrame(
    {
        "tp": [2, 8, 16],
        "sp": [False, False, True],
        "link": ["intra", "intra", "inter"],
        "seconds": [1e-4, 3e-4, 6e-3],
        "busbw_bytes_per_s": [3.5e11, 3.0e11, 4.0e10],
    }
)


def test_layer_time_chart_overlays_measured_seconds():
    pred = tp_scaling(GPT175, H100)
    (data,) = (pd.DataFrame(d) for d in _datasets(scaling_charts.layer_time_chart(pred, 8, MEASURED)))
    measured = data[data["part"] == "measured"]
    assert sorted(measured["ms"].round(6)) == [0.1, 0.3, 6.0]
    assert set(measured["link"]) == {"NVLink (intra-node)", "InfiniBand (inter-node)"}
    text = json.dumps(scaling_charts.layer_time_chart(pred, 8, MEASURED).to_dict())
    assert "datum.tp > 8" in text and "diamond" in text
    plain = pd.DataFrame(_datasets(scaling_charts.layer_time_chart(pred, 8))[0])
    assert "measured" not in set(plain["part"])


def test_busbw_chart_overlays_measured_busbw():
    pred = tp_scaling(GPT175, H100)
    (data,) = (pd.DataFrame(d) for d in _datasets(scaling_charts.busbw_chart(pred, 8, MEASURED)))
    assert sorted(data.loc[data["source"] == "measured", "busbw_gbs"]) == [40.0, 300.0, 350.0]
    predicted = data[data["source"] == "predicted"].set_index("tp")["busbw_gbs"]
    assert predicted[8] > 5 * predicted[16]  # NVLink vs InfiniBand


def test_busbw_chart_of_a_moe_model_draws_its_tp_collectives():
    """A MoE model runs TP only with SP (Megatron-core refuses it without): the TP collective's bus
    bandwidth is drawn from the SP rows (all-gather / reduce-scatter, the same busbw as the all-reduce)."""
    pred = tp_scaling(MODELS["mixtral-8x7b"], H100, plan=Plan(tp=2, sp=True))
    assert not pred.loc[pred["sp"] & (pred["tp"] > 1), "valid"].eq(False).any()
    (data,) = (pd.DataFrame(d) for d in _datasets(scaling_charts.busbw_chart(pred, 8)))
    predicted = data[data["source"] == "predicted"].set_index("tp")["busbw_gbs"]
    assert list(predicted.index) == [2, 4, 8, 16, 32] and predicted[8] > 5 * predicted[16]
    dense = pd.DataFrame(_datasets(scaling_charts.busbw_chart(tp_scaling(GPT175, H100), 8))[0])
    assert not dense["sp"].any()  # a dense model keeps the all-reduce rows


def test_speedup_chart_has_both_metrics():
    pred = tp_scaling(GPT175, H100)
    (data,) = (pd.DataFrame(d) for d in _datasets(scaling_charts.speedup_chart(pred, 8)))
    assert set(data["metric"]) == {"speedup over TP = 1", "efficiency = speedup / TP"}


# ---------------------------------------------------------------- topology


def test_gpu_cells_and_paths_for_the_issue_example():
    topo = Topology(dp=2, pp=4, cp=1, tp=2, gpus_per_node=8)  # the 16-GPU example
    cells = topology_data.gpu_cells(topo, group_dim="dp", compare_order="tp-cp-pp-dp")
    assert len(cells) == 16 and list(cells.loc[cells["rank"] == 2, ["node", "local", "dp", "tp"]].iloc[0]) == [
        0,
        2,
        1,
        0,
    ]
    assert cells.loc[cells["rank"] == 0, "group_ranks"].iloc[0] == "[0, 2]"
    paths = topology_data.group_paths(topo, "pp")
    assert paths.groupby("group")["rank"].apply(list).iloc[0] == [0, 4, 8, 12]
    assert set(paths["link"]) == {"InfiniBand (inter-node)"}


def test_window_and_node_overview_for_a_large_cluster():
    topo = Topology(dp=64, pp=8, cp=1, tp=8, gpus_per_node=8)  # 4096 GPUs
    cells = topology_data.gpu_cells(topo, group_dim="tp", compare_order="tp-cp-pp-dp", first_node=128, nodes=128)
    assert len(cells) == 1024 and cells["node"].min() == 128
    nodes = topology_data.node_overview(topo, "pp")
    assert len(nodes) == 512 and set(nodes["value"]) == {str(i) for i in range(8)}  # one stage per node
    assert set(topology_data.node_overview(topo, "tp")["value"]) == {"mixed"}  # every node holds all of TP
    chart = topology_charts.node_overview_chart(nodes, color_dim="pp", window=(128, 255))
    assert "datum.node >= 128 && datum.node <= 255" in json.dumps(chart.to_dict())


def test_rank_values_hook_colours_by_a_measured_series():
    topo = Topology(dp=2, pp=1, cp=1, tp=4, gpus_per_node=8)
    cells = topology_data.gpu_cells(topo, group_dim="tp", compare_order=topo.order)
    valued = topology_data.with_rank_values(cells, pd.Series({0: 1.5, 3: 2.5}), "exposed_ms")
    assert valued["exposed_ms"].notna().sum() == 2
    spec = topology_charts.rank_values_chart(valued, "exposed_ms", title="exposed comm, ms").to_dict()
    assert spec["encoding"]["color"]["field"] == "exposed_ms" and spec["encoding"]["color"]["type"] == "quantitative"
    assert spec["encoding"]["color"]["legend"]["format"] == ",.3g"  # the legend read "14.653500"


def test_moved_ranks_between_orders():
    topo = Topology(dp=2, pp=4, cp=1, tp=2, gpus_per_node=8)
    assert topology_data.moved_count(topo, "tp-cp-ep-dp-pp") == 0
    assert topology_data.same_order("tp-cp-ep-dp-pp", "tp-cp-dp-pp")
    moved = topology_data.moved_count(topo, "tp-cp-pp-dp")
    assert 0 < moved < 16
    summary = topology_data.dim_summary(topo, "tp-cp-pp-dp").set_index("dimension")
    assert summary.loc["DP", "crossing domains"] == 0 and summary.loc["DP", "crossing under tp-cp-pp-dp"] == 8


# ---------------------------------------------------------------- layering

PURE = [
    "parallel.core.scaling",
    "parallel.review.urls",
    "parallel.core.rank_grid",
    "parallel.core.memory_sweeps",
    "ui.topology_charts",
    "ui.memory_charts",
    "ui.scaling_charts",
    "ui.theme",
    "tests.support.apptest",
]


def test_pure_modules_import_neither_streamlit_nor_torch():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('streamlit', 'torch'))\nprint(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_node_overview_names_a_one_gpu_node_by_its_rank():
    """a node of one GPU read "ranks 3–3"."""
    one = node_overview(Topology(dp=4, pp=1, cp=1, tp=1, gpus_per_node=1), "dp")
    assert list(one["ranks"]) == ["0", "1", "2", "3"]
    two = node_overview(Topology(dp=4, pp=1, cp=1, tp=1, gpus_per_node=2), "dp")
    assert list(two["ranks"]) == ["0–1", "2–3"]


def test_layer_bars_stack_only_what_is_on_the_critical_path():
    pred = tp_scaling(GPT175, H100)
    chart = scaling_charts.layer_time_chart(pred, 8)
    spec = json.dumps(chart.to_dict())
    assert "datum.part != 'TP communication (overlapped)'" in spec  # the hidden part is not stacked
    data = pd.DataFrame(_datasets(chart)[0])
    stacked = data[data["part"] != "TP communication (overlapped)"].groupby(["variant", "tp"])["ms"].sum()
    layer = data.groupby(["variant", "tp"])["layer_ms"].first()
    assert (stacked - layer).abs().max() < 1e-9  # each bar is the layer's time: compute + exposed
    assert (data["part"] == "TP communication (overlapped)").any()  # still drawn, as a tick
