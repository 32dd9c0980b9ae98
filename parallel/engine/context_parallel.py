"""Context parallelism: the sequence split over CP ranks with causal load balancing; attention over all-gathered K/V.

Load balance (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.2, as Megatron-LM's CP):
the sequence is cut into 2·cp equal chunks and CP rank i keeps chunks i and 2·cp−1−i, so under a
causal mask every rank does the same attention work. Each rank computes Q, K and V for its s/cp
tokens; K and V are all-gathered over the CP group before attention and their gradients
reduce-scattered back (`collectives.gather_seq`); Llama 3 prefers this to ring attention because it
handles any mask and the K/V exchange is small next to Q·K for GQA. The causal mask is built from
global token positions, so the gathered keys need no reordering.

With sequence parallelism inside each CP rank, the TP ranks split the rank's s/cp tokens further
into s/(cp·tp) contiguous pieces (`sp_ranges`).
"""

from __future__ import annotations

import torch


def token_ranges(*, seq_len: int, cp: int, index: int) -> list[tuple[int, int]]:
    """The [start, end) position ranges CP rank `index` holds: chunks index and 2·cp−1−index."""
    if cp == 1:
        return [(0, seq_len)]
    c = seq_len // (2 * cp)
    return [(index * c, (index + 1) * c), ((2 * cp - 1 - index) * c, (2 * cp - index) * c)]


def sp_ranges(ranges: list[tuple[int, int]], *, tp: int, index: int) -> list[tuple[int, int]]:
    """Piece `index` of `tp` equal pieces of the tokens in `ranges` (kept in order), as ranges."""
    n = sum(b - a for a, b in ranges) // tp
    lo, hi, out, seen = index * n, (index + 1) * n, [], 0
    for a, b in ranges:
        s, e = max(a, a + lo - seen), min(b, a + hi - seen)
        if s < e:
            out.append((s, e))
        seen += b - a
    return out


def take(x: torch.Tensor, ranges: list[tuple[int, int]], *, axis: int = 1) -> torch.Tensor:
    """The tokens of `ranges` along `axis`: slices and a cat, which autograd saves nothing for."""
    parts = [x.narrow(axis, a, b - a) for a, b in ranges]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=axis)


def positions(ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in ranges])


def causal_bias(*, seq_len: int, cp: int, index: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Additive mask (s/cp, s) for CP rank `index`'s queries against the keys gathered from all CP
    ranks in group order: 0 where key position <= query position, -inf elsewhere."""
    q = positions(token_ranges(seq_len=seq_len, cp=cp, index=index))
    k = torch.cat([positions(token_ranges(seq_len=seq_len, cp=cp, index=j)) for j in range(cp)])
    bias = torch.zeros(len(q), len(k), dtype=dtype)
    bias.masked_fill_(k.unsqueeze(0) > q.unsqueeze(1), float("-inf"))
    return bias.to(device) if device is not None else bias
