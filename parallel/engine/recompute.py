"""Activation recomputation: keep a block's inputs, run its forward again in backward.

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; the two granularities of
Korthikanti et al. 2022, Sec. 5: *full* recomputes each transformer layer (keeping only its input,
2sbh bytes in their Table 2) and *selective* recomputes only the core attention, the part that is
large (the s x s scores) but cheap to recompute. This is torch's reentrant checkpoint in a few lines,
written here so the saved tensors are exactly the inputs (and the activation meter sees them): the
forward runs without autograd; backward restores the RNG state (so dropout draws the same masks),
replays the forward with autograd on, and back-propagates through it. Collectives inside the block
run again in backward, in the same order on every rank of their group, as in Megatron-LM.
"""

from __future__ import annotations

import torch


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, *inputs):
        ctx.run = run
        ctx.cuda = inputs[0].is_cuda
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state() if ctx.cuda else None
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return run(*inputs)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        devices = [torch.cuda.current_device()] if ctx.cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(ctx.rng)
            if ctx.cuda:
                torch.cuda.set_rng_state(ctx.cuda_rng)
            with torch.enable_grad():
                out = ctx.run(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, grads)
        return (None, *[t.grad if t.requires_grad else None for t in inputs])


def recompute(run, *inputs: torch.Tensor):
    """`run(*inputs)`, keeping only `inputs` for backward and recomputing the rest there."""
    return _Recompute.apply(run, *inputs)
