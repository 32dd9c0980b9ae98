"""One rank's training job: build its pipeline stage, run the schedule, reduce gradients, step, report.

The flat `parallelize` sequence of torchtitan, in plain steps: process groups from the plan's
topology (dist.py) -> this rank's stage of the GPT with its TP/SP/CP shards (gpt.py) -> gradient
buckets and ZeRO-1 shards (data_parallel.py), or ZeRO-2/3's per-layer units (zero.py) -> AdamW -> per step: the rank's microbatches
(data.py), the GPipe or 1F1B schedule (pipeline.py), gradient reduction, optimizer step. The first
microbatch of the first step runs under the activation meter (actmem.py). At the end every rank's
numbers go to rank 0, which writes metrics.json (metrics.py).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import torch

from parallel.core import memory
from parallel.engine import data, dist, flight
from parallel.engine.actmem import ActivationMeter, predicted_breakdown
from parallel.engine.collectives import BLOCKED, all_reduce, gather_object
from parallel.engine.data_parallel import GradReducer
from parallel.engine.gpt import GPTStage
from parallel.engine.metrics import build_metrics
from parallel.engine.modelstate import held_bytes, predicted_bytes
from parallel.engine.optim import AdamW
from parallel.engine.pipeline import Pipeline, phase
from parallel.engine.zero import ShardedReducer
from runfiles.rundir import write_json_atomic


def _threads() -> None:
    """One intra-op thread per CPU rank unless OMP_NUM_THREADS says otherwise: on a shared or
    oversubscribed host an OpenMP pool of 2+ threads per rank waits on descheduled threads at every
    op (measured here: the tiny model's step 30x slower with 2 threads than with 1)."""
    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def _fail_hook(rank: int) -> int | None:
    """Test hook: the step at which this rank fails (PARASCOPE_FAIL_RANK / PARASCOPE_FAIL_STEP)."""
    if os.environ.get("PARASCOPE_FAIL_RANK") == str(rank):
        return int(os.environ.get("PARASCOPE_FAIL_STEP", "0"))
    return None


def _fail(rank: int, step: int) -> None:
    """PARASCOPE_FAIL_MODE: raise (default) an exception; kill this process with SIGKILL; or hang,
    so the peers' next collective ends by the process-group timeout."""
    mode = os.environ.get("PARASCOPE_FAIL_MODE", "raise")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(10**6)
    raise RuntimeError(f"injected failure on rank {rank} at step {step} (PARASCOPE_FAIL_RANK)")


def train_rank(
    cfg, *, rank: int, world_size: int, init_method: str, local_rank: int, node: int, gpus_per_node: int, on_step=None
) -> dict | None:
    t_start = time.perf_counter()
    _threads()
    ctx = dist.init(
        kv_replicas=max(1, cfg.plan.tp // cfg.model.kv_heads),
        plan=cfg.plan,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        gpus_per_node=gpus_per_node,
        init_method=init_method,
        timeout_s=cfg.timeout_s,
    )
    metrics = _train(cfg, ctx, node=node, local_rank=local_rank, on_step=on_step, t_start=t_start)
    dist.shutdown()  # only on success: after a failure the launcher stops the peers
    return metrics


def _train(cfg, ctx, *, node: int, local_rank: int, on_step, t_start: float) -> dict | None:
    model, plan, rank = cfg.model, cfg.plan, ctx.rank
    dtype = torch.float32 if model.dtype_bytes == 4 else torch.bfloat16
    fail_step = _fail_hook(rank)
    torch.manual_seed(cfg.seed * 1000 + rank)  # dropout streams only: weights come from (seed, name)

    chunks = [GPTStage(model=model, ctx=ctx, dropout=cfg.dropout, chunk=c, swiglu=cfg.swiglu) for c in range(plan.vpp)]
    for chunk in chunks:
        chunk.init_weights(seed=cfg.seed)
        chunk.to(device=ctx.device, dtype=dtype)
    named = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]  # the serial model's names
    if plan.zero >= 2:  # sharded gradients (and parameters): per-layer units, zero.py
        reducer = ShardedReducer(chunks, ctx=ctx, zero=plan.zero, tied=model.tied_embeddings)
    else:  # flat buckets: all-reduce, or ZeRO-1's reduce-scatter of the same buckets
        reducer = GradReducer(
            named, ctx=ctx, zero=plan.zero, bucket_bytes=int(cfg.bucket_mb * 2**20), tied=model.tied_embeddings
        )
    optimizer = AdamW(reducer.optimizer_params(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.weight_decay)
    meter = ActivationMeter(exclude=[p for _, p in named])
    t_local = model.seq_len // plan.cp // (plan.tp if plan.sp else 1)  # tokens per rank between layers
    pipe = Pipeline(models=chunks, ctx=ctx, act_shape=(plan.micro_batch, t_local, model.hidden), dtype=dtype)
    if cfg.straggler and cfg.straggler[0] == rank:
        pipe.delay_s = cfg.straggler[1] / 1e3
    tokens = plan.global_batch * model.seq_len  # the loss is the mean over all of them
    init_s = time.perf_counter() - t_start

    losses, times, comm_times, first_grads, state_bytes = [], [], [], {}, {}
    cpu_times, comm_cpu_times = [], []
    for step in range(cfg.steps):
        if step == fail_step:
            _fail(rank, step)
        flight.INJECTOR.step = step  # profiler run --inject-hang fires at this step's first collective
        BLOCKED.take()  # this step's communication time starts here
        BLOCKED.take_cpu()
        t0, c0 = time.perf_counter(), time.process_time()
        batch = data.global_batch(
            step=step, seed=cfg.seed, global_batch=plan.global_batch, seq_len=model.seq_len, vocab=model.vocab
        )
        mbs = data.microbatches(batch, plan=plan, dp_index=ctx.dp.index, cp_index=ctx.cp.index, device=ctx.device)
        reducer.zero_grad()
        loss = pipe.step(mbs, schedule=plan.schedule, tokens=tokens, meter=meter if step == 0 else None)
        reducer.reduce()
        if step == 0:  # model state with gradients, states and parameters all alive (modelstate.py)
            state_bytes = held_bytes([p for _, p in named], reducer, optimizer)
        if step == 0 and cfg.save_params and plan.zero == 0:  # the first step's reduced gradients, for tests
            first_grads = {n: p.grad.detach().cpu().clone() for n, p in named}
        with phase("optim"):
            optimizer.step()
            reducer.after_step()
        if ctx.is_last:
            all_reduce(loss, group=ctx.dpcp, dim="dp")  # the global-batch mean
        value = float(loss.item()) if ctx.is_last else None
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        comm_times.append(BLOCKED.take())
        comm_cpu_times.append(BLOCKED.take_cpu())
        losses.append(value)
        if rank == ctx.topo.rank_of(pp=plan.pp - 1):  # one rank that knows the loss reports it
            print(f"step {step}  loss {value:.6f}  {times[-1] * 1e3:.0f} ms", flush=True)
        if on_step is not None:
            on_step(step, {"step": step, "steps": cfg.steps, "loss": value, "step_time_s": times[-1]})

    if cfg.save_params and cfg.out:
        if plan.zero == 3:  # the full parameters exist only while gathered
            reducer.gather_all()
        _save_shards(named, ctx, Path(cfg.out), grads=first_grads)
    result = {
        "rank": rank,
        "coords": ctx.coords,
        "stage": ctx.stage,
        "node": node,
        "local_rank": local_rank,
        "hostname": socket.gethostname(),
        "loss": losses if ctx.is_last else None,
        "step_time_s": times,
        "comm_time_s": comm_times,
        "cpu_time_s": cpu_times,
        "comm_cpu_time_s": comm_cpu_times,
        "init_s": init_s,
        "activation_bytes": meter.total(),
        "activation_breakdown": meter.breakdown(),
        "activation_bytes_per_layer": meter.per_layer(),
        "predicted_activation_breakdown": predicted_breakdown(
            model, plan, stage=ctx.stage, dropout=cfg.dropout, swiglu=cfg.swiglu
        ),
        "model_state_bytes": state_bytes,
        "predicted_model_state_bytes": predicted_bytes(model, plan, stage=ctx.stage),
        "model_state_transient_bytes": reducer.transient_peak() if plan.zero >= 2 else {},
        "live_microbatches": {
            "peak": pipe.peak_total,
            "per_chunk": list(pipe.peak_live),
            "predicted_peak": int(memory.inflight_chunks(plan, ctx.stage)),
            "predicted_first_chunk": int(memory.embedding_chunks(plan)) if ctx.stage == 0 else None,
        },
    }
    results = gather_object(result, world_size=ctx.world_size)
    if rank != 0:
        return None
    metrics = build_metrics(cfg, results, backend=ctx.backend)
    if cfg.out:
        write_json_atomic(Path(cfg.out) / "metrics.json", metrics)
    return metrics


def _save_shards(named, ctx, out: Path, *, grads: dict) -> None:
    """This rank's parameter shards after training, and its first step's reduced gradients (not kept
    under ZeRO-1, where each rank has only its shard of them); metrics.full_state_dict reassembles."""
    (out / "params").mkdir(parents=True, exist_ok=True)
    payload = {
        "coords": ctx.coords,
        "tp": ctx.tp.size,
        "params": {n: p.detach().cpu().clone() for n, p in named},
        "grads": grads,
        "tp_shard": {n: p.tp_shard for n, p in named if hasattr(p, "tp_shard")},
    }
    tmp = out / "params" / f".rank{ctx.rank}.pt.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, out / "params" / f"rank{ctx.rank}.pt")
