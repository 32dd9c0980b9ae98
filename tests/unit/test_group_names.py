"""Process-group names -> dimension, pinned to the names Megatron-LM and torchtitan give their groups
(megatron/core/parallel_state.py `group_desc=`, NVIDIA/Megatron-LM d98e8a6; torchtitan/distributed/
parallel_dims.py mesh axes, pytorch/torchtitan b5bcd76), read the same by the trace labels and the
hang diagnosis."""

import json

import pytest

from parallel.core.plan import Plan
from profiler.analyzers.hang import diagnose, load_dumps
from profiler.analyzers.labels import DimLabeler
from profiler.traces.group_names import dim_from_group_desc

MEGATRON = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EMBEDDING_GROUP": "pp",
    "POSITION_EMBEDDING_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_GLOO": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp",
    "DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT": "dp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "dp",
    "HIERARCHICAL_DATA_PARALLEL_GROUP_L1": "dp",
    "HIERARCHICAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO_L0": "dp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "tp",
    "EXPERT_DATA_PARALLEL_GROUP": "dp",
    "EXPERT_DATA_PARALLEL_GROUP_GLOO": "dp",
    "EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "dp",
    # groups of two or more dimensions name none: a plan's groups decide
    "MODEL_PARALLEL_GROUP": None,
    "TENSOR_AND_DATA_PARALLEL_GROUP": None,
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": None,
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": None,
    "TENSOR_AND_EXPERT_PARALLEL_GROUP": None,  # Megatron-LM before the expert groups were renamed
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": None,
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": None,
    "EXPERT_GTP_WEIGHT_REMAT_GROUP": None,
    "GTP_WEIGHT_REMAT_GROUP": None,
    "HYBRID_DP_CP_GROUP_4": None,
}
TORCHTITAN = {
    "dp": "dp", "dp_replicate": "dp", "dp_shard": "dp", "fsdp": "dp", "efsdp": "dp", "batch": "dp",
    "dp_shard_cp": "dp", "dp_cp": "dp", "tp": "tp", "cp": "cp", "pp": "pp", "ep": "ep", "loss": None,
    "world": None,
}  # fmt: skip
OTHERS = {"ddp": "dp", "sp": "sp", "default_pg": None, "undefined": None, "": None, "TENSOR": None, "mytp": None}
TABLE = {**MEGATRON, **TORCHTITAN, **{f"mesh_{k}": v for k, v in TORCHTITAN.items()}, **OTHERS}


@pytest.mark.parametrize(("name", "dim"), TABLE.items(), ids=list(TABLE))
def test_group_name_names_its_dimension(name, dim):
    assert dim_from_group_desc(name) == dim
    # the trace labels read the same table when no plan decides
    assert DimLabeler(None).label(ann_dim=None, ranks=(0, 1), op="all_reduce", desc=name) == (
        (dim, "group_desc") if dim else ("unknown", "unknown")
    )


@pytest.mark.parametrize("name", ["TENSOR_AND_DATA_PARALLEL_GROUP", "mesh_loss", "undefined"])
def test_hang_and_labels_match_a_group_to_the_plan_alike(tmp_path, name):
    """A group whose name says nothing (or two dimensions) takes the plan's dimension whose group has
    its ranks, in the hang diagnosis as in the trace labels (one matcher: labels.DimLabeler)."""
    plan = Plan(dp=2, tp=2, global_batch=4)
    for rank in range(4):
        group = [rank - rank % 2, rank - rank % 2 + 1]  # the TP pair
        entry = {"process_group": ["7", name], "collective_seq_id": 1, "profiling_name": "nccl:all_reduce",
                 "input_sizes": [[4]], "output_sizes": [[4]], "state": "scheduled"}  # fmt: skip
        dump = {"pg_config": {"7": {"name": "7", "desc": name, "ranks": str(group)}}, "entries": [entry] * (rank != 3)}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(dump))
    report = diagnose(load_dumps(tmp_path), plan=plan)
    label = DimLabeler(plan).label(ann_dim=None, ranks=(2, 3), op="all_reduce", desc=name)
    assert report["suspects"][0]["rank"] == 3 and report["suspects"][0]["dim"] == label[0] == "tp"
