"""Every valid plan trains the serial model: same per-step loss, same gradients, same parameters.

The matrix is generated from the rules, not listed: both architectures (tiny GPT and tiny-llama),
dp, tp, pp, cp in {1, 2, 4} with world size 2..8, SP on and off (tp > 1), each CP exchange
(all-gather, ring, Ulysses; cp > 1), 1F1B and GPipe (pp > 1), and interleaved 1F1B (vpp 2) where
the 4 layers allow it, kept when the plan model (parallel.core.validate) and the engine accept it.
A spread of it runs in CI; `--full-matrix` runs all of it. Each case is
a real multi-process run of `python -m parallel train` (local launcher, gloo) compared with the
same command at world size 1:

* loss of each of 3 optimizer steps within 1e-5 relative (fp32);
* the first step's reduced gradients, gathered to full shape, equal to the serial ones up to fp32
  summation order (this also catches scale errors such as a sum instead of a mean, which Adam's
  per-element normalisation would hide from the loss and the parameters);
* parameters after 3 steps, gathered to full shape, within lr/10: Adam divides each gradient by its
  own running RMS, so an element whose gradient is near zero (cancellation) moves by up to lr in a
  direction set by rounding -- at most 1 element in 1,000 may (assert_params_close; one of the 32,768
  of tiny-llama's embedding did on a CPU whose float sums round otherwise); a real bug moves
  thousands of elements by about lr;
* every dp×cp replica holds bit-identical parameters;
* measured activation bytes equal to parallel.core.memory's formula on every rank, component by
  component (the SwiGLU, GQA, ring and Ulysses terms checked by measurement);
* measured model-state bytes (parameters, gradients, optimizer states: parallel.engine.modelstate)
  within 1% of the formula on every rank.

ZeRO: the plans with dp > 1 again at ZeRO-1, -2 and -3 (ZERO_PLANS), each against the
same serial run; the CI spread ZERO_CI, the rest under `--full-matrix`.
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from itertools import product

import pytest
import torch

from parallel.core.engine_plan import engine_plan
from parallel.core.plan import CP_KINDS, SCHEDULES, Plan
from parallel.core.specs import CLUSTERS, MODELS
from parallel.core.validate import check
from parallel.engine.api import engine_errors
from parallel.engine.metrics import full_state_dict, load_shards
from runfiles.metrics import load_metrics
from tests.conftest import ROOT

STEPS, GLOBAL_BATCH, LR = 3, 8, 1e-3
METRIC_KEYS = (
    "world_size",
    "plan",
    "loss",
    "step_time_s",
    "activation_bytes",
    "activation_breakdown",
    "predicted_activation_bytes",
)


def train_cli(out, *flags, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`python -m parallel train FLAGS --out OUT` with the matrix's steps and batch."""
    cmd = [
        sys.executable,
        "-m",
        "parallel",
        "train",
        "--steps",
        str(STEPS),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--lr",
        str(LR),
        "--out",
        str(out),
        *flags,
    ]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


ARCHS = {"tiny": "", "tiny-llama": "llama"}  # model -> its prefix in plan ids


def plan_id(p: Plan, model: str = "tiny") -> str:
    parts = ([ARCHS[model]] if ARCHS[model] else []) + [
        f"{d}{getattr(p, d)}" for d in ("dp", "tp", "pp", "cp") if getattr(p, d) > 1
    ]
    if p.sp:
        parts.append("sp")
    if p.cp > 1 and p.cp_kind != "allgather":
        parts.append(p.cp_kind)
    if p.pp > 1 and p.schedule == "gpipe":
        parts.append("gpipe")
    if p.vpp > 1:
        parts.append(f"v{p.vpp}")
    if p.zero:
        parts.append(f"z{p.zero}")
    return "-".join(parts)


def plan_flags(p: Plan) -> list[str]:
    flags = [f"--{d}={getattr(p, d)}" for d in ("dp", "tp", "pp", "cp", "vpp")] + [f"--schedule={p.schedule}"]
    return flags + (["--sp"] if p.sp else []) + [f"--cp-kind={p.cp_kind}", f"--zero={p.zero}"]


def matrix() -> dict[str, tuple[str, Plan]]:
    """{plan id: (model, plan)} of every plan the contract covers."""
    plans = {}
    for name in ARCHS:
        model = MODELS[name]
        for dp, tp, pp, cp in product((1, 2, 4), repeat=4):
            world = dp * tp * pp * cp
            if not 1 < world <= 8:
                continue
            for sp, schedule, vpp, kind in product(
                (False, True) if tp > 1 else (False,),
                SCHEDULES if pp > 1 else ("1f1b",),
                (1, 2) if pp > 1 else (1,),
                CP_KINDS if cp > 1 else ("allgather",),
            ):
                plan = Plan(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    sp=sp,
                    micro_batch=1,
                    global_batch=GLOBAL_BATCH,
                    schedule=schedule,
                    vpp=vpp,
                    cp_kind=kind,
                )
                cluster = CLUSTERS["local-cpu"].sized_for(world)
                if check(plan, model, cluster).valid and not engine_errors(model, plan):
                    plans[plan_id(plan, name)] = (name, plan)
    return plans


PLANS = matrix()
ZERO_PLANS = {
    plan_id(z, name): (name, z)
    for name, p in PLANS.values()
    if p.dp > 1
    for z in (replace(p, zero=stage) for stage in (1, 2, 3))
}
ZERO_CI = [
    "dp2-z2",
    "dp2-z3",
    "dp4-z3",
    "dp2-tp2-pp2-sp-z3",
    "dp2-pp2-cp2-gpipe-z2",
    "dp2-tp2-cp2-sp-ring-z3",
    "llama-dp2-tp2-pp2-sp-z2",
    "llama-dp2-pp2-v2-z3",
]
# The CI spread: every parallelism alone, SP with TP and CP, both schedules, degree 4, and 3-D mixes;
# each CP exchange alone and with TP+SP, PP and DP; the llama architecture alone and in 3-D plans.
CI = [
    "dp2",
    "tp2-sp",
    "pp2",
    "pp2-gpipe",
    "cp2",
    "tp2-cp2-sp",
    "dp2-tp2-pp2-sp",
    "tp4",
    "pp4",
    "dp2-pp2-cp2-gpipe",
    "tp2-pp2-sp-v2",
    "cp2-ring",
    "tp2-cp2-sp-ring",
    "dp2-pp2-cp2-ulysses",
    "llama-tp2-sp",
    "llama-tp4",
    "llama-cp4-ring",
    "llama-tp2-cp2-sp-ulysses",
    "llama-tp2-pp2-cp2-sp-ring",
    "llama-dp2-tp2-pp2-sp",
]
# Engine features outside the contract's matrix, checked against the same serial run.
# (model flags of the serial run, flags of the parallel run)
FEATURES = {
    "zero1-mb2-buckets-dp2-cp2": ((), ["--dp=2", "--cp=2", "--zero=1", "--micro-batch=2", "--bucket-mb=0.05"]),
    "recompute-all-tp2-sp": ((), ["--tp=2", "--sp", "--recompute=full"]),
    "recompute-selective-order-dp2-pp2": ((), ["--dp=2", "--pp=2", "--recompute=selective", "--order=tp-cp-pp-dp"]),
    "ring-recompute-full-tp2-cp2-sp": ((), ["--tp=2", "--cp=2", "--sp", "--cp-kind=ring", "--recompute=full"]),
    "ulysses-recompute-selective-cp2": ((), ["--cp=2", "--cp-kind=ulysses", "--recompute=selective"]),
    # GQA with tp > kv_heads: each pair of TP ranks shares one K/V head
    "llama-kv2-replicated-tp4-sp-cp2-ring": (
        ("--model=tiny-llama", "--kv-heads=2"),
        ["--tp=4", "--sp", "--cp=2", "--cp-kind=ring"],
    ),
    "llama-swiglu-unfused-tp2-pp2": (("--model=tiny-llama",), ["--tp=2", "--pp=2", "--swiglu=unfused"]),
    # ZeRO-3's layers gathered for the forward replayed inside backward, and GQA's shared K/V rows
    # summed over their TP pair on the gradient shards
    "zero3-recompute-full-dp2-pp2": ((), ["--dp=2", "--pp=2", "--zero=3", "--recompute=full"]),
    "zero3-llama-kv2-replicated-dp2-tp4-sp": (
        ("--model=tiny-llama", "--kv-heads=2"),
        ["--dp=2", "--tp=4", "--sp", "--zero=3"],
    ),
}


def test_matrix_is_generated_and_covers_the_contract():
    plans = [p for _, p in PLANS.values()]
    assert len(PLANS) > 200
    assert set(CI) <= set(PLANS)
    assert {p.world_size for p in plans} == {2, 4, 8}
    assert any(p.dp == p.tp == p.pp == 2 and p.sp for p in plans)
    assert any(p.cp == 4 for p in plans) and any(p.tp == 4 and p.sp for p in plans)
    assert any(p.vpp == 2 and p.dp == 2 for p in plans)
    for name in ARCHS:  # each CP exchange at cp 2 and 4, with and without TP+SP, for both architectures
        for kind in CP_KINDS:
            mine = [p for m, p in PLANS.values() if m == name and p.cp > 1 and p.cp_kind == kind]
            assert {p.cp for p in mine} == {2, 4} and any(p.tp > 1 and p.sp for p in mine), (name, kind)


@pytest.fixture(scope="session")
def serials(tmp_path_factory):
    """The serial run of a model (its flags), made once per session when first asked for."""
    runs: dict[tuple, dict] = {}

    def get(model_flags=()) -> dict:
        key = tuple(model_flags)
        if key not in runs:
            out = tmp_path_factory.mktemp("serial")
            r = train_cli(out, "--save-params", *key)
            assert r.returncode == 0, r.stderr[-3000:]
            runs[key] = {
                "metrics": load_metrics(out),
                "params": full_state_dict(out),
                "grads": full_state_dict(out, key="grads"),
            }
        return runs[key]

    return get


@pytest.fixture(scope="session")
def serial(serials):
    return serials()


def assert_params_close(got: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    """Within lr/10 but for the few elements rounding decides (module docstring): an element whose
    gradient cancels to ~0 in one run and exactly 0 in the other is moved by Adam by up to about lr a
    step in one of them only. At most 1 in 1,000 elements (and 2 in a small tensor) may be that far,
    and none beyond what Adam can move an element in STEPS steps; a real bug moves thousands."""
    assert got.shape == ref.shape, name
    diff = (got - ref).abs()
    far = int((diff > LR / 10).sum())
    assert far <= max(2, diff.numel() // 1000), f"{name}: {far} of {diff.numel()} elements off by more than lr/10"
    assert float(diff.max()) <= 4 * STEPS * LR, f"{name}: an element off by {float(diff.max()):.2e}"


def check_against_serial(out, serial, *, world_size: int, grads: bool = True):
    m = load_metrics(out)
    assert all(k in m for k in METRIC_KEYS)
    assert m["world_size"] == world_size and len(m["loss"]) == STEPS and len(m["step_time_s"]) == STEPS
    assert set(m["activation_bytes"]) == {str(r) for r in range(world_size)}
    for ours, ref in zip(m["loss"], serial["metrics"]["loss"]):
        assert abs(ours - ref) <= 1e-5 * abs(ref), (m["loss"], serial["metrics"]["loss"])
    if grads:
        g = full_state_dict(out, key="grads")
        assert g.keys() == serial["grads"].keys()
        for name, ref in serial["grads"].items():
            torch.testing.assert_close(g[name], ref, rtol=1e-4, atol=1e-6 * ref.abs().max().item(), msg=name)
    params = full_state_dict(out)
    assert params.keys() == serial["params"].keys()
    for name, ref in serial["params"].items():
        assert_params_close(params[name], ref, name)
    shards = load_shards(out)
    for s in shards.values():  # replicas: same (pp, tp) coordinates, any dp and cp
        twin = next(
            t
            for t in shards.values()
            if (t["coords"]["pp"], t["coords"]["tp"]) == (s["coords"]["pp"], s["coords"]["tp"])
        )
        for name, tensor in s["params"].items():
            assert torch.equal(tensor, twin["params"][name]), (s["coords"], name)
    for rank, measured in m["activation_bytes"].items():
        assert measured == m["predicted_activation_bytes"][rank], rank
        assert m["activation_breakdown"][rank] == m["predicted_activation_breakdown"][rank], rank
    for rank, held in m["model_state_bytes"].items():
        predicted = m["predicted_model_state_bytes"][rank]
        assert held.keys() == predicted.keys() == {"params", "grads", "optimizer"}
        for kind, n in held.items():
            assert abs(n - predicted[kind]) <= 0.01 * predicted[kind], (rank, kind, n, predicted[kind])
    return m


def run_plan(model: str, plan: Plan, serials, tmp_path):
    flags = () if model == "tiny" else (f"--model={model}",)
    r = train_cli(tmp_path, "--save-params", *flags, *plan_flags(plan))
    assert r.returncode == 0, r.stderr[-3000:]
    # the first step's reduced gradients are kept whole only without ZeRO (each rank has its shard)
    m = check_against_serial(tmp_path, serials(flags), world_size=plan.world_size, grads=plan.zero == 0)
    assert m["plan"] == engine_plan(plan, dropout=0.0).to_dict()  # the engine's attention, no dropout flag
    return m


@pytest.mark.slow
@pytest.mark.parametrize("pid", CI)
def test_plan_trains_the_serial_model(pid, serials, tmp_path):
    run_plan(*PLANS[pid], serials, tmp_path)


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("pid", [p for p in PLANS if p not in CI])
def test_plan_trains_the_serial_model_all(pid, serials, tmp_path):
    run_plan(*PLANS[pid], serials, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FEATURES))
def test_engine_feature_trains_the_serial_model(name, serials, tmp_path):
    model_flags, flags = FEATURES[name]
    r = train_cli(tmp_path, "--save-params", *model_flags, *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    world = json.loads((tmp_path / "metrics.json").read_text())["world_size"]
    sharded = any(f.startswith("--zero=") and f != "--zero=0" for f in flags)
    check_against_serial(tmp_path, serials(model_flags), world_size=world, grads=not sharded)


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("global_batch", [4, 8])  # 4: m = p, every microbatch in the warm-up
def test_interleaved_pp4_vpp2_trains_the_serial_8_layer_model(global_batch, tmp_path):
    """The tiny model's 4 layers allow only pp2 vpp2; 8 layers give pp4 vpp2."""
    flags = ["--layers=8", "--save-params", f"--global-batch={global_batch}"]
    serial, out = tmp_path / "serial", tmp_path / "pp4v2"
    assert train_cli(serial, *flags).returncode == 0
    ref = {
        "metrics": load_metrics(serial),
        "params": full_state_dict(serial),
        "grads": full_state_dict(serial, key="grads"),
    }
    r = train_cli(out, *flags, "--pp=4", "--vpp=2")
    assert r.returncode == 0, r.stderr[-3000:]
    check_against_serial(out, ref, world_size=4)


def test_zero_matrix_covers_every_stage_with_each_parallelism():
    plans = [p for _, p in ZERO_PLANS.values()]
    assert set(ZERO_CI) <= set(ZERO_PLANS)
    assert {p.zero for p in plans} == {1, 2, 3} and {p.dp for p in plans} == {2, 4}
    for stage in (2, 3):
        mine = [p for p in plans if p.zero == stage]
        assert any(p.tp > 1 and p.sp for p in mine) and any(p.pp > 1 for p in mine) and any(p.cp > 1 for p in mine)


@pytest.mark.slow
@pytest.mark.parametrize("pid", ZERO_CI)
def test_zero_plan_trains_the_serial_model(pid, serials, tmp_path):
    m = run_plan(*ZERO_PLANS[pid], serials, tmp_path)
    zero, nd = m["plan"]["zero"], m["plan"]["dp"] * m["plan"]["cp"]
    for rank, held in m["model_state_bytes"].items():  # sharded: less than the replicated state
        transient = m["model_state_transient_bytes"][rank]
        assert held["grads"] < held["params"] if zero == 2 else held["grads"] == held["params"]
        assert (transient["gathered_params"] > 0) == (zero == 3) and transient["unsharded_grads"] > 0
        assert held["optimizer"] == 2 * held["grads"] and nd > 1


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("pid", [p for p in ZERO_PLANS if p not in ZERO_CI])
def test_zero_plan_trains_the_serial_model_all(pid, serials, tmp_path):
    run_plan(*ZERO_PLANS[pid], serials, tmp_path)
