"""AppTest of the Hang page: a run here whose fr/ holds Flight Recorder dumps of a stuck rank -- the
diagnosis (once), the rank grid with the suspect outlined, the suspects and groups tables, the suspect's
log (once); `?run=NAME` opens that run and choosing a run writes it to the URL; Home links a failed run
with dumps to the page."""

import json
import os
import time

import pytest

from parallel.core.plan import Plan
from tests.support.apptest import page_test, vega_charts
from tests.support.fr_dumps import Fault, job_dumps, write_dumps

PAGE = "pages/hang.py"


def _run(root, name, fault, age_s=0):
    run = root / name
    write_dumps(run / "fr", job_dumps(world=8, tp=2, steps=3, fault=fault))
    hosts = {str(r): {"node": r // 4, "local_rank": r % 4} for r in range(8)}
    plan = Plan(dp=4, tp=2, global_batch=4).to_dict()
    (run / "run.json").write_text(json.dumps({"plan": plan, "hosts": hosts, "status": "failed", "world_size": 8}))
    (run / "logs").mkdir()
    (run / "logs" / f"rank{fault.rank}.log").write_text("step 1\nstuck in the data loader\n")
    stamp = time.time() - age_s
    os.utime(run, (stamp, stamp))
    return run


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    _run(root, "hung", Fault("missing", rank=5, dim="tp", seq=4))
    monkeypatch.setenv("PARASCOPE_RUNS", str(root))
    return root


def test_a_runs_dumps_diagnosed_drawn_and_its_log_shown(runs):
    at = page_test(PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == ["Rank 5 · tp · missing at all_reduce #4: the diagnosis, to paste into an "
                                           "incident channel"]  # fmt: skip
    paragraphs = [c.value for c in at.code if c.value.startswith("Rank 5 on node 1 never issued all_reduce #4")]
    assert len(paragraphs) == 1  # once, to copy
    (grid,) = vega_charts(at)
    cells = grid.frame()
    assert len(cells) == 8 and set(cells.loc[cells["suspect"] != "", "rank"]) == {5}
    assert cells.set_index("rank").loc[5, "last"] == 3 and cells.set_index("rank").loc[4, "last"] == 6
    suspects = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    assert suspects.iloc[0]["rank"] == 5 and suspects.iloc[0]["dim"] == "tp"
    # rank 5 is a suspect in its TP and its DP group: its log is shown once
    assert sum("stuck in the data loader" in c.value for c in at.code) == 1
    assert at.query_params["run"] in ("hung", ["hung"])


def test_the_url_names_the_run_and_choosing_one_writes_it(runs):
    _run(runs, "older", Fault("op_mismatch", rank=2, dim="dp", seq=2), age_s=3600)
    at = page_test(PAGE, {"run": "older"})
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="hang.run").value.name == "older"
    assert any(c.value.startswith("Rank 2 on node 0 issued broadcast") for c in at.code)
    at.selectbox(key="hang.run").select_index(0).run()
    assert at.query_params["run"] in ("hung", ["hung"])
    assert any(c.value.startswith("Rank 5 on node 1 never issued") for c in at.code)


def test_a_failed_run_with_dumps_is_linked_from_home(runs):
    at = page_test("pages/home.py", {"run": "hung"})
    assert not at.exception, [e.value for e in at.exception]
    links = [p for p in at.get("page_link") if p.proto.page.endswith("hang.py") or "hang" in p.proto.label.lower()]
    assert links and links[0].proto.query_string == "run=hung"


def test_no_dumps_says_how_to_get_some(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_RUNS", str(tmp_path / "empty"))
    at = page_test(PAGE)
    assert not at.exception
    assert any("Upload one JSON dump per rank" in i.value for i in at.info)
