"""Real hangs: `profiler run --inject-hang` on 4-rank gloo jobs (a DP, a TP and a PP group), every
rank's Flight Recorder dump collected into fr/, and `profiler hang` naming the rank, the group's
dimension, the collective and the kind -- and, where PyTorch's flight_recorder reads the same dumps,
the same fault."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.unit.test_hang import reference_findings

pytestmark = pytest.mark.slow

CASES = {  # plan flags, --inject-hang, (rank, dim, kind, op)
    "dp-op": (["--dp=4"], "2:2:op", (2, "dp", "op_mismatch", "all_reduce")),
    "tp-size": (["--tp=2", "--dp=2", "--sp"], "1:2:size", (1, "tp", "size_mismatch", "all_reduce")),
    "pp-skip": (["--pp=2", "--dp=2"], "3:2:skip", (3, "pp", "missing", "recv")),
}


@pytest.fixture(scope="module", params=list(CASES))
def hung(request, tmp_path_factory):
    flags, inject, want = CASES[request.param]
    out = tmp_path_factory.mktemp(request.param) / "run"
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "run", "--model=tiny", *flags, "--global-batch=4", "--steps=4"]
        + [f"--inject-hang={inject}", "--timeout=10", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    return out, want


def test_every_rank_dumped_and_the_diagnosis_names_the_fault(hung):
    out, (rank, dim, kind, op) = hung
    assert sorted(p.name for p in (out / "fr").glob("rank*.json")) == [f"rank{r}.json" for r in range(4)]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "hang", str(out), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    first = report["suspects"][0]
    assert (first["rank"], first["dim"], first["kind"], first["op"]) == (rank, dim, kind, op), report["diagnosis"]
    assert first["node"] == 0 and report["diagnosis"].startswith(f"Rank {rank} on node 0 ")


def test_pytorchs_flight_recorder_names_the_same_collective_fault(hung, tmp_path):
    out, (rank, dim, kind, op) = hung
    if kind == "missing" and dim == "pp":
        pytest.skip("gloo records no point-to-point ops: the reference sees the PP group's collectives only")
    found = reference_findings(out / "fr", tmp_path / "pickles")
    # the reference takes the first rank it reads as the expected one; where that is the odd one out it
    # blames the others of the group instead
    assert any(k == kind and (blamed == {rank} or rank not in blamed) for k, _, blamed in found), found
