"""`pip install .` into a new virtual environment gives a `parascope` command that works from any
directory: the plan command's JSON, `--help`, and `parascope dashboard` serving the installed pages
(app.py and pages/ ship inside the wheel as parascope/dashboard/). The new environment borrows the
checkout's installed dependencies through a .pth line, so nothing is downloaded."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.ports import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    # one build at a time: setuptools builds in the source tree's build/, and test workers share it
    (ROOT / ".cache").mkdir(exist_ok=True)
    with open(ROOT / ".cache" / "wheel-build.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels)]
            + [str(ROOT)],
            check=True,
            cwd=tmp,
            capture_output=True,
        )
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, streamlit, ... from .venv
    wheel = next(wheels.glob("parascope-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    return env


def run(env: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(env / "bin" / "parascope"), *args], cwd=cwd, env=clean, capture_output=True, text=True, timeout=120
    )


def test_parascope_plan_json_from_another_directory(venv, tmp_path):
    r = run(
        venv,
        "plan",
        "--model",
        "gpt3-175b",
        "--dp",
        "8",
        "--tp",
        "8",
        "--pp",
        "8",
        "--sp",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "64",
        "--global-batch",
        "1536",
        "--micro-batch",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["valid"] is True and out["world_size"] == 512 and out["plan"]["tp"] == 8
    assert out["memory_per_gpu_bytes"]["total"] > 0


def test_the_installed_code_is_what_runs(venv, tmp_path):
    code = "import parallel, parascope.cli as c; print(parallel.__file__); print(c.app_path())"
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    package, app = r.stdout.split()
    assert package.startswith(str(venv)) and app.startswith(str(venv)) and app.endswith("parascope/dashboard/app.py")
    pages = sorted(p.name for p in (Path(app).parent / "pages").glob("*.py"))
    assert pages == sorted(p.name for p in (ROOT / "pages").glob("*.py"))
    r = run(venv, "--help", cwd=tmp_path)
    assert r.returncode == 0 and all(c in r.stdout for c in ("dashboard", "plan", "search", "analyze", "tpsweep"))
    assert run(venv, "no-such-command", cwd=tmp_path).returncode == 2


def test_parascope_dashboard_serves(venv, tmp_path):
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["PARASCOPE_RUNS"] = str(tmp_path / "runs")
    proc = subprocess.Popen(
        [str(venv / "bin" / "parascope"), "dashboard", f"--server.port={port}", "--server.headless=true"],
        cwd=tmp_path,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 60, ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert body == "ok", proc.stdout.read() if proc.poll() is not None else "no answer in 60 s"
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
        assert "<title>" in page.lower() or "streamlit" in page.lower()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
