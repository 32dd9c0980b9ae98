"""Plan pages opened on a trace set whose model ParaScope does not know (an upload of a DLRM-like job: eight
V100 ranks, no plan, no model) ask for the model first and show no stand-in's numbers as the job's: no
memory, step time or MFU, no memory error, no preset's name, until the user picks one. The layout, which
needs no model, stays (Topology draws the job's rank grid and its measured values)."""

from __future__ import annotations

import pytest

from parallel.core.plan import Plan
from tests.support.apptest import page_test, vega_charts
from tests.support.upload_sets import write_upload

PAGES = ("pages/topology.py", "pages/activation_memory.py", "pages/tp_scaling.py")
HEADLINE = {"Memory per GPU", "Step time", "MFU"}
ASKED = "Which model did this job train?"


@pytest.fixture
def uploads(tmp_path, monkeypatch):
    folder = tmp_path / "uploads"
    monkeypatch.setenv("PARASCOPE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PARASCOPE_UPLOADS", str(folder))
    return folder


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def _shown(at) -> list[tuple[str, str]]:
    """(element type, text) of the main area's elements in page order, nested blocks flattened."""
    out = []

    def walk(node):
        for child in node.children.values():
            if hasattr(child, "children"):  # a block: columns, containers, expanders
                walk(child)
            else:
                value = getattr(child, "value", None)
                text = value if isinstance(value, str) else getattr(child, "label", "") or ""
                out.append((type(child).__name__, text))

    walk(at.main)
    return out


def _asks_first(at) -> None:
    """The title, then the question: nothing in between says anything about the plan."""
    texts = [(k, t) for k, t in _shown(at) if k not in ("UnknownElement",)]
    assert texts[0] == ("Title", at.title[0].value)
    assert texts[1][0] == "Warning" and ASKED in texts[1][1], texts[:3]


def _nothing_of_a_stand_in(at) -> None:
    assert not {m.label for m in at.metric} & HEADLINE, [m.label for m in at.metric]
    assert not at.error, [e.value for e in at.error]
    text = " ".join(t for _, t in _shown(at)) + " ".join(c.value for c in at.caption)
    assert "gpt3-175b" not in text and "exceeds the GPU" not in text
    assert "model" not in at.query_params


@pytest.mark.parametrize("page", PAGES)
def test_a_plan_page_on_an_upload_of_an_unknown_model_asks_for_it_first(uploads, page):
    sid = write_upload(uploads, "dlrm")
    at = _ok(page_test(page, {"run": sid}))
    _asks_first(at)
    _nothing_of_a_stand_in(at)
    assert "dlrm names no model ParaScope knows" in at.warning[0].value
    assert at.query_params["dp"] == "8" and at.query_params["run"] == sid  # the job's layout, a guess said
    assert at.selectbox(key="plan_ask_model").value is None and at.selectbox(key="plan.model").value is None
    assert any(c.value.startswith("model unknown on dgx-h100 1×8 GPUs") for c in at.caption)
    charts = len(vega_charts(at))
    assert charts == (2 if page == "pages/topology.py" else 0)  # the layout and its measured values need no model

    at.selectbox(key="plan_ask_model").select("llama3-8b").run()
    _ok(at)
    assert at.query_params["model"] == "llama3-8b" and at.query_params["dp"] == "8"
    assert HEADLINE <= {m.label for m in at.metric}
    assert not any(ASKED in w.value for w in at.warning)
    assert any(c.value.startswith("llama3-8b on dgx-h100 1×8 GPUs") for c in at.caption)
    assert len(vega_charts(at)) >= max(charts, 1)  # the model's charts join the layout's


def test_the_sidebar_picks_the_model_too_and_a_copied_link_still_asks(uploads):
    sid = write_upload(uploads, "dlrm")
    at = _ok(page_test("pages/activation_memory.py", {"run": sid}))
    link = dict(at.query_params)  # what a user copies: the job's layout, no model
    again = _ok(page_test("pages/tp_scaling.py", link))
    _asks_first(again)
    _nothing_of_a_stand_in(again)
    at.selectbox(key="plan.model").select("gpt3-22b").run()
    _ok(at)
    assert at.query_params["model"] == "gpt3-22b"
    assert {m.label for m in at.metric} >= HEADLINE and not any(ASKED in w.value for w in at.warning)


@pytest.mark.parametrize(
    ("model", "asks"),
    [("llama3-8b", None), ("dlrm-dcnv2", "dlrm names no model ParaScope knows (its plan calls it dlrm-dcnv2)")],
)
def test_an_upload_with_a_plan_asks_only_when_its_model_is_no_preset(uploads, model, asks):
    sid = write_upload(uploads, "dlrm", plan=Plan(dp=8, global_batch=8).to_dict(), model=model)
    at = _ok(page_test("pages/topology.py", {"run": sid}))
    if asks is None:
        assert at.query_params["model"] == model and HEADLINE <= {m.label for m in at.metric}
        assert not any(ASKED in w.value for w in at.warning)
    else:
        _asks_first(at)
        _nothing_of_a_stand_in(at)
        assert asks in at.warning[0].value
