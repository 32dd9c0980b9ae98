"""A transformer's shape read back from the input shapes its operators recorded (`record_shapes`).

    facts, missing = model_from_shapes(traces.shapes, steps={0: 3, ...}, stage={0: 0, ...}, tp=2, cp=1)
    facts["hidden"].value, facts["hidden"].evidence     # 64, "the width every layer GEMM reads or writes"

What each fact rests on (per pipeline stage, one traced rank of it; counts are per traced step):
    GEMMs        nn.Linear / x @ W of the forward (aten::linear, else aten::matmul with a 2-D weight, else
                 aten::mm / addmm): tokens × K → N. The hidden width h is the size most GEMMs read or
                 write (QKV and the MLP's first GEMM read it, the out-projection and the last write it).
                 The GEMMs that write h are the out-projection (K = this rank's heads × head dim) and
                 the MLP's last (K = f/tp): f = K × tp. Two GEMMs of h → f/tp per layer (or one of 2f/tp)
                 is a gated (SwiGLU) MLP. A bias (a third input) is GPT's; none is Llama's.
    attention    SDPA / FlashAttention's own op: q (B, heads/tp, T, d), k (B, kv/tp, S, d) (FlashAttention:
                 (B, T, heads, d)); or the two batched GEMMs of an eager attention, q·kᵀ (B, n, R, d) @
                 (B, n, d, S) and p·v: head dim d, micro batch B, query tokens T, heads/tp = n·R/T.
                 KV heads: the fused QKV width, (N·tp − h)/(2d), or the attention's K/V heads × tp;
                 when TP splits fewer K/V heads than ranks (one replicated head each) it is not told.
    sequence     the attention's query tokens × cp (the GEMMs see every token of a CP rank's slice).
    vocabulary   the embedding's table rows × tp (vocab-parallel), else the output layer's N × tp.
    microbatches per step: the token embedding's lookups per step (first stage) or the output layer's
                 GEMMs per step (last stage); given by the plan when it is known.
    layers       per stage: attention ops (else the MLP's last GEMMs) per step ÷ microbatches. A forward recomputed in the
                 backward (activation recomputation) runs it twice: pass the plan's recompute to say so.

A fact that the shapes do not show is left out of `facts` and named in `missing` with the reason.

Pure: stdlib, pandas.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

GEMM_OPS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm")  # highest level first
FUSED_ATTENTION = "scaled_dot_product|flash_attn|_flash_attention_forward|_efficient_attention_forward"
MODEL_FACTS = ("hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "seq_len", "vocab", "layers", "arch")
BATCH_FACTS = ("micro_batch", "microbatches", "stage_layers")


@dataclass(frozen=True)
class Fact:
    """One identified fact: its value, where it came from (a source name) and what it rests on."""

    value: Any
    source: str
    evidence: str

    def to_dict(self) -> dict:
        return {"value": self.value, "source": self.source, "evidence": self.evidence}


@dataclass(frozen=True)
class Gemm:
    op: str
    lead: tuple[int, ...]  # the token dims of the input: (B, T), (T, B) or (B·T,)
    k: int
    n: int
    bias: bool
    count: float  # per step


def _gemm(op: str, dims: list, count: float) -> Gemm | None:
    """The forward GEMM an operator's input dims describe, or None (batched, or not a GEMM)."""
    if op == "aten::linear" and len(dims) >= 2 and len(dims[0]) >= 2 and len(dims[1]) == 2:
        x, w = dims[0], dims[1]
        if x[-1] == w[1]:
            return Gemm(op, tuple(x[:-1]), w[1], w[0], len(dims) > 2 and bool(dims[2]), count)
    if op in ("aten::matmul", "aten::mm") and len(dims) == 2 and len(dims[0]) >= 2 and len(dims[1]) == 2:
        x, w = dims
        if x[-1] == w[0]:
            return Gemm(op, tuple(x[:-1]), w[0], w[1], False, count)
    if op == "aten::addmm" and len(dims) >= 3 and len(dims[1]) == 2 and len(dims[2]) == 2:
        x, w = dims[1], dims[2]
        if x[-1] == w[0]:
            return Gemm(op, tuple(x[:-1]), w[0], w[1], True, count)
    return None


@dataclass(frozen=True)
class Attention:
    batch: int
    heads: int  # this rank's query heads
    kv_heads: int | None  # this rank's K/V heads, when the op shows them
    tokens: int  # query tokens
    keys: int  # key tokens
    head_dim: int
    op: str
    count: float


def _attention(op: str, dims: list, count: float, tokens: set[int]) -> Attention | None:
    """A fused attention op's q/k dims: (B, heads, T, d) for SDPA, (B, T, heads, d) for FlashAttention."""
    if len(dims) < 2 or len(dims[0]) != 4 or len(dims[1]) != 4:
        return None
    q, k = dims[0], dims[1]
    if "scaled_dot_product" in op:
        return Attention(q[0], q[1], k[1], q[2], k[2], q[3], op, count)
    return Attention(q[0], q[2], k[2], q[1], k[1], q[3], op, count)


def _eager_attention(batched: list[tuple[list, float]], tokens: set[int]) -> Attention | None:
    """q·kᵀ of an eager attention: (B, n, R, d) @ (B, n, d, S), its p·v twin (B, n, R, S) @ (B, n, S, d)
    beside it with the same count; heads/tp = n·R/T for the T query tokens a GEMM saw."""
    for (a, b), count in batched:
        twin = [1 for (c, e), n in batched if n == count and c[:3] == a[:3] and c[3] == b[3] and e[3] == a[3]]
        if not twin or a[3] != b[2]:
            continue
        B, n, R, d, S = a[0], a[1], a[2], a[3], b[3]
        for t in sorted(tokens, reverse=True):
            if t % B == 0 and (n * R) % (t // B) == 0 and R % (t // B) == 0:
                T = t // B
                return Attention(B, n * R // T, n if R > T else None, T, S, d, "aten::matmul (q·kᵀ, p·v)", count)
    return None


def stage_ops(shapes: pd.DataFrame, rank: int, steps: int) -> tuple[list[Gemm], list[Attention], list, list]:
    """(forward GEMMs, attention ops, embedding lookups [(table rows, width, count)], batched products)
    of one rank, counts per step."""
    rows = shapes[shapes["rank"] == rank]
    parsed = [
        (str(op), json.loads(d), float(c) / max(steps, 1)) for op, d, c in zip(rows["op"], rows["dims"], rows["count"])
    ]
    gemms: list[Gemm] = []
    for level in GEMM_OPS:  # the highest level the trace has: a linear's own matmul/mm is not counted twice
        gemms = [g for op, d, c in parsed if op == level and (g := _gemm(op, d, c)) is not None]
        if gemms:
            break
    tokens = {int(_prod(g.lead)) for g in gemms}
    attn = [a for op, d, c in parsed if _fused(op) and (a := _attention(op, d, c, tokens)) is not None]
    batched = [(d, c) for op, d, c in parsed if op == "aten::matmul" and len(d) == 2 and len(d[0]) == len(d[1]) == 4]
    if not attn and (eager := _eager_attention(batched, tokens)) is not None:
        attn = [eager]
    embeds = [(d[0][0], d[0][1], c) for op, d, c in parsed if op == "aten::embedding" and d and len(d[0]) == 2]
    return gemms, attn, embeds, batched


def _fused(op: str) -> bool:
    return any(p in op for p in FUSED_ATTENTION.split("|"))


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def model_from_shapes(
    shapes: pd.DataFrame,
    *,
    steps: dict[int, int],
    stage: dict[int, int],
    tp: int,
    cp: int = 1,
    pp: int = 1,
    microbatches: Fact | None = None,
    recompute: str = "none",
) -> tuple[dict[str, Fact], dict[str, str]]:
    """The facts the recorded shapes show (module docstring) and the reasons for those they do not."""
    facts: dict[str, Fact] = {}
    missing: dict[str, str] = {}
    src = "shapes"
    if shapes is None or not len(shapes):
        why = "the traces recorded no operator shapes (profile with record_shapes=True)"
        return facts, dict.fromkeys((*MODEL_FACTS, *BATCH_FACTS), why)
    per_stage: dict[int, tuple] = {}
    for rank in sorted(set(int(r) for r in shapes["rank"])):
        s = stage.get(rank, 0)
        if s not in per_stage:
            ops = stage_ops(shapes, rank, steps.get(rank, 1))
            if ops[0]:
                per_stage[s] = (rank, *ops)
    if not per_stage:
        why = "no forward GEMM (aten::linear / matmul / mm with a 2-D weight) among the recorded shapes"
        return facts, dict.fromkeys((*MODEL_FACTS, *BATCH_FACTS), why)
    all_gemms = [g for v in per_stage.values() for g in v[1]]
    sizes = Counter(x for g in all_gemms for x in (g.k, g.n))
    h = sizes.most_common(1)[0][0]
    facts["hidden"] = Fact(h, src, f"{h} is the width most forward GEMMs read or write ({sizes[h]} of them)")
    attn = next((v[2][0] for v in per_stage.values() if v[2]), None)
    # the MLP's last GEMM writes h from the widest input; the out-projection writes it from heads × d / tp
    writers = sorted({g.k for g in all_gemms if g.n == h}, reverse=True)
    f_local = writers[0] if writers else None
    if f_local is not None and attn is not None and f_local == attn.heads * attn.head_dim and len(writers) == 1:
        f_local = None  # only the out-projection writes h: no MLP seen
    # the unit of a layer on each rank: its attention ops per step (one per layer and microbatch),
    # else the MLP's last GEMM's; a record that runs a whole multiple of it belongs to the layers
    unit: dict[int, float] = {}
    layer: list[Gemm] = []
    other: list[Gemm] = []
    for s, (_rank, gemms, attns, *_r) in per_stage.items():
        down = [g.count for g in gemms if g.k == f_local and g.n == h]
        u = sum(a.count for a in attns) if attns else (down[0] / 2 if down and f_local == h else down[0] if down else 0)
        unit[s] = u
        for g in gemms:
            whole = u > 0 and g.count >= u and abs(g.count / u - round(g.count / u)) < 1e-6
            (layer if whole else other).append(g)
    if f_local is not None and any(unit.values()):
        facts["ffn_hidden"] = Fact(
            f_local * tp, src, f"the MLP's last GEMM reads {f_local} = ffn_hidden / tp (tp {tp})"
        )
        s0 = next(s for s, u in unit.items() if u)
        gemms0 = per_stage[s0][1]
        ups = sum(g.count for g in gemms0 if g.k == h and g.n == f_local) / unit[s0] - (1 if f_local == h else 0)
        ups += 2 * sum(g.count for g in gemms0 if g.k == h and g.n == 2 * f_local) / unit[s0]
        gated = round(ups) >= 2
        bias = any(g.bias for g in layer)
        arch = "llama" if gated and not bias else "gpt" if not gated and bias else None
        what = (
            "two GEMMs h → f/tp (or one of 2f/tp) per layer: a gated MLP"
            if gated
            else "one GEMM h → f/tp per layer: an MLP of one activation"
        )
        what += ", with biases" if bias else ", without biases"
        if arch:
            facts["arch"] = Fact(arch, src, what)
        else:
            missing["arch"] = what + ": neither GPT's layout nor Llama's"
    else:
        for k in ("ffn_hidden", "arch"):
            missing[k] = "no GEMM writes the hidden width from a wider input: the MLP was not seen"
    if attn is not None:
        d = attn.head_dim
        facts["head_dim"] = Fact(d, src, f"{attn.op}: q's last dimension")
        facts["heads"] = Fact(attn.heads * tp, src, f"{attn.op}: {attn.heads} query heads per rank × tp {tp}")
        facts["micro_batch"] = Fact(attn.batch, src, f"{attn.op}: q's batch dimension")
        facts["seq_len"] = Fact(
            attn.tokens * cp, src, f"{attn.op}: {attn.tokens} query tokens" + (f" × cp {cp}" if cp > 1 else "")
        )
        q = attn.heads * d
        qkv = [
            g
            for g in layer
            if g.k == h and g.n > q and (g.n - q) % (2 * d) == 0 and g.n not in (f_local, 2 * (f_local or 0))
        ]
        kv_local = (qkv[0].n - q) // (2 * d) if qkv else attn.kv_heads
        if kv_local is None:
            separate = [g for g in layer if g.k == h and g.n < q and g.n % d == 0]  # K and V of their own
            kv_local = separate[0].n // d if separate else None
        if kv_local is not None and (kv_local > 1 or tp == 1):
            how = f"the fused QKV GEMM writes {qkv[0].n} = ({attn.heads} + 2·{kv_local})·{d}" if qkv else "K's width"
            facts["kv_heads"] = Fact(kv_local * tp, src, f"{how}: {kv_local} K/V heads per rank × tp {tp}")
        elif kv_local == 1:
            missing["kv_heads"] = f"one K/V head per rank under tp {tp}: any count up to {tp} K/V heads gives that"
        else:
            missing["kv_heads"] = "no QKV GEMM whose width tells the K/V heads"
    else:
        why = "no attention op (SDPA, FlashAttention, or eager q·kᵀ and p·v) among the recorded shapes"
        for k in ("head_dim", "heads", "kv_heads", "micro_batch", "seq_len"):
            missing[k] = why
    # vocabulary: the embedding table, else the output layer
    embeds = [e for v in per_stage.values() for e in v[3] if e[1] == h]
    table = max(embeds, key=lambda e: e[0]) if embeds else None
    head = sorted((g for g in other if g.k == h and g.n != h), key=lambda g: -g.n)
    if table is not None:
        facts["vocab"] = Fact(table[0] * tp, src, f"the token embedding's table has {table[0]} rows × tp {tp}")
    elif head:
        facts["vocab"] = Fact(head[0].n * tp, src, f"the output layer writes {head[0].n} logits per token × tp {tp}")
    else:
        missing["vocab"] = "neither the token embedding nor the output layer was traced"
    # microbatches per step: the plan's, else the embedding's lookups or the output layer's GEMMs
    m = microbatches
    if m is None and table is not None:
        m = Fact(round(table[2]), src, f"the token embedding ran {table[2]:g} times per step")
    if m is None and head:
        m = Fact(round(head[0].count), src, f"the output layer ran {head[0].count:g} times per step")
    if m is not None and m.value >= 1:
        facts["microbatches"] = m
    else:
        missing["microbatches"] = "neither the plan, the token embedding nor the output layer tells the microbatches"
    # layers per stage
    if f_local is not None and "microbatches" in facts:
        runs = 2 if recompute == "full" else 1
        counts = {s: unit[s] / (facts["microbatches"].value * runs) for s in per_stage}
        whole = {s: round(c) for s, c in counts.items() if abs(c - round(c)) < 0.05 and round(c) >= 1}
        if len(whole) == len(counts):
            stages = [whole.get(s) for s in range(max(pp, 1))]
            facts["stage_layers"] = Fact(
                stages,
                src,
                "attention ops (else the MLP's last GEMM) per step ÷ microbatches"
                + (" ÷ 2 (full recomputation)" if runs == 2 else " (no activation recomputation: the plan says none)"),
            )
            if None not in stages:
                facts["layers"] = Fact(sum(stages), src, f"the stages' layers {stages} summed")
            else:
                missing["layers"] = f"stages {[s for s, n in enumerate(stages) if n is None]} have no traced rank"
        else:
            missing["stage_layers"] = missing["layers"] = (
                f"the MLP's GEMMs per microbatch are not whole numbers ({sorted(counts.items())}): "
                "recomputation or a schedule the counts do not show"
            )
    else:
        for k in ("stage_layers", "layers"):
            missing.setdefault(k, "needs the MLP's GEMM and the microbatches per step")
    return facts, missing
