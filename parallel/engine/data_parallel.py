"""Gradient reduction: bucketed all-reduce over the dp×cp replicas, the SP and tied-embedding partial
gradients, and ZeRO-1.

Gradients live in flat buckets (PyTorch DDP's design, Li et al. 2020, "PyTorch Distributed",
Sec. 3.2.3; 25 MiB buckets by default as DDP), filled in reverse parameter order, the order
backward produces them; each parameter's `.grad` is a view of its bucket, so autograd accumulates
the microbatches in place and one collective per bucket reduces them. The reduction runs over the
dp×cp group: context-parallel ranks hold the same weights and see different tokens (Megatron-LM's
data-parallel group "with context parallel"). The loss is already divided by the global batch's
tokens, so the reduction is a plain sum.

Before it, two partial sums of the plan itself are completed:
  * under SP, LayerNorm gains/biases, the row-parallel biases and the position embedding were
    applied to s/t tokens per TP rank: their gradients are summed over TP (Korthikanti et al. 2022,
    Sec. 4.2.2; Megatron-LM's allreduce of "sequence_parallel" gradients), one coalesced all-reduce;
  * with pp > 1 the output layer is a copy of the token embedding on the last stage, and the two
    copies' gradients are summed over the embedding group (Megatron-LM; Shoeybi et al. 2019) --
    only where the output layer is tied (GPT);
  * with GQA and tp > kv_heads, the TP ranks sharing a K/V head each computed its weights'
    gradient from their own query heads: the rows marked `tp_replicated` are summed over ctx.kv.

ZeRO-1 (Rajbhandari et al. 2020, "ZeRO", Sec. 5.1): each bucket is reduce-scattered instead, the
optimizer updates only this rank's 1/N of every bucket (its states are 1/N), and the updated
parameters are all-gathered back.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from parallel.engine.collectives import all_gather_flat, all_reduce, reduce_scatter_flat


def flatten_params(params: list[nn.Parameter], *, n_shards: int, index: int):
    """The parameters copied into one flat buffer padded to a multiple of `n_shards` elements, each
    parameter becoming a view of it: (flat, offset of each parameter, [lo, hi) of shard `index`)."""
    numel = sum(p.numel() for p in params)
    padded = -(-numel // n_shards) * n_shards  # a multiple of the dp×cp size, for ZeRO
    p0 = params[0]
    flat = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
    offsets, off = [], 0
    for p in params:
        n = p.numel()
        flat[off : off + n].copy_(p.detach().reshape(-1))
        p.data = flat[off : off + n].view_as(p)
        offsets.append(off)
        off += n
    size = padded // n_shards
    return flat, offsets, (index * size, (index + 1) * size)


class _Bucket:
    def __init__(self, params: list[nn.Parameter], *, n_shards: int, index: int):
        self.param, offsets, (self.lo, self.hi) = flatten_params(params, n_shards=n_shards, index=index)
        self.grad = torch.zeros_like(self.param)
        for p, off in zip(params, offsets):  # gradients become views of the flat buffer too
            p.grad = self.grad[off : off + p.numel()].view_as(p)


def _sum_in_place(grads: list[torch.Tensor], *, group, dim: str) -> None:
    """Sum `grads` (views into the gradient buckets) over `group` with one coalesced all-reduce."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce(flat, group=group, dim=dim)
    off = 0
    for g in grads:
        g.copy_(flat[off : off + g.numel()].view_as(g))
        off += g.numel()


class GradReducer:
    """Owns the gradient buffers of a stage's parameters and reduces them before the optimizer step."""

    def __init__(self, named_params, *, ctx, zero: int = 0, bucket_bytes: int = 25 * 2**20, tied: bool = True):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        params = [p for _, p in named]
        self.ctx, self.zero, self.params = ctx, zero, params
        self.sp_params = [p for p in params if getattr(p, "sequence_parallel", False)]
        self.kv_params = [p for p in params if hasattr(p, "tp_replicated")]
        # the tied embedding's two copies (first and last stage) when pp > 1
        self.emb_params = [p for n, p in named if n == "wte.weight"] if tied and ctx.emb.size > 1 else []
        n, idx = ctx.dpcp.size, max(ctx.dpcp.index, 0)
        self.buckets, cur, cur_bytes = [], [], 0
        for p in reversed(params):
            cur.append(p)
            cur_bytes += p.numel() * p.element_size()
            if cur_bytes >= bucket_bytes:
                self.buckets.append(_Bucket(cur, n_shards=n, index=idx))
                cur, cur_bytes = [], 0
        if cur:
            self.buckets.append(_Bucket(cur, n_shards=n, index=idx))
        if zero >= 1:
            # the optimizer sees one parameter per bucket: this rank's shard of the flat buffer
            # and its gradient is the same slice of the bucket's (the distributed optimizer keeps the
            # whole gradient buffer; its shard is a view, not a second copy)
            self.shards = [nn.Parameter(b.param[b.lo : b.hi]) for b in self.buckets]
            for s, b in zip(self.shards, self.buckets):
                s.grad = b.grad[b.lo : b.hi]

    def optimizer_params(self) -> list[nn.Parameter]:
        """What the optimizer updates: the parameters, or under ZeRO-1 this rank's bucket shards."""
        return self.shards if self.zero >= 1 else self.params

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.grad.zero_()

    def reduce(self) -> None:
        ctx = self.ctx
        if self.sp_params and ctx.tp.size > 1:
            _sum_in_place([p.grad for p in self.sp_params], group=ctx.tp, dim="sp")
        if self.kv_params and ctx.kv.size > 1:
            _sum_in_place([p.grad[slice(*p.tp_replicated)] for p in self.kv_params], group=ctx.kv, dim="tp")
        for p in self.emb_params:
            all_reduce(p.grad, group=ctx.emb, dim="pp")
        for b, shard in zip(self.buckets, self.shards if self.zero >= 1 else [None] * len(self.buckets)):
            if shard is None:
                all_reduce(b.grad, group=ctx.dpcp, dim="dp")
            elif ctx.dpcp.size > 1:  # into a fresh shard: the output may not alias the input
                out = torch.empty_like(shard.grad)
                reduce_scatter_flat(out, b.grad, group=ctx.dpcp, dim="dp")
                shard.grad.copy_(out)

    def after_step(self) -> None:
        """ZeRO-1: all-gather the updated shards into every replica's parameters."""
        if self.zero >= 1 and self.ctx.dpcp.size > 1:
            for b in self.buckets:
                all_gather_flat(b.param, b.param[b.lo : b.hi].clone(), group=self.ctx.dpcp, dim="dp")
