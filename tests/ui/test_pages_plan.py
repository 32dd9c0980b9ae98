"""AppTest of the plan pages (Topology, Activation memory, TP scaling) and their shared plan form.

No browser: app.py runs in-process, switched to each page with the plan in the URL's query
parameters; charts are checked through their Vega-Lite specs and Arrow data (tests.support.apptest).
"""

import pytest

from parallel.core.memory import ActivationOptions, activation_bytes_per_layer
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS
from parallel.review.urls import DEFAULT_PARAMS
from tests.support.apptest import page_test, vega_charts
from ui.theme import link_names

SMALL = {
    "model": "gpt3-22b",
    "cluster": "dgx-h100",
    "nodes": "2",
    "dp": "2",
    "tp": "2",
    "pp": "4",
    "sp": "1",
    "gb": "64",
}


def _errors(at) -> list[str]:
    return [e.value for e in at.error]


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize(
    "query, world, nodes",
    [
        (SMALL, 16, 2),
        ({**SMALL, "order": "tp-cp-pp-dp", "cp": "1"}, 16, 2),
        (
            {
                "model": "tiny",
                "cluster": "local-cpu",
                "nodes": "1",
                "dp": "2",
                "tp": "2",
                "pp": "2",
                "gb": "8",
                "sp": "0",
            },
            8,
            1,
        ),
    ],
)
def test_topology_draws_one_cell_per_gpu(query, world, nodes):
    at = _ok(page_test("pages/topology.py", query))
    (grid,) = vega_charts(at)
    assert {"rect", "line"} <= grid.marks()
    cells = grid.frame()
    assert len(cells) == world and sorted(cells["rank"]) == list(range(world))
    assert cells["node"].nunique() == nodes
    paths = [f for f in grid.datasets.values() if "step" in f.columns][0]
    assert paths["group"].nunique() == world // 2  # TP groups (the default "groups of" dimension), TP = 2
    # the cluster's own link names: NVLink on DGX, loopback for a CPU run
    assert set(paths["link"]) == {link_names(CLUSTERS[query["cluster"]])["intra"]}
    assert set(paths["link"]) == (
        {"loopback (intra-node)"} if query["cluster"] == "local-cpu" else {"NVLink (intra-node)"}
    )


def test_topology_shows_what_moves_under_another_order():
    at = _ok(page_test("pages/topology.py", SMALL))
    cells = vega_charts(at)[0].frame()
    # default order tp-cp-ep-dp-pp vs the automatic comparison tp-cp-pp-dp: DP and PP swap places
    assert cells["moved"].any() and not cells["moved"].all()
    metric = [m for m in at.metric if m.label.startswith("Ranks that move")][0]
    assert metric.value == f"{int(cells['moved'].sum())} of 16"


def test_topology_group_dimension_and_crossing_links():
    at = page_test("pages/topology.py", SMALL)
    at.segmented_control(key="topo_groups").set_value("pp").run()
    _ok(at)
    paths = [f for f in vega_charts(at)[0].datasets.values() if "step" in f.columns][0]
    assert paths.groupby("group").size().eq(4).all()  # PP = 4 ranks per group
    assert set(paths["link"]) == {"InfiniBand (inter-node)"}  # stages 0,1 on node 0; 2,3 on node 1
    summary = at.dataframe[0].value
    assert summary.set_index("dimension").loc["PP", "link"] == "InfiniBand"


def test_topology_draws_the_expert_parallel_groups_of_a_moe_plan():
    """Mixtral on 2 nodes of 8, DP4 TP2 PP2 EP4: Megatron's expert layout groups ranks 0, 2, 4, 6."""
    query = {**DEFAULT_PARAMS, "model": "mixtral-8x7b", "nodes": "2", "dp": "4", "tp": "2", "pp": "2"}
    query.update(ep="4", gb="64", mb="1")
    at = page_test("pages/topology.py", query)
    at.segmented_control(key="topo_groups").set_value("ep").run()
    _ok(at)
    paths = [f for f in vega_charts(at)[0].datasets.values() if "step" in f.columns][0]
    assert paths.groupby("group").size().eq(4).all()  # EP = 4 ranks per group
    first = paths[paths["group"] == paths["group"].min()].sort_values("step")["rank"].tolist()
    assert first == [0, 2, 4, 6]


def test_topology_4096_gpus_is_windowed_with_a_node_overview():
    query = {**DEFAULT_PARAMS, "nodes": "512", "dp": "64"}
    at = _ok(page_test("pages/topology.py", query))
    overview, grid = vega_charts(at)
    assert len(overview.frame()) == 512  # one cell per node
    assert len(grid.frame()) == 1024  # a window of 128 nodes x 8 GPUs, not 4096 cells
    assert not _errors(at)


def test_topology_draws_the_nvlink_racks_of_a_gb200_nvl72():
    """144 GB200s (36 trays of 4) are two NVL72 racks: each drawn as a band around its 18 nodes and named
    in the caption; a TP 8 group over two trays stays on NVLink, so none crosses a domain."""
    query = {"model": "gpt3-22b", "cluster": "gb200-nvl72", "dp": "18", "tp": "8", "pp": "1", "gb": "72"}
    at = _ok(page_test("pages/topology.py", query))
    assert at.query_params["gpn"] == "4" and "nvl" not in at.query_params  # the preset's hosts and domain
    notes = [c.value for c in at.caption if "NVLink domain (rack)" in c.value]
    assert notes and "NVLink domain (rack) 1: nodes 18–35, 72 GPUs" in notes[0]
    (grid,) = vega_charts(at)
    bands = [f for f in grid.datasets.values() if "label" in f.columns][0]
    assert bands[["first_node", "last_node"]].values.tolist() == [[0, 17], [18, 35]]
    assert {"rect", "text"} <= grid.marks() and '"rack " + datum.domain'.replace('"', "'") in grid.text()
    paths = [f for f in grid.datasets.values() if "step" in f.columns][0]
    assert paths.groupby("group")["rank"].apply(lambda r: len(set(r // 4))).eq(2).all()  # each over two trays
    assert set(paths["link"]) == {link_names(CLUSTERS["gb200-nvl72"])["intra"]} == {"NVLink (intra-domain)"}
    metric = [m for m in at.metric if m.label == "TP groups crossing NVLink domains"][0]
    assert metric.value == "0"


def test_topology_on_a_dgx_says_a_domain_is_a_node_and_draws_no_bands():
    at = _ok(page_test("pages/topology.py", SMALL))
    assert "NVLink domain = one node (8 GPUs): a group stays on NVLink only inside its node." in [
        c.value for c in at.caption
    ]
    (grid,) = vega_charts(at)
    assert not [f for f in grid.datasets.values() if "label" in f.columns] and "text" not in grid.marks()


def test_a_custom_nvlink_domain_rides_in_the_topology_link():
    """gpn=4&nvl=8 on a DGX H100: TP 8 spans two hosts of one 8-GPU domain, so it stays on NVLink."""
    query = {**SMALL, "gpn": "4", "nvl": "8", "nodes": "4", "dp": "2", "tp": "8", "pp": "1"}
    at = _ok(page_test("pages/topology.py", query))
    assert at.query_params["nvl"] == "8" and at.number_input(key="plan.nvl").value == 8
    paths = [f for f in vega_charts(at)[0].datasets.values() if "step" in f.columns][0]
    assert set(paths["link"]) == {"NVLink (intra-domain)"}
    at.number_input(key="plan.nvl").set_value(None).run()  # back to the cluster's: one host
    paths = [f for f in vega_charts(_ok(at))[0].datasets.values() if "step" in f.columns][0]
    assert "nvl" not in at.query_params and set(paths["link"]) == {"InfiniBand (inter-node)"}
    at.number_input(key="plan.nvl").set_value(6).run()  # not whole 4-GPU hosts: the Cluster's message
    assert any("an NVLink domain is whole hosts" in e for e in _errors(_ok(at)))
    at.selectbox(key="plan.cluster").set_value("gb200-nvl72").run()  # a preset brings its hosts and domain
    assert at.query_params["gpn"] == "4" and "nvl" not in at.query_params and not _errors(_ok(at))
    assert any("NVLink domain (rack) 0: nodes 0–3, 16 GPUs" in c.value for c in at.caption)


def test_activation_memory_stacks_components_with_and_without_sp():
    at = _ok(page_test("pages/activation_memory.py", DEFAULT_PARAMS))
    recompute, stages, seq, tp = vega_charts(at)
    df = recompute.frame()
    assert set(df["sp"]) == {"without SP", "with SP"}
    assert set(df["recompute"]) == {"none", "selective", "full"}
    assert {"attention", "mlp", "layernorm/dropout/residual"} <= set(df["group"])
    model = MODELS["gpt3-175b"]
    for sp in (False, True):
        plan = Plan(dp=8, tp=8, pp=8, sp=sp, global_batch=1536)
        rows = df[(df["sp"] == ("with SP" if sp else "without SP")) & (df["recompute"] == "none")]
        assert rows["bytes"].sum() == pytest.approx(activation_bytes_per_layer(model, plan, ActivationOptions()))
    assert stages.frame()["stage"].nunique() == 8
    assert set(stages.frame()["kind"]) == {"params", "grads", "optimizer", "activations"}
    assert {512, 2048, 32768} <= set(seq.frame()["x"])
    assert set(tp.frame()["x"]) == {1, 2, 4, 8, 16, 32}
    assert set(tp.frame().query("sp == 'with SP'")["x"]) == {2, 4, 8, 16, 32}  # SP needs TP > 1
    assert any("TP = 1, 2, 4, 8, 16, 32 for this model" in c.value for c in at.caption)
    # a model of 4 heads shows TP 1, 2, 4 only, and the caption says so
    tiny = _ok(
        page_test(
            "pages/activation_memory.py",
            {**DEFAULT_PARAMS, "model": "tiny", "tp": "2", "dp": "1", "pp": "1", "nodes": "1", "gb": "4"},
        )
    )
    assert set(vega_charts(tiny)[-1].frame()["x"]) == {1, 2, 4}
    assert any("TP = 1, 2, 4 for this model" in c.value for c in tiny.caption)


def test_activation_memory_options_change_the_bars():
    at = page_test("pages/activation_memory.py", {**DEFAULT_PARAMS, "attn": "unfused"})
    before = vega_charts(at)[0].frame()
    at.selectbox(key="plan.attn").set_value("fused").run()  # the plan's own field, in the sidebar
    _ok(at)
    after = vega_charts(at)[0].frame()
    assert "attention.scores" in set(before["component"]) and "attention.scores" not in set(after["component"])
    assert "attention.softmax_stats" in set(after["component"])


def test_activation_memory_captions_name_the_modules_recomputed_and_offloaded():
    """Mixtral 8x7B recomputing its norms and expert activations: the captions over the stage and sweep
    charts say which modules (the numbers under them depend on them), not a bare 'selective'."""
    query = {"model": "mixtral-8x7b", "cluster": "dgx-h100", "nodes": "8", "dp": "8", "tp": "2", "pp": "4"}
    query |= {"sp": "1", "gb": "256", "ep": "8", "recompute": "selective", "rcm": "layernorm+moe_act"}
    at = _ok(page_test("pages/activation_memory.py", {**query, "offl": "expert_fc1"}))
    captions = [c.value for c in at.caption]
    words = "recompute selective of moe_act+layernorm, expert_fc1 offloaded, fused attention"
    assert sum(words in c for c in captions) == 2, captions
    assert any("the plan's: moe_act+layernorm" in c for c in captions)


def test_activation_memory_draws_a_partial_full_recompute():
    """Full recompute of 2 layers a stage: the page draws every mode (the layer count belongs to full)."""
    query = {"model": "llama3-70b", "cluster": "dgx-h100", "nodes": "16", "dp": "4", "tp": "8", "pp": "4"}
    at = _ok(
        page_test("pages/activation_memory.py", {**query, "sp": "1", "gb": "256", "recompute": "full", "rcl": "2"})
    )
    bars = vega_charts(at)[0].frame()
    assert set(bars["recompute"]) == {"none", "selective", "full"}


def test_tp_scaling_covers_tp_1_to_32_with_the_boundary():
    at = _ok(page_test("pages/tp_scaling.py", DEFAULT_PARAMS))
    time, speedup, busbw = vega_charts(at)[:3]  # a lab TP sweep under the runs dir adds a 4th
    df = time.frame()
    assert sorted(df["tp"].unique()) == [1, 2, 4, 8, 16, 32]
    assert set(df["variant"]) == {"TP without SP", "TP + SP"}
    assert {"compute", "TP communication (exposed)"} <= set(df["part"])
    assert set(df.loc[df["tp"] > 8, "link"]) == {"InfiniBand (inter-node)"}
    assert set(df.loc[df["tp"] <= 8, "link"]) == {"NVLink (intra-node)"}
    assert "datum.tp > 8" in time.text()  # the shaded InfiniBand band
    assert set(speedup.frame()["metric"]) == {"speedup over TP = 1", "efficiency = speedup / TP"}
    labels = [m.label for m in at.metric][3:]  # after the plan's memory, step time and MFU
    # TP 8 is both the plan's and the largest inside a node; the plan has SP, so the headlines do
    assert labels == ["TP 8+SP (the plan's)", "TP 16+SP: first across nodes"]
    sp_row = time.frame().query("variant == 'TP + SP' and tp == 8")
    assert len(sp_row)
    no_sp = _ok(page_test("pages/tp_scaling.py", {**DEFAULT_PARAMS, "sp": "0"}))
    assert [m.label for m in no_sp.metric][3:] == ["TP 8 (the plan's)", "TP 16: first across nodes"]
    assert [m.value for m in no_sp.metric][3:] != [m.value for m in at.metric][3:]  # sp=0 reads the other rows


def test_tp_scaling_hides_sp_comm_under_the_gemms_inside_a_node_only():
    at = _ok(page_test("pages/tp_scaling.py", DEFAULT_PARAMS))
    exposed = _part_seconds(vega_charts(at)[0].frame(), "TP communication (exposed)")
    at.toggle(key="plan.tpo").set_value(True).run()  # the plan's own overlap field, in the sidebar
    df = vega_charts(_ok(at))[0].frame()
    after = _part_seconds(df, "TP communication (exposed)")
    assert after[("TP + SP", 8)] < 0.5 * exposed[("TP + SP", 8)]  # NVLink: mostly under the GEMMs
    assert after[("TP + SP", 16)] == pytest.approx(exposed[("TP + SP", 16)])  # across nodes: exposed as before
    assert after[("TP without SP", 8)] == pytest.approx(exposed[("TP without SP", 8)])  # works on SP's collectives
    at.radio(key="plan.compute").set_value("mfu").run()  # the sidebar's Modelling assumptions
    flat = _part_seconds(vega_charts(_ok(at))[0].frame(), "compute")
    device = _part_seconds(df, "compute")
    assert flat[("TP without SP", 1)] != pytest.approx(device[("TP without SP", 1)])


def _part_seconds(frame, part: str) -> dict:
    rows = frame[frame["part"] == part]
    value = "seconds" if "seconds" in rows else "ms"
    return {(r["variant"], int(r["tp"])): float(r[value]) for r in rows.to_dict("records")}


def test_plan_round_trips_through_the_url():
    at = _ok(page_test("pages/tp_scaling.py", SMALL))
    assert at.number_input(key="plan.tp").value == 2 and at.selectbox(key="plan.model").value == "gpt3-22b"
    at.number_input(key="plan.dp").set_value(4).run()
    at.number_input(key="plan.nodes").set_value(4).run()
    _ok(at)
    assert at.query_params["dp"] == "4" and at.query_params["nodes"] == "4"
    assert at.query_params["sp"] in ("1",) and at.query_params["model"] == "gpt3-22b"
    # the same plan opens on another page of the session
    at.switch_page("pages/activation_memory.py").run()
    _ok(at)
    assert at.number_input(key="plan.dp").value == 4 and "DP4 TP2+SP PP4" in at.caption[0].value
    # and a fresh session opened with the URL shows it too
    fresh = _ok(page_test("pages/topology.py", {k: at.query_params[k] for k in DEFAULT_PARAMS}))
    assert len(vega_charts(fresh)[0].frame()) == 32


@pytest.mark.parametrize("page", ["pages/topology.py", "pages/activation_memory.py", "pages/tp_scaling.py"])
def test_invalid_plan_shows_the_plan_models_error(page):
    at = _ok(page_test(page, {**DEFAULT_PARAMS, "tp": "7", "dp": "1"}))
    assert any("not divisible by tp 7" in e for e in _errors(at))
    assert not vega_charts(at)  # nothing drawn for a shape that cannot exist
    assert any("pick a nearby plan below, or change the plan in the sidebar" in i.value for i in at.info)


def test_a_plan_the_model_cannot_split_offers_the_nearest_that_it_can():
    """Llama-3 405B's 126 layers on PP 8: the page offers PP 7 and PP 9 (nodes following the GPU
    count) and one click draws the plan."""
    at = _ok(page_test("pages/topology.py", {**DEFAULT_PARAMS, "model": "llama3-405b"}))
    assert any("layers 126" in e for e in _errors(at)) and not vega_charts(at)
    offers = {b.label: b for b in at.button if b.key and b.key.startswith("plan_fix_")}
    assert set(offers) == {"Use PP 9 on 72 nodes", "Use PP 7 on 56 nodes"}
    offers["Use PP 7 on 56 nodes"].click().run()
    _ok(at)
    assert at.query_params["pp"] == "7" and at.query_params["nodes"] == "56"
    assert not any("layers 126" in e for e in _errors(at)) and len(vega_charts(at)[0].frame()) == 448


def test_bad_url_value_is_reported_and_the_page_still_draws():
    at = _ok(page_test("pages/topology.py", {**DEFAULT_PARAMS, "tp": "eight"}))
    assert any("tp='eight' must be an integer" in e for e in _errors(at))
    assert at.query_params["tp"] == "1"  # the field's one declared default, and the URL is repaired
    assert at.query_params["dp"] == "8" and at.query_params["pp"] == "8"  # the link's other values are kept
    at.button(key="plan_fit_nodes").click().run()  # 64 GPUs: "Use 8 nodes"
    at.button(key="plan_fix_sp_False").click().run()  # SP needs TP > 1: the offered fix
    assert len(vega_charts(_ok(at))[0].frame()) == 64
    at = _ok(page_test("pages/tp_scaling.py", {**SMALL, "sp": "maybe"}))
    assert any("sp='maybe' must be 0 or 1" in e for e in _errors(at))
    assert at.selectbox(key="plan.model").value == "gpt3-22b"  # the link's other values are kept


def test_world_size_mismatch_offers_to_fit_the_nodes():
    at = _ok(page_test("pages/topology.py", {**DEFAULT_PARAMS, "dp": "16", "gb": "1536"}))
    assert any("= 1024, but the cluster has 64×8 = 512 GPUs" in e for e in _errors(at))
    at.button(key="plan_fit_nodes").click().run()  # "Use 128 nodes (128×8 = 1024 GPUs)"
    _ok(at)
    assert at.number_input(key="plan.nodes").value == 128 and not _errors(at)


def test_reset_returns_to_the_default_plan():
    at = page_test("pages/activation_memory.py", SMALL)
    at.button(key="plan_reset").click().run()
    _ok(at)
    assert {k: at.query_params[k] for k in DEFAULT_PARAMS} == DEFAULT_PARAMS


def test_view_choices_come_from_the_url_too():
    at = _ok(
        page_test("pages/topology.py", {**SMALL, "topo_color": "DP", "topo_groups": "PP", "topo_vs": "tp-cp-pp-dp"})
    )
    assert at.segmented_control(key="topo_color").value == "dp"
    assert at.segmented_control(key="topo_groups").value == "pp"
    grid = vega_charts(at)[0]
    assert '"field": "dp"' in grid.text() and "moves under tp-cp-pp-dp" in grid.text()
    at = _ok(page_test("pages/activation_memory.py", {**SMALL, "attn": "fa2", "mem_scope": "per GPU"}))
    assert at.selectbox(key="plan.attn").value == "fa2" and at.segmented_control(key="mem_scope").value == "gpu"


def test_the_memory_banner_follows_the_plans_attention_kernel():
    """The plan's attention kernel changes the charts and the plan form's memory banner alike: both
    come from the same plan."""
    query = {"model": "gpt3-175b", "cluster": "dgx-h100", "nodes": "64", "dp": "4", "tp": "8", "pp": "16"}
    query |= {"sp": "1", "mb": "2", "gb": "1536"}
    plain = _ok(page_test("pages/activation_memory.py", {**query, "attn": "unfused"}))
    (banner,) = [e for e in _errors(plain) if e.startswith("memory per GPU")]
    stages = next(c for c in vega_charts(plain) if "stage" in c.frame().columns).frame()
    mine = stages[stages["sp"] == "with SP"]
    worst = mine.loc[mine["total_bytes"].idxmax(), "stage"]  # the banner's GPU: the most loaded stage
    act = mine[(mine["stage"] == worst) & (mine["kind"] == "activations")]["bytes_GiB"].item()
    assert f"activations {act:.1f} GiB" in banner  # the chart's figure
    flash = _ok(page_test("pages/activation_memory.py", query))  # the declared default: fused attention
    assert not [e for e in _errors(flash) if e.startswith("memory per GPU")]  # 64.2 GiB of scores gone: it fits
    flash.selectbox(key="plan.attn").set_value("unfused").run()  # and changed within the session
    assert [e for e in _errors(_ok(flash)) if e.startswith("memory per GPU")] == [banner]


def test_topology_overview_of_512_nodes_keeps_its_rows_and_tells_64_stages_apart():
    """At 512 nodes with PP 64 the "All nodes" chart collapsed to a flat line (its
    65-entry legend took the height) and 64 PP colours repeated a 20-colour palette."""
    query = {"model": "gpt3-1t", "cluster": "dgx-h100", "nodes": "512", "gpn": "8", "dp": "8", "tp": "8", "pp": "64"}
    query |= {"sp": "1", "mb": "1", "gb": "3072", "topo_color": "pp"}
    at = _ok(page_test("pages/topology.py", query))
    overview, grid = vega_charts(at)[:2]
    nodes = overview.frame()
    assert sorted(nodes["row"].unique()) == list(range(8)) and nodes["value"].nunique() == 64
    spec = overview.text()
    assert '"scheme": "viridis"' in spec and '"domain": [0, 63]' in spec  # sequential, every stage its own shade
    assert overview.spec["height"] >= 8 * 16 + 90  # the 8 rows of cells, with room for the legend
    assert '"scheme": "viridis"' in grid.text()  # the GPU grid uses the same scale
    small = _ok(page_test("pages/topology.py", {**query, "pp": "8", "dp": "64", "gb": "1536"}))
    assert '"viridis"' not in vega_charts(small)[0].text()  # 8 stages: distinct categorical colours


def test_a_shared_links_activation_bytes_reach_the_memory_banner():
    """The Activation bytes choice is bound to the URL as its label ('4 B'): a link that carries it checks
    the plan's memory with 4 B per activation on its first run, as the same choice made by hand does
    (Llama 3 8B, micro batch 4: 70 GiB fits at the model's 2 B, 106 GiB at 4 B does not)."""
    query = {"model": "llama3-8b", "cluster": "dgx-h100", "nodes": "1", "dp": "2", "tp": "4", "pp": "1"}
    query |= {"sp": "1", "mb": "4", "gb": "8"}
    by_hand = _ok(page_test("pages/activation_memory.py", query))
    assert not [e for e in _errors(by_hand) if e.startswith("memory per GPU")]
    by_hand.selectbox(key="mem_act").set_value(4).run()
    (banner,) = [e for e in _errors(_ok(by_hand)) if e.startswith("memory per GPU")]
    assert "activations 72.2 GiB" in banner
    linked = _ok(page_test("pages/activation_memory.py", {**query, "mem_act": "4 B"}))
    assert linked.selectbox(key="mem_act").value == 4
    assert [e for e in _errors(linked) if e.startswith("memory per GPU")] == [banner]
