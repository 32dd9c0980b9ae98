"""Frames behind the TP-scaling page's lab section: TP sweeps (`python -m profiler tpsweep --lab`)
found under the runs dir, measured beside the plan model's prediction for the lab's own links.

    sweeps = find_sweeps(runs_dir)          # [{name, path, mtime_ns, status, created_at, points}], newest first
    view = sweep_view(load_sweep(path))     # {chart, table, gpus_per_node, caption, notes}

The numbers come from profiler.lab.sweep_model (measurement and prediction, one place for the CLI and
the page). Pure: pandas, json.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from profiler.lab.sweep_model import compare, compute_rate, lab_cluster, prediction
from runfiles.rundir import load_json_object

SWEEP_JSON = "sweep.json"
LAB_LINKS = {"intra": "inside a node (loopback)", "inter": "across nodes (shaped veth)"}
METRICS = {  # metric -> (title, scale from the sweep's unit)
    "tp_comm": ("TP comm, ms/layer", 1e3),
    "busbw": ("TP busbw, GB/s", 1e-9),
    "step": ("step time, s", 1.0),
}
VARIANTS = {False: "TP without SP", True: "TP + SP"}


class SweepError(ValueError):
    """A sweep.json that cannot be shown, with the reason."""


def load_sweep(path: Path) -> dict:
    try:
        data = load_json_object(path)
    except OSError as err:
        raise SweepError(f"{path}: cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise SweepError(f"{path}: cannot be read as a sweep ({err})") from None
    if data.get("kind") != "parascope-tpsweep":
        raise SweepError(f"{path}: not a sweep of `python -m profiler tpsweep` (no kind 'parascope-tpsweep')")
    missing = [k for k in ("model", "gpus_per_node", "points") if k not in data]
    if missing:
        raise SweepError(f"{path}: lacks {', '.join(missing)}")
    return data


def find_sweeps(root: Path) -> list[dict]:
    """Sweep directories directly under `root` (the runs dir), newest first."""
    out = []
    root = Path(root)
    if not root.is_dir():
        return out
    for path in root.glob(f"*/{SWEEP_JSON}"):
        try:
            data = load_sweep(path)
        except SweepError:
            continue
        out.append(
            {
                "name": path.parent.name,
                "path": str(path),
                "mtime_ns": path.stat().st_mtime_ns,
                "status": data.get("status"),
                "created_at": data.get("created_at") or "",
                "points": len(data.get("points") or []),
            }
        )
    return sorted(out, key=lambda s: (s["created_at"], s["name"]), reverse=True)


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def chart_frame(sweep: dict) -> pd.DataFrame:
    """Long form for scaling_charts.sweep_chart: one row per (metric, variant, tp, source) with value,
    lo/hi (measured spread), error_pct (measured vs predicted; on 'calibrated' rows, the calibrated
    step or TP comm vs measured), link (LAB_LINKS words). Sources: predicted (the analytic plan model
    for the lab's links), measured, calibrated (the sweep's calibrated model, when it has one)."""
    cmp, pred = compare(sweep), prediction(sweep)
    rows = []
    for r in pred[pred["valid"]].itertuples():  # the model's curve at every TP degree of the sweep
        base = {
            "tp": int(r.tp),
            "variant": VARIANTS[bool(r.sp)],
            "link": LAB_LINKS.get(r.link, r.link),
            "source": "predicted",
            "lo": math.nan,
            "hi": math.nan,
            "error_pct": math.nan,
        }
        rows.append({**base, "metric": METRICS["tp_comm"][0], "value": (r.tp_comm_s + r.overlapped_s) * 1e3})
        if r.tp > 1 and _finite(r.busbw_bytes_per_s):
            rows.append({**base, "metric": METRICS["busbw"][0], "value": r.busbw_bytes_per_s * 1e-9})
    for r in cmp.itertuples():
        base = {"tp": int(r.tp), "variant": VARIANTS[bool(r.sp)], "link": LAB_LINKS.get(r.link, r.link)}
        if _finite(r.predicted_step_s):
            rows.append(
                {
                    **base,
                    "source": "predicted",
                    "metric": METRICS["step"][0],
                    "value": r.predicted_step_s,
                    "lo": math.nan,
                    "hi": math.nan,
                    "error_pct": math.nan,
                }
            )
        if r.status != "completed":
            continue
        for key, measured, lo, hi in (
            ("tp_comm", r.measured_tp_comm_s, r.measured_tp_comm_lo_s, r.measured_tp_comm_hi_s),
            ("busbw", r.measured_busbw_bytes_per_s, math.nan, math.nan),
            ("step", r.measured_step_s, math.nan, math.nan),
        ):
            title, unit = METRICS[key]
            if _finite(measured) and not (key != "step" and r.tp == 1):
                rows.append(
                    {
                        **base,
                        "source": "measured",
                        "metric": title,
                        "value": measured * unit,
                        "lo": lo * unit,
                        "hi": hi * unit,
                        "error_pct": getattr(r, f"{key}_error_pct"),
                    }
                )
    links = {(int(r.tp), bool(r.sp)): LAB_LINKS.get(r.link, r.link) for r in cmp.itertuples()}
    for q in ((sweep.get("calibrated") or {}).get("points")) or []:  # the calibrated model: step and TP comm
        for key, value, error in (
            ("step", q.get("predicted_step_s"), q.get("error_pct")),
            ("tp_comm", q.get("predicted_tp_comm_s") if q["tp"] > 1 else None, q.get("tp_comm_error_pct")),
        ):
            if _finite(value):
                rows.append(
                    {
                        "tp": int(q["tp"]),
                        "variant": VARIANTS[bool(q["sp"])],
                        "link": links.get((int(q["tp"]), bool(q["sp"])), ""),
                        "source": "calibrated",
                        "metric": METRICS[key][0],
                        "value": value * METRICS[key][1],
                        "lo": math.nan,
                        "hi": math.nan,
                        "error_pct": error if _finite(error) else math.nan,
                    }
                )
    df = pd.DataFrame(rows, columns=["tp", "variant", "link", "source", "metric", "value", "lo", "hi", "error_pct"])
    df["error_label"] = df["error_pct"].map(lambda e: f"{e:+.0f}%" if _finite(e) else "")
    return df


def error_table(sweep: dict) -> pd.DataFrame:
    """Measured beside predicted, one row per run, in ms, GB/s and s, errors in %; with the sweep's
    calibrated step-time model (profiler.lab.sweep_model.calibrate_sweep) when it has one."""
    c = compare(sweep)
    out = pd.DataFrame(
        {
            "TP": c["tp"],
            "SP": c["sp"].map({False: "off", True: "on"}),
            "link": c["link"].map(LAB_LINKS),
            "status": c["status"],
            "TP comm ms/layer": c["measured_tp_comm_s"] * 1e3,
            "predicted ms": c["predicted_tp_comm_s"] * 1e3,
            "TP comm error %": c["tp_comm_error_pct"],
            "busbw GB/s": c["measured_busbw_bytes_per_s"] / 1e9,
            "predicted GB/s": c["predicted_busbw_bytes_per_s"] / 1e9,
            "busbw error %": c["busbw_error_pct"],
            "step s": c["measured_step_s"],
            "predicted s": c["predicted_step_s"],
            "step error %": c["step_error_pct"],
        }
    )
    cal = ((sweep.get("calibrated") or {}).get("points")) or []
    if cal:
        by = {(q["tp"], q["sp"]): q for q in cal}
        keys = list(zip(c["tp"], c["sp"]))
        out["calibrated s"] = [by.get(k, {}).get("predicted_step_s") for k in keys]
        out["calibrated error %"] = [by.get(k, {}).get("error_pct") for k in keys]
        comm = [by.get(k, {}).get("predicted_tp_comm_s") for k in keys]
        # the calibrated TP comm is compared with what the step pays a layer (each call's mean cost,
        # untraced: sweep_model.measure_run's tp_comm_paid_s), not with the median transfer above
        out["TP comm paid ms/layer"] = [
            q["measured_tp_comm_s"] * 1e3
            if q.get("measured_tp_comm_kind") == "paid" and _finite(q.get("measured_tp_comm_s"))
            else None
            for q in (by.get(k, {}) for k in keys)
        ]
        out["calibrated TP comm ms"] = [None if v is None else v * 1e3 for v in comm]
        out["calibrated TP comm error %"] = [by.get(k, {}).get("tp_comm_error_pct") for k in keys]
        out["calibrated on"] = ["yes" if by.get(k, {}).get("calibrated_on") else "" for k in keys]
    return out.round(3)


def caption(sweep: dict) -> str:
    """What was measured, on which link, against which model inputs."""
    m, lab = sweep["model"], sweep.get("lab") or {}
    rate, how = compute_rate(sweep)
    c = lab_cluster(sweep, rate)
    like = (lab.get("like") or {}).get("cluster")
    link = (
        f"shaped to {lab['bandwidth_bytes_per_s'] * 8 / 1e9:.2f} Gbit/s each way" + (f" (like {like})" if like else "")
        if lab.get("bandwidth_bytes_per_s")
        else "shaped link"
    )
    text = (
        f"Model h={m['hidden']}, s={m['seq_len']}, {m['layers']} layers, micro batch {sweep.get('micro_batch', 1)} "
        f"(fp32: {sweep.get('micro_batch', 1) * m['seq_len'] * m['hidden'] * m['dtype_bytes'] / 2**20:.2f} MiB per TP "
        f"collective); {sweep['gpus_per_node']} ranks per lab node, inter-node link {link}. Prediction: "
        f"parallel.core.scaling with the lab's commbench fit — inside a node α {c.intra.latency_s * 1e6:.0f} µs, "
        f"β {c.intra.bandwidth_bytes_per_s / 1e9:.2f} GB/s; across α {c.inter.latency_s * 1e6:.0f} µs, "
        f"β {c.inter.bandwidth_bytes_per_s / 1e9:.3f} GB/s"
    )
    if rate:
        text += (
            f"; compute {rate / 1e9:.1f} GFLOP/s per core, {sweep.get('machine', {}).get('cpus', '?')} cores "
            f"shared by the ranks (calibrated on the TP {how.get('tp', '?')} run, whose step-time error is 0 by "
            "construction)"
        )
    return text + "."


def notes(sweep: dict) -> list[str]:
    """Things the reader must know: failed runs, a commbench that failed, a sweep still running."""
    out = []
    if sweep.get("status") == "running":
        out.append("This sweep is still running; the page shows the runs finished so far.")
    cb = sweep.get("commbench") or {}
    if cb.get("error"):
        out.append(
            f"commbench failed ({cb['error']}): the prediction uses the link as shaped and the local-cpu "
            "preset's loopback instead of fitted links."
        )
    for p in sweep.get("points") or []:
        if p.get("status") != "completed":
            out.append(f"TP {p.get('tp')}{' + SP' if p.get('sp') else ''} failed: {p.get('error')}")
    return out


def sweep_view(sweep: dict) -> dict:
    return {
        "chart": chart_frame(sweep),
        "table": error_table(sweep),
        "gpus_per_node": int(sweep["gpus_per_node"]),
        "caption": caption(sweep),
        "notes": notes(sweep),
    }
