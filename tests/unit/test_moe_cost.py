"""The MoE cost model against the rules and numbers Megatron-core's code gives: the dispatchers'
volumes (token_dispatcher.py), capacity (moe_utils.get_capacity), DeepEP's once-per-domain sends and
node-limited routing (DeepSeek-V3 report Sec. 3.2.2), the EP overlap's schedule
(model_chunk_schedule_plan.py) and its asserts (transformer_config.py), grouped GEMMs; the MoE
plan fields through every entry point; and the importers' reading of each MoE flag."""

import argparse
import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

import parallel.search.space as S
from parallel.cli.args import add_plan_args, plan_from_args
from parallel.cli.plan import main
from parallel.core.comm import comm_per_step, flex_inter_share
from parallel.core.compute import expert_gemms, gemm_efficiency, layer_cost
from parallel.core.devices import cluster_device
from parallel.core.memory import memory_per_gpu_bytes, routed_copies, routed_rows
from parallel.core.perf import FLEX_DISPATCH_SMS, step_time
from parallel.core.plan import Plan, plan_from_values
from parallel.core.report import plan_report
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.core.validate import check
from parallel.importers import ImportFailed, import_text
from parallel.importers.export import megatron_script, torchtitan_toml
from parallel.search.space import Constraints, expert_layouts, search

V3, MIXTRAL = MODELS["deepseek-v3"], MODELS["mixtral-8x7b"]
H100 = CLUSTERS["dgx-h100"]


def ep_rows(model, plan, cluster, collective=None):
    return [
        r
        for r in comm_per_step(model, plan, cluster)
        if r["dim"] == "ep" and (collective is None or r["collective"] == collective)
    ]


# ---------------------------------------------------------------- dispatch volumes and tiers


@pytest.mark.parametrize(
    "n, per_domain, groups, group_topk, domains_reached",
    [
        (64, 8, 0, 0, 8 * (1 - (7 / 8) ** 8)),  # EP64 on 8 DGX nodes: 5.25 of 8 nodes a token
        (64, 8, 8, 4, 4 * (1 - (3 / 4) ** 8)),  # DeepSeek-V3: 8 groups = 8 nodes, top-4: 3.6 nodes
        (256, 8, 8, 4, 4 * 4 * (1 - (1 - 1 / 16) ** 8)),  # a group spans 4 nodes: at most 16 of 32
        (64, 64, 8, 4, 1.0),  # one domain: every copy reaches it
    ],
)
def test_flex_sends_a_token_once_per_domain_it_reaches(n, per_domain, groups, group_topk, domains_reached):
    share = flex_inter_share(8, n, per_domain, groups, group_topk)
    assert float(share) == pytest.approx(domains_reached / 8)


def test_deepseek_v3_node_limited_flex_dispatch_sends_45_percent_of_the_all_to_all_across_nodes():
    plan = Plan(dp=128, pp=16, ep=64, zero=1, global_batch=15360, first_stage_layers=2, last_stage_layers=3)
    free = {k: dataclasses.replace(getattr(H100, k), latency_s=0.0) for k in ("intra", "inter")}  # bytes alone
    cluster = dataclasses.replace(H100.with_nodes(256), **free)
    a2a = ep_rows(V3, plan, cluster, "all_to_all")
    flex = ep_rows(V3, dataclasses.replace(plan, moe_dispatcher="flex"), cluster, "all_to_all")
    assert a2a[0]["link"] == flex[0]["link"] == "inter"
    assert a2a[0]["bytes_per_call"] == flex[0]["bytes_per_call"]  # the same copies leave the rank ...
    ratio = flex[0]["seconds"] / a2a[0]["seconds"]  # ... but a node receives each token once
    assert ratio == pytest.approx(4 * (1 - 0.75**8) / 8, rel=1e-9)
    ungrouped = dataclasses.replace(V3, router_groups=0, router_group_topk=0)
    flex_free = ep_rows(ungrouped, dataclasses.replace(plan, moe_dispatcher="flex"), cluster, "all_to_all")
    assert flex_free[0]["seconds"] > flex[0]["seconds"]  # node-limited routing bounds the nodes reached


def test_inside_one_nvlink_domain_flex_costs_what_the_all_to_all_does():
    # GB200 NVL72: EP64 of 64 consecutive ranks in a 72-GPU domain (a job placed 16 trays a rack)
    nvl = dataclasses.replace(CLUSTERS["gb200-nvl72"], nodes=16, nvlink_domain=64)
    plan = Plan(dp=64, ep=64, zero=1, global_batch=64)
    a2a, flex = (
        ep_rows(V3, dataclasses.replace(plan, moe_dispatcher=d), nvl, "all_to_all") for d in ("alltoall", "flex")
    )
    assert a2a[0]["link"] == "intra" and a2a[0]["seconds"] == pytest.approx(flex[0]["seconds"])


def test_alltoall_moves_top_k_copies_of_the_ranks_own_tokens_and_gathers_them_over_etp():
    # token_dispatcher.py: all_to_all over the EP group, then gather_from_sequence_parallel_region on
    # the expert-TP group; tokens on a rank are its s/tp sequence shard (SP)
    plan = Plan(dp=8, tp=2, sp=True, ep=4, global_batch=8, micro_batch=1)
    cluster = H100.with_nodes(2)
    tokens = MIXTRAL.seq_len // 2
    copy_bytes = tokens * MIXTRAL.top_k * MIXTRAL.hidden * 2
    a2a = ep_rows(MIXTRAL, plan, cluster, "all_to_all")[0]
    assert a2a["bytes_per_call"] == copy_bytes and a2a["calls"] == 4 * MIXTRAL.moe_layers * plan.microbatches
    gathers = [r for r in ep_rows(MIXTRAL, plan, cluster) if r["what"] == "ETP"]
    assert {r["collective"] for r in gathers} == {"all_gather", "reduce_scatter"}
    assert all(r["bytes_per_call"] == 2 * copy_bytes for r in gathers)  # gathered over etp = tp = 2
    assert not [r for r in ep_rows(MIXTRAL, dataclasses.replace(plan, etp=1, ep=8), cluster) if r["what"] == "ETP"]


def test_allgather_dispatcher_gathers_every_token_over_etp_times_ep():
    # MoEAllGatherTokenDispatcher: [(S/TP)*B, H] -> [S*B*EP, H] over the tp_ep group, reduce-scattered back
    plan = Plan(dp=8, tp=2, sp=True, ep=4, global_batch=8, moe_dispatcher="allgather")
    rows = ep_rows(MIXTRAL, plan, H100.with_nodes(2))
    assert {r["collective"] for r in rows} == {"all_gather", "reduce_scatter"}
    assert all(r["bytes_per_call"] == MIXTRAL.seq_len * 4 * MIXTRAL.hidden * 2 for r in rows)
    assert all(r["calls"] == 2 * MIXTRAL.moe_layers for r in rows)  # forward and backward, one microbatch


@pytest.mark.parametrize(
    "capacity, pad, expected",
    [
        (None, False, 4096 * 2),  # dropless: top_k copies a token
        (1.25, True, math.ceil(4096 * 2 / 8 * 1.25) * 8),  # padded: get_capacity x experts
        (1.25, False, 4096 * 2),  # balanced routing drops nothing above a factor of 1
        (0.5, False, math.ceil(4096 * 2 / 8 * 0.5) * 8),  # below it the excess is dropped
    ],
)
def test_capacity_follows_megatron_get_capacity(capacity, pad, expected):
    plan = Plan(dp=8, ep=8, global_batch=8, capacity_factor=capacity, capacity_pad=pad)
    assert routed_copies(MIXTRAL, plan) == expected and routed_rows(MIXTRAL, plan) == expected
    a2a = ep_rows(MIXTRAL, plan, H100.with_nodes(1), "all_to_all")[0]
    assert a2a["bytes_per_call"] == expected * MIXTRAL.hidden * 2


# ---------------------------------------------------------------- grouped GEMMs


def test_grouped_gemm_runs_each_experts_rows_in_whole_tiles_and_sequential_experts_cost_more():
    plan = Plan(dp=64, ep=64, global_batch=64)
    fc1, _ = expert_gemms(V3, plan)
    assert fc1.count == 4 and fc1.m == pytest.approx(64 * 4096 * 8 / 256)  # 4 local experts, 64 ranks' tokens
    fc1, _ = expert_gemms(V3, dataclasses.replace(plan, ep=1))
    assert fc1.count == 256 and fc1.m == pytest.approx(4096 * 8 / 256)  # 128 rows an expert at ep 1
    dev = cluster_device(H100)
    small, large = gemm_efficiency(dev, 32, 4096, 7168), gemm_efficiency(dev, 4096, 4096, 7168)
    assert small < 0.5 * large  # 32 tokens an expert fill a quarter of a 128-row tile
    grouped = layer_cost(V3, plan, dev)
    sequential = layer_cost(V3, dataclasses.replace(plan, grouped_gemm=False), dev)
    assert sequential.gemm_fwd > grouped.gemm_fwd and sequential.gemm_bwd > grouped.gemm_bwd


# ---------------------------------------------------------------- EP overlap


def ep_split(model, plan, cluster):
    t = step_time(model, plan, cluster)
    return float(t["exposed_ep_s"]), float(t["hidden_ep_s"])


def test_ep_overlap_hides_dispatch_behind_the_other_microbatch_but_not_the_unpaired_ones():
    cluster = H100.with_nodes(256)
    plan = Plan(dp=2048, ep=64, zero=1, global_batch=16384)  # one stage: the same slowest stage throughout
    plain = ep_split(V3, plan, cluster)
    assert plain[1] == 0
    overlapped = ep_split(V3, dataclasses.replace(plan, ep_overlap=True, moe_dispatcher="flex"), cluster)
    flex = ep_split(V3, dataclasses.replace(plan, moe_dispatcher="flex"), cluster)
    assert overlapped[0] < flex[0] and overlapped[0] + overlapped[1] == pytest.approx(flex[0])
    delayed = ep_split(V3, dataclasses.replace(plan, ep_overlap=True, delay_wgrad=True, moe_dispatcher="flex"), cluster)
    assert delayed[0] <= overlapped[0]


@pytest.mark.parametrize("m", [1, 4])
def test_ep_overlap_pairs_all_but_the_first_forward_and_last_backward_without_a_pipeline(m):
    # fast NVLink EP and long compute: every paired transfer hides, the unpaired 1/m stays exposed
    cluster = H100.with_nodes(1)
    plan = Plan(dp=8, ep=8, micro_batch=4, global_batch=32 * m)
    total = ep_split(MIXTRAL, plan, cluster)[0]
    exposed, hidden = ep_split(MIXTRAL, dataclasses.replace(plan, ep_overlap=True), cluster)
    assert exposed == pytest.approx(total / m) and hidden == pytest.approx(total - total / m)


def test_an_overlapped_flex_dispatch_still_costs_the_sms_it_holds():
    # every transfer fits its window, but DeepEP's 20 SMs are the window's for as long as it runs
    cluster = H100.with_nodes(1)
    plan = Plan(dp=8, ep=8, micro_batch=4, global_batch=128, moe_dispatcher="flex")
    total = ep_split(MIXTRAL, plan, cluster)[0]
    exposed, hidden = ep_split(MIXTRAL, dataclasses.replace(plan, ep_overlap=True), cluster)
    paired = total * 3 / 4  # of 4 microbatches the first forward and last backward run alone
    share = FLEX_DISPATCH_SMS / cluster_device(cluster).sms
    assert share == pytest.approx(20 / 132)
    assert exposed == pytest.approx(total / 4 + paired * share) and hidden == pytest.approx(paired * (1 - share))


def test_ep_overlap_is_refused_where_megatron_core_asserts():
    cluster = H100.with_nodes(2)

    def errors(**kw):
        plan = Plan(**{"dp": 16, "ep": 8, "global_batch": 64, "ep_overlap": True, **kw})
        return " ".join(check(plan, MIXTRAL, cluster).errors)

    assert "EP overlap" not in errors()
    assert "ep > 1" in errors(ep=1)
    assert "alltoall or flex" in errors(moe_dispatcher="allgather")
    assert "no full recompute" in errors(recompute="full")
    assert "vpp > 1 when pp > 1" in errors(dp=8, pp=2)
    assert "pad" in " ".join(
        check(
            Plan(dp=16, ep=8, global_batch=64, moe_dispatcher="flex", capacity_factor=1.0, capacity_pad=True),
            MIXTRAL,
            cluster,
        ).errors
    )


# ---------------------------------------------------------------- the plan fields


@pytest.mark.parametrize(
    "degrees, shown",
    [
        (dict(dp=8, tp=2, pp=4, sp=True), True),  # EP 1, the experts' TP 2: the allgather dispatcher's group
        (dict(dp=8, tp=2, pp=4, sp=True, ep=8), True),
        (dict(dp=16, tp=2, pp=2, sp=True, ep=4, etp=1), True),
        (dict(dp=16, tp=1, pp=4), False),  # no group to dispatch over: the dispatcher changes nothing
    ],
)
def test_the_label_names_the_dispatcher_wherever_it_changes_the_step(degrees, shown):
    """Two plans whose step times differ never share a label: the dispatcher works over ETP x EP."""
    cluster = CLUSTERS["dgx-h100"].with_nodes(8)
    plans = [Plan(**degrees, global_batch=256, moe_dispatcher=d) for d in ("alltoall", "allgather")]
    steps = [step_time(MIXTRAL, p, cluster)["step_time_s"] for p in plans]
    assert (steps[0] != pytest.approx(steps[1], rel=1e-9)) == shown
    assert ("disp-allgather" in plans[1].label()) == shown
    assert plans[0].label() != plans[1].label() if shown else plans[0].label() == plans[1].label()


def test_moe_fields_through_urls_flags_and_json():
    plan = plan_from_values({"ep": "8", "dp": "8", "disp": "flex", "cap": "1.25", "pad": "1", "epo": "1"}, "url")
    assert (plan.moe_dispatcher, plan.capacity_factor, plan.capacity_pad, plan.ep_overlap) == ("flex", 1.25, True, True)
    assert plan.label() == "DP8 EP8 disp-flex cap1.25-pad ovl:ep"
    assert Plan.from_dict(plan.to_dict()) == plan
    for bad, message in (({"cap": "-1"}, "must be a number above 0"), ({"cap": "x"}, "must be a number")):
        with pytest.raises(SpecError, match=message):
            plan_from_values(bad, "url")
    with pytest.raises(SpecError, match="capacity_pad needs a capacity_factor"):
        Plan(capacity_pad=True)
    parser = argparse.ArgumentParser()
    add_plan_args(parser)
    args = parser.parse_args(["--capacity-factor", "2", "--moe-dispatcher", "allgather", "--no-grouped-gemm"])
    got = plan_from_args(args)
    assert (got.capacity_factor, got.moe_dispatcher, got.grouped_gemm) == (2.0, "allgather", False)


def test_router_groups_are_checked_as_megatron_core_checks_them():
    assert (V3.router_groups, V3.router_group_topk) == (8, 4)
    with pytest.raises(SpecError, match="must divide the 256 experts"):
        dataclasses.replace(V3, router_groups=7)
    with pytest.raises(SpecError, match="hold top_k 8"):
        dataclasses.replace(V3, router_groups=128, router_group_topk=2)  # 2 groups of 2 experts: 4 < top-8
    with pytest.raises(SpecError, match="must be 1 to the 8 groups"):
        dataclasses.replace(V3, router_group_topk=9)


# ---------------------------------------------------------------- importers


LAUNCH = (
    "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
    "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
    "--seq-length 4096 --swiglu --untie-embeddings-and-output-weights --bf16 --vocab-size 32000 "
    "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 "
)


@pytest.mark.parametrize(
    "flags, field, value",
    [
        ("", "moe_dispatcher", "allgather"),  # Megatron-core's default dispatcher
        ("--moe-token-dispatcher-type alltoall", "moe_dispatcher", "alltoall"),
        ("--moe-token-dispatcher-type flex --moe-enable-deepep", "moe_dispatcher", "flex"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "moe_dispatcher", "flex"),
        ("--moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm", "ep_overlap", True),
        ("--delay-wgrad-compute", "delay_wgrad", True),
        ("--moe-expert-capacity-factor 1.5", "capacity_factor", 1.5),
        ("--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity", "capacity_pad", True),
        ("", "grouped_gemm", False),  # without --moe-grouped-gemm: SequentialMLP
        ("--moe-grouped-gemm", "grouped_gemm", True),
    ],
)
def test_megatron_moe_flags_become_plan_fields(flags, field, value):
    imp = import_text(LAUNCH + flags)
    assert getattr(imp.plan, field) == value and imp.unknown == ()


def test_megatron_router_group_flags_become_model_fields():
    imp = import_text(LAUNCH + "--moe-router-num-groups 4 --moe-router-group-topk 2")
    assert (imp.model.router_groups, imp.model.router_group_topk) == (4, 2)


@pytest.mark.parametrize(
    "flags, message",
    [
        ("--moe-token-dispatcher-type a2a", "must be one of allgather, alltoall, flex"),
        ("--moe-enable-deepep", "needs --moe-token-dispatcher-type flex"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend nvshmem", "must be one of deepep"),
        ("--moe-pad-expert-input-to-capacity", "needs --moe-expert-capacity-factor"),
        ("--moe-expert-capacity-factor -1", "must be above 0"),
        ("--moe-router-num-groups 3 --moe-router-group-topk 1", "must divide the 8 experts"),
    ],
)
def test_megatron_moe_flags_refused_as_megatron_core_refuses_them(flags, message):
    with pytest.raises(ImportFailed, match=message):
        import_text(LAUNCH + flags)


def test_torchtitan_expert_parallel_comm_backend_names_the_dispatcher():
    text = (Path(__file__).resolve().parents[1] / "data" / "imports" / "torchtitan_llama4_17bx16e.toml").read_text()
    assert import_text(text, "scout.toml").plan.moe_dispatcher == "alltoall"  # "standard"
    for backend in ("deepep", "hybridep"):
        edited = text.replace(
            "expert_parallel_degree = 1", f'expert_parallel_degree = 1\nexpert_parallel_comm_backend = "{backend}"'
        )
        assert import_text(edited, "scout.toml").plan.moe_dispatcher == "flex"
    bad = text.replace(
        "expert_parallel_degree = 1", 'expert_parallel_degree = 1\nexpert_parallel_comm_backend = "nccl"'
    )
    with pytest.raises(ImportFailed, match="expert_parallel_comm_backend 'nccl' must be one of standard, deepep"):
        import_text(bad, "scout.toml")


def test_search_tries_flex_where_ep_spans_domains_and_etp_one_from_the_tp_ranks():
    rows = expert_layouts(V3, 8, 16, Constraints(), domain=8, world=2048)
    by = {(ep, etp): d for ep, etp, d in rows}
    assert by[(2, 8)] == 2 and by[(1, 8)] == 0  # etp 8 x ep 2 spans two nodes: flex; ep 1: nothing moves
    assert (128, 1) in by and by[(128, 1)] == 2  # ep from dp·cp·tp = 128 when etp is 1
    assert by[(8, 1)] == 0  # 8 consecutive ranks: one node, alltoall
    with_gather = expert_layouts(V3, 1, 64, Constraints(dispatchers=("alltoall", "allgather")), domain=8, world=2048)
    assert {d for ep, _, d in with_gather if ep == 64} == {0, 1}
    assert np.all([ep == 1 for ep, _, _ in expert_layouts(MODELS["llama3-8b"], 8, 16, Constraints())])


def test_a_space_past_the_bound_names_the_limits_that_bring_it_under(monkeypatch):
    cluster = H100.with_nodes(8)
    monkeypatch.setattr(S, "MAX_CANDIDATES", 60_000)
    with pytest.raises(SpecError, match="narrow the search") as err:
        S.search(MIXTRAL, cluster, 512)
    suggested = re.findall(r"--max-(cp|micro-batch) (\d+) \(([\d,]+) plans\)", str(err.value))
    assert suggested
    for name, value, count in suggested:
        limit = {"max_cp" if name == "cp" else "max_micro_batch": int(value)}
        cands, _ = S.candidates(MIXTRAL, cluster.gpus, 512, S.Constraints(**limit), cluster)
        assert len(cands) <= int(count.replace(",", "")) <= 60_000  # counted before the SP and MoE filters


@pytest.mark.parametrize(
    "base",
    [
        Plan(ep_overlap=True, delay_wgrad=True),
        Plan(capacity_factor=1.25, capacity_pad=True, grouped_gemm=False),
    ],
    ids=["ep-overlap", "capacity-padded-sequential"],
)
def test_search_rows_with_the_moe_fields_equal_their_plan_reports(base):
    cluster = H100.with_nodes(4)
    result = search(MIXTRAL, cluster, 256, Constraints(base=base, max_micro_batch=2, max_cp=1))
    table = result.table
    assert len(table) and (table["ep"] > 1).any()
    if base.ep_overlap:  # the rules Megatron-core asserts, as filters
        assert (table["ep"] > 1).all() and (table["moe_dispatcher"] != "allgather").all()
        assert ((table["pp"] == 1) | (table["vpp"] > 1)).all() and (table["recompute"] != "full").all()
    for i in range(0, len(table), max(1, len(table) // 7)):
        plan = result.plan_at(i)
        rep = plan_report(plan, MIXTRAL, cluster)
        assert rep["valid"], rep["errors"]
        assert rep["step_time_s"] == pytest.approx(table["step_time_s"].iloc[i], rel=1e-9)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(dp=64, ep=64, global_batch=64, moe_dispatcher="flex", ep_overlap=True, delay_wgrad=True, zero=1),
        Plan(dp=16, tp=4, sp=True, ep=8, etp=1, global_batch=64, capacity_factor=1.25, capacity_pad=True),
        Plan(dp=8, ep=8, global_batch=8, moe_dispatcher="allgather", grouped_gemm=False),
    ],
    ids=["flex-overlap", "capacity-padded", "allgather-sequential"],
)
def test_the_moe_fields_go_out_as_megatron_flags_and_come_back(plan):
    text, notes = megatron_script(plan, V3, gpus_per_node=8)
    back = import_text(text, "pretrain.sh")
    assert notes == [] and back.unknown == ()
    fields = ("moe_dispatcher", "capacity_factor", "capacity_pad", "grouped_gemm", "ep_overlap", "delay_wgrad", "etp")
    assert {k: getattr(back.plan, k) for k in fields} == {k: getattr(plan, k) for k in fields}
    assert (back.model.router_groups, back.model.router_group_topk) == (8, 4)
    toml, toml_notes = torchtitan_toml(plan, V3)  # what torchtitan cannot run is said, never dropped
    assert ('expert_parallel_comm_backend = "deepep"' in toml) == (plan.moe_dispatcher == "flex")
    unsaid = {"ep_overlap": True, "delay_wgrad": True, "capacity_factor": 1.25, "grouped_gemm": False}
    for name, value in {**unsaid, "moe_dispatcher": "allgather"}.items():
        assert (getattr(plan, name) == value) == any(n.startswith(f"{name} ") for n in toml_notes)


def test_parallel_plan_names_the_exposed_ep_time_in_its_step(capsys):
    argv = "--model mixtral-8x7b --cluster dgx-h100 --nodes 2 --dp 16 --ep 8 --zero 3 --global-batch 64".split()
    assert main(argv) == 0
    step = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("step time"))
    assert "exposed comm (ep " in step


def test_routing_skew_paces_the_layer_by_the_busiest_ep_rank():
    """expert_imbalance 1.5: the busiest EP rank's experts get 1.5x the balanced rows (GEMMs, their
    activations) and 1.5x the dispatched bytes arrive on its link; capped at ep (every copy on one
    rank) and at the capacity factor (each expert drops past it); padded capacity is balanced."""
    model, cluster = MODELS["mixtral-8x7b"], H100.with_nodes(4)
    even = Plan(dp=4, tp=2, pp=4, sp=True, ep=4, global_batch=64)
    skewed = dataclasses.replace(even, expert_imbalance=1.5)
    assert routed_rows(model, skewed) == pytest.approx(1.5 * routed_rows(model, even))
    assert routed_copies(model, skewed) == routed_copies(model, even)  # each rank sends its own share
    a2a = {p: ep_rows(model, p, cluster, "all_to_all") for p in (even, skewed)}
    assert a2a[skewed][0]["bytes_per_call"] == pytest.approx(1.5 * a2a[even][0]["bytes_per_call"])
    (e_fc1, _), (s_fc1, _) = expert_gemms(model, even), expert_gemms(model, skewed)
    assert s_fc1.m == pytest.approx(1.5 * e_fc1.m)
    t_even, t_skew = (step_time(model, p, cluster) for p in (even, skewed))
    assert t_skew["compute_s"] > t_even["compute_s"] and t_skew["step_time_s"] > t_even["step_time_s"]
    mem = {p: memory_per_gpu_bytes(model, p)["activations"] for p in (even, skewed)}
    assert mem[skewed] > mem[even]
    assert routed_rows(model, dataclasses.replace(even, expert_imbalance=9.0)) == pytest.approx(
        4 * routed_rows(model, even)
    )  # at most ep x the share
    capped = dataclasses.replace(skewed, capacity_factor=1.25)
    assert routed_rows(model, capped) == pytest.approx(
        1.25 * routed_rows(model, dataclasses.replace(even, capacity_factor=1.25))
    )
    padded = dataclasses.replace(capped, capacity_pad=True)
    assert routed_rows(model, padded) == routed_rows(model, dataclasses.replace(padded, expert_imbalance=None))
    assert skewed.label().endswith("imb1.5") or " imb1.5" in skewed.label()
    assert Plan(ep=4, expert_imbalance=1.0).expert_imbalance is None  # balanced: one spelling
    with pytest.raises(SpecError, match="at least 1"):
        Plan(expert_imbalance=0.8)


def test_the_plans_dispatch_sms_set_what_an_overlapped_flex_dispatch_holds():
    cluster = H100.with_nodes(1)
    plan = Plan(dp=8, ep=8, micro_batch=4, global_batch=128, moe_dispatcher="flex", ep_overlap=True)
    default = ep_split(MIXTRAL, plan, cluster)
    twenty = ep_split(MIXTRAL, dataclasses.replace(plan, dispatch_sms=FLEX_DISPATCH_SMS), cluster)
    forty = ep_split(MIXTRAL, dataclasses.replace(plan, dispatch_sms=2 * FLEX_DISPATCH_SMS), cluster)
    assert twenty == pytest.approx(default)  # unset is DeepEP's default
    paired = default[1] / (1 - 20 / 132)  # the paired transfers' seconds
    assert forty[0] - default[0] == pytest.approx(paired * 20 / 132)  # 20 more SMs held, as long again
    assert ep_split(MIXTRAL, dataclasses.replace(plan, dispatch_sms=1000), cluster)[1] == pytest.approx(0)
