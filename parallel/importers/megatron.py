"""Megatron-LM: a launch script or a pasted command line -> model, plan and world size.

The script is walked by `shell_eval` (variables, arrays, if-blocks, eval); the command with the most
Megatron-LM flags is the launch. Its launcher (`torchrun`, `python -m torch.distributed.run|launch`,
`deepspeed`, `srun`, and `#SBATCH` directives) gives the world size; its flags give the model and
the plan, read as Megatron-LM's `arguments.py` reads them:

* dp = world / (tp·pp·cp); `--global-batch-size` defaults to micro batch × dp.
* `--num-layers-per-virtual-pipeline-stage N` -> vpp = L' / (pp·N), L' the layers with the embedding
  and the loss counted as one each under `--account-for-embedding/loss-in-pipeline-split`.
* `--moe-layer-freq` (an int N: layer i MoE when i % N == 0; or a list expression such as
  `([0]*3+[1]*58)`, parallel.importers.moe_pattern) -> Model.moe_pattern.
* `--multi-latent-attention` with `--q-lora-rank --kv-lora-rank --qk-head-dim --qk-pos-emb-head-dim
  --v-head-dim` (Megatron-LM's defaults where not given) -> the Model's MLA fields.
* MoE (parallel.core.comm / perf model each): `--moe-token-dispatcher-type` (Megatron-core's default
  allgather) with `--moe-enable-deepep` / `--moe-flex-dispatcher-backend` -> moe_dispatcher;
  `--overlap-moe-expert-parallel-comm`, `--delay-wgrad-compute` -> ep_overlap, delay_wgrad;
  `--moe-expert-capacity-factor`, `--moe-pad-expert-input-to-capacity` -> capacity_factor / _pad;
  `--moe-flex-dispatcher-num-sms` (or the deprecated `--moe-deepep/hybridep-num-sms`) -> dispatch_sms;
  `--exp-avg-dtype` / `--exp-avg-sq-dtype` under `--use-precision-aware-optimizer` -> Adam's moments;
  `--moe-grouped-gemm` -> grouped_gemm (without it: one GEMM per expert); `--moe-router-num-groups`,
  `--moe-router-group-topk` -> the Model's router groups. Checked as TransformerConfig checks them.
* `--nproc_per_node` is the processes per host; the NVLink domain is the cluster's (Cluster.nvlink_domain).
* `--sequence-parallel` is switched off when tp = 1 (Megatron-LM does the same).
* `--use-distributed-optimizer` -> ZeRO-1; `--use-torch-fsdp2` -> ZeRO-3;
  `--data-parallel-sharding-strategy optim|optim_grads|optim_grads_params` -> ZeRO 1|2|3.
* vocab: `--vocab-size`, or GPT-2 BPE (50257) with `--vocab-file/--merge-file`; the model pads it
  to a multiple of `--make-vocab-size-divisible-by` (128) × tp as Megatron-LM does (Model.vocab_divisor).
* overlap: `--tp-comm-overlap`, `--overlap-grad-reduce`, `--overlap-param-gather` and the
  interleaved schedule's P2P (on unless `--no-overlap-p2p-communication`) -> the plan's overlap fields.
* uneven stages: `--decoder-first/last-pipeline-num-layers`, `--account-for-embedding/loss-in-
  pipeline-split`, or Megatron-core's `--pipeline-model-parallel-layout` -> pp_layout (parallel.core.
  pipeline_layout: its t's the model's layers, its m's --mtp-num-layers; uneven middle ranks refused);
  `--recompute-method block --recompute-num-layers N` -> recompute_layers.
* `--recompute-granularity selective --recompute-modules M ...` (and the deprecated
  `--moe-layer-recompute`: + moe) -> recompute_modules; `--fine-grained-activation-offloading
  --offload-modules M ...` -> offload_modules; both checked as TransformerConfig checks them.
* `--swiglu` or `--quick-geglu` (both a gated linear unit in Megatron-LM's argument_utils) -> the
  llama architecture (gated MLP; ffn default int(8h/3/64)·64), else gpt.
* `--padded-vocab-size` -> the vocabulary as given, unpadded (Megatron-LM then skips its padding).
* A launch held in a variable and not run by the script (`CMD="... pretrain_gpt.py ..."` started from
  an sbatch heredoc), or a file of arguments alone (`MODEL_ARGS="--num-layers ..."`), is read from
  that variable when no command the script runs carries Megatron-LM flags.
* `--cp-comm-type p2p|a2a|allgather|a2a+p2p` (default p2p) -> the plan's cp_kind ring | ulysses |
  allgather | ring (hierarchical, noted).
* `--transformer-impl`, `--attention-backend` and `--use-flash-attn` -> the attention kernel
  (attention_kernel: Transformer Engine's fused kernel unless local or unfused); both dropouts 0 ->
  no dropout masks.

Flags that change nothing in the plan model (optimizer, data, logging, ...) are recognised and
dropped; any other flag is listed in `unknown`. Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import re

from parallel.core.pipeline_layout import LayoutError, parse_layout, plan_split
from parallel.core.plan import (
    CP_KINDS,
    DEFAULT_RECOMPUTE_MODULES,
    MOMENT_DTYPES,
    NO_OFFLOAD,
    OFFLOAD_MODULES,
    RECOMPUTE_MODULES,
    Plan,
)
from parallel.core.specs import MODELS, Model, SpecError
from parallel.importers.base import Imported, failure
from parallel.importers.moe_pattern import PatternError, moe_layer_flags
from parallel.importers.shell_eval import UNRESOLVED, Reader, ShellError, Word, commands_in_values, run

USED = {  # flag -> (type, key)
    "--tensor-model-parallel-size": ("int", "tp"),
    "--model-parallel-size": ("int", "tp"),
    "--pipeline-model-parallel-size": ("int", "pp"),
    "--context-parallel-size": ("int", "cp"),
    "--sequence-parallel": ("true", "sp"),
    "--micro-batch-size": ("int", "micro_batch"),
    "--global-batch-size": ("int", "global_batch"),
    "--num-layers-per-virtual-pipeline-stage": ("int", "layers_per_virtual_stage"),
    "--virtual-pipeline-model-parallel-size": ("int", "vpp"),
    "--num-virtual-stages-per-pipeline-rank": ("int", "vpp"),
    "--num-layers": ("int", "layers"),
    "--hidden-size": ("int", "hidden"),
    "--num-attention-heads": ("int", "heads"),
    "--group-query-attention": ("true", "gqa"),
    "--num-query-groups": ("int", "kv_heads"),
    "--ffn-hidden-size": ("int", "ffn_hidden"),
    "--seq-length": ("int", "seq_len"),
    "--encoder-seq-length": ("int", "seq_len"),
    "--max-position-embeddings": ("int", "max_pos"),
    "--vocab-size": ("int", "vocab"),
    "--make-vocab-size-divisible-by": ("int", "vocab_divisor"),
    "--padded-vocab-size": ("int", "padded_vocab"),
    "--kv-channels": ("int", "kv_channels"),
    "--swiglu": ("true", "swiglu"),
    "--quick-geglu": ("true", "quick_geglu"),
    "--untie-embeddings-and-output-weights": ("true", "untied"),
    "--disable-bias-linear": ("true", "no_bias"),
    "--normalization": ("str", "norm"),
    "--bf16": ("true", "bf16"),
    "--fp16": ("true", "fp16"),
    "--recompute-granularity": ("str", "recompute"),
    "--recompute-activations": ("true", "recompute_activations"),
    "--checkpoint-activations": ("true", "checkpoint_activations"),
    "--activations-checkpoint-method": ("str", "checkpoint_method"),
    "--recompute-method": ("str", "recompute_method"),
    "--recompute-num-layers": ("int", "recompute_layers"),
    "--recompute-modules": ("list", "recompute_modules"),
    "--moe-layer-recompute": ("true", "moe_layer_recompute"),
    "--fine-grained-activation-offloading": ("true", "offloading"),
    "--offload-modules": ("list", "offload_modules"),
    "--pipeline-model-parallel-layout": ("str", "pp_layout"),
    "--mtp-num-layers": ("int", "mtp_layers"),
    "--use-distributed-optimizer": ("true", "distributed_optimizer"),
    "--use-torch-fsdp2": ("true", "fsdp2"),
    "--data-parallel-sharding-strategy": ("str", "sharding"),
    "--use-tp-pp-dp-mapping": ("true", "tp_pp_dp"),
    "--attention-backend": ("str", "attention_backend"),
    "--use-flash-attn": ("true", "flash"),
    "--transformer-impl": ("str", "transformer_impl"),
    "--attention-dropout": ("float", "attention_dropout"),
    "--hidden-dropout": ("float", "hidden_dropout"),
    "--tokenizer-type": ("str", "tokenizer"),
    "--vocab-file": ("path", "vocab_file"),
    "--merge-file": ("path", "merge_file"),
    "--num-experts": ("int", "experts"),
    "--expert-model-parallel-size": ("int", "ep"),
    "--moe-router-topk": ("int", "top_k"),
    "--moe-ffn-hidden-size": ("int", "expert_ffn"),
    "--moe-shared-expert-intermediate-size": ("int", "shared_expert_ffn"),
    "--moe-layer-freq": ("str", "moe_freq"),
    "--multi-latent-attention": ("true", "mla"),
    "--q-lora-rank": ("int", "q_lora_rank"),
    "--kv-lora-rank": ("int", "kv_lora_rank"),
    "--qk-head-dim": ("int", "qk_head_dim"),
    "--qk-pos-emb-head-dim": ("int", "qk_pos_head_dim"),
    "--v-head-dim": ("int", "v_head_dim"),
    "--expert-tensor-parallel-size": ("int", "etp"),
    "--moe-token-dispatcher-type": ("str", "dispatcher"),
    "--moe-enable-deepep": ("true", "deepep"),
    "--moe-flex-dispatcher-backend": ("str", "flex_backend"),
    "--moe-flex-dispatcher-num-sms": ("int", "dispatch_sms"),
    "--moe-deepep-num-sms": ("int", "deepep_sms"),
    "--moe-hybridep-num-sms": ("int", "hybridep_sms"),
    "--moe-router-num-groups": ("int", "router_groups"),
    "--moe-router-group-topk": ("int", "router_group_topk"),
    "--overlap-moe-expert-parallel-comm": ("true", "ep_overlap"),
    "--delay-wgrad-compute": ("true", "delay_wgrad"),
    "--moe-expert-capacity-factor": ("float", "capacity_factor"),
    "--moe-pad-expert-input-to-capacity": ("true", "capacity_pad"),
    "--moe-grouped-gemm": ("true", "grouped_gemm"),
    "--overlap-grad-reduce": ("true", "overlap_grad_reduce"),
    "--tp-comm-overlap": ("true", "tp_comm_overlap"),
    "--rampup-batch-size": ("list", "rampup"),
    "--cp-comm-type": ("list", "cp_comm_type"),
    "--fp8-format": ("str", "fp8"),
    "--fp8-param-gather": ("true", "fp8_params"),
    "--grad-reduce-in-bf16": ("true", "grad_bf16"),
    "--main-grads-dtype": ("str", "main_grads"),
    "--use-precision-aware-optimizer": ("true", "precision_aware"),
    "--optimizer-cpu-offload": ("true", "optimizer_offload"),
    "--moe-shared-expert-overlap": ("true", "shared_expert_overlap"),
    "--optimizer-offload-fraction": ("float", "optimizer_offload_fraction"),
    "--exp-avg-dtype": ("str", "exp_avg"),
    "--exp-avg-sq-dtype": ("str", "exp_avg_sq"),
    "--no-bias-swiglu-fusion": ("true", "no_swiglu_fusion"),
    "--decoder-first-pipeline-num-layers": ("int", "first_stage_layers"),
    "--decoder-last-pipeline-num-layers": ("int", "last_stage_layers"),
    "--account-for-embedding-in-pipeline-split": ("true", "embedding_in_split"),
    "--account-for-loss-in-pipeline-split": ("true", "loss_in_split"),
    "--overlap-param-gather": ("true", "overlap_param_gather"),
    "--overlap-p2p-communication": ("true", "overlap_p2p"),
    "--no-overlap-p2p-communication": ("true", "no_overlap_p2p"),
}
# Recognised, and without effect on memory, communication or time in the plan model.
IGNORED = re.compile(
    r"--(lr|min-lr|adam-|weight-decay|start-weight|end-weight|clip-grad|init-method|data-|split|tokenizer-|save|load|"
    r"log-|eval-|tensorboard|wandb|train-|seed|exit-|ckpt-|profile|use-pytorch-profiler|num-workers|dataloader|mock-data|"
    r"use-mcore|use-legacy|distributed-|loss-scale|initial-loss-scale|hysteresis|no-|fp8-|rotary-|apply-|manual-gc|"
    r"empty-unused|optimizer|sgd-|decoupled-|cross-entropy|calculate-per-token|grad-reduce-in|bias-|"
    r"masked-softmax|attention-softmax|accumulate-allreduce|DDP-impl|rerun-|tiktoken|use-checkpoint-args|finetune|"
    r"vocab-extra|moe-|position-embedding-type|add-bias|add-qkv-bias|qk-layernorm|"
    r"use-rotary|timing-log|override-opt|use-cpu-init|use-contiguous|log_|micro-batch-size-|"
    r"keep-fp8|use-precision-aware|main-grads|main-params|exp-avg|ddp-|fp16-lm|fp32-residual|"
    r"squared-relu|openai-gelu|onnx|align-|delay-|defer-|check-for|result-rejected|"
    r"eod-mask|reset-|cuda-graph|enable-|disable-|te-|nccl-|high-priority|"
    r"deterministic|num-dataset|object-storage|full-validation|timing|barrier|use-dist-ckpt|auto-detect|"
    r"dist-ckpt|async-save|non-persistent|pretrained-checkpoint|tensorboard-dir|use-fused|"
    r"gradient-accumulation-fusion)"
)
# Vocabularies fixed by the tokenizer type alone (the others depend on the tokenizer model file).
TOKENIZER_VOCAB = {
    "GPT2BPETokenizer": 50257,  # GPT-2's encoder.json
    "Llama2Tokenizer": 32000,  # Llama 2's SentencePiece model (Touvron et al. 2023, Sec. 2.1)
}
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed", "srun", "mpirun")
WORLD_FLAGS = {
    "--nnodes": "nodes",
    "--num_nodes": "nodes",
    "--nodes": "nodes",
    "-N": "nodes",
    "--nproc_per_node": "gpus",
    "--nproc-per-node": "gpus",
    "--num_gpus": "gpus",
    "--ntasks-per-node": "gpus",
    "--gpus-per-node": "gpus",
}


def _is_flag(text: str) -> bool:
    return (text.startswith("--") and len(text) > 2) or bool(re.fullmatch(r"-[A-Za-z]", text))


def _sbatch(text: str) -> dict[str, str]:
    """Nodes and tasks per node from `#SBATCH` lines, as the SLURM_* variables a job sees."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        for key, value in re.findall(r"(--nodes|-N|--ntasks-per-node|--gpus-per-node)[= ]\s*(\d+)", line):
            if key in ("--nodes", "-N"):
                out["SLURM_NNODES"] = out["SLURM_JOB_NUM_NODES"] = value
            else:
                out["SLURM_NTASKS_PER_NODE"] = out["SLURM_GPUS_PER_NODE"] = value
    return out


class _Reader:
    def __init__(self, text: str, source: str):
        self.text, self.source, self.lines = text, source, text.splitlines()
        self.notes: list[str] = []
        self.unknown: list[str] = []
        self.unset: dict[str, int] = {}
        self.seen: dict[str, object] = {}  # flag as written -> value

    def fail(self, line: int | None, message: str):
        return failure(self.source, line, message, self.text)

    def where(self, flag: str, line: int) -> int:
        """The source line that spells `flag` (the word's own line, else the first line naming it)."""
        pat = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
        if 0 < line <= len(self.lines) and pat.search(self.lines[line - 1]):
            return line
        return next(
            (i + 1 for i, ln in enumerate(self.lines) if pat.search(ln) and not ln.lstrip().startswith("#")), line
        )

    def value(self, flag: str, kind: str, words: list[Word], line: int):
        ln = self.where(flag, line)
        if kind == "path":  # only its presence matters (e.g. a GPT-2 BPE vocabulary file)
            return words[0].text.replace(UNRESOLVED, "") if words else ""
        if not words:
            unset = [n for n, _ in self.unset.items() if re.search(rf"\$\{{?{n}\b", self.lines[ln - 1] if ln else "")]
            why = f" ({', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set in the script)" if unset else ""
            raise self.fail(ln, f"{flag} needs a value{why}")
        text = words[0].text
        if UNRESOLVED in text:
            raise self.fail(
                ln,
                f"{flag} takes its value from `{text.replace(UNRESOLVED, '')}`, a command this "
                f"importer does not run; write the number in the script",
            )
        if kind == "int":
            try:
                value = int(text)
            except ValueError:
                raise self.fail(ln, f"{flag} expects an integer, got {text!r}") from None
            if value < 1:
                raise self.fail(ln, f"{flag} must be at least 1, got {value}")
            return value
        if kind == "float":
            try:
                return float(text)
            except ValueError:
                raise self.fail(ln, f"{flag} expects a number, got {text!r}") from None
        return [w.text for w in words] if kind == "list" else text

    def flags(self, words: list[Word]) -> dict:
        """Megatron flags -> {key: (value, line)}; unknown flags collected, values of ignored flags skipped."""
        out: dict = {}
        i = 0
        while i < len(words):
            w = words[i]
            i += 1
            if not _is_flag(w.text):
                continue
            flag, _, inline = w.text.partition("=")
            vals = [Word(inline, w.line)] if inline else []
            while not inline and i < len(words) and not _is_flag(words[i].text):
                vals.append(words[i])
                i += 1
            kind, key = USED.get(flag, (None, None))
            if key is None:
                if not IGNORED.match(flag) and flag not in self.unknown:
                    self.unknown.append(flag)
                continue
            self.seen[flag] = True if kind == "true" else None
            if kind == "true":
                out[key] = (True, self.where(flag, w.line))
                if vals:
                    self.notes.append(
                        f"line {self.where(flag, w.line)}: {flag} takes no value; "
                        f"{' '.join(v.text for v in vals)!r} after it is ignored"
                    )
                continue
            out[key] = (self.value(flag, kind, vals if kind == "list" else vals[:1], w.line), self.where(flag, w.line))
            self.seen[flag] = out[key][0]
        return out


def _flag_count(cmd: list[Word]) -> int:
    return sum(1 for w in cmd if w.text.partition("=")[0] in USED)


def _launch(commands: list[list[Word]]) -> tuple[list[Word], list[Word]]:
    """(launcher words, Megatron words) of the command carrying the most Megatron flags."""
    best = max(commands, key=_flag_count, default=None)
    if best is None or _flag_count(best) == 0:
        return [], []
    script = next((i for i, w in enumerate(best) if w.text.endswith(".py")), None)
    if script is None:
        first = next(i for i, w in enumerate(best) if _is_flag(w.text))
        return best[:first], best[first:]
    return best[:script], best[script + 1 :]


def _launch_in_values(result) -> tuple[list[Word], list[Word], Word | None]:
    """_launch over the commands the script's variables hold (shell_eval.commands_in_values), and the
    variable it came from (a Word of its name at its line)."""
    held = [(name, value, cmd) for name, value, cmds in commands_in_values(result) for cmd in cmds]
    best = max(held, key=lambda x: _flag_count(x[2]), default=None)
    if best is None or not _flag_count(best[2]):
        return [], [], None
    name, value, cmd = best
    return *_launch([cmd]), Word(name, value.line)


def _world(r: _Reader, launcher: list[Word], sbatch: dict[str, str]) -> tuple[int | None, int | None, int | None, str]:
    """(world, nodes, gpus per node, where from) from the launcher's flags, else #SBATCH."""
    found: dict[str, tuple[str, int]] = {}
    i = 0
    while i < len(launcher):
        flag, _, inline = launcher[i].text.partition("=")
        if flag in WORLD_FLAGS and (inline or i + 1 < len(launcher)):
            found.setdefault(WORLD_FLAGS[flag], (inline or launcher[i + 1].text, launcher[i].line))
        if flag == "--standalone":
            found.setdefault("nodes", ("1", launcher[i].line))
        i += 1
    names = {w.text.rsplit("/", 1)[-1] for w in launcher}
    is_torchrun = bool(names & {"torchrun", "torch.distributed.run", "torch.distributed.launch"})
    if is_torchrun and "nodes" not in found and "gpus" in found:
        found["nodes"] = ("1", found["gpus"][1])  # torchrun's default --nnodes
    if "nodes" not in found and "SLURM_NNODES" in sbatch:
        found["nodes"] = (sbatch["SLURM_NNODES"], 0)
    if "gpus" not in found and "SLURM_NTASKS_PER_NODE" in sbatch and not is_torchrun:
        found["gpus"] = (sbatch["SLURM_NTASKS_PER_NODE"], 0)
    values: dict[str, int] = {}
    for key, (text, line) in found.items():
        if ":" in text and key == "nodes":  # elastic MIN:MAX
            r.notes.append(f"line {line}: elastic --nnodes {text}: the largest, {text.split(':')[-1]}, is used")
            text = text.split(":")[-1]
        try:
            values[key] = int(text)
        except ValueError:
            shown = text.replace(UNRESOLVED, "")
            r.notes.append(
                f"line {line}: the {'nodes' if key == 'nodes' else 'GPUs per node'} come from {shown!r}, "
                f"which this importer cannot evaluate"
            )
    nodes, gpus = values.get("nodes"), values.get("gpus")
    if nodes and gpus:
        line = found["gpus"][1] or found["nodes"][1]
        where = f"line {line}: " if line else "#SBATCH: " if not (found["gpus"][1] and found["nodes"][1]) else ""
        return nodes * gpus, nodes, gpus, f"{where}{nodes} nodes × {gpus} GPUs per node"
    if not launcher and not sbatch:  # Megatron-LM's arguments alone (a model file, a pasted flag list)
        return None, nodes, gpus, "the arguments come with no launch command to say how many GPUs they run on"
    return None, nodes, gpus, "the launch command does not say how many GPUs it runs on"


def _no_dropout(get: dict) -> bool:
    """Both dropouts set to 0 (Megatron-LM's defaults are 0.1): the model trains without dropout."""
    return get.get("attention_dropout") == 0 and get.get("hidden_dropout") == 0


def _model(r: _Reader, f: dict, tp: int, launch_line: int) -> Model:
    get = {k: v for k, (v, _) in f.items()}
    hybrid = next((u for u in r.unknown if u.startswith(("--hybrid-", "--mamba-", "--is-hybrid"))), None)
    if hybrid:  # pretrain_mamba.py's models: their state-space layers have no formula here
        raise r.fail(
            r.where(hybrid, launch_line),
            f"{hybrid}: a hybrid Mamba-Transformer model; the plan model prices attention, MLP and MoE "
            "layers only, not Mamba's state-space layers",
        )
    missing = [
        flag
        for flag, key in (("--num-layers", "layers"), ("--hidden-size", "hidden"), ("--num-attention-heads", "heads"))
        if key not in get
    ]
    seq = get.get("seq_len") or get.get("max_pos")
    if seq is None:
        missing.append("--seq-length")
    if missing:
        raise r.fail(launch_line, f"the launch command gives no {', '.join(missing)}: the model's shape is unknown")
    if "seq_len" not in get:
        r.notes.append(f"no --seq-length: --max-position-embeddings {seq} used as the sequence length")
    h, heads, layers = get["hidden"], get["heads"], get["layers"]
    kv = heads
    if "kv_heads" in get and get.get("gqa"):
        kv = get["kv_heads"]
    elif "kv_heads" in get:
        r.notes.append(
            f"line {f['kv_heads'][1]}: --num-query-groups without --group-query-attention "
            f"is ignored by Megatron-LM: plain multi-head attention"
        )
    llama = bool(get.get("swiglu") or get.get("quick_geglu"))
    if get.get("quick_geglu"):
        r.notes.append("--quick-geglu: a gated MLP (three matrices) as --swiglu, its activation priced as SwiGLU's")
    ffn = get.get("ffn_hidden") or (int(4 * h * 2 / 3 / 64) * 64 if llama else 4 * h)
    if llama and not get.get("untied"):
        r.notes.append("--swiglu with tied embeddings: modelled as the llama architecture (untied output layer)")
    if not llama and get.get("untied"):
        r.notes.append("--untie-embeddings-and-output-weights with a GeLU MLP: modelled as the gpt architecture (tied)")
    head_dim = None
    if get.get("mla"):  # MLA's query/key head is --qk-head-dim (+ the RoPE part), not --kv-channels
        head_dim = get.get("qk_head_dim", 128) if get.get("qk_head_dim", 128) != h // heads else None
    elif "kv_channels" in get and get["kv_channels"] != h // heads:
        head_dim = get["kv_channels"]
        r.notes.append(
            f"--kv-channels {head_dim} differs from hidden/heads = {h // heads}: Q is heads × {head_dim} wide"
        )
    dtype = 2 if get.get("bf16") or get.get("fp16") else 4
    if dtype == 4:
        r.notes.append(
            "neither --bf16 nor --fp16: fp32 training (Megatron-LM's default), 4-byte weights and activations"
        )
    shape = dict(
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=kv,
        ffn_hidden=ffn,
        seq_len=seq,
        dtype_bytes=dtype,
        arch="llama" if llama else "gpt",
        dropout=not _no_dropout(get),
        attention_head_dim=head_dim,
    )
    if get.get("experts"):  # Megatron-LM's MoE flags; top-k 2 is its default
        shape.update(
            experts=get["experts"],
            top_k=get.get("top_k", 2),
            expert_ffn=get.get("expert_ffn"),
            shared_expert_ffn=get.get("shared_expert_ffn", 0),
            router_groups=get.get("router_groups", 0),
            router_group_topk=get.get("router_group_topk", 0),
        )
        if "moe_freq" in get:
            try:
                flags = moe_layer_flags(get["moe_freq"], layers)
            except PatternError as err:
                raise r.fail(f["moe_freq"][1], f"--moe-layer-freq {err}") from None
            if not all(flags):  # all MoE is the default, not a pattern
                shape["moe_pattern"] = flags
    elif "moe_freq" in get:
        r.notes.append(f"line {f['moe_freq'][1]}: --moe-layer-freq without --num-experts: a dense model")
    shape.update(_mla(r, f, get))
    like = next(
        (
            m
            for m in MODELS.values()
            if all(getattr(m, k) == shape[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "arch"))
            and m.experts == shape.get("experts", 0)
        ),
        None,
    )
    vocab = get.get("padded_vocab") or get.get("vocab")
    tokenizer = get.get("tokenizer")
    if get.get("padded_vocab"):
        r.notes.append(f"--padded-vocab-size {vocab}: the vocabulary as given, not padded further")
    elif vocab is None and tokenizer in TOKENIZER_VOCAB:
        vocab = TOKENIZER_VOCAB[tokenizer]
        r.notes.append(f"--tokenizer-type {tokenizer}: vocabulary {vocab}")
    elif vocab is None and (tokenizer is None and ("vocab_file" in get or "merge_file" in get)):
        vocab = 50257
        r.notes.append("GPT-2 BPE tokenizer (--vocab-file/--merge-file): vocabulary 50257")
    elif vocab is None and like is not None:
        vocab = like.vocab
        r.notes.append(
            f"no --vocab-size and tokenizer {tokenizer or 'unknown'}, whose vocabulary this importer does not "
            f"know: {vocab}, the vocabulary of the preset {like.name} with the same shape, is a guess"
        )
    elif vocab is None:
        vocab = 51200
        r.notes.append("no --vocab-size and an unknown tokenizer: vocabulary 51200 assumed")
    shape["vocab"] = vocab
    shape["vocab_divisor"] = 1 if get.get("padded_vocab") else get.get("vocab_divisor", 128)
    multiple = shape["vocab_divisor"] * tp
    padded = -(-vocab // multiple) * multiple
    if padded != vocab:
        r.notes.append(
            f"vocabulary {vocab} padded to {padded}, a multiple of make-vocab-size-divisible-by × tp = "
            f"{multiple}, as Megatron-LM pads it"
        )
    try:
        candidate = Model(name="imported", **shape)
    except SpecError as err:
        raise r.fail(launch_line, f"the model's shape is not valid: {err}") from None
    # a preset it is, when they differ at most in a vocabulary that pads to the same size at this tp
    exact = next(
        (
            m
            for m in MODELS.values()
            if dataclasses.replace(candidate, name=m.name, vocab=m.vocab) == m
            and m.padded_vocab(tp) == candidate.padded_vocab(tp)
        ),
        None,
    )
    if exact:
        return exact
    if like is not None:
        diff = ",".join(
            f"{k}={shape[k]}"
            for k in ("seq_len", "vocab", "dtype_bytes", "dropout")
            if getattr(like, k) != shape[k]
            and not (k == "vocab" and like.padded_vocab(tp) == candidate.padded_vocab(tp))
        )
        name = f"{like.name} ({diff})" if diff else f"{like.name} variant"
    else:
        name = f"megatron L{layers} h{h} a{heads}" + (f" kv{kv}" if kv != heads else "")
    try:
        return Model(name=name, **shape)
    except SpecError as err:
        raise r.fail(launch_line, f"the model's shape is not valid: {err}") from None


MLA_FLAGS = {  # key -> (flag, Megatron-LM's default: megatron/training/arguments.py, _add_mla_args)
    "q_lora_rank": ("--q-lora-rank", None),
    "kv_lora_rank": ("--kv-lora-rank", 32),
    "qk_head_dim": ("--qk-head-dim", 128),
    "qk_pos_head_dim": ("--qk-pos-emb-head-dim", 64),
    "v_head_dim": ("--v-head-dim", 128),
}


def _mla(r: _Reader, f: dict, get: dict) -> dict:
    """Multi-latent attention's Model fields from --multi-latent-attention and its rank and head-width
    flags, their defaults Megatron-LM's; the flags alone (without the switch) change nothing there."""
    given = [flag for key, (flag, _) in MLA_FLAGS.items() if key in get]
    if not get.get("mla"):
        if given:
            r.notes.append(f"{', '.join(given)} without --multi-latent-attention: ignored, as Megatron-LM does")
        return {}
    if get.get("gqa"):  # megatron/training/arguments.py asserts the same
        raise r.fail(f["mla"][1], "--multi-latent-attention and --group-query-attention exclude one another")
    value = {key: get.get(key, default) for key, (_, default) in MLA_FLAGS.items()}
    defaulted = [f"{flag} {default}" for key, (flag, default) in MLA_FLAGS.items() if key not in get and default]
    if defaulted:
        r.notes.append(f"multi-latent attention with Megatron-LM's defaults: {', '.join(defaulted)}")
    return dict(
        q_lora_rank=value["q_lora_rank"] or 0,
        kv_lora_rank=value["kv_lora_rank"],
        qk_pos_head_dim=value["qk_pos_head_dim"],
        v_head_dim=value["v_head_dim"],
    )


# Megatron-core's dispatcher flags (transformer_config.py): --moe-token-dispatcher-type (default
# allgather); flex runs the --moe-flex-dispatcher-backend (deepep by default, hybridep, ncclep), and
# --moe-enable-deepep (deprecated) asks for deepep, which needs flex
DISPATCHER_TYPES = ("allgather", "alltoall", "flex")
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")


def _moment_dtypes(r: _Reader, get: dict, line: dict) -> dict[str, str]:
    """Adam's moment dtypes: --exp-avg-dtype / --exp-avg-sq-dtype, which Megatron-LM's optimizer uses
    only under --use-precision-aware-optimizer (fp32 otherwise, noted)."""
    out = {}
    for key, field, flag in (
        ("exp_avg", "exp_avg_dtype", "--exp-avg-dtype"),
        ("exp_avg_sq", "exp_avg_sq_dtype", "--exp-avg-sq-dtype"),
    ):
        value = get.get(key, "fp32")
        if value not in MOMENT_DTYPES:
            raise r.fail(line[key], f"{flag} must be one of {', '.join(MOMENT_DTYPES)}, got {value!r}")
        if value != "fp32" and not get.get("precision_aware"):
            r.notes.append(f"{flag} {value} without --use-precision-aware-optimizer: fp32, as Megatron-LM keeps it")
            value = "fp32"
        out[field] = value
    return out


def _dispatch_sms(r: _Reader, get: dict, line: dict) -> int | None:
    """--moe-flex-dispatcher-num-sms, else the deprecated per-backend counts it unifies, routed as
    Megatron-core's TransformerConfig routes them (two different ones refused)."""
    if "dispatch_sms" in get:
        return get["dispatch_sms"]
    old = {get[k] for k in ("deepep_sms", "hybridep_sms") if k in get}
    if len(old) > 1:
        raise r.fail(
            line["hybridep_sms"],
            "--moe-deepep-num-sms and --moe-hybridep-num-sms differ; Megatron-core refuses the conflict: "
            "give one --moe-flex-dispatcher-num-sms",
        )
    return old.pop() if old else None


def _moe_plan(r: _Reader, get: dict, line: dict) -> dict:
    """The plan's MoE fields from Megatron-core's flags, checked as its TransformerConfig checks them."""
    kind = get.get("dispatcher", "allgather")
    if kind not in DISPATCHER_TYPES:
        raise r.fail(
            line["dispatcher"],
            f"--moe-token-dispatcher-type must be one of {', '.join(DISPATCHER_TYPES)}, got {kind!r}",
        )
    if get.get("deepep") and kind != "flex":
        raise r.fail(
            line["deepep"], "--moe-enable-deepep needs --moe-token-dispatcher-type flex (as Megatron-core says)"
        )
    backend = get.get("flex_backend", "deepep")
    if backend not in FLEX_BACKENDS:
        raise r.fail(
            line["flex_backend"],
            f"--moe-flex-dispatcher-backend must be one of {', '.join(FLEX_BACKENDS)}, got {backend!r}",
        )
    if kind == "flex":
        r.notes.append(f"flex dispatcher ({backend}): a token crosses to another NVLink domain once per domain")
    out = dict(
        moe_dispatcher=kind,
        dispatch_sms=_dispatch_sms(r, get, line),
        grouped_gemm=bool(get.get("grouped_gemm")),
        ep_overlap=bool(get.get("ep_overlap")),
        delay_wgrad=bool(get.get("delay_wgrad")),
        capacity_factor=get.get("capacity_factor"),
        capacity_pad=bool(get.get("capacity_pad")),
    )
    cap = out["capacity_factor"]
    if cap is not None and not 0 < cap <= 1024:
        raise r.fail(line["capacity_factor"], f"--moe-expert-capacity-factor must be above 0, got {cap:g}")
    if out["capacity_pad"] and cap is None:
        raise r.fail(
            line["capacity_pad"],
            "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron-core)",
        )
    if not out["grouped_gemm"]:
        r.notes.append("no --moe-grouped-gemm: each local expert's GEMMs run one after another (SequentialMLP)")
    if get.get("shared_expert_overlap"):
        r.notes.append(
            "--moe-shared-expert-overlap is not modelled: the dispatch is priced without the shared experts' "
            "compute under it"
        )
    return out


def _plan(r: _Reader, f: dict, layers: int) -> tuple[dict, dict]:
    get = {k: v for k, (v, _) in f.items()}
    line = {k: ln for k, (_, ln) in f.items()}
    tp, pp, cp = get.get("tp", 1), get.get("pp", 1), get.get("cp", 1)
    experts = bool(get.get("experts"))
    sp = bool(get.get("sp"))
    if sp and tp == 1:
        r.notes.append(f"line {line['sp']}: --sequence-parallel with tp = 1: Megatron-LM turns it off")
        sp = False
    split = _layout_split(r, get, line, layers, pp) if "pp_layout" in get else {}
    vpp = split.pop("vpp", get.get("vpp", 1))
    if "layers_per_virtual_stage" in get:
        vpp = _vpp_from_layers_per_stage(r, get, line, layers, pp)
    zero = 1 if get.get("distributed_optimizer") else 0
    if get.get("fsdp2"):
        zero = 3
    if "sharding" in get:
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(get["sharding"], zero)
    recompute = "none"
    if get.get("recompute_activations"):
        recompute = "selective"
    if get.get("checkpoint_activations") or get.get("checkpoint_method"):
        recompute = "full"
    if "recompute" in get:
        if get["recompute"] not in ("full", "selective"):
            raise r.fail(
                line["recompute"], f"--recompute-granularity must be full or selective, got {get['recompute']!r}"
            )
        recompute = get["recompute"]
    if get.get("moe_layer_recompute"):  # deprecated: TransformerConfig turns it into selective + "moe"
        if recompute == "full":
            raise r.fail(
                line["moe_layer_recompute"], "--moe-layer-recompute with full recompute (Megatron-core refuses it)"
            )
        recompute = "selective"
    modules = _recompute_modules(r, get, line, recompute)
    recompute_layers = None
    if recompute == "full" and "recompute_layers" in get and get.get("recompute_method") == "block":
        recompute_layers = get["recompute_layers"]
        r.notes.append(
            f"--recompute-method block --recompute-num-layers {recompute_layers}: that many layers of each "
            f"virtual stage recomputed, the others' activations kept"
        )
    plan = dict(
        tp=tp,
        pp=pp,
        cp=cp,
        sp=sp,
        micro_batch=get.get("micro_batch", 1),
        vpp=vpp,
        zero=zero,
        recompute=recompute,
        recompute_modules=modules,
        offload_modules=_offload_modules(r, get, line),
        order="tp-cp-ep-pp-dp" if get.get("tp_pp_dp") else "tp-cp-ep-dp-pp",
        main_grads="bf16" if get.get("grad_bf16") or get.get("main_grads") in ("bf16", "bfloat16") else "fp32",
        **_moment_dtypes(r, get, line),
        fp8="none",
        ep=get.get("ep", 1),
        etp=get.get("etp"),
        cp_kind=_cp_kind(get, line, cp, r),
        **(_moe_plan(r, get, line) if experts else {}),
        recompute_layers=recompute_layers,
        tp_overlap=bool(get.get("tp_comm_overlap")) and tp > 1,
        grad_reduce_overlap=bool(get.get("overlap_grad_reduce")),
        param_gather_overlap=bool(get.get("overlap_param_gather")),
        # Megatron-LM overlaps the interleaved schedule's sends and receives unless told not to
        p2p_overlap=vpp > 1 and not get.get("no_overlap_p2p"),
        first_stage_layers=get.get("first_stage_layers"),
        last_stage_layers=get.get("last_stage_layers"),
        # at pp 1 Megatron-core counts them and takes them off the one stage again: no effect
        embedding_in_split=bool(get.get("embedding_in_split")) and pp > 1,
        loss_in_split=bool(get.get("loss_in_split")) and pp > 1,
    )
    if get.get("optimizer_offload"):
        share = get.get("optimizer_offload_fraction", 1.0)
        r.notes.append(
            f"--optimizer-cpu-offload ({share:.0%} of the optimizer on the CPU) is not modelled: the memory "
            "shown keeps the whole optimizer on the GPU, and the step has no host optimizer or copies"
        )
    if pp == 1 and (get.get("embedding_in_split") or get.get("loss_in_split")):
        r.notes.append(
            "--account-for-embedding/loss-in-pipeline-split at pp 1: no effect (one stage holds every layer)"
        )
    plan.update(split)
    if get.get("fp8"):
        plan["fp8"] = "weights" if get.get("fp8_params") else "gemm"
        r.notes.append(
            f"line {line['fp8']}: --fp8-format {get['fp8']}: FP8 GEMMs; their inputs are saved for backward "
            f"in 1 byte, LayerNorm inputs, Q/K/V and the MLP activation's input in bf16"
            + (
                "; --fp8-param-gather: the GEMM weights are stored in FP8 (1 byte), fp32 master copies in the optimizer"
                if get.get("fp8_params")
                else "; each GEMM weight keeps an FP8 copy (1 byte) beside its bf16 weight"
            )
        )
    if get.get("tp_comm_overlap") and not sp:
        r.notes.append(f"line {line['tp_comm_overlap']}: --tp-comm-overlap needs --sequence-parallel in Megatron-LM")
    for key, text in (("rampup", "--rampup-batch-size: the plan uses the final global batch"),):
        if key in get:
            r.notes.append(f"line {line[key]}: {text}")
    options = {}
    attention, why = attention_kernel(get.get("transformer_impl"), get.get("attention_backend"), get.get("flash"))
    if attention:
        plan["attention"] = attention
        r.notes.append(why)
    if _no_dropout(get):
        plan["dropout"] = False
    if get.get("no_swiglu_fusion") and get.get("swiglu"):
        options["swiglu"] = "unfused"
    return plan, options


# Megatron-core's recompute modules of layers the plan model does not have (transformer_config.py)
FOREIGN_RECOMPUTE_MODULES = {
    "gdn_norm_out": "GatedDeltaNet layers",
    "gdp_in_proj": "GatedDeltaProduct layers",
    "gdp_qkv": "GatedDeltaProduct layers",
    "mhc": "hyper-connections",
}


def _recompute_modules(r: _Reader, get: dict, line: dict, recompute: str) -> str:
    """Plan.recompute_modules from --recompute-modules (default core_attn) and --moe-layer-recompute
    (which adds moe), checked as Megatron-core's TransformerConfig.__post_init__ checks them: known
    names; moe_act only with --moe-grouped-gemm, mla_up_proj only with --multi-latent-attention. The
    list counts only under --recompute-granularity selective (a note otherwise)."""
    names = list(get.get("recompute_modules") or [DEFAULT_RECOMPUTE_MODULES])
    if get.get("moe_layer_recompute") and "moe" not in names:
        names.append("moe")
        r.notes.append(
            f"line {line['moe_layer_recompute']}: --moe-layer-recompute: selective recompute of the MoE block"
        )
    if "recompute_modules" not in get:
        return "+".join(names)
    ln = line["recompute_modules"]
    if recompute != "selective":
        r.notes.append(
            f"line {ln}: --recompute-modules without --recompute-granularity selective: ignored, as Megatron-core does"
        )
        return DEFAULT_RECOMPUTE_MODULES
    foreign = [n for n in names if n in FOREIGN_RECOMPUTE_MODULES]
    if foreign:
        raise r.fail(
            ln,
            f"--recompute-modules {' '.join(foreign)}: "
            + ", ".join(f"{n} belongs to {FOREIGN_RECOMPUTE_MODULES[n]}" for n in foreign)
            + ", which the plan model does not have",
        )
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise r.fail(
            ln,
            f"--recompute-modules {' '.join(unknown)}: not a Megatron-core module; it recomputes "
            f"{', '.join(RECOMPUTE_MODULES + tuple(FOREIGN_RECOMPUTE_MODULES))}",
        )
    if "moe_act" in names and not get.get("grouped_gemm"):
        raise r.fail(ln, "--recompute-modules moe_act needs --moe-grouped-gemm (Megatron-core refuses it without)")
    if "mla_up_proj" in names and not get.get("mla"):
        raise r.fail(
            ln, "--recompute-modules mla_up_proj needs --multi-latent-attention (Megatron-core refuses it without)"
        )
    return "+".join(names)


def _offload_modules(r: _Reader, get: dict, line: dict) -> str:
    """Plan.offload_modules from --fine-grained-activation-offloading --offload-modules M ..., checked as
    TransformerConfig checks them: at least one module, each known, attn_proj only with core_attn,
    Transformer Engine only (arguments.py). The modules alone, without the switch, offload nothing."""
    names = list(get.get("offload_modules") or [])
    if not get.get("offloading"):
        if names:
            r.notes.append(
                f"line {line['offload_modules']}: --offload-modules without --fine-grained-activation-offloading: "
                "nothing offloaded, as Megatron-core does"
            )
        return NO_OFFLOAD
    ln = line["offloading"]
    if not names:
        raise r.fail(ln, "--fine-grained-activation-offloading needs --offload-modules (Megatron-core asserts it)")
    if get.get("transformer_impl") == "local":
        raise r.fail(ln, "--fine-grained-activation-offloading needs --transformer-impl transformer_engine")
    foreign = {"fused_group_mlp": "needs Transformer Engine's op fuser", "gdp_qkv": "belongs to GatedDeltaProduct"}
    unknown = [n for n in names if n not in OFFLOAD_MODULES]
    if unknown:
        why = ", ".join(f"{n} {foreign[n]}, not modelled" if n in foreign else f"{n} unknown" for n in unknown)
        raise r.fail(
            line["offload_modules"], f"--offload-modules: {why}; the plan model offloads {', '.join(OFFLOAD_MODULES)}"
        )
    if "attn_proj" in names and "core_attn" not in names:
        raise r.fail(
            line["offload_modules"], "--offload-modules attn_proj needs core_attn (Megatron-core refuses it alone)"
        )
    return "+".join(names)


def attention_kernel(impl: str | None, backend: str | None, flash: bool | None) -> tuple[str | None, str]:
    """The attention kernel Megatron-LM runs (Plan.attention) and why, from --transformer-impl
    (default transformer_engine), --attention-backend (default auto) and --use-flash-attn; None where
    the flags leave the plan's default.

    Under Transformer Engine every backend but unfused/local is a fused kernel: auto and fused run
    cuDNN's flash attention, which TE picks over FlashAttention on Hopper and later ("Select
    FusedAttention on sm90", DotProductAttention since TE 1.4); flash runs FlashAttention-3 on Hopper
    where installed (Shah et al. 2024: within ~10% of cuDNN); --use-flash-attn changes nothing there
    (it selects the flash-attn package only for the local implementation). On an A100 the fused
    kernel is FlashAttention-2 class: the device table gives both one rate. With --transformer-impl
    local, --use-flash-attn runs the flash-attn package (FlashAttention-2), else the scores are
    materialised."""
    if impl == "local" or backend == "local":
        if flash:
            return "fa2", "--transformer-impl local --use-flash-attn: the flash-attn package (FlashAttention-2)"
        return "unfused", "local attention: the s x s scores materialised (Megatron-LM's own softmax)"
    if backend == "unfused":
        return "unfused", "--attention-backend unfused: Transformer Engine's unfused attention (s x s scores kept)"
    if backend in ("flash", "fused", "auto") or flash:
        kernel = {"flash": "FlashAttention-3 on Hopper"}.get(backend, "cuDNN's fused flash attention")
        return "fused", f"Transformer Engine attention ({backend or 'auto'}): {kernel}, priced as the fused kernel"
    return None, ""


# the flags Megatron-LM refuses beside --pipeline-model-parallel-layout (arguments.py, validate_args;
# TransformerConfig.__post_init__): the layout sets the virtual stages and every stage's layers itself
LAYOUT_EXCLUDES = {
    "layers_per_virtual_stage": "--num-layers-per-virtual-pipeline-stage",
    "vpp": "--num-virtual-stages-per-pipeline-rank",
    "first_stage_layers": "--decoder-first-pipeline-num-layers",
    "last_stage_layers": "--decoder-last-pipeline-num-layers",
    "embedding_in_split": "--account-for-embedding-in-pipeline-split",
    "loss_in_split": "--account-for-loss-in-pipeline-split",
}


def _layout_split(r: _Reader, get: dict, line: dict, layers: int, pp: int) -> dict:
    """pp_layout from --pipeline-model-parallel-layout, with its summary (vpp, the first / last stage's
    layers: parallel.core.pipeline_layout), refused beside the flags Megatron-LM refuses with it,
    where its MTP layers differ from --mtp-num-layers and where the plan cannot express it (uneven
    middle stages)."""
    ln = line["pp_layout"]
    clash = [flag for key, flag in LAYOUT_EXCLUDES.items() if get.get(key)]
    if clash:
        raise r.fail(ln, f"--pipeline-model-parallel-layout cannot be set with {', '.join(clash)} (Megatron-LM)")
    text = get["pp_layout"]
    try:
        layout = parse_layout(text, pp, layers, get.get("mtp_layers"))
        fields, notes = plan_split(layout)
    except LayoutError as err:
        raise r.fail(ln, str(err)) from None
    if layout.mtp_layers and "mtp_layers" not in get:
        notes.append(
            f"pipeline layout: {layout.mtp_layers} MTP layer(s) but no --mtp-num-layers, which Megatron-core needs"
        )
    r.notes += [f"line {ln}: {n}" for n in notes]
    return {"pp_layout": text, **fields}


def _vpp_from_layers_per_stage(r: _Reader, get: dict, line: dict, layers: int, pp: int) -> int:
    """vpp from --num-layers-per-virtual-pipeline-stage N, by Megatron-LM's own rule
    (megatron/training/arguments.py, validate_args): the embedding and the loss count as a layer
    each where --account-for-embedding/loss-in-pipeline-split says so; those L' layers must divide
    by pp, and L'/pp by N; vpp = L'/pp/N."""
    per, ln = get["layers_per_virtual_stage"], line["layers_per_virtual_stage"]
    extra = [name for key, name in (("embedding_in_split", "embedding"), ("loss_in_split", "loss")) if get.get(key)]
    counted = layers + len(extra)
    what = f"layers {layers}" + "".join(f" + 1 ({name})" for name in extra) + (f" = {counted}" if extra else "")
    if counted % pp:
        raise r.fail(ln, f"--num-layers-per-virtual-pipeline-stage {per}: {what} are not divisible by pp {pp}")
    if (counted // pp) % per:
        raise r.fail(
            ln,
            f"--num-layers-per-virtual-pipeline-stage {per}: {what} give {counted // pp} per pipeline "
            f"stage, not divisible by {per}",
        )
    return counted // pp // per


# Megatron-LM's --cp-comm-type (megatron/training/arguments.py; Transformer Engine's attention with CP):
# p2p = ring attention (the default), a2a = DeepSpeed-Ulysses, allgather = all-gathered K/V,
# a2a+p2p = hierarchical (all-to-all inside the hierarchical_context_parallel_sizes groups, ring across).
CP_COMM_TYPES = {"p2p": "ring", "a2a": "ulysses", "allgather": "allgather", "a2a+p2p": "ring"}


def _cp_kind(get: dict, line: dict, cp: int, r) -> str:
    """The plan's cp_kind from --cp-comm-type (one value, or one per layer: the most used)."""
    values = get.get("cp_comm_type") or ["p2p"]
    for v in values:
        if v not in CP_COMM_TYPES:
            raise r.fail(line["cp_comm_type"], f"--cp-comm-type must be among {', '.join(CP_COMM_TYPES)}, got {v!r}")
    kinds = [CP_COMM_TYPES[v] for v in values]
    kind = max(CP_KINDS, key=kinds.count)
    if cp > 1 and len(set(values)) > 1:
        r.notes.append(
            f"line {line['cp_comm_type']}: --cp-comm-type {' '.join(values)}: one exchange per layer; "
            f"modelled as {kind} for every layer"
        )
    if cp > 1 and "a2a+p2p" in values:
        r.notes.append(
            f"line {line['cp_comm_type']}: --cp-comm-type a2a+p2p: hierarchical CP (all-to-all inside a "
            f"group, ring across groups) is modelled as ring attention over all cp ranks"
        )
    return kind


def import_megatron(text: str, source: str = "pasted text", *, read: Reader | None = None) -> Imported:
    """`read(name)`: the text of a config file the script sources (shell_eval.run), or None."""
    r = _Reader(text, source)
    sbatch = _sbatch(text)
    try:
        result = run(text, sbatch, read=read)
    except ShellError as err:
        raise r.fail(err.line, str(err)) from None
    r.unset = result.unset
    launcher, words = _launch(result.commands)
    if not words:  # no command run carries the flags: a variable holding the launch or the arguments
        launcher, words, held = _launch_in_values(result)
        if words:
            what, why = ("launch", "not run by the script here") if launcher else ("arguments", "no launch command")
            r.notes.append(f"line {held.line}: the {what} read from the variable ${held.text} ({why})")
    if not words:
        raise r.fail(
            None,
            "no Megatron-LM launch found: expected a command such as `torchrun ... pretrain_gpt.py "
            "--tensor-model-parallel-size 8 ...` (a script or a pasted command line)",
        )
    flags = r.flags(words)
    launch_line = (launcher or words)[0].line
    world, nodes, gpus, world_from = _world(r, launcher, sbatch)
    plan_fields, options = _plan(r, flags, flags.get("layers", (1, 0))[0])
    model = _model(r, flags, plan_fields["tp"], launch_line)
    gb = flags.get("global_batch", (None, 0))[0]
    if gb is None:
        r.notes.append("no --global-batch-size: micro batch × dp (Megatron-LM's default)")
    try:
        plan = Plan(dp=1, global_batch=gb or plan_fields["micro_batch"], **plan_fields)
    except SpecError as err:
        raise r.fail(launch_line, str(err)) from None
    imported = Imported(
        kind="megatron",
        source=source,
        model=model,
        plan=plan,
        world_size=None,
        nodes=nodes,
        gpus_per_node=gpus,
        world_from=world_from,
        recognised=dict(r.seen),
        unknown=tuple(r.unknown),
        notes=tuple(result.notes + r.notes),
        options=options,
        global_batch=gb,
    )
    if world is None:
        return imported
    replica = plan.tp * plan.pp * plan.cp
    if world % replica:  # e.g. an example published for one node, to be scaled up by its user
        return Imported(
            **{
                **imported.__dict__,
                "world_from": f"{world_from} = {world} GPUs, which cannot hold tp×pp×cp = {replica}: not used",
                "nodes": None,
                "gpus_per_node": gpus,
            }
        )
    return imported.with_world_size(world, world_from)
