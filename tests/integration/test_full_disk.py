"""A full disk during a profile run: `profiler run --out` on a 3 MB tmpfs ends
the job cleanly -- exit 1, one error line naming the device problem and the path, no traceback,
run.json `failed`, nothing left in .partial/ -- and a killed cache write's temporary folder is
removed by the next write. Needs root (mount); skipped elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from profiler.traces import cache
from tests.conftest import ROOT


@pytest.fixture
def tiny_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_a_run_that_fills_the_disk_fails_cleanly(tiny_disk):
    out = tiny_disk / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "profiler",
            "run",
            "--dp",
            "2",
            "--tp",
            "2",
            "--sp",
            "--global-batch",
            "8",
            "--steps",
            "6",
            f"--out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"no space left on device ({out}" in errors[0], r.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and "no space left on device" in record["error"]["message"]
    assert not (out / ".partial").exists()


def test_a_killed_cache_write_is_cleaned_up_by_the_next(tmp_path):
    stale, fresh = tmp_path / ".tmp-killed", tmp_path / ".tmp-writing"
    for d in (stale, fresh):
        d.mkdir()
        (d / "events.arrow").write_bytes(b"\0" * 1000)
    old = time.time() - cache.STALE_TMP_S - 60
    os.utime(stale, (old, old))
    assert cache.remove_stale_temporaries(tmp_path) == 1
    assert not stale.exists() and fresh.exists()  # a write in progress is left alone
