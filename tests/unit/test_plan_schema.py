"""One plan, one truth: a plan entered through any door -- command-line flags, a dashboard URL, the
review editor's row, plan JSON, a Megatron-LM script, a torchtitan TOML, a search row -- is the same
Plan with the same report; and every search row, re-planned from its own `plan` object, reproduces
its step time and memory."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from parallel.cli import plan as plan_cli
from parallel.cli.args import plan_from_args
from parallel.core.plan import PLAN_DEFAULTS, PLAN_FIELDS, Plan, plan_from_values, plan_values
from parallel.core.plan_schema import schema_table
from parallel.core.report import plan_report
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.importers import import_text
from parallel.importers.export import megatron_script
from parallel.review.document import NamedPlan
from parallel.review.urls import (
    parse_plan_code,
    plan_code,
    plan_from_params,
    plan_rows_of,
    plan_to_params,
    plans_from_rows,
)
from parallel.search.space import Constraints, result_json, search

MODEL, CLUSTER, NODES = "llama3-70b", "dgx-h100", 8
# Megatron-core's way of running it: SP with TP comm overlap, interleaved 1F1B, the distributed
# optimizer with both DP overlaps, selective recompute, bf16 gradient reduction, no dropout
PLAN = Plan(
    dp=4,
    tp=4,
    pp=4,
    sp=True,
    micro_batch=1,
    global_batch=256,
    vpp=2,
    zero=1,
    recompute="selective",
    main_grads="bf16",
    tp_overlap=True,
    grad_reduce_overlap=True,
    param_gather_overlap=True,
    p2p_overlap=True,
    dropout=False,
)
MEGATRON = """\
torchrun --nnodes 8 --nproc_per_node 8 pretrain_gpt.py \\
  --num-layers 80 --hidden-size 8192 --num-attention-heads 64 --group-query-attention --num-query-groups 8 \\
  --ffn-hidden-size 28672 --swiglu --seq-length 8192 --max-position-embeddings 8192 --normalization RMSNorm \\
  --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear --bf16 \\
  --tokenizer-type HuggingFaceTokenizer --vocab-size 128256 \\
  --attention-dropout 0 --hidden-dropout 0 --transformer-impl transformer_engine \\
  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel \\
  --num-layers-per-virtual-pipeline-stage 10 \\
  --micro-batch-size 1 --global-batch-size 256 --use-distributed-optimizer --grad-reduce-in-bf16 \\
  --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap --recompute-activations
"""


def _flags(plan: Plan) -> list[str]:
    """The plan as `parallel plan` flags, written from the schema: every field that is not the default."""
    out = []
    for spec in PLAN_FIELDS:
        value = getattr(plan, spec.name)
        if value == spec.default and type(value) is type(spec.default):
            continue
        if isinstance(value, bool):
            out.append(spec.knob.flag if value else "--no-" + spec.knob.flag[2:])
        else:
            out += [spec.knob.flag, str(value)]
    return out


def via_flags(plan):
    return plan_from_args(plan_cli.build_parser().parse_args(["--model", MODEL, *_flags(plan)]))


def via_url(plan):
    return plan_from_params(plan_to_params(MODEL, CLUSTER, NODES, plan))[2]


def via_plan_code(plan):
    return parse_plan_code(plan_code(NamedPlan("p", plan))).plan


def via_editor_row(plan):
    plans, errors = plans_from_rows(plan_rows_of((NamedPlan("p", plan),)))
    assert errors == []
    return plans[0].plan


def via_plan_json(plan):
    text = json.dumps({"plan": plan.to_dict(), "model": MODEL, "cluster": CLUSTER, "nodes": NODES})
    return import_text(text, "plan.json").plan


def search_row_plan(plan):
    """The plan of the search row with `plan`'s degrees, the search's shared fields `plan`'s own, as
    its --json row gives it. The GPUs get twice their memory: the plan's even split at vpp 2 needs
    87 GiB of 80, and whether it fits is not what the doors are about."""
    c = Constraints(zero=(plan.zero,), recompute=(plan.recompute,), base=plan, max_pp=plan.pp, headroom=0.0)
    cluster = CLUSTERS[CLUSTER].with_nodes(NODES)
    cluster = dataclasses.replace(cluster, gpu_memory_bytes=2 * cluster.gpu_memory_bytes)
    result = search(MODELS[MODEL], cluster, plan.global_batch, c)
    for row in result_json(result):
        p = Plan.from_dict(row["plan"])
        if (p.dp, p.tp, p.pp, p.vpp, p.sp, p.micro_batch) == (plan.dp, plan.tp, plan.pp, plan.vpp, plan.sp, 1):
            assert row["label"] == p.label()
            return p
    raise AssertionError("the search holds no row of the plan's degrees")


DOORS = [via_flags, via_url, via_plan_code, via_editor_row, via_plan_json]


@pytest.mark.parametrize("door", DOORS, ids=lambda f: f.__name__)
def test_every_door_yields_the_same_plan_and_report(door):
    got = door(PLAN)
    assert got == PLAN
    model, cluster = MODELS[MODEL], CLUSTERS[CLUSTER].with_nodes(NODES)
    assert plan_report(got, model, cluster) == plan_report(PLAN, model, cluster)


def test_a_megatron_script_is_the_same_plan():
    imported = import_text(MEGATRON, "pretrain_llama3_70b.sh")
    assert imported.world_size == 64 and imported.model.layers == 80
    assert imported.plan == PLAN


def test_a_torchtitan_toml_is_the_same_plan_as_its_flags():
    toml = """
[model]
name = "llama3"
flavor = "70B"
[training]
local_batch_size = 2
global_batch_size = 256
seq_len = 8192
mixed_precision_reduce = "bfloat16"
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = 8
tensor_parallel_degree = 8
pipeline_parallel_degree = 1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""
    plan = import_text(toml, "llama3_70b.toml").plan
    assert via_flags(plan) == plan == via_url(plan) == via_editor_row(plan) == via_plan_json(plan)
    assert (plan.attention, plan.dropout, plan.zero, plan.sp) == ("fa2", False, 3, True)  # SDPA, FSDP2, SP norms


def test_a_search_row_is_the_same_plan_through_every_door():
    row = search_row_plan(PLAN)
    # the search's shared fields are the plan's; it explores the degrees and the stage split
    assert dataclasses.replace(row, first_stage_layers=None, last_stage_layers=None) == PLAN
    model, cluster = MODELS[MODEL], CLUSTERS[CLUSTER].with_nodes(NODES)
    for door in DOORS:
        got = door(row)
        assert got == row and plan_report(got, model, cluster) == plan_report(row, model, cluster), door.__name__


SEARCHES = [
    ("llama3-70b", "dgx-h100", 8, 512, {}),
    ("gpt3-175b", "dgx-h100", 64, 1536, {"tp_overlap": True, "grad_reduce_overlap": True}),
    ("mixtral-8x7b", "dgx-a100", 4, 256, {"attention": "fa2", "dropout": False}),
    ("llama3-8b", "dgx-h100", 2, 64, {"param_gather_overlap": True, "p2p_overlap": True, "main_grads": "bf16"}),
]


def test_fifty_search_rows_replanned_from_their_own_plan_are_identical(tmp_path, capsys):
    rng = random.Random(46)
    rows = []
    for model, cluster, nodes, gb, base in SEARCHES:
        result = search(
            MODELS[model], CLUSTERS[cluster].with_nodes(nodes), gb, Constraints(base=plan_from_values(base))
        )
        table = result_json(result)
        rows += [(model, cluster, nodes, row) for row in rng.sample(table, min(13, len(table)))]
    assert len(rows) >= 50
    for i, (model, cluster, nodes, row) in enumerate(rows[:50]):
        assert set(row["plan"]) == set(PLAN_DEFAULTS) and row["label"] == Plan.from_dict(row["plan"]).label()
        path = tmp_path / f"row{i}.json"
        path.write_text(json.dumps({"plan": row["plan"], "model": model, "cluster": cluster}))
        code = plan_cli.main(["--import", str(path), "--nodes", str(nodes), "--json"])
        rep = json.loads(capsys.readouterr().out)
        assert code == 0, rep["errors"]
        assert round(rep["step_time_s"], 3) == round(row["step_time_s"], 3), (row["label"], model)
        total = rep["memory_per_gpu_bytes"]["total"]
        assert round(total / 2**20) == round(row["memory_per_gpu_bytes"] / 2**20), (row["label"], model)


def test_a_field_declared_once_reaches_every_door():
    """Each field has its flag, URL key, editor column and JSON name, and a non-default value of it
    survives every door (so a new field needs nothing but its declaration)."""
    odd = {
        "int": 2,
        "opt_int": 1,
        "bool": True,
        "opt_bool": False,
        "text": "tp-cp-pp-dp",
    }
    for spec in PLAN_FIELDS:
        value = odd.get(spec.kind) if spec.kind != "choice" else spec.knob.choices[-1]
        fields = {spec.name: value}
        if spec.name == "recompute_layers":
            fields["recompute"] = "full"
        try:
            plan = plan_from_values({"dp": 2, "tp": 2, "pp": 2, **fields})
        except SpecError:
            continue  # a value the plan's own rules refuse on this small plan
        for door in DOORS:
            assert door(plan) == plan, (spec.name, door.__name__)
        kept = getattr(plan, spec.name)  # (the plan's one spelling: cp_kind is the default at cp 1)
        assert plan_values(plan, "url", changed_only=True).get(spec.knob.url) == kept or kept == spec.default


def test_the_schema_document_is_the_declarations():
    """docs/plan-schema.md's table is generated from the declarations: a field added, renamed or
    re-defaulted without regenerating it fails here (regenerate: schema_table(PLAN_FIELDS))."""
    doc = (Path(__file__).parents[2] / "docs" / "plan-schema.md").read_text()
    assert schema_table(PLAN_FIELDS) in doc


# A plan whose pipeline layout holds chunks of 9, 10 and 11 layers: ranks of 19, 20, 20, 21 layers
LAYOUT_PLAN = dataclasses.replace(PLAN, vpp=1, pp_layout="Et*9|(t*10|)*6t*11L")


def via_megatron_script(plan):
    text, notes = megatron_script(plan, MODELS[MODEL])
    assert notes == []
    return import_text(text, "launch.sh").plan


@pytest.mark.parametrize("door", [*DOORS, via_megatron_script], ids=lambda f: f.__name__)
def test_a_pipeline_layout_passes_every_door(door):
    assert (LAYOUT_PLAN.vpp, LAYOUT_PLAN.first_stage_layers, LAYOUT_PLAN.last_stage_layers) == (2, 19, 21)
    got = door(LAYOUT_PLAN)
    assert got == LAYOUT_PLAN
    model, cluster = MODELS[MODEL], CLUSTERS[CLUSTER].with_nodes(NODES)
    rep = plan_report(got, model, cluster)
    assert rep == plan_report(LAYOUT_PLAN, model, cluster)
    assert not [e for e in rep["errors"] if not e.startswith("memory per GPU")]  # 21 / vpp 2 not whole: fine


def test_a_search_row_of_a_layout_plan_drops_the_layout():
    """The search explores pp, vpp and the end stages itself: a base plan's layout is dropped (its
    summary kept as the base's fields), every row a plan without one."""
    row = search_row_plan(LAYOUT_PLAN)
    assert row.pp_layout == "" and dataclasses.replace(row, first_stage_layers=None, last_stage_layers=None) == PLAN
