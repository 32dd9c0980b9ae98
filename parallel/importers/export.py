"""A plan and its model back out as what teams launch: a Megatron-LM launch script and a torchtitan TOML.

    text, notes = megatron_script(plan, model, gpus_per_node=8)    # torchrun ... pretrain_gpt.py --tensor-...
    text, notes = torchtitan_toml(plan, model)                     # [parallelism] tensor_parallel_degree = ...

Every plan option is written under the name the plan schema declares for that framework
(`Knob.megatron`, `Knob.torchtitan` in parallel/core/plan.py); the model's Megatron-LM flags are the
importer's own table (parallel.importers.megatron.USED), its torchtitan name and flavour the
torchtitan importer's (FLAVOURS, FLAVOUR_SHAPES). So `parallel plan --import` reads the file back
into the same plan (a plan's dropout "the model's" resolved: Megatron-LM has only rates). What a
framework cannot express (GPipe in Megatron-LM, ZeRO-1 in torchtitan, ...) is returned in `notes`
and written at the top of the file as comments, never silently dropped.

Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from parallel.core.pipeline_layout import parse_layout
from parallel.core.plan import DEFAULT_RECOMPUTE_MODULES, PLAN_FIELDS, Plan, offloaded_modules
from parallel.core.specs import MODELS, Model
from parallel.core.topology import DEFAULT_ORDER
from parallel.importers.megatron import CP_COMM_TYPES, USED
from parallel.importers.torchtitan import FLAVOUR_SHAPES, FLAVOURS, ROTATE_METHODS

_SPECS = {spec.name: spec for spec in PLAN_FIELDS}
_MODEL_FLAG = {key: flag for flag, (_, key) in reversed(list(USED.items()))}  # the first flag naming each key
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"  # Megatron-LM's --use-tp-pp-dp-mapping (parallel.importers.megatron)
DROPOUT_RATE = 0.1  # Megatron-LM's default --attention-dropout / --hidden-dropout


def megatron_flags(name: str) -> list[str]:
    """The Megatron-LM flags plan field `name` maps to, as the schema declares them."""
    return re.findall(r"--[a-z0-9][a-z0-9-]*", " ".join(_SPECS[name].knob.megatron))


def torchtitan_keys(name: str) -> list[str]:
    """The torchtitan `section.key`s plan field `name` maps to, as the schema declares them."""
    return re.findall(r"\b[a-z_]+\.[a-z_]+\b", " ".join(_SPECS[name].knob.torchtitan))


def _flag(name: str, i: int = 0) -> str:
    return megatron_flags(name)[i]


def _megatron_model(model: Model) -> list[str]:
    f = _MODEL_FLAG
    out = [
        f"{f['layers']} {model.layers}",
        f"{f['hidden']} {model.hidden}",
        f"{f['heads']} {model.heads}",
        f"{f['ffn_hidden']} {model.ffn_hidden}",
        f"{f['seq_len']} {model.seq_len}",
        f"{f['max_pos']} {model.seq_len}",
        f"{f['vocab']} {model.vocab}",
        f"{f['vocab_divisor']} {model.vocab_divisor}",
    ]
    if model.kv_heads != model.heads:
        out += [f["gqa"], f"{f['kv_heads']} {model.kv_heads}"]
    if model.mla:  # the importer's MLA flags (megatron.MLA_FLAGS); Q/K heads are --qk-head-dim wide
        out.append(f["mla"])
        for key, value in (
            ("q_lora_rank", model.q_lora_rank),
            ("kv_lora_rank", model.kv_lora_rank),
            ("qk_head_dim", model.head_dim),
            ("qk_pos_head_dim", model.qk_pos_head_dim),
            ("v_head_dim", model.v_head_width),
        ):
            if value:
                out.append(f"{f[key]} {value}")
    elif model.attention_head_dim is not None:
        out.append(f"{f['kv_channels']} {model.attention_head_dim}")
    if model.arch == "llama":
        out += [f["swiglu"], f["untied"], f["no_bias"], f"{f['norm']} RMSNorm"]
    if model.dtype_bytes == 2:
        out.append(f["bf16"])
    if model.experts:
        flags = "".join(str(x) for x in model.moe_layer_flags)
        out += [f"{f['experts']} {model.experts}", f"{f['top_k']} {model.top_k}"]
        if model.expert_ffn is not None:
            out.append(f"{f['expert_ffn']} {model.expert_ffn}")
        if model.shared_expert_ffn:
            out.append(f"{f['shared_expert_ffn']} {model.shared_expert_ffn}")
        if "0" in flags:
            out.append(f"{f['moe_freq']} '[{','.join(flags)}]'")
        if model.router_groups:
            out += [
                f"{f['router_groups']} {model.router_groups}",
                f"{f['router_group_topk']} {model.router_group_topk}",
            ]
    return out


def megatron_script(plan: Plan, model: Model, *, gpus_per_node: int = 8) -> tuple[str, list[str]]:
    """(a Megatron-LM launch script running `model` under `plan`, what it cannot express)."""
    notes: list[str] = []
    p = plan
    flags = [f"{_flag(k)} {getattr(p, k)}" for k in ("tp", "pp", "cp")]
    if p.sp and p.tp > 1:
        flags.append(_flag("sp"))
    flags += [f"{_flag('micro_batch')} {p.micro_batch}", f"{_flag('global_batch')} {p.global_batch}"]
    if p.pp_layout:  # the layout sets the virtual stages and each one's layers; Megatron-LM refuses both
        layout = parse_layout(p.pp_layout, p.pp)
        flags.append(f"{_flag('pp_layout')} {shlex.quote(p.pp_layout)}")
        if layout.mtp_layers:  # Megatron-core refuses a layout's MTP layers without their count
            flags.append(f"--mtp-num-layers {layout.mtp_layers}")
    if p.vpp > 1:
        if not p.pp_layout:
            flags.append(f"{_flag('vpp', 1)} {p.vpp}")
        if not p.p2p_overlap:
            flags.append("--no" + _flag("p2p_overlap")[1:])
    elif p.p2p_overlap:
        notes.append("p2p_overlap: Megatron-LM overlaps P2P only under the interleaved schedule (vpp > 1)")
    if p.schedule != "1f1b":
        notes.append(f"schedule {p.schedule}: Megatron-LM runs 1F1B only")
    if p.zero == 1:
        flags.append(_flag("zero", 0))
    elif p.zero in (2, 3):
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[p.zero]
        flags.append(f"{_flag('zero', 1)} {strategy}")
    if p.recompute == "selective" and p.recompute_modules == DEFAULT_RECOMPUTE_MODULES:
        flags.append(_flag("recompute", 0))
    elif p.recompute == "selective":
        modules = p.recompute_modules.split("+")
        if "mla_up_proj" in modules and not model.mla:
            notes.append(f"recompute module mla_up_proj: {model.name} has no multi-latent attention")
            modules.remove("mla_up_proj")
        flags.append(f"{_flag('recompute', 1)} selective")
        flags.append(f"{_flag('recompute_modules')} {' '.join(modules or [DEFAULT_RECOMPUTE_MODULES])}")
        if "moe_act" in modules and not model.experts:  # Megatron-core asks for it whatever the model
            flags.append(_flag("grouped_gemm"))
    elif p.recompute == "full":
        flags.append(f"{_flag('recompute', 1)} full")
        if p.recompute_layers is not None:
            flags += [f"{_flag('recompute_layers', 0)} block", f"{_flag('recompute_layers', 1)} {p.recompute_layers}"]
    if offloaded_modules(p) and p.attention == "fa2":  # written as the local implementation (below)
        notes.append(f"offloaded activations ({p.offload_modules}): Megatron-LM offloads under Transformer Engine only")
    elif offloaded_modules(p):
        flags += [_flag("offload_modules", 0), f"{_flag('offload_modules', 1)} {p.offload_modules.replace('+', ' ')}"]
    if p.order == TP_PP_DP_ORDER:
        flags.append(_flag("order"))
    elif p.order != DEFAULT_ORDER:
        notes.append(f"rank order {p.order}: Megatron-LM builds {DEFAULT_ORDER} or {TP_PP_DP_ORDER} only")
    if p.main_grads == "bf16":
        flags.append(_flag("main_grads", 0))
    if (p.exp_avg_dtype, p.exp_avg_sq_dtype) != ("fp32", "fp32"):
        flags += [
            _flag("exp_avg_dtype", 0),
            f"{_flag('exp_avg_dtype', 1)} {p.exp_avg_dtype}",
            f"{_flag('exp_avg_sq_dtype', 1)} {p.exp_avg_sq_dtype}",
        ]
    if p.fp8 != "none":
        flags.append(f"{_flag('fp8', 0)} hybrid")
        if p.fp8 == "weights":
            flags.append(_flag("fp8", 1))
    if p.ep > 1:
        flags.append(f"{_flag('ep')} {p.ep}")
    if p.etp is not None:
        flags.append(f"{_flag('etp')} {p.etp}")
    if model.experts:  # the MoE fields (the importer reads them for a MoE model only)
        flags.append(f"{_flag('moe_dispatcher', 0)} {p.moe_dispatcher}")
        flags += [
            _flag(name) for name in ("grouped_gemm", "ep_overlap", "delay_wgrad", "capacity_pad") if getattr(p, name)
        ]
        if p.capacity_factor is not None:
            flags.append(f"{_flag('capacity_factor')} {p.capacity_factor:g}")
        if p.dispatch_sms is not None:
            flags.append(f"{_flag('dispatch_sms')} {p.dispatch_sms}")
        if p.expert_imbalance is not None:
            notes.append(ROUTING_NOTE.format(p.expert_imbalance))
    else:
        notes += [f"{name}: no MoE layers in {model.name}" for name in _moe_set(p)]
    comm = next(k for k, v in CP_COMM_TYPES.items() if v == p.cp_kind)  # at cp 1 too: Megatron-LM's default is p2p
    flags.append(f"{_flag('cp_kind')} {comm}")
    if p.tp_overlap and p.tp > 1:
        flags.append(_flag("tp_overlap"))
    for name in ("grad_reduce_overlap", "param_gather_overlap", "embedding_in_split", "loss_in_split"):
        if getattr(p, name):
            flags.append(_flag(name))
    for name in ("first_stage_layers", "last_stage_layers"):
        if getattr(p, name) is not None and not p.pp_layout:
            flags.append(f"{_flag(name)} {getattr(p, name)}")
    if p.attention == "fa2":  # the flash-attn package: Megatron-LM's local implementation (importers.megatron)
        flags += [f"{_flag('attention', 2)} local", _flag("attention", 1)]
    else:  # Transformer Engine: cuDNN's fused kernel, or its unfused attention
        flags.append(f"{_flag('attention', 0)} {p.attention}")
    dropout = model.dropout if p.dropout is None else p.dropout
    rate = DROPOUT_RATE if dropout else 0
    flags += [f"{_flag('dropout', 0)} {rate}", f"{_flag('dropout', 1)} {rate}"]
    world = p.world_size
    nodes, per = (world // gpus_per_node, gpus_per_node) if world % gpus_per_node == 0 else (1, world)
    lines = [
        "#!/bin/bash",
        f"# {model.name} under {p.label() or 'DP1'}, written by ParaScope from its plan schema",
        *(f"# not expressible in Megatron-LM: {n}" for n in notes),
        "",
        f"torchrun --nnodes {nodes} --nproc_per_node {per} pretrain_gpt.py \\",
    ]
    words = _megatron_model(model) + flags
    lines += [f"    {w} \\" for w in words[:-1]] + [f"    {words[-1]}", ""]
    return "\n".join(lines), notes


MOE_FIELDS = (
    "moe_dispatcher",
    "dispatch_sms",
    "capacity_factor",
    "capacity_pad",
    "grouped_gemm",
    "ep_overlap",
    "delay_wgrad",
    "expert_imbalance",
)
ROUTING_NOTE = "expert_imbalance {:g}: the routing's skew, priced into the plan; no launch option sets it"


def _moe_set(p: Plan) -> list[str]:
    """The MoE plan fields `p` sets away from their defaults."""
    return [name for name in MOE_FIELDS if getattr(p, name) != _SPECS[name].default]


def _flavour(model: Model) -> tuple[str, str] | None:
    """torchtitan's (name, flavour) of `model`: a preset's, else a flavour of the same shape."""
    for name, flavours in FLAVOURS.items():
        for flavour, preset in flavours.items():
            base = MODELS[preset]
            if (
                dataclasses.replace(
                    model,
                    name=base.name,
                    seq_len=base.seq_len,
                    dtype_bytes=base.dtype_bytes,
                    vocab_divisor=base.vocab_divisor,
                )
                == base
            ):
                return name, flavour
    for (name, flavour), shape in FLAVOUR_SHAPES.items():
        fields = {k: getattr(model, k) for k in shape if k not in ("seq_len",)}
        if all(fields[k] == v for k, v in shape.items() if k != "seq_len"):
            return name, flavour
    return None


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def torchtitan_toml(plan: Plan, model: Model) -> tuple[str, list[str]]:
    """(a torchtitan training TOML of `model` under `plan`, what it cannot express). torchtitan always
    runs SP with TP, SDPA's FlashAttention-2 without dropout, FSDP2 or DDP with overlapped collectives."""
    p = plan
    notes: list[str] = []
    sections: dict[str, dict] = {"model": {}, "training": {}, "parallelism": {}, "activation_checkpoint": {}}

    def put(key: str, value) -> None:
        section, name = key.split(".")
        sections[section][name] = value

    flavour = _flavour(model)
    if flavour is None:
        notes.append(f"model {model.name}: no torchtitan model flavour has its shape")
        flavour = ("llama3", model.name)
    put("model.name", flavour[0])
    put("model.flavor", flavour[1])
    put("training.seq_len", model.seq_len)
    put("training.mixed_precision_param", "bfloat16" if model.dtype_bytes == 2 else "float32")
    replicate, shard = torchtitan_keys("dp")
    if p.zero == 3 or (p.cp > 1 and p.zero):
        put(replicate, 1)
        put(shard, p.dp)
        if p.dp * p.cp == 1:
            notes.append("ZeRO-3 on one data-parallel rank: nothing to shard")
    else:
        put(replicate, p.dp)
        put(shard, 1)
        if p.zero in (1, 2):
            notes.append(f"ZeRO-{p.zero}: torchtitan shards by FSDP2 (ZeRO-3) or not at all; written unsharded")
        if p.cp > 1:
            notes.append("cp > 1: torchtitan's FSDP shards over the CP ranks (ZeRO-3) whatever the replicas")
    for name in ("tp", "pp", "cp"):
        put(torchtitan_keys(name)[0], getattr(p, name))
    local = p.global_batch // p.dp
    put(torchtitan_keys("micro_batch")[0], local)
    put(torchtitan_keys("global_batch")[0], p.global_batch)
    if p.pp > 1:
        put(torchtitan_keys("micro_batch")[1], p.micro_batch)
    elif p.micro_batch != local:
        notes.append(f"micro batch {p.micro_batch}: without PP torchtitan runs the local batch {local} at once")
    schedule_key, per_stage_key = torchtitan_keys("vpp")
    if p.pp > 1:
        if p.vpp > 1:
            put(schedule_key, "Interleaved1F1B")
            put(per_stage_key, model.layers // (p.pp * p.vpp))
        else:
            put(schedule_key, "GPipe" if p.schedule == "gpipe" else "1F1B")
    if p.tp > 1 and not p.sp:
        notes.append("TP without SP: torchtitan always shards the norms (sequence parallelism)")
    mode_key = torchtitan_keys("recompute")[0]
    if p.recompute == "selective":
        what = "attention core" if p.recompute_modules == DEFAULT_RECOMPUTE_MODULES else p.recompute_modules
        notes.append(f"selective recompute ({what}): torchtitan's selective AC checkpoints whole blocks")
    if p.recompute == "full" and p.recompute_layers is not None:
        chunk = max(model.layers // (p.pp * p.vpp), 1)
        every = max(chunk // p.recompute_layers, 1)
        put(mode_key, "selective")
        put(torchtitan_keys("recompute_layers")[0], str(every))
        if max(chunk // every, 1) != p.recompute_layers:
            notes.append(f"{p.recompute_layers} of {chunk} layers recomputed: torchtitan checkpoints every k-th block")
    else:
        put(mode_key, "full" if p.recompute == "full" else "none")
    if offloaded_modules(p):
        notes.append(f"offloaded activations ({p.offload_modules}): torchtitan has no fine-grained offloading")
    put(torchtitan_keys("main_grads")[0], "bfloat16" if p.main_grads == "bf16" else "float32")
    if (p.exp_avg_dtype, p.exp_avg_sq_dtype) != ("fp32", "fp32"):
        notes.append(
            f"Adam's moments in {p.exp_avg_dtype} / {p.exp_avg_sq_dtype}: torchtitan's optimizer keeps them in fp32"
        )
    if p.fp8 != "none":
        sections["model"]["converters"] = ["float8"]
        notes.append(f"fp8 {p.fp8}: torchtitan's float8 converter; the plan read back has no FP8")
    if p.ep > 1:
        put(torchtitan_keys("ep")[0], p.ep)
    if p.etp is not None:
        put(torchtitan_keys("etp")[0], p.etp)
    if p.moe_dispatcher == "flex" and model.experts:
        put(torchtitan_keys("moe_dispatcher")[0], "deepep")
    notes += [
        f"{name} {getattr(p, name)}: torchtitan dispatches by all-to-all (or DeepEP), dropless, grouped"
        for name in _moe_set(p)
        if name != "expert_imbalance"
        and not (name == "moe_dispatcher" and p.moe_dispatcher == "flex" and model.experts)
    ]
    if p.expert_imbalance is not None:
        notes.append(ROUTING_NOTE.format(p.expert_imbalance))
    if p.cp > 1:
        method = next((k for k, v in ROTATE_METHODS.items() if v == p.cp_kind), None)
        if method is None:
            notes.append(f"cp kind {p.cp_kind}: torchtitan rotates K/V by all-gather or all-to-all only")
        else:
            put(torchtitan_keys("cp_kind")[0], method)
    if p.tp_overlap and p.tp > 1:
        put(torchtitan_keys("tp_overlap")[0], True)
    if not (p.grad_reduce_overlap and p.param_gather_overlap):
        notes.append("FSDP2 and DDP always overlap gradient reduction and (FSDP2) the weight gathers")
    if p.order != DEFAULT_ORDER:
        notes.append(f"rank order {p.order}: torchtitan's device mesh order is fixed")
    if p.pp_layout:  # torchtitan's module_fqns_per_model_part names its modules per stage (schema)
        notes.append(
            f"pipeline layout {p.pp_layout}: torchtitan's {torchtitan_keys('pp_layout')[0]} (module names per "
            "stage) is not written; torchtitan splits by its own rule"
        )
    elif p.first_stage_layers is not None or p.last_stage_layers is not None:
        notes.append("uneven first / last stages: torchtitan splits by its own rule")
    if p.attention != "fa2" or p.dropout:
        notes.append("attention: torchtitan runs SDPA (FlashAttention-2) without dropout")
    lines = [
        f"# {model.name} under {p.label() or 'DP1'}, written by ParaScope from its plan schema",
        *(f"# not expressible in torchtitan: {n}" for n in notes),
    ]
    for section, body in sections.items():
        if not body:
            continue
        lines += ["", f"[{section}]"]
        for key, value in body.items():
            shown = "[" + ", ".join(_toml_value(v) for v in value) + "]" if isinstance(value, list) else None
            lines.append(f"{key} = {shown or _toml_value(value)}")
    return "\n".join(lines) + "\n", notes
