"""The calibrated model's element-wise class: B_layer from the activation
formula (parallel.core.memory), the prediction's term, the fit of e from the traces' leaf operators,
and which operators are leaves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from parallel.core.calibrated import Calibration, CalibrationError, elementwise_bytes, predict
from parallel.core.memory import activation_bytes_per_layer, activation_components_bytes
from parallel.core.plan import Plan
from parallel.core.specs import MODELS
from profiler.analyzers.calibrate import _fit_elementwise, _fit_work, _leaves
from tests.support.work_samples import work_sample

LONG = dataclasses.replace(MODELS["tiny"], seq_len=256, hidden=128, heads=4)


def test_elementwise_bytes_are_the_activations_a_layer_writes():
    tp = Plan(tp=2, global_batch=2, attention="unfused")  # the scores materialised: recomputation rewrites them
    sp = dataclasses.replace(tp, sp=True)
    assert elementwise_bytes(LONG, tp) == pytest.approx(activation_bytes_per_layer(LONG, tp))
    # SP shards the LayerNorm/dropout/residual tensors plain TP keeps whole on every rank: their work too
    assert elementwise_bytes(LONG, sp) == pytest.approx(activation_bytes_per_layer(LONG, sp))
    assert elementwise_bytes(LONG, sp) < elementwise_bytes(LONG, tp)
    # recomputation writes again what it recomputes: the scores (selective), the whole forward (full)
    parts = activation_components_bytes(LONG, tp)
    scores = sum(parts[k] for k in ("attention.scores", "attention.dropout_mask", "attention.dropout_output"))
    assert scores > 0
    assert elementwise_bytes(LONG, dataclasses.replace(tp, recompute="selective")) == pytest.approx(
        activation_bytes_per_layer(LONG, tp) + scores
    )
    assert elementwise_bytes(LONG, dataclasses.replace(tp, recompute="full")) == pytest.approx(
        2 * activation_bytes_per_layer(LONG, tp)
    )
    # ring CP keeps no scores, but its online softmax writes each block's, and backward again
    ring = Plan(cp=2, cp_kind="ring", global_batch=2)
    block_scores = LONG.dtype_bytes * LONG.heads * 1 * (LONG.seq_len // 2) * LONG.seq_len
    assert elementwise_bytes(LONG, ring) == pytest.approx(activation_bytes_per_layer(LONG, ring) + 2 * block_scores)


def test_the_prediction_pays_e_per_byte_of_every_layer_and_microbatch():
    plan = Plan(pp=2, global_batch=4)  # 4 microbatches, 2 layers a stage
    cal = Calibration(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, elementwise_byte_s=1e-9, cores=0, device="gpu")
    out = predict(LONG, plan, cal)
    slot = 2 * elementwise_bytes(LONG, plan) * 1e-9
    assert out["compute_s"] == pytest.approx(4 * slot)
    assert out["bubble_s"] == pytest.approx(1 * slot)  # (p-1)/v slots of the slowest stage
    assert Calibration.from_dict(cal.to_dict()).elementwise_byte_s == 1e-9
    with pytest.raises(CalibrationError, match="elementwise_byte_s"):
        Calibration.from_dict({**cal.to_dict(), "elementwise_byte_s": -1.0})


def _sample(ops: float, nbytes: float, c: float, e: float, a: float = 0.0) -> dict:
    ew = ops * c + nbytes * e
    return work_sample(
        layers_mb=4.0,
        elementwise_ops=ops,
        elementwise_bytes=nbytes,
        elementwise_s=ew,
        pipeline_work_s=4.0 * a + ew,
        work_s=4.0 * a + ew,
    )


def test_e_is_fitted_apart_from_each_operators_dispatch():
    c, e = 3e-6, 4e-10
    # two plans: many small operators (dispatch-bound) and fewer large ones
    samples = [_sample(2000, 3e6, c, e, a=1e-3), _sample(700, 9e7, c, e, a=1e-3)]
    assert _fit_elementwise(samples) == pytest.approx(e)
    # the per-layer cost is what is left: the dispatch, not the bytes
    w = _fit_work(samples)
    assert w.e == pytest.approx(e)
    assert w.a == pytest.approx(1e-3 + 2000 * c / 4, rel=0.2)  # the layers' fixed cost carries the dispatch
    # one ratio of bytes to operators (one plan's ranks) cannot tell the two apart: no element-wise term
    assert _fit_elementwise([_sample(2000, 3e6, c, e), _sample(4000, 6e6, c, e)]) == 0.0
    assert _fit_elementwise([]) == 0.0


def test_leaves_are_the_operators_that_hold_no_other_on_their_thread():
    rows = [  # (tid, ts, dur, kind, name)
        (1, 0, 100, "cpu_op", "aten::linear"),
        (1, 10, 50, "cpu_op", "aten::addmm"),  # inside linear: the leaf
        (1, 100, 20, "cpu_op", "aten::gelu"),  # starts where linear ends: not inside it
        (1, 130, 40, "cpu_op", "aten::softmax"),
        (1, 130, 30, "cpu_op", "aten::_softmax"),  # same start, shorter: the inner one
        (2, 20, 60, "cpu_op", "aten::mul"),  # another thread, overlapping thread 1's ops: a leaf
        (1, 200, 10, "user_annotation", "ps.phase kind=fwd"),  # not an operator
    ]
    ev = pd.DataFrame(rows, columns=["tid", "ts_ns", "dur_ns", "kind", "name"])
    ts, end = ev["ts_ns"].to_numpy(), (ev["ts_ns"] + ev["dur_ns"]).to_numpy()
    leaf = _leaves(ev, ts, end)
    assert ev["name"][leaf].tolist() == ["aten::addmm", "aten::gelu", "aten::_softmax", "aten::mul"]
    assert not _leaves(ev[ev["kind"] != "cpu_op"], np.array([200]), np.array([210])).any()
