"""Why did it hang: a job's Flight Recorder dumps (a run here with fr/, `?run=NAME`, or dumps uploaded
as JSON files or one .zip / .tar.gz) read across ranks by `python -m profiler hang --json` in a process
of its own, under a time and memory budget (the server never parses a dump) -- the rank grid coloured
by each rank's last completed collective, the suspects outlined, the diagnosis paragraph to paste
into an incident channel, the per-group table, and each suspect's log tail when the run is ours."""

from __future__ import annotations

import hashlib
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from profiler.analyzers.hang_dumps import read_run_json
from profiler.collect import trace_sets
from runfiles.rundir import flight_dir, log_path
from ui import hang_charts
from ui.routing import ensure_navigation
from ui.text import md

UPLOAD_TYPES = ["json", "zip", "tar", "gz", "tgz"]
LOG_TAIL = 30
TIME_S = 60  # the diagnosis's budget: the dumps' own caps (profiler.analyzers.hang_dumps) keep it ~10 s
MEMORY_BYTES = 3 << 30
ROOT = Path(__file__).resolve().parents[1]


def _limit_memory() -> None:  # in the child, before it runs
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


@st.cache_data(show_spinner="Reading the dumps…", max_entries=16)
def _report(path: str, stamp: str, gpus_per_node: int) -> tuple[dict | None, str]:
    """(report, '') from `profiler hang PATH --json` run in its own process under the budget, or (None,
    the one-line reason it gave none)."""
    cmd = [sys.executable, "-m", "profiler", "hang", path, "--json", "--gpus-per-node", str(gpus_per_node)]
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIME_S, preexec_fn=_limit_memory, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"reading them took more than {TIME_S} s"
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        reason = lines[-1].removeprefix("error: ") if lines else f"exit {done.returncode}"
        if "MemoryError" in (done.stderr or ""):
            reason = f"reading them needs more than {MEMORY_BYTES >> 30} GiB"
        return None, reason
    return json.loads(done.stdout), ""


def _runs_with_dumps() -> list[Path]:
    root = trace_sets.runs_dir()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if flight_dir(p).is_dir() and any(flight_dir(p).glob("rank*.json"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _stamp(folder: Path) -> str:
    return ",".join(f"{p.name}:{p.stat().st_mtime_ns}" for p in sorted(folder.glob("rank*.json")))


def _uploaded(files) -> Path | None:
    """The uploaded dumps in a folder of their own (content-named, so a rerun reuses it)."""
    if not files:
        return None
    digest = hashlib.sha256(b"".join(f.name.encode() + f.getvalue()[:4096] for f in files)).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"parascope-fr-{digest}"
    if not folder.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=".fr-", dir=tempfile.gettempdir()))
        for i, f in enumerate(files):
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(f.name).name).lstrip(".") or f"dump{i}.json"
            (tmp / name).write_bytes(f.getvalue())
        try:
            tmp.rename(folder)
        except OSError:  # another session made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def hang_page() -> None:
    st.caption(
        "Flight Recorder dumps of a stuck job: `profiler run` collects them into the run's fr/ when a job fails or "
        "times out; from your own job, dump JSON on every rank with `torch._C._distributed_c10d._dump_fr_trace_json()` "
        "and upload the files (pickled dumps are refused: reading them can run code)."
    )
    runs = _runs_with_dumps()
    asked = st.query_params.get("run")
    if "hang.run" not in st.session_state and asked:  # a link names the run: open it
        st.session_state["hang.run"] = next((p for p in runs if p.name == asked), None)
        if st.session_state["hang.run"] is None:
            del st.session_state["hang.run"]
            st.warning(f"No run named {md(asked)} has Flight Recorder dumps here; showing the newest that has.")
    source = st.radio("Dumps", ["A run here", "Upload"], horizontal=True, key="hang.source", index=0 if runs else 1)
    c1, c2 = st.columns([3, 1])
    gpn = int(c2.number_input("GPUs per node", 1, 1024, 8, key="hang.gpn", help="a run's own hosts win"))
    if source == "A run here":
        if not runs:
            st.info("No run here has Flight Recorder dumps. Try: `python -m profiler run --dp 4 --global-batch 4 "
                    "--inject-hang 2:2 --timeout 10`.")  # fmt: skip
            return
        chosen = c1.selectbox("Run", runs, format_func=lambda p: p.name, key="hang.run")
        st.query_params["run"] = chosen.name  # the URL reopens this run
        path, stamp, run_dir = chosen, _stamp(flight_dir(chosen)), chosen
    else:
        files = c1.file_uploader(
            "Dump files (rank<k>.json) or one archive", type=UPLOAD_TYPES, accept_multiple_files=True, key="hang.up"
        )
        folder = _uploaded(files)
        if folder is None:
            st.info("Upload one JSON dump per rank, or a .zip / .tar.gz of them.")
            return
        path, stamp, run_dir = folder, _stamp(folder) or folder.name, None
        st.query_params.pop("run", None)
    report, reason = _report(str(path), stamp, gpn)
    if report is None:
        st.error(f"These dumps cannot be read: {md(reason)}")
        return
    if report["suspects"]:
        first = report["suspects"][0]
        st.error(f"Rank {first['rank']} · {first['dim']} · {first['kind'].replace('_', ' ')} at {first['op']} "
                 f"#{first['seq']}: the diagnosis, to paste into an incident channel")  # fmt: skip
    else:
        st.success("The dumps agree: no rank disagrees with its peers")
    st.code(report["diagnosis"], language=None, wrap_lines=True)  # copy button: for the incident channel
    run = read_run_json(run_dir / "run.json") if run_dir is not None else None
    hosts = (run or {}).get("hosts") or {}
    nodes = {int(r): h["node"] for r, h in hosts.items() if isinstance(h, dict) and isinstance(h.get("node"), int)}
    world = max([*report["ranks"], *report["missing_dumps"], -1]) + 1
    cells = hang_charts.rank_cells(report, world, gpn, nodes)
    if len(cells) < world:
        st.caption(f"The grid shows the first {hang_charts.MAX_CELLS:,} of {world:,} ranks and every suspect.")
    st.altair_chart(hang_charts.rank_grid_chart(cells, report["progress"]["dim"]))
    if report["suspects"]:
        st.subheader("Suspects")
        st.dataframe(pd.DataFrame(report["suspects"]), hide_index=True)
    if report["evidence"]:
        st.subheader("The collective on each rank")
        st.dataframe(pd.DataFrame(report["evidence"]), hide_index=True)
    st.subheader("Process groups")
    groups = pd.DataFrame(
        [
            {
                "group": g["name"],
                "description": g["desc"],
                "dim": g["dim"],
                "ranks": len(g["ranks"]),
                "last completed (min–max)": _span(g["last_completed"]),
            }
            for g in report["groups"]
        ]
    )
    st.dataframe(groups, hide_index=True)
    if run_dir is not None:
        for rank in list(dict.fromkeys(s["rank"] for s in report["suspects"]))[:4]:  # each rank's log once
            log = log_path(run_dir, rank)
            if log.is_file():
                with st.expander(f"rank {rank}'s log (last {LOG_TAIL} lines)"):
                    st.code("\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL:]), language=None)


def _span(last: dict) -> str:
    values = [v for v in last.values() if v is not None]
    return f"{min(values)}–{max(values)}" if values else "—"


ensure_navigation()
st.title("Why did it hang")
hang_page()
