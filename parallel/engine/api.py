"""What a wrapper of the engine needs without importing torch: the job's config, the plans this engine
accepts beyond the plan model's rules, torchrun's environment, and `run_rank` (torch is imported only
when a rank actually trains).

For wrappers (the profiler): `run_rank(cfg, rank=..., world_size=..., init_method=..., on_step=...)`
trains one rank and returns the job's metrics on rank 0; `on_step(step, info)` runs on every rank
after each optimizer step (info: step, steps, loss (last stage) or None, step_time_s), the place for
`prof.step()`. `launch.run_local(fn, world_size=...)` forks ranks that call `fn(rank=, world_size=,
init_method=)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from parallel.core.plan import Plan
from parallel.core.specs import Model


@dataclass(frozen=True)
class TrainConfig:
    model: Model
    plan: Plan
    steps: int = 3
    seed: int = 0
    lr: float = 1e-3  # AdamW, betas (0.9, 0.95) as GPT-3 (Brown et al. 2020, Sec. B)
    weight_decay: float = 0.0
    dropout: float = 0.0  # off: every plan then computes exactly the serial model
    swiglu: str = "fused"  # llama: what the SwiGLU keeps for backward (parallel.core.memory.SWIGLU)
    bucket_mb: float = 25.0  # gradient bucket size (PyTorch DDP's default)
    timeout_s: float = 60.0  # process-group timeout: a dead peer ends a collective within this
    out: str | None = None
    save_params: bool = False  # DIR/params/rank{r}.pt: each rank's shards (see metrics.full_state_dict)
    launcher: str = "local"
    # (rank, ms): a host delay of ms on every microbatch's forward of that rank -- an injected straggler
    # that what-if replays are checked against (profiler whatif --rank-speed R=median)
    straggler: tuple[int, float] | None = None


def engine_errors(model: Model, plan: Plan) -> list[str]:
    """What the plan model accepts but this engine does not implement."""
    errors = []
    if model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        errors.append(
            f"kv_heads {model.kv_heads} and tp {plan.tp} do not divide one another: the engine splits K/V heads "
            f"over TP (tp ≤ kv_heads) or gives each group of tp/kv_heads ranks one whole head"
        )
    if model.arch == "llama" and model.tie_embeddings:
        errors.append("tie_embeddings true with arch llama: the engine's llama has an untied output layer")
    if model.head_dim % 2 and model.arch == "llama":
        errors.append(f"head_dim {model.head_dim} is odd: rotary embeddings rotate pairs of dimensions")
    if model.vocab % plan.tp:
        errors.append(f"vocab {model.vocab} is not divisible by tp {plan.tp}: the engine does not pad the vocabulary")
    if model.dtype_bytes not in (2, 4):
        errors.append(f"dtype_bytes {model.dtype_bytes}: the engine trains fp32 (4) or bf16 (2)")
    if model.tie_embeddings is False and model.arch == "gpt":
        errors.append("tie_embeddings false: the engine's output layer is the token embedding")
    if model.q_hidden != model.hidden:
        errors.append(
            f"heads × head_dim = {model.q_hidden} ≠ hidden {model.hidden}: the engine's attention is hidden wide"
        )
    if model.experts or plan.ep > 1:
        errors.append("mixture of experts / ep > 1: the engine trains dense models")
    if plan.fp8 != "none":
        errors.append(f"fp8 {plan.fp8!r}: the engine has no FP8 GEMMs (they need Transformer Engine on Hopper GPUs)")
    return errors


# Host bytes per token of the step's global batch while data.global_batch builds it on each rank:
# the (G, s+1) int64 progression, its modulo, the random replacements and the result, and the float
# noise mask (4 x 8 + 4 bytes, rounded up).
DATA_BYTES_PER_TOKEN = 40


def available_memory_bytes() -> int | None:
    """This machine's MemAvailable (/proc/meminfo), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_errors(model: Model, plan: Plan, *, ranks_here: int, available: int | None = None) -> list[str]:
    """Whether the step's data fits this machine before any rank starts: every rank builds the whole
    global batch of tokens (data.global_batch), `ranks_here` of them at once on this host."""
    available = available_memory_bytes() if available is None else available
    need = plan.global_batch * (model.seq_len + 1) * DATA_BYTES_PER_TOKEN * ranks_here
    if available is None or need <= available:
        return []
    return [
        f"--global-batch {plan.global_batch:,}: each of the {ranks_here} ranks on this machine builds the step's "
        f"{plan.global_batch:,} × {model.seq_len + 1:,} tokens, about {need / 1e9:,.1f} GB together; "
        f"{available / 1e9:,.1f} GB is available"
    ]


def torchrun_env() -> dict | None:
    """Rank, world, local rank, node and ranks per node from torchrun's environment, or None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_RANK" not in os.environ:
        return None
    return {
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "node": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
        "gpus_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
    }


def run_rank(
    cfg: TrainConfig,
    *,
    rank: int,
    world_size: int,
    init_method: str = "env://",
    local_rank: int | None = None,
    node: int = 0,
    gpus_per_node: int | None = None,
    on_step=None,
) -> dict | None:
    """Train `cfg` as rank `rank`; returns the job's metrics on rank 0 (written to cfg.out), else None."""
    from parallel.engine.job import train_rank  # lazy: torch, only when a rank trains (api.py loads none)

    return train_rank(
        cfg,
        rank=rank,
        world_size=world_size,
        init_method=init_method,
        local_rank=rank if local_rank is None else local_rank,
        node=node,
        gpus_per_node=gpus_per_node or world_size,
        on_step=on_step,
    )
