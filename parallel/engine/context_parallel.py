"""Context parallelism: the sequence split over CP ranks with causal load balancing, and the three
ways attention sees the whole sequence (`Plan.cp_kind`).

Load balance (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.2, as Megatron-LM's CP):
the sequence is cut into 2·cp equal chunks and CP rank i keeps chunks i and 2·cp−1−i, so under a
causal mask every rank does the same attention work. Each rank computes Q, K and V for its s/cp
tokens; K and V are all-gathered over the CP group before attention and their gradients
reduce-scattered back (`collectives.gather_seq`); Llama 3 prefers this to ring attention because it
handles any mask and the K/V exchange is small next to Q·K for GQA. The causal mask is built from
global token positions, so the gathered keys need no reordering.

With sequence parallelism inside each CP rank, the TP ranks split the rank's s/cp tokens further
into s/(cp·tp) contiguous pieces (`sp_ranges`).

The three exchanges (the plan model's memory and comm formulas follow each):

* allgather: K and V all-gathered over CP before attention (collectives.gather_seq), gradients
  reduce-scattered back; the scores are s/cp x s.
* ring (`ring_attention`; Liu et al. 2023, "Ring Attention with Blockwise Transformers for
  Near-Infinite Context"; load balancing as Brandon et al. 2023, "Striped Attention", and Megatron-LM:
  2·cp chunks): each rank keeps its Q and passes its K/V block around the CP ring by send/recv, the
  next block's transfer issued before this block's attention so the two overlap; outputs of the
  blocks are merged by their log-sum-exp (the online softmax of Milakov & Gimelshein 2018 / flash
  attention). Backward keeps only Q, K, V, the output and the log-sum-exp, sends the K/V blocks
  round again, recomputes each block's probabilities, and passes the blocks' dK/dV partial sums
  along with them until they reach their owners.
* ulysses (`collectives.seq_to_heads`; Jacobs et al. 2023, "DeepSpeed Ulysses"): an all-to-all turns
  (s/cp tokens, all local heads) into (all s tokens, heads/cp) for Q, K and V; attention is local
  over the whole sequence; a second all-to-all turns the output back. Tokens arrive in CP-rank order
  (each rank's two chunks), and the mask is built from those global positions.
"""

from __future__ import annotations

import torch

from parallel.engine.collectives import ring_shift


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


def _rank_positions(seq_len: int, cp: int, index: int) -> torch.Tensor:
    return positions(token_ranges(seq_len=seq_len, cp=cp, index=index))


def all_positions(*, seq_len: int, cp: int) -> torch.Tensor:
    """Global positions of the tokens in CP-rank order: the order an all-gather of K/V and Ulysses'
    all-to-all put them in."""
    return torch.cat([_rank_positions(seq_len, cp, j) for j in range(cp)])


def _mask(q: torch.Tensor, k: torch.Tensor, dtype) -> torch.Tensor:
    """Additive causal mask (len q, len k) from global positions: 0 where key <= query, -inf elsewhere."""
    return torch.zeros(len(q), len(k), dtype=dtype).masked_fill_(k.unsqueeze(0) > q.unsqueeze(1), float("-inf"))


def causal_bias(*, seq_len: int, cp: int, index: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Additive mask (s/cp, s) for CP rank `index`'s queries against the keys gathered from all CP
    ranks in group order: 0 where key position <= query position, -inf elsewhere."""
    bias = _mask(_rank_positions(seq_len, cp, index), all_positions(seq_len=seq_len, cp=cp), dtype)
    return bias.to(device) if device is not None else bias


def block_bias(*, seq_len: int, cp: int, q_index: int, k_index: int, dtype=torch.float32) -> torch.Tensor:
    """Additive causal mask (s/cp, s/cp) of CP rank `q_index`'s queries against rank `k_index`'s keys:
    one block of `causal_bias` (ring attention's mask for the K/V block in hand)."""
    return _mask(_rank_positions(seq_len, cp, q_index), _rank_positions(seq_len, cp, k_index), dtype)


def gathered_bias(*, seq_len: int, cp: int, dtype=torch.float32) -> torch.Tensor:
    """Additive causal mask (s, s) over all tokens in CP-rank order (Ulysses' attention)."""
    p = all_positions(seq_len=seq_len, cp=cp)
    return _mask(p, p, dtype)


def _block_scores(qg, k, bias, scale):
    """(B, nkv, g·T, Tk) scores of grouped queries against one K block, masked."""
    B, nkv, gT, _ = qg.shape
    T, Tk = bias.shape
    s = (qg @ k.transpose(-2, -1)) * scale
    return (s.view(B, nkv, gT // T, T, Tk) + bias).view(B, nkv, gT, Tk)


class _RingAttention(torch.autograd.Function):
    """softmax(Q K^T / sqrt(d) + mask) V over the K/V blocks of every CP rank, one block at a time."""

    @staticmethod
    def forward(ctx, q, k, v, group, biases, scale, labels):
        B, nh, T, hd = q.shape
        nkv, n, me = k.size(1), group.size, group.index
        qg = q.view(B, nkv, nh // nkv * T, hd)  # the query heads of one K/V head, stacked
        kv = torch.stack([k, v])  # one message per step: (2, B, nkv, T, hd)
        out = torch.zeros_like(qg)
        lse = torch.full(qg.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        for j in range(n):
            pending = ring_shift(kv, group=group) if j + 1 < n else None  # overlaps this block's attention
            s = _block_scores(qg, kv[0], biases[(me - j) % n], scale)
            new = torch.logaddexp(lse, torch.logsumexp(s.float(), dim=-1))  # finite: block 0 holds the diagonal
            out = (
                out * torch.exp(lse - new).unsqueeze(-1).to(out.dtype)
                + torch.exp(s - new.unsqueeze(-1).to(s.dtype)) @ kv[1]
            )
            lse = new
            if pending is not None:
                kv = pending.wait()[0]
        out = out.view(B, nh, T, hd).transpose(1, 2).contiguous()  # (B, T, nh, hd): the out-projection's layout
        ctx.group, ctx.biases, ctx.scale = group, biases, scale
        ctx.save_for_backward(q, k, v, out, lse)
        if labels is not None:  # the activation meter's names for what this saves (actmem.saves)
            labels.update({"attention.softmax_stats": lse, "attention.proj_input": out})
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, biases, scale = ctx.group, ctx.biases, ctx.scale
        B, nh, T, hd = q.shape
        nkv, n, me = k.size(1), group.size, group.index
        qg = q.view(B, nkv, nh // nkv * T, hd)
        do = dout.transpose(1, 2).reshape(B, nkv, nh // nkv * T, hd)
        o = out.transpose(1, 2).reshape(B, nkv, nh // nkv * T, hd)
        delta = (do * o).sum(-1, keepdim=True)  # rowsum(dO * O): the softmax backward's correction
        dq = torch.zeros_like(qg)
        kv, partial, pending_dkv = torch.stack([k, v]), None, None
        for j in range(n):
            pending = ring_shift(kv, group=group, tag=0) if j + 1 < n else None
            s = _block_scores(qg, kv[0], biases[(me - j) % n], scale)
            p = torch.exp(s - lse.unsqueeze(-1).to(s.dtype))
            dv = p.transpose(-2, -1) @ do
            ds = p * (do @ kv[1].transpose(-2, -1) - delta)
            dq += (ds @ kv[0]) * scale
            dk = (ds.transpose(-2, -1) @ qg) * scale
            if pending_dkv is not None:  # the block's dK/dV summed by the ranks it visited before
                partial = pending_dkv.wait()[0]
            mine = torch.stack([dk, dv])
            partial = mine if partial is None else partial + mine
            pending_dkv = ring_shift(partial, group=group, tag=1)  # on with the block, towards its owner
            if pending is not None:
                kv = pending.wait()[0]
        dkv = pending_dkv.wait()[0]  # after n shifts: this rank's own block
        return dq.view(B, nh, T, hd), dkv[0], dkv[1], None, None, None, None


def ring_attention(q, k, v, *, group, biases, scale: float, labels: dict | None = None) -> torch.Tensor:
    """Causal attention of this CP rank's queries q (B, nh, T, hd) over every rank's k, v (B, nkv, T, hd),
    by ring attention (a CP group of two or more ranks); `biases[j]` the mask against rank j's block
    (block_bias). Returns (B, T, nh, hd).
    `labels`: an actmem.saves dict, given the log-sum-exp and the output it keeps."""
    return _RingAttention.apply(q, k, v, group, biases, scale, labels)
