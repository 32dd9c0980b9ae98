"""What an importer returns: the model, the plan, the world size if the file says it, and an account of
what was read, what was not understood and what was assumed. Pure: stdlib only."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from parallel.core.plan import Plan
from parallel.core.specs import Cluster, Model, SpecError
from runfiles.lines import one_line


class ImportFailed(SpecError):
    """The file cannot become a plan; the message names the file and line (and shows the line)."""


def failure(source: str, line: int | None, message: str, text: str | None = None) -> ImportFailed:
    """`source line N: message` followed by the offending line, indented."""
    source = one_line(source)  # a name may hold newlines or terminal escapes: never split the message
    where = f"{source} line {line}" if line else source
    shown = ""
    if text is not None and line:
        lines = text.splitlines()
        if 0 < line <= len(lines):
            shown = f"\n    {line:>4} | {lines[line - 1].rstrip()}"
    return ImportFailed(f"{where}: {message}{shown}")


@dataclass(frozen=True)
class Imported:
    kind: str  # "megatron" | "torchtitan" | "plan-json"
    source: str  # file name, or "pasted text"
    model: Model | None  # None: a bare plan JSON, the model comes from the caller
    plan: Plan  # dp and global batch resolved for `world_size` (dp = 1 while it is unknown)
    world_size: int | None  # GPUs the file launches on, when it says
    nodes: int | None = None
    gpus_per_node: int | None = None
    cluster: Cluster | None = None  # a plan JSON may carry its whole cluster
    world_from: str = ""  # where the world size came from, or why it is unknown
    recognised: dict = field(default_factory=dict)  # flag or key -> value, as read
    unknown: tuple[str, ...] = ()  # flags or keys this importer does not know (listed, never fatal)
    notes: tuple[str, ...] = ()  # assumptions and approximations, each with its line where it has one
    options: dict = field(default_factory=dict)  # modelling hints besides the plan's fields: swiglu
    global_batch: int | None = None  # None: micro/local batch x dp (Megatron's and torchtitan's default)
    local_batch: int | None = None  # sequences per DP rank per step, when the global batch follows dp
    fsdp_replicate: int | None = None  # torchtitan: FSDP (ZeRO-3) over dp/replicate x cp when that is > 1

    def with_world_size(self, world: int, why: str = "") -> "Imported":
        """The same import on `world` GPUs: dp = world / (tp·pp·cp), and what follows from dp."""
        p = self.plan
        replica = p.tp * p.pp * p.cp
        if world < 1 or world % replica:
            raise ImportFailed(
                f"{self.source}: {why or 'the world size'} gives {world} GPUs, but one model replica "
                f"needs tp×pp×cp = {p.tp}×{p.pp}×{p.cp} = {replica}, which does not divide it; "
                f"set the nodes so that nodes × GPUs per node is a multiple of {replica}"
            )
        dp = world // replica
        gb = self.global_batch or (self.local_batch or p.micro_batch) * dp
        zero = p.zero
        if self.fsdp_replicate is not None:
            if dp % self.fsdp_replicate:
                raise ImportFailed(
                    f"{self.source}: dp = {world}/{replica} = {dp} is not divisible by "
                    f"data_parallel_replicate_degree {self.fsdp_replicate}"
                )
            zero = 3 if dp // self.fsdp_replicate * p.cp > 1 else 0
        plan = dataclasses.replace(p, dp=dp, global_batch=gb, zero=zero)
        return dataclasses.replace(self, plan=plan, world_size=world, world_from=why or self.world_from)

    def summary(self) -> dict:
        """JSON-ready account of the import (the `imported` key of `python -m parallel plan --import --json`)."""
        return {
            "kind": self.kind,
            "source": self.source,
            "model": self.model.name if self.model else None,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "world_from": self.world_from,
            # rows, not a mapping: the flags and keys are the source's names ("--num-layers", "model.name")
            "recognised": [{"option": k, "value": v} for k, v in self.recognised.items()],
            "unknown": list(self.unknown),
            "notes": list(self.notes),
            "options": dict(self.options),
        }
