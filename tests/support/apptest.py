"""Helpers for page tests: read the charts an `AppTest` run drew, and open any registered page.

    at = page_test("pages/topology.py", {"tp": "2"})     # app.py, switched to the page, run
    charts = vega_charts(at)                             # one VegaChart per st.altair_chart, in order
    charts[0].frame()                                    # its data (a DataFrame, decoded from Arrow)
    charts[0].marks()                                    # {'rect', 'line'}: the spec's mark types

`registered_pages()` reads app.py's `st.Page("pages/…")` entries, so tests (the browser pass
included) cover pages other engineers register without being edited. No streamlit import at
module level: importing this module is cheap.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app.py"


@dataclass
class VegaChart:
    spec: dict
    datasets: dict[str, pd.DataFrame] = field(default_factory=dict)

    def frame(self, name: str | None = None) -> pd.DataFrame:
        """The chart's data: the named dataset, or the only/largest one."""
        if name is not None:
            return self.datasets[name]
        if not self.datasets:
            raise AssertionError("chart has no datasets")
        return max(self.datasets.values(), key=len)

    def marks(self) -> set[str]:
        """Every mark type anywhere in the spec (layers, facets, concatenations)."""
        found: set[str] = set()

        def walk(node):
            if isinstance(node, dict):
                mark = node.get("mark")
                if mark is not None:
                    found.add(mark if isinstance(mark, str) else mark.get("type"))
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk({k: v for k, v in self.spec.items() if k != "datasets"})
        return found

    def text(self) -> str:
        """The spec as JSON (titles, field names, filters) for substring assertions."""
        return json.dumps(self.spec)


def vega_charts(at) -> list[VegaChart]:
    """The Altair/Vega-Lite charts of an AppTest run, with their Arrow datasets decoded."""
    out = []
    for element in at.get("vega_lite_chart"):
        proto = element.proto
        datasets = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in proto.datasets}
        if proto.data.data:
            datasets["__data__"] = pa.ipc.open_stream(proto.data.data).read_all().to_pandas()
        out.append(VegaChart(json.loads(proto.spec), datasets))
    return out


def registered_pages(app: Path = APP) -> list[dict]:
    """app.py's pages in navigation order: [{'path': 'pages/x.py', 'title': ..., 'url_path': ...}]."""
    pages = []
    for node in ast.walk(ast.parse(app.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Page" and node.args:
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            kwargs = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
            path = first.value
            pages.append(
                {
                    "path": path,
                    "title": kwargs.get("title", Path(path).stem),
                    "url_path": "" if kwargs.get("default") else kwargs.get("url_path", Path(path).stem),
                    "default": bool(kwargs.get("default")),
                }
            )
    text = app.read_text()
    pages.sort(key=lambda p: text.find(f'"{p["path"]}"'))  # ast.walk is breadth-first, not source order
    return pages


def page_test(page: str, query: dict[str, str] | None = None, *, timeout: float = 60):
    """An AppTest of app.py, switched to `page` ('pages/x.py'), with `query` as the URL's query
    parameters, already run."""
    # lazy: the chart readers and registered_pages serve tests that must not load streamlit (~1 s)
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page(page)
    return at.run()
