"""The first start: a fresh install has no runs, so the dashboard profiles a small real job itself.

    start_demo(runs_dir)   # the demo run's id (its directory name under runs_dir), started if needed

Over `profiler.collect.demo.ensure_demo_run`: an 8-rank DP2 × TP2 × PP2 + SP job of the tiny
model in the background, in a session of its own; it returns at once, and a second caller (another
tab) gets the same run. Pure-ish: stdlib (no streamlit).
"""

from __future__ import annotations

from pathlib import Path

from profiler.collect import demo


def start_demo(runs_dir: Path) -> str:
    return Path(demo.ensure_demo_run(runs_dir)).name
