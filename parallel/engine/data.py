"""Deterministic synthetic token batches, and each rank's share of them.

No downloads: step k's global batch is a pure function of (seed, k). Each sequence is a noisy
arithmetic progression modulo the vocabulary (a random start and stride, 10% of tokens replaced by
random ones), which a small transformer learns within a few hundred steps, so the loss visibly falls.

A rank's share: its data-parallel slice of the global batch (rows [d·G/dp, (d+1)·G/dp)), cut into
microbatches of `micro_batch` sequences, and of each sequence the tokens of its CP rank
(context_parallel.token_ranges). Inputs are tokens [0, s), targets tokens [1, s + 1).
"""

from __future__ import annotations

import torch

from parallel.engine.context_parallel import take, token_ranges


def global_batch(*, step: int, seed: int, global_batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """(global_batch, seq_len + 1) int64 tokens of optimizer step `step`."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(vocab, (global_batch, 1), generator=g)
    stride = torch.randint(1, 8, (global_batch, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
    noise = torch.rand(global_batch, seq_len + 1, generator=g) < 0.1
    return torch.where(noise, torch.randint(vocab, tokens.shape, generator=g), tokens)


def microbatches(tokens: torch.Tensor, *, plan, dp_index: int, cp_index: int, device=None) -> list[dict]:
    """This rank's microbatches: [{"ids": (b, s/cp), "targets": (b, s/cp)}] for its dp and cp coordinates."""
    per = tokens.size(0) // plan.dp
    rows = tokens[dp_index * per : (dp_index + 1) * per]
    ranges = token_ranges(seq_len=tokens.size(1) - 1, cp=plan.cp, index=cp_index)
    out = []
    for i in range(0, per, plan.micro_batch):
        mb = rows[i : i + plan.micro_batch]
        ids, targets = take(mb[:, :-1], ranges), take(mb[:, 1:], ranges)
        out.append({"ids": ids.contiguous().to(device), "targets": targets.contiguous().to(device)})
    return out
