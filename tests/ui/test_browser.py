"""A real browser over every page: `streamlit run app.py` in a subprocess, Debian's headless Chromium
driven by Playwright's Python API (never `playwright install`).

Pages are read from app.py's navigation (tests.support.apptest.registered_pages), so a page anyone registers
is covered without editing this file. The server's runs folder (PARASCOPE_RUNS) holds a real run
(tests/ui/test_pages_runs.py's sample) and a failed copy of it, so the run pages are also visited with a
run selected through the URL (RUN_VIEWS). For each page: load it, wait until the script has finished,
assert no exception box and no JavaScript error, every Vega chart drawn at a non-zero size, and
save a full-page screenshot under test-artifacts/browser/.

    .venv/bin/python -m pytest tests/ui/test_browser.py -m slow
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from parallel.core.plan import Plan
from profiler.cli import calibrate
from profiler.collect import uploads as uploads_mod
from tests.support import trace_samples as ts
from tests.support.apptest import ROOT, registered_pages
from tests.support.ports import free_port
from tests.ui.test_pages_runs import install_run

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
PAGES = registered_pages()
START_TIMEOUT_S = 90
PAGE_TIMEOUT_MS = 180_000  # generous: CI machines are shared and slow

pytestmark = pytest.mark.slow


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"streamlit did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def _streamlit(tmp_path_factory, env: dict | None = None):
    """The dashboard on a free port; stopped (its whole process group) on exit."""
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.headless",
        "true",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture(scope="module")
def dashboard_data(tmp_path_factory) -> dict:
    """Runs and uploads folders for the server: the sample run, a failed copy with its rank's log, and a
    calibration fitted from the sample run."""
    root = tmp_path_factory.mktemp("dashboard")
    runs = root / "runs"
    runs.mkdir()
    install_run(runs, "sample")
    broken = install_run(
        runs, "broken", status="failed", error={"rank": 1, "message": "RuntimeError: injected at step 2"}
    )
    (broken / "logs").mkdir(exist_ok=True)
    (broken / "logs" / "rank1.log").write_text("step 1 ok\nRuntimeError: injected at step 2\n")
    # a calibration fitted from the sample run, as Home's form or `profiler calibrate` writes it: the run
    # pages then show the calibrated prediction beside the measured step
    assert calibrate.main([str(runs / "sample"), f"--out={runs / 'calibration.json'}"]) == 0
    return {"PARASCOPE_RUNS": str(runs), "PARASCOPE_UPLOADS": str(root / "uploads")}


@pytest.fixture(scope="module")
def server(tmp_path_factory, dashboard_data):
    with _streamlit(tmp_path_factory, env=dashboard_data) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--headless",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield b
        finally:
            b.close()


def _wait_for_script(page) -> None:
    """Until the app has connected, run the page script, stopped, and drawn every element (lazy
    element code replaces its grey `stSkeleton` placeholders, seconds later on a busy machine);
    seen twice in a row 0.5 s apart, since the plan form's URL update can trigger one more run."""
    page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]', timeout=PAGE_TIMEOUT_MS)
    deadline = time.monotonic() + PAGE_TIMEOUT_MS / 1000
    settled, state, skeletons = 0, None, None
    while time.monotonic() < deadline:
        state = page.get_attribute('[data-testid="stApp"]', "data-test-script-state")
        skeletons = page.locator('[data-testid="stSkeleton"]').count()
        settled = settled + 1 if state == "notRunning" and skeletons == 0 else 0
        if settled >= 2:
            return
        page.wait_for_timeout(500)
    raise AssertionError(
        f"page not settled after {PAGE_TIMEOUT_MS / 1000:.0f} s: script {state!r}, {skeletons} placeholders left"
    )


def _screenshot(page, path: Path) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    height = page.evaluate(
        "() => Math.max(...[...document.querySelectorAll('[data-testid=stMain], "
        "[data-testid=stSidebarContent]')].map(e => e.scrollHeight), 1000)"
    )
    page.set_viewport_size({"width": 1500, "height": min(int(height) + 40, 9000)})
    page.wait_for_timeout(500)  # charts re-lay out to the new size
    page.screenshot(path=str(path), full_page=True)


def _chart_sizes(page) -> list[tuple[float, float]]:
    """(width, height) of the drawn canvas/svg of every Vega chart on the page."""
    return page.eval_on_selector_all(
        '[data-testid="stVegaLiteChart"]',
        """charts => charts.map(c => {
               const g = c.querySelector('canvas, svg.marks');
               if (!g) return [0, 0];
               const r = g.getBoundingClientRect();
               return [r.width, r.height];
           })""",
    )


# Heavier views of registered pages, drawn too: (screenshot name, page path, URL path + query).
EXTRA_VIEWS = [
    ("topology-4096-gpus", "pages/topology.py", "topology?nodes=512&dp=64&tp=8&pp=8&gb=1536"),
    (
        "topology-4096-gpus-pp64",
        "pages/topology.py",
        "topology?model=gpt3-1t&cluster=dgx-h100&nodes=512&gpn=8&dp=8&tp=8&pp=64&sp=1&mb=1&gb=3072",
    ),
    (  # 1,024 GB200s: 256 trays of 4 in 15 NVL72 racks, each drawn as a labelled band
        "topology-gb200-nvl72-1024-gpus",
        "pages/topology.py",
        "topology?model=gpt3-175b&cluster=gb200-nvl72&dp=16&tp=8&pp=8&sp=1&gb=1536&topo_groups=DP",
    ),
    (
        "long_context-llama3-70b",
        "pages/long_context.py",
        "long_context?model=llama3-70b&nodes=8&dp=4&tp=8&pp=2&sp=1&zero=1&gb=8&recompute=selective&lc_cp=16",
    ),
]
# Run-dependent views, with the sample run (or its failed copy) named in the URL.
_RUN_PLAN = "model=tiny&cluster=local-cpu&nodes=1&dp=2&tp=2&pp=1&cp=1&sp=1&mb=1&gb=4&run=sample"
RUN_VIEWS = [
    ("home-run", "pages/home.py", "?run=sample"),
    ("home-failed-run", "pages/home.py", "?run=broken"),
    ("timeline-run", "pages/timeline.py", "timeline?run=sample"),
    ("timeline-run-zoomed", "pages/timeline.py", "timeline?run=sample&tl_step=2&win=5,25"),
    ("topology-run", "pages/topology.py", f"topology?{_RUN_PLAN}"),
    ("activation_memory-run", "pages/activation_memory.py", f"activation_memory?{_RUN_PLAN}"),
    ("tp_scaling-run", "pages/tp_scaling.py", f"tp_scaling?{_RUN_PLAN}"),
]
EXTRA_VIEWS += RUN_VIEWS
PLAN_PAGES_WITH_RUNS = {"pages/topology.py", "pages/activation_memory.py", "pages/tp_scaling.py"}
VIEWS = [{"name": Path(p["path"]).stem, "path": p["path"], "url": p["url_path"]} for p in PAGES] + [
    {"name": n, "path": p, "url": u} for n, p, u in EXTRA_VIEWS if any(e["path"] == p for e in PAGES)
]


# Streamlit's frontend, opened on a page's URL, first asks for /<page>/_stcore/health and host-config
# (it tries the page name as a base path) and then for /_stcore/...: two 404s on every page, a
# confirmed upstream bug (streamlit/streamlit#7074) that no app code can avoid.
UPSTREAM_404 = re.compile(r"/[\w-]+/_stcore/(health|host-config)$")


def _clipped_text(page) -> list[str]:
    """Metric labels, values and deltas whose text is cut (scrollWidth past the box) at this width."""
    return page.evaluate(
        """() => [...document.querySelectorAll(
              '[data-testid=stMetricValue], [data-testid=stMetricLabel], [data-testid=stMetricDelta]')]
            .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText.slice(0, 80))"""
    )


@pytest.mark.parametrize("entry", VIEWS, ids=[v["name"] for v in VIEWS])
def test_page_renders_in_chromium(server, browser, entry):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    js_errors: list[str] = []
    console: list[str] = []  # warnings and errors: Vega's "Infinite extent", a failed request, ...
    failed: list[str] = []
    page.on("pageerror", lambda err: js_errors.append(str(err)))
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("warning", "error") else None)
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    try:
        page.goto(f"{server}/{entry['url']}", wait_until="domcontentloaded", timeout=PAGE_TIMEOUT_MS)
        _wait_for_script(page)
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        for i in range(charts.count()):  # vega-embed draws asynchronously after the script ends
            charts.nth(i).locator("canvas, svg.marks").first.wait_for(timeout=PAGE_TIMEOUT_MS)
        clipped = _clipped_text(page)  # at 1400 px, before the screenshot widens the viewport
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        _screenshot(page, ARTIFACTS / f"{entry['name']}.png")
        exceptions = page.locator('[data-testid="stException"]')
        assert exceptions.count() == 0, exceptions.first.inner_text()
        assert not js_errors, js_errors
        sizes = _chart_sizes(page)
        assert all(w > 0 and h > 0 for w, h in sizes), f"charts not drawn: {sizes}"
        title = page.locator("h1").first.inner_text(timeout=PAGE_TIMEOUT_MS)
        assert title.strip(), "page has no title"
        ours = [u for u in failed if not UPSTREAM_404.search(u.split("?")[0])]
        assert not ours, f"requests that failed: {ours}"
        noise = [m for m in console if not (failed and "Failed to load resource" in m)]
        assert not noise, f"console warnings or errors: {noise}"
        assert not clipped, f"text cut at 1400 px: {clipped}"
        if entry["name"] in {v[0] for v in RUN_VIEWS}:  # the URL's run was found and shown
            body = page.inner_text("body")
            assert "There is no run or uploaded set called" not in body
            assert ("Measured:" in body) == (entry["path"] in PLAN_PAGES_WITH_RUNS)
        if entry["name"] == "topology-gb200-nvl72-1024-gpus":  # the racks are named, the grid drawn whole
            body = page.inner_text("body")
            assert "15 NVLink domains (racks) of 18 nodes × 4 GPUs = 72 GPUs" in body
            assert "NVLink domain (rack) 0: nodes 0–17, 72 GPUs" in body and "Nodes shown GPU by GPU" not in body
        if entry["name"] == "home-run":  # predicted beside measured, with the error and the phases drawn
            metric = page.locator('[data-testid="stMetric"]', has_text="Predicted step (calibrated)")
            text = metric.inner_text()
            assert re.search(r"\d+\.\d{3} s", text) and re.search(r"[+-]\d+\.\d% vs measured", text), text
            assert len(sizes) >= 1
    finally:
        page.close()


def test_timeline_brush_zooms_the_detail_view(server, browser):
    """Dragging across the overview re-queries the detail view for that window and puts it in the URL."""
    if not any(p["path"] == "pages/timeline.py" for p in PAGES):
        pytest.skip("Collective timeline not registered")
    page = browser.new_page(viewport={"width": 1500, "height": 1200})
    try:
        page.goto(f"{server}/timeline?run=sample", timeout=PAGE_TIMEOUT_MS)
        _wait_for_script(page)
        plot = page.locator('[data-testid="stVegaLiteChart"]').first.locator("canvas, svg.marks").first
        plot.wait_for(timeout=PAGE_TIMEOUT_MS)
        box = plot.bounding_box()
        y = box["y"] + box["height"] * 0.2  # inside the plot, above the axis and legend
        page.mouse.move(box["x"] + box["width"] * 0.4, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=8)
        page.mouse.up()
        page.wait_for_function("() => location.search.includes('win=')", timeout=PAGE_TIMEOUT_MS)
        _wait_for_script(page)
        heading = page.locator("h3", has_text="Detail:").first.inner_text()
        assert not heading.startswith("Detail: 0.0–"), heading  # the detail view now starts inside the step
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def test_plan_pages_share_the_plan_through_the_url(server, browser):
    """A copied URL reopens the same plan and view; switching pages in the sidebar keeps the plan."""
    if not any(p["path"] == "pages/topology.py" for p in PAGES):
        pytest.skip("Topology page not registered")
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(
            f"{server}/topology?model=gpt3-22b&nodes=2&dp=2&tp=2&pp=4&gb=64&topo_color=DP&topo_groups=PP",
            timeout=PAGE_TIMEOUT_MS,
        )
        _wait_for_script(page)
        body = page.inner_text("body")
        assert "gpt3-22b on dgx-h100 2×8 GPUs · DP2 TP2 PP4 gb64" in body
        assert "DP coordinate" in body and "PP group link" in body  # the view's choices came from the URL
        assert "cluster=dgx-h100" in page.url and "gpn=8" in page.url  # the link's plan, placed, is written back
        page.get_by_role("link", name="Activation memory").click()
        page.wait_for_function("() => location.pathname.endsWith('/activation_memory')", timeout=PAGE_TIMEOUT_MS)
        _wait_for_script(page)
        assert "DP2 TP2 PP4 gb64" in page.inner_text("body")
        assert "dp=2" in page.url and "tp=2" in page.url
    finally:
        page.close()


def test_shared_link_on_a_fresh_server_keeps_the_navigation(tmp_path_factory, browser):
    """The first request of a fresh server is a deep link: Streamlit would run the page in its
    legacy pages/ mode (file names in the sidebar, no app.py); ui.routing.ensure_navigation
    reruns it through app.py, keeping the link's plan."""
    if not any(p["path"] == "pages/topology.py" for p in PAGES):
        pytest.skip("Topology page not registered")
    with _streamlit(tmp_path_factory) as url:
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        try:
            page.goto(f"{url}/topology?model=gpt3-22b&nodes=2&dp=2&tp=2&pp=4&gb=64", timeout=PAGE_TIMEOUT_MS)
            _wait_for_script(page)
            nav = page.locator('[data-testid="stSidebarNav"]').inner_text(timeout=PAGE_TIMEOUT_MS)
            assert "Topology" in nav and "topology" not in nav.split()  # app.py's titles, not file names
            assert "DP2 TP2 PP4 gb64" in page.inner_text("body")
        finally:
            page.close()


def test_enter_in_a_run_a_job_field_starts_nothing(server, browser, dashboard_data):
    """Pressing Enter in the form's fields submitted it (4 unintended jobs); only the
    start button starts a job."""
    jobs_dir = Path(dashboard_data["PARASCOPE_RUNS"]) / ".jobs"
    before = sorted(jobs_dir.glob("*.json")) if jobs_dir.is_dir() else []
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(f"{server}/run_job", timeout=PAGE_TIMEOUT_MS)
        _wait_for_script(page)
        for label in ("Steps", "Run label (optional)"):
            field = page.get_by_label(label, exact=True)
            field.click()
            field.press("Enter")
            page.wait_for_timeout(1500)
            _wait_for_script(page)
        after = sorted(jobs_dir.glob("*.json")) if jobs_dir.is_dir() else []
        assert after == before, "Enter started a job"
        assert "Started **" not in page.inner_text("body")
    finally:
        page.close()


def _upload(uploads: Path, name: str, world: int, **plan) -> str:
    """A set stored as the Upload page stores one: `world` gloo ranks of a plain data-parallel job
    whose traces name no group (one all-reduce over every rank); with `plan`, its plan attached."""
    files = [(f"rank{r}_trace.json", json.dumps(ts.gloo_cpu(r, world)).encode()) for r in range(world)]
    checked = uploads_mod.check_files(files)
    assert not checked.rejected, checked.rejected
    uploads_mod.store(
        name, checked.accepted, uploads=uploads, plan=Plan(**plan) if plan else None, model="tiny" if plan else None
    )
    return "upload:" + name


def _body(browser, url: str) -> str:
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(url, timeout=PAGE_TIMEOUT_MS)
        _wait_for_script(page)
        assert page.locator('[data-testid="stException"]').count() == 0
        return page.inner_text("body")
    finally:
        page.close()


def test_an_uploaded_set_is_labelled_from_evidence_only(server, browser, dashboard_data):
    """A 4-rank upload without a plan: its collectives are 'world', never a dimension, and the pages say
    what they stand on (a guess of the layout, no model named); with a plan attached, its labels and
    model follow the plan."""
    uploads = Path(dashboard_data["PARASCOPE_UPLOADS"])
    bare = _upload(uploads, "ddp-bare", 4)
    planned = _upload(uploads, "ddp-planned", 4, dp=4, global_batch=4)
    body = _body(browser, f"{server}/timeline?run={bare}")
    assert (
        "1 spans all ranks ('world')" in body and "give the job's plan or launch script" in body
    )  # once, not x4 ranks
    body = _body(browser, f"{server}/topology?run={bare}")
    assert "ddp-bare came without a plan" in body and "this is a guess, DP4" in body
    assert "names no model ParaScope knows" in body and "Which model did this job train?" in body
    body = _body(browser, f"{server}/timeline?run={planned}")
    assert "span all ranks ('world')" not in body and "tell the parallel dimension" not in body
    body = _body(browser, f"{server}/topology?run={planned}")
    assert "tiny on" in body and "DP4" in body
    assert "came without a plan" not in body and "Which model did this job train?" not in body


def test_a_ten_thousand_rank_upload_loads_with_progress_while_the_server_answers(server, browser, dashboard_data):
    """10,000 ranks (one zip, a few events each, stored as the Upload page stores a set) opened cold:
    the page shows a progress bar, then the first ranks while the rest loads, then every rank; the
    health endpoint answers throughout (the analysis runs in a process of its own)."""
    world, name = 10_000, "ranks-10k"
    folder = Path(dashboard_data["PARASCOPE_UPLOADS"]) / name
    (folder / "traces").mkdir(parents=True)
    with zipfile.ZipFile(folder / "traces" / "set.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for r in range(world):
            zf.writestr(f"rank{r}_trace.json", json.dumps(ts.gloo_cpu(r, world)))
    size = (folder / "traces" / "set.zip").stat().st_size
    manifest = {"name": name, "created_at": "", "world_size": world, "ranks": list(range(world))}
    manifest["files"] = [{"name": "set.zip", "bytes": size, "ranks": list(range(world))}]
    (folder / "manifest.json").write_text(json.dumps(manifest))

    waits: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            t = time.monotonic()
            with urllib.request.urlopen(f"{server}/_stcore/health", timeout=60) as r:
                assert r.status == 200
            waits.append(time.monotonic() - t)
            stop.wait(0.2)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server}/timeline?run=upload:{name}", timeout=PAGE_TIMEOUT_MS)
        page.locator('[data-testid="stProgress"]').first.wait_for(timeout=PAGE_TIMEOUT_MS)
        page.get_by_text("Ranks 0–63, first").wait_for(timeout=PAGE_TIMEOUT_MS * 2)
        loading = len(waits)
        page.get_by_text(f"All {world:,} ranks").wait_for(timeout=PAGE_TIMEOUT_MS * 3)
        _wait_for_script(page)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.get_by_text("Ranks 0–63, first").count() == 0  # the preview gave way to the page
        assert "10,000" in page.inner_text("body")
    finally:
        page.close()
        stop.set()
        prober.join(timeout=90)
    assert len(waits) > loading > 0, "the health endpoint stopped answering during the load"
    assert max(waits) < 10, f"the health endpoint took {max(waits):.1f} s to answer during the load"
