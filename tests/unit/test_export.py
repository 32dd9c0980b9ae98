"""The exporters: a plan written as a Megatron-LM script or a torchtitan TOML reads back, through the
importers, as the same plan; what a framework cannot express is named in the notes."""

from __future__ import annotations

import dataclasses

import pytest

from parallel.core.plan import PLAN_FIELDS, Plan
from parallel.core.specs import MODELS
from parallel.importers import import_text
from parallel.importers.export import megatron_flags, megatron_script, torchtitan_keys, torchtitan_toml


def resolved(plan: Plan, model) -> Plan:
    """The plan with "the model's" dropout told: Megatron-LM has rates, not a default."""
    return dataclasses.replace(plan, dropout=model.dropout if plan.dropout is None else plan.dropout)


MEGATRON = [
    ("tiny", Plan(dp=2, tp=2, sp=True, global_batch=8)),
    ("tiny-llama", Plan(dp=4, global_batch=8, micro_batch=2, zero=2)),
    (
        "gpt3-175b",
        Plan(
            dp=8, tp=8, pp=8, sp=True, vpp=2, global_batch=1536, zero=1, recompute="selective", grad_reduce_overlap=True
        ),
    ),
    (
        "llama3-8b",
        Plan(
            dp=4,
            tp=2,
            pp=2,
            cp=2,
            cp_kind="ring",
            zero=3,
            global_batch=64,
            micro_batch=2,
            recompute="full",
            recompute_layers=2,
            main_grads="bf16",
            attention="fa2",
            first_stage_layers=15,
            last_stage_layers=17,
            order="tp-cp-ep-pp-dp",
        ),
    ),
    (
        "llama3-70b",
        Plan(dp=2, tp=8, pp=4, sp=True, vpp=5, p2p_overlap=True, tp_overlap=True, global_batch=64, fp8="gemm"),
    ),
    (
        "mixtral-8x7b",
        Plan(
            dp=8,
            tp=2,
            ep=4,
            etp=1,
            global_batch=64,
            param_gather_overlap=True,
            zero=1,
            cp=1,
            exp_avg_dtype="bf16",
            exp_avg_sq_dtype="fp8",
        ),
    ),
    (
        "deepseek-v3",
        Plan(
            dp=8,
            tp=2,
            pp=4,
            sp=True,
            ep=8,
            zero=1,
            global_batch=64,
            recompute="selective",
            recompute_modules="moe_act+layernorm+mla_up_proj",
            last_stage_layers=13,
            moe_dispatcher="flex",
            dispatch_sms=32,
        ),
    ),
]


@pytest.mark.parametrize("name,plan", MEGATRON, ids=[m for m, _ in MEGATRON])
def test_a_megatron_script_reads_back_as_the_same_plan_and_model(name, plan):
    model = MODELS[name]
    text, notes = megatron_script(plan, model, gpus_per_node=8)
    back = import_text(text, "pretrain.sh")
    assert notes == []
    assert back.unknown == (), back.unknown  # every flag written is one the importer reads
    assert back.world_size == plan.world_size
    assert resolved(back.plan, back.model) == resolved(plan, model)
    assert back.model.layers == model.layers and back.model.moe_layer_flags == model.moe_layer_flags


TORCHTITAN = [  # plans torchtitan can run: SP with TP, SDPA without dropout, FSDP2 or DDP (both overlapped)
    Plan(dp=4, global_batch=32, micro_batch=8, zero=3),
    Plan(dp=2, tp=2, pp=2, sp=True, vpp=2, global_batch=16, zero=3),
    Plan(dp=2, tp=4, sp=True, global_batch=8, micro_batch=4, tp_overlap=True, main_grads="bf16"),
    Plan(dp=1, tp=2, pp=4, cp=2, sp=True, cp_kind="ring", global_batch=8, schedule="gpipe", zero=3, recompute="full"),
]


@pytest.mark.parametrize("plan", TORCHTITAN, ids=[p.label() for p in TORCHTITAN])
def test_a_torchtitan_toml_reads_back_as_the_same_plan(plan):
    plan = dataclasses.replace(
        plan, attention="fa2", dropout=False, grad_reduce_overlap=True, param_gather_overlap=True
    )
    text, notes = torchtitan_toml(plan, MODELS["llama3-8b"])
    back = import_text(text, "train.toml")
    assert notes == []
    assert back.unknown == ()
    assert back.plan == plan
    assert back.model.name.startswith("llama3-8b")


@pytest.mark.parametrize(
    "plan,said",
    [
        (Plan(dp=2, pp=2, global_batch=4, schedule="gpipe"), "Megatron-LM runs 1F1B only"),
        (Plan(dp=4, global_batch=4, order="dp-tp-cp-ep-pp"), "rank order dp-tp-cp-ep-pp"),
    ],
)
def test_what_megatron_cannot_run_is_named_in_the_script(plan, said):
    text, notes = megatron_script(plan, MODELS["llama3-8b"])
    assert any(said in n for n in notes) and f"# not expressible in Megatron-LM: {notes[0]}" in text


@pytest.mark.parametrize(
    "plan,said",
    [
        (Plan(dp=4, global_batch=4, zero=1), "ZeRO-1"),
        (Plan(dp=2, tp=2, global_batch=2), "TP without SP"),
        (Plan(dp=2, pp=2, global_batch=4, recompute="selective"), "selective recompute"),
        (Plan(dp=2, cp=2, global_batch=2, cp_kind="ulysses"), "cp kind ulysses"),
    ],
)
def test_what_torchtitan_cannot_run_is_named_in_the_toml(plan, said):
    text, notes = torchtitan_toml(plan, MODELS["llama3-8b"])
    assert any(said in n for n in notes), notes
    assert all(f"# not expressible in torchtitan: {n}" in text for n in notes)


def test_a_model_torchtitan_has_no_flavour_for_is_said_so():
    _, notes = torchtitan_toml(Plan(dp=4, global_batch=4), MODELS["tiny"])
    assert any("no torchtitan model flavour" in n for n in notes)


def test_the_names_written_are_the_schemas_own():
    spec = {s.name: s for s in PLAN_FIELDS}
    assert megatron_flags("tp") == ["--tensor-model-parallel-size"]
    assert all(f in " ".join(spec["zero"].knob.megatron) for f in megatron_flags("zero"))
    assert torchtitan_keys("cp") == ["parallelism.context_parallel_degree"]
    text, _ = megatron_script(Plan(dp=2, tp=2, sp=True, global_batch=2), MODELS["tiny"])
    for name in ("tp", "pp", "cp", "sp", "micro_batch", "global_batch"):
        assert megatron_flags(name)[0] in text
