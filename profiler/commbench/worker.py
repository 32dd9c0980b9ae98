"""One rank of `python -m profiler commbench`: time collectives with torch.distributed.

Started by the local agent (`prepare(FLAGS)` once, `rank(...)` per forked rank) or by torchrun as
`python -m profiler.commbench.worker FLAGS` per rank. Every rank creates every measured group (the
new_group contract); for each (group, op, size) the group's ranks run `warmup` calls, a barrier,
then `iters` back-to-back calls timed with perf_counter (after a device synchronise on GPUs), and
the mean per-call time is reduced over the group (avg and max). Ranks outside the group wait at a
world barrier between blocks, so only one group talks at a time.

Groups, for each size n = 2..N:
    intra   ranks 0..n-1 when they fit on one node (node 0's first n local ranks)
    inter   (multi-node only) n ranks taken round-robin over the nodes, so the ring crosses them
Rank 0 belongs to every group; it fits the results (commbench_fit.py) and writes FILE and FILE.csv.

Runtime layer: imports torch.
"""

from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from parallel.engine.api import torchrun_env
from profiler.collect.launchers import worker_args
from profiler.commbench import fit
from profiler.commbench.spec import CommbenchSpec, parse_commbench
from runfiles.rundir import now_iso, write_json_atomic


def groups_to_measure(world: int, nproc_per_node: int, sizes: list[int]) -> list[tuple[str, tuple[int, ...]]]:
    """[(link, ranks)] in creation order: intra groups of the first ranks of node 0, and for
    multi-node jobs groups spread round-robin over the nodes."""
    nnodes = world // nproc_per_node
    out = [("intra", tuple(range(n))) for n in sizes if n <= nproc_per_node]
    if nnodes > 1:
        spread = [node * nproc_per_node + local for local in range(nproc_per_node) for node in range(nnodes)]
        out += [("inter", tuple(sorted(spread[:n]))) for n in sizes]
    return out


def _op(op: str, nbytes: int, group, n: int, me: int, device, dtype=torch.float32):
    """(a zero-argument callable running one `op` of about `nbytes` over the group, actual bytes)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    count = max(nbytes // elem // n, 1) * n  # divisible by n, as nccl-tests rounds counts
    x = torch.ones(count, dtype=dtype, device=device)
    if op == "all_reduce":
        return (lambda: dist.all_reduce(x, group=group)), count * elem
    if op == "all_gather":
        part = x[: count // n].clone()
        return (lambda: dist.all_gather_into_tensor(x, part, group=group)), count * elem
    if op == "reduce_scatter":
        part = torch.empty(count // n, dtype=dtype, device=device)
        return (lambda: dist.reduce_scatter_tensor(part, x, group=group)), count * elem
    if op == "all_to_all":
        out = torch.empty_like(x)
        return (lambda: dist.all_to_all_single(out, x, group=group)), count * elem
    if op == "send_recv":  # ring shift: each rank sends to the next and receives from the previous
        ranks = dist.get_process_group_ranks(group)
        i = ranks.index(me)
        nxt, prv = ranks[(i + 1) % n], ranks[(i - 1) % n]
        out = torch.empty_like(x)

        def shift():
            for w in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, x, nxt, group=group), dist.P2POp(dist.irecv, out, prv, group=group)]
            ):
                w.wait()

        return shift, count * elem
    raise ValueError(f"unknown op {op!r}")


def _time(call, spec: CommbenchSpec, group, device) -> float:
    for _ in range(spec.warmup_iters):
        call()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(spec.iters):
        call()
    sync()
    return (time.perf_counter() - t0) / spec.iters


def measure(spec: CommbenchSpec, *, rank: int, world: int, nproc_per_node: int, device) -> list[dict]:
    """Every (group, op, size) this rank takes part in; rows with group-reduced times (rank 0 keeps them)."""
    layout = groups_to_measure(world, nproc_per_node, spec.group_sizes(world))
    pgs = [
        (link, ranks, dist.new_group(list(ranks), timeout=timedelta(seconds=spec.timeout_s))) for link, ranks in layout
    ]
    rows = []
    for link, ranks, pg in pgs:
        for op in spec.ops:
            if rank in ranks:
                n = len(ranks)
                for size in spec.sizes:
                    call, nbytes = _op(op, size, pg, n, rank, device)
                    own = _time(call, spec, pg, device)
                    total = torch.tensor([own], dtype=torch.float64, device=device)
                    worst = torch.tensor([own], dtype=torch.float64, device=device)
                    dist.all_reduce(total, group=pg)
                    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=pg)
                    sec, worst = float(total) / n, float(worst)
                    alg, bus = fit.bandwidths(op, n, nbytes, sec)
                    rows.append(
                        {
                            "op": op,
                            "group_size": n,
                            "link": link,
                            "ranks": ",".join(map(str, ranks)),
                            "bytes": nbytes,
                            "iters": spec.iters,
                            "time_us": sec * 1e6,
                            "time_max_us": worst * 1e6,
                            "algbw_gbps": alg,
                            "busbw_gbps": bus,
                        }
                    )
            dist.barrier()  # one group at a time
    return rows


def prepare(argv) -> CommbenchSpec:
    spec, errors = parse_commbench(argv)
    if errors:
        raise SystemExit("profiler.commbench.worker: " + "; ".join(errors))
    return spec


def rank(
    spec: CommbenchSpec,
    *,
    rank: int,
    world_size: int,
    init_method: str = "env://",
    local_rank: int = 0,
    node: int = 0,
    gpus_per_node: int | None = None,
) -> None:
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=spec.timeout_s)
    )
    host = {"hostname": socket.gethostname(), "node": node, "local_rank": local_rank}
    hosts = [None] * world_size
    dist.all_gather_object(hosts, host)
    rows = measure(spec, rank=rank, world=world_size, nproc_per_node=gpus_per_node or world_size, device=device)
    if rank == 0:
        write_result(
            spec,
            rows,
            hosts=hosts,
            backend=backend,
            device=str(device.type),
            world=world_size,
            nproc_per_node=gpus_per_node or world_size,
        )
    dist.barrier()
    dist.destroy_process_group()


def write_result(
    spec: CommbenchSpec, rows: list[dict], *, hosts, backend: str, device: str, world: int, nproc_per_node: int
) -> None:
    where = f"{backend} on {device}, {world} ranks on {len({h['hostname'] for h in hosts})} host(s)"
    per, links = fit.fits(
        rows, names={"intra": f"fitted intra-node ({where})", "inter": f"fitted inter-node ({where})"}
    )
    result = {
        "schema": 1,
        "created_at": now_iso(),
        "backend": backend,
        "device": device,
        "torch_version": torch.__version__,
        "world_size": world,
        "nnodes": world // nproc_per_node,
        "nproc_per_node": nproc_per_node,
        "hosts": {str(r): h for r, h in enumerate(hosts)},
        "settings": {
            "ops": list(spec.ops),
            "sizes": list(spec.sizes),
            "group_sizes": spec.group_sizes(world),
            "iters": spec.iters,
            "warmup_iters": spec.warmup_iters,
            "dtype": "float32",
        },
        "conventions": fit.__doc__.split("\n\n")[1].strip(),
        "results": rows,
        "fits": per,
        "links": links,
    }
    if "inter" not in links:
        result["links_note"] = (
            "all ranks ran on one node: only the intra-node link was measured; run commbench "
            "across nodes (torchrun --nnodes 2, or the lab) to fit `inter`"
        )
    write_json_atomic(spec.out, result)
    fit.write_csv(spec.csv_path, rows)


def main(argv=None) -> int:
    """Entry point of one rank under torchrun."""
    spec = prepare(worker_args(sys.argv[1:] if argv is None else list(argv)))
    env = torchrun_env()
    if env is None:
        print("profiler.commbench.worker: start it with torchrun (or `python -m profiler commbench`)", file=sys.stderr)
        return 2
    record(rank)(
        spec,
        rank=env["rank"],
        world_size=env["world_size"],
        local_rank=env["local_rank"],
        node=env["node"],
        gpus_per_node=env["gpus_per_node"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
