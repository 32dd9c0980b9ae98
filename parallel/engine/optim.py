"""AdamW, written out (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2).

The same arithmetic, op for op, as torch.optim.AdamW's single-tensor path, so results match it. It
exists because constructing any torch.optim optimizer imports torch._dynamo, several seconds per
rank on a small machine, which is most of a short job's start-up under torchrun.
"""

from __future__ import annotations

import math

import torch


class AdamW:
    def __init__(self, params, *, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.0):
        self.params = list(params)
        self.lr, (self.beta1, self.beta2), self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.exp_avg = [torch.zeros_like(p) for p in self.params]  # first moment m
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]  # second moment v
        self.steps = 0

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        lr, b1, b2 = self.lr, self.beta1, self.beta2
        bias_correction1 = 1 - b1**self.steps
        bias_correction2_sqrt = math.sqrt(1 - b2**self.steps)
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            g = p.grad
            p.mul_(1 - lr * self.weight_decay)  # decoupled weight decay
            m.lerp_(g, 1 - b1)  # m = b1 m + (1 - b1) g
            v.mul_(b2).addcmul_(g, g, value=1 - b2)  # v = b2 v + (1 - b2) g^2
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.addcdiv_(m, denom, value=-lr / bias_correction1)
