"""Cached loaders for the plan pages: plain arguments in (the plan's query params, page options),
frames out. Every plan-model call of a page goes through here, so a warm page costs only drawing.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from parallel.core import long_context as long_context_data
from parallel.core import memory_sweeps as memory_data
from parallel.core import rank_grid as topology_data
from parallel.core import scaling
from parallel.core.memory import ActivationOptions, activation_bytes_per_layer
from parallel.core.plan import Plan
from parallel.core.report import Options, plan_report
from parallel.core.specs import Cluster, Model, SpecError
from parallel.core.topology import placed
from parallel.core.validate import check
from parallel.review.urls import perf_of_params, plan_from_params
from runfiles.rundir import load_json_object
from ui.theme import link_names, link_words


def inputs(params: dict[str, str]) -> tuple[Model, Cluster, Plan]:
    return plan_from_params(params)


@st.cache_data(show_spinner=False, max_entries=512)
def verdict(params: dict[str, str], act_bytes: int = 0) -> dict:
    """errors, warnings and computable of parallel.core.validate.check for the plan, its memory check
    with the page's bytes per activation (0: the model's; the same the page's numbers use)."""
    model, cluster, plan = inputs(params)
    v = check(plan, model, cluster, _activation_options(act_bytes))
    return {"errors": list(v.errors), "warnings": list(v.warnings), "computable": v.computable}


@st.cache_data(show_spinner=False, max_entries=512)
def plan_numbers(params: dict[str, str]) -> dict:
    """The plan's memory per GPU (bytes, the most loaded stage) and step time (s) as `python -m parallel
    plan` and Plan review give them (parallel.core.report.plan_report, under the URL's assumptions: `mfu`,
    `dp_overlap`, else the model's own); None where the plan cannot be computed."""
    model, cluster, plan = inputs(params)
    rep = plan_report(plan, model, cluster, Options(perf=perf_of_params(params)))
    memory = rep["memory_per_gpu_bytes"]
    return {
        "memory_per_gpu_bytes": None if memory is None else memory["total"],
        "step_time_s": rep["step_time_s"],
        "mfu": (rep.get("step_time") or {}).get("mfu"),
    }


@st.cache_data(show_spinner=False, max_entries=128)
def topology_view(params: dict[str, str], color_dim: str, group_dim: str, compare_order: str, first_node: int) -> dict:
    """Everything the Topology page draws. cells/paths cover a window of at most
    topology_data.max_window_nodes(gpus_per_node) nodes from `first_node`; `overview` (one row per
    node) only when the cluster is larger than that window."""
    _, cluster, plan = inputs(params)
    topo = placed(plan, cluster)  # on the cluster's NVLink domains, which decide each group's link
    total = topology_data.node_count(plan.world_size, cluster.gpus_per_node)
    window = min(total, topology_data.max_window_nodes(cluster.gpus_per_node))
    first = max(0, min(first_node, total - window))
    compare = None if topology_data.same_order(plan.order, compare_order) else compare_order
    return {
        "cells": topology_data.gpu_cells(
            topo,
            group_dim=group_dim,
            compare_order=compare or plan.order,
            first_node=first,
            nodes=window,
            names=link_names(cluster),
        ),
        "paths": topology_data.group_paths(topo, group_dim, first_node=first, nodes=window, names=link_names(cluster)),
        "domains": topology_data.domain_spans(topo, first_node=first, nodes=window),
        "domain_note": topology_data.domain_note(topo),
        "overview": topology_data.node_overview(topo, color_dim) if window < total else None,
        "summary": topology_data.dim_summary(topo, compare_order, link_words(cluster)),
        "crossing": {
            **{d: topo.crossing(d) if topo.sizes[d] > 1 else 0 for d in topology_data.DIMS},
            "ep": topo.crossing("ep") if plan.ep > 1 else 0,  # the MoE layers' expert groups
        },
        "moved": topology_data.moved_count(topo, compare) if compare else 0,
        "compare": compare,
        "nodes": total,
        "window": (first, first + window - 1),
    }


def _activation_options(act_bytes: int) -> ActivationOptions:
    return ActivationOptions(act_bytes=act_bytes or None)


@st.cache_data(show_spinner=False, max_entries=128)
def memory_view(params: dict[str, str], act_bytes: int, scope: str) -> dict:
    """Everything the Activation-memory page draws (act_bytes 0 = the model's dtype; the plan's own
    attention kernel and dropout)."""
    model, cluster, plan = inputs(params)
    opts = _activation_options(act_bytes)
    per_layer = {
        memory_data.SP_LABEL[p.sp]: activation_bytes_per_layer(model, p, opts) for p in memory_data.sp_variants(plan)
    }
    return {
        "recompute": memory_data.layer_components(model, plan, opts, scope=scope),
        "seq_len": memory_data.components_sweep(model, plan, opts, axis="seq_len", scope=scope),
        "tp": memory_data.components_sweep(model, plan, opts, axis="tp", scope=scope),
        "stages": memory_data.stage_memory(model, plan, opts, cluster.gpu_memory_bytes),
        "per_layer": per_layer,
    }


@st.cache_data(show_spinner=False, max_entries=64)
def scaling_view(params: dict[str, str]) -> dict:
    """parallel.core.scaling.tp_scaling for the plan's model and cluster under the plan's per-rank
    settings (micro batch, recompute, attention, TP overlap; compute per operator on the cluster's
    device, or at the URL's `mfu`): frame (the prediction), table, highlights (SP as the plan has it)
    and notes (TP degrees left out, and why)."""
    model, cluster, plan = inputs(params)
    names = link_words(cluster)
    df = scaling.tp_scaling(model, cluster, plan=plan, perf=perf_of_params(params))
    return {
        "frame": df,
        "table": scaling.summary_table(df, names),
        "notes": scaling.invalid_notes(df),
        "highlights": scaling.highlights(df, cluster.gpus_per_node, plan.tp, names, sp=plan.sp),
    }


@st.cache_data(show_spinner=False, max_entries=64)
def long_context_view(params: dict[str, str], cp: int, runs: tuple[tuple[str, int], ...]) -> dict:
    """Everything the Long-context page draws for the plan's model, cluster, TP, micro batch, recompute
    mode and attention kernel, with `cp`-way CP; `runs`: (metrics.json path, mtime) of this project's
    runs, so a new or finished run redraws its measured points."""
    model, cluster, plan = inputs(params)
    flash = plan.flash
    opts = ActivationOptions()
    pairs = []
    for path, _ in runs:
        try:
            metrics = load_json_object(path)
            pairs.append((metrics, Plan.from_dict(metrics["plan"]), Path(path).parent.name))
        except (OSError, ValueError, KeyError, TypeError, SpecError):
            continue  # a run being written, or one from an older version: no point for it
    measured = long_context_data.measured_points(model, plan, cp, pairs)
    if flash:  # the engine keeps the s x s scores unless its CP exchange is ring: compare without flash
        measured = measured[measured["variant"].str.endswith(" ring")]
    lengths = tuple(sorted(set(long_context_data.LENGTHS) | set(measured["seq_len"])))  # the curves pass the runs
    return {
        "memory": long_context_data.memory_curves(model, plan, cp, opts, lengths),
        "comm": long_context_data.comm_curves(model, plan, cp, cluster),
        "fits": long_context_data.smallest_fits(model, plan, cluster, opts),
        "measured": measured,
    }
