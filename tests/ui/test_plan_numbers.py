"""A plan's memory per GPU and step time are the same on Plan review's card and on every plan page its links
open, under the review's modelling assumptions too (a flat MFU, a fixed DP overlap): the links carry them,
and the plan form shows them as controls (the browser pass, tests/ui/test_browser_plan_numbers.py, clicks
through the default review)."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from tests.support.apptest import page_test

REVIEW = {
    "model": "gpt3-22b",
    "cluster": "dgx-h100",
    "nodes": "2",
    "plan": ["A|dp=2,tp=8,pp=1,sp=1,gb=64", "B|dp=2,tp=4,pp=2,sp=1,gb=64,zero=1,recompute=selective,tpo=1,gro=1"],
}
PLAN_PAGES = {
    "Topology": "pages/topology.py",
    "Activation memory": "pages/activation_memory.py",
    "TP scaling": "pages/tp_scaling.py",
    "Long context": "pages/long_context.py",
}


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def _value(at, label: str) -> list[str]:
    return [m.value for m in at.metric if m.label.lower() == label.lower()]


@pytest.mark.parametrize(
    "assumptions", [{}, {"mfu": "0.4"}, {"dp_overlap": "0.5"}], ids=["model's own", "flat MFU", "fixed DP overlap"]
)
def test_every_linked_page_shows_the_cards_numbers(assumptions):
    review = _ok(page_test("pages/plan_review.py", {**REVIEW, **assumptions}))
    steps, memories = _value(review, "step time"), _value(review, "memory per GPU")
    links = [link.proto for link in review.get("page_link")]
    by_plan = [links[i : i + len(PLAN_PAGES)] for i in range(0, len(links), len(PLAN_PAGES))]
    assert len(by_plan) == 2 and len(set(steps)) == 2  # two plans, told apart by their step
    for step, memory, plan_links in zip(steps, memories, by_plan):
        for link in plan_links:
            query = dict(parse_qsl(link.query_string))
            assert {k: query.get(k) for k in assumptions} == assumptions, link.query_string
            at = _ok(page_test(PLAN_PAGES[link.label], query))
            assert (_value(at, "Step time"), _value(at, "Memory per GPU")) == ([step], [memory]), link.label


def test_the_plan_form_sets_the_assumptions_and_the_link_keeps_them():
    plan = {"model": "gpt3-22b", "nodes": "2", "dp": "2", "tp": "8", "gb": "64"}
    at = _ok(page_test("pages/activation_memory.py", plan))
    before = _value(at, "Step time")
    at.radio(key="plan.compute").set_value("mfu").run()
    at.slider(key="plan.mfu").set_value(0.3).run()
    _ok(at)
    assert at.query_params["mfu"] == "0.3" and _value(at, "Step time") != before
    again = _ok(page_test("pages/tp_scaling.py", dict(at.query_params)))  # a copied link
    assert again.radio(key="plan.compute").value == "mfu" and again.slider(key="plan.mfu").value == 0.3
    assert _value(again, "Step time") == _value(at, "Step time")
    assert any("every operator at 30% MFU" in c.value for c in again.caption)
    at.radio(key="plan.compute").set_value("device").run()
    assert "mfu" not in at.query_params and _value(at, "Step time") == before
    bad = _ok(page_test("pages/topology.py", {**plan, "mfu": "7"}))
    assert any("mfu=7.0 must be in" in e.value for e in bad.error) and "mfu" not in bad.query_params
    assert bad.radio(key="plan.compute").value == "device"
