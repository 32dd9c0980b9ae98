"""The device model's efficiencies fitted to a GPU job's own kernel times: the per-operator compute
model (parallel.core.compute) calibrated the way `profiler calibrate` calibrates the CPU one.

    fit = fit_device(traces, model, plan, cluster)   # DeviceFit: the fitted Device and the evidence

Each GPU kernel of the traced steps falls in one class by its name (KERNEL_CLASSES): attention
(FlashAttention, cuDNN's fused SDPA, Transformer Engine's fused attention), GEMM (cuBLAS, cuBLASLt's
nvjet, CUTLASS, hipBLASLt's Cijk) or element-wise (every other compute kernel; communication,
memcpy and memset are left out). Per class, the traced ranks' kernel seconds per step are summed and
set against what the model gives the same ranks -- each rank's pipeline stage with its layers, the
embedding on the first, the output layer and loss on the last, times the microbatches -- from the
kernels' isolated speed (no job efficiency: a trace times kernels, not the gaps between them). The
class's efficiency is then scaled by modelled / measured: GEMMs' sustained efficiency (fp8's too,
by the same ratio, for an FP8 plan), flash attention's, HBM's for element-wise traffic. Exact where a
class runs at its roofline's bound (large GEMMs, attention, element-wise traffic); a job of small
GEMMs, which the model times partly by wave quantization, moves less than the ratio says.

Without flash attention the model's attention core is two batched GEMMs per head and a softmax:
its time joins the GEMM class, as the kernels' names do.

Pure: numpy, pandas and parallel/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from parallel.core.compute import KERNEL_CLASSES, kernel_class_seconds
from parallel.core.devices import Device, cluster_device
from parallel.core.memory import ActivationOptions
from parallel.core.plan import Plan, stage_layer_counts
from parallel.core.specs import Cluster, Model
from profiler.traces.model import Traces

ATTENTION_KERNEL = r"flash|fmha|sdpa|fused_attn|attention|_attn|mha_"
GEMM_KERNEL = r"gemm|cutlass|xmma|cublas|nvjet|cijk_|sm\d+_"
EFFICIENCY_FLOOR = 0.01  # a fitted efficiency below this says the trace is not the plan's job


class DeviceFitError(ValueError):
    """The traces cannot fit the device: no GPU kernels, or the plan does not match them."""


def kernel_classes(names: pd.Series) -> np.ndarray:
    """The class of each kernel name: attention first (cuDNN's SDPA kernels also carry sm90_), then
    GEMM, else element-wise."""
    names = names.astype(str)
    attention = names.str.contains(ATTENTION_KERNEL, case=False, regex=True).to_numpy()
    gemm = names.str.contains(GEMM_KERNEL, case=False, regex=True).to_numpy() & ~attention
    return np.where(attention, "attention", np.where(gemm, "gemm", "elementwise"))


def measured_seconds(traces: Traces, ranks: list[int] | None = None) -> pd.DataFrame:
    """Per traced GPU rank: rank, steps and the seconds per step of each class's kernels inside the
    ProfilerStep windows (the whole trace as one step where it has none)."""
    windows = traces.step_windows
    rows = []
    for rank in ranks if ranks is not None else traces.rank_ids:
        if traces.device_of(rank) != "gpu":
            continue
        ev = traces.rank_events(rank)
        ev = ev[(ev["kind"] == "compute").to_numpy()]
        ts, dur = ev["ts_ns"].to_numpy(np.int64), ev["dur_ns"].to_numpy(np.int64)
        w = windows[windows["rank"] == rank]
        if len(w):
            inside = np.zeros(len(ev), dtype=bool)
            for lo, hi in zip(w["start_ns"].to_numpy(), w["end_ns"].to_numpy()):
                inside |= (ts >= lo) & (ts < hi)
            ev, dur, steps = ev[inside], dur[inside], len(w)
        else:
            steps = 1
        classes = kernel_classes(ev["name"])
        rows.append(
            {
                "rank": int(rank),
                "steps": steps,
                **{c: float(dur[classes == c].sum()) / 1e9 / steps for c in KERNEL_CLASSES},
            }
        )
    return pd.DataFrame(rows, columns=["rank", "steps", *KERNEL_CLASSES])


def modelled_seconds(
    model: Model, plan: Plan, device: Device, ranks: list[int], gpus_per_node: int, acts: ActivationOptions
) -> dict[str, float]:
    """The model's isolated kernel seconds per step of each class, summed over `ranks` (the plan's
    attention kernel: Plan.attention)."""
    parts = kernel_class_seconds(model, plan, device, acts)
    first_n, middle_n, last_n = stage_layer_counts(model.layers, plan)
    topo = plan.topology(gpus_per_node)
    m = max(plan.microbatches, 1)
    total = dict.fromkeys(KERNEL_CLASSES, 0.0)
    for rank in ranks:
        stage = topo.coords_of(rank)["pp"]
        first, last = stage == 0, stage == plan.pp - 1
        layers = first_n if first else last_n if last else middle_n
        for c in KERNEL_CLASSES:
            seconds = layers * parts["layer"][c]
            seconds += parts["embedding"][c] if first else 0.0
            seconds += parts["head"][c] if last else 0.0
            total[c] += m * seconds
    return total


@dataclass(frozen=True)
class DeviceFit:
    base: Device
    device: Device
    rows: pd.DataFrame  # class, measured_s, modelled_s, ratio (modelled / measured), fitted (bool)
    ranks: int
    steps: int

    def to_dict(self) -> dict:
        d = self.device
        return {
            "device": self.base.name,
            "gemm_efficiency": d.gemm_efficiency,
            "fp8_gemm_efficiency": d.fp8_gemm_efficiency,
            "attention_efficiency": d.attention_efficiency,
            "fa2_efficiency": d.fa2_efficiency,
            "memory_efficiency": d.memory_efficiency,
            "ranks": self.ranks,
            "steps": self.steps,
            "classes": self.rows.to_dict("records"),
        }


def fit_device(
    traces: Traces,
    model: Model,
    plan: Plan,
    cluster: Cluster,
    acts: ActivationOptions | None = None,
) -> DeviceFit:
    """The cluster's device with its efficiencies scaled to the traces' kernel times (module docstring)."""
    acts = acts or ActivationOptions()
    base = cluster_device(cluster)
    measured = measured_seconds(traces)
    if not len(measured):
        raise DeviceFitError("no rank of these traces ran on a GPU: fit the device from a GPU job's traces")
    world = plan.world_size
    outside = [r for r in measured["rank"] if r >= world]
    if outside:
        raise DeviceFitError(f"ranks {outside[:5]} are outside the plan's {world} GPUs ({plan.label()})")
    ranks = [int(r) for r in measured["rank"]]
    modelled = modelled_seconds(model, plan, base, ranks, cluster.gpus_per_node, acts)
    got = {c: float(measured[c].sum()) for c in KERNEL_CLASSES}
    if got["attention"] == 0 and modelled["attention"] > 0:  # materialised attention: batched GEMMs
        modelled["gemm"] += modelled["attention"]
        modelled["attention"] = 0.0
    rows = []
    for c in KERNEL_CLASSES:
        ratio = modelled[c] / got[c] if got[c] > 0 and modelled[c] > 0 else float("nan")
        rows.append(
            {"class": c, "measured_s": got[c], "modelled_s": modelled[c], "ratio": ratio, "fitted": ratio == ratio}
        )
    frame = pd.DataFrame(rows)
    scale = {r["class"]: r["ratio"] for r in rows if r["fitted"]}

    def scaled(value: float | None, c: str) -> float | None:
        if value is None or c not in scale:
            return value
        fitted = value * scale[c]
        if fitted < EFFICIENCY_FLOOR:
            raise DeviceFitError(
                f"{c} kernels took {1 / scale[c]:.0f}x the model's time on {base.name}: the traces do not look like "
                f"{model.name} under {plan.label()}"
            )
        return min(1.0, fitted)

    device = dataclasses.replace(
        base,
        name=f"{base.name}, fitted",
        gemm_efficiency=scaled(base.gemm_efficiency, "gemm"),
        fp8_gemm_efficiency=scaled(base.fp8_gemm_efficiency, "gemm")
        if plan.fp8 != "none"
        else base.fp8_gemm_efficiency,
        attention_efficiency=scaled(base.attention_efficiency, "attention"),
        fa2_efficiency=scaled(base.fa2_efficiency, "attention"),
        memory_efficiency=scaled(base.memory_efficiency, "elementwise"),
    )
    return DeviceFit(base, device, frame, len(ranks), int(measured["steps"].max()))
