"""Process-group names -> the parallel dimension they serve, in one place.

A process group's description (Flight Recorder's `pg_config[..]["desc"]`, Kineto's `Process Group
Description`) names it as its framework does:
- the engine's own groups: tp, sp, cp, pp, dp, ep (parallel.engine.collectives);
- Megatron-LM's `group_desc=` in megatron/core/parallel_state.py (NVIDIA/Megatron-LM d98e8a6, plus
  the older TENSOR_AND_EXPERT_PARALLEL_GROUP), with their _GLOO, _WITH_GTP_REMAT and
  HIERARCHICAL_..._L<k> variants;
- torchtitan's DeviceMesh axis names in torchtitan/distributed/parallel_dims.py (pytorch/torchtitan
  b5bcd76): dp, dp_replicate, dp_shard, fsdp, efsdp, batch, cp, tp, pp, ep, and the flattened
  dp_shard_cp / dp_cp of earlier releases; a DeviceMesh group is described as "mesh_<name>";
- DDP's and FSDP's own short names (ddp, fsdp).
A group that spans two dimensions (Megatron's TENSOR_AND_DATA_PARALLEL_GROUP, MODEL_PARALLEL_GROUP,
torchtitan's loss mesh) names none: None, and a plan's groups decide (profiler.analyzers.labels).
A data-parallel group that includes the context-parallel ranks (DATA_PARALLEL_GROUP_WITH_CP, dp_cp)
is 'dp': it carries the gradients.

Pure: stdlib only.
"""

from __future__ import annotations

import re

DIMS = ("tp", "sp", "cp", "pp", "dp", "ep")

# Megatron-LM group_desc -> dimension (None: a group of two or more dimensions)
MEGATRON = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EMBEDDING_GROUP": "pp",  # first and last stage: the tied embedding's gradient
    "POSITION_EMBEDDING_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "dp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "tp",  # TP inside the experts
    "EXPERT_DATA_PARALLEL_GROUP": "dp",  # DP of the expert weights
    "EXPERT_GTP_WEIGHT_REMAT_GROUP": None,
    "GTP_WEIGHT_REMAT_GROUP": None,
    "MODEL_PARALLEL_GROUP": None,  # tp x pp
    "TENSOR_AND_DATA_PARALLEL_GROUP": None,
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": None,
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": None,
    "TENSOR_AND_EXPERT_PARALLEL_GROUP": None,
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": None,
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": None,
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": None,
}
# torchtitan DeviceMesh axis names (and DDP's) -> dimension
MESH = {
    "tp": "tp",
    "sp": "sp",
    "cp": "cp",
    "pp": "pp",
    "ep": "ep",
    "dp": "dp",
    "dp_replicate": "dp",
    "dp_shard": "dp",
    "fsdp": "dp",
    "efsdp": "dp",  # FSDP of the expert weights
    "batch": "dp",
    "dp_shard_cp": "dp",
    "dp_cp": "dp",
    "ddp": "dp",
    "loss": None,  # batch x cp
    "world": None,
}
_MEGATRON_VARIANT = re.compile(r"^HIERARCHICAL_|_L\d+$|_GLOO$|_WITH_GTP_REMAT$")


def dim_from_group_desc(desc: object) -> str | None:
    """'tp', 'sp', 'cp', 'pp', 'dp' or 'ep' from a process-group description, None when it names none
    (an unknown name, a group of several dimensions, 'default_pg', 'undefined')."""
    if not isinstance(desc, str) or not desc or len(desc) > 200:
        return None
    name = desc.removeprefix("mesh_")
    if name in MESH:
        return MESH[name]
    if name.lower() in MESH:
        return MESH[name.lower()]
    stem = desc
    while True:
        shorter = _MEGATRON_VARIANT.sub("", stem)
        if shorter == stem:
            break
        stem = shorter
    return MEGATRON.get(stem)
