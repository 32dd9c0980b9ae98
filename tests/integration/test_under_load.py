"""The timing-sensitive checks with every core kept busy: the shaped lab link's guarantees and an injected
hang caught and diagnosed, while busy-loop processes (twice the cores) compete for the CPUs -- what a CI
machine shared with other work does to them. Each check is the one its own test makes on a quiet machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from profiler.lab import settings as lab
from tests.conftest import ROOT
from tests.integration.test_lab import check_shaped_link, holding_lab_lock, machine, needs_root

pytestmark = pytest.mark.slow

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture
def busy_cpus():
    """2 x the cores of busy-loop processes for the test's duration (each stops by itself after 10 minutes
    should the test's process die first), stopped by their ids afterwards."""
    n = 2 * (os.cpu_count() or 2)
    procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=600)]) for _ in range(n)]
    time.sleep(0.5)
    assert all(p.poll() is None for p in procs)
    yield n
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=30)


@pytest.fixture
def prefix():
    p = f"pslu{os.getpid() % 0xFFFF:04x}-"
    with holding_lab_lock():
        lab.down(p)
        before = machine()
        yield p
        lab.down(p)
        assert machine() == before


@needs_root
def test_the_shaped_link_holds_its_guarantees_under_load(prefix, busy_cpus):
    check_shaped_link(prefix)


def test_an_injected_hang_is_caught_and_named_under_load(tmp_path, busy_cpus):
    """DP 4, rank 2 issues the wrong collective at step 2: the watchdog fires, every rank dumps, and
    `profiler hang` names rank 2 first -- with the CPUs oversubscribed."""
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "run", "--model=tiny", "--dp=4", "--global-batch=4", "--steps=4"]
        + ["--inject-hang=2:2:op", "--timeout=10", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert sorted(p.name for p in (out / "fr").glob("rank*.json")) == [f"rank{r}.json" for r in range(4)]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "hang", str(out), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)["suspects"][0]
    assert (first["rank"], first["op"]) == (2, "all_reduce"), first
