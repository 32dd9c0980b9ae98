"""Megatron-core's --pipeline-model-parallel-layout: its grammar (pipeline_parallel_layer_layout.py),
the layers each pipeline rank holds, and the plan fields a Megatron-LM launch script's layout becomes."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from parallel.cli import plan as plan_cli
from parallel.core.memory import inflight_chunks, inflight_layers, layout_peak_layers, memory_per_stage
from parallel.core.pipeline_layout import MAX_LAYOUT_CHARS, LayoutError, parse_layout, plan_split, unroll
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.core.validate import check
from parallel.importers import ImportFailed, import_text
from parallel.importers.export import megatron_script, torchtitan_toml
from parallel.search.space import Constraints, search

sys.path.insert(0, str(Path(__file__).parent))
from test_moe_models import V3_LAUNCH  # noqa: E402


@pytest.mark.parametrize(
    "text,unrolled",
    [  # parse_str_to_list's own examples (its patterns do not check the characters)
        ("(ab)*3", "ababab"),
        ("ab,(cd|)*2", "abcd|cd|"),
        ("(|ab)*2,cd", "|ab|abcd"),
        ("xy(ab|cd|ef)*2,pq", "xyab|cd|efab|cd|efpq"),
        ("Et*3|(t*2|)*2L", "Ettt|tt|tt|L"),
    ],
)
def test_unroll_follows_megatron_cores_two_patterns(text, unrolled):
    assert unroll(text) == unrolled


def test_the_docstring_example_parses_to_its_stages():
    layout = parse_layout("Ettt|(tt|)*29,m|L", pp=2)
    assert layout.stages == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert (layout.vpp, layout.layers, layout.mtp_layers) == (16, 61, 1)


@pytest.mark.parametrize(
    "text,pp,vpp,ranks",
    [
        # Megatron-Bridge's H100 DeepSeek-V3 layout: E+1 | 2 x 30 | mtp+loss, 32 virtual stages.
        # pp 8: rank 0 holds stages 0, 8, 16, 24 = 1+2+2+2; rank 7 holds 7, 15, 23, 31 = 2+2+2+0
        ("Et|(tt|)*30mL", 8, 4, (7,) + (8,) * 6 + (6,)),
        # pp 16: rank 0 holds stages 0 and 16 = 1+2, rank 15 stages 15 and 31 = 2+0, the others 2+2
        ("Et|(tt|)*30mL", 16, 2, (3,) + (4,) * 14 + (2,)),
        ("Et*16|t*16|t*16|t*13mL", 4, 1, (16, 16, 16, 13)),
        ("Et*4|(t*4|)*14tmL", 4, 4, (16, 16, 16, 13)),  # stages 3, 7, 11, 15 on rank 3: 4+4+4+1
        ("Et*8|(t*8|)*6t*5mL", 2, 4, (32, 29)),
    ],
)
def test_deepseek_v3_layouts_give_each_rank_its_hand_counted_layers(text, pp, vpp, ranks):
    layout = parse_layout(text, pp, layers=61)
    assert (layout.vpp, layout.rank_layers()) == (vpp, ranks)


@pytest.mark.parametrize(
    "text,pp,message",
    [
        ("Et|tx|L", 1, "unknown character\\(s\\) 'x' in stage 'tx'"),
        ("Et|(tt|)*30mL", 5, "has 32 virtual stages, not a multiple of pp = 5"),
        ("tE|tL", 2, "the embedding \\(E\\) must come first"),
        ("Et|Lt", 2, "the loss \\(L\\) must come last"),
        ("Et|tL|L", 3, "the loss \\(L\\) must come last, once \\(found 2\\)"),
        ("Etm|tL", 2, "must all come before MTP layers"),
        ("E(t)*99999999|L", 2, "unrolls past"),
        ("E" + "(t)*60000" * 3 + "|L", 2, "unrolls past"),
        ("Et*60|L", 2, "holds 60 transformer layers \\(t\\), the model 61"),
        # Megatron-core's MTP rules (validate_layer_layout): one virtual stage, a rank's last chunk
        ("Et*30|t*31m|mL", 1, "MTP layers \\(m\\) in virtual stages 1, 2"),
        (
            "Et*30|t*31m|L|",
            2,
            "in virtual stage 1, chunk 0 of rank 1; Megatron-core needs them in a rank's last chunk \\(1\\)",
        ),
    ],
)
def test_bad_layouts_are_refused_with_what_is_wrong(text, pp, message):
    with pytest.raises(LayoutError, match=message):
        parse_layout(text, pp, layers=61)


def test_the_unrolled_layout_is_bounded_before_it_is_built():
    assert len(unroll("E(t)*60000|L")) < MAX_LAYOUT_CHARS
    with pytest.raises(LayoutError):
        unroll("(" + "t" * 1000 + ")*1000")


@pytest.mark.parametrize(
    "text,pp,fields",
    [
        ("Et|(tt|)*30mL", 8, {"vpp": 4, "first_stage_layers": 7, "last_stage_layers": 6}),
        ("Et*16|t*16|t*16|t*13mL", 4, {"vpp": 1, "first_stage_layers": None, "last_stage_layers": 13}),
        ("Et*31|t*30L", 2, {"vpp": 1, "first_stage_layers": 31, "last_stage_layers": 30}),
        # 15 stages of 4 but the last of 5: rank 2 holds stages 2, 5, 8, 11, 14 = 4+4+4+4+5
        ("E(t*4|)*14t*5L", 3, {"vpp": 5, "first_stage_layers": None, "last_stage_layers": 21}),
        ("E(t*4|)*14t*4L", 3, {"vpp": 5, "first_stage_layers": None, "last_stage_layers": None}),
    ],
)
def test_a_layout_maps_to_the_plans_first_and_last_stage(text, pp, fields):
    got, _ = plan_split(parse_layout(text, pp))
    assert got == {**fields, "embedding_in_split": False, "loss_in_split": False}


def test_uneven_virtual_stages_and_mtp_are_said_uneven_middle_ranks_refused():
    _, notes = plan_split(parse_layout("Et|(tt|)*30mL", 8))
    assert "rank 0's virtual stages hold 1, 2, 2, 2 layers" in notes[0] and "MTP" in notes[-1]
    with pytest.raises(LayoutError, match="the middle ranks 1-2 hold 2, 3 transformer layers"):
        plan_split(parse_layout("Ett|tt|ttt|ttL", 4))


V3_PP8 = V3_LAUNCH.replace("--pipeline-model-parallel-size 4", "--pipeline-model-parallel-size 8")


def test_the_importer_reads_the_layout_into_the_plan():
    imp = import_text(V3_PP8 + "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'", "ds.sh")
    p = imp.plan
    assert (p.pp, p.vpp, p.first_stage_layers, p.last_stage_layers, p.p2p_overlap) == (8, 4, 7, 6, True)
    assert any("1 MTP layer(s) on rank 7, not modelled" in n for n in imp.notes)


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            "--pipeline-model-parallel-layout 'Et|(tt|)*30mL' --decoder-first-pipeline-num-layers 7",
            "cannot be set with",
        ),
        ("--pipeline-model-parallel-layout 'Et|(tt|)*30mL' --num-layers-per-virtual-pipeline-stage 2", "cannot be set"),
        ("--pipeline-model-parallel-layout 'Et|(tt|)*29t|mL'", "holds 60 transformer layers"),
        ("--pipeline-model-parallel-layout 'Et|(tt|)*30mL|'", "33 virtual stages, not a multiple of pp = 8"),
        ("--pipeline-model-parallel-layout 'Et*8|t*7|t*9|(t*8|)*4t*5mL'", "middle ranks 1-6 hold 7, 9, 8"),
    ],
)
def test_the_importer_refuses_a_layout_it_cannot_read_at_its_line(extra, message):
    with pytest.raises(ImportFailed, match=message):
        import_text(V3_PP8 + "\\\n  " + extra, "ds.sh")


# ---------------------------------------------------------------- the layout as a plan field

V3_H100 = "Et|(tt|)*30mL"  # DeepSeek-V3's H100 recipe layout (Megatron-Bridge)


@pytest.mark.parametrize(
    "pp,summary",
    [(8, (4, 7, 6)), (16, (2, 3, 2)), (4, (8, 15, 14))],
)
def test_a_plan_derives_vpp_and_its_end_stages_from_its_layout(pp, summary):
    plan = Plan(pp=pp, pp_layout=V3_H100)
    assert (plan.vpp, plan.first_stage_layers, plan.last_stage_layers) == summary
    assert not plan.embedding_in_split and not plan.loss_in_split
    assert f"layout {V3_H100}" in plan.label() and "stages" not in plan.label()
    assert Plan(pp=pp, pp_layout=V3_H100, vpp=summary[0], first_stage_layers=summary[1]) == plan  # agreeing: same


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"vpp": 2}, "Plan.vpp 2 contradicts pp_layout 'Et\\|\\(tt\\|\\)\\*30mL', which gives 4 at pp 8"),
        ({"first_stage_layers": 8}, "Plan.first_stage_layers 8 contradicts .* gives 7"),
        ({"last_stage_layers": 7}, "Plan.last_stage_layers 7 contradicts .* gives 6"),
        ({"embedding_in_split": True}, "Plan.embedding_in_split True contradicts"),
        ({"pp": 5}, "32 virtual stages, not a multiple of pp = 5"),
        ({"pp_layout": "Et|(tt|)*30mL|x"}, "unknown character"),
    ],
)
def test_a_plan_refuses_fields_its_layout_contradicts(fields, message):
    with pytest.raises(SpecError, match=message):
        Plan(**{"pp": 8, "pp_layout": V3_H100, **fields})


def test_the_mtp_count_is_checked_where_it_is_known():
    assert parse_layout(V3_H100, 8, layers=61, mtp_layers=1).mtp_layers == 1
    with pytest.raises(LayoutError, match="holds 1 MTP layers \\(m\\), the model 2"):
        parse_layout(V3_H100, 8, layers=61, mtp_layers=2)


def v3_script(pp: int, ep: int, layout: str = V3_H100) -> str:
    """DeepSeek-V3 on 1,024 H100s in Megatron-core's H100 recipe shape, with its pipeline layout."""
    return (
        V3_LAUNCH.replace("--nproc_per_node 4 --nnodes 64", "--nproc_per_node 8 --nnodes 128")
        .replace("--pipeline-model-parallel-size 4", f"--pipeline-model-parallel-size {pp}")
        .replace("--expert-model-parallel-size 64", f"--expert-model-parallel-size {ep}")
        + "--tensor-model-parallel-size 2 --sequence-parallel --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
        "--micro-batch-size 1 --global-batch-size 8192 --use-distributed-optimizer "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
        f"--pipeline-model-parallel-layout '{layout}' --mtp-num-layers 1\n"
    )


@pytest.mark.parametrize("pp,ep,vpp", [(8, 64, 4), (16, 32, 2)])
def test_deepseek_v3s_h100_layout_is_a_valid_plan(tmp_path, capsys, pp, ep, vpp):
    script = tmp_path / "deepseek_v3.sh"
    script.write_text(v3_script(pp, ep))
    code = plan_cli.main(["--import", str(script), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["valid"], rep["errors"]
    assert (rep["plan"]["pp_layout"], rep["plan"]["vpp"]) == (V3_H100, vpp)


def test_a_layout_of_the_wrong_layer_count_is_invalid_with_the_reason(capsys):
    layout = "E|(tt|)*30mL"  # 60 layers on 32 stages: ranks of 6, 8, ..., 8, 6
    code = plan_cli.main(
        ["--model", "deepseek-v3", "--nodes", "128", "--dp", "64", "--tp", "2", "--sp"]
        + ["--pp", "8", "--ep", "64", "--pp-layout", layout, "--global-batch", "8192", "--json"]
    )
    rep = json.loads(capsys.readouterr().out)
    assert code != 0 and not rep["valid"]
    assert f"pipeline layout {layout!r} holds 60 transformer layers (t), the model 61" in rep["errors"]


def test_without_a_layout_the_flag_paths_divisibility_rule_stays():
    model = MODELS["deepseek-v3"]
    plan = Plan(
        dp=64,
        tp=2,
        sp=True,
        pp=8,
        vpp=4,
        ep=64,
        zero=1,
        recompute="full",
        global_batch=8192,
        first_stage_layers=7,
        last_stage_layers=6,
    )
    errors = check(plan, model, CLUSTERS["dgx-h100"].with_nodes(128)).errors
    assert any("not divisible by vpp" in e for e in errors)
    with_layout = dataclasses.replace(plan, pp_layout=V3_H100)
    assert not [e for e in check(with_layout, model, CLUSTERS["dgx-h100"].with_nodes(128)).errors]


def test_import_export_import_gives_the_same_plan():
    first = import_text(v3_script(8, 64), "v3.sh")
    text, notes = megatron_script(first.plan, first.model)
    assert f"--pipeline-model-parallel-layout '{V3_H100}'" in text and "--mtp-num-layers 1" in text
    assert "--decoder-first-pipeline-num-layers" not in text and "--num-virtual-stages-per-pipeline-rank" not in text
    back = import_text(text, "back.sh")
    assert (back.plan, back.model) == (first.plan, first.model) and notes == []
    assert "module_fqns_per_model_part" in " ".join(torchtitan_toml(first.plan, first.model)[1])


@pytest.mark.parametrize(
    "chunks,pp,microbatches,peak",
    [
        # rank 0 of V3_H100 at pp 8: 2(p - 1) + (v - 1)p + 1 = 39 forwards in flight, chunk 0 for
        # forwards 0-7 and 32-38 (15 x 1 layer), chunks 1-3 for 8 each (2 layers): 15 + 48 = 63
        ((1, 2, 2, 2), 8, 128, 63),
        # rank 7: 24 warm-up forwards hold 8 x 2 x 3 = 48; the steady state's first 8 forwards and
        # backwards are of the empty chunk 3, then a forward of chunk 0 (2 layers) runs before the
        # backward of chunk 2 frees 2: 50
        ((2, 2, 2, 0), 8, 128, 50),
        ((2, 2, 2, 2), 8, 128, 50),  # equal chunks: inflight (25) x the chunk, the mean's formula
        ((1, 2, 2, 2), 8, 8, 56),  # m = p: every forward before the first backward: 8 x 7
        ((3,), 4, 16, 12),  # 1F1B, no interleaving: p - stage (= 4 on rank 0) microbatches of 3 layers
    ],
)
def test_a_layouts_activation_peak_walks_the_interleaved_schedule(chunks, pp, microbatches, peak):
    rank = 7 if chunks[-1] == 0 or chunks == (2, 2, 2, 2) else 0
    plan = Plan(pp=pp, vpp=len(chunks), global_batch=microbatches)
    assert layout_peak_layers(chunks, pp, int(inflight_chunks(plan, rank)), microbatches) == peak


def test_equal_chunks_cost_the_same_with_or_without_a_layout():
    model = MODELS["llama3-70b"]
    plan = Plan(dp=4, tp=4, pp=4, vpp=2, sp=True, global_batch=256)
    layout = Plan(dp=4, tp=4, pp=4, sp=True, global_batch=256, pp_layout="E(t*10|)*7t*10L")
    assert layout.vpp == 2 and layout.first_stage_layers is None
    assert memory_per_stage(model, layout) == memory_per_stage(model, plan)
    # DeepSeek-V3's layout: the first rank's activations are those of its 63 layer-microbatches
    v3 = Plan(dp=64, tp=2, sp=True, pp=8, ep=64, global_batch=8192, recompute="full", pp_layout=V3_H100)
    assert inflight_layers(MODELS["deepseek-v3"], v3, 0) == 63
    assert inflight_layers(MODELS["deepseek-v3"], dataclasses.replace(v3, pp_layout=""), 0) == 7 / 4 * 39


def test_the_search_drops_a_base_plans_layout():
    base = Plan(pp=8, pp_layout=V3_H100, recompute="full")
    c = Constraints(base=base, max_pp=8, zero=(1,), recompute=("full",))
    assert c.base.pp_layout == "" and (c.base.first_stage_layers, c.base.vpp) == (7, 4)
    result = search(MODELS["deepseek-v3"], CLUSTERS["dgx-h100"].with_nodes(128), 8192, c)
    assert len(result.table) and all(not p.pp_layout for p in result.plans()[:20])
