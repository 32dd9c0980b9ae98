"""Kineto traces of a known transformer under a known plan, with the input shapes `record_shapes` writes.

    write_job(folder, model, plan, steps=2, attention="sdpa")    # folder/rank{r}_trace.json

Each rank's trace holds, per step and per microbatch, the forward operators of its pipeline stage as
PyTorch records them -- aten::embedding on the first stage, per layer the fused QKV nn.Linear, the
attention (SDPA's (B, heads, T, d); FlashAttention's (B, T, heads, d); or eager q·kᵀ and p·v), the
out-projection, the MLP's GEMMs (one of h → f/tp for GPT, gate and up for Llama) and its last, and
the output layer on the last stage -- with TP's shard sizes, then autograd's backward operator, plus each process group of the plan
in distributedInfo.pg_config, named as a DeviceMesh names them (mesh_tp, ...) (the layout inference's evidence). Times are made up; shapes are exact.
"""

from __future__ import annotations

from pathlib import Path

from parallel.core.plan import Plan
from parallel.core.specs import Model
from tests.support.trace_samples import annotation, cpu, trace, write


def _linear(ts, lead, k, n, bias):
    dims = [[*lead, k], [n, k]] + ([[n]] if bias else [[]])
    return cpu("aten::linear", ts, 5, **{"Input Dims": dims, "Input type": ["float"] * 3})


def _pg_config(plan: Plan) -> list[dict]:
    topo = plan.topology(plan.world_size)
    out = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": plan.world_size, "ranks": list(range(plan.world_size))}]
    for dim in ("tp", "pp", "dp"):
        if topo.sizes[dim] > 1:
            for row in topo.group_ranks(dim):
                ranks = [int(r) for r in row]
                out.append({"pg_name": str(len(out)), "pg_desc": f"mesh_{dim}", "pg_size": len(ranks), "ranks": ranks})
    return out


def rank_events(model: Model, plan: Plan, rank: int, *, steps: int, attention: str) -> list[dict]:
    topo = plan.topology(plan.world_size)
    stage = int(topo.coords_of(rank)["pp"])
    per = model.layers // plan.pp
    t, B, T = plan.tp, plan.micro_batch, model.seq_len // plan.cp
    h, d = model.hidden, model.hidden // model.heads
    f = model.ffn_hidden or 4 * h
    heads, kv = model.heads // t, (model.kv_heads or model.heads) // t
    bias = model.arch == "gpt"
    events, ts = [], 0
    for step in range(steps):
        start = ts
        for _mb in range(plan.microbatches):
            ev = []
            if stage == 0:
                ev.append(cpu("aten::embedding", ts, 2, **{"Input Dims": [[model.vocab // t, h], [B, T], [], [], []]}))
            for _layer in range(per):
                ev.append(_linear(ts, (B, T), h, (heads + 2 * kv) * d, bias))
                if attention == "sdpa":
                    dims = [[B, heads, T, d], [B, kv, T, d], [B, kv, T, d], [], []]
                    ev.append(cpu("aten::_scaled_dot_product_flash_attention", ts, 5, **{"Input Dims": dims}))
                elif attention == "flash":
                    dims = [[B, T, heads, d], [B, T, kv, d], [B, T, kv, d]]
                    ev.append(cpu("flash_attn::_flash_attn_forward", ts, 5, **{"Input Dims": dims}))
                elif attention == "eager":  # grouped as parallel/engine/gpt.py does: (B, kv, g·T, d)
                    g = heads // kv
                    ev.append(cpu("aten::matmul", ts, 3, **{"Input Dims": [[B, kv, g * T, d], [B, kv, d, T]]}))
                    ev.append(cpu("aten::matmul", ts, 3, **{"Input Dims": [[B, kv, g * T, T], [B, kv, T, d]]}))
                ev.append(_linear(ts, (B, T), heads * d, h, bias))
                ev.append(_linear(ts, (B, T), h, f // t, bias))
                if model.arch == "llama":
                    ev.append(_linear(ts, (B, T), h, f // t, bias))
                ev.append(_linear(ts, (B, T), f // t, h, bias))
            if stage == plan.pp - 1:
                ev.append(_linear(ts, (B, T), h, model.vocab // t, False))
            # the backward pass, as autograd records it (its shapes are not what the inference reads)
            ev.append(cpu("autograd::engine::evaluate_function: MmBackward0", ts, 5))
            for e in ev:
                e["ts"] = ts
                ts += 10
            events += ev
        events.append(annotation(f"ProfilerStep#{step + 1}", start, ts - start + 5))
        ts += 10
    return events


def write_job(folder: Path, model: Model, plan: Plan, *, steps: int = 2, attention: str = "sdpa") -> Path:
    """One trace per rank of `model` under `plan` in `folder` (module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    pg = _pg_config(plan)
    for rank in range(plan.world_size):
        events = rank_events(model, plan, rank, steps=steps, attention=attention)
        write(folder / f"rank{rank}_trace.json", trace(rank, plan.world_size, events, pg_config=pg, backend="gloo"))
    return folder
