"""How one transformer layer scales with tensor parallelism: compute vs TP communication, TP = 1…32.

For one layer, one microbatch of b sequences of s tokens, on one GPU of a TP group of size t:

    compute   forward + backward (+ the recomputed forward) of the layer's GEMMs, attention core and
              element-wise kernels on one TP rank, timed from their shapes on the cluster's device
              (parallel.core.compute), or every FLOP at `mfu` of the peak when given
    TP comm   the layer's TP collectives by the alpha-beta ring model (parallel.core.comm): without SP
              4 all-reduces of b*s*h elements (Shoeybi et al. 2019, Sec. 3); with SP 4 all-gathers +
              4 reduce-scatters of the same volume (Korthikanti et al. 2022, Sec. 4.2.2), plus the
              backward re-gather of SP inputs, which Megatron-LM overlaps (reported, not on the
              critical path). With `tp_overlap` (Megatron-LM --tp-comm-overlap, torchtitan's async
              TP) SP's collectives run in chunks under the GEMMs inside a node (parallel.core.perf).
              Exposed = on the critical path; hidden = overlapped.

A TP group that does not fit in one node (t > gpus_per_node) is bound by the inter-node link: the
NVLink/InfiniBand cliff. Speedup is against TP = 1 (no SP, which needs t > 1); efficiency = speedup/t.
Degrees the model cannot be split by (heads % t, seq % t under SP, ...) are kept as rows with
`valid` False and the reason, so charts can say why a point is missing.

Pure: stdlib, pandas and parallel/ only.
"""

from __future__ import annotations

import pandas as pd

from parallel.core.comm import CommOptions, bus_factor, collective_seconds
from parallel.core.memory import ActivationOptions
from parallel.core.perf import PerfOptions, layer_tp_seconds, stage_cost
from parallel.core.plan import Plan
from parallel.core.specs import Cluster, Model
from parallel.core.topology import placed
from parallel.core.validate import _shape_errors

TP_DEGREES = (1, 2, 4, 8, 16, 32)
COLUMNS = (
    "tp",
    "sp",
    "valid",
    "reason",
    "link",
    "compute_s",
    "tp_comm_s",
    "overlapped_s",
    "layer_s",
    "comm_fraction",
    "speedup",
    "efficiency",
    "bytes_per_call",
    "busbw_bytes_per_s",
)


def layer_compute_seconds(
    model: Model, plan: Plan, cluster: Cluster, perf: PerfOptions = PerfOptions(), acts: ActivationOptions | None = None
) -> float:
    """Forward + backward (+ recomputed forward) of one layer for one microbatch on one TP rank: the
    per-operator model of parallel.core.compute on the cluster's device (or perf.mfu's flat one)."""
    return float(stage_cost(model, plan, cluster, perf, acts or ActivationOptions()).layer)


def tp_busbw(n: int, nbytes: float, cluster: Cluster, link: str) -> float:
    """Predicted bus bandwidth (nccl-tests convention) of an all-reduce of `nbytes` over n ranks:
    algbw * bus_factor. All-gather/reduce-scatter give the same under the ring model."""
    if n <= 1:
        return float("nan")
    seconds = collective_seconds("all_reduce", n, nbytes, cluster.inter if link == "inter" else cluster.intra)
    return nbytes / seconds * bus_factor("all_reduce", n)


def one_layer_plan(plan: Plan, tp: int, sp: bool) -> Plan:
    """`plan`'s per-rank settings (micro batch, recompute and the modules it recomputes, attention,
    dropout, FP8, TP overlap) on a lone TP group of `tp` ranks, SP on or off: the plan one row of the
    sweep times (the overlap works on SP's collectives only)."""
    return Plan(
        tp=tp,
        sp=sp,
        micro_batch=plan.micro_batch,
        global_batch=plan.micro_batch,
        recompute=plan.recompute,
        recompute_modules=plan.recompute_modules,
        attention=plan.attention,
        dropout=plan.dropout,
        fp8=plan.fp8,
        tp_overlap=plan.tp_overlap and sp,
    )


def _row(
    model: Model, cluster: Cluster, plan: Plan, perf: PerfOptions, comm: CommOptions, acts: ActivationOptions | None
) -> dict:
    tp, sp, micro_batch = plan.tp, plan.sp, plan.micro_batch
    row = dict.fromkeys(COLUMNS, float("nan"))
    row.update(tp=tp, sp=sp, valid=True, reason="")
    errors = _shape_errors(plan, model)
    if errors:
        row.update(valid=False, reason="; ".join(errors), link="")
        return row
    link = placed(plan, cluster).link("tp")  # a group of tp ranks from rank 0
    exposed, hidden = layer_tp_seconds(model, plan, cluster, perf, comm, acts)
    compute = layer_compute_seconds(model, plan, cluster, perf, acts)
    nbytes = micro_batch * model.seq_len * model.hidden * model.dtype_bytes
    row.update(
        link=link,
        compute_s=compute,
        tp_comm_s=exposed,
        overlapped_s=hidden,
        layer_s=compute + exposed,
        comm_fraction=exposed / (compute + exposed),
        bytes_per_call=nbytes,
        busbw_bytes_per_s=tp_busbw(tp, nbytes, cluster, link),
    )
    return row


def tp_scaling(
    model: Model,
    cluster: Cluster,
    *,
    tps: tuple[int, ...] = TP_DEGREES,
    plan: Plan = Plan(),
    perf: PerfOptions = PerfOptions(),
    comm: CommOptions = CommOptions(),
    acts: ActivationOptions | None = None,
) -> pd.DataFrame:
    """One row per (tp, sp) with COLUMNS, each one layer under `plan`'s per-rank settings
    (one_layer_plan); sp=True rows start at tp=2 (SP needs a TP group)."""
    rows = [
        _row(model, cluster, one_layer_plan(plan, t, sp), perf, comm, acts)
        for sp in (False, True)
        for t in tps
        if not (sp and t == 1)
    ]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    base = df.loc[(df.tp == 1) & ~df.sp, "layer_s"]
    base_s = float(base.iloc[0]) if len(base) else float("nan")
    df["speedup"] = base_s / df["layer_s"]
    df["efficiency"] = df["speedup"] / df["tp"]
    return df


def highlights(
    df: pd.DataFrame,
    gpus_per_node: int,
    current_tp: int,
    link_names: tuple[str, str] = ("NVLink", "InfiniBand"),
    *,
    sp: bool = False,
) -> list[dict]:
    """Up to three rows worth a headline, SP as the plan has it (`sp`; TP 1 has no SP; where only the other
    variant runs, that one: a MoE layer takes TP only with SP): the plan's TP, the largest TP inside a node
    and the smallest that leaves it — each with label, tp, sp, link, comm_fraction, efficiency, help.
    `link_names`: what the cluster calls its (intra, inter)-node links."""
    valid = df[df["valid"]]
    valid = valid.assign(other=valid["sp"] != sp).sort_values(["tp", "other"], kind="stable").drop_duplicates("tp")
    inside = valid[valid["tp"] <= gpus_per_node]["tp"]
    outside = valid[valid["tp"] > gpus_per_node]["tp"]
    on = set(valid.loc[valid["sp"], "tp"])
    name = lambda tp: f"TP {tp}" + ("+SP" if tp in on else "")  # noqa: E731
    picks = [(current_tp, f"{name(current_tp)} (the plan's)")]
    if len(inside):
        picks.append((int(inside.max()), f"{name(int(inside.max()))}: largest inside a node"))
    if len(outside):
        picks.append((int(outside.min()), f"{name(int(outside.min()))}: first across nodes"))
    out, seen = [], set()
    for tp, label in picks:
        row = valid[valid["tp"] == tp]
        if tp in seen or row.empty:
            continue
        seen.add(tp)
        r = row.iloc[0]
        link = link_names[0] if r["link"] == "intra" else link_names[1]
        out.append(
            {
                "label": label,
                "tp": tp,
                "sp": bool(r["sp"]),
                "link": r["link"],
                "comm_fraction": float(r["comm_fraction"]),
                "efficiency": float(r["efficiency"]),
                "help": f"{link}: exposed TP communication is {r['comm_fraction']:.0%} of the layer's "
                f"{r['layer_s'] * 1e3:.2f} ms; speedup {r['speedup']:.2f}× over TP = 1",
            }
        )
    return out


def summary_table(df: pd.DataFrame, link_names: tuple[str, str] = ("NVLink", "InfiniBand")) -> pd.DataFrame:
    """The prediction as a readable table: milliseconds, shares and GB/s, one row per (TP, SP);
    `link_names` as in `highlights`."""
    valid = df[df["valid"]]
    return pd.DataFrame(
        {
            "TP": valid["tp"],
            "SP": valid["sp"].map({False: "off", True: "on"}),
            "link": valid["link"].map(dict(zip(("intra", "inter"), link_names))),
            "compute ms": valid["compute_s"] * 1e3,
            "TP comm ms (exposed)": valid["tp_comm_s"] * 1e3,
            "TP comm ms (overlapped)": valid["overlapped_s"] * 1e3,
            "layer ms": valid["layer_s"] * 1e3,
            "comm share": valid["comm_fraction"],
            "speedup": valid["speedup"],
            "efficiency": valid["efficiency"],
            "busbw GB/s": valid["busbw_bytes_per_s"] / 1e9,
        }
    ).round(3)


def invalid_notes(df: pd.DataFrame) -> list[str]:
    """One line per TP degree (and SP variant) left out, with the plan model's reason; 'without SP' where
    only the SP-off row is left out (a MoE model: TP needs SP), so the note never reads as the degree gone."""
    bad = df[~df["valid"]]
    with_sp = set(df.loc[df["valid"] & df["sp"], "tp"])
    return [
        f"TP {int(r.tp)}{' + SP' if r.sp else ' without SP' if r.tp in with_sp else ''} left out: {r.reason}"
        for r in bad.itertuples()
    ]
