"""The Run-a-job form: the plan and model flags of `python -m profiler run` (those of `python -m parallel
train`, plus the profiler's schedule), checked by the profiler's own validation before anything starts.

    flags, label = job_form()      # None until the form is submitted; then the flags and a run label
    errors, warnings = check(flags)

Widget keys `job.<flag>`; the values stay in the session while the user edits.
"""

from __future__ import annotations

import streamlit as st

from parallel.core.plan import CP_KINDS, RECOMPUTE, SCHEDULES
from parallel.core.specs import MODELS
from parallel.core.topology import DEFAULT_ORDER, ORDERS
from profiler.collect.jobs import flags_of
from profiler.collect.spec import parse_run

K = "job."
DEFAULTS = {
    "model": "tiny",
    "dp": 2,
    "tp": 2,
    "pp": 2,
    "cp": 1,
    "sp": True,
    "micro_batch": 1,
    "global_batch": None,  # empty: dp × micro batch × pp, as `profiler run` takes it
    "vpp": 1,
    "zero": 0,
    "recompute": "none",
    "order": DEFAULT_ORDER,
    "schedule": "1f1b",
    "cp_kind": "allgather",
    "steps": 4,
    "launcher": "local",
    "timeout": 60.0,
    "wait": 1,
    "warmup": 1,
    "active": None,
    "layers": None,
    "hidden": None,
    "heads": None,
    "seq_len": None,
}


def _int(container, label: str, key: str, lo: int = 1, hi: int = 4096, **kw):
    return container.number_input(label, min_value=lo, max_value=hi, step=1, key=K + key, **kw)


def job_form() -> tuple[list[str], str] | None:
    ss = st.session_state
    for key, value in DEFAULTS.items():
        if value is not None:  # the shape overrides start empty (value=None below)
            ss.setdefault(K + key, value)
    # Enter in a field must not start a job (a job is minutes of every core): only the button does
    with st.form("job_form", border=True, enter_to_submit=False):
        c1, c2 = st.columns([3, 2])
        c1.selectbox(
            "Model",
            list(MODELS),
            key=K + "model",
            format_func=lambda n: f"{n} ({MODELS[n].layers} layers, h {MODELS[n].hidden})",
            help="tiny and tiny-llama train in seconds on CPU; the others are the planning presets (shape flags "
            "below shrink them)",
        )
        c2.number_input(
            "Steps", min_value=1, max_value=1000, step=1, key=K + "steps", help="optimizer steps to train and profile"
        )
        cols = st.columns(5)
        for col, (dim, name) in zip(cols, (("dp", "DP"), ("tp", "TP"), ("pp", "PP"), ("cp", "CP"))):
            _int(col, name, dim, hi=64)
        cols[4].toggle("SP", key=K + "sp", help="Megatron sequence parallelism (needs TP > 1)")
        cols = st.columns(5)
        _int(cols[0], "Micro batch", "micro_batch")
        cols[1].number_input(
            "Global batch",
            min_value=1,
            max_value=10**6,
            step=1,
            key=K + "global_batch",
            value=None,
            placeholder="dp × micro × pp",
            help="empty: dp × micro batch × pp",
        )
        _int(cols[2], "vpp", "vpp", hi=64, help="virtual pipeline stages per rank (interleaved 1F1B)")
        cols[3].selectbox(
            "ZeRO",
            [0, 1, 2, 3],
            key=K + "zero",
            help="over the DP×CP ranks: 1 shards optimizer states, 2 also gradients, 3 also parameters "
            "(gathered per layer)",
        )
        cols[4].selectbox("Recompute", list(RECOMPUTE), key=K + "recompute")
        with st.expander("Rank order, schedule, CP exchange, launcher, model shape"):
            c1, c2, c3, c4 = st.columns(4)
            c1.selectbox("Rank order", list(ORDERS), key=K + "order", format_func=lambda o: f"{o} — {ORDERS[o]}")
            c2.selectbox("Pipeline schedule", list(SCHEDULES), key=K + "schedule")
            c4.selectbox(
                "CP exchange",
                list(CP_KINDS),
                key=K + "cp_kind",
                help="all-gathered K/V, ring attention (send/recv round the CP ring) or Ulysses all-to-all (CP > 1)",
            )
            c3.selectbox(
                "Launcher",
                ["local", "torchrun"],
                key=K + "launcher",
                help="local: fork the ranks from one process (fast); torchrun: one-node torchrun",
            )
            cols = st.columns(5)
            for col, (flag, name) in zip(
                cols, (("layers", "Layers"), ("hidden", "Hidden"), ("heads", "Heads"), ("seq_len", "Sequence length"))
            ):
                col.number_input(
                    name,
                    min_value=1,
                    max_value=1 << 20,
                    step=1,
                    key=K + flag,
                    value=None,
                    placeholder="preset",
                    help="overrides the preset's value",
                )
            cols[4].number_input(
                "Group timeout, s",
                min_value=5.0,
                max_value=3600.0,
                step=5.0,
                key=K + "timeout",
                help="a dead or hung peer ends the job within this",
            )
            cols = st.columns(5)
            _int(cols[0], "Profiler: wait steps", "wait", lo=0, hi=1000, help="steps before tracing starts")
            _int(cols[1], "warmup steps", "warmup", lo=0, hi=1000, help="steps traced but dropped")
            cols[2].number_input(
                "active steps",
                min_value=1,
                max_value=1000,
                step=1,
                key=K + "active",
                value=None,
                placeholder="the rest",
                help="steps recorded in the traces",
            )
        st.text_input(
            "Run label (optional)",
            key=K + "label",
            placeholder="e.g. sp-vs-nosp",
            help="part of the run's directory name, after the time",
        )
        submitted = st.form_submit_button("Start profiling", type="primary", icon=":material/play_arrow:")
    if not submitted:
        return None
    values = {key: ss.get(K + key) for key in DEFAULTS}
    flags = flags_of(values)
    plan = f"{values['model']} DP{values['dp']} TP{values['tp']}{'+SP' if values['sp'] else ''} PP{values['pp']}" + (
        f" CP{values['cp']}" + ("" if values["cp_kind"] == "allgather" else f" {values['cp_kind']}")
        if values["cp"] > 1
        else ""
    )
    return flags, (ss.get(K + "label") or "").strip() or plan


def check(flags: list[str]) -> tuple[list[str], list[str]]:
    """`python -m profiler run`'s own validation of the flags (plan, model, schedule, launcher; no torch
    import): (errors, warnings)."""
    try:
        _, errors, warnings = parse_run(flags)
    except SystemExit:  # argparse: a value it refused (and printed)
        return [f"python -m profiler run does not accept: {' '.join(flags)}"], []
    return list(errors), list(warnings)
