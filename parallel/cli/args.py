"""Command-line flags shared by `python -m parallel plan | train | search` and the profiler.

Model: a preset (`--model gpt3-175b`) and/or explicit shape flags, which override the preset.
Cluster: a preset (`--cluster dgx-h100`), `--nodes` (default: just enough for the plan), its hosts
and NVLink domain (`--gpus-per-node`, `--nvlink-domain`: the Cluster checks that a domain is whole
hosts) and link flags, or links fitted by `python -m profiler commbench` (`--links FILE`).
Plan: the degrees and schedule. Each `*_from_args` raises SpecError with a readable message.
Pure: stdlib only (argparse).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from parallel.core.plan import PLAN_FIELDS, Plan, plan_from_values
from parallel.core.specs import CLUSTERS, GB, MODELS, Cluster, GiB, Link, Model, SpecError, cluster_preset, model_preset
from runfiles.rundir import load_json_object

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
    g.add_argument(
        "--nvlink-domain",
        type=int,
        default=None,
        metavar="N",
        help="GPUs sharing one NVLink fabric, whole hosts: a multiple of the GPUs per node (default: the "
        "preset's, 72 on an NVL72 rack; else one host). --gpus-per-node alone keeps the preset's domain "
        "while it is whole hosts; when it is not, give this too",
    )
    g.add_argument("--gpu-memory-gb", type=float, default=None, help="GPU memory in GiB")
    g.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 TFLOP/s per GPU")
    g.add_argument("--intra-bw", type=float, default=None, help="GB/s per GPU per direction inside an NVLink domain")
    g.add_argument("--inter-bw", type=float, default=None, help="GB/s per GPU per direction between domains")
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
    domain = getattr(args, "nvlink_domain", None)
    if args.gpus_per_node is not None or domain is not None:  # the Cluster says if the domain is whole hosts
        c = dataclasses.replace(
            c,
            gpus_per_node=c.gpus_per_node if args.gpus_per_node is None else args.gpus_per_node,
            nvlink_domain=c.nvlink_domain if domain is None else domain,
        )
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
        c = dataclasses.replace(c.launched_as(-(-world_size // nodes)), nodes=nodes)
    return c


PLAN_GROUPS = {  # argparse group titles of the schema's groups (parallel.core.plan_schema.Knob.group)
    "plan": "plan",
    "batch": "batch",
    "overlap": "overlap (what the framework hides behind compute)",
    "stages": "uneven pipeline stages",
}


def add_plan_args(parser: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None) -> None:
    """One flag per plan field (parallel.core.plan's declarations; `only`: these fields). Every flag
    defaults to None -- "not given" -- so the plan takes the field's one declared default."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in PLAN_FIELDS:
        if only is not None and spec.name not in only:
            continue
        k = spec.knob
        g = groups.get(k.group) or groups.setdefault(k.group, parser.add_argument_group(PLAN_GROUPS[k.group]))
        shown = (
            ""
            if spec.default is None or spec.default is False or "default" in k.help
            else f" (default: {spec.default})"
        )
        common = {"dest": spec.name, "default": None, "help": k.help + shown}
        if k.kind in ("bool", "opt_bool"):
            g.add_argument(k.flag, action=argparse.BooleanOptionalAction, **common)
        elif k.kind == "choice":
            g.add_argument(k.flag, choices=k.choices, type=type(k.choices[0]), **common)
        elif k.kind == "text":
            g.add_argument(k.flag, **common)
        elif k.kind == "opt_float":
            g.add_argument(k.flag, type=float, metavar="X", **common)
        else:
            g.add_argument(k.flag, type=int, metavar="N", **common)


def given_plan_values(args: argparse.Namespace, *, only: tuple[str, ...] | None = None) -> dict:
    """The plan fields given on the command line (the others: not set); `only`: as add_plan_args'."""
    names = [s.name for s in PLAN_FIELDS if only is None or s.name in only]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def plan_from_args(args: argparse.Namespace, *, only: tuple[str, ...] | None = None) -> Plan:
    """The plan the flags name: parallel.core.plan.plan_from_values over the given ones."""
    return plan_from_values(given_plan_values(args, only=only), style="flag")


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
