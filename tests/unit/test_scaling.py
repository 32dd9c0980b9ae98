"""parallel.core.scaling: one layer's compute vs TP communication for TP = 1…32, and the node boundary."""

import pytest

from parallel.core.comm import collective_seconds
from parallel.core.perf import PerfOptions
from parallel.core.plan import Plan
from parallel.core.scaling import TP_DEGREES, highlights, invalid_notes, summary_table, tp_scaling
from parallel.core.specs import CLUSTERS, MODELS, Model

H100 = CLUSTERS["dgx-h100"]
GPT175 = MODELS["gpt3-175b"]


def test_rows_cover_tp_1_to_32_with_and_without_sp():
    df = tp_scaling(GPT175, H100)
    assert sorted(df.loc[~df.sp, "tp"]) == list(TP_DEGREES)
    assert sorted(df.loc[df.sp, "tp"]) == [2, 4, 8, 16, 32]  # SP needs a TP group
    assert df["valid"].all()
    base = df[(df.tp == 1) & ~df.sp].iloc[0]
    assert base.speedup == pytest.approx(1.0) and base.tp_comm_s == 0 and base.efficiency == pytest.approx(1.0)


@pytest.mark.parametrize("cluster, inside", [("dgx-h100", (1, 2, 4, 8)), ("local-cpu", (1, 2, 4, 8))])
def test_link_changes_at_the_node_boundary(cluster, inside):
    df = tp_scaling(GPT175, CLUSTERS[cluster])
    valid = df[~df.sp & (df.tp > 1)]
    assert set(valid.loc[valid.tp.isin(inside), "link"]) == {"intra"}
    assert set(valid.loc[~valid.tp.isin(inside), "link"]) == {"inter"}
    # the cliff: TP communication's share jumps when the group leaves the node (a group of 8 ranks a node
    # crosses through the node's 8 NICs at once, comm.inter_bandwidth, so the step is the latency and
    # the slower per-NIC link, not a ninth of NVLink)
    share = valid.set_index("tp")["comm_fraction"]
    assert share[16] > 2 * share[8]


def test_tp_comm_is_four_all_reduces_of_bsh_per_layer():
    df = tp_scaling(GPT175, H100, plan=Plan(micro_batch=2, global_batch=2))
    row = df[(df.tp == 8) & ~df.sp].iloc[0]
    nbytes = 2 * GPT175.seq_len * GPT175.hidden * GPT175.dtype_bytes
    assert row.bytes_per_call == nbytes
    assert row.tp_comm_s == pytest.approx(4 * collective_seconds("all_reduce", 8, nbytes, H100.intra))
    sp = df[(df.tp == 8) & df.sp].iloc[0]
    assert sp.tp_comm_s == pytest.approx(row.tp_comm_s)  # AG + RS move what the all-reduce moved
    assert sp.overlapped_s > 0 and row.overlapped_s == 0  # Megatron's backward re-gather, overlapped


def test_compute_splits_by_tp_and_recompute_adds_a_forward():
    flat = PerfOptions(mfu=0.5)  # every FLOP at one efficiency: TP divides the work exactly
    df = tp_scaling(GPT175, H100, perf=flat)
    c = df[~df.sp].set_index("tp")["compute_s"]
    assert c[8] == pytest.approx(c[1] / 8)
    full = tp_scaling(GPT175, H100, plan=Plan(recompute="full"), perf=flat)
    assert full.loc[(full.tp == 1) & ~full.sp, "compute_s"].iloc[0] == pytest.approx(c[1] * 4 / 3)


def test_per_operator_compute_loses_efficiency_as_tp_shrinks_the_gemms():
    c = tp_scaling(GPT175, H100).pipe(lambda df: df[~df.sp].set_index("tp")["compute_s"])
    assert c[1] / 8 < c[8] < c[1] / 4  # an eighth of each GEMM runs a little below the whole one's rate
    assert (c.diff().dropna() < 0).all()  # still faster with every doubling


def test_a_moe_plan_without_tp_still_gets_the_boundarys_headlines():
    """Qwen3-30B-A3B at TP 1 (SP off): TP > 1 runs only with SP there, so the headlines beside the plan's
    are the SP rows, named so."""
    df = tp_scaling(MODELS["qwen3-30b-a3b"], H100, plan=Plan())
    rows = highlights(df, 8, 1, sp=False)
    assert [(r["tp"], r["sp"]) for r in rows] == [(1, False), (8, True), (16, True)]
    assert [r["label"] for r in rows][1:] == ["TP 8+SP: largest inside a node", "TP 16+SP: first across nodes"]
    assert [r["tp"] for r in highlights(tp_scaling(GPT175, H100), 8, 4)] == [4, 8, 16]


def test_the_modules_a_selective_recompute_repeats_are_the_plans():
    """Recomputing the MLP too repeats its forward: Llama-3 70B's layer on TP 8 computes longer than
    with the attention core alone, as the plan's own step model has it."""
    plans = [Plan(tp=8, sp=True, recompute="selective", recompute_modules=m) for m in ("core_attn", "core_attn+mlp")]
    compute = [
        tp_scaling(MODELS["llama3-70b"], H100, plan=p).set_index(["tp", "sp"]).loc[(8, True), "compute_s"]
        for p in plans
    ]
    assert compute[1] > 1.1 * compute[0]


def test_degrees_the_model_cannot_use_are_kept_with_the_reason():
    odd = Model(name="odd", layers=4, hidden=768, heads=12, vocab=1000, seq_len=1024)
    df = tp_scaling(odd, H100)
    bad = df[~df["valid"]]
    assert set(bad.tp) == {8, 16, 32}
    assert all("heads 12 are not divisible" in r for r in bad.reason)
    notes = invalid_notes(df)
    assert len(notes) == len(bad) and notes[0].startswith("TP 8 left out: heads 12")
    assert len(summary_table(df)) == int(df["valid"].sum())
    moe = invalid_notes(tp_scaling(MODELS["mixtral-8x7b"], H100, plan=Plan(tp=2, sp=True)))
    assert moe and all(n.startswith(f"TP {t} without SP left out: a MoE model") for n, t in zip(moe, TP_DEGREES[1:]))


def test_highlights_name_the_plans_tp_and_both_sides_of_the_boundary():
    df = tp_scaling(GPT175, H100)
    rows = highlights(df, 8, 4)
    assert [r["tp"] for r in rows] == [4, 8, 16]
    assert [r["link"] for r in rows] == ["intra", "intra", "inter"]
    assert [r["tp"] for r in highlights(df, 8, 8)] == [8, 16]  # no duplicate
