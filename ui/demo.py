"""The first start: a fresh install has no runs, so the dashboard profiles a small real job itself.

    start_demo(runs_dir)   # the demo run's id once it is started (or already there); None if it cannot start

Adapter over `profiler.demo.ensure_demo_run` (issue #4). Until that module lands, the same small job
is started through ui.jobs with `python -m profiler run`, when the user asks for it.
Pure-ish: stdlib (no streamlit).
"""

from __future__ import annotations

from pathlib import Path

from . import jobs

DEMO_FLAGS = ["--model", "tiny", "--dp", "2", "--tp", "2", "--pp", "2", "--sp", "--steps", "4"]
DEMO_LABEL = "demo DP2 TP2+SP PP2"


def automatic() -> bool:
    """True when profiler.demo is there to start the demo run without asking."""
    try:
        import profiler.demo  # noqa: F401
    except ImportError:
        return False
    return True


def start_demo(runs_dir: Path) -> str | None:
    """Start (or find) the demo run; its id (its directory name under runs_dir)."""
    runs_dir = Path(runs_dir)
    try:
        from profiler.demo import ensure_demo_run
    except ImportError:
        name = jobs.reserve(runs_dir, DEMO_LABEL)
        jobs.start(jobs.profile_argv(DEMO_FLAGS, runs_dir / name), name=name, runs_dir=runs_dir)
        return name
    found = ensure_demo_run(runs_dir)
    return Path(found).name if found else None
