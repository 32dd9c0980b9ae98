"""A big trace set opened cold in the dashboard, in a real browser: how long until the first chart,
how long until the page settles, the server's peak memory (alone, and with the processes it starts
to prepare the set), and how long `/_stcore/health` took to answer at worst while the set loaded (a
stalled health check is a dashboard frozen for everyone).

    .venv/bin/python -m bench.cold_open                       # 10,000 tiny ranks and 1,024 real-sized ones
    .venv/bin/python -m bench.cold_open --sets tiny10000      # one set

Each set is stored as an upload (its files and a manifest). `tinyN` is N gloo ranks of a few events
each, one world all-reduce (tests/support/trace_samples), zipped; `realN` is bench.scale's copies of
a real 8-rank profiled run (~16k events a rank), one file a rank. Each set is opened on a fresh
server with an empty parse cache; the browser is Debian's Chromium, driven by Playwright. A
benchmark, not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import psutil
from playwright.sync_api import sync_playwright

from bench.scale import base_run, make_set
from tests.support import trace_samples as ts
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def tiny_set(folder: Path, ranks: int) -> Path:
    (folder / "traces").mkdir(parents=True)
    with zipfile.ZipFile(folder / "traces" / "set.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for r in range(ranks):
            zf.writestr(f"rank{r}_trace.json", json.dumps(ts.gloo_cpu(r, ranks)))
    return folder


def real_set(folder: Path, ranks: int, work: Path) -> Path:
    made = make_set(work, base_run(work), ranks)
    shutil.copytree(made, folder / "traces")
    return folder


class _Probe(threading.Thread):
    """Health-check latency and the server process's memory, every 0.2 s."""

    def __init__(self, url: str, pid: int):
        super().__init__(daemon=True)
        self.url, self.proc = url, psutil.Process(pid)
        self.worst_health_s = 0.0
        self.peak_mb = 0.0
        self.peak_tree_mb = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=60).read()
            except OSError:
                pass
            self.worst_health_s = max(self.worst_health_s, time.monotonic() - t)
            try:  # the server process itself, and with the processes it started (the set's preparation)
                self.peak_mb = max(self.peak_mb, self.proc.memory_info().rss / 2**20)
                tree = 0
                for p in [self.proc, *self.proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        tree += p.memory_info().rss
                self.peak_tree_mb = max(self.peak_tree_mb, tree / 2**20)
            except psutil.Error:
                pass
            self.stop.wait(0.2)


def open_cold(name: str, folder: Path, ranks: int) -> dict:
    """Serve `folder` as the only run on a fresh server (fresh cache) and open its timeline."""
    runs = Path(tempfile.mkdtemp(prefix="parascope-cold-"))
    (runs / "uploads").mkdir()
    shutil.move(str(folder), runs / "uploads" / name)
    files = [p for p in (runs / "uploads" / name / "traces").iterdir() if p.is_file()]
    manifest = {
        "name": name,
        "created_at": "",
        "world_size": ranks,
        "ranks": list(range(ranks)),
        "files": [{"name": p.name, "bytes": p.stat().st_size} for p in files],
    }
    (runs / "uploads" / name / "manifest.json").write_text(json.dumps(manifest))
    port = free_port()
    env = {
        **os.environ,
        "PARASCOPE_RUNS": str(runs),
        "PARASCOPE_UPLOADS": str(runs / "uploads"),
        "PARASCOPE_CACHE": str(runs / ".cache"),
    }
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true"]
    cmd += ["--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false"]
    server = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        probe = _Probe(url, server.pid)
        probe.start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            start = time.monotonic()
            page.goto(f"{url}/timeline?run=upload:{name}", timeout=600_000)
            page.locator(
                '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg.marks'
            ).first.wait_for(timeout=900_000)
            first_chart = time.monotonic() - start
            page.wait_for_function(
                "() => document.querySelector('[data-testid=stApp]')?.dataset.testScriptState === 'notRunning'",
                timeout=900_000,
            )
            settled = time.monotonic() - start
            browser.close()
        probe.stop.set()
        probe.join()
        return {
            "set": name,
            "first_chart_s": round(first_chart, 1),
            "settled_s": round(settled, 1),
            "server_peak_mb": round(probe.peak_mb),
            "all_peak_mb": round(probe.peak_tree_mb),
            "worst_health_s": round(probe.worst_health_s, 2),
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        shutil.rmtree(runs, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cold_open", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=["tiny10000", "real1024"], help="tinyN and/or realN")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "parascope-bench-scale")
    args = ap.parse_args(argv)
    print("| set | first chart s | settled s | server peak MB | with its processes MB | worst health s |")
    print("|---|---|---|---|---|---|")
    for name in args.sets:
        folder = Path(tempfile.mkdtemp(prefix="parascope-set-")) / name
        n = int(name.lstrip("tinyreal"))
        made = tiny_set(folder, n) if name.startswith("tiny") else real_set(folder, n, args.work)
        row = open_cold(name, made, n)
        print(
            f"| {row['set']} | {row['first_chart_s']} | {row['settled_s']} | {row['server_peak_mb']} | "
            f"{row['all_peak_mb']} | {row['worst_health_s']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
