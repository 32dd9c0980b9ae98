"""AppTest of the Hang page: a run here whose fr/ holds Flight Recorder dumps of a stuck rank -- the
diagnosis, the rank grid with the suspect outlined, the suspects and groups tables, the suspect's log."""

import json

import pytest

from parallel.core.plan import Plan
from tests.support.apptest import page_test, vega_charts
from tests.support.fr_dumps import Fault, job_dumps, write_dumps

PAGE = "pages/hang.py"


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    run = root / "hung"
    write_dumps(run / "fr", job_dumps(world=8, tp=2, steps=3, fault=Fault("missing", rank=5, dim="tp", seq=4)))
    hosts = {str(r): {"node": r // 4, "local_rank": r % 4} for r in range(8)}
    (run / "run.json").write_text(json.dumps({"plan": Plan(dp=4, tp=2, global_batch=4).to_dict(), "hosts": hosts}))
    (run / "logs").mkdir()
    (run / "logs" / "rank5.log").write_text("step 1\nstuck in the data loader\n")
    monkeypatch.setenv("PARASCOPE_RUNS", str(root))
    return root


def test_a_runs_dumps_diagnosed_drawn_and_its_log_shown(runs):
    at = page_test(PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert any(e.value.startswith("Rank 5 on node 1 never issued all") for e in at.error)
    assert any(c.value.startswith("Rank 5 on node 1 never issued all_reduce #4") for c in at.code)  # to copy
    (grid,) = vega_charts(at)
    cells = grid.frame()
    assert len(cells) == 8 and set(cells.loc[cells["suspect"] != "", "rank"]) == {5}
    assert cells.set_index("rank").loc[5, "last"] == 3 and cells.set_index("rank").loc[4, "last"] == 6
    suspects = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    assert suspects.iloc[0]["rank"] == 5 and suspects.iloc[0]["dim"] == "tp"
    assert any("stuck in the data loader" in c.value for c in at.code)


def test_no_dumps_says_how_to_get_some(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_RUNS", str(tmp_path / "empty"))
    at = page_test(PAGE)
    assert not at.exception
    assert any("Upload one JSON dump per rank" in i.value for i in at.info)
