"""AppTest of the Plan review page: compare, search, import, saved reviews, and the URL that
reproduces the view. No browser: app.py in-process, switched to the page (tests.support.apptest)."""

import json
import re
from urllib.parse import parse_qsl

import pytest

from parallel.core.report import Options, plan_report
from parallel.core.specs import GiB
from parallel.importers import import_text
from parallel.review.urls import review_from_params, review_to_params
from tests.support.apptest import page_test, vega_charts
from tests.unit.test_import import DATA
from tests.unit.test_import_torchtitan_registry import REGISTRY
from tests.unit.test_input_bounds import shown

PAGE = "pages/plan_review.py"
SMALL = {
    "model": "gpt3-22b",
    "cluster": "dgx-h100",
    "nodes": "2",
    "plan": [
        "A|dp=2,tp=8,pp=1,sp=1,gb=64",
        "B|dp=2,tp=4,pp=2,sp=1,gb=64,zero=1,recompute=selective,tpo=1,gro=1,pgo=1",
        "C|dp=1,tp=16,sp=1,gb=64",
    ],
}


@pytest.fixture(autouse=True)
def _data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("PARASCOPE_REVIEWS_DB", raising=False)
    monkeypatch.setenv("PARASCOPE_DATA", str(tmp_path))


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def button(at, prefix: str):
    return next(b for b in at.button if b.label.startswith(prefix))


def frame_with(at, column: str):
    """The first table of the page (st.dataframe / st.data_editor) that has `column`."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def url(at) -> dict:
    return {
        k: at.query_params.get_all(k) if hasattr(at.query_params, "get_all") else at.query_params[k]
        for k in at.query_params
    }


def test_compare_draws_every_chart_with_one_row_per_plan_and_component():
    at = ok(page_test(PAGE, SMALL))
    memory, time, hidden, comm = vega_charts(at)
    assert {"bar", "rule"} <= memory.marks()
    bars = memory.frame()
    assert len(bars) == 3 * 4 and set(bars["plan"]) == {"A", "B", "C"}
    assert set(bars["component"]) == {"params", "grads", "optimizer", "activations"}
    rules = [f for f in memory.datasets.values() if "what" in f.columns][0]
    assert rules["gib"].iloc[0] == pytest.approx(80.0)  # the H100's memory
    assert set(time.frame()["plan"]) == {"A", "B", "C"} and "compute" in set(time.frame()["part"])
    assert "optimizer" in set(time.frame()["part"])  # the device model times the optimizer step
    shown = hidden.frame()
    assert {"SP", "DP"} <= set(shown.loc[shown["plan"] == "B", "dim"])  # B overlaps TP comm and the DP reduce
    assert any("each operator timed from its shape on h100-sxm" in c.value for c in at.caption)
    assert {"NVLink (intra-node)", "InfiniBand (inter-node)"} <= set(comm.frame()["link"])  # C's TP 16 crosses nodes
    table = frame_with(at, "metric")
    assert {"section", "metric", "A", "B", "C"} <= set(table.columns) and len(table) > 30
    assert list(frame_with(at, "recompute")["name"]) == ["A", "B", "C"]  # the plan editor
    assert any("cross nodes" in w.value for w in at.warning)  # C's TP groups span the two nodes


def test_links_open_each_plan_in_the_plan_pages():
    at = ok(page_test(PAGE, SMALL))
    links = at.get("page_link")
    assert len(links) == 3 * 4  # Topology, Activation memory, TP scaling, Long context per plan
    assert [link.proto.label for link in links][-1] == "Long context"
    topo = [link.proto for link in links if link.proto.label == "Topology"]
    assert "dp=2&tp=4&pp=2&sp=1&gb=64&zero=1&recompute=selective" in topo[1].query_string
    assert "model=gpt3-22b&cluster=dgx-h100&nodes=2" in topo[1].query_string


def test_the_url_reproduces_the_view():
    query = {
        **SMALL,
        "title": "22B on 2 nodes",
        "chosen": "B",
        "verdict": "B: half the memory",
        "mfu": "0.4",
        "s_max_tp": "8",
        "s_sp": "1",
        "s_zero": "1,2",
        "dropout": "0",
    }
    at = ok(page_test(PAGE, query))
    written = url(at)
    assert review_from_params(written) == review_from_params(query)
    assert at.text_input(key="rv.title").value == "22B on 2 nodes"
    assert at.selectbox(key="rv.chosen").value == "B" and at.text_area(key="rv.verdict").value == "B: half the memory"
    # a second session opening the written URL sees the same state
    again = ok(page_test(PAGE, {k: v if len(v) > 1 or k == "plan" else v[0] for k, v in written.items()}))
    assert review_from_params(url(again)) == review_from_params(written)
    # editing a widget goes back into the URL
    at.text_input(key="rv.title").input("renamed").run()
    assert ok(at).query_params["title"] == "renamed"


def test_a_bad_link_is_explained_not_a_traceback():
    at = ok(page_test(PAGE, {"plan": ["A|tp=eight"]}))
    assert any("The link's review could not be used" in e.value and "tp='eight'" in e.value for e in at.error)
    assert len(vega_charts(at)) == 4  # the default review instead


def test_search_pareto_chart_and_send_to_compare():
    at = ok(page_test(PAGE, {**SMALL, "view": "search"}))
    (pareto,) = vega_charts(at)
    points = pareto.frame()
    assert {"circle", "line", "rule"} <= pareto.marks()
    assert {"gib", "step_time_s", "label", "front"} <= set(points.columns)
    assert points["gib"].max() <= 0.9 * 80 + 1e-9 and (points["front"] == "Pareto front").any()
    assert len(points) <= 300 + (points["front"] == "Pareto front").sum()
    # the y axis stops a decade above the fastest plan, not at the lean end of the front
    # (206 s here, 83x the fastest), and the caption says how many plans are left out
    assert points["step_time_s"].max() <= 10 * points["step_time_s"].min() + 1e-12
    assert any("slower plans" in c.value and "are not drawn" in c.value for c in at.caption)
    button(at, "Add to compare").click().run()
    ok(at)
    assert at.query_params["view"] == "compare"
    plans = url(at)["plan"]
    assert len(plans) == 4 and plans[-1].startswith("search #1|")
    assert len(vega_charts(at)[0].frame()) == 4 * 4


def test_search_that_finds_nothing_says_why():
    at = ok(
        page_test(
            PAGE, {"model": "gpt3-175b", "nodes": "1", "plan": ["A|dp=1,tp=8,gb=16"], "view": "search", "s_zero": "0"}
        )
    )
    assert any("no plan fits" in e.value and "allowing ZeRO-3" in e.value for e in at.error)
    assert len(frame_with(at, "constraint")) >= 5  # the funnel


def test_import_a_megatron_script_then_add_it():
    at = ok(page_test(PAGE, {**SMALL, "view": "import"}))
    at.text_area(key="rv.i_text").input((DATA / "megatron_gpt3_175b.sh").read_text()).run()
    at.number_input(key="rv.i_nodes").set_value(64).run()
    button(at, "Read it").click().run()
    ok(at)
    assert any("gpt3-175b, DP4 TP8 PP16" in s.value for s in at.success)
    recognised = frame_with(at, "flag or key")
    assert "--tensor-model-parallel-size" in set(recognised["flag or key"])
    button(at, "Add to compare").click().run()
    ok(at)
    assert at.query_params["model"] == "gpt3-175b" and at.query_params["nodes"] == "64"
    assert url(at)["plan"][-1].startswith("imported|dp=4,tp=8,pp=16")


def test_import_a_torchtitan_config_registry_picks_its_config():
    at = ok(page_test(PAGE, {**SMALL, "plan": SMALL["plan"][:1], "view": "import"}))  # room for two more
    assert "config registry" in at.text_area(key="rv.i_text").label  # the box says a registry goes in it
    at.text_area(key="rv.i_text").input((DATA / "torchtitan_registry_llama3.py").read_text()).run()
    ok(at)
    config = at.selectbox(key="rv.i_config")
    assert config.options == ["llama3_8b", "llama3_8b_mxfp8", "llama3_70b", "llama3_405b"]
    config.set_value("llama3_70b").run()
    at.number_input(key="rv.i_nodes").set_value(8).run()
    button(at, "Read it").click().run()
    ok(at)
    assert any("llama3-70b" in s.value and "TP8+SP" in s.value and "64 GPUs" in s.value for s in at.success)
    assert any("torchtitan config llama3\\_70b" in m.value for m in at.markdown)  # markdown-escaped
    button(at, "Add to compare as 'llama3_70b'").click().run()
    assert url(ok(at))["plan"][-1].startswith("llama3_70b|dp=8,tp=8")
    at.segmented_control(key="rv.view").set_value("import").run()  # a second config of the same registry:
    assert at.text_area(key="rv.i_text").value.startswith("# Test fixture")  # the text and Nodes are kept
    assert at.number_input(key="rv.i_nodes").value == 8 and at.selectbox(key="rv.i_config").value == "llama3_70b"
    at.selectbox(key="rv.i_config").set_value("llama3_8b").run()
    button(at, "Read it").click().run()
    button(at, "Add to compare as 'llama3_8b'").click().run()
    assert [p.split("|")[0] for p in url(ok(at))["plan"]][-2:] == ["llama3_70b", "llama3_8b"]


def test_import_on_too_few_gpus_for_one_replica_asks_for_nodes_without_cli_flags():
    """llama3_70b is TP8; one GB200 NVL72 tray has 4 GPUs: the page says to set the nodes (its widget),
    not the CLI's --nodes."""
    at = ok(page_test(PAGE, {**SMALL, "cluster": "gb200-nvl72", "nodes": "4", "view": "import"}))
    at.text_area(key="rv.i_text").input((DATA / "torchtitan_registry_llama3.py").read_text()).run()
    at.selectbox(key="rv.i_config").set_value("llama3_70b").run()
    at.number_input(key="rv.i_nodes").set_value(1).run()
    button(at, "Read it").click().run()
    (err,) = [shown(e.value) for e in ok(at).error]
    assert err == (
        "pasted text: 1 node × 4 GPUs per node gives 4 GPUs, but one model replica needs tp×pp×cp = 8×1×1 = 8, "
        "which does not divide it; set the nodes so that nodes × GPUs per node is a multiple of 8"
    )


def test_an_import_read_from_other_inputs_is_not_shown_as_this_ones():
    """Read llama3_70b, then pick another config, change the Nodes, or paste another file: the plan read
    before is not this file's, so neither it nor its Add to compare stays on the page until Read it."""
    registry = (DATA / "torchtitan_registry_llama3.py").read_text()
    at = ok(page_test(PAGE, {**SMALL, "view": "import"}))
    at.text_area(key="rv.i_text").input(registry).run()
    at.selectbox(key="rv.i_config").set_value("llama3_70b").run()
    at.number_input(key="rv.i_nodes").set_value(8).run()
    button(at, "Read it").click().run()
    assert any("llama3-70b" in s.value for s in ok(at).success)
    for change in (
        lambda: at.selectbox(key="rv.i_config").set_value("llama3_405b").run(),
        lambda: at.number_input(key="rv.i_nodes").set_value(16).run(),
        lambda: at.text_area(key="rv.i_text").input((DATA / "megatron_gpt3_175b.sh").read_text()).run(),
    ):
        button(at, "Read it").click().run()
        assert ok(at).success
        change()
        assert not ok(at).success and not at.warning and not at.dataframe
        assert not any(b.label.startswith("Add to compare") for b in at.button)
        assert [shown(i.value) for i in at.info] == [
            "Changed since the last **Read it**: press **Read it** to read this file with these settings."
        ]
    button(at, "Read it").click().run()
    assert any("gpt3-175b" in s.value for s in ok(at).success) and not at.info
    at.text_area(key="rv.i_text").input((DATA / "torchtitan_registry_llama3.py").read_text()).run()
    at.selectbox(key="rv.i_config").set_value("llama3_405b").run()
    deepseek = REGISTRY.format(step=-1, pp=1, tp=2)
    at.text_area(key="rv.i_text").input(deepseek).run()  # another registry: the Config box follows it
    assert ok(at).selectbox(key="rv.i_config").options == ["deepseek_v3_16b", "deepseek_v3_16b_hybridep"]
    assert at.selectbox(key="rv.i_config").value == "deepseek_v3_16b"


def test_import_of_a_plan_json_takes_its_cluster_as_the_cli_does():
    """A plan JSON that names its cluster (Qwen3-30B-A3B on 32 GB200 NVL72 trays, TP and EP across trays)
    imported into a review of GPT-3 22B on 2 DGX H100s: the review moves to the file's model, cluster and
    nodes (retitled, its plans re-fitted) and the imported card shows `parallel plan --import`'s numbers."""
    text = json.dumps(
        {
            "model": "qwen3-30b-a3b",
            "cluster": "gb200-nvl72",
            "nodes": 32,
            "plan": {"dp": 16, "tp": 8, "sp": True, "ep": 16, "moe_dispatcher": "flex", "global_batch": 512},
        }
    )
    at = ok(page_test(PAGE, {**SMALL, "view": "import", "title": "gpt3-22b on 2 dgx-h100 nodes"}))
    at.text_area(key="rv.i_text").input(text).run()
    button(at, "Read it").click().run()
    ok(at)
    assert any("on 32 gb200-nvl72 nodes" in s.value for s in at.success)
    button(at, "Add to compare").click().run()
    ok(at)
    assert (at.query_params["cluster"], at.query_params["nodes"]) == ("gb200-nvl72", "32")
    assert at.title[0].value == "Plan review: qwen3-30b-a3b on 32 gb200-nvl72 nodes"
    assert "DP 2 → 16 for 128 GPUs" in " ".join(m.value for m in at.markdown)  # plan A re-fitted
    imported = import_text(text, "plan.json")
    report = plan_report(imported.plan, imported.model, imported.cluster, Options())
    card = [m.value for m in at.metric if m.label == "step time"][-1]
    assert card == f"{report['step_time_s']:,.3f} s"


def test_import_bad_input_points_at_the_line():
    at = ok(page_test(PAGE, {**SMALL, "view": "import"}))
    at.text_area(key="rv.i_text").input(
        'torchrun pretrain_gpt.py --num-layers 2 \\\n  --tensor-model-parallel-size "8\n'
    ).run()
    button(at, "Read it").click().run()
    ok(at)
    assert any("line 2: unterminated double quote" in e.value for e in at.error)


# Megatron-LM's arguments alone, as its examples/post_training/modelopt/conf/*.sh keep a model's shape
MODEL_ARGS = """#!/bin/bash
MODEL_ARGS=" \\
    --num-layers 24 --hidden-size 2048 --num-attention-heads 16 \\
    --num-experts 64 --moe-ffn-hidden-size 1408 --moe-router-topk 6 \\
    --untie-embeddings-and-output-weights --quick-geglu \\
    --seq-length 4096 --bf16 --padded-vocab-size 102400 \\
"
"""


def test_import_of_arguments_alone_asks_for_the_nodes_and_shows_what_it_read():
    at = ok(page_test(PAGE, {**SMALL, "view": "import"}))
    at.text_area(key="rv.i_text").input(MODEL_ARGS).run()
    button(at, "Read it").click().run()
    ok(at)
    assert not at.error and not at.success
    (ask,) = [shown(w.value) for w in at.warning]
    assert ask == (
        "pasted text: read as megatron L24 h2048 a16, but the arguments come with no launch command to say how "
        "many GPUs they run on. Set **Nodes** to the nodes of 8 GPUs it runs on, then **Read it** again."
    )
    notes = [shown(m.value) for m in at.markdown if m.value.startswith("**Notes**")]
    assert notes and "- line 2: the arguments read from the variable $MODEL_ARGS (no launch command)" in notes[0]
    assert "- --padded-vocab-size 102400: the vocabulary as given, not padded further" in notes[0]
    assert not any(b.label.startswith("Add to compare") for b in at.button)  # no plan until the GPUs are known
    at.number_input(key="rv.i_nodes").set_value(2).run()
    button(at, "Read it").click().run()
    ok(at)
    assert not at.warning
    (got,) = [shown(m.value) for m in at.success]
    assert got.startswith("megatron: megatron L24 h2048 a16, DP16 ")
    assert got.endswith("16 GPUs (2 nodes × 8 GPUs per node) on 2 dgx-h100 nodes")
    button(at, "Add to compare").click().run()
    assert url(ok(at))["plan"][-1].startswith("imported|dp=16,tp=1,pp=1")


def test_import_of_a_hybrid_mamba_model_is_one_error_and_the_page_goes_on():
    at = ok(page_test(PAGE, {**SMALL, "view": "import", "nodes": "2"}))
    hybrid = MODEL_ARGS.replace("--num-layers 24", "--num-layers 24 --mamba-num-heads 64")
    at.text_area(key="rv.i_text").input(hybrid).run()
    button(at, "Read it").click().run()
    ok(at)
    (err,) = [e.value for e in at.error]
    head, _, block = err.partition("\n\n")
    assert shown(head) == (
        "pasted text line 3: --mamba-num-heads: a hybrid Mamba-Transformer model; the plan model prices "
        "attention, MLP and MoE layers only, not Mamba's state-space layers"
    )
    assert block == "```\n       3 |     --num-layers 24 --mamba-num-heads 64 --hidden-size 2048 " + (
        "--num-attention-heads 16 \\\n```"
    )
    at.text_area(key="rv.i_text").input(MODEL_ARGS).run()
    at.number_input(key="rv.i_nodes").set_value(2).run()
    button(at, "Read it").click().run()
    assert not ok(at).error and [s.value.split(", ")[1] for s in at.success] == ["DP16 seq-experts"]


def test_the_uploader_takes_every_file_the_importers_name_by_suffix():
    at = ok(page_test(PAGE, {**SMALL, "view": "import"}))
    at.radio(key="rv.i_how").set_value("Upload").run()
    (uploader,) = ok(at).get("file_uploader")
    assert {".sh", ".bash", ".slurm", ".sbatch", ".toml", ".py", ".json", ".txt"} == set(uploader.proto.type)


def test_save_list_reopen_and_notes():
    at = ok(page_test(PAGE, {**SMALL, "view": "saved", "title": "to keep", "chosen": "A"}))
    assert any("No saved reviews yet" in i.value for i in at.info)
    at.text_input(key="rv.author").input("ana")
    button(at, "Save as a new review").click().run()
    ok(at)
    assert at.query_params["review"] == "1" and any("Saved as review #1" in s.value for s in at.success)
    saved = frame_with(at, "revisions")
    assert list(saved["title"]) == ["to keep"] and saved["chosen"][0] == "A"
    at.text_area(key="rv.note_text").input("B would free memory for a longer sequence")
    button(at, "Add note").click().run()
    assert any("**ana**" in m.value and "longer sequence" in m.value for m in ok(at).markdown)
    # another session opens it from the list
    other = ok(page_test(PAGE, {"view": "saved"}))
    button(other, "Open").click().run()
    ok(other)
    assert other.query_params["view"] == "compare" and other.query_params["title"] == "to keep"
    assert len(url(other)["plan"]) == 3


def test_custom_model_rides_in_the_url_and_disables_the_links():
    at = ok(page_test(PAGE, {"view": "import", "nodes": "8"}))
    at.text_area(key="rv.i_text").input((DATA / "megatron_sc21_figure15.sh").read_text()).run()
    button(at, "Read it").click().run()
    button(ok(at), "Add to compare").click().run()
    ok(at)
    assert at.query_params["model"] == "custom" and at.query_params["shape"].startswith("L=32,h=3840,a=32")
    assert all(link.proto.disabled for link in at.get("page_link")[-3:])
    state = review_from_params(url(at))
    assert review_to_params(state)["mname"] == "megatron L32 h3840 a32"
    assert state.plans[-1].plan.tp == 2 and state.nodes == 8
    assert vega_charts(at)[0].frame()["bytes"].max() < 80 * GiB


def test_a_link_opens_the_plan_in_the_topology_page():
    at = ok(page_test(PAGE, SMALL))
    topo = [link.proto for link in at.get("page_link") if link.proto.label == "Topology"][1]  # plan B
    other = ok(page_test("pages/topology.py", dict(parse_qsl(topo.query_string))))
    assert other.query_params["tp"] == "4" and other.query_params["pp"] == "2" and other.query_params["zero"] == "1"
    assert len(vega_charts(other)[0].frame()) == 16  # one cell per GPU of the review's 2 nodes


def test_a_review_compares_a_dense_plan_with_a_moe_plan():
    """Llama-3 70B (the review's model) beside Mixtral 8x7B with EP 8 on the same 8 nodes."""
    query = {
        "model": "llama3-70b",
        "cluster": "dgx-h100",
        "nodes": "8",
        "plan": ["dense|dp=2,tp=8,pp=4,sp=1,gb=64,zero=1", "moe|dp=16,tp=1,pp=4,gb=64,zero=1,ep=8,model=mixtral-8x7b"],
    }
    at = ok(page_test(PAGE, query))
    table = frame_with(at, "metric")
    rows = table.set_index(["section", "metric"])
    assert list(rows.loc[("model", "name"), ["dense", "moe"]]) == ["llama3-70b", "mixtral-8x7b"]
    assert int(rows.loc[("plan", "ep"), "moe"]) == 8 and int(rows.loc[("plan", "ep"), "dense"]) == 1
    exposed = rows.loc[("time", "exposed EP comm (s)")]
    assert float(exposed["moe"]) > 0 == float(exposed["dense"])
    state = review_from_params(url(at))  # the URL keeps which model each plan trains
    assert [p.model.name if p.model else None for p in state.plans] == [None, "mixtral-8x7b"]
    assert any("EP=8" in m.value for m in at.markdown)


def test_explain_says_why_one_plan_beats_another():
    at = ok(page_test(PAGE, SMALL))
    table = frame_with(at, "B − A")
    parts = list(table[""])
    assert parts[0] == "step" and "exposed SP" in parts and parts[-1] == "memory per GPU (GiB)"
    step = table.iloc[0]
    assert step["B − A"] == pytest.approx(step["B"] - step["A"], abs=2e-3)
    # the verdict: the slower step over the faster, less one, as a positive percentage
    (text,) = [m.value for m in at.markdown if " slower than " in m.value]
    fast, slow = sorted([step["A"], step["B"]])
    percent = float(re.search(r"is (\d+\.\d)% slower than", text).group(1))
    assert percent == pytest.approx(100 * (slow / fast - 1), abs=0.1) and not re.search(r"-\d[\d.]*%", text)
    at.selectbox(key="rv.x_b").select("A").run()
    assert any("Pick two different plans" in i.value for i in ok(at).info)


def test_search_marks_plans_the_model_cannot_tell_apart_and_explains_the_first():
    at = ok(page_test(PAGE, {**SMALL, "view": "search"}))
    rows = frame_with(at, "≈ fastest")
    assert rows["≈ fastest"].iloc[0]  # the fastest is equivalent to itself
    within = rows.loc[rows["≈ fastest"], "step (s)"]
    assert within.max() <= rows["step (s)"].min() * 1.07 + 1e-3
    assert any("the model's mean error against published GPU runs" in c.value for c in at.caption)
    table = frame_with(at, "#2 − #1")
    step = table.iloc[0]
    assert step[""] == "step" and step["#2 − #1"] == pytest.approx(step["#2"] - step["#1"], abs=2e-3)
    assert step["#1"] == pytest.approx(rows["step (s)"].iloc[0], abs=1e-3)


def test_switching_model_and_cluster_refits_the_plans_and_retitles_the_review():
    """The default review (GPT-3 175B on 64 DGX H100 nodes) switched to Llama-3 70B on 8 nodes: the page
    is retitled and each plan re-fitted to the 64 GPUs (its DP absorbs the change); on 4 nodes no DP
    can, so the cards say why instead of showing a step time."""
    at = ok(page_test(PAGE))
    assert at.title[0].value == "Plan review: gpt3-175b on 64 dgx-h100 nodes"
    at.selectbox(key="rv.model").set_value("llama3-70b").run()
    at.number_input(key="rv.nodes").set_value(8).run()
    ok(at)
    assert at.title[0].value == "Plan review: llama3-70b on 8 dgx-h100 nodes"
    text = " ".join(m.value for m in at.markdown)
    assert "DP 8 → 1 for 64 GPUs" in text
    assert len([m for m in at.metric if m.label == "step time"]) == 2  # both fit: both priced
    at.number_input(key="rv.nodes").set_value(4).run()
    ok(at)
    text = " ".join(m.value for m in at.markdown)
    assert "does not fit" in text and at.title[0].value == "Plan review: llama3-70b on 4 dgx-h100 nodes"
    assert not [m for m in at.metric if m.label == "step time"]  # no forecast for a plan that cannot run
    assert any("32 GPUs" in e.value for e in at.error)
