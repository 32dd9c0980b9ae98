"""`python -m profiler whatif RUN_OR_TRACES [scenarios] [--json]`: a measured trace replayed with changes.

    python -m profiler whatif runs/demo                              # the measured step, reproduced
    python -m profiler whatif runs/slow --rank-speed 3=median --json # rank 3 at its peers' median speed
    python -m profiler whatif runs/lab --link inter=2                # the inter-node link twice as fast
    python -m profiler whatif runs/demo --overlap dp --microbatches 16

Scenarios (repeatable, combined):
    --rank-speed R=median | R=F   rank R's own time at the median of its stage's peers, or F x faster
    --link KEY=K                  transfers K x faster on link tier intra / inter, or of a dimension
    --overlap DIM                 that dimension's communication fully hidden
    --microbatches M              the same global batch in M microbatches (the pipeline bubble scales)

--json prints profiler.analyzers.whatif's object (measured_step_time_s, predicted_step_time_s, the
per-phase breakdown of both, the scenarios and what each assumes, the critical path, the pipeline's
bubble vs P2P wait per stage). Bad input exits 2 with one line on stderr.
Pure: no torch.
"""

from __future__ import annotations

import argparse
import sys

import orjson

from parallel.cli.dispatch import prog_name
from parallel.core.comm import DIMS
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.replay import Scenario
from profiler.analyzers.whatif import StepNotTraced, whatif
from profiler.cli.analyze import _plan, _ranks
from profiler.traces.errors import TraceError
from profiler.traces.loader import load_traces


class ScenarioError(ValueError):
    pass


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog_name("python -m profiler whatif"), description="replay a measured trace with changes"
    )
    ap.add_argument("path", nargs="+", help="run directory, folder, trace file(s), or .zip/.tar.gz")
    ap.add_argument(
        "--plan",
        help="Plan JSON (or a run.json with a 'plan'), a Megatron-LM launch script or a torchtitan TOML: "
        "stages and microbatches",
    )
    ap.add_argument("--rank-speed", action="append", default=[], metavar="R=median|F")
    ap.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="KEY=K",
        help="KEY: intra, inter, a dimension, or unknown (ops no plan labels)",
    )
    ap.add_argument("--overlap", action="append", default=[], metavar="DIM", choices=sorted({*DIMS, "unknown"}))
    ap.add_argument("--microbatches", type=int, default=None, metavar="M")
    ap.add_argument(
        "--step", type=int, default=None, metavar="N", help="measure and replay ProfilerStep#N (default: every step)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rank", action="append", default=[], metavar="FILE=R", help="as in profiler analyze")
    ap.add_argument("--no-cache", action="store_true", help="neither read nor write the parse cache")
    return ap


def _pair(item: str, flag: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key or not value:
        raise ScenarioError(f"{flag} {item!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def _factor(value: str, where: str, expected: str) -> float:
    """A positive factor, or the ScenarioError that says which flag and what it expected."""
    try:
        f = float(value)
    except ValueError:
        raise ScenarioError(f"{where}: expected {expected}") from None
    if not 0 < f < 1e6:
        raise ScenarioError(f"{where}: the factor must be > 0")
    return f


def scenario_from_args(args: argparse.Namespace, ranks: list[int]) -> Scenario:
    """The Scenario the flags describe; ScenarioError names the flag that is wrong and why."""
    speed: dict = {}
    for item in args.rank_speed:
        key, value = _pair(item, "--rank-speed")
        if not key.isdigit() or int(key) not in ranks:
            raise ScenarioError(
                f"--rank-speed {item!r}: rank {key} is not in the traces (ranks {ranks[0]}..{ranks[-1]})"
            )
        speed[int(key)] = (
            value
            if value == "median"
            else _factor(value, f"--rank-speed {item!r}", "'median' or a speed factor like 1.5")
        )
    link: dict = {}
    for item in args.link:
        key, value = _pair(item, "--link")
        if key not in ("intra", "inter", *DIMS, "unknown"):
            raise ScenarioError(f"--link {item!r}: KEY is intra, inter, unknown or one of {', '.join(DIMS)}")
        link[key] = _factor(value, f"--link {item!r}", "a number K, e.g. inter=2")
    if args.microbatches is not None and args.microbatches < 1:
        raise ScenarioError(f"--microbatches {args.microbatches}: expected 1 or more")
    return Scenario(rank_speed=speed, link=link, overlap=frozenset(args.overlap))


def _text(out: dict) -> str:
    lines = [
        f"measured step  {out['measured_step_time_s'] * 1e3:,.2f} ms   ("
        + ("median over traced steps" if out["step"] is None else f"step {out['step']}")
        + " of the mean over ranks of the files' ProfilerStep range)",
        f"predicted step {out['predicted_step_time_s'] * 1e3:,.2f} ms"
        + (f"   ({out['change_pct']:+.1f}%)" if out["change_pct"] is not None else ""),
    ]
    for s in out["scenarios"]:
        shown = ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("kind", "assumes", "note"))
        lines.append(f"  {s['kind']}: {shown}")
        lines.append(f"    assumes: {s['assumes']}")
        if s.get("note"):
            lines.append(f"    note: {s['note']}")
    lines += ["", "what changed:"] + [f"  {c}" for c in out["changed"]]
    path = out["critical_path"].get("measured") or {}
    if path:
        lines += [
            "",
            f"critical path of step {path['step']}: {path['length_s'] * 1e3:,.2f} ms over ranks {path['ranks']}, "
            f"{path['rank_switches']} rank switches",
        ]
        lines += [f"  {k:<12}{v * 1e3:>10,.2f} ms" for k, v in path["by_category"].items()]
    if out["pipeline"]:
        lines += [
            "",
            f"  {'stage':>5}{'work':>10}{'bubble':>10}{'p2p wait':>10}{'p2p xfer':>10}{'bubble %':>10}"
            f"{'wait %':>10}{'theory %':>10}",
        ]
        for r in out["pipeline"]:
            lines.append(
                f"  {r['stage']:>5}{r['work_ms']:>10,.1f}{r['bubble_ms']:>10,.1f}{r['p2p_wait_ms']:>10,.1f}"
                f"{r['p2p_transfer_ms']:>10,.1f}{r['bubble_fraction'] * 100:>10,.1f}"
                f"{r['p2p_wait_fraction'] * 100:>10,.1f}{r['theory_fraction'] * 100:>10,.1f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        _plan(args.plan)  # a bad plan file fails before the traces are parsed
        source = args.path if len(args.path) > 1 else args.path[0]
        traces = load_traces(source, ranks=_ranks(args.rank), cache=not args.no_cache)
        analysis = TraceAnalysis(traces, _plan(args.plan, traces.world_size))
        scenario = scenario_from_args(args, analysis.traces.rank_ids)
        out = whatif(
            analysis.graph, scenario, plan=analysis.layout_plan, microbatches=args.microbatches, step=args.step
        )
    except (TraceError, ScenarioError, StepNotTraced) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncancelled", file=sys.stderr)
        return 130
    sys.stdout.write(orjson.dumps(out).decode() + "\n" if args.json else _text(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
