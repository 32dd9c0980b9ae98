"""`python -m parallel plan`: validate a plan on a cluster; print its layout, memory, communication, time.

    python -m parallel plan --model gpt3-175b --cluster dgx-h100 --nodes 64 \\
        --dp 8 --tp 8 --pp 8 --sp --micro-batch 1 --global-batch 1536 [--json]

Exit status: 0 for a valid plan, 2 for an invalid one or bad flags (its errors printed, never a
traceback). Pure: no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from parallel.cli.args import (
    add_cluster_args,
    add_model_args,
    add_plan_args,
    cluster_from_args,
    given_plan_values,
    model_from_args,
    plan_from_args,
)
from parallel.cli.dispatch import prog_name
from parallel.core.calibrated import CalibrationError, predict, read_calibration
from parallel.core.comm import CommOptions
from parallel.core.compute import JOB_EFFICIENCY
from parallel.core.devices import MIN_EFFICIENCY, read_device_fit
from parallel.core.memory import SWIGLU, ActivationOptions
from parallel.core.perf import PerfOptions
from parallel.core.plan import plan_from_values, plan_values
from parallel.core.report import Options, plan_report
from parallel.core.specs import GiB, Model, SpecError
from parallel.importers import import_plan, place


def add_option_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("modelling assumptions")
    g.add_argument(
        "--mfu",
        type=float,
        default=None,
        help="an explicit flat efficiency: every FLOP at this fraction of peak (default: each operator timed "
        "from its shape on the cluster's device)",
    )
    g.add_argument(
        "--dp-overlap",
        type=float,
        default=None,
        help="an explicit fraction of DP communication hidden (0..1; default: from the plan's overlap flags)",
    )
    g.add_argument(
        "--job-efficiency",
        type=float,
        default=JOB_EFFICIENCY,
        help=f"the share of their isolated speed kernels keep inside a job (default {JOB_EFFICIENCY}: the published "
        "runs'; profiler calibrate fits your job's)",
    )
    g.add_argument(
        "--device-fit",
        metavar="JSON",
        default=None,
        help="time operators on the GPU as your job's kernels ran: the device fit of `profiler calibrate --kernels`",
    )
    g.add_argument(
        "--swiglu",
        choices=SWIGLU,
        default=None,
        help="SwiGLU saves its input only (fused, Megatron-LM's default) or silu(gate) too (unfused)",
    )
    g.add_argument("--act-bytes", type=int, default=None, help="bytes per activation (default: the model's dtype)")


def _device_fit(path: str):
    """The fitted Device of a `profiler calibrate --kernels` JSON; SpecError naming the file."""
    try:
        return read_device_fit(path)
    except SpecError as err:
        raise SpecError(f"--device-fit {path}: {err}") from None


def options_from_args(args: argparse.Namespace) -> Options:
    for name in ("mfu", "dp_overlap"):
        value = getattr(args, name)
        if value is not None and not (MIN_EFFICIENCY <= value <= 1 if name == "mfu" else 0 <= value <= 1):
            raise SpecError(
                f"--{name.replace('_', '-')} must be in {f'[{MIN_EFFICIENCY}, 1]' if name == 'mfu' else '[0, 1]'}, "
                f"got {value}"
            )
    acts = ActivationOptions(act_bytes=args.act_bytes, swiglu=args.swiglu or "fused")
    if not MIN_EFFICIENCY <= args.job_efficiency <= 1:
        raise SpecError(f"--job-efficiency must be in [{MIN_EFFICIENCY}, 1], got {args.job_efficiency}")
    perf = PerfOptions(
        mfu=args.mfu,
        dp_overlap=args.dp_overlap,
        job_efficiency=args.job_efficiency,
        device=_device_fit(args.device_fit) if getattr(args, "device_fit", None) else None,
    )
    return Options(activations=acts, comm=CommOptions(), perf=perf)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog_name("python -m parallel plan"), description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    add_cluster_args(parser)
    add_plan_args(parser)
    add_option_args(parser)
    parser.add_argument(
        "--import",
        dest="import_file",
        default=None,
        metavar="FILE",
        help="take model and plan from a Megatron-LM command line/script, a torchtitan TOML or config "
        "registry (.py), or a plan JSON",
    )
    parser.add_argument(
        "--config",
        dest="import_config",
        default=None,
        metavar="NAME",
        help="with --import of a torchtitan config registry: the config function to read (e.g. llama3_70b)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="CALIB.json",
        help="step time from the model fitted to measured runs (python -m profiler calibrate)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _calibrated(rep: dict, model, plan, path: str, cluster) -> None:
    """Replace the step time with the calibrated model's (parallel.core.calibrated) on `cluster` (groups
    that span its nodes take the inter-node link's terms); keep the analytic one as
    `analytic_step_time`, and name the calibration's sources and assumptions. ValueError when the
    calibration was measured on another kind of device than the cluster's: it says nothing there."""
    try:
        cal = read_calibration(path)
    except CalibrationError as err:
        raise ValueError(f"--calibration {path}: {err}") from None
    if cal.device != cluster.device:
        raise ValueError(
            f"--calibration {path}: measured on {cal.device.upper()} ranks, but cluster {cluster.name} runs on "
            f"{cluster.device.upper()}s: it cannot predict this plan there; calibrate from runs on that kind of "
            "machine (python -m profiler calibrate YOUR_TRACES)"
        )
    timing = predict(model, plan, cal, cluster=cluster)
    rep["analytic_step_time"] = rep["step_time"]
    rep["step_time_s"] = timing["step_time_s"]
    rep["step_time"] = {**timing, "mfu": rep["analytic_step_time"].get("mfu")}
    rep["calibration"] = {
        "path": path,
        "sources": cal.sources,
        "cores": cal.cores,
        "device": cal.device,
        "assumptions": list(cal.assumptions),
    }


def _gib(x: float) -> str:
    return f"{x / GiB:8.2f} GiB"


def _table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_text(rep: dict) -> str:
    p, m, c = rep["plan"], rep["model"], rep["cluster"]
    plan = plan_from_values(p)
    padded = Model.from_dict(m).padded_vocab(p["tp"])
    vocab = f"V={m['vocab']}" + (f" (padded to {padded} for tp {p['tp']})" if padded != m["vocab"] else "")
    out = [
        f"model {m['name']}: L={m['layers']} h={m['hidden']} a={m['heads']} kv={m['kv_heads']} "
        f"ffn={m['ffn_hidden']} s={m['seq_len']} {vocab}",
        f"cluster {c['name']}: {c['nodes']}×{c['gpus_per_node']} GPUs, "
        f"{c['gpu_memory_bytes'] / GiB:.0f} GiB, intra {c['intra']['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
        f"inter {c['inter']['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s",
        # the label, then every field away from its default, as the schema names them (plan JSON's keys)
        f"plan {plan.label()}: "
        + " ".join(f"{k}={v}" for k, v in plan_values(plan, changed_only=True).items() if k != "global_batch")
        + f" global_batch={plan.global_batch}",
        f"world size {rep['world_size']}: {'VALID' if rep['valid'] else 'INVALID'}",
    ]
    out += [f"  error: {e}" for e in rep["errors"]] + [f"  warning: {w}" for w in rep["warnings"]]
    if rep["memory_per_gpu_bytes"] is None:
        return "\n".join(out)
    mem = rep["memory_per_gpu_bytes"]
    out += [
        "",
        "memory per GPU (most loaded stage):",
        _table(
            ["stage", "params", "grads", "optimizer", "activations", "total"],
            [
                [r["stage"]] + [_gib(r[k]) for k in ("params", "grads", "optimizer", "activations", "total")]
                for r in rep["memory_per_stage_bytes"]
            ],
        ),
        f"max total {_gib(mem['total']).strip()}; activations per layer per microbatch "
        f"{rep['activation_bytes_per_layer'] / 2**20:.1f} MiB",
    ]
    out += [
        "",
        "groups:",
        _table(
            ["dim", "size", "groups", "crossing domains", "first group"],
            [
                [d, p[d], rep["group_counts"][d], rep["crossing_groups"][d], g[0]["ranks"][:16]]
                for d, g in rep["groups"].items()
            ],
        ),
    ]
    out += [
        "",
        "communication per step (one GPU):",
        _table(
            ["dim", "collective", "calls", "bytes/call", "link", "seconds", "overlapped"],
            [
                [
                    r["dim"],
                    r["collective"],
                    r["calls"],
                    f"{r['bytes_per_call'] / 2**20:.2f} MiB",
                    r["link"],
                    f"{r['seconds']:.4f}",
                    "yes" if r["overlapped"] else "",
                ]
                for r in rep["comm_per_step"]
            ],
        ),
    ]
    t = rep["step_time"]
    exposed = ", ".join(
        f"{d} {t[f'exposed_{d}_s']:.3f}" for d in ("tp", "sp", "cp", "ep", "pp", "dp") if t.get(f"exposed_{d}_s")
    )
    if "calibration" in rep:
        out += [
            "",
            f"step time {t['step_time_s']:.4f} s (calibrated: {len(rep['calibration']['sources'])} measured run(s)) = "
            f"compute {t['compute_s']:.4f} + bubble {t['bubble_s']:.4f} + exposed comm ({exposed or 'none'}) + "
            f"fixed {t['fixed_s']:.4f}; contention x{t['contention_factor']:.2f}",
        ]
        return "\n".join(out)
    hidden = ", ".join(
        f"{d} {t[f'hidden_{d}_s']:.3f}" for d in ("tp", "sp", "cp", "ep", "pp", "dp") if t.get(f"hidden_{d}_s")
    )
    parts = t.get("compute_parts_s") or {}
    layers = t.get("stage_layers") or []
    out += [
        "",
        f"step time {t['step_time_s']:.3f} s = compute {t['compute_s']:.3f} + bubble {t['bubble_s']:.3f} "
        f"(fraction {rep['bubble_fraction']:.3f}) + exposed comm ({exposed or 'none'}) + optimizer "
        f"{t.get('optimizer_s', 0.0):.3f}; MFU {t['mfu']:.1%} (model FLOPs {t['model_flops']:.3g}, hardware "
        f"{t['hardware_flops']:.3g})",
        f"  compute ({t.get('compute_model', 'flat')}): "
        + ", ".join(f"{k} {v:.3f}" for k, v in parts.items() if v)
        + (f"; stage layers {'/'.join(f'{n:g}' for n in layers)}" if len(set(layers)) > 1 else ""),
        f"  hidden behind compute: {hidden or 'nothing'}",
    ]
    return "\n".join(out)


def _fail(message: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"valid": False, "errors": [message], "warnings": []}, ensure_ascii=False))
    else:
        print(f"error: {message}", file=sys.stderr)
    return 2


def _from_import(args: argparse.Namespace, argv: list[str]):
    """The model and plan from a Megatron-LM script, torchtitan TOML or plan JSON; the world size
    from --nodes when given, else from the file (torchrun --nnodes x --nproc_per_node, ...)."""
    imported = import_plan(args.import_file, config=args.import_config)
    model = imported.model or model_from_args(args)  # a bare plan JSON names no model
    if imported.gpus_per_node and args.gpus_per_node is None and imported.cluster is None:
        args.gpus_per_node = imported.gpus_per_node
    if imported.cluster is not None and not any(a.split("=")[0] == "--cluster" for a in argv):
        base = imported.cluster
    else:
        nodes, args.nodes = args.nodes, 1
        base = cluster_from_args(args, 1)
        args.nodes = nodes
    imported, cluster = place(imported, base, args.nodes)
    args.swiglu = args.swiglu or imported.options.get("swiglu")
    plan = imported.plan
    given = given_plan_values(args)
    if given:  # plan flags beside --import override the file's fields
        plan = plan_from_values({**plan.to_dict(), **given})
        imported = dataclasses.replace(
            imported, notes=(*imported.notes, "overridden on the command line: " + ", ".join(sorted(given)))
        )
    return model, plan, cluster, imported


def _import_text(summary: dict) -> str:
    out = ["", f"imported from {summary['source']} ({summary['kind']}): world size from {summary['world_from']}"]
    out += [f"  unknown: {', '.join(summary['unknown'])}"] if summary["unknown"] else []
    out += [f"  note: {n}" for n in summary["notes"]]
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        if args.import_file:
            model, plan, cluster, imported = _from_import(args, argv)
        else:
            model, plan = model_from_args(args), plan_from_args(args)
            cluster = cluster_from_args(args, plan.world_size)
        options = options_from_args(args)
    except (SpecError, ValueError, OSError) as err:
        return _fail(str(err), args.json)
    rep = plan_report(plan, model, cluster, options)
    if args.calibration and rep["valid"]:
        try:
            _calibrated(rep, model, plan, args.calibration, cluster)
        except ValueError as err:
            return _fail(str(err), args.json)
    if args.import_file:
        rep["imported"] = imported.summary()
    text = None if args.json else render_text(rep) + (_import_text(rep["imported"]) if args.import_file else "")
    print(json.dumps(rep, ensure_ascii=False) if args.json else text)
    return 0 if rep["valid"] else 2
