"""Command-line flags shared by `python -m parallel plan | train | search` and the profiler.

Model: a preset (`--model gpt3-175b`) and/or explicit shape flags, which override the preset.
Cluster: a preset (`--cluster dgx-h100`), `--nodes` (default: just enough for the plan) and link
flags, or links fitted by `python -m profiler commbench` (`--links FILE`).
Plan: the degrees and schedule. Each `*_from_args` raises SpecError with a readable message.
Pure: stdlib only (argparse).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from parallel.core.plan import CP_KINDS, FP8, MAIN_GRADS, RECOMPUTE, SCHEDULES, Plan
from parallel.core.specs import CLUSTERS, GB, MODELS, Cluster, GiB, Link, Model, SpecError, cluster_preset, model_preset
from parallel.core.topology import DEFAULT_ORDER, ORDERS

MODEL_SHAPE = {  # flag -> Model field
    "layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "ffn_hidden": "ffn_hidden",
    "seq_len": "seq_len",
    "vocab": "vocab",
    "dtype_bytes": "dtype_bytes",
    "arch": "arch",
}


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    g = parser.add_argument_group("model (a preset, and/or its shape)")
    g.add_argument("--model", default=default, help=f"preset: {', '.join(MODELS)}")
    for flag in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab", "dtype_bytes"):
        g.add_argument("--" + flag.replace("_", "-"), dest=flag, type=int, default=None)
    g.add_argument("--arch", choices=("gpt", "llama"), default=None)
    g.add_argument(
        "--vocab-divisor",
        type=int,
        default=None,
        help="pad the vocabulary to a multiple of this x tp, as Megatron-LM's --make-vocab-size-divisible-by "
        "(default: the preset's, 128)",
    )
    g.add_argument(
        "--no-vocab-padding", action="store_true", help="build the vocabulary as given (torchtitan does not pad)"
    )


def model_from_args(args: argparse.Namespace) -> Model:
    model = _model_shape(args)
    divisor = 1 if getattr(args, "no_vocab_padding", False) else getattr(args, "vocab_divisor", None)
    if divisor is not None and divisor != model.vocab_divisor:
        if getattr(args, "no_vocab_padding", False) and getattr(args, "vocab_divisor", None) not in (None, 1):
            raise SpecError("--no-vocab-padding and --vocab-divisor contradict each other")
        return dataclasses.replace(model, vocab_divisor=divisor)
    return model


def _model_shape(args: argparse.Namespace) -> Model:
    overrides = {
        field: getattr(args, flag) for flag, field in MODEL_SHAPE.items() if getattr(args, flag, None) is not None
    }
    if args.model:
        base = model_preset(args.model)
        if not overrides:
            return base
        label = ",".join(f"{k}={v}" for k, v in overrides.items())
        data = {**base.to_dict(), **overrides, "name": f"{base.name} ({label})"}
        if "heads" in overrides and "kv_heads" not in overrides and base.kv_heads == base.heads:
            data["kv_heads"] = None  # plain MHA stays MHA
        if "hidden" in overrides and "ffn_hidden" not in overrides and base.ffn_hidden == 4 * base.hidden:
            data["ffn_hidden"] = None
        return Model.from_dict(data)
    missing = [
        f"--{f.replace('_', '-')}" for f in ("layers", "hidden", "heads", "seq_len", "vocab") if f not in overrides
    ]
    if missing:
        raise SpecError(
            f"give a model: --model PRESET ({', '.join(MODELS)}) or all of "
            f"--layers --hidden --heads --seq-len --vocab (missing {' '.join(missing)})"
        )
    return Model(name="custom", **overrides)


def add_cluster_args(parser: argparse.ArgumentParser, *, default: str = "dgx-h100") -> None:
    g = parser.add_argument_group("cluster (a preset, its size, and its links)")
    g.add_argument("--cluster", default=default, help=f"preset: {', '.join(CLUSTERS)}")
    g.add_argument("--nodes", type=int, default=None, help="nodes (default: just enough for the plan)")
    g.add_argument("--gpus-per-node", type=int, default=None)
    g.add_argument("--gpu-memory-gb", type=float, default=None, help="GPU memory in GiB")
    g.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 TFLOP/s per GPU")
    g.add_argument("--intra-bw", type=float, default=None, help="intra-node GB/s per GPU per direction")
    g.add_argument("--inter-bw", type=float, default=None, help="inter-node GB/s per GPU per direction")
    g.add_argument("--intra-latency-us", type=float, default=None)
    g.add_argument("--inter-latency-us", type=float, default=None)
    g.add_argument(
        "--links",
        type=Path,
        default=None,
        help="JSON from `python -m profiler commbench`: use its fitted intra/inter links",
    )


MAX_COMMBENCH_BYTES = 16 << 20  # a commbench result: its rows per op, size and group, a few hundred KiB at most


def links_from_commbench(path: Path, unmeasured: list[str] | None = None) -> dict[str, Link]:
    """The fitted links of a commbench result: its `links` object, {intra|inter: {latency_s, bandwidth_bytes_per_s}}.
    A link whose bandwidth the run could not fit (null: its times showed no size dependence, as a
    loopback run on shared cores can) is left out -- its name appended to `unmeasured` -- so the
    cluster's own link stays."""
    from runfiles.rundir import load_json_object

    try:
        links = load_json_object(path, MAX_COMMBENCH_BYTES)["links"]
        out = {}
        for name, v in links.items():
            if name not in ("intra", "inter"):
                continue
            if v.get("bandwidth_bytes_per_s") is None:
                if unmeasured is not None:
                    unmeasured.append(name)
                continue
            out[name] = Link(float(v["bandwidth_bytes_per_s"]), float(v["latency_s"]), v.get("name", f"fitted {name}"))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise SpecError(f"--links {path}: not a commbench result with fitted links ({err})") from None


def cluster_from_args(args: argparse.Namespace, world_size: int) -> Cluster:
    c = cluster_preset(args.cluster)
    if args.gpus_per_node is not None:
        c = dataclasses.replace(c, gpus_per_node=args.gpus_per_node)
    intra, inter = c.intra, c.inter
    if getattr(args, "links", None):
        unmeasured: list[str] = []
        fitted = links_from_commbench(args.links, unmeasured)
        intra, inter = fitted.get("intra", intra), fitted.get("inter", inter)
        for name in unmeasured:  # stderr: --json keeps stdout to the report
            print(
                f"note: --links {args.links}: the {name} link's bandwidth was not fitted (its times showed no "
                f"size dependence); the cluster's {name} link is used",
                file=sys.stderr,
            )
    if args.intra_bw is not None or args.intra_latency_us is not None:
        intra = Link(
            args.intra_bw * GB if args.intra_bw is not None else intra.bandwidth_bytes_per_s,
            args.intra_latency_us * 1e-6 if args.intra_latency_us is not None else intra.latency_s,
            intra.name,
        )
    if args.inter_bw is not None or args.inter_latency_us is not None:
        inter = Link(
            args.inter_bw * GB if args.inter_bw is not None else inter.bandwidth_bytes_per_s,
            args.inter_latency_us * 1e-6 if args.inter_latency_us is not None else inter.latency_s,
            inter.name,
        )
    c = dataclasses.replace(c, intra=intra, inter=inter)
    if args.gpu_memory_gb is not None:
        c = dataclasses.replace(c, gpu_memory_bytes=int(args.gpu_memory_gb * GiB))
    if args.peak_tflops is not None:
        c = dataclasses.replace(c, peak_flops=args.peak_tflops * 1e12)
    return c.with_nodes(args.nodes) if args.nodes is not None else c.sized_for(world_size)


def launch_cluster(args: argparse.Namespace, world_size: int, *, nnodes: int = 1) -> Cluster:
    """The cluster a launch of `world_size` ranks runs on: the preset's links and GPUs, shaped as the
    launch is -- `nnodes` machines of world/nnodes ranks (the local launcher: one machine holding them
    all) -- unless --nodes or --gpus-per-node say otherwise. A preset's node size describes its
    hardware, not this launch: 12 local-cpu ranks on one machine are one node, and their TP groups
    never cross one."""
    c = cluster_from_args(args, world_size)
    if args.nodes is None and args.gpus_per_node is None:
        nodes = max(int(nnodes), 1)
        c = dataclasses.replace(c, nodes=nodes, gpus_per_node=-(-world_size // nodes))
    return c


def add_plan_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("plan")
    for flag in ("dp", "tp", "pp", "cp"):
        g.add_argument(f"--{flag}", type=int, default=1)
    g.add_argument("--sp", action="store_true", help="Megatron sequence parallelism (needs tp > 1)")
    g.add_argument(
        "--cp-kind",
        choices=CP_KINDS,
        default="allgather",
        help="how context parallelism exchanges the sequence: all-gathered K/V, ring attention, or Ulysses all-to-all",
    )
    g.add_argument(
        "--ep", type=int, default=1, help="expert parallelism of a MoE model (ranks taken from dp x cp; adds no GPUs)"
    )
    g.add_argument("--etp", type=int, default=None, help="expert tensor parallelism (default: tp)")
    g.add_argument("--micro-batch", type=int, default=1)
    g.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="sequences per optimizer step (default: dp×micro_batch×pp, one microbatch per stage)",
    )
    g.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages per rank (interleaved 1F1B)")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 over the data-parallel ranks")
    g.add_argument("--recompute", choices=RECOMPUTE, default="none")
    g.add_argument(
        "--order",
        default=DEFAULT_ORDER,
        help="rank order, fastest first: " + "; ".join(f"{k} ({v})" for k, v in ORDERS.items()),
    )
    g.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    g.add_argument(
        "--main-grads",
        choices=MAIN_GRADS,
        default="fp32",
        help="gradient buffer dtype: fp32 (Megatron-LM's default) or bf16 (--grad-reduce-in-bf16)",
    )
    g.add_argument(
        "--fp8",
        choices=FP8,
        default="none",
        help="FP8 GEMMs with bf16 weights (gemm) or FP8 weights too (weights, Megatron's --fp8-param-gather)",
    )
    o = parser.add_argument_group("overlap (what the framework hides behind compute)")
    o.add_argument(
        "--tp-overlap",
        action="store_true",
        help="TP/SP collectives under the GEMMs (Megatron --tp-comm-overlap, torchtitan async TP)",
    )
    o.add_argument(
        "--grad-reduce-overlap",
        action="store_true",
        help="DP gradient reduction under backward (Megatron --overlap-grad-reduce, DDP, FSDP2)",
    )
    o.add_argument(
        "--param-gather-overlap",
        action="store_true",
        help="ZeRO's weight all-gathers under forward (Megatron --overlap-param-gather, FSDP2 prefetch)",
    )
    o.add_argument(
        "--p2p-overlap",
        action="store_true",
        help="pipeline sends/receives under the neighbouring microbatch (Megatron's interleaved schedule)",
    )
    u = parser.add_argument_group("uneven pipeline stages (Megatron-LM's flags)")
    u.add_argument(
        "--first-stage-layers",
        type=int,
        default=None,
        help="layers on the first stage (--decoder-first-pipeline-num-layers)",
    )
    u.add_argument(
        "--last-stage-layers",
        type=int,
        default=None,
        help="layers on the last stage (--decoder-last-pipeline-num-layers)",
    )
    u.add_argument(
        "--embedding-in-split",
        action="store_true",
        help="the embedding counts as a layer of the split (--account-for-embedding-in-pipeline-split)",
    )
    u.add_argument(
        "--loss-in-split",
        action="store_true",
        help="the loss counts as a layer of the split (--account-for-loss-in-pipeline-split)",
    )


def plan_from_args(args: argparse.Namespace) -> Plan:
    gb = args.global_batch
    if gb is None:
        gb = max(args.dp, 1) * max(args.micro_batch, 1) * max(args.pp, 1)
    return Plan(
        dp=args.dp,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        sp=args.sp,
        micro_batch=args.micro_batch,
        global_batch=gb,
        vpp=args.vpp,
        zero=args.zero,
        recompute=args.recompute,
        order=args.order,
        schedule=args.schedule,
        main_grads=args.main_grads,
        fp8=args.fp8,
        ep=args.ep,
        etp=args.etp,
        cp_kind=args.cp_kind,
        tp_overlap=args.tp_overlap,
        grad_reduce_overlap=args.grad_reduce_overlap,
        param_gather_overlap=args.param_gather_overlap,
        p2p_overlap=args.p2p_overlap,
        first_stage_layers=args.first_stage_layers,
        last_stage_layers=args.last_stage_layers,
        embedding_in_split=args.embedding_in_split,
        loss_in_split=args.loss_in_split,
    )


def unwritable_ancestor(path: Path) -> tuple[Path, str] | None:
    """Where files under `path` cannot go, found before a job runs: the nearest existing ancestor of
    `path` (itself included) with what is wrong with it ('is not a directory' | 'is not writable');
    None when `path` can be created and written in."""
    path = Path(path).absolute()
    where = next(p for p in (path, *path.parents) if p.exists())  # the root always exists
    if not where.is_dir():
        return where, "is not a directory"
    if not os.access(where, os.W_OK | os.X_OK):
        return where, "is not writable"
    return None
