"""The Collective timeline's critical-path and what-if tables, shaped for charts and tables (no Streamlit).

    path_frame(path, t0_ns)      the critical path's segments in ms from the step's start: one rule per
                                 segment on its rank's row (kind compute | host | idle | comm, category:
                                 the kind, or comm and the dim)
    path_links(frame)            the vertical hops where the path changes rank (a collective's last
                                 arrival on another rank set its end)
    path_categories(path)        time on the path per category, with its share
    phase_rows(out)              whatif's measured vs predicted phases, long form for a grouped bar
    scenario_of(...)             a Scenario from the form's plain values (the cache key)

Pure: pandas.
"""

from __future__ import annotations

import pandas as pd

from profiler.analyzers.replay import OWN_KINDS, Scenario

PATH_FRAME_COLUMNS = ["rank", "start_ms", "end_ms", "dur_ms", "kind", "category", "label"]
LINK_COLUMNS = ["at_ms", "from_rank", "to_rank"]


def op_label(op: pd.Series, instance: pd.Series) -> pd.Series:
    """'all_reduce 0,1#3'; an instance already named by its op ('all_to_all#3') alone."""
    labels = [i if i.startswith(f"{o}#") else f"{o} {i}" for o, i in zip(op.astype(str), instance.astype(str))]
    return pd.Series(labels, index=instance.index, dtype=object)


def path_frame(path: pd.DataFrame, t0_ns: int) -> pd.DataFrame:
    """profiler.analyzers.replay.critical_path's rows in ms from t0 (the step's aligned start)."""
    if not len(path):
        return pd.DataFrame(columns=PATH_FRAME_COLUMNS)
    kind = path["kind"].astype(str)
    dim = path["dim"].astype(str)
    return pd.DataFrame(
        {
            "rank": path["rank"].astype("int64"),
            "start_ms": (path["start_ns"] - t0_ns) / 1e6,
            "end_ms": (path["end_ns"] - t0_ns) / 1e6,
            "dur_ms": path["dur_ns"] / 1e6,
            "kind": kind,
            "category": kind.where(kind != "comm", "comm: " + dim),
            "label": kind.where(kind != "comm", op_label(path["op"], path["instance"])),
        }
    ).reset_index(drop=True)


def path_extent(frame: pd.DataFrame, *, span_ms: float, steps: int = 1) -> dict:
    """Where a path_frame lies against the step it was walked in (`span_ms`: the step's first start to
    last end over all ranks, the overview's axis): its length (the segments' sum), its first and last
    ms, the ranks it starts and ends on, and how far it runs past the measured span (a replay that
    re-times ops whose clocks disagree can end later than the trace did)."""
    if not len(frame):
        return {
            "length_ms": 0.0,
            "start_ms": 0.0,
            "end_ms": 0.0,
            "first_rank": None,
            "last_rank": None,
            "span_ms": span_ms,
            "past_ms": 0.0,
            "steps": steps,
        }
    first, last = frame.loc[frame["start_ms"].idxmin()], frame.loc[frame["end_ms"].idxmax()]
    end = float(last["end_ms"])
    return {
        "length_ms": float(frame["dur_ms"].sum()),
        "start_ms": float(first["start_ms"]),
        "end_ms": end,
        "first_rank": int(first["rank"]),
        "last_rank": int(last["rank"]),
        "span_ms": float(span_ms),
        "past_ms": max(0.0, end - float(span_ms)),
        "steps": steps,
    }


def path_links(frame: pd.DataFrame) -> pd.DataFrame:
    """Where consecutive segments sit on different ranks: the time of the hop and the two ranks."""
    if len(frame) < 2:
        return pd.DataFrame(columns=LINK_COLUMNS)
    prev, nxt = frame.iloc[:-1].reset_index(drop=True), frame.iloc[1:].reset_index(drop=True)
    hop = prev["rank"].to_numpy() != nxt["rank"].to_numpy()
    return pd.DataFrame(
        {
            "at_ms": nxt["start_ms"][hop].to_numpy(),
            "from_rank": prev["rank"][hop].to_numpy(),
            "to_rank": nxt["rank"][hop].to_numpy(),
        }
    )


def path_categories(path: pd.DataFrame) -> pd.DataFrame:
    """category, ms on the path, share of the path (largest first)."""
    if not len(path):
        return pd.DataFrame(columns=["category", "ms", "share"])
    frame = path_frame(path, 0)
    by = frame.groupby("category")["dur_ms"].sum().sort_values(ascending=False)
    total = float(frame["end_ms"].max() - frame["start_ms"].min()) or 1.0
    return pd.DataFrame({"category": by.index, "ms": by.to_numpy(), "share": by.to_numpy() / total})


def phase_rows(out: dict) -> pd.DataFrame:
    """whatif's measured_phases / predicted_phases as rows: which (measured | predicted), phase, ms."""
    rows = []
    for which in ("measured", "predicted"):
        ph = out[f"{which}_phases"]
        for kind in OWN_KINDS:  # the rank's own time: device busy, host alone, idle
            rows.append({"which": which, "phase": kind, "ms": ph[f"{kind}_s"] * 1e3})
        rows.append({"which": which, "phase": "wait", "ms": ph["wait_s"] * 1e3})
        for dim, s in sorted(ph["transfer_s"].items()):
            rows.append({"which": which, "phase": f"{dim} transfer", "ms": s * 1e3})
    return pd.DataFrame(rows, columns=["which", "phase", "ms"])


def scenario_of(
    *, rank: int | None, speed: str | float | None, link: str | None, link_factor: float, overlap: tuple[str, ...]
) -> Scenario:
    """The form's values as a Scenario: a rank at `speed` ('median' or a factor), `link` k x faster, dims hidden."""
    return Scenario(
        rank_speed={int(rank): speed} if rank is not None and speed not in (None, "", 1.0) else {},
        link={link: float(link_factor)} if link and link_factor and float(link_factor) != 1.0 else {},
        overlap=frozenset(overlap),
    )


def pipeline_table(out: dict) -> pd.DataFrame:
    """whatif's pipeline rows for a table: stage, ranks, ms columns, measured and theory bubble %."""
    rows = pd.DataFrame(out.get("pipeline") or [])
    if rows.empty:
        return rows
    rows["bubble %"] = rows.pop("bubble_fraction") * 100
    rows["P2P wait %"] = rows.pop("p2p_wait_fraction") * 100
    rows["(p−1)/(v·m) %"] = rows.pop("theory_fraction") * 100
    return rows.rename(
        columns={
            "work_ms": "work ms",
            "bubble_ms": "bubble ms",
            "p2p_wait_ms": "P2P wait ms",
            "p2p_transfer_ms": "P2P transfer ms",
        }
    )
