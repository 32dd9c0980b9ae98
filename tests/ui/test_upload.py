"""Uploads (profiler.collect.uploads and the Upload page): each bad file rejected with the trace loader's message
while the good ones are kept; sets stored whole, under a name, never overwriting another; a plan
attached for dimension labels; a stored set opens from Home and in the Collective timeline.
The good files are the real traces of tests/ui/test_pages_runs.py's sample run.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path

import pytest

from parallel.core.plan import Plan
from profiler import load_traces
from profiler.collect import runs_calibration, trace_sets, uploads
from tests.support.apptest import page_test, vega_charts
from tests.support.fr_dumps import job_dumps
from tests.ui.test_pages_runs import sample_run


@pytest.fixture(scope="module")
def good() -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted((sample_run() / "traces").glob("rank*_trace.json.gz"))]


def _other_job(data: bytes, world: int) -> bytes:
    trace = json.loads(gzip.decompress(data))
    trace["distributedInfo"]["world_size"] = world
    return gzip.compress(json.dumps(trace).encode())


def _bad(good) -> list[tuple[str, bytes]]:
    return [
        ("notes.txt", b"hello"),
        ("broken.json", b'{"traceEvents": ['),
        ("rank5_trace.json.gz", good[0][1][: len(good[0][1]) // 2]),  # cut off mid-stream
        ("copy_of_rank0.json.gz", good[0][1]),
    ]  # rank 0 again


def test_bad_files_are_rejected_with_the_loaders_message_and_good_ones_kept(good):
    checked = uploads.check_files(good + _bad(good))
    assert [a.name for a in checked.accepted] == [n for n, _ in good]
    assert checked.ranks == [0, 1, 2, 3] and checked.world_size == 4
    why = dict(checked.rejected)
    assert set(why) == {"notes.txt", "broken.json", "rank5_trace.json.gz", "copy_of_rank0.json.gz"}
    assert "not a trace file" in why["notes.txt"]
    assert why["broken.json"].startswith("broken.json: ") and "JSON" in why["broken.json"]
    assert "truncated" in why["rank5_trace.json.gz"]
    assert "rank 0 appears twice" in why["copy_of_rank0.json.gz"]


def test_files_of_another_job_are_rejected(good):
    checked = uploads.check_files([good[0], ("rank1_trace.json.gz", _other_job(good[1][1], 8))])
    assert [a.name for a in checked.accepted] == [good[0][0]]
    assert "world size 8" in checked.rejected[0][1] and "different jobs" in checked.rejected[0][1]


def test_an_archive_is_one_upload(good):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in good:
            z.writestr(f"job/{name}", data)
    checked = uploads.check_files([("job.zip", buf.getvalue())])
    assert checked.ranks == [0, 1, 2, 3] and not checked.rejected


def test_store_writes_the_set_whole_and_never_overwrites(tmp_path, good):
    checked = uploads.check_files(good)
    plan = Plan(dp=2, tp=2, sp=True, global_batch=4)
    path = uploads.store(
        "my-set", checked.accepted, uploads=tmp_path, plan=plan, model="tiny", rejected=[("x.txt", "not a trace")]
    )
    assert sorted(p.name for p in (path / "traces").iterdir()) == [n for n, _ in good]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["world_size"] == 4 and manifest["rejected"] == [{"name": "x.txt", "message": "not a trace"}]
    assert json.loads((path / "plan.json").read_text())["plan"]["tp"] == 2
    with pytest.raises(uploads.UploadError, match="already exists"):
        uploads.store("my-set", checked.accepted, uploads=tmp_path)
    with pytest.raises(uploads.UploadError, match="use 1-64 letters"):
        uploads.store("../escape", checked.accepted, uploads=tmp_path)
    with pytest.raises(uploads.UploadError, match="4×2×1×1 = 8 ranks"):
        uploads.store("wrong-plan", checked.accepted, uploads=tmp_path, plan=Plan(dp=4, tp=2, global_batch=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-set"]  # no half-written set, no temp folder left
    s = trace_sets.find_set("upload:my-set", uploads=tmp_path)
    assert (s.kind, s.status, s.world_size, s.plan_label, s.trace_files) == (
        "upload",
        "uploaded",
        4,
        "DP2 TP2+SP gb4",
        4,
    )


def test_plan_from_a_run_json_or_megatron_script():
    run_json = json.dumps({"plan": {"dp": 2, "tp": 2, "sp": True, "global_batch": 4}, "model": "tiny"})
    plan, model = uploads.plan_from_file("run.json", run_json, 4)
    assert (plan.dp, plan.tp, plan.sp, model.name) == (2, 2, True, "tiny")
    script = (
        "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64"
    )
    plan, model = uploads.plan_from_file("train.sh", script, 8)
    assert (plan.dp, plan.tp, plan.pp) == (2, 2, 2)
    assert (model.layers, model.hidden, model.heads, model.seq_len) == (4, 64, 4, 64)  # the script's shape, kept


# ------------------------------------------------------------------------------------------ the page


@pytest.fixture
def dirs(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PARASCOPE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PARASCOPE_UPLOADS", str(tmp_path / "uploads"))
    return tmp_path / "uploads"


def test_upload_page_without_files_says_what_to_drop(dirs):
    at = page_test("pages/upload.py")
    assert not at.exception
    assert "MB per file" in at.caption[0].value and at.file_uploader[0].accept_multiple_files
    assert "Drop the traces of one job here" in at.info[0].value


def test_upload_page_keeps_good_files_rejects_bad_ones_and_stores_the_set(dirs, good):
    at = page_test("pages/upload.py")
    at.file_uploader(key="up_files").set_value([(n, d, "application/gzip") for n, d in good + _bad(good)]).run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 4 and any(e.startswith("Rejected **broken.json**: is not valid JSON") for e in errors)
    assert "Kept 4 rank traces (ranks 0–3) of a job of world size 4. 4 rejected" in at.success[0].value
    assert list(at.dataframe[0].value["file"]) == [n for n, _ in good]
    at.radio(key="up_plan").set_value("degrees").run()
    at.number_input(key="up_dp").set_value(2)
    at.number_input(key="up_tp").set_value(2)
    at.toggle(key="up_sp").set_value(True)
    at.selectbox(key="up_model").set_value("tiny")  # with a model, Home can fit a calibration from the set
    at.text_input(key="up_name").set_value("mine").run()
    at.button(key="up_store").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Stored **mine**" in s.value for s in at.success)
    assert at.query_params["run"] == "upload:mine"
    s = trace_sets.find_set("upload:mine")
    assert s is not None and s.plan_label == "DP2 TP2+SP" and s.model == "tiny"
    assert runs_calibration.calibration_candidates([s]) == [s]
    # the stored set opens in the timeline, its collectives labelled by the plan
    tl = page_test("pages/timeline.py", {"run": "upload:mine"})
    assert not tl.exception
    detail = vega_charts(tl)[1].frame()
    assert {"sp", "dp"} <= set(detail["category"].astype(str))
    home = page_test("pages/home.py", {"run": "upload:mine"})
    assert home.selectbox(key="home_pick").value == "upload:mine"
    # storing again under the same name is refused
    at.button(key="up_store").click().run()
    assert any("already exists" in e.value for e in at.error)


def test_an_archive_is_counted_by_the_rank_traces_it_holds(dirs, good):
    """A zip of 4 traces: 4 rank traces kept from 1 file, not '1 file(s)'."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in good:
            zf.writestr(name, data)
    at = page_test("pages/upload.py")
    at.file_uploader(key="up_files").set_value([("job.zip", buf.getvalue(), "application/zip")]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.success[0].value == "Kept 4 rank traces (ranks 0–3) from 1 file of a job of world size 4."


def test_upload_page_with_nothing_readable(dirs):
    at = page_test("pages/upload.py")
    at.file_uploader(key="up_files").set_value([("junk.json", b"not json", "application/json")]).run()
    assert not at.exception
    assert "No file could be read as a trace" in at.warning[0].value and not at.get("button")


def test_flight_recorder_dumps_are_sent_to_the_hang_page(good):
    dump = json.dumps(job_dumps(world=2, tp=2, steps=1)[0]).encode()
    checked = uploads.check_files([good[0], ("rank0.json", dump)])
    assert [a.name for a in checked.accepted] == [good[0][0]]
    assert "a Flight Recorder dump, not a trace" in dict(checked.rejected)["rank0.json"]


def test_a_good_upload_is_decoded_once(good, tmp_path, monkeypatch):
    """Two plain rank files and a zip of the other two: the check loads them as one set into the parse
    cache, and the stored set's views open that parse (no second decode)."""
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in good[2:]:
            zf.writestr(name, data)
    checked = uploads.check_files([*good[:2], ("rest.zip", buf.getvalue())])
    assert not checked.rejected
    assert [(a.name, a.ranks) for a in checked.accepted] == [
        (good[0][0], (0,)),
        (good[1][0], (1,)),
        ("rest.zip", (2, 3)),
    ]
    assert all(a.events > 0 for a in checked.accepted) and checked.world_size == 4
    path = uploads.store("once", checked.accepted, uploads=tmp_path / "uploads")
    traces = load_traces(path / "traces")
    assert traces.from_cache and traces.rank_ids == [0, 1, 2, 3]
