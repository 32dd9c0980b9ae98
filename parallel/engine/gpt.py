"""The small pre-norm transformers (nanoGPT's GPT, and a Llama), built as one pipeline stage of a DP×TP×PP×CP(+SP) plan.

Architecture "gpt" (Radford et al. 2019, GPT-2; Karpathy's nanoGPT): learned token and position
embeddings, L blocks of `x + attn(ln_1(x))`, `x + mlp(ln_2(x))` with biases and GeLU, a final
LayerNorm, and an output layer tied to the token embedding. Dropout is off unless asked for.
Architecture "llama" (llama.py): the same blocks with RMSNorm, a SwiGLU MLP, rotary positions,
grouped-query attention, no biases, no dropout, and an untied output layer (`output.weight`).

Parallel pieces (each in its own file): QKV and fc1 are column-parallel, out-projection and fc2
row-parallel (tensor_parallel.py); under SP the LayerNorms, dropouts and residual adds see s/t tokens
(collectives.py); under CP each rank holds 2 of 2·cp sequence chunks and attention sees the whole
sequence by all-gathered K/V, ring attention or Ulysses all-to-all (context_parallel.py); a stage holds L/pp contiguous layers, the first the embeddings, the last the
final LayerNorm and the loss, and a tied copy of the embedding whose gradient is all-reduced with
the first stage's (Megatron-LM's embedding group).

Parameters are named as the serial model names them (`h.3.attn.c_attn.weight`), and every rank
initialises the *full* tensor from (seed, name) and keeps its shard, so any plan starts from the
serial model's weights. What each op saves for backward is labelled for the activation meter
(actmem.py) with memory.py's component names.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from parallel.core.specs import Model
from parallel.engine.actmem import layer, saves
from parallel.engine.collectives import gather_seq, heads_to_seq, reduce_from_tp, scatter_seq, seq_to_heads
from parallel.engine.context_parallel import (
    block_bias,
    causal_bias,
    gathered_bias,
    positions,
    ring_attention,
    sp_ranges,
    take,
    token_ranges,
)
from parallel.engine.llama import RMSNorm, SwiGLUMLP, apply_rope, rope_tables
from parallel.engine.recompute import recompute
from parallel.engine.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    column_parallel_linear,
    shard_tensor,
    vocab_parallel_cross_entropy,
)


def full_shapes(model: Model) -> dict[str, tuple[int, ...]]:
    """Every parameter of the serial model, by name."""
    if model.arch == "llama":
        return _llama_shapes(model)
    h, k, f, v, s = model.hidden, model.kv_hidden, model.ffn_hidden, model.vocab, model.seq_len
    shapes = {"wte.weight": (v, h), "wpe.weight": (s, h)}
    for i in range(model.layers):
        p = f"h.{i}."
        shapes.update(
            {
                p + "ln_1.weight": (h,),
                p + "ln_1.bias": (h,),
                p + "attn.c_attn.weight": (h + 2 * k, h),
                p + "attn.c_attn.bias": (h + 2 * k,),
                p + "attn.c_proj.weight": (h, h),
                p + "attn.c_proj.bias": (h,),
                p + "ln_2.weight": (h,),
                p + "ln_2.bias": (h,),
                p + "mlp.c_fc.weight": (f, h),
                p + "mlp.c_fc.bias": (f,),
                p + "mlp.c_proj.weight": (h, f),
                p + "mlp.c_proj.bias": (h,),
            }
        )
    shapes.update({"ln_f.weight": (h,), "ln_f.bias": (h,)})
    return shapes


def _llama_shapes(model: Model) -> dict[str, tuple[int, ...]]:
    h, k, f, v = model.hidden, model.kv_hidden, model.ffn_hidden, model.vocab
    shapes = {"wte.weight": (v, h)}
    for i in range(model.layers):
        p = f"h.{i}."
        shapes.update(
            {
                p + "ln_1.weight": (h,),
                p + "attn.c_attn.weight": (h + 2 * k, h),
                p + "attn.c_proj.weight": (h, h),
                p + "ln_2.weight": (h,),
                p + "mlp.c_fc.weight": (2 * f, h),  # [gate | up]
                p + "mlp.c_proj.weight": (h, f),
            }
        )
    shapes.update({"ln_f.weight": (h,), "output.weight": (v, h)})
    return shapes


def init_tensor(name: str, shape, *, seed: int, layers: int) -> torch.Tensor:
    """The serial model's initial value of parameter `name`, from (seed, name) alone: N(0, 0.02)
    weights, residual projections scaled by 1/sqrt(2L) (GPT-2 paper, Sec. 2.3), zero biases,
    unit LayerNorm gains."""
    if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        return torch.ones(shape)
    if name.endswith("bias"):
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
    return torch.randn(shape, generator=g) * std


class _LayerNormFn(torch.autograd.Function):
    """LayerNorm keeping only its input for backward (the statistics are recomputed there): exactly the
    "LayerNorm input" of Korthikanti et al. 2022, Sec. 4.1 (torch's kernel also keeps mean and 1/std)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return F.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)

    @staticmethod
    def backward(ctx, g):
        x, w, b = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            y = F.layer_norm(x, x.shape[-1:], w, b, 1e-5)
        return torch.autograd.grad(y, (x, w, b), g)


class LayerNorm(nn.Module):
    def __init__(self, hidden: int, *, sp: bool):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.empty(hidden)), nn.Parameter(torch.empty(hidden))
        if sp:  # applied to s/t tokens: each TP rank holds part of the gradient
            self.weight.sequence_parallel = self.bias.sequence_parallel = True

    def forward(self, x):
        return _LayerNormFn.apply(x, self.weight, self.bias)


class _DropoutFn(torch.autograd.Function):
    """Dropout keeping a 1-byte bool mask (Korthikanti et al. 2022 count masks at 1 byte; torch's CPU
    dropout keeps a float one)."""

    @staticmethod
    def forward(ctx, x, p):
        mask = torch.rand_like(x) >= p
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(mask)
        return x * mask * ctx.scale

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask * ctx.scale, None


def dropout(x, p: float, training: bool):
    return _DropoutFn.apply(x, p) if p > 0 and training else x


class CausalSelfAttention(nn.Module):
    """Q, K, V from one column-parallel GEMM (this rank's heads); K/V heads split over TP when
    tp <= kv_heads, else each rank keeps the one K/V head its query heads use (replicated over
    tp/kv_heads ranks, whose weight gradients ctx.kv sums; Megatron-LM/vLLM do the same); then the
    plan's CP exchange (context_parallel.py) and the row-parallel out-projection."""

    def __init__(self, model: Model, ctx, *, dropout: float, bias: bool = True, rope: bool = False):
        super().__init__()
        plan, t = ctx.plan, ctx.tp.size
        self.tp, self.cp, self.dropout, self.rope = ctx.tp, ctx.cp, dropout, rope
        self.head_dim = model.head_dim
        kv_pieces = min(t, model.kv_heads)  # K/V head groups over TP (one head each when replicated)
        self.heads, self.kv_heads = model.heads // t, model.kv_heads // kv_pieces  # this rank's heads
        h, k = model.hidden, model.kv_hidden
        self.c_attn = ColumnParallelLinear(
            h, [h, k, k], group=ctx.tp, sp=plan.sp, bias=bias, pieces=[t, kv_pieces, kv_pieces]
        )
        if kv_pieces < t:  # rows [h/t, h/t + 2k/kv_pieces) of this rank's weight are the shared K/V head
            self.c_attn.weight.tp_replicated = (h // t, h // t + 2 * k // kv_pieces)
            if bias:
                self.c_attn.bias.tp_replicated = self.c_attn.weight.tp_replicated
        self.c_proj = RowParallelLinear(h, h, group=ctx.tp, sp=plan.sp, bias=bias)
        self.kind = plan.cp_exchange
        # selective recompute drops the s x s scores; ring attention keeps none to drop
        self.selective = plan.recompute == "selective" and self.kind != "ring"

    def core(self, q, k, v, bias):
        """softmax(Q K^T / sqrt(d) + mask) V with grouped K/V heads, no s x s copy of K or V."""
        B, nh, T, hd = q.size()
        nkv, S = k.size(1), k.size(2)
        qg = q.view(B, nkv, nh // nkv * T, hd)  # the query heads of one K/V head, stacked
        with saves("attention.qk"):
            att = (qg @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nkv, g*T, S)
        att = att.view(B, nkv, nh // nkv, T, S) + bias  # causal mask over global positions
        with saves("attention.scores"):
            p = F.softmax(att, dim=-1)
        with saves("attention.dropout_mask"):
            pd = dropout(p, self.dropout, self.training)
        with saves({"attention.dropout_output": pd, "attention.v": v}):
            y = pd.view(B, nkv, nh // nkv * T, S) @ v  # (B, nkv, g*T, hd)
        return y.view(B, nh, T, hd)

    def attend(self, q, k, v, mask):
        """Attention of (B, nh, T, hd) queries over (B, nkv, S, hd) keys: selective recompute or not."""
        if self.selective:  # keep Q, K, V; recompute the scores and softmax in backward
            with saves({"attention.qk": (q, k), "attention.v": v}):
                return recompute(lambda q_, k_, v_: self.core(q_, k_, v_, mask), q, k, v)
        return self.core(q, k, v, mask)

    def forward(self, x, mask, rope=None):
        """`mask`: the stage's masks for this CP exchange; `rope`: (cos, sin) of this rank's tokens."""
        B = x.size(0)
        with saves("attention.qkv_input"):
            qkv = self.c_attn(x)  # (B, T, (h + 2k)/t): all s/cp tokens of this CP rank, this rank's heads
        T, hd = qkv.size(1), self.head_dim
        q, k, v = qkv.split([self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=2)
        q, k, v = q.view(B, T, self.heads, hd), k.view(B, T, self.kv_heads, hd), v.view(B, T, self.kv_heads, hd)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.kind == "ulysses":  # (B, T, heads) -> (B, s, heads/cp): every token of some heads
            q, k, v = (seq_to_heads(t, group=self.cp) for t in (q, k, v))
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (B, heads, tokens, hd)
        if self.kind == "ring":
            labels = {"attention.qk": (q, k), "attention.v": v}  # ring_attention adds its lse and output
            with saves(labels):
                y = ring_attention(q, k, v, group=self.cp, biases=mask, scale=1.0 / math.sqrt(hd), labels=labels)
            y = y.view(B, T, self.heads * hd)  # (B, T, h/t), the saved output itself
        else:
            if self.kind == "allgather":
                k = gather_seq(k, group=self.cp, dim="cp", axis=2)  # (B, nkv, s, hd): keys of every CP rank
                v = gather_seq(v, group=self.cp, dim="cp", axis=2)
            y = self.attend(q, k, v, mask).transpose(1, 2)  # (B, tokens, heads, hd)
            if self.kind == "ulysses":
                y = heads_to_seq(y, group=self.cp)  # (B, T, nh, hd)
            y = y.contiguous().view(B, T, self.heads * hd)  # (B, T, h/t)
        with saves("attention.proj_input"):
            y = self.c_proj(y)  # (B, T_local, h): s/(cp·t) tokens under SP
        with saves("residual.dropout_masks"):
            return dropout(y, self.dropout, self.training)


class MLP(nn.Module):  # GPT's: GeLU between the two GEMMs
    def __init__(self, model: Model, ctx, *, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.c_fc = ColumnParallelLinear(model.hidden, [model.ffn_hidden], group=ctx.tp, sp=ctx.plan.sp)
        self.c_proj = RowParallelLinear(model.ffn_hidden, model.hidden, group=ctx.tp, sp=ctx.plan.sp)

    def forward(self, x):
        with saves("mlp.fc1_input"):
            x = self.c_fc(x)  # (B, T, f/t)
        with saves("mlp.act_input"):
            x = F.gelu(x)
        with saves("mlp.fc2_input"):
            x = self.c_proj(x)  # (B, T_local, h)
        with saves("residual.dropout_masks"):
            return dropout(x, self.dropout, self.training)


def norm(model: Model, *, sp: bool) -> nn.Module:
    return RMSNorm(model.hidden, sp=sp) if model.arch == "llama" else LayerNorm(model.hidden, sp=sp)


class Block(nn.Module):
    def __init__(self, model: Model, ctx, *, dropout: float, swiglu: str = "fused"):
        super().__init__()
        llama, sp = model.arch == "llama", ctx.plan.sp
        self.ln_1 = norm(model, sp=sp)
        self.attn = CausalSelfAttention(model, ctx, dropout=dropout, bias=not llama, rope=llama)
        self.ln_2 = norm(model, sp=sp)
        self.mlp = SwiGLUMLP(model, ctx, swiglu=swiglu) if llama else MLP(model, ctx, dropout=dropout)

    def forward(self, x, mask, rope=None):
        with saves("layernorm"):
            a = self.ln_1(x)
        x = x + self.attn(a, mask, rope)
        with saves("layernorm"):
            m = self.ln_2(x)
        return x + self.mlp(m)


class GPTStage(nn.Module):
    """Model chunk `chunk` of pipeline stage `ctx.stage`: virtual stage u = chunk·pp + stage of pp·vpp
    holds layers [u·L/(pp·vpp), (u+1)·L/(pp·vpp)), plus the embeddings on the first virtual stage and
    the final LayerNorm, output layer and loss on the last. Without interleaving (vpp = 1) a stage
    is one chunk."""

    def __init__(self, *, model: Model, ctx, dropout: float = 0.0, chunk: int = 0, swiglu: str = "fused"):
        super().__init__()
        plan, tp = ctx.plan, ctx.tp
        self.model, self.tp, self.sp, self.dropout = model, tp, plan.sp, dropout
        self.llama = model.arch == "llama"
        virtual, n_virtual = chunk * plan.pp + ctx.stage, plan.pp * plan.vpp
        self.first, self.last, self.full_recompute = virtual == 0, virtual == n_virtual - 1, plan.recompute == "full"
        if self.first or (self.last and not self.llama):  # GPT's output layer is the token embedding
            self.wte = VocabParallelEmbedding(model.vocab, model.hidden, group=tp)
        if self.first and not self.llama:
            self.wpe = nn.Embedding(model.seq_len, model.hidden)  # its weight, sliced by position ranges
            self.wpe.weight.sequence_parallel = plan.sp
        per = model.layers // n_virtual
        self.h = nn.ModuleDict(
            {
                str(i): Block(model, ctx, dropout=dropout, swiglu=swiglu)
                for i in range(virtual * per, (virtual + 1) * per)
            }
        )
        if self.last:
            self.ln_f = norm(model, sp=plan.sp)
            if self.llama:  # untied: the vocabulary-split output layer of its own
                self.output = VocabParallelEmbedding(model.vocab, model.hidden, group=tp)
        self.ranges = token_ranges(seq_len=model.seq_len, cp=plan.cp, index=ctx.cp.index)  # this CP rank's tokens
        self.local_ranges = sp_ranges(self.ranges, tp=tp.size, index=tp.index) if plan.sp else self.ranges
        # the causal mask(s) of this CP rank's queries for the plan's CP exchange; buffers, so .to()
        # moves and casts them with the weights
        s, cp, me = model.seq_len, plan.cp, ctx.cp.index
        kind = plan.cp_exchange
        if kind == "ring":  # one (s/cp, s/cp) block per CP rank whose K/V pass by
            mask = torch.stack([block_bias(seq_len=s, cp=cp, q_index=me, k_index=j) for j in range(cp)])
        elif kind == "ulysses":  # all s tokens, in CP-rank order
            mask = gathered_bias(seq_len=s, cp=cp)
        else:
            mask = causal_bias(seq_len=s, cp=cp, index=me)
        self.register_buffer("bias", mask, persistent=False)
        if self.llama:  # rotary tables of this rank's tokens (before Ulysses' exchange: its own tokens)
            cos, sin = rope_tables(positions(self.ranges), model.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self, *, seed: int) -> None:
        """Every parameter from the serial model's full tensor, sharded for this TP rank."""
        t, shapes = self.tp, full_shapes(self.model)
        for name, p in self.named_parameters():
            full = init_tensor(name, shapes[name], seed=seed, layers=self.model.layers)
            if hasattr(p, "tp_shard"):
                full = shard_tensor(full, *p.tp_shard, index=t.index, size=t.size)
            p.copy_(full)

    def embed(self, ids):
        with saves("embedding.token_ids"):
            x = self.wte(ids)  # (B, s/cp, h) partial sums over the vocabulary shards
        x = scatter_seq(x, group=self.tp, dim="sp") if self.sp else reduce_from_tp(x, group=self.tp)
        if self.llama:  # positions enter as rotations inside attention
            return x
        x = x + take(self.wpe.weight, self.local_ranges, axis=0)  # (B, T_local, h) + positions of these tokens
        with saves("embedding.dropout_mask"):
            return dropout(x, self.dropout, self.training)

    def forward(self, x=None, *, ids=None, targets=None, tokens: int = 1):
        """First stage: token `ids` (B, s/cp); others: the previous stage's `x` (B, T_local, h).
        Returns the activation for the next stage, or on the last stage this rank's share of the
        global-batch mean loss: its tokens' losses summed, divided by all `tokens` of the step."""
        if self.first:
            x = self.embed(ids)
        rope = (self.rope_cos, self.rope_sin) if self.llama else None
        for i, block in self.h.items():
            with layer(int(i)):
                if self.full_recompute:
                    with saves("layer_input"):
                        x = recompute(lambda x_, b=block: b(x_, self.bias, rope), x)
                else:
                    x = block(x, self.bias, rope)
        if not self.last:
            return x
        with saves("output.layernorm"):
            x = self.ln_f(x)
        head = self.output if self.llama else self.wte
        with saves("output.proj_input"):
            logits = column_parallel_linear(x, head.weight, None, group=self.tp, sp=self.sp)  # (B, s/cp, V/t)
        with saves("output.logits"):
            loss = vocab_parallel_cross_entropy(logits, targets, start=head.start, group=self.tp)  # (B, s/cp)
        return loss.sum() / tokens
