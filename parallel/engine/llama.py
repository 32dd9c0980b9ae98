"""The Llama architecture's own pieces: RMSNorm, the SwiGLU MLP and rotary position embeddings.

Touvron et al. 2023, "LLaMA" (Sec. 2.2): pre-normalisation with RMSNorm (Zhang & Sennrich 2019), the
SwiGLU activation (Shazeer 2020, "GLU Variants Improve Transformer": silu(x W_gate) * (x W_up), then
W_down), rotary embeddings (Su et al. 2021, "RoFormer") instead of learned positions, no biases; Llama
2/3 add grouped-query attention (Ainslie et al. 2023), handled by the attention in gpt.py.

What each op keeps for backward is what the plan model counts (parallel.core.memory):
  * RMSNorm keeps only its input (the statistic is recomputed), like gpt.py's LayerNorm;
  * SwiGLU "fused" keeps only its input, gate and up (silu recomputed in backward: Megatron-LM's
    bias_swiglu fusion); "unfused" is PyTorch's silu(gate) * up, which also keeps silu(gate);
  * RoPE keeps nothing but the rotation tables, which are constants of the model (fused RoPE
    kernels, e.g. Apex/Transformer Engine's, keep only the frequencies).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from parallel.engine.actmem import saves
from parallel.engine.tensor_parallel import ColumnParallelLinear, RowParallelLinear

RMS_EPS = 1e-5
ROPE_THETA = 10000.0  # RoFormer's base (Llama 3 uses 500000; the base changes no shape or byte)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * weight


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm keeping only its input (and the gain, a parameter) for backward."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return rms_norm(x, weight)

    @staticmethod
    def backward(ctx, g):
        x, w = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            y = rms_norm(x, w)
        return torch.autograd.grad(y, (x, w), g)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, *, sp: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden))
        if sp:  # applied to s/t tokens: each TP rank holds part of the gradient
            self.weight.sequence_parallel = True

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight)


class _FusedSwiGLU(torch.autograd.Function):
    """silu(gate) * up from the column-parallel GEMM's (B, T, 2f/t) output, keeping only that output."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, g):
        (gate_up,) = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_gate = g * up * sig * (1 + gate * (1 - sig))
        return torch.cat([d_gate, g * silu], dim=-1)


class SwiGLUMLP(nn.Module):
    """W_down(silu(x W_gate) * x W_up): gate and up are one column-parallel GEMM whose two blocks are
    split separately over TP (each rank: f/t of each), down is row-parallel."""

    def __init__(self, model, ctx, *, swiglu: str = "fused"):
        super().__init__()
        f, sp = model.ffn_hidden, ctx.plan.sp
        self.fused = swiglu == "fused"
        self.c_fc = ColumnParallelLinear(model.hidden, [f, f], group=ctx.tp, sp=sp, bias=False)
        self.c_proj = RowParallelLinear(f, model.hidden, group=ctx.tp, sp=sp, bias=False)

    def forward(self, x):
        with saves("mlp.fc1_input"):
            gate_up = self.c_fc(x)  # (B, T, 2f/t): [gate | up] of this rank
        if self.fused:
            with saves("mlp.act_input"):
                y = _FusedSwiGLU.apply(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            with saves("mlp.act_input"):
                a = F.silu(gate)
            with saves({"mlp.act_input": (gate, up), "mlp.fc2_input": a}):
                y = a * up
        with saves("mlp.fc2_input"):
            return self.c_proj(y)


def rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, head_dim) for the tokens at `positions` (RoFormer Eq. 34, rotate-half layout)."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64).unsqueeze(1) * inv.unsqueeze(0)  # (T, d/2)
    angles = torch.cat([angles, angles], dim=1)
    return angles.cos().float(), angles.sin().float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class _Rope(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin on (B, T, heads, d); backward is the inverse rotation. The tables
    sit on ctx (constants), so autograd keeps no tensor for it."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.cos, ctx.sin = cos, sin
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.cos, ctx.sin
        gs = g * sin
        a, b = gs.chunk(2, dim=-1)
        return g * cos + torch.cat([b, -a], dim=-1), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, T, heads, d) by the tables of its T tokens (cos, sin: (T, d))."""
    return _Rope.apply(x, cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype))
