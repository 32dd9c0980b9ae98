"""Every chart of every page holds data its axes can show.

For each registered page, opened with the sample run in the URL (the run views) and on its own, each
Altair chart's Vega-Lite spec is walked unit by unit (layers, facets, concatenations) with the data
it draws: a positional channel (x, y, x2, y2, xOffset, yOffset) bound to a quantitative column must
have no ±Infinity and no NaN in the rows that reach the mark (after the unit's simple equality
filters); an explicit scale domain on such a channel must hold that data, unless the mark clips
(a zoomed window); and nothing is drawn from an empty dataset (Vega's "Infinite extent" warning).
The browser pass (test_browser.py) checks the same pages for console warnings and clipped text.
"""

from __future__ import annotations

import re
import shutil

import altair as alt
import numpy as np
import pandas as pd
import pytest

from profiler import TraceAnalysis
from tests.conftest import SHARED_TRACES
from tests.support.apptest import VegaChart, page_test, registered_pages, vega_charts
from tests.ui.test_pages_runs import SAMPLE_PLAN, install_run

POSITIONAL = ("x", "y", "x2", "y2")
PAGES = [p["path"] for p in registered_pages()]
RUN_PLAN = {**SAMPLE_PLAN, "run": "sample"}
FILTER = re.compile(r"^datum\.(\w+) (==|!=) '([^']*)'$")


def _units(node, data=None, clip=False):
    """(unit spec, its data name, whether its mark clips) for every unit view under `node`."""
    if not isinstance(node, dict):
        return
    data = (node.get("data") or {}).get("name", data)
    mark = node.get("mark")
    if mark is not None:
        yield node, data, bool(isinstance(mark, dict) and mark.get("clip"))
    for key in ("layer", "vconcat", "hconcat", "concat"):
        for child in node.get(key, []):
            yield from _units(child, data)
    if "spec" in node:
        yield from _units(node["spec"], data)


def _rows(frame: pd.DataFrame, unit: dict) -> pd.DataFrame:
    """The rows a unit draws: its `datum.f == 'v'` / `!=` filters applied (others left as they are)."""
    for t in unit.get("transform", []):
        m = FILTER.match(str(t.get("filter", ""))) if isinstance(t.get("filter"), str) else None
        if m and m.group(1) in frame:
            col, op, value = m.group(1), m.group(2), m.group(3)
            keep = frame[col].astype(str) == value
            frame = frame[keep if op == "==" else ~keep]
    return frame


def _check_chart(chart, where: str) -> int:
    spec, checked = chart.spec, 0
    for unit, data, clip in _units(spec):
        frame = chart.datasets.get(data) if data else chart.datasets.get("__data__")
        if frame is None:
            continue
        rows = _rows(frame, unit)
        enc = unit.get("encoding", {})
        for channel in POSITIONAL:
            e = enc.get(channel)
            if isinstance(e, dict) and channel.endswith("2") and isinstance(enc.get(channel[0]), dict):
                e = {**enc[channel[0]], "field": e.get("field")}  # x2 shares x's type and scale
            if not isinstance(e, dict) or e.get("type") != "quantitative" or e.get("field") not in rows:
                continue
            if e.get("aggregate") or "bin" in e:
                continue
            values = pd.to_numeric(rows[e["field"]], errors="coerce").to_numpy(dtype=float)
            assert not np.isinf(values).any(), f"{where}: {channel}={e['field']} has Infinity"
            assert not np.isnan(values).any(), f"{where}: {channel}={e['field']} has NaN or non-numbers"
            domain = (e.get("scale") or {}).get("domain")
            if isinstance(domain, list) and len(domain) == 2 and not clip and len(values):
                lo, hi = (float(d) for d in domain)
                if e.get("scale", {}).get("type") != "log":
                    span = (hi - lo) * 1e-6
                    assert values.min() >= lo - span and values.max() <= hi + span, (
                        f"{where}: {channel}={e['field']} data [{values.min()}, {values.max()}] outside the "
                        f"axis [{lo}, {hi}]"
                    )
            checked += 1
        if enc and not len(rows) and any(k in enc for k in POSITIONAL):
            fields = [enc[k].get("field") for k in POSITIONAL if isinstance(enc.get(k), dict)]
            if any(f in frame for f in fields):  # a layer whose filter leaves nothing: an infinite extent
                raise AssertionError(f"{where}: a layer draws no rows ({fields})")
    return checked


@pytest.fixture(scope="module")
def with_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    install_run(runs, "sample")
    return runs


@pytest.mark.parametrize("page", PAGES)
def test_every_chart_holds_data_its_axes_can_show(page, with_run, monkeypatch):
    monkeypatch.setenv("PARASCOPE_RUNS", str(with_run))
    monkeypatch.setenv("PARASCOPE_UPLOADS", str(with_run.parent / "uploads"))
    checked = 0
    for query in ({}, RUN_PLAN if page != "pages/timeline.py" else {"run": "sample"}):
        at = page_test(page, query, timeout=120)
        assert not at.exception, [e.value for e in at.exception]
        for i, chart in enumerate(vega_charts(at)):
            checked += _check_chart(chart, f"{page} {query.get('run', 'plan')} chart {i}")
    if page in ("pages/timeline.py", "pages/topology.py", "pages/tp_scaling.py", "pages/activation_memory.py"):
        assert checked > 0, f"{page}: no positional data checked"


def test_the_checker_finds_what_it_looks_for():
    """It would have caught an axis that hides its data, Infinity, and a layer filtered to nothing."""

    def chart(frame, *, domain=None, filter_to=None):
        base = alt.Chart(frame).mark_point()
        if filter_to is not None:
            base = base.transform_filter(f"datum.kind == '{filter_to}'")
        x = alt.X("v:Q", scale=alt.Scale(domain=domain)) if domain else alt.X("v:Q")
        spec = base.encode(x=x, y="w:Q").to_dict()
        name = spec["data"]["name"]
        return VegaChart(spec, {name: frame})

    good = pd.DataFrame({"v": [1.0, 2.0], "w": [0.0, 1.0], "kind": ["a", "b"]})
    assert _check_chart(chart(good), "good") == 2
    with pytest.raises(AssertionError, match="outside the axis"):
        _check_chart(chart(good, domain=[0, 1.5]), "clipped")
    with pytest.raises(AssertionError, match="Infinity"):
        _check_chart(chart(good.assign(v=[1.0, np.inf])), "inf")
    with pytest.raises(AssertionError, match="draws no rows"):
        _check_chart(chart(good, filter_to="measured"), "empty layer")


def _shared_set(runs, name: str):
    """A real set of ../shared/traces copied in as a traces-only set (as an upload lands), or None."""
    src = SHARED_TRACES / name
    if not src.is_dir():
        return None
    dest = runs / f"shared-{name}" / "traces"
    if not dest.exists():
        dest.mkdir(parents=True)
        for f in src.iterdir():
            if f.name.endswith((".json", ".json.gz")):
                shutil.copy(f, dest / f.name)
    return f"shared-{name}"


@pytest.mark.parametrize("source", ["sample", "hta_nccl_parser_config", "hta_df_index_resolver"])
def test_timeline_charts_show_the_analyzers_tables(source, with_run, monkeypatch):
    """The Collective timeline's pictures against the tables they claim to show: the per-rank stacked
    bar sums to the breakdown's window, the overview's busy time per rank and class matches the
    analyzer's unmerged events, and every chart holds finite data inside its axes -- on our run and on
    real uploaded GPU traces."""
    monkeypatch.setenv("PARASCOPE_RUNS", str(with_run))
    monkeypatch.setenv("PARASCOPE_UPLOADS", str(with_run.parent / "uploads"))
    set_id = source if source == "sample" else _shared_set(with_run, source)
    if set_id is None:
        pytest.skip(f"../shared/traces/{source} is not present")
    at = page_test("pages/timeline.py", {"run": set_id, "tl_step": "all"}, timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    charts = vega_charts(at)
    for i, chart in enumerate(charts):
        _check_chart(chart, f"timeline {source} chart {i}")
    a = TraceAnalysis.load(with_run / set_id)
    bd = a.breakdown
    parts = next(c for c in charts if "part" in c.frame())
    shown = parts.frame().groupby("rank")["ms"].sum()
    window = bd.groupby("rank")["window_ns"].sum() / 1e6
    assert shown.to_numpy() == pytest.approx(window.loc[shown.index].to_numpy(), rel=1e-6)
    # the overview (merged to a few spans per rank) and the detail (the same whole-step window at a
    # finer level of detail) show each class's busy time alike, per rank
    over = next(c for c in charts if "brush" in c.text())  # its rects' data, not the critical path's
    overview = next(f for f in over.datasets.values() if "busy_ms" in f.columns)
    detail = next(c for c in charts if '"pick"' in c.text()).frame()

    def busy(frame):
        return frame.groupby([frame["rank"], frame["category"].astype(str)], observed=True)["busy_ms"].sum()

    coarse, fine = busy(overview), busy(detail)
    assert set(coarse.index) == set(fine.index)
    assert coarse.to_numpy() == pytest.approx(fine.loc[coarse.index].to_numpy(), rel=1e-4, abs=1e-3)
    assert overview["n_events"].sum() <= detail["n_events"].sum() or len(overview) < len(detail)
