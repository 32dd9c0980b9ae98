"""ZeRO-2 and ZeRO-3 over the dp×cp replicas: sharded gradients, and sharded parameters gathered per layer.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
Sec. 5.2-5.3 (P_os+g, P_os+g+p): with N_d = dp·cp replicas of the same weights (Megatron-LM's
data-parallel group "with context parallel"),

  ZeRO-2  each rank keeps 1/N_d of the gradients and optimizer states. A unit's gradients are
          reduce-scattered as soon as backward has produced them for a microbatch and the full-size
          gradients are dropped (DeepSpeed's stage 2 and PyTorch FSDP with gradient accumulation do
          the same: one reduce-scatter per unit per microbatch); the updated shards are all-gathered
          into the full parameters after the optimizer step, as ZeRO-1.
  ZeRO-3  also the parameters: each rank stores its 1/N_d shard; a unit's full parameters are
          all-gathered before its forward and again before its backward, and freed after each
          (the flat buffer's storage shrinks to 0 bytes), so the optimizer steps the shards and no
          gather follows it.

Units, as torchtitan wraps a model for FSDP: each transformer layer is one; the token embedding is
one (so its tied copy on the last stage shards exactly as on the first, and the two copies'
gradient shards can be summed over the embedding group); the rest of a chunk's parameters (position
embedding, final norm, untied output layer) one more. The end units stay gathered for the whole
forward of their chunk (the tied output layer is the embedding, used again at the end) and from the
start of its backward to their gradients; FSDP2 keeps its root module's parameters from forward to
backward instead, which saves one gather per microbatch at the cost of holding them in between,
and under 1F1B would make the number of gathers depend on the schedule.

Why hand-written and not `torch.distributed.fsdp.fully_shard` (FSDP2, which does run on gloo
here): FSDP2 has no ZeRO-2 -- parameters at rest are always sharded, `reshard_after_forward=False`
only skips the free between forward and backward -- and its collectives run inside its own code,
outside the `ps.comm` ranges that give every collective of this engine its plan dimension in a
trace. The units' flat buffers, one collective per unit and microbatch, and the partial sums of
the plan (SP, GQA replicas, tied embedding) applied to the gradient shards are the same design as
data_parallel.py's buckets.

Partial sums on shards: every TP rank (and the first and last stage, for the tied embedding) lays
out its units identically, so the slice of an SP parameter's gradient inside this rank's shard is
the same slice on every TP rank; summing those slices over TP after the reduce-scatter equals
summing the full gradients before it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from parallel.engine.collectives import all_gather_flat, all_reduce, reduce_scatter_flat
from parallel.engine.data_parallel import _sum_in_place, flatten_params


class _Unit:
    """The parameters of one layer (or one end of a chunk) in a flat buffer, and this rank's shard."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], *, reducer: ShardedReducer, shard_params: bool):
        self.reducer, self.params = reducer, [p for _, p in named]
        ctx = reducer.ctx
        self.flat, self.offsets, (self.lo, self.hi) = flatten_params(
            self.params, n_shards=ctx.dpcp.size, index=max(ctx.dpcp.index, 0)
        )
        self.pad = self.flat.numel() - sum(p.numel() for p in self.params)
        self.shard_params = shard_params
        if shard_params:  # ZeRO-3: the shard is the only stored copy; the flat buffer is freed
            self.shard = nn.Parameter(self.flat[self.lo : self.hi].clone())
            self._nbytes = self.flat.untyped_storage().nbytes()
            self.flat.untyped_storage().resize_(0)
            self.gathered = False
        else:  # ZeRO-2: full parameters; the optimizer updates this rank's slice of them in place
            self.shard = nn.Parameter(self.flat[self.lo : self.hi])
            self.gathered = True
        self.shard.grad = torch.zeros_like(self.shard)  # the gradient shard, summed over microbatches
        self.arrived = 0  # parameters whose gradient backward has produced this microbatch
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    # ---- ZeRO-3 parameter gather / free -------------------------------------------------------
    @torch.no_grad()
    def gather(self) -> None:
        if self.gathered:
            return
        self.flat.untyped_storage().resize_(self._nbytes)
        ctx = self.reducer.ctx
        if ctx.dpcp.size > 1:
            all_gather_flat(self.flat, self.shard.detach(), group=ctx.dpcp, dim="dp")
        else:
            self.flat.copy_(self.shard.detach())
        self.gathered = True
        self.reducer._transient("gathered_params", self._nbytes)

    def free(self) -> None:
        if self.shard_params and self.gathered:
            self.flat.untyped_storage().resize_(0)
            self.gathered = False
            self.reducer._transient("gathered_params", -self._nbytes)

    # ---- gradients -----------------------------------------------------------------------------
    def _on_grad(self, p: nn.Parameter) -> None:
        self.arrived += 1
        self.reducer._transient("unsharded_grads", p.grad.numel() * p.grad.element_size())
        if self.arrived == len(self.params):
            self.reduce_scatter()

    @torch.no_grad()
    def reduce_scatter(self) -> None:
        """This microbatch's full gradients -> this rank's shard (added), then drop them."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        ctx = self.reducer.ctx
        pieces = [
            p.grad.reshape(-1) if p.grad is not None else self.shard.grad.new_zeros(p.numel()) for p in self.params
        ]
        flat = torch.cat(pieces + [self.shard.grad.new_zeros(self.pad)])
        if ctx.dpcp.size > 1:
            out = torch.empty_like(self.shard.grad)
            reduce_scatter_flat(out, flat, group=ctx.dpcp, dim="dp")
            self.shard.grad += out
        else:
            self.shard.grad += flat
        self.reducer._transient("unsharded_grads", -sum(g.numel() * g.element_size() for g in grads))
        for p in self.params:
            p.grad = None
        self.arrived = 0
        self.free()

    def local(self, lo: int, hi: int) -> slice | None:
        """The part of flat range [lo, hi) inside this rank's shard, in shard coordinates."""
        a, b = max(lo, self.lo), min(hi, self.hi)
        return slice(a - self.lo, b - self.lo) if a < b else None


class ShardedReducer:
    """GradReducer's interface (data_parallel.py) for ZeRO-2 and ZeRO-3 over a stage's model chunks."""

    def __init__(self, chunks, *, ctx, zero: int, tied: bool = True):
        if zero not in (2, 3):
            raise ValueError(f"ShardedReducer is for ZeRO-2 and 3, not {zero}")
        self.ctx, self.zero = ctx, zero
        self.transient = {"gathered_params": 0, "unsharded_grads": 0}
        self.peak = dict(self.transient)
        self.units: list[_Unit] = []
        self.wte_units: list[_Unit] = []  # the token embedding (and its tied copy), summed over ctx.emb
        shard_params = zero == 3
        for chunk in chunks:
            ends: list[_Unit] = []
            block_names = {f"h.{i}." for i in getattr(chunk, "h", {})}
            named = [(n, p) for n, p in chunk.named_parameters() if p.requires_grad]
            wte = [(n, p) for n, p in named if n == "wte.weight"]
            rest = [(n, p) for n, p in named if n != "wte.weight" and not n.startswith(tuple(block_names))]
            for i, block in getattr(chunk, "h", {}).items():
                mine = [(n, p) for n, p in named if n.startswith(f"h.{i}.")]
                unit = _Unit(mine, reducer=self, shard_params=shard_params)
                self.units.append(unit)
                if shard_params:
                    self._hook_block(block, unit)
            for group in (wte, rest):
                if group:
                    unit = _Unit(group, reducer=self, shard_params=shard_params)
                    self.units.append(unit)
                    ends.append(unit)
                    if group is wte and tied and ctx.emb.size > 1:
                        self.wte_units.append(unit)
            if shard_params and ends:
                self._hook_chunk(chunk, ends)
        self._slices()

    # ---- ZeRO-3 hooks --------------------------------------------------------------------------
    @staticmethod
    def _in_backward() -> bool:
        return torch._C._current_graph_task_id() != -1

    def _hook_block(self, block: nn.Module, unit: _Unit) -> None:
        """Gather before the layer's forward; free after it, and gather again when its output's
        gradient arrives (the layer's backward is next). Under full recompute the forward replayed
        inside backward keeps the parameters for the backward that follows at once."""

        def pre(module, args):
            unit.gather()

        def post(module, args, out):
            if self._in_backward():
                return
            if torch.is_grad_enabled() and out.requires_grad:
                out.register_hook(lambda g: unit.gather())
            unit.free()

        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)

    def _hook_chunk(self, chunk: nn.Module, ends: list[_Unit]) -> None:
        """The chunk's end units (embeddings, final norm, output layer): gathered for the chunk's whole
        forward and again from the start of its backward, freed after each, so like every layer
        they are all-gathered twice per microbatch (parallel.core.comm's ZeRO-3 count)."""

        def gather_ends(*_):
            for u in ends:
                u.gather()

        def post(module, args, out):
            if torch.is_grad_enabled() and out.requires_grad:
                out.register_hook(lambda g: gather_ends())
            for u in ends:
                u.free()

        chunk.register_forward_pre_hook(gather_ends)
        chunk.register_forward_hook(post)

    # ---- the plan's partial sums, on the gradient shards ----------------------------------------
    def _slices(self) -> None:
        self.sp_slices, self.kv_slices = [], []
        for u in self.units:
            for p, off in zip(u.params, u.offsets):
                if getattr(p, "sequence_parallel", False):
                    self.sp_slices.append((u, u.local(off, off + p.numel())))
                if hasattr(p, "tp_replicated"):
                    row = p.numel() // p.shape[0]
                    a, b = p.tp_replicated
                    self.kv_slices.append((u, u.local(off + a * row, off + b * row)))
        self.sp_slices = [(u, s) for u, s in self.sp_slices if s is not None]
        self.kv_slices = [(u, s) for u, s in self.kv_slices if s is not None]

    def _transient(self, kind: str, delta: int) -> None:
        self.transient[kind] += delta
        self.peak[kind] = max(self.peak[kind], self.transient[kind])

    # ---- GradReducer's interface ---------------------------------------------------------------
    def optimizer_params(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units]

    def zero_grad(self) -> None:
        for u in self.units:
            u.shard.grad.zero_()
            for p in u.params:
                p.grad = None
            u.arrived = 0

    def reduce(self) -> None:
        """After the last microbatch: reduce what backward left (a unit with unused parameters), then
        complete the SP / GQA / tied-embedding partial sums on the shards."""
        ctx = self.ctx
        for u in self.units:
            if any(p.grad is not None for p in u.params):
                u.reduce_scatter()
            u.free()
        if self.sp_slices and ctx.tp.size > 1:
            _sum_in_place([u.shard.grad[s] for u, s in self.sp_slices], group=ctx.tp, dim="sp")
        if self.kv_slices and ctx.kv.size > 1:
            _sum_in_place([u.shard.grad[s] for u, s in self.kv_slices], group=ctx.kv, dim="tp")
        for u in self.wte_units:
            all_reduce(u.shard.grad, group=ctx.emb, dim="pp")

    @torch.no_grad()
    def after_step(self) -> None:
        """ZeRO-2: all-gather the updated shards into the full parameters (ZeRO-3 keeps only shards)."""
        if self.zero == 2 and self.ctx.dpcp.size > 1:
            for u in self.units:
                all_gather_flat(u.flat, u.flat[u.lo : u.hi].clone(), group=self.ctx.dpcp, dim="dp")

    def gather_all(self) -> None:
        """Every unit's full parameters (to save them); ZeRO-3 frees them at the next forward's units."""
        for u in self.units:
            u.gather()

    def transient_peak(self) -> dict[str, int]:
        """The most bytes held at once, during the steps so far, of gathered full parameters (ZeRO-3)
        and of full-size gradients waiting for their unit's reduce-scatter."""
        return dict(self.peak)
