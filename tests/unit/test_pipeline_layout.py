"""Megatron-core's --pipeline-model-parallel-layout: its grammar (pipeline_parallel_layer_layout.py),
the layers each pipeline rank holds, and the plan fields a Megatron-LM launch script's layout becomes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from parallel.core.pipeline_layout import MAX_LAYOUT_CHARS, LayoutError, parse_layout, plan_split, unroll
from parallel.importers import ImportFailed, import_text

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
