"""Real multi-rank Kineto traces of annotated gloo collectives, for tests and bench/ingest.py.

This writes what the profiler writes -- DIR/run.json and
DIR/traces/rank{r}_trace.json.gz -- from a real torch.profiler run of real torch.distributed
collectives on gloo over 127.0.0.1: per step, each microbatch does a little compute, TP collectives
(all_reduce; with SP all_gather + reduce_scatter labelled 'sp'), PP send/recv between stages, and
the step ends with a DP all_reduce of the gradients; every collective runs inside
`record_function(runfiles.annotations.comm_name(...))` and phases inside `phase_name(...)`.

    python tests/support/tracegen.py OUT_DIR --dp 2 --tp 2 --pp 2 [--sp] [--steps 2] [--late-rank R]

Runtime layer (imports torch); the library under test never imports this file.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

from parallel.core.topology import Topology
from runfiles.annotations import comm_name, phase_name
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _worker(rank: int, cfg: dict) -> None:
    # lazy: torch (2 s) in the spawned ranks only; trace_samples imports this module for every unit test
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.set_num_threads(1)
    world = cfg["dp"] * cfg["tp"] * cfg["pp"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{cfg['port']}",
        rank=rank,
        world_size=world,
        timeout=__import__("datetime").timedelta(seconds=120),
    )
    topo = Topology(dp=cfg["dp"], pp=cfg["pp"], cp=1, tp=cfg["tp"], gpus_per_node=cfg["gpus_per_node"])
    groups = {}
    for dim in ("tp", "dp", "pp"):  # every rank creates every group, in the same order
        for row in topo.group_ranks(dim):
            ranks = tuple(int(r) for r in row)
            pg = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                groups[dim] = (ranks, pg)
    seq: dict[tuple, int] = {}

    def annotated(dim, op, nbytes, ranks, fn):
        key = tuple(ranks)
        n = seq.get(key, 0)
        seq[key] = n + 1
        with record_function(comm_name(dim, op, nbytes, ranks, n)):
            fn()

    h = cfg["hidden"]
    coords = topo.coords_of(rank)
    stage = coords["pp"]
    tp_ranks, tp_pg = groups["tp"]
    dp_ranks, dp_pg = groups["dp"]
    pp_ranks, _ = groups["pp"]
    weight = torch.randn(h, h)
    out_dir = Path(cfg["out"]) / "traces"

    def tp_collectives(x):
        if len(tp_ranks) < 2:
            return
        if cfg["sp"]:
            full = torch.empty(x.numel() * len(tp_ranks))
            annotated(
                "sp",
                "all_gather",
                full.numel() * 4,
                tp_ranks,
                lambda: dist.all_gather_into_tensor(full, x, group=tp_pg),
            )
            part = torch.empty(x.numel())
            annotated(
                "sp",
                "reduce_scatter",
                full.numel() * 4,
                tp_ranks,
                lambda: dist.reduce_scatter_tensor(part, full, group=tp_pg),
            )
        else:
            annotated("tp", "all_reduce", x.numel() * 4, tp_ranks, lambda: dist.all_reduce(x, group=tp_pg))

    def p2p(x, forward: bool):
        if len(pp_ranks) < 2:
            return
        src_stage, dst_stage = (stage - 1, stage + 1) if forward else (stage + 1, stage - 1)
        if 0 <= src_stage < len(pp_ranks):
            peer = pp_ranks[src_stage]
            annotated("pp", "recv", x.numel() * 4, (peer, rank), lambda: dist.recv(x, src=peer))
        if 0 <= dst_stage < len(pp_ranks):
            peer = pp_ranks[dst_stage]
            annotated("pp", "send", x.numel() * 4, (rank, peer), lambda: dist.send(x, dst=peer))

    def step(i):
        for mb in range(cfg["microbatches"]):
            x = torch.randn(cfg["tokens"], h)
            with record_function(phase_name("fwd", mb=mb, stage=stage)):
                p2p(x, forward=True)
                y = x @ weight
                tp_collectives(y.flatten()[: h * 4].contiguous())
            with record_function(phase_name("bwd", mb=mb, stage=stage)):
                p2p(x, forward=False)
                g = y.t() @ x
                tp_collectives(g.flatten()[: h * 4].contiguous())
        grad = torch.ones(cfg["grad_elems"])
        if rank == cfg["late_rank"]:
            time.sleep(cfg["late_s"])
        if len(dp_ranks) > 1:
            annotated("dp", "all_reduce", grad.numel() * 4, dp_ranks, lambda: dist.all_reduce(grad, group=dp_pg))
        with record_function(phase_name("optim")):
            weight.add_(torch.randn(h, h), alpha=1e-3)

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=cfg["steps"], repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out_dir / f"rank{rank}_trace.json.gz")),
    ) as prof:
        for i in range(cfg["steps"] + 1):
            step(i)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def generate(
    out,
    *,
    dp=2,
    tp=2,
    pp=1,
    sp=False,
    steps=2,
    microbatches=2,
    hidden=32,
    tokens=16,
    grad_elems=4096,
    late_rank=-1,
    late_s=0.02,
    gpus_per_node=8,
) -> Path:
    """Write a run directory with one trace per rank; returns its path."""
    import torch.multiprocessing as mp  # lazy: torch (2 s), only when a run is generated (see _worker)

    out = Path(out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    world = dp * tp * pp
    cfg = dict(
        dp=dp,
        tp=tp,
        pp=pp,
        sp=sp,
        steps=steps,
        microbatches=microbatches,
        hidden=hidden,
        tokens=tokens,
        grad_elems=grad_elems,
        late_rank=late_rank,
        late_s=late_s,
        gpus_per_node=gpus_per_node,
        out=str(out),
        port=free_port(),
    )
    ctx = mp.get_context("fork")  # children share the parent's imported torch pages
    procs = [ctx.Process(target=_worker, args=(r, cfg)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        for p in procs:
            if p.is_alive():
                p.kill()
        raise RuntimeError(f"trace generation failed on ranks {bad}")
    host = socket.gethostname()
    run = {
        "status": "completed",
        "world_size": world,
        "backend": "gloo",
        "plan": {"dp": dp, "tp": tp, "pp": pp, "cp": 1, "sp": sp, "micro_batch": 1, "global_batch": dp * microbatches},
        "hosts": {
            str(r): {"hostname": host, "node": r // gpus_per_node, "local_rank": r % gpus_per_node}
            for r in range(world)
        },
    }
    (out / "run.json").write_text(json.dumps(run, indent=1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    for name, default in (("dp", 2), ("tp", 2), ("pp", 1), ("steps", 2), ("microbatches", 2), ("late_rank", -1)):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    ap.add_argument("--sp", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    generate(
        args.out,
        dp=args.dp,
        tp=args.tp,
        pp=args.pp,
        sp=args.sp,
        steps=args.steps,
        microbatches=args.microbatches,
        late_rank=args.late_rank,
    )
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
