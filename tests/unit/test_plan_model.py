"""The plan model: Table 2 activations, ZeRO states, rank groups, comm, FLOPs, validation."""

import dataclasses
import json
import math

import numpy as np
import pytest

from parallel.core.comm import CommOptions, collective_seconds, comm_per_step
from parallel.core.memory import (
    COMPONENT_GROUP,
    ActivationOptions,
    activation_bytes_per_layer,
    activation_bytes_per_stage,
    activation_components_bytes,
    inflight_chunks,
    memory_per_gpu_bytes,
    model_state_bytes,
    params_per_stage,
)
from parallel.core.perf import PerfOptions, bubble_fraction, flops_per_step, step_time
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, Cluster, GiB, Link, Model, SpecError
from parallel.core.topology import DIMS, Topology, TopologyError, spanning
from parallel.core.validate import _shape_errors, check, nearest_computable

GPT3 = ["gpt3-22b", "gpt3-175b", "gpt3-530b", "gpt3-1t"]
TABLE2 = ActivationOptions.table2()


def T2(**fields) -> Plan:
    """A plan as Table 2 assumes it: the s x s scores materialised, dropout on."""
    return Plan(attention="unfused", dropout=True, **fields)


# Korthikanti et al. 2022, Table 2, written out as the paper prints it (bytes per layer).
def table2(row, s, b, h, a, t):
    sbh = s * b * h
    return {
        "no parallelism": sbh * (34 + 5 * a * s / h),
        "tp": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp+sp": sbh * (34 / t + 5 * a * s / (h * t)),
        "tp+selective": sbh * (10 + 24 / t),
        "tp+sp+selective": sbh * (34 / t),
        "full": sbh * 2,
    }[row]


ROWS = {
    "no parallelism": dict(tp=1),
    "tp": dict(tp=8),
    "tp+sp": dict(tp=8, sp=True),
    "tp+selective": dict(tp=8, recompute="selective"),
    "tp+sp+selective": dict(tp=8, sp=True, recompute="selective"),
    "full": dict(tp=8, recompute="full"),
}


@pytest.mark.parametrize("preset", GPT3)
@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("b", [1, 4])
def test_table2_activations_per_layer(preset, row, b):
    m = MODELS[preset]
    plan = T2(micro_batch=b, global_batch=b, **ROWS[row])
    got = activation_bytes_per_layer(m, plan, TABLE2)
    want = table2(row, m.seq_len, b, m.hidden, m.heads, plan.tp)
    assert got == pytest.approx(want, rel=1e-12)


def test_table2_175b_known_value():
    # 175B, TP=8, no SP: sbh(10 + 24/8 + 5*96*2048/(12288*8)) = 23 sbh
    m = MODELS["gpt3-175b"]
    assert activation_bytes_per_layer(m, T2(tp=8), TABLE2) == 23 * 2048 * 12288


@pytest.mark.parametrize("t", [2, 4, 8])
def test_sp_shards_the_layernorm_dropout_residual_group_by_tp(t):
    m = MODELS["gpt3-22b"]
    base = activation_components_bytes(m, T2(tp=t), TABLE2)
    sp = activation_components_bytes(m, T2(tp=t, sp=True), TABLE2)
    for name, group in COMPONENT_GROUP.items():
        if name in base and group == "layernorm/dropout/residual" or name in ("attention.qkv_input", "mlp.fc1_input"):
            assert sp[name] * t == pytest.approx(base[name])
        elif name in base:
            assert sp[name] == pytest.approx(base[name])


def test_variants_flash_no_dropout_gqa_cp():
    m = MODELS["gpt3-22b"]
    full = activation_components_bytes(m, T2(tp=8), TABLE2)
    flash = activation_components_bytes(m, Plan(tp=8, dropout=True), TABLE2)
    assert flash["attention.scores"] == flash["attention.dropout_mask"] == flash["attention.dropout_output"] == 0
    assert flash["attention.softmax_stats"] == 4 * m.heads * m.seq_len / 8
    nodrop = activation_components_bytes(m, Plan(tp=8, attention="unfused", dropout=False), TABLE2)
    assert nodrop["attention.dropout_output"] == 0 and nodrop["residual.dropout_masks"] == 0
    assert nodrop["attention.scores"] == full["attention.scores"]
    llama = MODELS["llama3-70b"]  # 64 heads, 8 KV heads: K and V are 1/8 of Q
    c = activation_components_bytes(llama, T2(tp=8), TABLE2)
    s, h = llama.seq_len, llama.hidden
    assert c["attention.v"] == 2 * s * (h // 8) / 8
    # CP=2 with all-gathered K/V: queries are s/2, keys all s
    cp = activation_components_bytes(m, T2(tp=8, cp=2), TABLE2)
    assert cp["attention.scores"] == pytest.approx(full["attention.scores"] / 2)
    assert cp["attention.v"] == full["attention.v"]
    assert cp["attention.proj_input"] == pytest.approx(full["attention.proj_input"] / 2)


@pytest.mark.parametrize("p,v,m", [(4, 1, 8), (8, 1, 64), (4, 2, 8), (8, 3, 64)])
def test_first_stage_holds_korthikanti_layers(p, v, m):
    # Sec. 4.3: the first stage holds L layers' activations (1F1B), L(1 + (p-1)/(pv)) interleaved.
    model = MODELS["gpt3-175b"]
    plan = Plan(pp=p, vpp=v, global_batch=m)
    layers_held = inflight_chunks(plan, 0) * model.layers / (p * v)
    assert layers_held == pytest.approx(model.layers * (1 + (p - 1) / (p * v)) if v > 1 else model.layers)
    assert [inflight_chunks(plan, i) for i in range(p)] == sorted(inflight_chunks(plan, i) for i in range(p))[::-1]


def test_gpipe_holds_all_microbatches_and_few_microbatches_cap_1f1b():
    assert inflight_chunks(Plan(pp=4, global_batch=16, schedule="gpipe"), 3) == 16
    assert inflight_chunks(Plan(pp=4, global_batch=2), 0) == 2


@pytest.mark.parametrize(
    "zero,expect", [(0, (2, 4, 12)), (1, (2, 4, 12 / 8)), (2, (2, 4 / 8, 12 / 8)), (3, (2 / 8, 4 / 8, 12 / 8))]
)
def test_zero_stages_split_model_states(zero, expect):
    """bf16 weights, fp32 main gradients (Megatron-LM's default), 12 bytes of Adam state per parameter."""
    m = MODELS["gpt3-22b"]
    plan = Plan(dp=8, zero=zero, global_batch=8)
    n = params_per_stage(m, plan, 0)
    states = model_state_bytes(m, plan, 0)
    assert (states["params"] / n, states["grads"] / n, states["optimizer"] / n) == pytest.approx(expect)


@pytest.mark.parametrize("m1,m2,k", [("bf16", "bf16", 8), ("fp8", "fp8", 6), ("bf16", "fp32", 10), ("fp16", "fp8", 7)])
def test_the_precision_aware_optimizer_keeps_adams_moments_in_their_dtypes(m1, m2, k):
    """fp32 master weights (4 bytes) plus each moment in its dtype (Megatron-LM's --exp-avg-dtype /
    --exp-avg-sq-dtype under --use-precision-aware-optimizer)."""
    m = MODELS["gpt3-22b"]
    plan = Plan(dp=8, zero=1, global_batch=8, exp_avg_dtype=m1, exp_avg_sq_dtype=m2)
    states = model_state_bytes(m, plan, 0)
    assert states["optimizer"] / params_per_stage(m, plan, 0) == pytest.approx(k / 8)


def test_params_per_stage_sum_to_the_model():
    for name in ("gpt3-175b", "llama3-70b"):
        m = MODELS[name]
        plan = Plan(pp=1)
        assert params_per_stage(m, plan, 0) == pytest.approx(m.params_total())


@pytest.mark.parametrize(
    "name,billions", [("gpt3-175b", 174.6), ("llama3-8b", 8.03), ("llama3-70b", 70.55), ("llama3-405b", 405.85)]
)
def test_parameter_counts_match_published_sizes(name, billions):
    assert MODELS[name].params_total() / 1e9 == pytest.approx(billions, abs=0.05)


# --- topology ---------------------------------------------------------------------------------


def megatron_oracle(world, sizes_by_name, order, dim):
    """Megatron-LM's orthogonal group rule, restated independently: with the axes of `order`
    (fastest first) and their sizes, the groups of `dim` vary the masked axis, every other axis
    fixed; groups are enumerated by the unmasked axes, fastest first."""
    names = order.split("-")
    sizes = [sizes_by_name.get(n, 1) for n in names]
    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    k = names.index(dim)
    others = [i for i in range(len(names)) if i != k]
    groups = []
    for g in range(world // sizes[k]):
        base, rem = 0, g
        for i in others:
            base += (rem % sizes[i]) * strides[i]
            rem //= sizes[i]
        groups.append([base + j * strides[k] for j in range(sizes[k])])
    return groups


CASES = [
    (dict(dp=2, pp=4, cp=1, tp=2), 8),
    (dict(dp=4, pp=2, cp=2, tp=4), 8),
    (dict(dp=8, pp=8, cp=1, tp=8), 8),
    (dict(dp=3, pp=2, cp=2, tp=2), 4),
    (dict(dp=1, pp=16, cp=4, tp=8), 8),
]


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-pp-dp", "tp-cp-dp-pp", "tp-pp-dp-cp"])
@pytest.mark.parametrize("sizes,gpn", CASES)
@pytest.mark.parametrize("dim", ["tp", "cp", "dp", "pp"])
def test_groups_match_megatron_rank_generator(order, sizes, gpn, dim):
    topo = Topology(gpus_per_node=gpn, order=order, **sizes)
    want = megatron_oracle(topo.world_size, sizes, order, dim)
    got = [list(g.ranks) for g in topo.groups(dim)]
    assert sorted(got) == sorted(want)
    # every rank's coordinates round-trip
    for r in range(topo.world_size):
        assert topo.rank_of(**topo.coords_of(r)) == r


def _laid_out(topo: Topology, dims: tuple[str, ...]) -> tuple[bool, int]:
    """Whether a group over `dims` spans NVLink domains and the fewest ranks a spanning one has in a
    domain, by laying out every group of the grid and taking each rank's domain."""
    axes = [DIMS.index(d) for d in dims]
    rest = [i for i in range(4) if i not in axes]
    groups = topo.grid.transpose(rest + axes).reshape(-1, int(np.prod([topo.grid.shape[i] for i in axes])))
    per_group = [set(topo.domain_of(g).tolist()) for g in groups]
    spanning_groups = [len(d) for d in per_group if len(d) > 1]
    n = groups.shape[1]
    return (True, min(n // k for k in spanning_groups)) if spanning_groups else (False, n)


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp", "tp-pp-dp-cp"])
@pytest.mark.parametrize("domain", [1, 3, 4, 8, 12, 72])
def test_spanning_from_strides_matches_every_group_laid_out(order, domain):
    rng = np.random.default_rng(domain)
    for _ in range(12):
        sizes = dict(zip(DIMS, (int(x) for x in rng.choice([1, 2, 3, 4, 6, 8, 16], size=4))))
        topo = Topology(gpus_per_node=8, order=order, nvlink_domain=domain, **sizes)
        for dims in (("tp",), ("pp",), ("cp",), ("dp",), ("dp", "cp"), ("tp", "cp"), ("dp", "pp", "cp", "tp")):
            assert spanning(sizes, order, domain, dims) == _laid_out(topo, dims), (sizes, dims)


def test_issue_example_16_gpus_tp2_dp2_pp4():
    t = Topology(dp=2, pp=4, cp=1, tp=2, gpus_per_node=8)
    assert [g.ranks for g in t.groups("tp")][:3] == [(0, 1), (2, 3), (4, 5)]
    assert [g.ranks for g in t.groups("dp")][:3] == [(0, 2), (1, 3), (4, 6)]
    assert [g.ranks for g in t.groups("pp")][:2] == [(0, 4, 8, 12), (1, 5, 9, 13)]
    assert {g.link for g in t.groups("tp")} == {"intra"} and {g.link for g in t.groups("pp")} == {"inter"}
    assert t.groups("pp")[0].nodes == (0, 1)


def test_picotron_layout_is_arange_view_dp_pp_cp_tp():
    t = Topology(dp=2, pp=2, cp=2, tp=2, gpus_per_node=8, order="tp-cp-pp-dp")
    assert (t.grid == np.arange(16).reshape(2, 2, 2, 2)).all()


@pytest.mark.parametrize("order", ["tp-dp-pp", "tp-tp-cp-dp-pp", "tp-cp-xx-dp-pp", ""])
def test_bad_orders_are_named(order):
    with pytest.raises(TopologyError, match="rank order"):
        Topology(dp=1, pp=1, cp=1, tp=1, gpus_per_node=8, order=order)


def test_4096_gpus_is_fast_enough_for_pages():
    t = Topology(dp=64, pp=8, cp=1, tp=8, gpus_per_node=8)
    assert t.crossing("tp") == 0 and t.crossing("pp") == 512 and len(t.rank_table()) == 4096


# --- communication and time -------------------------------------------------------------------

LINK = Link(100e9, 5e-6)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_formulas(n):
    S = 64 * 2**20
    assert collective_seconds("all_reduce", n, S, LINK) == pytest.approx(
        2 * (n - 1) / n * S / 100e9 + 2 * (n - 1) * 5e-6
    )
    assert collective_seconds("all_gather", n, S, LINK) + collective_seconds(
        "reduce_scatter", n, S, LINK
    ) == pytest.approx(collective_seconds("all_reduce", n, S, LINK))
    assert collective_seconds("send_recv", 2, S, LINK) == pytest.approx(S / 100e9 + 5e-6)


def _by(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def test_sp_moves_the_same_volume_as_tp():
    m, c = MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].with_nodes(1)
    tp = comm_per_step(m, Plan(tp=8, global_batch=4), c)
    sp = comm_per_step(m, Plan(tp=8, sp=True, global_batch=4), c, CommOptions(sp_regather=False))
    (ar,) = _by(tp, dim="tp", scope="layer")
    assert ar["calls"] == 4 * m.layers * 4 and ar["bytes_per_call"] == 2048 * 12288 * 2
    vol_tp = ar["calls"] * ar["bytes_per_call"] * 2  # all-reduce moves 2(n-1)/n S
    vol_sp = sum(r["calls"] * r["bytes_per_call"] for r in _by(sp, dim="sp", scope="layer"))
    assert vol_sp == vol_tp
    layer_s = [sum(r["seconds"] for r in _by(rows, scope="layer")) for rows in (sp, tp)]
    assert layer_s[0] == pytest.approx(layer_s[1])
    # the output layer (last stage, one stage here) likewise: its input-gradient all-reduce moves what its
    # forward all-gather and backward reduce-scatter do; the loss's all-reduces are the same under both
    vol = [
        sum(r["calls"] * r["bytes_per_call"] * (2 if r["collective"] == "all_reduce" else 1) for r in rows)
        for rows in (_by(sp, what="output layer"), _by(tp, what="output layer"))
    ]
    assert vol[0] == vol[1] and _by(sp, what="loss") == _by(tp, what="loss")
    with_regather = comm_per_step(m, Plan(tp=8, sp=True, global_batch=4), c)
    assert [r["overlapped"] for r in _by(with_regather, scope="layer")].count(True) == 1
    assert [r["what"] for r in with_regather if r["overlapped"]] == ["", "output layer"]


def test_groups_across_nodes_use_the_slow_link():
    m = MODELS["gpt3-22b"]
    c = CLUSTERS["dgx-h100"].with_nodes(2)
    rows = comm_per_step(m, Plan(tp=16, global_batch=1), c)
    assert rows[0]["link"] == "inter"
    fast = comm_per_step(m, Plan(tp=8, dp=2, global_batch=2), c)
    assert _by(fast, dim="tp")[0]["link"] == "intra" and _by(fast, dim="dp")[0]["link"] == "inter"


def test_zero_changes_dp_collectives():
    m, c = MODELS["gpt3-22b"], CLUSTERS["dgx-h100"].with_nodes(2)
    ops = {
        z: sorted(
            {
                r["collective"]
                for r in _by(comm_per_step(m, Plan(dp=16, zero=z, global_batch=16), c), dim="dp")
                if r["what"] != "loss"  # the loss's own all-reduce, whatever ZeRO does to gradients
            }
        )
        for z in (0, 1, 3)
    }
    assert ops == {0: ["all_reduce"], 1: ["all_gather", "reduce_scatter"], 3: ["all_gather", "reduce_scatter"]}


@pytest.mark.parametrize("recompute,factor", [("none", 72), ("full", 96)])
def test_flops_match_narayanan_eq3(recompute, factor):
    m = MODELS["gpt3-175b"]
    B, s, L, h, V = 1536, m.seq_len, m.layers, m.hidden, m.vocab
    plan = Plan(dp=8, tp=8, pp=8, global_batch=B, recompute=recompute)
    tail = V / (12 * L * h) if factor == 72 else V / (16 * L * h)
    want = factor * B * s * L * h**2 * (1 + s / (6 * h) + tail)
    # Eq. (3) ignores biases and LayerNorms, so do we: the formula is exact (it counts the whole s x s)
    assert flops_per_step(m, plan, causal=False)["hardware_flops"] == pytest.approx(want, rel=1e-12)


def test_bubble_and_step_time_parts():
    assert bubble_fraction(Plan(pp=8, vpp=2, global_batch=64)) == pytest.approx(7 / 128)
    m, c = MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].with_nodes(64)
    plan = Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536)
    t = step_time(m, plan, c, PerfOptions(mfu=0.5))
    assert t["step_time_s"] == pytest.approx(
        t["compute_s"] + t["bubble_s"] + sum(t[f"exposed_{d}_s"] for d in ("tp", "sp", "cp", "ep", "pp", "dp"))
    )
    assert t["exposed_tp_s"] > 0  # under SP still: the loss's all-reduces over TP
    assert 0 < t["mfu"] < 0.5
    hidden = step_time(m, plan, c, PerfOptions(mfu=0.5, dp_overlap=1.0))
    assert hidden["exposed_dp_s"] == 0 and hidden["step_time_s"] < t["step_time_s"]


# --- validation -------------------------------------------------------------------------------

H100 = CLUSTERS["dgx-h100"]
G175 = MODELS["gpt3-175b"]


@pytest.mark.parametrize(
    "plan,model,nodes,message",
    [
        (dict(dp=8, tp=8, pp=8), G175, 60, "dp×tp×pp×cp = 8×8×8×1 = 512, but the cluster has 60×8 = 480 GPUs"),
        (dict(tp=5, dp=8, pp=2, global_batch=80), MODELS["gpt3-22b"], 10, "heads 64 are not divisible by tp 5"),
        (
            dict(tp=16),
            Model("gqa", layers=8, hidden=6144, heads=48, kv_heads=6, vocab=32000, seq_len=2048),
            2,
            "kv_heads 6 and tp 16: neither divides the other",
        ),
        (dict(pp=5, dp=1, tp=8, global_batch=5), G175, 5, "layers 96 are not divisible by pp×vpp = 5×1 = 5"),
        (dict(pp=8, vpp=5, dp=1, tp=8, global_batch=8), G175, 8, "pp×vpp = 8×5 = 40"),
        (
            dict(tp=8, sp=True, global_batch=1),
            Model("odd", layers=2, hidden=1024, heads=8, vocab=1000, seq_len=2044),
            1,
            "seq_len/cp = 2044/1 = 2044 is not divisible by tp 8",
        ),
        (
            dict(cp=4, tp=2, global_batch=1),
            Model("odd", layers=2, hidden=1024, heads=8, vocab=1000, seq_len=2060),
            1,
            "seq_len 2060 is not divisible by 2×cp = 8",
        ),
        (dict(sp=True, dp=8, global_batch=8), MODELS["gpt3-22b"], 1, "sequence parallelism (sp) needs tp > 1"),
        (
            dict(dp=8, tp=8, pp=8, micro_batch=2, global_batch=100),
            G175,
            64,
            "global_batch 100 is not divisible by dp×micro_batch = 8×2 = 16",
        ),
        (
            dict(dp=8, tp=8, vpp=2, global_batch=64),
            MODELS["gpt3-22b"],
            8,
            "vpp 2 > 1 (interleaved schedule) needs pp > 1",
        ),
        (
            dict(dp=8, tp=8, pp=8, vpp=2, global_batch=8 * 12),
            G175,
            64,
            "microbatches 12 (= global_batch/(dp×micro_batch)) must be divisible by pp 8",
        ),
        (dict(dp=64, tp=8, global_batch=64), G175, 64, "exceeds the GPU's 80.0 GiB"),
    ],
)
def test_every_validation_error_has_its_numbers(plan, model, nodes, message):
    v = check(Plan(**plan), model, H100.with_nodes(nodes))
    assert not v.valid
    assert any(message in e for e in v.errors), v.errors


@pytest.mark.parametrize(
    "plan,nodes,message",
    [
        (dict(tp=16, dp=4, pp=8, global_batch=512), 64, "32 of 32 TP groups cross nodes (tp=16, 8 GPUs per node)"),
        (dict(tp=8, cp=2, dp=4, pp=8, global_batch=512), 64, "CP groups cross nodes"),
        (dict(tp=8, dp=8, pp=8, global_batch=128), 64, "bubble (pp−1)/(vpp·m)"),
        (dict(tp=8, dp=64, pp=8, global_batch=256), 512, "the pipeline never fills"),
    ],
)
def test_layout_warnings(plan, nodes, message):
    v = check(Plan(sp=True, **plan), G175, H100.with_nodes(nodes))
    assert any(message in w for w in v.warnings), v.warnings


def test_a_good_plan_is_valid():
    v = check(Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536), G175, H100.with_nodes(64))
    assert v.valid and v.computable


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(dp=0), "Plan.dp must be a positive integer"),
        (dict(zero=4), "Plan.zero must be one of 0, 1, 2, 3"),
        (dict(recompute="some"), "recompute must be one of"),
        (dict(schedule="zb"), "schedule must be one of"),
        (dict(order="dp-tp"), "rank order"),
    ],
)
def test_plan_rejects_impossible_fields(bad, message):
    with pytest.raises(SpecError, match=message):
        Plan(**bad)


# --- JSON round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        *MODELS.values(),
        *CLUSTERS.values(),
        Plan(
            dp=8,
            tp=8,
            pp=8,
            cp=2,
            sp=True,
            micro_batch=2,
            global_batch=1536,
            vpp=3,
            zero=1,
            recompute="selective",
            order="tp-cp-pp-dp",
            schedule="1f1b",
        ),
    ],
)
def test_json_round_trip(obj):
    again = type(obj).from_dict(json.loads(json.dumps(obj.to_dict())))
    assert again == obj


def test_from_dict_names_unknown_and_missing_fields():
    with pytest.raises(SpecError, match="unknown plan field"):
        Plan.from_dict({"dp": 2, "tensor_parallel": 4})
    with pytest.raises(SpecError, match="Model"):
        Model.from_dict({"name": "x", "layers": 2})
    with pytest.raises(SpecError, match="link bandwidth"):
        Cluster.from_dict({**CLUSTERS["dgx-a100"].to_dict(), "inter": {"bandwidth_bytes_per_s": 0, "latency_s": 0}})


def test_most_loaded_gpu_is_the_max_over_stages():
    m = MODELS["gpt3-175b"]
    plan = Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536, attention="unfused")
    mem = memory_per_gpu_bytes(m, plan)
    assert mem["activations"] == pytest.approx(activation_bytes_per_stage(m, plan, 0))
    assert 60 * GiB < mem["total"] < 80 * GiB
    flash = memory_per_gpu_bytes(m, dataclasses.replace(plan, attention="fused"))  # no s x s scores kept
    assert flash["total"] < mem["total"] - 20 * GiB


def test_nearest_computable_changes_one_field_keeping_the_gpus_first():
    l405 = MODELS["llama3-405b"]
    fixes = nearest_computable(Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536), l405)
    assert [(n, v) for n, v, _ in fixes] == [("pp", 9), ("pp", 7)]  # 126 layers: the divisors around 8
    assert all(not _shape_errors(p, l405) for _, _, p in fixes)
    # a batch one off: the GPU count stays, so the batch is offered before dp
    gpt = MODELS["gpt3-175b"]
    fixes = nearest_computable(Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1537), gpt)
    assert [(n, v) for n, v, _ in fixes][:2] == [("global_batch", 1536), ("global_batch", 1544)]
    assert nearest_computable(Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536), gpt) == []
