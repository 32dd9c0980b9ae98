"""Why did it hang: a job's Flight Recorder dumps (a run here with fr/, or dumps uploaded as JSON
files or one .zip / .tar.gz) read across ranks by profiler.analyzers.hang -- the rank grid coloured
by each rank's last completed collective, the suspects outlined, the diagnosis paragraph to paste
into an incident channel, the per-group table, and the suspect's log tail when the run is ours."""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from profiler.analyzers.hang import diagnose, load_dumps
from profiler.traces.errors import TraceError
from runfiles.rundir import flight_dir, log_path
from ui import hang_charts, trace_sets
from ui.routing import ensure_navigation
from ui.text import md

UPLOAD_TYPES = ["json", "zip", "tar", "gz", "tgz"]
LOG_TAIL = 30


@st.cache_data(show_spinner="Reading the dumps…", max_entries=16)
def _report(path: str, stamp: str, gpus_per_node: int) -> tuple[dict, dict | None]:
    dumps = load_dumps(path)
    return diagnose(dumps, gpus_per_node=gpus_per_node), dumps.run


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
    source = st.radio("Dumps", ["A run here", "Upload"], horizontal=True, key="hang.source", index=0 if runs else 1)
    c1, c2 = st.columns([3, 1])
    gpn = int(c2.number_input("GPUs per node", 1, 1024, 8, key="hang.gpn", help="a run's own hosts win"))
    if source == "A run here":
        if not runs:
            st.info("No run here has Flight Recorder dumps. Try: `python -m profiler run --dp 4 --global-batch 4 "
                    "--inject-hang 2:2 --timeout 10`.")  # fmt: skip
            return
        chosen = c1.selectbox("Run", runs, format_func=lambda p: p.name, key="hang.run")
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
    try:
        report, run = _report(str(path), stamp, gpn)
    except (TraceError, ValueError, OSError) as err:
        st.error(f"These dumps cannot be read: {md(err)}")
        return
    (st.error if report["suspects"] else st.success)(md(report["diagnosis"]))
    st.code(report["diagnosis"], language=None, wrap_lines=True)  # copy button: for the incident channel
    hosts = (run or {}).get("hosts") or {}
    nodes = {int(r): h["node"] for r, h in hosts.items() if isinstance(h, dict) and isinstance(h.get("node"), int)}
    world = max([*report["ranks"], *report["missing_dumps"], -1]) + 1
    cells = hang_charts.rank_cells(report, world, gpn, nodes)
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
        for s in report["suspects"][:4]:
            log = log_path(run_dir, s["rank"])
            if log.is_file():
                with st.expander(f"rank {s['rank']}'s log (last {LOG_TAIL} lines)"):
                    st.code("\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL:]), language=None)


def _span(last: dict) -> str:
    values = [v for v in last.values() if v is not None]
    return f"{min(values)}–{max(values)}" if values else "—"


ensure_navigation()
st.title("Why did it hang")
hang_page()
