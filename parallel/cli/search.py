"""`python -m parallel search`: enumerate valid plans for a model and cluster, best first (parallel.search.space).

    python -m parallel search --model gpt3-175b --cluster dgx-h100 --gpus 512 --global-batch 1536 \\
        [--top N] [--json] [--headroom 0.1] [--max-tp 8] [--require-sp] [--zero 0,1] [--recompute none,selective]
        [--explain [--against dp=8,tp=8,pp=8,sp=1,vpp=2,micro_batch=1,zero=1]]
"""

from __future__ import annotations

import argparse
import json
import sys

from parallel.cli.args import (
    add_cluster_args,
    add_model_args,
    add_plan_args,
    cluster_from_args,
    model_from_args,
    plan_from_args,
)
from parallel.cli.dispatch import prog_name
from parallel.cli.plan import add_option_args, options_from_args
from parallel.core.plan import CP_KINDS, PLAN_DEFAULTS, RECOMPUTE, Plan, plan_from_values
from parallel.core.report import Options
from parallel.core.specs import MODELS, TRAINED_GLOBAL_BATCH, Cluster, GiB, Model, SpecError
from parallel.search.explain import explain, explain_text, runner_up
from parallel.search.space import (
    PLAN_KEYS,
    SEARCH_SETS,
    Constraints,
    SearchResult,
    plan_of,
    result_json,
    search,
    shared_text,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog_name("python -m parallel search"),
        description="enumerate valid plans for a model and cluster, best first",
    )
    add_model_args(parser)
    add_cluster_args(parser)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to plan for (default: --nodes × GPUs per node)")
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="sequences per optimizer step (default: the preset's published training batch, where it has one)",
    )
    g = parser.add_argument_group("constraints")
    g.add_argument("--headroom", type=float, default=Constraints.headroom, help="fraction of GPU memory kept free")
    for name in ("tp", "pp", "cp", "micro-batch"):
        g.add_argument(f"--max-{name}", type=int, default=None)
    g.add_argument("--require-sp", action="store_true", help="every plan with tp > 1 uses sequence parallelism")
    g.add_argument("--zero", default="0,1,2,3", help="ZeRO stages to consider, e.g. 0,1")
    g.add_argument("--recompute", default=",".join(RECOMPUTE), help="recompute modes to consider, e.g. none,selective")
    g.add_argument(
        "--cp-kinds", default=",".join(CP_KINDS), help="context-parallel exchanges to consider, e.g. ring,ulysses"
    )
    g.add_argument(
        "--dispatchers",
        default=",".join(Constraints.dispatchers),
        help="MoE token dispatchers to consider where ep > 1 (flex where EP spans NVLink domains, alltoall "
        "inside; allgather as its own rows), e.g. alltoall,flex,allgather",
    )
    # every other plan field is shared by all candidates: the same flags and defaults as `parallel plan`
    add_plan_args(parser, only=SHARED_FLAGS)
    add_option_args(parser)
    parser.add_argument("--top", type=int, default=10, help="plans to print (0: all)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, best first")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="why the top plan beats the runner-up (or --against): the two step breakdowns side by side",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="SPEC",
        help="your plan to explain against, e.g. dp=8,tp=8,pp=8,sp=1,vpp=2,micro_batch=1,zero=1 (any plan field; "
        "the others: the search's)",
    )
    return parser


# the plan fields every candidate shares: the same flags and defaults as `parallel plan`
SHARED_FLAGS = tuple(k for k in PLAN_DEFAULTS if k not in (*PLAN_KEYS, *SEARCH_SETS, "global_batch"))


def plan_spec(spec: str, base: Plan) -> Plan:
    """A Plan from `key=value,...` (plan field names), the other fields `base`'s (the search's)."""
    fields: dict = {}
    for part in filter(None, (x.strip() for x in spec.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in PLAN_DEFAULTS:
            raise SpecError(f"--against: {part!r} is not key=value with a key among {', '.join(PLAN_DEFAULTS)}")
        fields[key] = value
    try:
        return plan_from_values({**base.to_dict(), **fields})
    except SpecError as err:
        raise SpecError(f"--against: {err}") from None


def constraints_from_args(args: argparse.Namespace) -> Constraints:
    try:
        zero = tuple(int(z) for z in args.zero.split(",") if z.strip())
    except ValueError:
        raise SpecError(f"--zero must list stages like 0,1,2,3, got {args.zero!r}") from None
    return Constraints(
        headroom=args.headroom,
        max_tp=args.max_tp,
        max_pp=args.max_pp,
        max_cp=args.max_cp,
        max_micro_batch=args.max_micro_batch,
        require_sp=args.require_sp,
        zero=zero,
        recompute=tuple(r.strip() for r in args.recompute.split(",") if r.strip()),
        cp_kinds=tuple(k.strip() for k in args.cp_kinds.split(",") if k.strip()),
        dispatchers=tuple(k.strip() for k in args.dispatchers.split(",") if k.strip()),
        base=plan_from_args(args, only=SHARED_FLAGS),
    )


def cluster_for_gpus(args: argparse.Namespace) -> Cluster:
    if args.gpus is None and args.nodes is None:
        raise SpecError("give the GPUs to plan for: --gpus N (or --nodes N)")
    if args.gpus is not None and args.gpus < 1:
        raise SpecError(f"--gpus must be at least 1, got {args.gpus}")
    cluster = cluster_from_args(args, args.gpus or 1)
    if args.gpus is not None and cluster.gpus != args.gpus:
        raise SpecError(
            f"--gpus {args.gpus} is not a whole number of {cluster.gpus_per_node}-GPU nodes"
            + (f" (--nodes {args.nodes} gives {cluster.gpus})" if args.nodes else "")
        )
    return cluster


def render_text(result: SearchResult, model: Model, cluster: Cluster, gb: int, top: int) -> str:
    lines = [
        f"{model.name} on {cluster.nodes}×{cluster.gpus_per_node} {cluster.name} GPUs, global batch {gb}"
        + (" (the model's published training batch)" if TRAINED_GLOBAL_BATCH.get(model.name) == gb else "")
        + ": "
        f"{len(result.table):,} plans fit ({result.evaluated:,} evaluated in {result.seconds:.2f} s)",
        f"ranking: {result.rule}",
        f"every plan: {shared_text(result.base)} (plan flags change these, e.g. --tp-overlap)",
        "",
        "funnel:",
    ]
    lines += [f"  {s['remaining']:>9,}  {s['constraint']}" for s in result.funnel]
    table = result.table if not top else result.table.head(top)
    labels = [plan_of(row, result.base).label() for row in table.to_dict("records")]
    w = max([len(x) for x in labels] + [4])
    lines += [
        "",
        f"{'#':>4}  {'plan':<{w}} {'memory/GPU':>11} {'step s':>8} {'bubble':>7} {'MFU':>6}  pareto  equivalent",
    ]
    for i, (label, row) in enumerate(zip(labels, table.to_dict("records"))):
        lines.append(
            f"{i + 1:>4}  {label:<{w}} {row['memory_per_gpu_bytes'] / GiB:>7.1f} GiB "
            f"{row['step_time_s']:>8.3f} {row['bubble_fraction']:>7.3f} {row['mfu']:>6.1%}  "
            f"{'*' if row['pareto'] else ' ':<6}  {'=' if row.get('equivalent') else ''}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, cluster, constraints, options = search_inputs(args)
        result = search(model, cluster, args.global_batch, constraints, options)
    except SpecError as err:
        if args.json:
            print("[]")
        print(f"error: {err}", file=sys.stderr)
        return 2
    ex = None
    if args.explain or args.against:
        try:
            ex = _explain(result, model, cluster, args, constraints, options)
        except (SpecError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.json:
        plans = result_json(result, args.top)
        print(json.dumps({"plans": plans, "explain": ex, "rule": result.rule} if ex else plans, ensure_ascii=False))
    else:
        print(render_text(result, model, cluster, args.global_batch, args.top))
        if ex:
            print("\n" + explain_text(ex))
    return 0


def search_inputs(args: argparse.Namespace) -> tuple[Model, Cluster, Constraints, Options]:
    """The model, cluster, constraints and options the command searches with (bench.search times the same)."""
    model, cluster = model_from_args(args), cluster_for_gpus(args)
    constraints, options = constraints_from_args(args), options_from_args(args)
    if args.global_batch is None:  # a preset as published (no shape flags) brings its training batch
        preset = args.model if model == MODELS.get(args.model or "") else ""
        args.global_batch = TRAINED_GLOBAL_BATCH.get(preset)
        if args.global_batch is None:
            raise SpecError(
                f"--global-batch is required: {model.name} has no published training batch (presets that "
                f"have one: {', '.join(TRAINED_GLOBAL_BATCH)})"
            )
    if args.global_batch < 1:
        raise SpecError(f"--global-batch must be at least 1, got {args.global_batch}")
    return model, cluster, constraints, options


def _explain(result: SearchResult, model: Model, cluster: Cluster, args, constraints: Constraints, options) -> dict:
    """The top plan against --against, or against the runner-up: the first plan whose step or memory
    differs from the top's (exact twins, such as a mirrored stage split, teach nothing)."""
    table = result.table
    top = plan_of(table.iloc[0].to_dict(), result.base)
    second, twins = runner_up(table)
    if args.against:
        other = plan_spec(args.against, result.base)
    elif second is not None:
        other = plan_of(table.iloc[second].to_dict(), result.base)
    else:
        raise SpecError("--explain: no other plan fits with a different step or memory (give --against)")
    ex = explain(model, cluster, top, other, options, float(table["step_time_s"].min()))
    return {**ex, "exact_ties": twins}
