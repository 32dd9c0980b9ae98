"""torchtitan: a training TOML -> model, plan and (when its degrees pin it) world size.

Read as torchtitan's `JobConfig` reads it (torchtitan/config/job_config.py):

* `[parallelism]` dp = data_parallel_replicate_degree × data_parallel_shard_degree, the shard degree
  -1 meaning "the GPUs left over" (then the world size comes from the caller); tp, pp, cp degrees.
  FSDP shards parameters, gradients and optimizer states over dp_shard × cp ranks -> ZeRO-3 when
  that is more than 1 (HSDP's replicas are noted: the plan model shards over all dp × cp ranks).
  TP always comes with sequence parallelism of the norms (torchtitan's `SequenceParallel` layers).
* `[training]` local_batch_size (older configs: batch_size; default 8) sequences per DP rank;
  global_batch_size (-1: local × dp); seq_len (default 2048); mixed_precision_param.
  Without PP one microbatch is the local batch; with PP, pipeline_parallel_microbatch_size.
* `pipeline_parallel_schedule`: 1F1B, GPipe, or a looped schedule (Interleaved1F1B, ...) whose
  stages per rank come from pipeline_parallel_layers_per_stage (default 2).
* `[activation_checkpoint] mode`: none | selective | full (torchtitan's default: selective); selective
  checkpoints every k-th block (selective_ac_option = k) or, per op, saves every other matmul: a
  partial full recompute (recompute_layers) of that share of the layers.
* FSDP2 and DDP overlap their collectives with backward (and FSDP2 prefetches its gathers):
  grad_reduce_overlap, param_gather_overlap; enable_async_tensor_parallel -> tp_overlap.
* `[model] name/flavor`: llama3 8B / 70B / 405B, llama4 17bx16e / 17bx128e, qwen3 32B / 235B-A22B,
  deepseek_v3 671B -> the presets; seq_len from [training]. `expert_parallel_degree` -> the plan's ep;
  `expert_parallel_comm_backend` standard | deepep | hybridep -> moe_dispatcher alltoall | flex.
* `[training] mixed_precision_reduce` (default float32) -> the plan's main_grads. FSDP2 keeps the
  sharded parameters in fp32 (bf16 only while gathered); the plan model counts bf16 weights plus an
  fp32 master copy in the optimizer, 2 bytes per parameter / N more (noted).
* Sep 2024 TOMLs keep pipeline_parallel_degree (and schedule, microbatches, CP, async TP) under
  `[experimental]`; they are read from there.
* Llama 3 in torchtitan has no dropout and uses SDPA (flash): the plan's attention is fa2 (SDPA's
  FlashAttention-2 back end) and its dropout off; the vocabulary is not padded.
* `context_parallel_rotate_method` allgather (default) | alltoall -> the plan's cp_kind allgather | ring.

Keys it does not know, in the sections it reads, are listed; other torchtitan sections are skipped.
Pure: stdlib only (tomllib).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib

from parallel.core.plan import Plan
from parallel.core.specs import MODELS, Model, SpecError
from parallel.importers.base import Imported, failure
from parallel.importers.limits import toml_shape_error
from parallel.importers.torchtitan_registry import RegistryError, looks_like_registry, registry_as_toml

# torchtitan's context_parallel_rotate_method (PyTorch's experimental context_parallel, ring attention
# over SDPA blocks): "allgather" (the default) all-gathers the K/V shards, "alltoall" rotates them one
# block per step with an all-to-all used as the ring shift.
ROTATE_METHODS = {"allgather": "allgather", "alltoall": "ring"}


def _cp_kind(par: dict, cp: int) -> tuple[str, str | None]:
    """(the plan's cp_kind, a note or None) from [parallelism] context_parallel_rotate_method."""
    method = par.get("context_parallel_rotate_method", "allgather")
    if method not in ROTATE_METHODS:
        raise ValueError(f"context_parallel_rotate_method must be one of {', '.join(ROTATE_METHODS)}, got {method!r}")
    if cp == 1:
        return "allgather", None
    kind = ROTATE_METHODS[method]
    note = (
        "context_parallel_rotate_method = 'allgather': K/V all-gathered per layer (PyTorch then attends "
        "block by block and keeps only its own K/V for backward, so the plan model's gathered K/V "
        "activations are an upper bound)"
        if kind == "allgather"
        else "context_parallel_rotate_method = 'alltoall': K/V blocks rotate around the CP ring "
        "(ring attention, one all-to-all shift per block)"
    )
    return kind, note


FLAVOURS = {  # torchtitan's model name -> flavour -> our preset
    "llama3": {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"},
    "llama4": {"17bx16e": "llama4-scout", "17bx128e": "llama4-maverick"},
    "qwen3": {"32B": "qwen3-32b", "235B-A22B": "qwen3-235b-a22b"},
    "deepseek_v3": {"671B": "deepseek-v3"},
    "gpt_oss": {"120b": "gpt-oss-120b"},
}


def _variant(preset: str, **changes) -> dict:
    """A preset's shape (every field but its name) with `changes`: a flavour that differs from it in a few."""
    model = MODELS[preset]
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "name"} | changes


def _qwen3(layers, dim, heads, kv, ffn, *, vocab=151936, tied=False, **moe):
    return dict(
        layers=layers,
        hidden=dim,
        heads=heads,
        kv_heads=kv,
        ffn_hidden=ffn,
        vocab=vocab,
        seq_len=4096,
        arch="llama",
        dropout=False,
        attention_head_dim=128,
        tie_embeddings=tied or None,
        **moe,
    )


def _deepseek(layers, dim, heads, ffn, expert_ffn, experts, shared, top_k, dense, vocab):
    # MLA approximated as multi-head attention of hidden/heads wide heads (as the deepseek-v3 preset)
    return dict(
        layers=layers,
        hidden=dim,
        heads=heads,
        ffn_hidden=ffn,
        vocab=vocab,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=experts,
        top_k=top_k,
        expert_ffn=expert_ffn,
        shared_expert_ffn=shared * expert_ffn,
        dense_layers=dense,
    )


# The other flavours torchtitan's train configs name, as its model args define them
# (torchtitan/models/{llama3,qwen3,deepseek_v3}/__init__.py, 2025; deepseek_v3 16B is DeepSeek-V2-Lite's
# 27 layers, 236B DeepSeek-V2's 60): shapes, not presets.
FLAVOUR_SHAPES = {
    ("llama3", "debugmodel"): dict(
        layers=6, hidden=256, heads=16, ffn_hidden=768, vocab=2048, seq_len=2048, arch="llama", dropout=False
    ),
    # llama4's debug model from its args' defaults: 8 experts, top-1 with a shared expert, MoE every
    # other layer; the expert width (compute_moe_hidden_dim) approximated as 512
    ("llama4", "debugmodel"): dict(
        layers=6,
        hidden=256,
        heads=16,
        ffn_hidden=768,
        vocab=2048,
        seq_len=2048,
        arch="llama",
        dropout=False,
        experts=8,
        top_k=1,
        expert_ffn=512,
        shared_expert_ffn=512,
        moe_every=2,
    ),
    ("qwen3", "debugmodel"): _qwen3(8, 256, 16, 8, 3072, vocab=2048, tied=True),
    ("qwen3", "0.6B"): _qwen3(28, 1024, 16, 8, 3072, tied=True),
    ("qwen3", "1.7B"): _qwen3(28, 2048, 16, 8, 6144, tied=True),
    ("qwen3", "4B"): _qwen3(36, 2560, 32, 8, 9728, tied=True),
    ("qwen3", "8B"): _qwen3(36, 4096, 32, 8, 12288),
    ("qwen3", "14B"): _qwen3(40, 5120, 40, 8, 17408),
    ("qwen3", "debugmodel_moe"): _qwen3(8, 256, 16, 8, 3072, vocab=2048, experts=64, top_k=8, expert_ffn=768),
    ("qwen3", "30B-A3B"): _qwen3(48, 2048, 32, 4, 6144, experts=128, top_k=8, expert_ffn=768),
    ("deepseek_v3", "debugmodel"): _deepseek(6, 256, 16, 1024, 256, 8, 2, 3, 1, 2048),
    ("deepseek_v3", "16B"): _deepseek(27, 2048, 16, 10944, 1408, 64, 2, 6, 1, 102400),
    ("deepseek_v3", "236B"): _deepseek(60, 5120, 128, 12288, 1536, 160, 2, 6, 1, 102400),
    # gpt-oss-20b: the 120b's layer with 32 experts, 24 layers (torchtitan/models/gpt_oss/__init__.py, 2026)
    ("gpt_oss", "20b"): _variant("gpt-oss-120b", layers=24, experts=32),
}


KNOWN = {  # section -> keys read (True) or known and without effect on the plan model (False)
    "model": {
        "name": True,
        "flavor": True,
        "tokenizer_path": False,
        "hf_assets_path": False,
        "converters": True,
        "print_after_conversion": False,
        "norm_type": False,
    },
    "training": {
        "local_batch_size": True,
        "batch_size": True,
        "global_batch_size": True,
        "seq_len": True,
        "mixed_precision_param": True,
        "mixed_precision_reduce": True,
        "max_norm": False,
        "steps": False,
        "dataset": False,
        "dataset_path": False,
        "compile": False,
        "gc_freq": False,
        "gc_debug": False,
        "seed": False,
        "deterministic": False,
        "data": False,
        "enable_cpu_offload": True,
        "enable_fp8_linear": True,
        "warmup_steps": False,
        "data_parallel_degree": True,
        "tensor_parallel_degree": True,
        "pipeline_parallel_degree": True,
    },
    "parallelism": {
        "data_parallel_replicate_degree": True,
        "data_parallel_shard_degree": True,
        "tensor_parallel_degree": True,
        "pipeline_parallel_degree": True,
        "context_parallel_degree": True,
        "pipeline_parallel_microbatch_size": True,
        "pipeline_parallel_schedule": True,
        "pipeline_parallel_layers_per_stage": True,
        "enable_sequence_parallel": True,
        "expert_parallel_degree": True,
        "expert_tensor_parallel_degree": True,
        "expert_parallel_comm_backend": True,
        "enable_async_tensor_parallel": True,
        "disable_loss_parallel": False,
        "enable_compiled_autograd": False,
        "fsdp_reshard_after_forward": True,
        "pipeline_parallel_split_points": False,
        "module_fqns_per_model_part": False,
        "pipeline_parallel_first_stage_less_layers": False,
        "pipeline_parallel_last_stage_less_layers": False,
        "pipeline_parallel_schedule_csv": False,
        "context_parallel_rotate_method": True,
        "spmd_backend": False,
        "enable_fsdp_symm_mem": False,
        "context_parallel_load_balancer": False,
        "context_parallel_ptrr_mask_key": False,
    },
    # Sep 2024 layout: pipeline (and CP, async TP) degrees under [experimental]
    "experimental": {
        "pipeline_parallel_degree": True,
        "pipeline_parallel_schedule": True,
        "pipeline_parallel_microbatches": True,
        "pipeline_parallel_split_points": False,
        "context_parallel_degree": True,
        "enable_async_tensor_parallel": True,
        "enable_compiled_autograd": False,
        "custom_model_path": False,
        "custom_import": False,
        "custom_args_module": False,
    },
    "activation_checkpoint": {
        "mode": True,
        "selective_ac_option": True,
        "per_op_sac_force_recompute_mm_shapes_by_fqns": False,
    },
}
OTHER_SECTIONS = {
    "job",
    "profiling",
    "metrics",
    "optimizer",
    "lr_scheduler",
    "checkpoint",
    "compile",
    "float8",
    "mx",
    "comm",
    "memory_estimation",
    "fault_tolerance",
    "validation",
    "quantize",
    "debug",
}
LOOPED = {"interleaved1f1b", "loopedbfs", "interleavedzerobubble", "zbvzerobubble", "dualpipev"}


class _Toml:
    def __init__(self, text: str, source: str):
        self.text, self.source, self.lines = text, source, text.splitlines()

    def line_of(self, section: str, key: str | None = None) -> int | None:
        current = None
        for i, raw in enumerate(self.lines, 1):
            m = re.match(r"\s*\[([^\]]+)\]", raw)
            if m:
                current = m.group(1).strip()
                if key is None and current == section:
                    return i
            elif key and current == section and re.match(rf"\s*{re.escape(key)}\s*=", raw):
                return i
        return None

    def fail(self, section: str, key: str | None, message: str):
        return failure(self.source, self.line_of(section, key), message, self.text)

    def int(self, data: dict, section: str, key: str, default: int, allow_minus_one: bool = False) -> int:
        value = data.get(section, {}).get(key, default)
        ok = (
            isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or (allow_minus_one and value == -1))
        )
        if not ok:
            want = "a positive integer" + (" or -1" if allow_minus_one else "")
            raise self.fail(section, key, f"[{section}] {key} = {value!r} must be {want}")
        return value


class _RegistryLines(_Toml):
    """A Python config registry's lines: where the reader found each setting (torchtitan_registry)."""

    def __init__(self, text: str, source: str, lines: dict[tuple[str, str | None], int]):
        super().__init__(text, source)
        self.lines_of = lines

    def line_of(self, section: str, key: str | None = None) -> int | None:
        return self.lines_of.get((section, key)) or self.lines_of.get((section, None))


def is_registry(text: str, source: str) -> bool:
    """True for torchtitan's Python config registries (a .py file, or Python returning a Trainer.Config)."""
    return source.lower().endswith(".py") or looks_like_registry(text)


def import_torchtitan(text: str, source: str = "pasted text", config: str | None = None) -> Imported:
    """A torchtitan TOML, or one config of a Python config registry (`config`: its function name; None
    takes the file's only one), as a Plan and Model, in named steps: parse, sort the keys, the model and
    its precision, the parallel layout (older layouts unified first), activation checkpointing, the plan."""
    notes: list[str] = []
    if is_registry(text, source):
        t, data = _parse_registry(text, source, config, notes)
    else:
        t, data = _parse(text, source)
    seen, unknown = _sorted_keys(data)
    model, dtype, main_grads = _model_and_precision(t, data, notes)
    data, par_section = _unified_layout(data, notes)
    lay = _layout(t, data, model, notes)
    mode, recompute_layers = _checkpointing(t, data, model, lay["pp"] * lay["vpp"], notes)
    _state_notes(lay["replicate"], lay["shard"], dtype, notes)
    _parallelism_notes(t, data.get("parallelism", {}), par_section, notes)
    try:
        plan = Plan(
            dp=1,
            tp=lay["tp"],
            pp=lay["pp"],
            cp=lay["cp"],
            sp=lay["sp"],
            micro_batch=lay["mb"],
            global_batch=lay["gb"] or lay["mb"],
            vpp=lay["vpp"],
            recompute=mode,
            recompute_layers=recompute_layers,
            schedule=lay["schedule"],
            main_grads=main_grads,
            ep=lay["ep"],
            etp=lay["etp"],
            moe_dispatcher=lay["dispatcher"],
            cp_kind=lay["cp_kind"],
            # FSDP2 prefetches the next gathers and reduce-scatters during backward; DDP buckets likewise
            tp_overlap=lay["async_tp"],
            grad_reduce_overlap=True,
            param_gather_overlap=True,
            attention="fa2",
            dropout=False,
            **lay["split"],
        )
    except SpecError as err:
        raise t.fail("parallelism", None, str(err)) from None
    notes.append(
        "attention: PyTorch SDPA's flash back end (FlashAttention-2), as torch 2.5-2.9 pick it (cuDNN was opt-in); "
        "the vocabulary unpadded (torchtitan builds it as the tokenizer gives it)"
    )
    model = dataclasses.replace(model, vocab_divisor=1)
    hint = re.search(r"preset for (\d+) ([\w-]+ )?GPUs", text)
    replicate, shard = lay["replicate"], lay["shard"]
    imported = Imported(
        kind="torchtitan",
        source=source,
        model=model,
        plan=plan,
        world_size=None,
        world_from="data_parallel_shard_degree = -1 (the GPUs left over) leaves the world size open"
        + (f" (the file's comment: a preset for {hint.group(1)} {hint.group(2) or ''}GPUs)" if hint else ""),
        recognised=seen,
        unknown=tuple(unknown),
        notes=tuple(notes),
        options={},
        global_batch=lay["gb"],
        local_batch=lay["local"],
        fsdp_replicate=replicate,
    )
    if shard == -1:
        return imported
    tp, pp, cp = lay["tp"], lay["pp"], lay["cp"]
    world = replicate * shard * tp * pp * cp
    return imported.with_world_size(world, f"replicate {replicate} × shard {shard} × tp {tp} × pp {pp} × cp {cp}")


def _parse_registry(text: str, source: str, config: str | None, notes: list[str]) -> tuple[_Toml, dict]:
    """A registry's config as the TOML sections torchtitan's older configs held, and where each came from."""
    models = tuple(dict.fromkeys([*FLAVOURS, *(m for m, _ in FLAVOUR_SHAPES)]))
    try:
        name, data, lines, read_notes = registry_as_toml(text, source, config, models)
    except RegistryError as err:
        raise failure(source, err.line, str(err), text) from None
    notes.append(f"torchtitan config {name} (a Python config registry, read without running it)")
    notes.extend(read_notes)
    return _RegistryLines(text, source, lines), data


def _parse(text: str, source: str) -> tuple[_Toml, dict]:
    t = _Toml(text, source)
    if shape := toml_shape_error(text):
        raise failure(source, shape[0], shape[1], text)
    try:
        return t, tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        m = re.search(r"line (\d+)", str(err))
        raise failure(source, int(m.group(1)) if m else None, f"not valid TOML: {err}", text) from None


def _sorted_keys(data: dict) -> tuple[dict, list[str]]:
    """(the recognised keys the plan uses, with their values; the keys and sections not known)."""
    unknown, seen = [], {}
    for section, body in data.items():
        if section in KNOWN:
            for key in body if isinstance(body, dict) else []:
                if key not in KNOWN[section]:
                    unknown.append(f"[{section}] {key}")
                elif KNOWN[section][key]:
                    seen[f"{section}.{key}"] = body[key]
        elif section not in OTHER_SECTIONS:
            unknown.append(f"[{section}]")
    return seen, unknown


def _model_and_precision(t: _Toml, data: dict, notes: list[str]) -> tuple[Model, int, str]:
    """The model (a preset or a known flavour's shape, at the config's sequence and dtype), its dtype
    bytes and the gradient-reduce dtype."""
    model_sec = data.get("model", {})
    name, flavor = model_sec.get("name", "llama3"), str(model_sec.get("flavor", "debugmodel"))
    preset = FLAVOURS.get(name, {}).get(flavor)
    if preset is not None:
        model = MODELS[preset]
    elif (name, flavor) in FLAVOUR_SHAPES:
        model = Model(name=f"torchtitan {name} {flavor}", **FLAVOUR_SHAPES[name, flavor])
        if name == "deepseek_v3":
            notes.append(f"{name} {flavor}: multi-head latent attention approximated as multi-head attention")
    else:
        models = dict.fromkeys([*FLAVOURS, *(m for m, _ in FLAVOUR_SHAPES)])
        known = "; ".join(  # a known model's own flavours; every model's for an unknown name
            f"{n}: {', '.join([*FLAVOURS.get(n, {}), *(f for m, f in FLAVOUR_SHAPES if m == n)])}"
            for n in ([name] if name in models else models)
        )
        raise t.fail(
            "model",
            "flavor" if name in FLAVOURS else "name",
            f"no shape for torchtitan model {name!r} flavour {flavor!r} (known: {known})",
        )
    train = data.get("training", {})
    seq = t.int(data, "training", "seq_len", 2048)
    if "seq_len" not in train:
        notes.append("[training] seq_len not set: torchtitan's default 2048")
    dtype = {"bfloat16": 2, "float32": 4}.get(train.get("mixed_precision_param", "bfloat16"))
    if dtype is None:
        raise t.fail(
            "training",
            "mixed_precision_param",
            f"[training] mixed_precision_param = {train['mixed_precision_param']!r} must be bfloat16 or float32",
        )
    if (seq, dtype) != (model.seq_len, model.dtype_bytes):
        diff = ",".join(
            f"{k}={v}"
            for k, v, base in (("seq_len", seq, model.seq_len), ("dtype_bytes", dtype, model.dtype_bytes))
            if v != base
        )
        model = dataclasses.replace(model, seq_len=seq, dtype_bytes=dtype, name=f"{model.name} ({diff})")
    if model_sec.get("converters") or train.get("enable_fp8_linear"):
        what = f"converters = {model_sec['converters']!r}" if model_sec.get("converters") else "enable_fp8_linear"
        notes.append(  # the plan's FP8 mode is Transformer Engine's: GEMM inputs saved in FP8, which torchao's are not
            f"{what}: float8/MX GEMMs, not modelled: time and memory priced as bf16 (torchao's Float8Linear saves "
            "its inputs in high precision and casts them in backward, unlike the plan's FP8 mode)"
        )
    reduce = train.get("mixed_precision_reduce", "float32")
    main_grads = {"float32": "fp32", "bfloat16": "bf16"}.get(reduce)
    if main_grads is None:
        raise t.fail(
            "training",
            "mixed_precision_reduce",
            f"[training] mixed_precision_reduce = {reduce!r} must be float32 or bfloat16",
        )
    return model, dtype, main_grads


def _unified_layout(data: dict, notes: list[str]) -> tuple[dict, str]:
    """The config with its degrees under [parallelism], as torchtitan now keeps them (older configs
    kept them under [training], the Sep 2024 ones under [experimental]); and the section they came from."""
    train = data.get("training", {})
    par_section = "parallelism"
    if "parallelism" not in data and any(k.endswith("_degree") for k in train):
        par_section = "training"
        data = {
            **data,
            "parallelism": {
                "data_parallel_shard_degree": train.get("data_parallel_degree", -1),
                **{k: v for k, v in train.items() if k.endswith("_parallel_degree")},
            },
        }
        notes.append("parallel degrees read from [training] (torchtitan's older layout)")
    exp = data.get("experimental", {})
    moved = {k: v for k, v in exp.items() if k in KNOWN["experimental"] and KNOWN["experimental"][k]}
    if moved:  # [parallelism] wins where both say
        par_here = data.get("parallelism", {})
        data = {**data, "parallelism": {**moved, **par_here}}
        if "pipeline_parallel_microbatches" in moved and "pipeline_parallel_microbatch_size" not in par_here:
            n = moved["pipeline_parallel_microbatches"]
            local_here = train.get("local_batch_size", train.get("batch_size", 8))
            if isinstance(n, int) and n > 0 and isinstance(local_here, int) and local_here % n == 0:
                data["parallelism"]["pipeline_parallel_microbatch_size"] = local_here // n
        notes.append(f"{', '.join(sorted(moved))} read from [experimental] (torchtitan's Sep 2024 layout)")
    return data, par_section


def _layout(t: _Toml, data: dict, model: Model, notes: list[str]) -> dict:
    """The parallel degrees, batches, pipeline schedule, SP, experts, async TP, uneven split and CP kind."""
    train, par = data.get("training", {}), data.get("parallelism", {})
    replicate = t.int(data, "parallelism", "data_parallel_replicate_degree", 1)
    shard = t.int(data, "parallelism", "data_parallel_shard_degree", -1, allow_minus_one=True)
    tp = t.int(data, "parallelism", "tensor_parallel_degree", 1)
    pp = t.int(data, "parallelism", "pipeline_parallel_degree", 1)
    cp = t.int(data, "parallelism", "context_parallel_degree", 1)
    local = t.int(data, "training", "local_batch_size" if "local_batch_size" in train else "batch_size", 8)
    gb = train.get("global_batch_size", -1)
    gb = gb if isinstance(gb, int) and gb > 0 else None
    mb = t.int(data, "parallelism", "pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    if pp > 1 and local % mb:
        raise t.fail(
            "parallelism",
            "pipeline_parallel_microbatch_size",
            f"local batch {local} is not divisible by pipeline_parallel_microbatch_size {mb}",
        )
    schedule, vpp = _schedule(par, pp, model, notes)
    ep = t.int(data, "parallelism", "expert_parallel_degree", 1)
    if ep > 1 and not model.experts:
        raise t.fail(
            "parallelism", "expert_parallel_degree", f"expert_parallel_degree {ep} for the dense model {model.name}"
        )
    etp = t.int(data, "parallelism", "expert_tensor_parallel_degree", tp) if model.experts else None
    backend = par.get("expert_parallel_comm_backend", "standard")
    if backend not in EP_COMM_BACKENDS:
        raise t.fail(
            "parallelism",
            "expert_parallel_comm_backend",
            f"expert_parallel_comm_backend {backend!r} must be one of {', '.join(EP_COMM_BACKENDS)}",
        )
    async_tp = par.get("enable_async_tensor_parallel") is True and tp > 1
    if async_tp:
        notes.append("enable_async_tensor_parallel: TP communication overlapped with the GEMMs (plan tp_overlap)")
    split = {}
    if pp > 1 and model.layers % (pp * vpp):
        less = (
            par.get("pipeline_parallel_first_stage_less_layers", 1),
            par.get("pipeline_parallel_last_stage_less_layers", 1),
        )
        if less == (1, 1) and (model.layers + 2) % (pp * vpp) == 0:
            split = {"embedding_in_split": True, "loss_in_split": True}
            notes.append(
                f"{model.layers} layers over {pp * vpp} stages: the embedding and the output count as a layer "
                "each (torchtitan's split), so the first and the last stage hold one transformer layer fewer"
            )
    try:
        cp_kind, rotate_note = _cp_kind(par, cp)
    except ValueError as err:
        raise t.fail("parallelism", "context_parallel_rotate_method", str(err)) from None
    if rotate_note:
        where = t.line_of("parallelism", "context_parallel_rotate_method") or t.line_of(
            "experimental", "context_parallel_rotate_method"
        )
        notes.append(f"line {where}: {rotate_note}" if where else rotate_note)
    return {
        "replicate": replicate,
        "shard": shard,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "local": local,
        "gb": gb,
        "mb": mb,
        "schedule": schedule,
        "vpp": vpp,
        "sp": tp > 1 and par.get("enable_sequence_parallel", True) is not False,
        "ep": ep,
        "etp": None if etp == tp else etp,  # None: the experts split as the rest of the layer (tp)
        "dispatcher": EP_COMM_BACKENDS[backend],
        "async_tp": async_tp,
        "split": split,
        "cp_kind": cp_kind,
    }


# torchtitan's parallelism.expert_parallel_comm_backend (torchtitan/distributed/expert_parallel.py and
# distributed/deepep): "standard" = all-to-all of every routed copy; DeepEP (H100/B200) and HybridEP
# (GB200 NVL72) send a token to a node once, as Megatron-core's flex dispatcher
EP_COMM_BACKENDS = {"standard": "alltoall", "deepep": "flex", "hybridep": "flex"}


def _schedule(par: dict, pp: int, model: Model, notes: list[str]) -> tuple[str, int]:
    """The pipeline schedule and stages per rank: GPipe, 1F1B, or a looped schedule as interleaved 1F1B."""
    schedule, vpp = "1f1b", 1
    sched = str(par.get("pipeline_parallel_schedule", "1F1B"))
    if pp > 1 and sched.lower() == "gpipe":
        schedule = "gpipe"
    elif pp > 1 and sched.lower() in LOOPED:
        per = par.get("pipeline_parallel_layers_per_stage")
        vpp = model.layers // (pp * per) if isinstance(per, int) and per > 0 else 2
        notes.append(
            f"pipeline_parallel_schedule {sched}: interleaved 1F1B with {vpp} stages per rank"
            + ("" if isinstance(per, int) else " (torchtitan's default for looped schedules)")
            + (
                "; its zero-bubble split of backward is not modelled"
                if "zero" in sched.lower() or "dual" in sched.lower()
                else ""
            )
        )
    elif pp > 1 and sched.lower() != "1f1b":
        notes.append(f"pipeline_parallel_schedule {sched}: modelled as 1F1B")
    return schedule, vpp


def _checkpointing(t: _Toml, data: dict, model: Model, stages: int, notes: list[str]) -> tuple[str, int | None]:
    """The recompute mode and, for torchtitan's selective AC, how many of each stage's layers it recomputes."""
    ac = data.get("activation_checkpoint", {})
    mode = ac.get("mode", "selective")
    if mode not in ("none", "selective", "full"):
        raise t.fail(
            "activation_checkpoint", "mode", f"[activation_checkpoint] mode = {mode!r} must be none, selective or full"
        )
    if "mode" not in ac:
        notes.append("[activation_checkpoint] mode not set: torchtitan's default 'selective'")
    if mode != "selective":
        return mode, None
    option = str(ac.get("selective_ac_option", "2"))
    chunk = max(model.layers // stages, 1)
    if option.isdigit() and int(option) > 0:  # every k-th transformer block checkpointed whole
        recompute_layers = max(chunk // int(option), 1)
        how = f"every {option}th layer checkpointed: {recompute_layers} of each stage's {chunk} layers recomputed"
    else:  # torchtitan's op policy saves every other matmul's output: about half the forward again
        recompute_layers = max(chunk // 2, 1)
        how = "the per-op policy (every other matmul saved) modelled as half the layers recomputed"
    notes.append(f"torchtitan selective AC: {how}")
    return "full", recompute_layers


def _state_notes(replicate: int, shard: int, dtype: int, notes: list[str]) -> None:
    """What the plan model counts differently from FSDP2's model state."""
    if replicate > 1 and shard != 1:
        notes.append(
            f"HSDP: ZeRO-3 over data_parallel_shard_degree × cp ranks, replicated {replicate}×; the plan "
            f"model shards over all dp × cp ranks, so model-state memory is underestimated"
        )
    if shard != 1 and dtype == 2:
        notes.append(
            "FSDP2 keeps the sharded weights in fp32 and gathers them in bf16: modelled as bf16 weights plus "
            "an fp32 master copy, 2 bytes per parameter / (dp_shard × cp) more than the job holds"
        )


def _parallelism_notes(t: _Toml, par: dict, par_section: str, notes: list[str]) -> None:
    for key, why in (("fsdp_reshard_after_forward", "FSDP reshard policy not modelled (ZeRO-3 gathers twice)"),):
        value = par.get(key)
        if value is True or (not isinstance(value, bool) and value not in (None, 1, "default", "allgather")):
            where = t.line_of(par_section, key) or t.line_of("experimental", key)
            notes.append(f"line {where}: {key} = {par[key]!r}: {why}")
