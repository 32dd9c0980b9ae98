"""Measured activation memory of real multi-process runs against parallel.core.memory.

The matrix (test_engine_matrix.py) checks measurement = formula for every plan without dropout;
here dropout is on, so every component of Korthikanti et al. 2022 Sec. 4.1 exists (attention and
residual dropout masks, the dropout output), under TP2 × CP2 × PP2 with and without SP. SP must
shrink exactly the tensors it shards, by exactly tp: the LayerNorm inputs and residual dropout masks
(the paper's "layernorm/dropout/residual" group) and the stored inputs of the column-parallel GEMMs.
"""

import pytest

from parallel.core.memory import COMPONENT_GROUP
from runfiles.metrics import load_metrics
from tests.integration.test_engine_matrix import train_cli

pytestmark = pytest.mark.slow

PLAN = ["--tp=2", "--cp=2", "--pp=2", "--dropout=0.1", "--steps=1", "--global-batch=2"]
SHARDED_BY_SP = {"layernorm", "residual.dropout_masks", "attention.qkv_input", "mlp.fc1_input", "first_stage_extra"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, flags in (("tp", PLAN), ("tp+sp", PLAN + ["--sp"])):
        d = tmp_path_factory.mktemp(name.replace("+", "-"))
        r = train_cli(d, *flags)
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = load_metrics(d)
    return out


@pytest.mark.parametrize("name", ["tp", "tp+sp"])
def test_measured_equals_formula_with_dropout(runs, name):
    m = runs[name]
    for rank, measured in m["activation_breakdown"].items():
        predicted = m["predicted_activation_breakdown"][rank]
        assert "attention.dropout_mask" in measured and "residual.dropout_masks" in measured
        assert measured.keys() == predicted.keys()
        for component, n in measured.items():
            assert n == pytest.approx(predicted[component], rel=0.02), (rank, component)
        assert m["activation_bytes"][rank] == pytest.approx(m["predicted_activation_bytes"][rank], rel=0.02)


def test_sp_shrinks_exactly_what_it_shards_by_exactly_tp(runs):
    tp, sp = runs["tp"], runs["tp+sp"]
    assert tp["coords"] == sp["coords"]
    for rank in tp["activation_breakdown"]:
        a, b = tp["activation_breakdown"][rank], sp["activation_breakdown"][rank]
        for component in a:
            ratio = a[component] / b[component]
            if component in SHARDED_BY_SP:
                assert ratio == 2, (rank, component)  # tp = 2, exactly
            elif component == "last_stage_extra":  # final LayerNorm and output-layer inputs shrink, logits do not
                assert 1 < ratio < 2
            else:
                assert ratio == 1, (rank, component)
        part = lambda d: sum(v for k, v in d.items() if COMPONENT_GROUP.get(k) == "layernorm/dropout/residual")
        assert part(a) == 2 * part(b) > 0
