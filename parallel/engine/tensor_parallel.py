"""Tensor (and sequence) parallel layers: column- and row-parallel linear, vocab-parallel embedding and cross entropy.

Shoeybi et al. 2019, "Megatron-LM", Sec. 3: the first GEMM of a pair is split by columns (each TP
rank computes its heads or its ffn_hidden/t slice), the second by rows, so a pair needs one
all-reduce forward and one backward. With sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2)
the all-reduces become an all-gather before the column-parallel GEMM and a reduce-scatter after the
row-parallel one, and the tensors in between the pairs (LayerNorm, dropout, residual) hold s/t tokens.

Each sharded parameter carries `tp_shard = (axis, parts, pieces)`: the full tensor is the blocks
`parts` along `axis` (e.g. [q | k | v] rows of the QKV weight), block j cut into pieces[j] equal
pieces of which TP rank i keeps piece i·pieces[j]/t: one piece per rank when pieces[j] = t, and
a piece shared by t/pieces[j] consecutive ranks when fewer (GQA's K/V heads when tp > kv_heads).
`shard_tensor` / `unshard_tensor` convert between the full (serial) tensor and a rank's shard.
Parameters whose gradient is a partial sum over the TP ranks under SP carry `sequence_parallel = True`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parallel.engine.collectives import (
    Group,
    all_gather,
    all_reduce,
    copy_to_tp,
    reduce_from_tp,
    reduce_scatter,
    scatter_seq,
)


def shard_tensor(full: torch.Tensor, axis: int, parts, pieces=None, *, index: int, size: int) -> torch.Tensor:
    """TP rank `index`'s piece of each block of `full`, concatenated along `axis`."""
    pieces = pieces or (size,) * len(parts)
    blocks = full.split(list(parts), dim=axis)
    return torch.cat([b.chunk(n, dim=axis)[index * n // size] for b, n in zip(blocks, pieces)], dim=axis).contiguous()


def unshard_tensor(shards: list[torch.Tensor], axis: int, parts, pieces=None) -> torch.Tensor:
    """The full tensor from the shards of TP ranks 0..t-1 (inverse of `shard_tensor`; a piece shared
    by several ranks is taken from the first of them)."""
    t = len(shards)
    pieces = pieces or (t,) * len(parts)
    split = [s.split([p // n for p, n in zip(parts, pieces)], dim=axis) for s in shards]
    return torch.cat(
        [torch.cat([split[c * t // n][j] for c in range(n)], dim=axis) for j, n in enumerate(pieces)], dim=axis
    )


class _LinearSeqGather(torch.autograd.Function):
    """Column-parallel GEMM under SP: all-gather the s/t-token input, multiply; keep only the
    *sharded* input for backward and all-gather it again there (Korthikanti et al. 2022, Sec. 4.2.2,
    as Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication), then reduce-scatter the
    input gradient (the conjugate `ḡ`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(all_gather(x, group=group, dim="sp", axis=1), weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        x_full = all_gather(x, group=ctx.group, dim="sp", axis=1)  # (B, T, in) re-gathered
        gx = reduce_scatter(g @ weight, group=ctx.group, dim="sp", axis=1)  # (B, T/t, in)
        g2 = g.reshape(-1, g.shape[-1])
        gw = g2.t() @ x_full.reshape(-1, x_full.shape[-1])
        gb = g2.sum(0) if ctx.has_bias else None
        return gx, gw, gb, None


def column_parallel_linear(x, weight, bias, *, group: Group, sp: bool):
    """X A_i (+ b_i) on TP rank i: `f` before it (or SP's all-gather)."""
    if sp and group.size > 1:
        return _LinearSeqGather.apply(x, weight, bias, group)
    return F.linear(copy_to_tp(x, group=group), weight, bias)


class ColumnParallelLinear(nn.Module):
    """Output features split over TP: weight (sum(out_parts)/t, in). `out_parts` keeps fused
    projections (QKV) head-aligned: each block is split separately."""

    def __init__(self, in_features: int, out_parts, *, group: Group, sp: bool, bias: bool = True, pieces=None):
        super().__init__()
        self.group, self.sp, t = group, sp, group.size
        pieces = tuple(pieces or (t,) * len(out_parts))  # see the module docstring
        out_local = sum(p // n for p, n in zip(out_parts, pieces))
        self.weight = nn.Parameter(torch.empty(out_local, in_features))
        self.weight.tp_shard = (0, tuple(out_parts), pieces)
        self.bias = nn.Parameter(torch.empty(out_local)) if bias else None
        if bias:
            self.bias.tp_shard = (0, tuple(out_parts), pieces)

    def forward(self, x):
        return column_parallel_linear(x, self.weight, self.bias, group=self.group, sp=self.sp)


class RowParallelLinear(nn.Module):
    """Input features split over TP: weight (out, in/t); `f̄` after it (or SP's reduce-scatter), then
    the bias, which every TP rank holds whole."""

    def __init__(self, in_features: int, out_features: int, *, group: Group, sp: bool, bias: bool = True):
        super().__init__()
        self.group, self.sp = group, sp
        self.weight = nn.Parameter(torch.empty(out_features, in_features // group.size))
        self.weight.tp_shard = (1, (in_features,))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        if bias and sp:
            self.bias.sequence_parallel = True  # added on s/t tokens: a partial gradient

    def forward(self, x):
        y = F.linear(x, self.weight)  # (B, T, out) partial sums over TP ranks
        y = scatter_seq(y, group=self.group, dim="sp") if self.sp else reduce_from_tp(y, group=self.group)
        return y if self.bias is None else y + self.bias


class _EmbeddingLookup(torch.autograd.Function):
    """Rows [start, start + V/t) of the vocabulary; tokens outside the range give zeros. Keeps only the
    token ids (the microbatch input, not an activation) and recomputes the mask in backward."""

    @staticmethod
    def forward(ctx, ids, weight, start):
        ctx.save_for_backward(ids)
        ctx.start, ctx.shape = start, weight.shape
        local, valid = _local_ids(ids, start, weight.shape[0])
        return F.embedding(local, weight) * valid.unsqueeze(-1).to(weight.dtype)

    @staticmethod
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        local, valid = _local_ids(ids, ctx.start, ctx.shape[0])
        gw = torch.zeros(ctx.shape, dtype=g.dtype, device=g.device)
        gw.index_put_((local[valid],), g[valid], accumulate=True)
        return None, gw, None


def _local_ids(ids, start: int, rows: int):
    valid = (ids >= start) & (ids < start + rows)
    return torch.where(valid, ids - start, 0), valid


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows over TP (Shoeybi et al. 2019, Sec. 3). Returns the
    rank's partial sum; the caller reduces it over TP (all-reduce, or SP's reduce-scatter)."""

    def __init__(self, vocab: int, hidden: int, *, group: Group):
        super().__init__()
        self.group = group
        rows = vocab // group.size
        self.start = group.index * rows
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.weight.tp_shard = (0, (vocab,))

    def forward(self, ids):
        return _EmbeddingLookup.apply(ids, self.weight, self.start)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary across TP, without gathering them (Shoeybi et al.
    2019, Sec. 3: the output GEMM fused with the loss, communicating b·s scalars instead of b·s·v
    logits). Backward needs only softmax − one-hot, so forward computes it and keeps nothing else:
    the fp32 logits-sized tensor of Korthikanti et al. 2022, Sec. 4.3 (4sbv/t bytes)."""

    @staticmethod
    def forward(ctx, logits, target, start, group):
        z = logits.float()  # (B, T, V/t)
        m = z.max(dim=-1).values  # (B, T)
        all_reduce(m, group=group, dim="tp", op=dist.ReduceOp.MAX)
        z = z - m.unsqueeze(-1)
        local, valid = _local_ids(target, start, z.shape[-1])
        e = z.exp()
        stats = torch.stack([e.sum(-1), z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * valid])  # (2, B, T)
        all_reduce(stats, group=group, dim="tp")
        loss = stats[0].log() - stats[1]  # log sum exp - target logit
        grad = e.div_(stats[0].unsqueeze(-1))  # softmax
        grad.view(-1, grad.shape[-1])[valid.view(-1), local.view(-1)[valid.view(-1)]] -= 1.0
        ctx.dtype = logits.dtype
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return (grad * g.unsqueeze(-1)).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits, target, *, start: int, group: Group):
    """Per-token loss (B, T) from this rank's logits (B, T, V/t) for vocabulary rows [start, start + V/t)."""
    return _VocabParallelCrossEntropy.apply(logits, target, start, group)
