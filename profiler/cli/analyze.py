"""`python -m profiler analyze PATH [--plan PLAN.json] [--json]`: a trace set summarised.

    python -m profiler analyze runs/demo                       # tables for a terminal
    python -m profiler analyze traces.zip --plan plan.json --json

With --json, one object (a contract other tools read):
    world_size, ranks (sorted rank ids), steps (ProfilerStep numbers),
    collectives [{op, dim, count, bytes, time_us}]   aggregated over all ranks; count is the number of
        communication kernels on GPU ranks (one per launch), of CPU collectives on CPU-only ranks
    per_rank [{rank, compute_us, comm_us, exposed_comm_us, idle_us}]   summed over steps
    stragglers [{op, dim, seq, late_rank, skew_us}]   the largest arrival skews (--top)
    rank_step_heat [{rank, step, step_ms, exposed_ms, late_ms, ...}]   every rank x step (the timeline's heat map)
    skew [{dim, op, instances, median_skew_ms, p95_skew_ms, max_skew_ms, most_often_late_rank, times_late}]
        all steps
Every key is snake_case with its unit in the name: docs/json-output.md lists them.
    tp_measured [{tp, sp, link, op, n, bytes, busbw_gbps, busbw_bytes_per_s}]   TP-group collectives

PATH is a run directory, a folder, trace files, or a .zip/.tar.gz. --plan takes a Plan JSON (or a
run.json holding one), a Megatron-LM launch script or a torchtitan TOML (its data parallelism from the
traces' world size, whatever the file's launcher says). Files are parsed by --workers processes (default:
the cores), or as tasks on a Dask cluster with --scheduler tcp://HOST:PORT (or $PARASCOPE_DASK_SCHEDULER);
the JSON is the same.
Bad input exits 2 with one line on stderr; never a traceback. Ctrl-C cancels (exit 130), keeping nothing.
Pure: no torch.
"""

from __future__ import annotations

import argparse
import os
import sys

import orjson

from parallel.cli.dispatch import prog_name
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.run_inputs import plan_file
from profiler.traces.errors import RankError, TraceError
from profiler.traces.loader import default_workers, load_traces, shared_workers


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog_name("python -m profiler analyze"), description="load and analyse per-rank Kineto traces"
    )
    ap.add_argument("path", nargs="+", help="run directory, folder, trace file(s), or .zip/.tar.gz")
    ap.add_argument(
        "--plan",
        help="Plan JSON (or a run.json with a 'plan'), a Megatron-LM launch script or a torchtitan TOML "
        "to label collectives by dimension",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object (see the module docstring)")
    ap.add_argument(
        "--rank",
        action="append",
        default=[],
        metavar="FILE=R",
        help="the rank of a file that has no distributedInfo and no rank in its name (repeatable)",
    )
    ap.add_argument("--top", type=int, default=20, help="stragglers to list (default 20)")
    ap.add_argument(
        "--align",
        choices=("auto", "ranks", "none"),
        default="auto",
        help="clock alignment across hosts (default auto: align hosts on collective ends)",
    )
    ap.add_argument("--no-cache", action="store_true", help="neither read nor write the parse cache")
    ap.add_argument(
        "--workers", type=int, default=None, help="processes parsing trace files at once (default: the cores)"
    )
    ap.add_argument(
        "--scheduler",
        default=os.environ.get("PARASCOPE_DASK_SCHEDULER") or None,
        metavar="tcp://HOST:PORT",
        help="parse on a Dask distributed cluster (its workers must see PATH and the cache at the same paths; "
        "default: $PARASCOPE_DASK_SCHEDULER)",
    )
    ap.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: when stderr is a terminal)",
    )
    return ap


class _Bar:
    """`[#####.....] 12/64 files  name` on stderr, redrawn in place on a terminal, one line per tenth
    of the work elsewhere."""

    WIDTH = 30

    def __init__(self, stream, live: bool):
        self.stream, self.live, self.shown = stream, live, -1

    def __call__(self, done: int, total: int, name: str) -> None:
        filled = self.WIDTH * done // max(total, 1)
        text = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done:,}/{total:,} files parsed  {name[-40:]}"
        if self.live:
            self.stream.write("\r\x1b[K" + text + ("\n" if done >= total else ""))
        elif (tenth := 10 * done // max(total, 1)) > self.shown:
            self.shown = tenth
            self.stream.write(text + "\n")
        self.stream.flush()

    def phase(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def _ranks(items: list[str]) -> dict | None:
    out = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name or not (value.isascii() and value.isdigit()):
            raise RankError(f"--rank {item!r}: expected FILE=RANK, e.g. --rank trace.json.gz=0")
        out[name] = int(value)
    return out or None


def _plan(path: str | None, world_size: int | None = None):
    """The plan dict in --plan (plan_file), or None without one."""
    return None if path is None else plan_file(path, world_size)[0]


def _text(traces, summary: dict, not_collectives: dict) -> str:
    lines = [
        traces.summary(),
        "",
        "collectives (all ranks):",
        f"  {'op':<15}{'dim':<9}{'count':>8}{'bytes':>16}{'time_us':>14}",
    ]
    for c in summary["collectives"]:
        lines.append(f"  {c['op']:<15}{c['dim']:<9}{c['count']:>8}{c['bytes']:>16,}{c['time_us']:>14,.1f}")
    for reason, n in not_collectives.items():
        lines.append(f"  (not counted: {n:,} {reason})")
    lines += [
        "",
        "per rank (us, summed over steps):",
        f"  {'rank':>6}{'compute':>14}{'comm':>14}{'exposed':>14}{'idle':>14}",
    ]
    for r in summary["per_rank"]:
        lines.append(
            f"  {r['rank']:>6}{r['compute_us']:>14,.1f}{r['comm_us']:>14,.1f}"
            f"{r['exposed_comm_us']:>14,.1f}{r['idle_us']:>14,.1f}"
        )
    if summary["stragglers"]:
        lines += ["", "largest arrival skews:", f"  {'op':<15}{'dim':<9}{'seq':>6}{'late rank':>11}{'skew_us':>12}"]
        for s in summary["stragglers"]:
            lines.append(f"  {s['op']:<15}{s['dim']:<9}{s['seq']:>6}{s['late_rank']:>11}{s['skew_us']:>12,.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.top < 0:  # head(-n) would silently drop the n smallest of the list instead
        print(f"error: --top {args.top}: expected a count of 0 or more", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"error: --workers {args.workers}: expected 1 or more processes", file=sys.stderr)
        return 2
    live = sys.stderr.isatty()
    bar = _Bar(sys.stderr, live) if (args.progress if args.progress is not None else live) else None
    workers = args.workers or default_workers()
    try:
        ranks = _ranks(args.rank)
        _plan(args.plan)  # a bad plan file fails before the traces are parsed
        source = args.path if len(args.path) > 1 else args.path[0]
        with shared_workers(workers if not args.scheduler else 1):  # one pool: parse, then each analysis
            traces = load_traces(
                source, ranks=ranks, cache=not args.no_cache, workers=workers, scheduler=args.scheduler, progress=bar
            )
            plan = _plan(args.plan, traces.world_size)  # an imported script's DP follows the traces
            analysis = TraceAnalysis(traces, plan, align=args.align, workers=workers, scheduler=args.scheduler)
            if bar is not None:
                bar.phase(f"analysing {len(analysis.traces.ranks):,} ranks: collectives, matching, breakdown")
            summary = analysis.summary(top=args.top)
    except TraceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncancelled: nothing of this load was kept", file=sys.stderr)
        return 130
    if args.json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        print(_text(analysis.traces, summary, analysis.collectives.attrs.get("not_collectives", {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
