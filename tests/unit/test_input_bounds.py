"""Numbers and names read from files, URLs and flags are bounded where they are read:
plans of any size are summarised without per-rank structures the answer does not need, searches
enumerate divisors in O(sqrt n) and refuse absurd sizes, ranks and world sizes in traces are capped
before anything is sized by them, trace errors are one line whatever a file is called, a trace
without collectives analyses to an empty table, and user text shown in Markdown renders as text."""

from __future__ import annotations

import json
import json as _json
import re

import pytest

from parallel.cli import plan as plan_cli
from parallel.core.plan import MAX_WORLD_SIZE, Plan
from parallel.core.report import LISTED, plan_report
from parallel.core.specs import CLUSTERS, MODELS, Model, SpecError
from parallel.engine.api import memory_errors
from parallel.importers import ImportFailed, import_text
from parallel.search.space import Constraints, divisors, search
from profiler import TraceAnalysis, TraceError, load_traces
from profiler.collect import jobs
from profiler.collect.trace_sets import read_upload
from profiler.lab import sweep_views as sweep_data
from runfiles.metrics import load_metrics
from runfiles.rundir import MAX_RUN_JSON_BYTES, load_json_object, read_json
from ui.text import error_md, md

EVENTS = [
    {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
    {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 5, "pid": 1, "tid": 1},
]


def test_divisors_are_exact_and_fast_for_large_n():
    assert all(divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 600))
    assert divisors(2**31 - 1) == [1, 2**31 - 1]  # a prime: ~46k trial divisions, not 2 billion


def test_a_million_gpu_plan_lists_a_bounded_sample_with_whole_counts():
    plan = Plan(dp=16384, tp=8, pp=8, global_batch=16384)
    rep = plan_report(plan, MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].sized_for(plan.world_size))
    assert rep["world_size"] == 2**20 and rep["truncated"] is True
    assert len(rep["ranks"]) == LISTED and rep["ranks"][9]["rank"] == 9
    assert rep["group_counts"] == {"dp": 64, "pp": 131072, "cp": 2**20, "tp": 131072}
    assert all(len(g) <= LISTED for g in rep["groups"].values())
    assert len(rep["groups"]["dp"][0]["ranks"]) == LISTED  # a 16,384-rank group: its first LISTED ranks
    assert rep["crossing_groups"]["tp"] == 0 and rep["crossing_groups"]["dp"] == 64


def test_a_small_plan_still_lists_every_rank_and_group():
    plan = Plan(dp=2, tp=4, pp=2, global_batch=8)
    rep = plan_report(plan, MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].sized_for(16))
    assert rep["truncated"] is False and len(rep["ranks"]) == 16
    assert [len(rep["groups"][d]) for d in ("tp", "pp", "dp", "cp")] == [4, 8, 8, 16]


@pytest.mark.parametrize("kwargs", [{"dp": MAX_WORLD_SIZE, "tp": 2}, {"global_batch": 2**40}])
def test_plans_beyond_the_bounds_are_refused_with_their_numbers(kwargs):
    with pytest.raises(SpecError, match=r"\d"):
        Plan(**kwargs)


@pytest.mark.parametrize(
    "gpus, batch, message", [(2**30, 1536, "GPUs; plans are limited"), (512, 10**18, "global batch")]
)
def test_search_refuses_absurd_sizes_at_once(gpus, batch, message):
    cluster = CLUSTERS["dgx-h100"].sized_for(gpus)
    with pytest.raises(SpecError, match=message):
        search(MODELS["gpt3-175b"], cluster, batch, Constraints())


def _write(path, doc):
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "name, doc, message",
    [
        ("r_rank123456789012_trace.json", {"traceEvents": EVENTS}, "beyond the"),
        (
            "ws_rank0.json",
            {"traceEvents": EVENTS, "distributedInfo": {"rank": 0, "world_size": 3 * 10**8}},
            "beyond the",
        ),
        ("deep_rank0.json", '{"traceEvents":[' + "[" * 20000 + "]" * 20000 + "]}", "nested too deeply"),
        ("two\nlines\x1b[31m_rank0.json", "{oops", "not valid JSON"),
    ],
)
def test_hostile_traces_are_one_typed_line(tmp_path, name, doc, message):
    with pytest.raises(TraceError, match=message) as info:
        load_traces(_write(tmp_path / name, doc), cache=False)
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)


def test_odd_device_ids_and_a_trace_without_collectives_analyse(tmp_path):
    doc = {
        "traceEvents": EVENTS,
        "deviceProperties": [{"id": [1], "name": "x"}, {"id": {"a": 1}}],
        "distributedInfo": {"rank": 0, "world_size": 1},
    }
    summary = TraceAnalysis(load_traces(_write(tmp_path / "one_rank0.json", doc), cache=False)).summary()
    assert summary["collectives"] == [] and summary["per_rank"][0]["compute_us"] == 5.0


INJECTIONS = [
    "![t](http://127.0.0.1:9/track.png)",
    "[Click to re-login](http://127.0.0.1:9/)",
    "<img src=x onerror=alert(1)>",
    ":red[alarm] :material/warning: $x^2$",
    "# Heading\n> quote\n- item\n1. first\n***",
    "see www.example.com or mail a@b.c, `code`, **bold**, ~~gone~~ | a | b |",
]


def shown(markdown: str) -> str:
    """The text a CommonMark renderer shows for escaped text: escapes removed, zero-width spaces gone."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u200b", "")


@pytest.mark.parametrize("text", INJECTIONS)
def test_user_text_in_markdown_is_shown_as_itself(text):
    out = md(text)
    assert shown(out) == text  # nothing lost, nothing added
    assert not re.search(r"(?<!\\)[\[\]<>`*_$|~!]", out)  # every construct-starting mark escaped
    assert "://" not in out and "www." not in out and not re.search(r":[a-z]", out)  # no autolink, no :shortcode
    assert not re.search(r"(?m)^\s*([#>+\-=]|\d+[.)]\s)", out)  # no heading, quote, list or rule


def test_an_import_error_shows_its_file_line_apart_and_as_written():
    """The line an importer quotes below its message is a code block (Markdown joins a bare newline into
    the sentence: "state-space layers 33 | --mamba-num-heads"), its backticks unable to close it."""
    text = "MODEL_ARGS='--num-layers 4 --hybrid-layer-pattern M*M*`````x --hidden-size 64'\n"
    with pytest.raises(ImportFailed) as err:
        import_text(text, "h_[x].sh")
    out = error_md(err.value)
    head, _, block = out.partition("\n\n")
    assert shown(head) == str(err.value).splitlines()[0] and "--hybrid-layer-pattern" in head
    assert "\\[x\\]" in head  # the sentence is escaped as md escapes it
    fence, *body, close = block.split("\n")
    assert fence == close == "``````" and body == [f"       1 | {text.rstrip()}"]  # longer than the 5 inside
    assert error_md("one line") == md("one line") and error_md("x\n") == "x"


def test_a_global_batch_that_cannot_fit_this_machine_is_refused_before_any_rank_starts():
    tiny = MODELS["tiny"]
    (err,) = memory_errors(tiny, Plan(dp=2, global_batch=2**30), ranks_here=2, available=24 << 30)
    assert "--global-batch 1,073,741,824" in err and "2 ranks" in err and "GB is available" in err
    assert memory_errors(tiny, Plan(dp=2, global_batch=8), ranks_here=2, available=24 << 30) == []


def test_a_runs_json_files_are_read_bounded_and_must_be_objects(tmp_path):
    """Every reader of a run's JSON files (run.json, metrics.json, a job record, a sweep, an upload's
    manifest) goes through one bounded reader: a file past the bound, a non-object or broken JSON is a
    one-line ValueError (or None where a poll reads it again), never a whole-file read or a crash."""
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"step_time_s": [0.1, 0.2]}))
    assert load_metrics(tmp_path) == {"step_time_s": [0.1, 0.2]} == read_json(path)
    path.write_text(" " * 65 + "{}")
    with pytest.raises(ValueError, match="larger than 64 bytes"):
        load_json_object(path, max_bytes=64)
    assert read_json(path, max_bytes=64) is None and read_json(path) == {}
    for text, reason in (("[1, 2]", "a JSON list, not an object"), ("{", "Expecting"), ("[" * 100_000, "too deeply")):
        path.write_text(text)
        with pytest.raises(ValueError, match=reason):
            load_metrics(tmp_path)
        assert read_json(path) is None
    with open(path, "wb") as f:  # one byte past the bound, sparse: refused without parsing
        f.truncate(MAX_RUN_JSON_BYTES + 1)
    with pytest.raises(ValueError, match=f"larger than {MAX_RUN_JSON_BYTES >> 20} MiB"):
        load_metrics(tmp_path)
    (tmp_path / jobs.JOBS).mkdir()
    (tmp_path / jobs.JOBS / "j1.json").write_text('["not", "a", "job"]')
    assert jobs.load(tmp_path, "j1") is None  # a record that is not an object: no job, no crash
    (tmp_path / "sweep.json").write_text("[]")
    with pytest.raises(sweep_data.SweepError, match="not an object"):
        sweep_data.load_sweep(tmp_path / "sweep.json")
    (tmp_path / "manifest.json").write_text('"text"')
    assert read_upload(tmp_path) is None


def test_a_model_shape_past_any_model_names_the_field_the_value_and_the_bound(tmp_path, capsys):
    with pytest.raises(SpecError, match=r"Model.hidden 1,000,000,000,000 is past any model: at most 1,048,576"):
        Model(name="x", layers=2, hidden=10**12, heads=8, vocab=100, seq_len=128)
    path = tmp_path / "plan.json"
    shape = {"name": "x", "layers": 2, "hidden": 64, "heads": 8, "vocab": 100, "seq_len": 10**30}
    path.write_text(_json.dumps({"plan": {"dp": 1, "global_batch": 1}, "model": shape}))
    assert plan_cli.main(["--import", str(path)]) == 2
    err = capsys.readouterr().err
    assert "seq_len" in err and "at most 268,435,456" in err and "Traceback" not in err
