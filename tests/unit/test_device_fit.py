"""profiler.analyzers.device_fit and `profiler calibrate --kernels`: the device model's efficiencies
fitted to a GPU job's kernel times, and `parallel plan --device-fit` timing operators with them.

The GPU traces are written by the test (no GPU here): a 4-rank TP2 x PP2 Llama-3 8B job whose kernels
take the model's own isolated times, each class slowed by a known factor; the fit must find the
factors again. Real traces from ../shared/traces check the kernel classes on names PyTorch wrote."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parallel.cli import plan as plan_cli
from parallel.core.compute import KERNEL_CLASSES
from parallel.core.devices import DEVICES, cluster_for_device, device_for_name, device_from_fit
from parallel.core.memory import ActivationOptions
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from profiler.analyzers.aggregates import job_device
from profiler.analyzers.device_fit import DeviceFitError, fit_device, kernel_classes, modelled_seconds
from profiler.cli import calibrate as calibrate_cli
from profiler.traces.loader import load_traces
from tests.support import trace_samples as ts
from tests.support.trace_samples import annotation, kernel, trace, write

MODEL = MODELS["llama3-8b"]
PLAN = Plan(tp=2, pp=2, sp=True, micro_batch=1, global_batch=4, zero=1)
CLUSTER = CLUSTERS["dgx-h100"].sized_for(PLAN.world_size)
FLASH = ActivationOptions()
SLOWER = {"gemm": 1.25, "attention": 0.8, "elementwise": 1.1}  # measured / modelled, per class
NAMES = {
    "gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
    "attention": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
    "elementwise": "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
}
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


def gpu_job(folder: Path, slower: dict, steps: int = 2) -> Path:
    """One trace per rank: per step, one kernel per class lasting the model's time x `slower`, and an
    NCCL kernel the fit must leave out."""
    folder.mkdir(parents=True, exist_ok=True)
    base = DEVICES["h100-sxm"]
    for rank in range(PLAN.world_size):
        want = modelled_seconds(MODEL, PLAN, base, [rank], CLUSTER.gpus_per_node, FLASH)
        events, t, corr = [], 0, 1
        for step in range(steps):
            length = sum(int(want[c] * slower[c] * 1e6) for c in KERNEL_CLASSES) + 5000
            events.append(annotation(f"ProfilerStep#{step + 1}", t, length))
            k = t + 100
            for c in KERNEL_CLASSES:
                dur = int(round(want[c] * slower[c] * 1e6))
                events.append(kernel(NAMES[c], k, dur, corr))
                k, corr = k + dur, corr + 1
            nccl = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
            events.append(kernel(nccl, k, 3000, corr, stream=20))
            t, corr = t + length + 10, corr + 1
        data = trace(rank, PLAN.world_size, events)
        data["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
        write(folder / f"rank{rank}_trace.json", data)
    (folder / "plan.json").write_text(json.dumps({"plan": PLAN.to_dict(), "model": MODEL.to_dict()}))
    return folder


def test_the_fit_finds_each_class_slowdown_again(tmp_path):
    traces = load_traces(gpu_job(tmp_path / "job", SLOWER))
    fit = fit_device(traces, MODEL, PLAN, CLUSTER, FLASH)
    base = DEVICES["h100-sxm"]
    rows = fit.rows.set_index("class")
    for c in KERNEL_CLASSES:  # the microsecond rounding of the written kernels is all that is left
        assert rows.loc[c, "measured_s"] == pytest.approx(rows.loc[c, "modelled_s"] * SLOWER[c], rel=1e-4)
    assert fit.device.gemm_efficiency == pytest.approx(base.gemm_efficiency / 1.25, rel=1e-4)
    assert fit.device.attention_efficiency == pytest.approx(base.attention_efficiency / 0.8, rel=1e-4)
    assert fit.device.memory_efficiency == pytest.approx(base.memory_efficiency / 1.1, rel=1e-4)
    assert fit.device.fp8_gemm_efficiency == base.fp8_gemm_efficiency  # a bf16 job says nothing about fp8
    assert (fit.ranks, fit.steps) == (4, 2)
    assert device_from_fit(json.loads(json.dumps(fit.to_dict()))) == fit.device


def test_stages_hold_their_own_layers_and_ends():
    base = DEVICES["h100-sxm"]
    first = modelled_seconds(MODEL, PLAN, base, [0], 8, FLASH)
    last = modelled_seconds(MODEL, PLAN, base, [2], 8, FLASH)  # tp-cp-ep-dp-pp: ranks 2, 3 on stage 1
    assert last["gemm"] > first["gemm"]  # the output layer's GEMM over a 128k vocabulary
    assert last["attention"] == pytest.approx(first["attention"])  # 16 layers each
    both = modelled_seconds(MODEL, PLAN, base, [0, 2], 8, FLASH)
    assert both["gemm"] == pytest.approx(first["gemm"] + last["gemm"])


def test_calibrate_kernels_then_plan_with_the_fitted_device(tmp_path, capsys):
    folder = gpu_job(tmp_path / "job", {"gemm": 2.0, "attention": 1.0, "elementwise": 1.0})
    out = tmp_path / "device.json"
    assert calibrate_cli.main([str(folder), "--kernels", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "h100-sxm fitted from 4 rank(s), 2 step(s)" in printed and "x0.50 of the model's efficiency" in printed
    fitted = json.loads(out.read_text())
    assert fitted["device"] == "h100-sxm"
    assert fitted["gemm_efficiency"] == pytest.approx(DEVICES["h100-sxm"].gemm_efficiency / 2, rel=1e-4)
    argv = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "8", "--dp", "8", "--global-batch", "64"]
    assert plan_cli.main([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["step_time"]
    assert plan_cli.main([*argv, "--json", "--device-fit", str(out)]) == 0
    slow = json.loads(capsys.readouterr().out)["step_time"]
    assert slow["compute_model"] == "h100-sxm, fitted"
    assert slow["compute_parts_s"]["gemm"] == pytest.approx(2 * plain["compute_parts_s"]["gemm"], rel=0.02)
    assert slow["compute_parts_s"]["attention"] == pytest.approx(plain["compute_parts_s"]["attention"], rel=1e-4)


def test_bad_inputs_are_one_line(tmp_path, capsys):
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    write(cpu / "rank0_trace.json", trace(0, 1, [annotation("ProfilerStep#1", 0, 100)]))
    (cpu / "plan.json").write_text(json.dumps({"plan": Plan().to_dict(), "model": MODELS["tiny"].to_dict()}))
    assert calibrate_cli.main([str(cpu), "--kernels", "--gpu", "h100-sxm", "--out", str(tmp_path / "x.json")]) == 2
    assert "no rank of these traces ran on a GPU" in capsys.readouterr().err
    with pytest.raises(SpecError, match="gemm_efficiency must be a number in"):
        device_from_fit({"device": "h100-sxm", "gemm_efficiency": 3})
    with pytest.raises(SpecError, match="unknown device 'tpu'"):
        device_from_fit({"device": "tpu"})
    bad = tmp_path / "fit.json"
    bad.write_text("{")
    assert plan_cli.main(["--model", "tiny", "--device-fit", str(bad)]) == 2
    assert "--device-fit" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    traces = load_traces(gpu_job(tmp_path / "job", SLOWER))
    with pytest.raises(DeviceFitError, match="outside the plan's 2 GPUs"):
        fit_device(traces, MODEL, Plan(tp=2, sp=True, global_batch=1), CLUSTER, FLASH)


def test_kernel_classes_and_device_names():
    names = pd.Series([*NAMES.values(), "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "flash_bwd_dq_dk_dv_loop"])
    assert list(kernel_classes(names)) == ["gemm", "attention", "elementwise", "gemm", "attention"]
    assert device_for_name("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert device_for_name("NVIDIA A100-SXM4-40GB") == "a100-sxm-40gb"
    assert device_for_name("NVIDIA A100-SXM4-80GB") == "a100-sxm-80gb"
    assert device_for_name("Tesla V100-SXM2-32GB") is None


@pytest.mark.skipif(not (SHARED / "hta_nccl_parser_config").is_dir(), reason="../shared/traces not here")
def test_real_a100_trace_kernels_fall_in_classes():
    traces = load_traces(SHARED / "hta_nccl_parser_config")
    ev = traces.rank_events(traces.rank_ids[0])
    compute = ev[(ev["kind"] == "compute").to_numpy()]
    classes = kernel_classes(compute["name"])
    assert set(classes) <= set(KERNEL_CLASSES) and (classes == "gemm").any() and (classes == "elementwise").any()
    assert not compute["name"].astype(str).str.contains("nccl", case=False).any()  # communication is not compute
    assert device_for_name(traces.ranks["device_name"].dropna().iloc[0]) in ("a100-sxm-40gb", "a100-sxm-80gb")
    assert np.isfinite(compute["dur_ns"].to_numpy()).all()


def test_cluster_of_a_reported_gpu():
    assert cluster_for_device("NVIDIA H100 80GB HBM3") == "dgx-h100"
    assert cluster_for_device("NVIDIA A100-SXM4-40GB") == "dgx-a100-40gb"
    assert cluster_for_device("NVIDIA B200") == "dgx-b200"
    assert cluster_for_device("Tesla V100-SXM2-32GB") is None and cluster_for_device(None) is None


def test_job_device_from_device_properties(tmp_path):
    """ranks.device_memory is the totalGlobalMem of the GPU each rank's kernels ran on; job_device
    names the set's GPU, its memory and the other GPUs seen."""
    for rank, data in enumerate(ts.gpu_pair()):
        name = "Tesla V100-SXM2-32GB" if rank == 0 else "Tesla V100-SXM2-16GB"
        data["deviceProperties"] = [{"id": 0, "name": name, "totalGlobalMem": (32 if rank == 0 else 16) << 30}]
        ts.write(tmp_path / f"rank{rank}_trace.json.gz", data)
    ranks = load_traces(tmp_path, cache=False).ranks
    assert list(ranks["device_memory"]) == [32 << 30, 16 << 30]
    device = job_device(ranks)
    assert device["name"] in ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-16GB") and device["ranks"] == 1
    assert device["memory_bytes"] == (32 << 30 if "32GB" in device["name"] else 16 << 30)
    assert len(device["others"]) == 1
    assert job_device(ranks.assign(device_name=None)) is None
