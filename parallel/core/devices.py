"""Accelerators: the published peaks and bandwidths a per-operator compute model needs, per device,
and the kernel efficiencies measured against them.

Each preset carries the vendor's dense (no sparsity) tensor-core peaks, its HBM bandwidth and its
multiprocessor count, and what real kernels reach of them:

    gemm_efficiency       a large GEMM's main loop under sustained load, as a fraction of the bf16
                          (fp8) peak: parallel.core.compute adds the shape's own losses on top. On the
                          H200 (and the H100, the same Hopper chip) measured by bench/gpu_kernels.py:
                          0.729 bf16, 0.718 fp8, fitted over 368 / 121 shapes. Elsewhere the "maximum
                          achievable matmul FLOPS" (MAMF, stas00/ml-engineering compute/accelerator/
                          README.md: the best shape's burst) times the ratio the H200 showed between the
                          two (0.729 / 0.803 bf16, 0.718 / 0.734 fp8): a burst at the best shape runs
                          cooler and at a higher clock than hours of training.
    attention_efficiency  flash attention's forward + backward with a fused (cuDNN / Transformer Engine
                          / FlashAttention-3 class) kernel, as the fraction of the bf16 peak it tends to
                          at long sequences (model FLOPs: causal half, backward twice the forward):
                          0.493 on the H200 with cuDNN (bench/gpu_kernels.py); A100: FlashAttention-2,
                          ~0.62 of 312 at 16k (Dao 2023, Fig. 6)
    fa2_efficiency        the same with FlashAttention-2, PyTorch SDPA's flash back end (0.284 on the
                          H200); PyTorch made cuDNN SDPA opt-in from 2.5 to 2.9 (pytorch/pytorch#138522)
    memory_efficiency     the fraction of HBM bandwidth element-wise kernels stream at: 0.76 on the
                          H200 (copy, add, GeLU, LayerNorm, SiLU x mul: 0.59-0.91, geometric mean)
    host_link_bytes_per_s the link to host memory, per direction (activation offloading's copies):
                          PCIe x16 (the datasheets' "PCIe Gen5: 128 GB/s", "Gen4: 64 GB/s", both
                          directions) at PCIE_PAYLOAD of its raw rate, or Grace-Blackwell's NVLink-C2C
                          (GB200 / GB300 NVL72 datasheets: 900 GB/s, both directions)

Where a preset's value rests on another device's measurement it says so.

Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from parallel.core.files import NotARegularFile, TooLarge, read_bounded
from parallel.core.specs import CLUSTERS, GB, Cluster, SpecError, _from_dict

# the least fraction of peak any efficiency may claim: 0.1%, below any kernel measured; a smaller one
# (5e-324 passes "> 0") turns step times into inf and their comparisons into nan
MIN_EFFICIENCY = 1e-3


@dataclass(frozen=True)
class Device:
    name: str
    bf16_flops: float  # dense bf16/fp16 tensor-core FLOP/s
    fp8_flops: float | None  # dense fp8 FLOP/s; None: no fp8 tensor cores (FP8 runs as bf16)
    hbm_bytes_per_s: float
    memory_bytes: int
    sms: int  # streaming multiprocessors (NVIDIA) / compute units (AMD): one GEMM tile each at a time
    gemm_efficiency: float  # MAMF / bf16 peak
    fp8_gemm_efficiency: float | None = None  # MAMF / fp8 peak
    attention_efficiency: float = 0.493
    memory_efficiency: float = 0.76
    source: str = ""
    fa2_efficiency: float | None = None  # None: the fused kernel's (where FlashAttention-2 is the best there is)
    host_link_bytes_per_s: float = 0.0  # to host memory, per direction; 0: unknown (PCIE_GEN5 assumed)

    def __post_init__(self):
        if self.fa2_efficiency is None:
            object.__setattr__(self, "fa2_efficiency", self.attention_efficiency)
        for name in ("bf16_flops", "hbm_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise SpecError(f"Device.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("gemm_efficiency", "attention_efficiency", "memory_efficiency"):
            if not MIN_EFFICIENCY <= getattr(self, name) <= 1:
                raise SpecError(f"Device.{name} must be in [{MIN_EFFICIENCY}, 1], got {getattr(self, name)!r}")

    @property
    def host_link(self) -> float:
        """Bytes per second each way to host memory: the preset's, else PCIe Gen5's (PCIE_GEN5)."""
        return self.host_link_bytes_per_s or PCIE_GEN5

    def peak(self, fp8: bool) -> float:
        """The dense tensor-core peak GEMMs of that precision run against (fp8 falls back to bf16)."""
        return self.fp8_flops if fp8 and self.fp8_flops else self.bf16_flops

    def gemm_max(self, fp8: bool) -> float:
        if fp8 and self.fp8_flops:
            return self.fp8_gemm_efficiency or self.gemm_efficiency
        return self.gemm_efficiency

    def scaled(self, bf16_flops: float) -> "Device":
        """The same device at another bf16 peak (a cluster's --peak-tflops): fp8 scales with it."""
        if bf16_flops == self.bf16_flops:
            return self
        ratio = bf16_flops / self.bf16_flops
        fp8 = self.fp8_flops * ratio if self.fp8_flops else None
        return dataclasses.replace(
            self, name=f"{self.name} (peak {bf16_flops / 1e12:.0f} TFLOP/s)", bf16_flops=bf16_flops, fp8_flops=fp8
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Device":
        return _from_dict(cls, data)


# Host links, per direction. PCIe x16 carries 64 GB/s (Gen5) or 32 GB/s (Gen4) raw each way; pinned
# host copies move about 55 GB/s of it on Gen5 (PCIE_PAYLOAD: 128b/130b coding and TLP headers): an
# estimate, not a measurement of ours. NVLink-C2C: the GB200 / GB300 datasheets' 900 GB/s, both ways.
PCIE_PAYLOAD = 55 / 64
PCIE_GEN5 = 64 * GB * PCIE_PAYLOAD
PCIE_GEN4 = 32 * GB * PCIE_PAYLOAD
NVLINK_C2C = 450 * GB
MAMF = "MAMF: stas00/ml-engineering compute/accelerator/README.md"
MEASURED = "bench/gpu_kernels.py on an H200"
BURST_TO_SUSTAINED = {"bf16": 0.729 / 0.803, "fp8": 0.718 / 0.734}  # H200: measured main loop / MAMF


def _sustained(mamf: float, dtype: str = "bf16") -> float:
    return round(mamf * BURST_TO_SUSTAINED[dtype], 3)


DEVICES: dict[str, Device] = {
    # NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, no fp8; 40 GB HBM2 at 1,555 GB/s, 80 GB HBM2e at
    # 2,039 GB/s; 108 SMs. MAMF 271.2 TFLOP/s (86.9%). FlashAttention-2 fwd+bwd ~0.62 of peak at 16k.
    "a100-sxm-40gb": Device(
        "a100-sxm-40gb",
        312e12,
        None,
        1555 * GB,
        40 * 10**9,
        108,
        _sustained(0.869),
        None,
        0.65,
        0.76,
        f"NVIDIA A100 datasheet; {MAMF} (A100 SXM 86.9%); FlashAttention-2 (Dao 2023) Fig. 6; {MEASURED} ratios",
        host_link_bytes_per_s=PCIE_GEN4,
    ),
    "a100-sxm-80gb": Device(
        "a100-sxm-80gb",
        312e12,
        None,
        2039 * GB,
        80 * 10**9,
        108,
        _sustained(0.869),
        None,
        0.65,
        0.76,
        f"NVIDIA A100 datasheet; {MAMF} (A100 SXM 86.9%); FlashAttention-2 (Dao 2023) Fig. 6; {MEASURED} ratios",
        host_link_bytes_per_s=PCIE_GEN4,
    ),
    # NVIDIA H100 datasheet (SXM5): 989 TFLOP/s dense bf16, 1,979 fp8; 80 GB HBM3 at 3.35 TB/s; 132
    # SMs. Kernel efficiencies: the H200's, the same chip (its clocks and tensor cores), measured.
    "h100-sxm": Device(
        "h100-sxm",
        989e12,
        1979e12,
        3350 * GB,
        80 * 10**9,
        132,
        0.729,
        0.718,
        0.493,
        0.76,
        f"NVIDIA H100 datasheet; kernel efficiencies {MEASURED} (the same Hopper chip)",
        fa2_efficiency=0.284,
        host_link_bytes_per_s=PCIE_GEN5,
    ),
    # NVIDIA H200 datasheet: H100's tensor cores with 141 GB HBM3e at 4.8 TB/s.
    "h200-sxm": Device(
        "h200-sxm",
        989e12,
        1979e12,
        4800 * GB,
        141 * 10**9,
        132,
        0.729,
        0.718,
        0.493,
        0.76,
        f"NVIDIA H200 datasheet; kernel efficiencies {MEASURED}",
        fa2_efficiency=0.284,
        host_link_bytes_per_s=PCIE_GEN5,
    ),
    # NVIDIA HGX B200: 2.25 PFLOP/s dense bf16, 4.5 fp8; 180 GB HBM3e at 8 TB/s; 148 SMs. MAMF bf16
    # 1,745 (77.6%), fp8 3,432.5 (76.3%). Attention and memory: Hopper's measured fractions.
    "b200": Device(
        "b200",
        2250e12,
        4500e12,
        8000 * GB,
        180 * 10**9,
        148,
        _sustained(0.776),
        _sustained(0.763, "fp8"),
        0.493,
        0.76,
        f"NVIDIA HGX B200 datasheet; {MAMF} (B200 bf16 77.6%, fp8 76.3%); attention as Hopper's",
        host_link_bytes_per_s=PCIE_GEN5,
    ),
    # NVIDIA GB200 NVL72: 2.5 PFLOP/s dense bf16, 5 fp8 per GPU; 186 GB HBM3e at 8 TB/s. MAMF bf16
    # 1,822 (72.9%), fp8 3,615.6 (72.3%).
    "gb200": Device(
        "gb200",
        2500e12,
        5000e12,
        8000 * GB,
        186 * 10**9,
        148,
        _sustained(0.729),
        _sustained(0.723, "fp8"),
        0.493,
        0.76,
        f"NVIDIA GB200 NVL72 datasheet; {MAMF} (GB200 bf16 72.9%, fp8 72.3%); attention as Hopper's",
        host_link_bytes_per_s=NVLINK_C2C,
    ),
    # NVIDIA GB300 NVL72 (Blackwell Ultra): 2.5 PFLOP/s dense bf16, 5 fp8; 288 GB HBM3e at 8 TB/s;
    # 160 SMs. MAMF of B300 (bf16 78.6%, fp8 74.5%), the same chip.
    "gb300": Device(
        "gb300",
        2500e12,
        5000e12,
        8000 * GB,
        288 * 10**9,
        160,
        _sustained(0.786),
        _sustained(0.745, "fp8"),
        0.493,
        0.76,
        f"NVIDIA GB300 NVL72 datasheet; {MAMF} (B300 bf16 78.6%, fp8 74.5%); attention as Hopper's",
        host_link_bytes_per_s=NVLINK_C2C,
    ),
    # AMD Instinct MI300X datasheet: 1,307.4 TFLOP/s dense bf16, 2,614.9 fp8; 192 GB HBM3 at 5.3
    # TB/s; 304 CUs. MAMF bf16 668.4 (51.4%, ROCm 6.3); fp8, attention and memory fractions assumed.
    "mi300x": Device(
        "mi300x",
        1307.4e12,
        2614.9e12,
        5300 * GB,
        192 * 10**9,
        304,
        _sustained(0.514),
        _sustained(0.514, "fp8"),
        0.3,
        0.7,
        f"AMD MI300X datasheet; {MAMF} (MI300X bf16 51.4%); fp8, attention and memory assumed",
        host_link_bytes_per_s=PCIE_GEN5,
    ),
}


def device_preset(name: str) -> Device:
    try:
        return DEVICES[name]
    except KeyError:
        raise SpecError(f"unknown device {name!r}; known: {', '.join(DEVICES)}") from None


def cluster_device(cluster: Cluster) -> Device:
    """The accelerator of `cluster` (its `gpu` preset) at the cluster's bf16 peak. A cluster that names
    none is a generic GPU of its peak with H100's efficiencies and H100's FLOP-per-byte ratio for its
    HBM bandwidth (989 TFLOP/s : 3.35 TB/s), an assumption the name says."""
    if cluster.gpu:
        return device_preset(cluster.gpu).scaled(cluster.peak_flops)
    h100 = DEVICES["h100-sxm"]
    ratio = cluster.peak_flops / h100.bf16_flops
    return dataclasses.replace(
        h100,
        name=f"generic GPU of {cluster.peak_flops / 1e12:.0f} TFLOP/s (H100's efficiencies and FLOP/byte)",
        bf16_flops=cluster.peak_flops,
        fp8_flops=h100.fp8_flops * ratio,
        hbm_bytes_per_s=h100.hbm_bytes_per_s * ratio,
        memory_bytes=cluster.gpu_memory_bytes,
        source="assumed: H100's efficiencies, bandwidth scaled with the peak",
    )


# what a trace's deviceProperties (torch.cuda.get_device_name) call each preset, most specific first
_NAMES = (
    ("gb300", "gb300"),
    ("gb200", "gb200"),
    ("b200", "b200"),
    ("h200", "h200-sxm"),
    ("h100", "h100-sxm"),
    ("a100-sxm4-40gb", "a100-sxm-40gb"),
    ("a100 40gb", "a100-sxm-40gb"),
    ("a100", "a100-sxm-80gb"),
    ("mi300x", "mi300x"),
)


def device_for_name(name: str | None) -> str | None:
    """The preset of a GPU by the name PyTorch reports ('NVIDIA H100 80GB HBM3' -> h100-sxm), or None."""
    low = (name or "").lower().replace("_", " ")
    return next((key for part, key in _NAMES if part in low), None)


def cluster_for_device(name: str | None) -> str | None:
    """The cluster preset built of the GPU PyTorch names ('NVIDIA H100 80GB HBM3' -> dgx-h100), or None."""
    key = device_for_name(name)
    return next((c.name for c in CLUSTERS.values() if key and c.gpu == key), None)


def device_from_fit(data: object) -> Device:
    """The fitted Device of a profiler.analyzers.device_fit.DeviceFit.to_dict() (or a calib.json holding one under "device_fit");
    SpecError naming what is wrong."""
    if isinstance(data, dict) and isinstance(data.get("device_fit"), dict):
        data = data["device_fit"]
    if not isinstance(data, dict) or "device" not in data:
        raise SpecError(
            'a device fit is a JSON object with "device" and its efficiencies (profiler calibrate --kernels)'
        )
    name = data["device"]
    if not isinstance(name, str) or name not in DEVICES:
        raise SpecError(f"device fit: unknown device {name!r}; one of {', '.join(DEVICES)}")
    values = {}
    for key in (
        "gemm_efficiency",
        "fp8_gemm_efficiency",
        "attention_efficiency",
        "fa2_efficiency",
        "memory_efficiency",
    ):
        v = data.get(key)
        if v is None:
            continue
        if (
            not isinstance(v, (int, float))
            or isinstance(v, bool)
            or not math.isfinite(v)
            or not MIN_EFFICIENCY <= v <= 1
        ):
            raise SpecError(f"device fit: {key} must be a number in [{MIN_EFFICIENCY}, 1], got {v!r}")
        values[key] = float(v)
    return dataclasses.replace(DEVICES[name], name=f"{name}, fitted", **values)


MAX_DEVICE_FIT_BYTES = 1 << 20  # a device fit is a few hundred bytes


def read_device_fit(path: str) -> Device:
    """The fitted Device in the JSON file at `path`, read bounded from a regular file only (a FIFO
    would block); SpecError saying what is wrong."""
    try:
        data = read_bounded(path, MAX_DEVICE_FIT_BYTES)
    except NotARegularFile:
        raise SpecError("not a regular file") from None
    except FileNotFoundError:
        raise SpecError("no such file") from None
    except TooLarge:
        raise SpecError(f"larger than {MAX_DEVICE_FIT_BYTES >> 10} KiB: not a device fit") from None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise SpecError(f"not valid JSON ({err})") from None
    return device_from_fit(doc)
