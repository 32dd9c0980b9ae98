"""bench.published (the step model against published GPU runs) and bench.gpu_kernels' offline
comparison: the translation of a run into a plan, what is refused and why, and -- where the
shared published runs are at hand -- the goal the model is held to."""

import json
import re
from pathlib import Path

import pytest

from bench import gpu_kernels, published
from parallel.core import compute
from parallel.core.devices import DEVICES
from parallel.core.pipeline_layout import parse_layout
from parallel.core.validate import check

RUNS = Path(__file__).resolve().parents[3] / "shared" / "published_runs.json"


def run(**over):
    base = {
        "source": {"repo_file": "NVIDIA/NeMo docs/source/performance/performance_summary.md", "row": "x"},
        "hardware": {"gpu": "H100 80GB SXM (DGX-H100)", "gpus_per_node": 8},
        "model": {
            "name": "LLAMA3-8B",
            "arch": "Llama",
            "layers": 32,
            "hidden": 4096,
            "heads": 32,
            "kv_heads": 8,
            "ffn_hidden": 14336,
            "vocab": 128256,
            "seq_len": 8192,
        },
        "parallel": {
            "num_gpus": 8,
            "tp": 1,
            "pp": 1,
            "vp": 1,
            "cp": 1,
            "ep": 1,
            "micro_batch": 1,
            "global_batch": 128,
            "precision": "FP8",
            "recompute": None,
            "optimizer_sharding": None,
            "overlap_flags": None,
            "sequence_parallel": None,
            "other": None,
        },
        "result": {"tokens_per_s_per_gpu": 14000, "iteration_time_s": None, "tflops_per_gpu": None, "other": None},
        "notes": "",
    }
    for key, value in over.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) else value
    return base


def test_a_run_becomes_its_frameworks_plan_and_a_step_time():
    case = published.translate(0, run())
    p = case.plan
    assert (p.dp, p.tp, p.zero, p.fp8, p.grad_reduce_overlap, p.param_gather_overlap) == (8, 1, 1, "gemm", True, True)
    assert case.measured_step_s == pytest.approx(128 * 8192 / (14000 * 8))
    row = published.predict(case)
    assert row["error"] == pytest.approx(case.measured_step_s / row["predicted_step_s"] - 1)
    assert any("Megatron-core performance recipe" in a for a in row["assumptions"])


@pytest.mark.parametrize(
    "over,reason",
    [
        ({"parallel": {"tp": None}}, "parallel degrees not given"),
        (
            {"parallel": {"tp": None, "pp": None, "other": {"scheme": "ZeRO-3", "model_parallel_size_M": 2}}},
            "ambiguous",
        ),
        (
            {"parallel": {"tp": None, "pp": None, "dp": 8, "other": {"scheme": "ZeRO-3", "model_parallel_size_M": 1}}},
            "DeepSpeed ZeRO-3 of 2021",
        ),
        ({"hardware": {"gpu": "H100 SXM 96GB HBM2e, 500W power limit"}}, "power-capped"),
        ({"result": {"tokens_per_s_per_gpu": None}}, "not convertible"),
        ({"notes": "Early ramp-up (GBS=16)"}, "not a steady-state"),
        ({"model": {"name": "Mystery", "ffn_hidden": None}}, "no known config"),
    ],
)
def test_incomplete_runs_are_left_out_with_the_reason(over, reason):
    with pytest.raises(published.Skip, match=reason):
        published.translate(0, run(**over))


@pytest.mark.skipif(not RUNS.is_file(), reason="../shared/published_runs.json not present")
def test_every_family_is_reported_and_the_dense_ones_meet_the_goal(capsys):
    assert published.main(["--runs", str(RUNS), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    families = out["summary"]["by_family"]
    assert list(families) == list(published.FAMILIES)
    for f in published.FAMILIES:  # each family predicted, with its mean and worst
        st = families[f]
        assert st["runs"] >= 5 and 0 <= st["mean_abs_error"] <= st["worst_abs_error"]
        assert all(r["family"] in published.FAMILIES for r in out["predicted"])
    for f in ("dense", "Blackwell"):  # the families the model is held to today (bench/README.md)
        assert families[f]["mean_abs_error"] <= 0.10 and families[f]["worst_abs_error"] <= 0.20
    runs = json.loads(RUNS.read_text())["runs"]
    assert len(out["predicted"]) + len(out["skipped"]) == len(runs)  # every run predicted or left out
    assert all(s["reason"] and "\n" not in s["reason"] for s in out["skipped"])


@pytest.mark.skipif(not RUNS.is_file(), reason="../shared/published_runs.json not present")
def test_the_text_report_gives_each_family_its_mean_worst_and_the_skip_reasons(capsys):
    assert published.main(["--runs", str(RUNS)]) == 0
    text = capsys.readouterr().out
    for f in published.FAMILIES:
        assert f"== {f}:" in text
        assert re.search(rf"^   {re.escape(f)}: mean \|error\| [0-9.]+%, worst [0-9.]+% \((meets|misses)", text, re.M)
    assert re.search(r"^\s+22 Korthikanti 2022 .* parallel degrees not given", text, re.M)


def test_each_run_falls_in_one_family():
    dense = published.translate(0, run(model={"seq_len": 4096}))
    assert published.family(dense) == "dense"
    long = published.translate(0, run(model={"seq_len": 32768}, parallel={"cp": 2, "global_batch": 64}))
    assert published.family(long) == "long context"
    gb = published.translate(0, run(hardware={"gpu": "GB200", "gpus_per_node": None}))
    assert published.family(gb) == "Blackwell"
    moe = published.translate(
        0,
        run(
            model={"name": "Qwen3_30B_a3B", "layers": None, "seq_len": 4096},
            hardware={"gpu": "GB300"},
            parallel={"ep": 8, "global_batch": 512},
        ),
    )
    assert published.family(moe) == "MoE"  # MoE before Blackwell


def test_deepseek_v3_is_the_mla_preset_with_its_recipe_pipeline_layout():
    ds = run(
        model={"name": "DeepSeekV3", "layers": None, "seq_len": 4096},
        hardware={"gpu": "GB200", "gpus_per_node": None},
        parallel={"num_gpus": 256, "tp": 1, "pp": 4, "vp": 4, "ep": 64, "global_batch": 4096, "precision": "BF16"},
    )
    case = published.translate(0, ds)
    assert case.model.mla and case.model.kv_lora_rank == 512 and case.model.moe_pattern[:4] == (0, 0, 0, 1)
    # Megatron-Bridge's (4, 4) layout: E + 4 | 4 x 14 | 1 + mtp + loss -> ranks of 16, 16, 16, 13 layers,
    # the plan's own layout (its summary: the last rank's 13, the rest even), valid though 13 / vpp 4 is not whole
    assert case.plan.pp_layout == published.SIXTEEN_STAGES
    assert (case.plan.vpp, case.plan.first_stage_layers, case.plan.last_stage_layers) == (4, None, 13)
    assert not [e for e in check(case.plan, case.model, case.cluster).errors if not e.startswith("memory per GPU")]
    assert case.cluster.nvlink_domain == 64  # Slurm --segment 16 trays of 4 GPUs
    with pytest.raises(published.Skip, match="no pipeline layout"):
        published.translate(0, run(**{**ds, "parallel": {**ds["parallel"], "pp": 2, "vp": 2}}))


@pytest.mark.parametrize("key,ranks", [((4, 4), (16, 13)), ((8, 4), (7, 6)), ((2, 4), (32, 29)), ((4, 1), (16, 13))])
def test_deepseek_layouts_parse_to_each_ranks_layers(key, ranks):
    """Rank r holds virtual stages r, r + pp, ...: (4, 4)'s E+4 | 4 x 14 | 1+mtp+loss gives rank 0 stages
    0, 4, 8, 12 (4 x 4) and rank 3 stages 3, 7, 11, 15 (4 + 4 + 4 + 1)."""
    layout = parse_layout(published.DEEPSEEK_LAYOUTS[key], key[0], 61)  # DeepSeek-V3's layers, each once
    assert (layout.rank_layers()[0], layout.rank_layers()[-1]) == ranks and layout.vpp == key[1]


@pytest.mark.parametrize("world,domain", [(8, 8), (64, 64), (72, 72), (256, 64), (128, 64), (96, 48), (576, 72)])
def test_nvl72_domain_follows_the_launchers_slurm_segment(world, domain):
    # Megatron-Bridge scripts/performance/utils/executors.py: segment = trays if <= 18, else the
    # largest divisor of the trays up to 18 (256 GPUs = 64 trays -> 16; 96 = 24 trays -> 12)
    assert published.nvl72_domain(world) == domain


def test_nemo_long_sequence_rows_use_the_whole_s2_count_and_4m_tokens_a_step():
    r = run(
        source={"repo_file": "NVIDIA/NeMo docs/source/performance/performance_long_sequence.md", "row": "SeqLen 32K"},
        model={"name": "LLAMA2-7B", "layers": None, "seq_len": 32768},
        parallel={"num_gpus": 32, "tp": 2, "cp": 2, "micro_batch": None, "global_batch": None},
        result={
            "tokens_per_s_per_gpu": None,
            "tflops_per_gpu": 610,
            "tflops_kind": "TFLOPS/GPU (model vs hardware not stated)",
        },
    )
    case = published.translate(0, r)
    assert (case.plan.micro_batch, case.plan.global_batch) == (1, 4 * 2**20 // 32768)
    whole = published.flops_per_step(case.model, case.plan, causal=False)["model_flops"]
    assert case.measured_step_s == pytest.approx(whole / (32 * 610e12))
    assert "whole" in case.measured_from


def test_the_nemo_24_07_table_counts_the_whole_s2():
    # the 24.07 row LLAMA3-8B, 8 GPUs: 12,036 tokens/s and 697 TFLOP/s a GPU -> 5.79e10 FLOPs a token,
    # the whole-s^2 count (the causal half would be 5.15e10)
    case = published.translate(0, run(parallel={"cp": 2}))
    tokens = case.plan.global_batch * case.model.seq_len
    whole = published.flops_per_step(case.model, case.plan, causal=False)["model_flops"] / tokens
    half = published.flops_per_step(case.model, case.plan, causal=True)["model_flops"] / tokens
    assert whole == pytest.approx(697e12 / 12036, rel=2e-3) and half == pytest.approx(5.147e10, rel=2e-3)


def test_gpu_kernels_compares_offline_against_the_model():
    dev = DEVICES["h200-sxm"]
    shapes = [(8192, 8192, 8192), (4096, 14336, 4096)]
    data = {
        "device": "synthetic",
        "sms": 132,
        "torch": "-",
        "gemm_grid": [
            {"m": m, "n": n, "k": k, "seconds": float(compute.gemm_seconds(dev, m, n, k))} for m, n, k in shapes
        ],
        "gemm_layers": [],
        "fp8_grid": [{"m": 8192, "n": 8192, "k": 8192, "seconds": 1e-6}],  # implausibly fast: ratio far from 1
    }
    lines = gpu_kernels.compare(data, dev)
    grid = next(x for x in lines if x.startswith("gemm_grid"))
    assert "median 1.00" in grid and "2 points" in grid
    assert "shorter than 30 us left out" in next(x for x in lines if x.startswith("fp8_grid"))


def test_rank_finds_the_runs_plan_and_a_top_plan_no_slower_than_it():
    short = run(model={"seq_len": 2048})  # at 8192 tokens this plan does not fit without recompute
    case = published.translate(0, short)
    r = published.rank_of(case)
    assert r["rank"] is not None and 1 <= r["rank"] <= r["of"]
    assert r["top_step_s"] <= published.predict(case)["predicted_step_s"] * 1.0001
    assert r["gain"] == pytest.approx(case.measured_step_s / r["top_step_s"] - 1)
    lines = published.rank_lines([short], None)
    assert lines[1].split()[0] == "0" and "faster than measured" in lines[-1]


def test_the_b200_long_sequence_rows_read_as_nemo_2504_under_its_whole_s2_count():
    """NeMo's B200 long-sequence table (container 25.04, in bench/data): every row is predicted, under
    the whole-s x s FLOP count NeMo used until August 2025, and lands within the family goal."""
    path = Path(published.__file__).parent / "data" / "nemo_25_04_long_sequence_b200.json"
    rows = []
    for i, r in enumerate(json.loads(path.read_text())["runs"]):
        case = published.translate(i, r)
        assert case.source == "NeMo 25.04 long sequence" and "whole-s²" in case.measured_from
        rows.append(published.predict(case))
    assert len(rows) == 8 and {r["family"] for r in rows} == {"long context", "Blackwell"}
    errors = [abs(r["error"]) for r in rows]
    assert sum(errors) / len(errors) <= published.GOAL_MEAN and max(errors) <= published.GOAL_WORST


def test_a_run_given_as_its_launch_command_is_read_by_the_importer():
    """The Megatron-MoE-ModelZoo rows (bench/data): each is its authors' training command, imported as
    `parallel plan --import` reads it; every one is predicted, with the importer's notes beside it."""
    path = Path(published.__file__).parent / "data" / "megatron_moe_modelzoo_h100.json"
    cases = [published.translate(i, r) for i, r in enumerate(json.loads(path.read_text())["runs"])]
    assert len(cases) == 5 and {c.source for c in cases} == {"Megatron-MoE-ModelZoo"}
    first = cases[0]
    assert first.model.name.startswith("qwen3-235b-a22b") and first.cluster.gpus == 256
    p = first.plan
    assert (p.dp, p.tp, p.pp, p.vpp, p.ep, p.expert_tp, p.moe_dispatcher) == (16, 2, 8, 4, 32, 1, "flex")
    assert p.embedding_in_split and p.loss_in_split and set(p.recompute_modules.split("+")) == {"layernorm", "moe_act"}
    assert cases[1].plan.ep_overlap and cases[1].plan.delay_wgrad
    assert cases[2].plan.zero == 3 and cases[2].plan.recompute == "full"
    assert all(published.predict(c)["family"] == "MoE" for c in cases)


def test_a_launch_the_importer_cannot_read_is_left_out_with_its_reason():
    bad = {
        "source": {"row": "x"},
        "cluster": "dgx-h100",
        "nodes": 1,
        "launch": "echo hi",
        "result": {"iteration_time_s": 1.0},
    }
    with pytest.raises(published.Skip, match="launch not importable: .*no Megatron-LM launch found"):
        published.translate(0, bad)
    with pytest.raises(published.Skip, match="no iteration time"):
        published.translate(0, {**bad, "result": {}})


def test_megatron_lm_weak_scaling_reads_under_its_whole_s2_count():
    """Megatron-LM's H100 weak-scaling table (bench/data): per-GPU TFLOP/s under core_r0.8.0's
    num_floating_point_operations (the whole s x s), so a row's step is its whole-s² FLOPs over them."""
    path = Path(published.__file__).parent / "data" / "megatron_lm_weak_scaling_h100.json"
    runs = json.loads(path.read_text())["runs"]
    cases = [published.translate(i, r) for i, r in enumerate(runs)]
    assert len(cases) == 9 and {c.source for c in cases} == {"Megatron-LM weak scaling (r0.8.0)"}
    for c, r in zip(cases, runs):
        assert "whole-s²" in c.measured_from and c.plan.main_grads == "fp32"  # bf16 runs reduce fp32 grads
        whole = published.flops_per_step(c.model, c.plan, causal=False)["model_flops"]
        assert whole / (c.measured_step_s * c.plan.world_size) == pytest.approx(r["result"]["tflops_per_gpu"] * 1e12)
    assert cases[-1].plan.pp == 16 and cases[-1].cluster.gpus == 6144
