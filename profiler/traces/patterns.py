"""Every name and category pattern that classifies a Kineto event, in one place.

The loader runs `classify(cat, name)` once per distinct (category, name) pair and stores the
result as the `kind` and `op` columns; analyzers only read those columns. Kinds:

    compute      GPU kernel that is not communication
    comm         GPU communication kernel (NCCL, RCCL, symmetric memory, vLLM custom all-reduce)
    memcpy       GPU memcpy            memset   GPU memset
    gpu_annotation  gpu_user_annotation (a CPU range mirrored on the GPU timeline)
    runtime      CUDA/HIP runtime or driver call on a CPU thread (cudaLaunchKernel, ...)
    cpu_comm     CPU side of a collective: record_param_comms, c10d::*, nccl:*, gloo:*, symm_mem::*
    ps_comm      our collective annotation (runfiles.annotations: ``ps.comm dim=.. op=..``)
    ps_phase     our phase annotation (``ps.phase kind=fwd mb=..``)
    step         ``ProfilerStep#N``
    cpu_op       any other CPU operator        annotation  any other user annotation
    python       python_function (with_stack)  other       anything else (Trace span, overhead)

`op` is one of OPS for comm, cpu_comm and ps_comm events, and empty for the rest.

Pure: stdlib only.
"""

from __future__ import annotations

import re
from functools import lru_cache

from runfiles.annotations import COMM_PREFIX, PHASE_PREFIX, parse_comm

OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "send",
    "recv",
    "broadcast",
    "reduce",
    "barrier",
    "other",
)
KINDS = (
    "compute",
    "comm",
    "memcpy",
    "memset",
    "gpu_annotation",
    "runtime",
    "cpu_comm",
    "ps_comm",
    "ps_phase",
    "step",
    "cpu_op",
    "annotation",
    "python",
    "other",
)
GPU_KINDS = frozenset({"compute", "comm", "memcpy", "memset", "gpu_annotation"})
COMM_KINDS = frozenset({"comm", "cpu_comm", "ps_comm"})

# Kineto categories across versions (older traces say "Kernel", "Memcpy", "Runtime", "Operator").
CATEGORY_ALIASES = {
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_runtime",
    "hip_runtime": "cuda_runtime",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
}

# --- GPU communication kernels --------------------------------------------------------------
# NCCL, three generations of kernel signature (the op is the word after the prefix):
#   1  ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)                     (NCCL <= 2.11)
#   2  ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)
#   3  ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)      (NCCL >= 2.19)
NCCL_KERNEL = re.compile(r"^(?:void )?nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)")
# RCCL (ROCm) names its generic kernel without the op; the op then comes from the CPU launch.
RCCL_KERNEL = re.compile(r"rccl|^(?:void )?ncclDevKernel_Generic", re.IGNORECASE)
# torch symmetric memory (torch.distributed._symmetric_memory) and vLLM's custom all-reduce.
SYMM_MEM_KERNEL = re.compile(
    r"(?:multimem|one_shot|two_shot)_(?:one_shot_)?(?P<op>all_reduce|all_gather|reduce_scatter)\w*_kernel"
)
CUSTOM_ALLREDUCE_KERNEL = re.compile(r"cross_device_reduce_\dstage")
MEMCPY_NAME = re.compile(r"^Memcpy")
MEMSET_NAME = re.compile(r"^Memset")

# --- CPU side of collectives ----------------------------------------------------------------
RECORD_PARAM_COMMS = "record_param_comms"
C10D_OP = re.compile(r"^_?c10d(?:_functional)?::(?P<op>\w+)$")  # c10d::allreduce_, _c10d_functional::all_reduce
NCCL_CPU_OP = re.compile(r"^nccl:(?P<op>\w+)$")  # nccl:all_reduce, nccl:_all_gather_base
GLOO_CPU_OP = re.compile(r"^gloo:(?P<op>\w+)$")  # gloo:all_reduce (runs on a gloo worker thread)
SYMM_MEM_CPU_OP = re.compile(r"^symm_mem::(?P<op>\w*(?:all_reduce|all_gather|reduce_scatter)\w*)$")
NOT_A_COLLECTIVE = re.compile(r"wait|get_|_set|register|rendezvous|new_group", re.IGNORECASE)

PROFILER_STEP = re.compile(r"^ProfilerStep#(?P<step>\d+)$")

# --- operators whose recorded shapes tell the model (record_shapes: their "Input Dims") -------------
# The GEMMs (nn.Linear, x @ W, the batched attention products), the fused attention entry points
# (SDPA in each backend, FlashAttention's own op) and the embedding lookup; backward ops excluded.
SHAPE_OP = re.compile(
    r"^(?:aten::(?:linear|matmul|mm|addmm|bmm|baddbmm|embedding|_?scaled_dot_product_\w*attention\w*|"
    r"_flash_attention_forward|_efficient_attention_forward)|flash_attn\w*::\w*(?:fwd|forward)\w*)$"
)


# The optimizer's step: torch.optim's own range (Optimizer.step#AdamW.step) or our engine's phase.
OPTIMIZER_RANGE = re.compile(r"^Optimizer\.step#|^ps\.phase kind=optim\b")
# GEMM and attention CPU operators (a CPU job's compute by kernel class: its GPU kernels' classes
# are profiler.analyzers.device_fit's).
GEMM_CPU_OP = re.compile(r"^aten::(?:linear|matmul|mm|addmm|bmm|baddbmm)$")
ATTENTION_CPU_OP = re.compile(r"scaled_dot_product|flash_attn|_flash_attention|_efficient_attention")


def shape_op(name: object) -> bool:
    """Whether a CPU operator of this name has its input shapes kept (SHAPE_OP, never a backward op)."""
    return isinstance(name, str) and "backward" not in name and SHAPE_OP.match(name) is not None


# Collective op tokens in every spelling seen (AllReduce, allreduce_, _allgather_base, all_to_all,
# reduce_scatter_tensor_coalesced, SendRecv, recv_any_source_ ...), matched after lower-casing and
# dropping underscores. Order matters: the longer, more specific token first.
_OP_TOKENS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
)

# Bytes per element for the dtype strings of record_param_comms / kernel args and Input type.
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::bfloat16": 2,
    "c10::half": 2,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "long int": 8,
    "short": 2,
    "int16": 2,
    "byte": 1,
    "uint8": 1,
    "unsigned char": 1,
    "char": 1,
    "int8": 1,
    "signed char": 1,
    "bool": 1,
    "complexfloat": 8,
    "complexdouble": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}


def normalize_op(token: str | None) -> str:
    """The op of any collective spelling: 'AllReduce', '_allgather_base' -> all_reduce, all_gather."""
    if not token:
        return "other"
    flat = token.lower().replace("_", "").replace(" ", "")
    for key, op in _OP_TOKENS:
        if key in flat:
            return op
    return "other"


def comm_kernel_op(name: str) -> str | None:
    """The op of a communication kernel name, 'other' when the name does not say, None if not comm."""
    m = NCCL_KERNEL.match(name)
    if m:
        op = normalize_op(m["op"])
        return "other" if m["op"] == "Generic" else op
    m = SYMM_MEM_KERNEL.search(name)
    if m:
        return m["op"]
    if CUSTOM_ALLREDUCE_KERNEL.search(name):
        return "all_reduce"
    if RCCL_KERNEL.search(name):
        return "other"
    return None


def cpu_comm_op(name: str) -> str | None:
    """The op of a CPU-side collective event, or None when the name is not one."""
    if name == RECORD_PARAM_COMMS:
        return "other"  # the op is in its args ("Collective name")
    for pattern in (C10D_OP, NCCL_CPU_OP, GLOO_CPU_OP, SYMM_MEM_CPU_OP):
        m = pattern.match(name)
        if m:
            if NOT_A_COLLECTIVE.search(m["op"]):
                return None
            return normalize_op(m["op"])
    return None


def profiler_step(name: str) -> int | None:
    m = PROFILER_STEP.match(name)
    return int(m["step"]) if m else None


@lru_cache(maxsize=1 << 16)
def classify(cat: str, name: str) -> tuple[str, str]:
    """(kind, op) of one event from its Kineto category and name; op is '' for non-comm kinds."""
    cat = CATEGORY_ALIASES.get(cat.lower(), cat.lower()) if isinstance(cat, str) else ""
    if cat == "kernel":
        op = comm_kernel_op(name)
        return ("comm", op) if op is not None else ("compute", "")
    if cat == "gpu_memcpy" or (cat == "" and MEMCPY_NAME.match(name)):
        return "memcpy", ""
    if cat == "gpu_memset" or (cat == "" and MEMSET_NAME.match(name)):
        return "memset", ""
    if cat == "gpu_user_annotation":
        return "gpu_annotation", ""
    if cat == "cuda_runtime":
        return "runtime", ""
    if cat == "python_function":
        return "python", ""
    if cat in ("cpu_op", "user_annotation"):
        if name.startswith(COMM_PREFIX):
            label = parse_comm(name)
            return ("ps_comm", label.op) if label else ("annotation", "")
        if name.startswith(PHASE_PREFIX):
            return "ps_phase", ""
        if PROFILER_STEP.match(name):
            return "step", ""
        op = cpu_comm_op(name)
        if op is not None:
            return "cpu_comm", op
        return ("cpu_op", "") if cat == "cpu_op" else ("annotation", "")
    return "other", ""


def dtype_bytes(dtype: object) -> int | None:
    """Bytes per element of a dtype string ('Float', 'c10::BFloat16', 'unsigned char'), or None."""
    if not isinstance(dtype, str):
        return None
    return DTYPE_BYTES.get(dtype.strip().lower())
