"""Bench: the step-time model against measured GPU training runs that papers, benchmark files and vendor
tables published (`../shared/published_runs.json`: source, hardware, model shape, parallel layout,
result). One device model predicts every run; nothing is tuned per run.

    .venv/bin/python -m bench.published [--runs PATH] [--json] [--rank] [--only 0,5,9]

For each run complete enough to predict (its device is a preset, its degrees and batch are known, its
result converts to a step time) the bench builds the plan as the run's framework ran it (the
framework's documented defaults, each printed as an assumption), predicts the step with
`parallel.core.perf.step_time`, and compares throughput: error = published step / predicted step - 1
(positive: the model predicts a faster step than was measured). The published figure becomes a step
time by the most direct field it has: tokens/s per GPU, else the iteration time, else TFLOP/s per GPU
under the FLOP count the source used (Narayanan et al. 2021 Eq. 3: the whole s x s and the recomputed
forward). Runs left out are listed with the reason, one line each. Runs are reported by family, each
with its mean and worst |error|: MoE (any run with experts), long context (16K tokens and more),
Blackwell (B200, GB200, GB300) and dense (the rest); a run falls in the first of these that fits.
`--rank` also runs the plan search for each run's model, GPUs and batch and reports where the
published plan ranks and the top plan's predicted gain.

Exit 0 (a report, not a test). Pure CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from parallel.core.memory import ActivationOptions
from parallel.core.perf import PerfOptions, flops_per_step, step_time
from parallel.core.pipeline_layout import parse_layout
from parallel.core.plan import Plan
from parallel.core.report import Options
from parallel.core.specs import CLUSTERS, MODELS, Cluster, Model, SpecError
from parallel.core.validate import check
from parallel.importers import ImportFailed, import_text, place
from parallel.search.space import Constraints, SearchEmpty, search

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = ROOT.parent / "shared" / "published_runs.json"

# Shapes of models a source names without giving them (public configs, each with where it comes from).
NAMED_SHAPES = {
    # NeMo gpt3_5b / gpt3_20b configs (GPT-2 BPE vocabulary, learned positions, GeLU MLP of 4h)
    "GPT3-5B": dict(layers=24, hidden=4096, heads=32, ffn_hidden=16384, vocab=50257, arch="gpt"),
    "GPT3-20B": dict(layers=44, hidden=6144, heads=48, ffn_hidden=24576, vocab=50257, arch="gpt"),
    # Touvron et al. 2023, "Llama 2", Table 1 and the released config.json
    "LLAMA2-7B": dict(layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, arch="llama"),
    "LLAMA2-13B": dict(layers=40, hidden=5120, heads=40, ffn_hidden=13824, vocab=32000, arch="llama"),
    "LLAMA2-70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000, arch="llama"),
    # NeMo nemotron3_8b / nemotron3_22b and Nemotron-4 340B (NVIDIA 2024, Table 1): squared-ReLU MLP
    # (two matrices, as GPT's), RoPE, 256k vocabulary, untied output layer
    "Nemotron-8B": dict(layers=32, hidden=4096, heads=32, ffn_hidden=16384, vocab=256000, arch="gpt", tie=False),
    "Nemotron-22B": dict(layers=40, hidden=6144, heads=48, ffn_hidden=24576, vocab=256000, arch="gpt", tie=False),
    "Nemotron-340B": dict(
        layers=96, hidden=18432, heads=96, kv_heads=8, ffn_hidden=73728, vocab=256000, arch="gpt", tie=False
    ),
    # Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 and the released config.json
    "LLAMA3-8B": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, arch="llama"),
    "LLAMA3-70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, arch="llama"),
    "LLAMA3.1-405B": dict(
        layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256, arch="llama"
    ),
    "LLAMA3-405B": dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256, arch="llama"),
    # Brown et al. 2020 Table 2.1 (GPT-3 175B: 96 layers, 12288, 96 heads); GPT-2 BPE vocabulary
    "GPT3-175B": dict(layers=96, hidden=12288, heads=96, ffn_hidden=49152, vocab=50257, arch="gpt"),
    # BigScience 2022, BLOOM (its config.json: 70 layers, 14336 hidden, 112 heads, 250880 vocabulary)
    "BLOOM 176B": dict(layers=70, hidden=14336, heads=112, ffn_hidden=57344, vocab=250880, arch="gpt"),
}

# Mixture-of-experts models a source names: the project's presets (parallel.core.specs.MODELS), each
# with its sources there (DeepSeek-V3's multi-latent attention and first three dense layers included).
# A source's name matches a preset's with only letters and digits kept ("Qwen3_235B_a22B" is
# qwen3-235b-a22b); dense models keep the public configs above.
PRESET_MODELS = {re.sub(r"[^A-Z0-9.]", "", name.upper()): name for name, m in MODELS.items() if m.experts}

# Megatron-Bridge's DeepSeek-V3 pipeline layouts (src/megatron/bridge/recipes/deepseek/deepseek_v3.py,
# layout_map, at the 25.11 performance summary's commit 00b7660), its lists of layer names written in
# Megatron-core's layout grammar (parallel.core.pipeline_layout): the embedding with the first
# virtual stage, the multi-token-prediction layer and the loss after the last.
# (2, 4) and (8, 4) are not in that map: (8, 4) is the recipe's own H100 layout "Et|(tt|)*30mL";
# (2, 4) follows the map's pattern for eight virtual stages, (4, 2) and (8, 1).
EIGHT_STAGES, SIXTEEN_STAGES = "Et*8|(t*8|)*6t*5mL", "Et*4|(t*4|)*14tmL"
DEEPSEEK_LAYOUTS = {
    (4, 1): "Et*16|t*16|t*16|t*13mL",
    (8, 1): EIGHT_STAGES,
    (4, 2): EIGHT_STAGES,
    (2, 4): EIGHT_STAGES,
    (16, 1): SIXTEEN_STAGES,
    (8, 2): SIXTEEN_STAGES,
    (4, 4): SIXTEEN_STAGES,
    (8, 4): "Et|(tt|)*30mL",
}


def nvl72_domain(world: int, gpus_per_tray: int = 4, trays_per_rack: int = 18) -> int:
    """The NVLink domain a GB200/GB300 job of `world` GPUs sees: Megatron-Bridge's performance launcher
    (scripts/performance/utils/executors.py, at 00b7660) asks Slurm for --segment = the job's trays
    when they are 18 or fewer, else the largest divisor of its trays up to 18; each segment is one
    NVL72 rack's trays, so 256 GPUs = 64 trays run as 4 segments of 16 trays: domains of 64 GPUs."""
    trays = max(world // gpus_per_tray, 1)
    segment = trays if trays <= trays_per_rack else max(d for d in range(1, trays_per_rack + 1) if trays % d == 0)
    return segment * gpus_per_tray


# The hardware a run names -> (cluster preset, assumption when the part is not the preset's exactly)
DEVICE_RULES = (
    (r"GB300", "gb300-nvl72"),
    (r"GB200", "gb200-nvl72"),
    (r"\bB200\b", "dgx-b200"),
    (r"H200", "dgx-h200"),
    (r"H100.*(500W|lower TDP|95GB|96GB)", None),  # a power-capped H100 whose peak no one published
    (r"H100", "dgx-h100"),
    (r"A100.*40GB", "dgx-a100-40gb"),
    (r"A100", "dgx-a100"),
)


@dataclass
class Case:
    index: int
    source: str
    label: str
    model: Model
    plan: Plan
    cluster: Cluster
    acts: ActivationOptions
    measured_step_s: float
    measured_from: str
    assumptions: list[str] = field(default_factory=list)
    perf: PerfOptions = PerfOptions()


class Skip(Exception):
    """A run the bench cannot predict: the message says what it lacks."""


# NeMo's long-sequence page: an H100 table (container 24.03) and a B200 one (25.04), each TFLOP/s
# under NeMo's count of its time
LONG_SEQUENCE_SOURCES = ("NeMo 24.03 long sequence", "NeMo 25.04 long sequence")


def source_of(run: dict) -> str:
    s = run["source"]
    text = " ".join(str(v) for v in s.values() if v)
    for pattern, name in (
        (r"Narayanan", "Narayanan 2021 (Megatron-LM, A100)"),
        (r"Korthikanti", "Korthikanti 2022"),
        (r"torchtitan", "torchtitan"),
        (r"Megatron-Bridge", "Megatron-Bridge 25.11"),
        (r"performance_long_sequence.*NeMo ?25\.04", "NeMo 25.04 long sequence"),
        (r"performance_long_sequence", "NeMo 24.03 long sequence"),
        (r"user-guide/24\.12", "NeMo 24.12"),
        (r"NeMo|nemo-framework", "NeMo 24.07"),
        (r"Megatron-LM examples", "Megatron-LM examples/llama"),
        (r"Megatron-LM README", "Megatron-LM weak scaling (r0.8.0)"),
        (r"Smith et al", "MT-NLG 530B (Smith 2022)"),
        (r"bigscience", "BLOOM 176B"),
        (r"Megatron-MoE-ModelZoo", "Megatron-MoE-ModelZoo"),
    ):
        if re.search(pattern, text):
            return name
    return "other"


def number(value) -> float | None:
    """A result field as a number: '37556 (FP8-MX: 36108)' -> 37556."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = re.match(r"\s*([0-9.]+)", str(value))
    return float(m.group(1)) if m else None


def _model(run: dict, notes: list[str]) -> Model:
    m = run["model"]
    name = m["name"]
    shape = {k: m.get(k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")}
    key = re.sub(r"[^A-Z0-9.]", "", name.upper())
    preset = PRESET_MODELS.get(key)
    if preset:
        if m.get("seq_len") is None:
            raise Skip("sequence length not given")
        notes.append(f"shape of {name}: the {preset} preset (parallel.core.specs; not in the source)")
        return replace(MODELS[preset], seq_len=int(m["seq_len"]))
    named = next((v for k, v in NAMED_SHAPES.items() if key.startswith(re.sub(r"[^A-Z0-9.]", "", k.upper()))), None)
    arch_text = (m.get("arch") or "").lower()
    missing = [k for k, v in shape.items() if v is None]
    if named and missing:
        notes.append(f"shape of {name}: its public config ({', '.join(missing)} not in the source)")
        shape = {**{k: named[k] for k in shape if k in named}, **{k: v for k, v in shape.items() if v is not None}}
        shape["kv_heads"] = shape.get("kv_heads") or named.get("kv_heads") or shape["heads"]
        arch = named["arch"]
        tie = named.get("tie")
    elif missing:
        raise Skip(f"model shape incomplete ({', '.join(missing)}) and {name!r} is no known config")
    else:
        arch = "llama" if ("swiglu" in arch_text or "llama" in arch_text) else "gpt"
        tie = None
    seq = m.get("seq_len")
    if seq is None:
        raise Skip("sequence length not given")
    return Model(
        name=name,
        layers=int(shape["layers"]),
        hidden=int(shape["hidden"]),
        heads=int(shape["heads"]),
        kv_heads=int(shape["kv_heads"] or shape["heads"]),
        ffn_hidden=int(shape["ffn_hidden"]),
        vocab=int(shape["vocab"]),
        seq_len=int(seq),
        arch=arch,
        dropout=arch == "gpt",
        tie_embeddings=tie,
    )


def _cluster(run: dict, world: int, source: str, notes: list[str]) -> Cluster:
    gpu = run["hardware"].get("gpu") or run["hardware"].get("system") or ""
    if not gpu and source == "NeMo 24.12":
        gpu = "H100"
        notes.append("DGX-H100: the row's system is not in its excerpt; the 24.07 page of the same table names it")
    for pattern, preset in DEVICE_RULES:
        if re.search(pattern, gpu):
            if preset is None:
                raise Skip(f"device {gpu!r}: a power-capped part whose peak and bandwidth are not published")
            cluster = CLUSTERS[preset].sized_for(world)
            if cluster.nvlink_domain:  # an NVL72 rack: the job sees the trays Slurm's --segment gives it
                domain = min(nvl72_domain(world, cluster.gpus_per_node), cluster.nvlink_domain)
                cluster = replace(cluster, nvlink_domain=domain)
                notes.append(
                    f"NVLink domains of {domain} GPUs: Megatron-Bridge's launcher asks Slurm for --segment "
                    f"{domain // cluster.gpus_per_node} trays of one NVL72 rack (utils/executors.py)"
                )
            return cluster
    raise Skip(f"device {gpu!r} not given or not a preset")


def _framework(source: str) -> str:
    if source.startswith(("NeMo", "Megatron-Bridge", "Megatron-LM")):
        return "megatron-core"
    if source.startswith("torchtitan"):
        return "torchtitan"
    if source.startswith("Narayanan"):
        return "megatron-2021"
    return "megatron-deepspeed"


def translate(index: int, run: dict) -> Case:
    """The run as a plan on its cluster, and its measured step time; Skip if it cannot be predicted."""
    if "launch" in run:
        return _from_launch(index, run)
    source = source_of(run)
    par = run["parallel"]
    notes: list[str] = []
    world = par.get("num_gpus")
    tp, pp, cp = par.get("tp"), par.get("pp"), par.get("cp") or 1
    other = par.get("other") or {}
    zero3 = other.get("scheme") == "ZeRO-3"
    if zero3 and tp is None and pp is None:  # Narayanan et al. Table 2: ZeRO-3 "without model parallelism"
        if other.get("model_parallel_size_M") != 1 or par.get("dp") != world:
            raise Skip(
                f"ZeRO-3 row with M = {other.get('model_parallel_size_M')} and dp {par.get('dp')} of {world} GPUs "
                "while its table says no model parallelism: ambiguous"
            )
        raise Skip(
            "DeepSpeed ZeRO-3 of 2021 (parameters fetched module by module by hooks) is not modelled: the "
            "ZeRO-3 of the plan model is FSDP2 / Megatron FSDP, one gather a block (bench/README.md)"
        )
    if not world or tp is None or pp is None:
        raise Skip("parallel degrees not given (tp/pp)")
    model = _model(run, notes)
    fw = _framework(source)
    dp = world // (tp * pp * cp)
    if dp * tp * pp * cp != world:
        raise Skip(f"tp×pp×cp = {tp * pp * cp} does not divide the {world} GPUs")
    mb, gb = par.get("micro_batch"), par.get("global_batch")
    if gb is None and mb is None and source in LONG_SEQUENCE_SOURCES:
        # the H100 table gives no batch; the B200 table of the same page holds 4M tokens per step at
        # every length (512 x 8K ... 4 x 1M). Per-GPU throughput barely depends on it here: pp = 1 but
        # for the 8K row, whose bubble it makes 1/128
        mb, gb = 1, max(4 * 2**20 // model.seq_len, dp)
        notes.append(
            f"micro batch 1, global batch {gb} (4M tokens a step, as the page's B200 table; the H100 table gives none)"
        )
    if gb is None:
        raise Skip("global batch not given")
    if mb is None:
        if fw == "torchtitan" and pp > 1:  # local batch split into pipeline microbatches of torchtitan's default 1
            mb = 1
            notes.append("micro batch 1 (torchtitan's pipeline_parallel_microbatch_size default)")
        elif fw == "megatron-deepspeed":
            mb = 1
            notes.append("micro batch 1 (not in the source)")
        else:
            raise Skip("micro batch not given")
    rc_text = (par.get("recompute") or "").lower()
    recompute = "full" if "full" in rc_text else "selective" if "selective" in rc_text else "none"
    recompute_layers = None
    if fw == "torchtitan" and recompute == "selective":
        # torchtitan's selective AC: "layer" checkpoints every 2nd block; "op" recomputes all but the
        # saved ops, among them every other matmul -- either about half the forward run again
        recompute, recompute_layers = "full", max(model.layers // (2 * pp), 1)
        notes.append(
            "torchtitan selective AC (every 2nd layer, or op-level: every other matmul): half the "
            "layers' forward recomputed"
        )
    if not rc_text and fw == "megatron-2021":
        recompute = "full"
        notes.append("recompute full (Narayanan et al. 2021: every run checkpoints each layer; its Eq. 3 counts it)")
    elif not rc_text:
        recompute = "full" if fw == "megatron-deepspeed" else "none"
        notes.append(
            f"recompute {recompute} ({'the framework default' if fw != 'megatron-deepspeed' else 'not in the source: Megatron-DeepSpeed runs of its time checkpoint every layer'})"
        )
    prec = (par.get("precision") or "").lower()
    fp8 = "gemm" if re.search(r"fp8|float8", prec) else "none"
    vp = par.get("vp") or 1
    ep = par.get("ep") or 1
    sp = bool(par.get("sequence_parallel")) or (fw in ("megatron-core", "torchtitan") and tp > 1)
    zero, gro, pgo, tpo, p2p = 0, False, False, False, False
    opt = (par.get("optimizer_sharding") or "").lower()
    overlap = (par.get("overlap_flags") or "").lower()
    flash = fw in ("megatron-core", "torchtitan")
    if fw == "torchtitan":  # FSDP2: ZeRO-3 over dp x cp, prefetching gathers, reduce-scatters in backward
        zero, gro, pgo = (3, True, True) if dp * cp > 1 else (0, False, False)
        tpo = "async tp" in overlap
        notes.append("FSDP2 (ZeRO-3) with its prefetch: gathers and reduce-scatters overlapped; SDPA flash attention")
    elif fw == "megatron-core":
        fsdp = "fsdp" in opt and "fsdp=0" not in opt
        zero = 3 if fsdp else 1
        gro = pgo = True
        tpo = tp > 1
        p2p = vp > 1
        notes.append(
            "Megatron-core performance recipe defaults: distributed optimizer"
            + (" (Megatron FSDP)" if fsdp else "")
            + ", --overlap-grad-reduce/--overlap-param-gather"
            + (", SP with --tp-comm-overlap" if tp > 1 else "")
            + (", overlapped P2P of the interleaved schedule" if vp > 1 else "")
            + ", Transformer Engine fused attention"
        )
    elif fw == "megatron-2021":
        gro = True  # torch DDP reduces gradients bucket by bucket during backward
        notes.append("Megatron-LM 2021: fp16, materialised attention scores (no flash attention), DDP overlap")
    else:
        zero = 1 if "zero-1" in opt else 0
        notes.append("Megatron-DeepSpeed: materialised attention scores, gradients reduced after the pipeline flush")
    if fw == "torchtitan":
        model = replace(model, vocab_divisor=1)  # torchtitan builds the vocabulary unpadded
    split = {}
    layout = DEEPSEEK_LAYOUTS.get((pp, vp)) if model.name == "deepseek-v3" and pp > 1 else None
    if model.name == "deepseek-v3" and pp > 1 and layout is None:
        raise Skip(f"no pipeline layout known for DeepSeek-V3 at pp {pp} × vp {vp}")
    if layout:
        ranks = parse_layout(layout, pp, model.layers).rank_layers()
        first, last = ranks[0], ranks[-1]
        split = {"pp_layout": layout}
        notes.append(
            f"Megatron-Bridge's DeepSeek-V3 pipeline layout for pp {pp} × vp {vp}: {first} layers on the first "
            f"rank, {last} on the last (with the MTP layer and the loss, not modelled: the last rank stays "
            "the lighter), the rest even; the recipe's recompute_modules (mla_up_proj / moe_act: the up "
            "projections' or the expert activation's forward again, a few % of a layer) not set here"
        )
    elif pp > 1 and model.layers % (pp * vp):
        why = {
            "megatron-core": "Megatron-Bridge's recipes: --account-for-embedding/loss-in-pipeline-split",
            "torchtitan": "torchtitan's default split counts the embedding and the output as a layer each",
            "megatron-deepspeed": "DeepSpeed's partition method type:transformer|embedding"
            if "embedding" in str(other.get("pp_partition", ""))
            else None,
        }.get(fw)
        if why and (model.layers + 2) % (pp * vp) == 0:
            split = {"embedding_in_split": True, "loss_in_split": True}
            notes.append(
                f"{model.layers} layers over pp×vp = {pp * vp}: the embedding and the loss counted in the split ({why})"
            )
        else:
            raise Skip(f"layers {model.layers} do not split over pp×vpp = {pp * vp} and the source gives no split")
    if fw == "megatron-core" and not source.startswith("Megatron-LM"):
        notes.append("bf16 gradient reduction (NeMo / Megatron-Bridge recipes: grad_reduce_in_fp32=False)")
    try:
        plan = Plan(
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            sp=sp and tp > 1,
            micro_batch=int(mb),
            global_batch=int(gb),
            vpp=int(vp),
            zero=zero,
            recompute=recompute,
            fp8=fp8,
            ep=int(ep),
            cp_kind="ring" if cp > 1 else "allgather",
            tp_overlap=tpo and tp > 1,
            grad_reduce_overlap=gro,
            param_gather_overlap=pgo,
            p2p_overlap=p2p,
            main_grads="bf16" if fw == "megatron-core" and not source.startswith("Megatron-LM") else "fp32",
            recompute_layers=recompute_layers,
            # torchtitan: PyTorch SDPA's flash back end (FlashAttention-2); Megatron: TE's fused attention
            attention=("fa2" if fw == "torchtitan" else "fused") if flash else "unfused",
            dropout=model.dropout if fw != "megatron-core" else False,
            **split,
        )
    except SpecError as err:
        raise Skip(f"plan not valid: {err}") from None
    cluster = _cluster(run, world, source, notes)
    acts = ActivationOptions()
    measured, how = _measured(run, model, plan, source)
    _check_shape(plan, model, cluster, acts)
    label = f"{run['model']['name']} {run['source'].get('row') or ''}".strip()
    perf = PerfOptions()
    if fw == "torchtitan":
        notes.append("PyTorch SDPA's flash back end (FlashAttention-2): cuDNN attention was opt-in in torch 2.5-2.9")
    return Case(index, source, label, model, plan, cluster, acts, measured, how, notes, perf)


def _check_shape(plan: Plan, model: Model, cluster: Cluster, acts: ActivationOptions) -> None:
    """Skip a run whose plan is not valid on its cluster; over memory it is still predicted (the run
    happened: the model's memory is what is wrong)."""
    errors = [e for e in check(plan, model, cluster, acts).errors if not e.startswith("memory per GPU")]
    if errors:
        raise Skip("; ".join(errors))


def _from_launch(index: int, run: dict) -> Case:
    """A run given as its authors' training command (`launch`: Megatron-LM flags) on `nodes` of a
    cluster preset (`cluster`), measured in seconds a step: read as `parallel plan --import` reads it,
    the importer's notes as the assumptions."""
    it = number(run["result"].get("iteration_time_s"))
    if not it:
        raise Skip("no iteration time")
    try:
        imp = import_text(run["launch"], run["source"].get("row") or "launch")
        placed, cluster = place(imp, CLUSTERS[run["cluster"]], run["nodes"])
    except ImportFailed as err:
        raise Skip(f"launch not importable: {err}") from None
    acts = ActivationOptions(swiglu=placed.options.get("swiglu") or "fused")
    _check_shape(placed.plan, placed.model, cluster, acts)
    notes = [*(run.get("assumed") or []), *placed.notes]
    label = run["source"].get("row") or ""
    return Case(index, source_of(run), label, placed.model, placed.plan, cluster, acts, it, "iteration time", notes)


def _measured(run: dict, model: Model, plan: Plan, source: str) -> tuple[float, str]:
    """The published result as seconds per step, and the field it came from."""
    res, par = run["result"], run["parallel"]
    said = json.dumps(res.get("other") or {}) + " " + (run.get("notes") or "")
    if re.search(r"ramp-up|approximate", said, re.I):
        raise Skip("not a steady-state measurement (the source marks it as during batch ramp-up or approximate)")
    tokens = plan.global_batch * model.seq_len
    world = plan.world_size
    tps = number(res.get("tokens_per_s_per_gpu"))
    if tps:
        return tokens / (tps * world), "tokens/s/GPU"
    it = number(res.get("iteration_time_s"))
    if it:
        return it, "iteration time"
    tflops = number(res.get("tflops_per_gpu"))
    kind = (res.get("tflops_kind") or "").lower()
    if tflops and "eq.3" in kind:  # Narayanan et al. Eq. 3: the whole s x s, plus the recomputed forward
        flops = flops_per_step(model, replace(plan, recompute="full", recompute_layers=None), causal=False)
        return flops["hardware_flops"] / (world * tflops * 1e12), "TFLOP/s/GPU (Eq. 3)"
    if tflops and "not stated" in kind and source in LONG_SEQUENCE_SOURCES:
        # NeMo's model FLOPs of that time count the whole s x s: its 24.07 table's tokens/s and TFLOP/s
        # agree with that count within 0.1% on every row (the causal half is 0.3-12.5% off); its
        # llama3 formula (nemo/utils/flops_formulas.py) kept the whole s x s until NVIDIA/NeMo#14424
        # (August 2025), after the 25.04 B200 table (May 2025)
        flops = flops_per_step(model, plan, causal=False)["model_flops"]
        return flops / (world * tflops * 1e12), "TFLOP/s/GPU (NeMo's whole-s² model count)"
    if tflops and "whole s x s" in kind:  # Megatron-LM's model FLOPs before causal halving (2025)
        flops = flops_per_step(model, plan, causal=False)["model_flops"]
        return flops / (world * tflops * 1e12), "TFLOP/s/GPU (Megatron-LM's whole-s² model count)"
    if tflops and "hardware" in kind:
        return flops_per_step(model, plan, causal=False)["hardware_flops"] / (world * tflops * 1e12), "hardware TFLOP/s"
    del par
    raise Skip("result not convertible to a step time (no tokens/s, iteration time or TFLOP/s of a known count)")


FAMILIES = ("dense", "MoE", "long context", "Blackwell")
LONG_CONTEXT = 16384  # tokens a sequence: the long-context family starts here
BLACKWELL = ("b200", "gb200", "gb300")


def family(case: Case) -> str:
    """The family a run is reported in: the first of MoE (experts), long context (LONG_CONTEXT tokens
    and more), Blackwell (B200, GB200, GB300) that fits, else dense."""
    if case.model.experts:
        return "MoE"
    if case.model.seq_len >= LONG_CONTEXT:
        return "long context"
    if case.cluster.gpu in BLACKWELL:
        return "Blackwell"
    return "dense"


def predict(case: Case) -> dict:
    t = step_time(case.model, case.plan, case.cluster, case.perf, acts=case.acts)
    err = case.measured_step_s / float(t["step_time_s"]) - 1
    return {
        "index": case.index,
        "family": family(case),
        "source": case.source,
        "run": case.label,
        "plan": case.plan.label(),
        "gpus": case.plan.world_size,
        "device": case.cluster.gpu,
        "measured_step_s": case.measured_step_s,
        "measured_from": case.measured_from,
        "predicted_step_s": float(t["step_time_s"]),
        "predicted_mfu": float(t["mfu"]),
        "error": err,
        "assumptions": case.assumptions,
    }


GOAL_MEAN, GOAL_WORST = 0.10, 0.20  # each family's goal: mean and worst |error|
GAIN_TO_INVESTIGATE = 0.15  # a top plan predicted this much faster than the run's authors measured


def rank_of(case: Case) -> dict:
    """The search's answer for the run's model, GPUs and global batch (the run's precision, overlaps
    and attention): the published plan's rank among the plans that fit, and the top plan."""
    p = case.plan
    c = Constraints(base=p)
    try:
        result = search(case.model, case.cluster, p.global_batch, c, Options(activations=case.acts, perf=case.perf))
    except SearchEmpty as err:
        return {"rank": None, "why": f"the search finds no plan: {err}"}
    t = result.table
    mine = (t["dp"] == p.dp) & (t["tp"] == p.tp) & (t["pp"] == p.pp) & (t["cp"] == p.cp) & (t["vpp"] == p.vpp)
    mine &= (t["micro_batch"] == p.micro_batch) & (t["sp"] == p.sp) & (t["zero"] == p.zero)
    mine &= t["recompute"].astype(str) == p.recompute
    top = result.plan_at(0)
    rank = int(mine.to_numpy().argmax()) + 1 if mine.any() else None
    return {
        "rank": rank,
        "of": len(t),
        "why": "" if rank else "its plan is not among the search's (recompute of some layers, or it does not fit)",
        "top": top.label(),
        "top_step_s": float(t["step_time_s"].iloc[0]),
        "gain": case.measured_step_s / float(t["step_time_s"].iloc[0]) - 1,
    }


def rank_lines(runs: list[dict], only: set | None) -> list[str]:
    out = [f"{'#':>3}  {'run':<30} {'published plan':<36} {'rank':>12}  {'top plan':<40} {'gain':>7}"]
    flagged = []
    for i, run in enumerate(runs):
        if only is not None and i not in only:
            continue
        try:
            case = translate(i, run)
        except Skip:
            continue
        if case.model.experts:
            continue
        r = rank_of(case)
        where = f"{r['rank']} of {r['of']:,}" if r.get("rank") else "—"
        out.append(
            f"{i:>3}  {case.label[:30]:<30} {case.plan.label()[:36]:<36} {where:>12}  "
            f"{r.get('top', r['why'])[:40]:<40} {r.get('gain', float('nan')):>+7.1%}"
        )
        if r.get("gain", 0) > GAIN_TO_INVESTIGATE:
            flagged.append(i)
    out.append(f"\ntop plans predicted more than {GAIN_TO_INVESTIGATE:.0%} faster than measured: {flagged or 'none'}")
    return out


GRID = [round(0.70 + 0.01 * i, 2) for i in range(31)]  # job efficiencies tried: 0.70 .. 1.00


FITTED_FAMILIES = ("dense", "Blackwell")  # the runs the one job efficiency is set on


def leave_one_source_out(runs: list[dict]) -> list[str]:
    """The job efficiency that minimises the mean |error| over every dense and Blackwell run, and over
    all sources but one -- and how that fit predicts the source it never saw. MoE and long-context
    runs are predicted with the constant, never fitted to."""
    cases = []
    for i, run in enumerate(runs):
        try:
            case = translate(i, run)
        except Skip:
            continue
        if family(case) in FITTED_FAMILIES:
            cases.append(case)
    errors = {
        c: {
            case.index: (case.source, predict(replace(case, perf=replace(case.perf, job_efficiency=c)))["error"])
            for case in cases
        }
        for c in GRID
    }

    def mean(c, without=None):
        e = [abs(v) for s, v in errors[c].values() if s != without]
        return statistics.fmean(e)

    best = min(GRID, key=mean)
    out = [
        f"fitted to all {len(cases)} dense and Blackwell runs: job efficiency {best:.2f}, mean |error| {mean(best):.1%}"
    ]
    for src in sorted({c.source for c in cases}):
        c = min(GRID, key=lambda x, src=src: mean(x, src))
        held = [abs(v) for s, v in errors[c].values() if s == src]
        out.append(
            f"  {src:<34} left out: fit {c:.2f} predicts it at {statistics.fmean(held):.1%} mean, {max(held):.1%} worst"
        )
    return out


def _line(r: dict) -> str:
    return (
        f"{r['index']:>3}  {r['source'][:28]:<28} {r['run'][:34]:<34} {r['plan'][:36]:<36} "
        f"{r['measured_step_s']:>8.3f}s {r['predicted_step_s']:>8.3f}s {r['error']:>+7.1%}"
    )


def markdown(rows: list[dict], skipped: list[dict], summary: dict) -> list[str]:
    """bench/README.md's tables: per family, per source, then every run and the runs left out."""
    out = ["| family | runs | mean abs error | worst |", "|---|---|---|---|"]
    for f, st in summary["by_family"].items():
        out.append(f"| {f} | {st['runs']} | {st['mean_abs_error']:.1%} | {st['worst_abs_error']:.1%} |")
    o = summary["overall"]
    out += [f"| **all** | {o['runs']} | **{o['mean_abs_error']:.1%}** | **{o['worst_abs_error']:.1%}** |", ""]
    out += ["| source | runs | mean abs error | worst |", "|---|---|---|---|"]
    for s, st in summary["by_source"].items():
        out.append(f"| {s} | {st['runs']} | {st['mean_abs_error']:.1%} | {st['worst_abs_error']:.1%} |")
    out += [
        "",
        "| # | family | source | run | plan | GPUs | device | measured s | predicted s | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['index']} | {r['family']} | {r['source']} | {r['run']} | {r['plan']} | {r['gpus']} | "
            f"{r['device']} | {r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | {r['error']:+.1%} |"
        )
    reasons: dict[str, int] = {}
    for sk in skipped:
        key = re.sub(r"(?<![\w-])\d+(?!\w)|'[^']*'", "…", sk["reason"])
        reasons[key] = reasons.get(key, 0) + 1
    out += ["", "| runs left out | why |", "|---|---|"]
    out += [f"| {n} | {why} |" for why, n in sorted(reasons.items(), key=lambda x: -x[1])]
    return out


def stats(errors: list[float]) -> dict:
    a = [abs(e) for e in errors]
    return {
        "runs": len(a),
        "mean_abs_error": statistics.fmean(a) if a else math.nan,
        "worst_abs_error": max(a, default=math.nan),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="published_runs.json")
    ap.add_argument("--only", default=None, help="run indices, e.g. 0,5,9")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="the tables bench/README.md shows")
    ap.add_argument(
        "--rank",
        action="store_true",
        help="search each run's model, GPUs and batch: where its plan ranks, and the top plan's predicted gain",
    )
    ap.add_argument(
        "--loso",
        action="store_true",
        help="fit the job efficiency to all sources, and to all but each one in turn (leave one source out)",
    )
    args = ap.parse_args(argv)
    if not args.runs.is_file():
        print(f"no published runs at {args.runs}: give --runs PATH", file=sys.stderr)
        return 2
    runs = json.loads(args.runs.read_text())["runs"]
    only = {int(i) for i in args.only.split(",")} if args.only else None
    if args.loso:
        print("\n".join(leave_one_source_out(runs)))
        return 0
    if args.rank:
        print("\n".join(rank_lines(runs, only)))
        return 0
    rows, skipped = [], []
    for i, run in enumerate(runs):
        if only is not None and i not in only:
            continue
        try:
            case = translate(i, run)
        except Skip as why:
            skipped.append({"index": i, "source": source_of(run), "run": run["model"]["name"], "reason": str(why)})
            continue
        rows.append(predict(case))
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"predicted": rows, "skipped": skipped, "summary": summary}, indent=1))
        return 0
    if args.markdown:
        print("\n".join(markdown(rows, skipped, summary)))
        return 0
    print("\n".join(report(rows, skipped, summary)))
    return 0


def summarize(rows: list[dict]) -> dict:
    """Mean and worst |error| overall, per family (FAMILIES' order, each present) and per source."""
    by_family = {f: [r["error"] for r in rows if r["family"] == f] for f in FAMILIES}
    by_source: dict[str, list[float]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r["error"])
    return {
        "overall": stats([r["error"] for r in rows]),
        "by_family": {f: stats(e) for f, e in by_family.items()},
        "by_source": {s: stats(e) for s, e in sorted(by_source.items())},
    }


def report(rows: list[dict], skipped: list[dict], summary: dict) -> list[str]:
    """The text report: each family's runs, its mean and worst |error| against the goal, the sources,
    and every run left out with why (one line each)."""
    head = f"{'#':>3}  {'source':<28} {'run':<34} {'plan':<36} {'measured':>9} {'predicted':>9} {'error':>7}"
    out = []
    for f in FAMILIES:
        mine = [r for r in rows if r["family"] == f]
        if not mine:  # a runs file of one family (the held-out ones under bench/data) prints only that
            continue
        st = summary["by_family"][f]
        out += [f"== {f}: {st['runs']} runs", head] + [_line(r) for r in mine]
        met = st["mean_abs_error"] <= GOAL_MEAN and st["worst_abs_error"] <= GOAL_WORST
        out.append(
            f"   {f}: mean |error| {st['mean_abs_error']:.1%}, worst {st['worst_abs_error']:.1%} "
            f"({'meets' if met else 'misses'} the goal: mean <= {GOAL_MEAN:.0%}, worst <= {GOAL_WORST:.0%})"
        )
        out.append("")
    for s, st in summary["by_source"].items():
        out.append(
            f"{s:<34} {st['runs']:>3} runs  mean |error| {st['mean_abs_error']:.1%}  worst {st['worst_abs_error']:.1%}"
        )
    o = summary["overall"]
    out.append(
        f"{'overall':<34} {o['runs']:>3} runs  mean |error| {o['mean_abs_error']:.1%}  worst {o['worst_abs_error']:.1%}"
    )
    out.append(f"\n{len(skipped)} runs not predicted:")
    out += [f"  {s['index']:>3} {s['source'][:28]:<28} {s['run'][:30]:<30} {s['reason']}" for s in skipped]
    return out


if __name__ == "__main__":
    sys.exit(main())
