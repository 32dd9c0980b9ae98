"""What the benchmarks share: the checkout's root and one way to run a project command in a fresh
process (each measured command gets its own interpreter, as a user's would)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_module(*args: str, timeout: int = 900) -> str:
    """`python -m ARGS` from the checkout's root; its stdout, or exit with its stderr's tail."""
    r = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{r.stderr[-3000:]}")
    return r.stdout
