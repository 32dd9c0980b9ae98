"""AppTest of the Long-context page: memory and communication from 4K to 1M tokens per
variant, each number parallel.core's own, the smallest plan that fits, and a real run's measured
activations sitting on its curve."""

import dataclasses
import subprocess
import sys

import pytest

from parallel.core import memory
from parallel.core.long_context import LENGTHS
from parallel.core.memory import ActivationOptions
from parallel.core.plan import Plan
from parallel.core.specs import MODELS
from tests.conftest import ROOT
from tests.support.apptest import page_test, vega_charts

L70 = {"model": "llama3-70b", "cluster": "dgx-h100", "nodes": "8", "dp": "1", "tp": "8", "pp": "1", "gb": "1"}


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def _frame(chart, column):
    return next(f for f in chart.datasets.values() if column in f.columns)


def test_memory_from_4k_to_1m_per_variant_is_the_plan_models():
    at = _ok(page_test("pages/long_context.py", {**L70, "recompute": "selective", "lc_cp": "16", "attn": "unfused"}))
    mem, comm = vega_charts(at)[:2]
    curves = _frame(mem, "cp_kind")
    assert set(curves["seq_len"]) == set(LENGTHS) and min(LENGTHS) == 4096 and max(LENGTHS) == 2**20
    # 8 K/V heads cannot be split over cp·tp = 128 ranks: no Ulysses curve, and the rest are there
    assert set(curves["variant"]) == {"TP8", "TP8+SP", "TP8+SP+CP16 all-gather", "TP8+SP+CP16 ring"}
    m = dataclasses.replace(MODELS["llama3-70b"], seq_len=2**20)
    p = Plan(tp=8, sp=True, cp=16, cp_kind="ring", recompute="selective", attention="unfused")
    opts = ActivationOptions()
    want = memory.activation_bytes_per_layer(m, p, opts) * m.layers
    want += memory.first_stage_extra_bytes(m, p, opts) + memory.last_stage_extra_bytes(m, p, opts)
    got = curves.set_index(["variant", "seq_len"]).loc[("TP8+SP+CP16 ring", 2**20), "bytes"]
    assert got == pytest.approx(want)
    at_1m = curves[curves["seq_len"] == 2**20].set_index("variant")["bytes"]
    assert at_1m["TP8"] > at_1m["TP8+SP"] > at_1m["TP8+SP+CP16 all-gather"] > at_1m["TP8+SP+CP16 ring"]
    # TP stays on NVLink; CP over 16 × 8 = 128 GPUs crosses nodes: InfiniBand
    links = _frame(comm, "link")
    assert set(links.loc[links["variant"] == "TP8", "link"]) == {"NVLink"}
    assert "InfiniBand" in set(links.loc[links["variant"].str.contains("CP16"), "link"])
    fits = at.dataframe[0].value
    assert list(fits["seq_len"]) == list(LENGTHS) and fits["fits"].all()
    assert fits["gpus"].is_monotonic_increasing and fits["gpus"].iloc[-1] > fits["gpus"].iloc[0]
    assert any("SP is not CP" in m.value for m in at.markdown)


def test_flash_attention_reaches_every_curve():
    plain = _ok(page_test("pages/long_context.py", {**L70, "lc_cp": "8", "attn": "unfused"}))
    flash = _ok(page_test("pages/long_context.py", {**L70, "lc_cp": "8", "attn": "fused"}))
    a = _frame(vega_charts(plain)[0], "cp_kind").set_index(["variant", "seq_len"])["bytes"]
    b = _frame(vega_charts(flash)[0], "cp_kind").set_index(["variant", "seq_len"])["bytes"]
    assert (b.loc["TP8"] < a.loc["TP8"]).all()  # no s × s scores
    assert (b.loc["TP8+SP+CP8 ring"] == a.loc["TP8+SP+CP8 ring"]).all()  # ring never kept them


@pytest.mark.slow
def test_a_real_run_sits_on_its_curve(tmp_path, monkeypatch):
    out = tmp_path / "runs" / "lc-ring"
    r = subprocess.run(
        [sys.executable, "-m", "parallel", "train", "--model", "tiny-llama", "--cp", "2", "--cp-kind", "ring"]
        + ["--steps", "1", "--global-batch", "2", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    query = {"model": "tiny-llama", "cluster": "local-cpu", "nodes": "1", "gpn": "2", "dp": "1", "tp": "1"}
    query |= {"pp": "1", "cp": "2", "sp": "0", "gb": "1", "lc_cp": "2"}
    monkeypatch.setenv("PARASCOPE_RUNS", str(tmp_path / "runs"))
    at = _ok(page_test("pages/long_context.py", query))
    mem = vega_charts(at)[0]
    (point,) = _frame(mem, "run").to_dict("records")
    assert point["run"] == "lc-ring" and point["variant"] == "TP1+CP2 ring" and point["seq_len"] == 64
    curve = _frame(mem, "cp_kind").set_index(["variant", "seq_len"])["bytes"]
    assert curve.loc[("TP1+CP2 ring", 64)] == point["bytes"]  # measured = the formula, on the curve


def test_the_smallest_plan_that_fits_saves_what_the_plan_saves():
    """Recomputing core_attn+mlp and offloading the norms cut Llama-3 70B's activations at 32K tokens to
    about 60% of plain selective recompute on the curves; the table under them uses the same settings:
    its plans carry them (label) and need no more GPUs than without."""
    settings = {"recompute": "selective", "rcm": "core_attn+mlp", "offl": "attn_norm+mlp_norm"}
    at = _ok(page_test("pages/long_context.py", {**L70, **settings, "lc_cp": "4"}))
    plain = _ok(page_test("pages/long_context.py", {**L70, "recompute": "selective", "lc_cp": "4"}))
    curves = [_frame(vega_charts(a)[0], "cp_kind").set_index(["variant", "seq_len"])["bytes"] for a in (at, plain)]
    assert curves[0].loc[("TP8+SP", 32768)] < 0.7 * curves[1].loc[("TP8+SP", 32768)]
    fits, plain_fits = at.dataframe[0].value, plain.dataframe[0].value
    assert all("rc-selective[core_attn+mlp] offload[attn_norm+mlp_norm]" in p for p in fits["plan"])
    assert (fits["gpus"] <= plain_fits["gpus"]).all() and (fits["memory_GiB"] != plain_fits["memory_GiB"]).any()
    caption = " ".join(c.value for c in at.caption)
    assert caption.count("recompute selective of core_attn+mlp, attn_norm+mlp_norm offloaded") >= 2


def test_nothing_fits_says_which_term_and_what_would_make_room():
    """GPT-3 175B at 1M tokens: no plan fits, because its learned position table puts the weights
    over the GPU on the first stage; the page says so with the numbers, not a bare 'nothing fits'."""
    gpt = {"model": "gpt3-175b", "cluster": "dgx-h100", "nodes": "64", "dp": "8", "tp": "8", "pp": "8"}
    at = _ok(page_test("pages/long_context.py", {**gpt, "gb": "1536", "sp": "1"}))
    (warning,) = [w.value for w in at.warning if "nothing fits" in w.value]
    assert warning.startswith("1,048,576 tokens: nothing fits — the least loaded plan, DP1 TP8+SP")
    assert "learned position table grows with the length" in warning and "GiB parameters" in warning
    assert "budget is 72.0 GiB" in warning
    table = at.dataframe[0].value
    assert "why" not in table and table["fits"].sum() == len(LENGTHS) - 1
    # eight decades of GiB: the plot keeps the chart's height (its legend on the right, not below)
    spec = vega_charts(at)[0].spec
    assert spec["height"] >= 400 and spec["layer"][0]["encoding"]["color"]["legend"]["orient"] == "right"


@pytest.mark.parametrize(
    "attention, hidden", [("fused", {"TP8+SP+CP8 ring": "TP8+SP+CP8 all-gather"}), ("unfused", {})]
)
def test_the_page_says_which_memory_curves_lie_on_each_other(attention, hidden):
    """Under a flash kernel all-gather CP keeps only its own K/V, as ring does: their curves are one line,
    and the page says so rather than leave a legend entry with no line of its own; with the scores kept
    (unfused) all-gather needs more and both lines show."""
    query = {**L70, "nodes": "1", "sp": "1", "lc_cp": "8", "attn": attention}
    at = _ok(page_test("pages/long_context.py", query))
    curves = _frame(vega_charts(at)[0], "cp_kind").set_index(["variant", "seq_len"])["GiB"]
    ring, gather = curves["TP8+SP+CP8 ring"], curves["TP8+SP+CP8 all-gather"]
    assert (ring[131072] == gather[131072]) == (attention == "fused")  # 43.0 GiB both; 2,607 GiB unfused
    notes = [c.value for c in at.caption if c.value.startswith("Drawn on top of each other")]
    assert notes == (
        [f"Drawn on top of each other (the same bytes at every length): {k} over {v}." for k, v in hidden.items()]
    )
