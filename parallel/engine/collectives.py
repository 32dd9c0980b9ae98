"""Every collective the engine issues, each labelled for the profiler, and the autograd operators built on them.

One door for communication: the layers, the pipeline and the gradient reduction call only this
module, and each call runs inside ``torch.profiler.record_function(comm_name(...))`` (the format of
``runfiles.annotations``: dim, op, nccl-tests bytes, the group's global ranks, a per-group
sequence number). Sequence numbers advance whether or not a profiler is on, so a trace that starts
at step 5 still numbers collectives consistently across ranks; the name is only formatted while
a profiler is recording, so the cost when it is off is one counter increment.

Autograd operators (Shoeybi et al. 2019, "Megatron-LM", Sec. 3, Fig. 3; Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", Sec. 4.2.2, Fig. 5):

    copy_to_tp        f   forward identity,        backward all-reduce   (TP input of a column-parallel GEMM)
    reduce_from_tp    f̄   forward all-reduce,      backward identity     (TP output of a row-parallel GEMM)
    gather_seq        g   forward all-gather,      backward reduce-scatter  (SP: before a column-parallel GEMM;
                                                                             CP: K and V for attention)
    scatter_seq       ḡ   forward reduce-scatter,  backward all-gather   (SP: after a row-parallel GEMM)

Tensors are (B, T, ...) and sequence collectives act on `axis` (T = 1 for activations, 2 for
(B, heads, T, head_dim) K/V). A group of one rank makes every operation the identity.

The same labelled ranges are timed whether or not a profiler records them (BLOCKED, two wall and two
CPU clock reads a call, ~2 us): the wall time this rank spent inside its communication calls, their
union where several are open at once (an exchange's send and receive ranges), and the process's CPU
time inside them. A step's share goes to metrics.json (`comm_time_s_per_rank`,
`comm_cpu_time_s_per_rank`), so a run's unprofiled steps say how much of them was communication -- the
calibration removes the tracing overhead of work and of communication each by its own measure -- and,
with the step's CPU time, how long work waited for a core where ranks share them.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import torch
import torch.distributed as dist

from parallel.engine import flight
from runfiles.annotations import comm_name

_profiling = torch._C._autograd._profiler_enabled


class BlockedClock:
    """Seconds this process spent inside communication calls: the union of the open ranges (one
    clock per rank process; `take()` returns the seconds since the last take and restarts), and the
    process's CPU seconds inside them (`take_cpu()`: its threads', the transport's included) -- on
    shared cores the two tell a rank's waiting from its host's work."""

    def __init__(self):
        self.open, self.since, self.total = 0, 0.0, 0.0
        self.cpu_since, self.cpu_total = 0.0, 0.0

    def enter(self) -> None:
        if self.open == 0:
            self.since = time.perf_counter()
            self.cpu_since = time.process_time()
        self.open += 1

    def exit(self) -> None:
        self.open -= 1
        if self.open == 0:
            self.total += time.perf_counter() - self.since
            self.cpu_total += time.process_time() - self.cpu_since

    def take(self) -> float:
        out, self.total = self.total, 0.0
        return out

    def take_cpu(self) -> float:
        out, self.cpu_total = self.cpu_total, 0.0
        return out


BLOCKED = BlockedClock()


class _Timed:
    """One communication call's range: timed on BLOCKED, and a `ps.comm` record_function range when a
    profiler is recording (the name is formatted only then)."""

    __slots__ = ("name", "rf")

    def __init__(self, name):
        self.name, self.rf = name, None

    def __enter__(self):
        if _profiling():
            self.rf = torch.profiler.record_function(self.name())
            self.rf.__enter__()
        BLOCKED.enter()
        return self

    def __exit__(self, *exc):
        BLOCKED.exit()
        if self.rf is not None:
            self.rf.__exit__(*exc)
        return False


class Group:
    """One process group of a parallel dimension: its global ranks (ascending by coordinate), this
    rank's index in it, the torch handle, and the sequence counters of its collectives."""

    def __init__(self, *, dim: str, ranks, pg, rank: int):
        self.dim, self.ranks, self.pg = dim, tuple(int(r) for r in ranks), pg
        self.size = len(self.ranks)
        self.index = self.ranks.index(rank) if rank in self.ranks else -1
        self._seq = 0
        self._p2p_seq: dict[tuple[int, int], int] = {}  # (src, dst) -> next seq (pipeline pairs)
        if pg is not None:
            flight.GROUPS.append(self)  # for the Flight Recorder dump's pg_config

    def __repr__(self):
        return f"Group({self.dim}, ranks={list(self.ranks)})"

    def _label(self, op: str, nbytes: int, dim: str | None, tensor: torch.Tensor | None = None) -> _Timed:
        if flight.INJECTOR.injection is not None:  # profiler run --inject-hang, on this rank
            flight.INJECTOR.at(self, op, tensor)
        seq, self._seq = self._seq, self._seq + 1
        return _Timed(lambda: comm_name(dim or self.dim, op, nbytes, self.ranks, seq))

    def _p2p_label(self, op: str, nbytes: int, src: int, dst: int, tensor=None) -> _Timed:  # pipeline, ring CP
        if flight.INJECTOR.injection is not None:
            flight.INJECTOR.at(self, op, tensor, dst if op == "send" else src)
        seq = self._p2p_seq.get((src, dst), 0)
        self._p2p_seq[(src, dst)] = seq + 1
        return _Timed(lambda: comm_name(self.dim, op, nbytes, (src, dst), seq))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---- plain collectives (no autograd) --------------------------------------------------------------


def all_reduce(t: torch.Tensor, *, group: Group, dim: str | None = None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce of `t` over `group` (bytes: the buffer)."""
    if group.size == 1:
        return t
    with group._label("all_reduce", _nbytes(t), dim, t):
        dist.all_reduce(t, op=op, group=group.pg)
    return t


def all_gather(t: torch.Tensor, *, group: Group, dim: str | None = None, axis: int = 0) -> torch.Tensor:
    """Concatenation along `axis` of every rank's `t`, in group order (bytes: the full output)."""
    if group.size == 1:
        return t
    t = t.contiguous()
    flat = torch.empty(group.size * t.numel(), dtype=t.dtype, device=t.device)  # rank-major, 1-D for any backend
    with group._label("all_gather", _nbytes(flat), dim, t):
        dist.all_gather_single(flat, t.reshape(-1), group=group.pg)
    out = flat.view(group.size, *t.shape)
    # (n, ..., T_i, ...) -> (..., n*T_i, ...): move the rank axis next to `axis` and merge them
    out = out.movedim(0, axis)
    return out.reshape(*t.shape[:axis], group.size * t.shape[axis], *t.shape[axis + 1 :])


def reduce_scatter(t: torch.Tensor, *, group: Group, dim: str | None = None, axis: int = 0) -> torch.Tensor:
    """Sum over ranks of `t`, split along `axis`; this rank keeps chunk `group.index` (bytes: the full input)."""
    if group.size == 1:
        return t
    n = group.size
    shape = (*t.shape[:axis], n, t.shape[axis] // n, *t.shape[axis + 1 :])
    inp = t.reshape(shape).movedim(axis, 0).contiguous()  # (n, ..., T/n, ...)
    out = torch.empty(inp.shape[1:], dtype=t.dtype, device=t.device)
    with group._label("reduce_scatter", _nbytes(inp), dim, inp):
        dist.reduce_scatter_single(out.view(-1), inp.view(-1), group=group.pg)
    return out


def all_gather_flat(out: torch.Tensor, shard: torch.Tensor, *, group: Group, dim: str | None = None) -> None:
    """all_gather of equal 1-D shards straight into the flat `out` (ZeRO-1 parameter gather)."""
    if group.size > 1:
        with group._label("all_gather", _nbytes(out), dim, shard):
            dist.all_gather_single(out, shard, group=group.pg)


def reduce_scatter_flat(out: torch.Tensor, flat: torch.Tensor, *, group: Group, dim: str | None = None) -> None:
    """reduce_scatter of a flat buffer into this rank's equal 1-D shard `out` (ZeRO-1 gradients)."""
    if group.size > 1:
        with group._label("reduce_scatter", _nbytes(flat), dim, flat):
            dist.reduce_scatter_single(out, flat, group=group.pg)


def _p2p_op(kind, item):
    tensor, peer, tag = (*item, 0)[:3]
    return dist.P2POp(kind, tensor, peer, tag=tag)


def exchange(*, group: Group, send=(), recv=()) -> None:
    """Point-to-point sends and receives with global peer ranks, `send` and `recv` lists of (tensor,
    peer[, tag]), issued together by batch_isend_irecv so that stages sending to each other cannot
    deadlock (Megatron-LM's p2p_communication does the same). Between one pair of ranks, messages
    match in order (NCCL ignores tags) and, where the backend has them, by tag. Labels: the `send`
    ranges enclose the issue of the batch (and, with nothing to receive, its completion); the
    `recv` ranges the wait for data (and, with nothing to send, the issue too: every backend op
    of the batch runs inside a label, so a trace never shows an unlabelled c10d::recv_)."""
    send, recv = list(send), list(recv)
    if send and recv:  # the send ranges hold the issue, the first recv range the wait
        start_exchange(group=group, send=send, recv=recv).wait()
        return
    if not send and not recv:
        return
    ops, sends, recvs = _p2p_batch(group, send, recv)
    with ExitStack() as issuing:  # one kind only: the same ranges hold the issue and the completion
        for label in sends or recvs[:1]:
            issuing.enter_context(label)
        for w in dist.batch_isend_irecv(ops) or []:
            w.wait()
    for label in recvs[1:]:
        with label:
            pass


def _p2p_batch(group: Group, send: list, recv: list):
    """The batch's P2POps and its labels (sends, then recvs: the order their sequence numbers advance)."""
    me = dist.get_rank()
    ops = [_p2p_op(dist.isend, item) for item in send] + [_p2p_op(dist.irecv, item) for item in recv]
    sends = [group._p2p_label("send", _nbytes(t), me, peer, t) for t, peer, *_ in send]
    recvs = [group._p2p_label("recv", _nbytes(t), peer, me, t) for t, peer, *_ in recv]
    for t, peer, *_ in send:  # after the labels: an injected hang stops there, before the ops exist
        flight.P2P.add(group, "send", me, peer, t)
    for t, peer, *_ in recv:
        flight.P2P.add(group, "recv", peer, me, t)
    return ops, sends, recvs


class Pending:
    """Point-to-point transfers in flight (start_exchange): `wait()` returns the received tensors."""

    def __init__(self, works, labels, received):
        self.works, self.labels, self.received = works, labels, received

    def wait(self) -> list[torch.Tensor]:
        for i, label in enumerate(self.labels):
            with label:
                if i == 0:  # the first recv range holds the wait, as in `exchange`
                    for w in self.works:
                        w.wait()
        return self.received


def start_exchange(*, group: Group, send, recv) -> Pending:
    """`exchange` without waiting: sends and receives are issued (inside the send ranges) and run
    while the caller computes; `Pending.wait()` waits for them inside the recv ranges. Both lists
    must be non-empty (ring attention: every rank sends one block on and receives the next)."""
    send, recv = list(send), list(recv)
    if not send or not recv:
        raise ValueError("start_exchange needs sends and receives")
    ops, sends, recvs = _p2p_batch(group, send, recv)
    with ExitStack() as issuing:
        for label in sends:
            issuing.enter_context(label)
        works = dist.batch_isend_irecv(ops) or []
    return Pending(works, recvs, [t for t, *_ in recv])


def ring_shift(t: torch.Tensor, *, group: Group, tag: int = 0) -> Pending:
    """Send `t` to the next rank of `group` and receive the previous rank's tensor of the same shape
    (ring attention's K/V rotation); `.wait()[0]` is the received tensor."""
    n, i = group.size, group.index
    nxt, prev = group.ranks[(i + 1) % n], group.ranks[(i - 1) % n]
    return start_exchange(group=group, send=[(t.contiguous(), nxt, tag)], recv=[(torch.empty_like(t), prev, tag)])


def all_to_all(t: torch.Tensor, *, group: Group, dim: str | None = None) -> torch.Tensor:
    """All-to-all of `t` (n, ...): chunk j goes to rank j, chunk j of the result came from rank j
    (bytes: the whole buffer, as nccl-tests count alltoall)."""
    if group.size == 1:
        return t
    t = t.contiguous()
    out = torch.empty_like(t)
    with group._label("all_to_all", _nbytes(t), dim, t):
        dist.all_to_all_single(out, t, group=group.pg)
    return out


def gather_object(obj, *, world_size: int):
    """Bookkeeping after training (per-rank metrics to rank 0): a list on rank 0, None elsewhere.
    Not a training collective, so it carries no `ps.comm` label."""
    if world_size == 1:
        return [obj]
    out = [None] * world_size if dist.get_rank() == 0 else None
    with torch.profiler.record_function("ps.meta gather_object"):
        dist.gather_object(obj, out, dst=0)
    return out


# ---- autograd operators (Megatron f / f̄, SP g / ḡ) ----------------------------------------------


class _CopyToTP(torch.autograd.Function):
    """Megatron's `f`: identity forward, all-reduce of the input gradient backward (Shoeybi et al. 2019, Fig. 3a)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.contiguous(), group=ctx.group, dim="tp"), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's `f̄` (called `g` in the paper): all-reduce forward, identity backward (Fig. 3a)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.contiguous().clone(), group=group, dim="tp")

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence forward, reduce-scatter of the gradient backward: SP's `g`
    (Korthikanti et al. 2022, Sec. 4.2.2) and context parallelism's K/V gather (Dubey et al. 2024,
    "The Llama 3 Herd of Models", Sec. 3.3.2)."""

    @staticmethod
    def forward(ctx, x, group, dim, axis):
        ctx.group, ctx.dim, ctx.axis = group, dim, axis
        return all_gather(x, group=group, dim=dim, axis=axis)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter(g, group=ctx.group, dim=ctx.dim, axis=ctx.axis), None, None, None


class _ScatterSeq(torch.autograd.Function):
    """Reduce-scatter along the sequence forward, all-gather backward: SP's `ḡ` (Korthikanti et al. 2022, Sec. 4.2.2)."""

    @staticmethod
    def forward(ctx, x, group, dim, axis):
        ctx.group, ctx.dim, ctx.axis = group, dim, axis
        return reduce_scatter(x, group=group, dim=dim, axis=axis)

    @staticmethod
    def backward(ctx, g):
        return all_gather(g, group=ctx.group, dim=ctx.dim, axis=ctx.axis), None, None, None


class _SeqToHeads(torch.autograd.Function):
    """DeepSpeed-Ulysses' all-to-all (Jacobs et al. 2023, Sec. 3.1): (B, T, H, d) of this rank's T
    tokens and H heads -> (B, n·T, H/n, d), all ranks' tokens (in group order) of H/n heads; the
    backward is the inverse all-to-all. `inverse=True` is that inverse (after attention)."""

    @staticmethod
    def forward(ctx, x, group, inverse):
        ctx.group, ctx.inverse = group, inverse
        return _heads_exchange(x, group, inverse)

    @staticmethod
    def backward(ctx, g):
        return _heads_exchange(g, ctx.group, not ctx.inverse), None, None


def _heads_exchange(x: torch.Tensor, group: Group, inverse: bool) -> torch.Tensor:
    n = group.size
    if not inverse:  # (B, T, H, d) -> chunks of heads to ranks -> (B, n·T, H/n, d)
        B, T, H, d = x.shape
        send = x.reshape(B, T, n, H // n, d).permute(2, 0, 1, 3, 4)  # (n, B, T, H/n, d)
        got = all_to_all(send, group=group, dim="cp")  # chunk j: rank j's tokens of my heads
        return got.permute(1, 0, 2, 3, 4).reshape(B, n * T, H // n, d)
    B, S, h, d = x.shape  # (B, n·T, H/n, d) -> token chunks back to their ranks -> (B, T, H, d)
    send = x.reshape(B, n, S // n, h, d).permute(1, 0, 2, 3, 4)  # (n, B, T, H/n, d)
    got = all_to_all(send, group=group, dim="cp")  # chunk j: my tokens of rank j's heads
    return got.permute(1, 2, 0, 3, 4).reshape(B, S // n, n * h, d)


def seq_to_heads(x, *, group: Group):
    """Ulysses before attention: (B, T, H, d) -> (B, n·T, H/n, d)."""
    return x if group.size == 1 else _SeqToHeads.apply(x, group, False)


def heads_to_seq(x, *, group: Group):
    """Ulysses after attention: (B, n·T, H/n, d) -> (B, T, H, d)."""
    return x if group.size == 1 else _SeqToHeads.apply(x, group, True)


def copy_to_tp(x, *, group: Group):
    return x if group.size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x, *, group: Group):
    return x if group.size == 1 else _ReduceFromTP.apply(x, group)


def gather_seq(x, *, group: Group, dim: str, axis: int = 1):
    return x if group.size == 1 else _GatherSeq.apply(x, group, dim, axis)


def scatter_seq(x, *, group: Group, dim: str, axis: int = 1):
    return x if group.size == 1 else _ScatterSeq.apply(x, group, dim, axis)
