"""Fine-grained activation offloading (Megatron-core's --fine-grained-activation-offloading
--offload-modules): the bytes each module sends to host memory, the memory per GPU without them, the
host-link copy time left exposed, and the Megatron-LM importer's and exporters' reading of the flags."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from parallel.core.compute import layer_cost
from parallel.core.devices import DEVICES, NVLINK_C2C, PCIE_GEN5, cluster_device
from parallel.core.memory import (
    activation_bytes_per_layer,
    activation_bytes_per_stage,
    activation_components_bytes,
    inflight_chunks,
    memory_per_gpu_bytes,
    offloaded_bytes_per_layer,
    routed_rows,
)
from parallel.core.perf import PerfOptions, step_time
from parallel.core.plan import OFFLOAD_MODULES, Plan, plan_from_values
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.importers import ImportFailed, import_text
from parallel.importers.export import megatron_script, torchtitan_toml

sys.path.insert(0, str(Path(__file__).parent))
from test_moe_models import V3_LAUNCH  # noqa: E402
from test_plan_schema import DOORS  # noqa: E402

V3, LLAMA = MODELS["deepseek-v3"], MODELS["llama3-8b"]
A = 2
V3_PLAN = Plan(dp=8, tp=2, pp=4, ep=8, sp=True, zero=1, global_batch=64, recompute="selective")
LLAMA_PLAN = Plan(dp=2, tp=4, pp=2, sp=True, global_batch=64)


def off(model, plan, modules):
    return offloaded_bytes_per_layer(model, dataclasses.replace(plan, offload_modules=modules))


def test_the_field_has_one_spelling_and_megatron_cores_checks():
    assert Plan(offload_modules="attn_proj core_attn").offload_modules == "core_attn+attn_proj"
    assert (
        Plan(offload_modules="").label() == "DP1"
        and "offload[expert_fc1]" in Plan(offload_modules="expert_fc1").label()
    )
    with pytest.raises(SpecError, match="attn_proj needs core_attn"):
        plan_from_values({"offload_modules": "attn_proj"})
    with pytest.raises(SpecError, match="'fused_group_mlp' unknown"):
        plan_from_values({"offload_modules": "fused_group_mlp"})
    plan = dataclasses.replace(LLAMA_PLAN, offload_modules="qkv_linear+core_attn+attn_proj")
    for door in DOORS:
        assert door(plan) == plan, door.__name__


def test_each_module_offloads_what_its_region_saves():
    b, s, t, r, h = 1, V3.seq_len, 2, 1 / 2, V3.hidden
    parts = activation_components_bytes(V3, V3_PLAN)
    got = off(V3, V3_PLAN, "+".join(OFFLOAD_MODULES))
    assert got["attn_norm"] == pytest.approx(A * b * s * h * r)  # MLA's input norm is a module
    assert got["mlp_norm"] == pytest.approx(A * b * s * h * r * V3.moe_share)  # MoE layers' pre-MLP norm
    assert got["qkv_linear"] == parts["attention.qkv_input"]
    assert got["attn_proj"] == parts["attention.proj_input"]
    core = ("qk", "v", "scores", "dropout_mask", "dropout_output", "softmax_stats")
    assert got["core_attn"] == pytest.approx(sum(parts[f"attention.{k}"] for k in core))
    routed = routed_rows(V3, V3_PLAN)
    assert got["expert_fc1"] == pytest.approx(V3.moe_share * A * routed * h)
    assert got["moe_act"] == pytest.approx(V3.moe_share * 2 * A * routed * V3.expert_width / t)
    # a dense GQA layer: no norm modules of their own; the fused QKV linear saves the norm's input too
    dense = off(LLAMA, LLAMA_PLAN, "attn_norm+mlp_norm+qkv_linear+expert_fc1")
    assert (dense["attn_norm"], dense["mlp_norm"], dense["expert_fc1"]) == (0, 0, 0)
    ln_out = activation_components_bytes(LLAMA, LLAMA_PLAN)["attention.qkv_input"]
    assert dense["qkv_linear"] == pytest.approx(ln_out + A * LLAMA.seq_len * LLAMA.hidden / 4)


def test_what_recomputation_no_longer_saves_is_not_offloaded():
    plan = dataclasses.replace(V3_PLAN, recompute_modules="mla_up_proj+moe")
    got = off(V3, plan, "core_attn+expert_fc1+moe_act")
    assert got["expert_fc1"] == got["moe_act"] == 0
    parts = activation_components_bytes(V3, plan)
    assert got["core_attn"] == pytest.approx(parts["attention.softmax_stats"])  # Q, K, V are recomputed
    assert (
        offloaded_bytes_per_layer(
            V3,
            dataclasses.replace(LLAMA_PLAN, recompute="full"),
        )
        == {}
    )
    full = off(LLAMA, dataclasses.replace(LLAMA_PLAN, recompute="full"), "qkv_linear+core_attn")
    assert full == {"qkv_linear": 0.0, "core_attn": 0}


@pytest.mark.parametrize("modules", ["core_attn+attn_proj", "expert_fc1+moe_act", "attn_norm+qkv_linear+mlp_norm"])
def test_memory_falls_by_the_offloaded_bytes_of_all_but_one_layer(modules):
    plan = dataclasses.replace(V3_PLAN, offload_modules=modules)
    layers = V3.layers / plan.pp  # stage 1: a middle stage, even split
    per_layer = sum(off(V3, V3_PLAN, modules).values())
    chunks = inflight_chunks(plan, 1)
    drop = activation_bytes_per_stage(V3, V3_PLAN, 1) - activation_bytes_per_stage(V3, plan, 1)
    assert drop == pytest.approx(per_layer * (layers * chunks - 1))
    assert activation_bytes_per_layer(V3, plan) == activation_bytes_per_layer(V3, V3_PLAN)  # what is saved
    assert memory_per_gpu_bytes(V3, plan)["total"] < memory_per_gpu_bytes(V3, V3_PLAN)["total"]


def test_host_links_are_per_device_properties():
    assert DEVICES["h100-sxm"].host_link == PCIE_GEN5 == pytest.approx(55e9)
    assert DEVICES["gb200"].host_link == NVLINK_C2C == 450e9
    assert DEVICES["a100-sxm-80gb"].host_link == pytest.approx(PCIE_GEN5 / 2)


def test_only_the_copy_one_layers_compute_cannot_hide_is_exposed():
    cluster = CLUSTERS["dgx-h100"].with_nodes(8)
    dev = cluster_device(cluster)
    plan = dataclasses.replace(V3_PLAN, offload_modules="core_attn+attn_proj+expert_fc1+moe_act")
    cost = layer_cost(V3, plan, dev)
    copy = sum(offloaded_bytes_per_layer(V3, plan).values()) / dev.host_link
    per_layer = max(copy - cost.fwd, 0) + max(copy - cost.bwd, 0)
    assert per_layer > 0  # PCIe: the forward copy outlasts the layer's forward
    got = step_time(V3, plan, cluster)
    base = step_time(V3, V3_PLAN, cluster)
    layers = V3.layers / plan.pp  # even split: the slowest stage holds layers / pp
    assert got["offload_exposed_s"] == pytest.approx(plan.microbatches * layers * per_layer)
    assert got["step_time_s"] > base["step_time_s"] and base["offload_exposed_s"] == 0
    # NVLink-C2C (GB200) moves the same bytes 8x faster: nothing exposed; the flat model prices none
    gb = CLUSTERS["gb200-nvl72"].with_nodes(64)
    assert step_time(V3, plan, gb)["offload_exposed_s"] == 0
    assert step_time(V3, plan, cluster, PerfOptions(mfu=0.4))["offload_exposed_s"] == 0


V3_SCRIPT = V3_LAUNCH + "--moe-layer-freq '([0]*3+[1]*58)' --moe-grouped-gemm "


def test_the_importer_reads_the_flags_as_megatron_core_does():
    imp = import_text(
        V3_SCRIPT + "--fine-grained-activation-offloading --offload-modules expert_fc1 core_attn attn_proj"
    )
    assert imp.plan.offload_modules == "core_attn+attn_proj+expert_fc1"
    alone = import_text(V3_SCRIPT + "--offload-modules core_attn")
    assert alone.plan.offload_modules == "none" and any("nothing offloaded" in n for n in alone.notes)


@pytest.mark.parametrize(
    "extra,message",
    [
        ("--fine-grained-activation-offloading", "needs --offload-modules"),
        ("--fine-grained-activation-offloading --offload-modules attn_proj", "attn_proj needs core_attn"),
        ("--fine-grained-activation-offloading --offload-modules fused_group_mlp", "op fuser, not modelled"),
        ("--fine-grained-activation-offloading --offload-modules bogus", "bogus unknown"),
        (
            "--transformer-impl local --fine-grained-activation-offloading --offload-modules core_attn",
            "transformer_engine",
        ),
    ],
)
def test_the_importer_refuses_what_megatron_core_refuses(extra, message):
    with pytest.raises(ImportFailed, match=message):
        import_text(V3_SCRIPT + extra)


def test_the_exporters_write_the_modules_or_say_they_cannot():
    plan = dataclasses.replace(V3_PLAN, offload_modules="core_attn+attn_proj+expert_fc1")
    text, notes = megatron_script(plan, V3)
    assert "--fine-grained-activation-offloading" in text and "--offload-modules core_attn attn_proj expert_fc1" in text
    assert notes == [] and import_text(text, "pretrain.sh").plan.offload_modules == plan.offload_modules
    _, notes = torchtitan_toml(plan, V3)
    assert any("torchtitan has no fine-grained offloading" in n for n in notes)
