"""README's pictures, made by the real dashboard over real data: the demo profile run and a run
whose rank 2 hangs, served by `streamlit run app.py` and photographed by Debian's headless Chromium
(Playwright's Python API; never `playwright install`).

    .venv/bin/python scripts/screenshots.py [--out docs/images] [--runs DIR]

--runs reuses a runs folder that already holds `demo` and `hang` (else both are made in a temporary
one: about two minutes on 2 cores). Each picture is written to a temporary file and renamed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SHOTS = {  # file name: (page path and query, what to wait for)
    "timeline.png": ("timeline?run=demo", "Collective timeline"),
    "topology.png": ("topology", "Topology"),
    "plan_review.png": ("plan_review", "Plan review"),
    "hang.png": ("hang", "Why did it hang"),
}


def _profile(runs: Path) -> None:
    """The demo run and a hung run, with the project's own commands."""
    python = sys.executable
    if not (runs / "demo" / "run.json").is_file():
        subprocess.run(
            [python, "-m", "profiler", "run", "--model", "tiny", "--dp", "2", "--tp", "2", "--pp", "2", "--sp"]
            + ["--global-batch", "8", "--steps", "6", "--out", str(runs / "demo")],
            cwd=ROOT,
            check=True,
        )
    if not (runs / "hang" / "fr").is_dir():
        subprocess.run(  # exits 1: the job hangs on purpose
            [python, "-m", "profiler", "run", "--model", "tiny", "--dp", "4", "--global-batch", "4"]
            + ["--steps", "4", "--inject-hang", "2:2", "--timeout", "10", "--out", str(runs / "hang")],
            cwd=ROOT,
        )


def _serve(runs: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PARASCOPE_RUNS": str(runs)}
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true"]
    cmd += ["--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit("the dashboard did not start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/screenshots.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    ap.add_argument("--runs", type=Path, default=None)
    ap.add_argument("--port", type=int, default=8599)
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"error: {CHROMIUM} is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or Path(tmp) / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        _profile(runs)
        server = _serve(runs, args.port)
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"]
                )
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                for name, (path, title) in SHOTS.items():
                    page.goto(f"http://127.0.0.1:{args.port}/{path}", timeout=180_000)
                    page.get_by_role("heading", name=title).first.wait_for(timeout=180_000)
                    page.wait_for_function(  # the script has finished and every chart is drawn
                        "!document.querySelector('[data-testid=stStatusWidget]')", timeout=180_000
                    )
                    time.sleep(2)
                    tmp_png = args.out / f".{name}.tmp.png"
                    page.screenshot(path=str(tmp_png), full_page=False)
                    tmp_png.replace(args.out / name)
                    print(f"wrote {args.out / name}")
                browser.close()
        finally:
            os.killpg(server.pid, signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
