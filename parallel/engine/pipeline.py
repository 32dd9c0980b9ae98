"""Pipeline parallelism: GPipe, 1F1B and interleaved 1F1B over microbatches, with point-to-point exchange.

GPipe (Huang et al. 2019): every microbatch forward, then every backward; a stage holds all m
microbatches' activations. 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", Sec. 2.2.1, Fig. 4 top; PipeDream-Flush): stage i runs
p − i − 1 warm-up forwards, then alternates one forward and one backward, then drains; it holds at
most p − i microbatches. Both have the same bubble, (p − 1)/m of the ideal time. Interleaved 1F1B
(same paper, Sec. 2.2.2, Fig. 4 bottom): each rank holds v model chunks (virtual stages c·p + i),
which cuts the bubble to (p − 1)/(v·m) for v times the point-to-point traffic.

Communication follows Megatron-LM / picotron: a stage that both sends and receives in one step
issues the pair together (`collectives.exchange`, batch_isend_irecv), so neighbours cannot
deadlock. Under SP each TP rank sends its s/t-token shard of the boundary activation.

Backward runs microbatches in forward order under both schedules, so gradients accumulate in the
same order and GPipe and 1F1B give bit-identical results.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext

import torch

from parallel.engine.collectives import _profiling, exchange
from runfiles.annotations import phase_name


def phase(kind: str, *, mb: int | None = None, stage: int | None = None, chunk: int | None = None):
    """A `ps.phase` profiler range (see runfiles.annotations); free when no profiler records."""
    if not _profiling():
        return nullcontext()
    return torch.profiler.record_function(phase_name(kind, mb=mb, stage=stage, chunk=chunk))


class Pipeline:
    """One training step's forward and backward passes on this rank's model chunks (one unless vpp > 1)."""

    def __init__(self, *, models, ctx, act_shape, dtype):
        self.models, self.ctx, self.shape, self.dtype = list(models), ctx, tuple(act_shape), dtype
        # Microbatches each chunk holds activations for (forward run, backward not yet), and the peak:
        # what the plan model's inflight_chunks / embedding_chunks predict for this schedule.
        self.live = [0] * len(self.models)
        self.peak_live = [0] * len(self.models)
        self.peak_total = 0  # the most microbatch-chunks held at once, all chunks together
        self.delay_s = 0.0  # host delay per microbatch forward (TrainConfig.straggler): a slow rank

    # ---- boundary exchange (picotron's pp_communications, Megatron's p2p_communication) ----------
    def _buf(self):
        return torch.empty(self.shape, dtype=self.dtype, device=self.ctx.device)

    def recv_forward(self):
        if self.ctx.is_first:
            return None
        x = self._buf()
        exchange(group=self.ctx.pp, recv=[(x, self.ctx.prev_rank)])
        return x.requires_grad_()

    def send_forward(self, y):
        if not self.ctx.is_last:
            exchange(group=self.ctx.pp, send=[(y.detach().contiguous(), self.ctx.next_rank)])

    def recv_backward(self):
        if self.ctx.is_last:
            return None
        g = self._buf()
        exchange(group=self.ctx.pp, recv=[(g, self.ctx.next_rank)])
        return g

    def send_backward(self, gx):
        if not self.ctx.is_first:
            exchange(group=self.ctx.pp, send=[(gx.contiguous(), self.ctx.prev_rank)])

    def send_forward_recv_backward(self, y):
        if self.ctx.is_last:
            return None
        g = self._buf()
        exchange(
            group=self.ctx.pp, send=[(y.detach().contiguous(), self.ctx.next_rank)], recv=[(g, self.ctx.next_rank)]
        )
        return g

    def send_backward_recv_forward(self, gx):
        if self.ctx.is_first:
            return None
        x = self._buf()
        exchange(group=self.ctx.pp, send=[(gx.contiguous(), self.ctx.prev_rank)], recv=[(x, self.ctx.prev_rank)])
        return x.requires_grad_()

    # ---- compute ----------------------------------------------------------------------------------
    def forward(self, i: int, x, mb: dict, chunk: int = 0):
        """Microbatch i through model chunk `chunk` (microbatch 0 of every chunk under the meter, if any)."""
        model = self.models[chunk]
        with phase("fwd", mb=i, stage=self.ctx.stage, chunk=chunk):
            measure = (
                self.meter.measure(inputs=[t for t in mb.values() if t is not None])
                if self.meter is not None and i == 0
                else nullcontext()
            )
            with measure:
                y = model(x, ids=mb.get("ids"), targets=mb.get("targets"), tokens=self.tokens)
            if self.delay_s and chunk == 0:
                time.sleep(self.delay_s)
        if model.last:
            self.loss += y.detach()
        self.live[chunk] += 1
        self.peak_live[chunk] = max(self.peak_live[chunk], self.live[chunk])
        self.peak_total = max(self.peak_total, sum(self.live))
        return y

    def backward(self, i: int, x, y, gy, chunk: int = 0):
        with phase("bwd", mb=i, stage=self.ctx.stage, chunk=chunk):
            torch.autograd.backward(y, grad_tensors=gy)
        self.live[chunk] -= 1
        return x.grad if x is not None else None

    # ---- schedules --------------------------------------------------------------------------------
    def step(self, microbatches: list[dict], *, schedule: str, tokens: int, meter=None) -> torch.Tensor:
        """Forward and backward of every microbatch; returns this rank's loss sum (last stage; else 0)."""
        self.tokens, self.meter = tokens, meter
        self.loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        run = self._interleaved if len(self.models) > 1 else self._gpipe if schedule == "gpipe" else self._one_f_one_b
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

    def _interleaved(self, mbs):
        """Interleaved 1F1B with the order of work and the send/receive decisions of Megatron-LM's
        forward_backward_pipelining_with_interleaving (without p2p overlap): virtual step k runs
        microbatch k // (p·v)·p + k % p on chunk k % (p·v) // p (backward: chunks in reverse), and each
        iteration ends in one batched exchange with both ring neighbours, so that sends and receives
        pair up iteration by iteration. The last stage's chunk c feeds the first stage's chunk c + 1."""
        ctx, p, v, m, s = self.ctx, self.ctx.plan.pp, len(self.models), len(mbs), self.ctx.stage
        total, first, last = m * v, ctx.is_first, ctx.is_last  # physical first and last stage
        nxt, prv = ctx.pp.ranks[(s + 1) % p], ctx.pp.ranks[(s - 1) % p]
        xs, gs, saved = ([deque() for _ in range(v)] for _ in range(3))  # inputs, output grads, for backward

        def chunk(k, forward=True):
            c = k % (p * v) // p
            return c if forward else v - 1 - c

        def fwd(k):
            c, i = chunk(k), k // (p * v) * p + k % p
            x = None if first and c == 0 else xs[c].popleft()
            y = self.forward(i, x, mbs[i], chunk=c)
            saved[c].append((i, x, y))
            return None if last and c == v - 1 else y.detach()  # the last virtual stage sends nothing

        def bwd(k):
            c = chunk(k, forward=False)
            i, x, y = saved[c].popleft()
            gx = self.backward(i, x, y, None if last and c == v - 1 else gs[c].popleft(), chunk=c)
            return None if first and c == 0 else gx

        def swap(y=None, gx=None, recv_x=False, recv_g=False):
            """Activations forward to the next rank and gradients back to the previous one (tags 0 and 1)."""
            x, g = (self._buf() if recv_x else None), (self._buf() if recv_g else None)
            send = [(t.contiguous(), peer, tag) for t, peer, tag in ((y, nxt, 0), (gx, prv, 1)) if t is not None]
            recv = [(t, peer, tag) for t, peer, tag in ((x, prv, 0), (g, nxt, 1)) if t is not None]
            exchange(group=ctx.pp, send=send, recv=recv)
            return (x.requires_grad_() if x is not None else None), g

        all_warmup = m == p
        warmup = total if all_warmup else min(2 * (p - s - 1) + (v - 1) * p, total)
        if not first:
            xs[0].append(swap(recv_x=True)[0])
        for k in range(warmup):
            y, nc = fwd(k), chunk(k + 1)
            recv_x = not (first and nc == 0) and k != total - 1
            recv_g = k == warmup - 1 and not all_warmup and not last
            x, g = swap(y=y, recv_x=recv_x, recv_g=recv_g)
            if recv_x:
                xs[nc].append(x)
            if recv_g:
                gs[v - 1].append(g)
        for k in range(total - warmup):  # steady state: one forward, one backward, one exchange
            y, gx = fwd(k + warmup), bwd(k)
            if first:  # the first stage runs p - 1 steps ahead of the last, which feeds its next chunk
                nc = chunk(k + warmup - (p - 1))
                recv_x, nc = nc != v - 1, nc + 1
            else:
                nc, recv_x = chunk(k + warmup + 1), True
            if last:  # and the last stage runs p - 1 steps ahead of the first in backward
                nb = chunk(k - (p - 1), forward=False)
                recv_g, nb = nb != 0, nb - 1
            else:
                nb, recv_g = chunk(k + 1, forward=False), True
            recv_x = recv_x and k != total - warmup - 1
            x, g = swap(y=y, gx=gx, recv_x=recv_x, recv_g=recv_g)
            if recv_x:
                xs[nc].append(x)
            if recv_g:
                gs[nb].append(g)
        if all_warmup and not last:
            gs[v - 1].append(swap(recv_g=True)[1])
        for k in range(total - warmup, total):  # cool-down
            gx, nb = bwd(k), chunk(k + 1, forward=False)
            recv_g = not (last and nb == v - 1) and k != total - 1
            _, g = swap(gx=gx, recv_g=recv_g)
            if recv_g:
                gs[nb].append(g)
