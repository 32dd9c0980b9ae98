"""Which parallel dimension a collective serves (its bus bandwidth factor: parallel.core.comm.bus_factor).

Precedence for `dim` (recorded in `dim_source`):
  1. 'annotation'  our own ``ps.comm dim=..`` name (runfiles.annotations) -- the job said so;
  2. 'plan'        the group's ranks equal one group of the plan's topology (send/recv: the two peers
                   lie inside one group). With plan.sp, a TP group collective stays 'tp' unless its
                   annotation says 'sp': on the wire SP and TP use the same group;
  3. 'group_desc'  the process group's description (Megatron-LM TENSOR_MODEL_PARALLEL_GROUP,
                   DeviceMesh mesh_tp, ...), see profiler.traces.group_names;
  4. 'unknown'.
Afterwards, across ranks (analyzers.collectives): 'group_size' -- a collective with none of these
whose group is every rank of the job is labelled 'world': which dimension it serves is not known.

Pure: numpy, and parallel.core.plan / parallel.core.topology (pure too).
"""

from __future__ import annotations

from parallel.core.plan import Plan
from parallel.core.specs import SpecError
from parallel.core.topology import DIMS as PLAN_DIMS
from parallel.core.topology import Topology
from profiler.traces.errors import PlanMismatchError
from profiler.traces.group_names import dim_from_group_desc
from profiler.traces.model import Traces

PlanLike = Plan | dict | None  # a Plan, its JSON dict, or None (run.json's plan, if any)
P2P_OPS = frozenset({"send", "recv", "send_recv"})


def plan_of(plan: PlanLike, traces: Traces) -> Plan | None:
    """The Plan to label with: the one given (Plan or dict), else run.json's, else None.
    PlanMismatchError when its world size differs from the traces'."""
    if plan is None:
        data = (traces.run or {}).get("plan")
        if not isinstance(data, dict):
            return None
        try:
            plan = Plan.from_dict(data)
        except SpecError:
            return None
    elif isinstance(plan, dict):
        try:
            plan = Plan.from_dict(plan)
        except SpecError as err:
            raise PlanMismatchError(f"the plan cannot be read: {err}") from None
    if plan.world_size != traces.world_size:
        raise PlanMismatchError(
            f"the plan is dp×tp×pp×cp = {plan.dp}×{plan.tp}×{plan.pp}×{plan.cp} = {plan.world_size} ranks, "
            f"but the traces come from a job of world size {traces.world_size}"
        )
    return plan


class DimLabeler:
    """Labels groups (tuples of global ranks) with a plan's dimension."""

    def __init__(self, plan: Plan | None):
        self.plan = plan
        self.groups: dict[frozenset, str] = {}
        self.member_of: dict[str, list[frozenset]] = {}
        if plan is None:
            return
        topo = Topology(dp=plan.dp, pp=plan.pp, cp=plan.cp, tp=plan.tp, gpus_per_node=1, order=plan.order)
        for dim in PLAN_DIMS:
            if topo.sizes[dim] < 2:
                continue
            sets = [frozenset(int(r) for r in row) for row in topo.group_ranks(dim)]
            self.member_of[dim] = sets
            for s in sets:
                self.groups.setdefault(s, dim)

    def label(self, *, ann_dim: str | None, ranks: tuple | None, op: str, desc: str | None) -> tuple[str, str]:
        """(dim, dim_source) by the precedence in the module docstring."""
        if ann_dim:
            return ann_dim, "annotation"
        if ranks and self.plan is not None:
            key = frozenset(ranks)
            if key in self.groups:
                return self.groups[key], "plan"
            if op in P2P_OPS and len(key) == 2:
                for dim in ("pp", "cp", "dp", "tp"):
                    if any(key <= s for s in self.member_of.get(dim, ())):
                        return dim, "plan"
        dim = dim_from_group_desc(desc)
        if dim:
            return dim, "group_desc"
        return "unknown", "unknown"
