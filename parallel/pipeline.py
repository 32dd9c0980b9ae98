"""Pipeline parallelism: GPipe and 1F1B schedules over microbatches, with point-to-point boundary exchange.

GPipe (Huang et al. 2019): every microbatch forward, then every backward; a stage holds all m
microbatches' activations. 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", Sec. 2.2.1, Fig. 4 top; PipeDream-Flush): stage i runs
p − i − 1 warm-up forwards, then alternates one forward and one backward, then drains; it holds at
most p − i microbatches. Both have the same bubble, (p − 1)/m of the ideal time.

Communication follows Megatron-LM / picotron: a stage that both sends and receives in one step
issues the pair together (`collectives.exchange`, batch_isend_irecv), so neighbours cannot
deadlock. Under SP each TP rank sends its s/t-token shard of the boundary activation.

Backward runs microbatches in forward order under both schedules, so gradients accumulate in the
same order and GPipe and 1F1B give bit-identical results.
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext

import torch

from profiler.annotations import phase_name

from .collectives import _profiling, exchange


def phase(kind: str, *, mb: int | None = None, stage: int | None = None, chunk: int | None = None):
    """A `ps.phase` profiler range (see profiler.annotations); free when no profiler records."""
    if not _profiling():
        return nullcontext()
    return torch.profiler.record_function(phase_name(kind, mb=mb, stage=stage, chunk=chunk))


class Pipeline:
    """One training step's forward and backward passes on this rank's stage."""

    def __init__(self, *, model, ctx, act_shape, dtype):
        self.model, self.ctx, self.shape, self.dtype = model, ctx, tuple(act_shape), dtype

    # ---- boundary exchange (picotron's pp_communications, Megatron's p2p_communication) ----------
    def _buf(self):
        return torch.empty(self.shape, dtype=self.dtype, device=self.ctx.device)

    def recv_forward(self):
        if self.ctx.is_first:
            return None
        x = self._buf()
        exchange(group=self.ctx.pp, recv=(x, self.ctx.prev_rank))
        return x.requires_grad_()

    def send_forward(self, y):
        if not self.ctx.is_last:
            exchange(group=self.ctx.pp, send=(y.detach().contiguous(), self.ctx.next_rank))

    def recv_backward(self):
        if self.ctx.is_last:
            return None
        g = self._buf()
        exchange(group=self.ctx.pp, recv=(g, self.ctx.next_rank))
        return g

    def send_backward(self, gx):
        if not self.ctx.is_first:
            exchange(group=self.ctx.pp, send=(gx.contiguous(), self.ctx.prev_rank))

    def send_forward_recv_backward(self, y):
        if self.ctx.is_last:
            return None
        g = self._buf()
        exchange(group=self.ctx.pp, send=(y.detach().contiguous(), self.ctx.next_rank), recv=(g, self.ctx.next_rank))
        return g

    def send_backward_recv_forward(self, gx):
        if self.ctx.is_first:
            return None
        x = self._buf()
        exchange(group=self.ctx.pp, send=(gx.contiguous(), self.ctx.prev_rank), recv=(x, self.ctx.prev_rank))
        return x.requires_grad_()

    # ---- compute ----------------------------------------------------------------------------------
    def forward(self, i: int, x, mb: dict):
        with phase("fwd", mb=i, stage=self.ctx.stage, chunk=0):
            measure = self.meter.measure(inputs=[t for t in mb.values() if t is not None]) \
                if self.meter is not None and i == 0 else nullcontext()
            with measure:
                y = self.model(x, ids=mb.get("ids"), targets=mb.get("targets"), tokens=self.tokens)
        if self.ctx.is_last:
            self.loss += y.detach()
        return y

    def backward(self, i: int, x, y, gy):
        with phase("bwd", mb=i, stage=self.ctx.stage, chunk=0):
            torch.autograd.backward(y, grad_tensors=gy)
        return x.grad if x is not None else None

    # ---- schedules --------------------------------------------------------------------------------
    def step(self, microbatches: list[dict], *, schedule: str, tokens: int, meter=None) -> torch.Tensor:
        """Forward and backward of every microbatch; returns this rank's loss sum (last stage; else 0)."""
        self.tokens, self.meter = tokens, meter
        self.loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        run = self._gpipe if schedule == "gpipe" else self._one_f_one_b
        run(microbatches)
        return self.loss

    def _gpipe(self, mbs):
        saved = []
        for i, mb in enumerate(mbs):
            x = self.recv_forward()
            y = self.forward(i, x, mb)
            self.send_forward(y)
            saved.append((x, y))
        for i in range(len(mbs)):
            x, y = saved[i]
            saved[i] = None
            gy = self.recv_backward()
            self.send_backward(self.backward(i, x, y, gy))

    def _one_f_one_b(self, mbs):
        m = len(mbs)
        warmup = min(self.ctx.plan.pp - self.ctx.stage - 1, m)
        inflight = deque()
        for i in range(warmup):
            x = self.recv_forward()
            y = self.forward(i, x, mbs[i])
            self.send_forward(y)
            inflight.append((i, x, y))
        x = self.recv_forward() if m > warmup else None
        for i in range(warmup, m):  # steady state: one forward, one backward
            y = self.forward(i, x, mbs[i])
            gy = self.send_forward_recv_backward(y)
            inflight.append((i, x, y))
            k, x0, y0 = inflight.popleft()
            gx = self.backward(k, x0, y0, gy)
            if i == m - 1:
                self.send_backward(gx)
            else:
                x = self.send_backward_recv_forward(gx)
        while inflight:  # cool-down
            k, x0, y0 = inflight.popleft()
            gy = self.recv_backward()
            self.send_backward(self.backward(k, x0, y0, gy))
