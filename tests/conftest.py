"""Shared test options and fixtures."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def pytest_addoption(parser):
    parser.addoption(
        "--full-matrix",
        action="store_true",
        default=False,
        help="run the full DPxTPxPPxCP correctness matrix of the engine (slow)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full-matrix"):
        return
    skip = pytest.mark.skip(reason="full matrix: pass --full-matrix")
    for item in items:
        if item.get_closest_marker("full") is not None:  # the marker, not any id that says "full"
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """../shared/traces beside the project, or skip when this checkout has none."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is not present")
    return SHARED_TRACES


def run_module(*args: str, timeout: int = 600) -> str:
    """`python -m ARGS` from the project root; its stdout (the test fails with its stderr otherwise)."""
    r = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
