"""Model and cluster descriptions (frozen dataclasses with JSON round trip) and their presets.

Pure: stdlib only. A `Model` is the transformer's shape; a `Cluster` is hosts of GPUs grouped into
NVLink domains: GPUs of one domain talk over the fast link (NVLink), GPUs of different domains over
the scale-out link (InfiniBand), each given per GPU per direction. A domain is one host on a DGX/HGX
(8 GPUs) and a whole rack on a GB200/GB300 NVL72 (72 GPUs over 18 hosts of 4).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

GB = 1e9
GiB = 2**30


class SpecError(ValueError):
    """A model, cluster or plan field that cannot be right on its own (a negative size, an unknown name)."""


# Shapes past any model (the largest published: hidden 25,600, 128 layers, 1M-token contexts, 256k vocabularies)
# by orders of magnitude: a bound keeps every product the model forms an exact, finite number.
SHAPE_LIMITS = {
    "layers": 1 << 16,
    "hidden": 1 << 20,
    "heads": 1 << 16,
    "kv_heads": 1 << 16,
    "ffn_hidden": 1 << 24,
    "vocab": 1 << 26,
    "seq_len": 1 << 28,
    "dtype_bytes": 8,
    "vocab_divisor": 1 << 16,
    "attention_head_dim": 1 << 16,
    "experts": 1 << 16,
    "expert_ffn": 1 << 24,
    "shared_expert_ffn": 1 << 24,
    "top_k": 1 << 16,
    "moe_every": 1 << 16,
    "dense_layers": 1 << 16,
    "q_lora_rank": 1 << 20,
    "kv_lora_rank": 1 << 20,
    "qk_pos_head_dim": 1 << 16,
    "v_head_dim": 1 << 16,
}


def _positive(obj, *names):
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}")
        limit = SHAPE_LIMITS.get(name) if isinstance(obj, Model) else None
        if limit is not None and value > limit:
            raise SpecError(f"{type(obj).__name__}.{name} {value:,} is past any model: at most {limit:,}")


def _from_dict(cls, data: dict, nested: dict | None = None):
    """Builds a dataclass from a dict, naming unknown keys instead of ignoring them."""
    if not isinstance(data, dict):
        raise SpecError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    kwargs = dict(data)
    for key, sub in (nested or {}).items():
        if key in kwargs and isinstance(kwargs[key], dict):
            kwargs[key] = sub.from_dict(kwargs[key])
    try:
        return cls(**kwargs)
    except TypeError as err:  # a missing required field
        raise SpecError(f"{cls.__name__}: {err}") from None


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer. Activation-memory formulas read these names as the paper does:
    L = layers, h = hidden, a = heads, s = seq_len, v = vocab."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None  # GQA query groups; None = heads (plain multi-head attention)
    ffn_hidden: int | None = None  # None = 4 * hidden (GPT)
    dtype_bytes: int = 2  # bf16/fp16 activations and weights
    # "gpt": LayerNorm, biases, GeLU MLP (2 matrices), learned positions, tied embeddings.
    # "llama": RMSNorm, no biases, SwiGLU MLP (3 matrices), RoPE, untied output layer.
    arch: str = "gpt"
    # Whether the model trains with dropout (after the softmax and on both residual branches, as
    # Table 2 assumes). GPT-3 does; Llama 3 does not (its released training config has none).
    dropout: bool = True
    # Mixture of experts (Shazeer et al. 2017; Fedus et al. 2022, Switch): `experts` routed experts per
    # MoE layer (0: a dense model), each token sent to `top_k` of them; each expert an MLP of width
    # `expert_ffn` (None: ffn_hidden), plus always-on shared experts of total width `shared_expert_ffn`
    # (DeepSeek, Llama 4); a router of hidden x experts. Layers: the first `dense_layers` are dense,
    # then every `moe_every`-th layer is MoE (Llama 4 Maverick alternates: 2), the others dense of ffn_hidden.
    experts: int = 0
    top_k: int = 1
    expert_ffn: int | None = None
    shared_expert_ffn: int = 0
    moe_every: int = 1
    dense_layers: int = 0
    # Width of one attention head; None = hidden / heads. Qwen3 uses 128 whatever its hidden (its Q
    # is heads * 128 wide, not hidden); Megatron-LM's --kv-channels.
    attention_head_dim: int | None = None
    # Whether the output layer shares the input embedding's weights; None = the arch's way (GPT ties,
    # Llama does not). Qwen3's small models (0.6B-4B) tie theirs.
    tie_embeddings: bool | None = None
    # Megatron-LM pads the vocabulary to a multiple of --make-vocab-size-divisible-by (128) x tp, so
    # every TP rank holds an equal slice of the embedding and the logits (megatron/training/
    # tokenizer: _vocab_size_with_padding); 1 = no padding (torchtitan, this project's engine).
    vocab_divisor: int = 128
    # Which layers are MoE, one 0/1 per layer (Megatron-LM's --moe-layer-freq: an int N gives layer i
    # MoE when i % N == 0, a list gives the pattern itself; megatron/core/models/gpt/
    # gpt_layer_specs.py). None: the first dense_layers dense, then every moe_every-th layer.
    moe_pattern: tuple[int, ...] | None = None
    # Group-limited routing (DeepSeek-V2 Sec. 2.1.2 device-limited, DeepSeek-V3 Sec. 2.1.2 node-
    # limited; Megatron-LM's --moe-router-num-groups / --moe-router-group-topk): the experts split
    # into `router_groups` equal groups of consecutive experts, each token routed inside the
    # `router_group_topk` groups of the highest scores only; 0 = no group limit. DeepSeek-V3: 8, 4.
    router_groups: int = 0
    router_group_topk: int = 0
    # Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, Sec. 2.1;
    # Megatron-LM's --multi-latent-attention, megatron/core/transformer/multi_latent_attention.py):
    # K and V are up-projected per head from one kv_lora_rank-wide latent of each token (0: not MLA),
    # Q from a q_lora_rank-wide one (0: Q projected from the hidden state directly); each head's query
    # and key are head_dim (--qk-head-dim) + qk_pos_head_dim (--qk-pos-emb-head-dim) wide, the RoPE
    # part of the key shared by all heads and projected with the latent; each value v_head_dim wide
    # (--v-head-dim; None: head_dim). The down projections and the latents' RMSNorms are replicated
    # over TP (Transformer Engine's "duplicated" linear), the up projections split by heads.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_pos_head_dim: int = 0
    v_head_dim: int | None = None

    def __post_init__(self):
        _positive(self, "layers", "hidden", "heads", "vocab", "seq_len", "dtype_bytes", "vocab_divisor")
        if not isinstance(self.dropout, bool):
            raise SpecError(f"Model.dropout must be true or false, got {self.dropout!r}")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _positive(self, "kv_heads", "ffn_hidden")
        # attention_head_dim and expert_ffn stay None when they follow hidden/heads and ffn_hidden,
        # so a copy with another hidden or ffn_hidden (dataclasses.replace, CLI overrides) follows too
        if self.attention_head_dim is None and self.hidden % self.heads:
            raise SpecError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.attention_head_dim is not None:
            _positive(self, "attention_head_dim")
        if self.heads % self.kv_heads:
            raise SpecError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.arch not in ("gpt", "llama"):
            raise SpecError(f"arch must be 'gpt' or 'llama', got {self.arch!r}")
        _positive(self, "top_k", "moe_every")
        if self.expert_ffn is not None:
            _positive(self, "expert_ffn")
        for name in ("experts", "shared_expert_ffn", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"Model.{name} must be a non-negative integer, got {value!r}")
            if value > SHAPE_LIMITS[name]:
                raise SpecError(f"Model.{name} {value:,} is past any model: at most {SHAPE_LIMITS[name]:,}")
        if self.experts and self.top_k > self.experts:
            raise SpecError(f"top_k {self.top_k} is more than the {self.experts} experts")
        if self.dense_layers > self.layers:
            raise SpecError(f"dense_layers {self.dense_layers} is more than the {self.layers} layers")
        self._check_moe_pattern()
        self._check_router_groups()
        self._check_mla()

    def _check_moe_pattern(self):
        if self.moe_pattern is None:
            return
        if isinstance(self.moe_pattern, (str, bytes)) or not hasattr(self.moe_pattern, "__len__"):
            raise SpecError(f"Model.moe_pattern must be a list of 0/1 per layer, got {self.moe_pattern!r}")
        pattern = tuple(self.moe_pattern)
        if any(isinstance(v, bool) or v not in (0, 1) for v in pattern):
            raise SpecError("Model.moe_pattern must hold only 0 (dense layer) and 1 (MoE layer)")
        if len(pattern) != self.layers:
            raise SpecError(f"Model.moe_pattern has {len(pattern)} entries for {self.layers} layers")
        if self.dense_layers or self.moe_every != 1:
            raise SpecError("Model.moe_pattern says which layers are MoE: leave dense_layers and moe_every unset")
        object.__setattr__(self, "moe_pattern", pattern)  # hashable, and equal after a JSON round trip

    def _check_router_groups(self):
        g, k = self.router_groups, self.router_group_topk
        for name, value in (("router_groups", g), ("router_group_topk", k)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SHAPE_LIMITS["experts"]:
                raise SpecError(f"Model.{name} must be a non-negative integer, got {value!r}")
        if not self.experts or (not g and not k):  # a dense model routes nothing (as its top_k says nothing)
            return
        if not g or self.experts % g:
            raise SpecError(f"Model.router_groups {g} must divide the {self.experts} experts")
        if not 1 <= k <= g or self.top_k > k * (self.experts // g):
            raise SpecError(
                f"Model.router_group_topk {k} must be 1 to the {g} groups and hold top_k {self.top_k} experts "
                f"({self.experts // g} a group), as Megatron-LM's group-limited router requires"
            )

    def _check_mla(self):
        for name in ("kv_lora_rank", "q_lora_rank", "qk_pos_head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"Model.{name} must be a non-negative integer, got {value!r}")
            if value > SHAPE_LIMITS[name]:
                raise SpecError(f"Model.{name} {value:,} is past any model: at most {SHAPE_LIMITS[name]:,}")
        if self.v_head_dim is not None:
            _positive(self, "v_head_dim")
        if not self.mla:
            extra = [n for n in ("q_lora_rank", "qk_pos_head_dim", "v_head_dim") if getattr(self, n)]
            if extra:
                raise SpecError(f"{', '.join(extra)} belong to multi-latent attention: set kv_lora_rank too")
            return
        if self.kv_heads != self.heads:
            raise SpecError(
                f"multi-latent attention up-projects K/V for every head: kv_heads must be heads {self.heads}"
            )
        if self.arch != "llama":
            raise SpecError("multi-latent attention is modelled for the llama arch (RMSNorm, no biases)")

    def padded_vocab(self, tp: Any = 1) -> Any:
        """The vocabulary the embedding and the logits are built with on `tp` ranks: `vocab` rounded up
        to a multiple of vocab_divisor x tp (Megatron-LM's padding); `tp` may be a numpy array."""
        multiple = self.vocab_divisor * tp
        return -(-self.vocab // multiple) * multiple

    @property
    def head_dim(self) -> int:
        """Width of one head's query and key (without MLA's RoPE part) and, but for MLA, of its value."""
        return self.attention_head_dim or self.hidden // self.heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (kv_lora_rank > 0)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_width(self) -> int:
        """Width of one head's query and key: head_dim, plus MLA's RoPE part."""
        return self.head_dim + self.qk_pos_head_dim

    @property
    def v_head_width(self) -> int:
        """Width of one head's value (and of its share of the attention output)."""
        return self.v_head_dim or self.head_dim

    @property
    def expert_width(self) -> int:
        """One routed expert's FFN width (expert_ffn, else ffn_hidden)."""
        return self.expert_ffn or self.ffn_hidden

    @property
    def q_hidden(self) -> int:
        """Width of Q: heads * qk_head_width (= hidden unless the head width is set, or MLA)."""
        return self.heads * self.qk_head_width

    @property
    def o_hidden(self) -> int:
        """Width of the attention output (the out-projection's input): heads * v_head_width."""
        return self.heads * self.v_head_width

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V) without MLA: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def k_hidden(self) -> int:
        """Width of K as attention sees it: kv_hidden, or MLA's heads * qk_head_width."""
        return self.heads * self.qk_head_width if self.mla else self.kv_hidden

    @property
    def v_hidden(self) -> int:
        """Width of V as attention sees it: kv_hidden, or MLA's heads * v_head_width."""
        return self.o_hidden if self.mla else self.kv_hidden

    @property
    def attention_core_width(self) -> float:
        """Multiply-accumulates per query-key pair of all heads, per 2: heads (qk + v head widths) / 2,
        so that the core's forward is 4 s^2 x this FLOPs per sequence (= q_hidden without MLA)."""
        return self.heads * (self.qk_head_width + self.v_head_width) / 2

    @property
    def mla_latent_width(self) -> int:
        """MLA: the per-token latents the up projections read (q_lora_rank, or the hidden state when
        Q is projected directly, + kv_lora_rank + the shared RoPE key); 0 without MLA."""
        if not self.mla:
            return 0
        return (self.q_lora_rank or self.hidden) + self.kv_lora_rank + self.qk_pos_head_dim

    def attention_replicated_params(self, *, matrices_only: bool = False) -> int:
        """Attention weights every TP rank holds whole: MLA's down projections and latent norms
        (Megatron-LM builds them as Transformer Engine 'duplicated' linears); 0 without MLA."""
        if not self.mla:
            return 0
        h, ql, kl = self.hidden, self.q_lora_rank, self.kv_lora_rank
        norms = 0 if matrices_only else ql + kl
        return h * ql + h * (kl + self.qk_pos_head_dim) + norms

    def attention_matrix_params(self) -> int:
        """One layer's attention GEMM weights.

        GQA/MHA: h (q + 2k) + o h (the Q, K, V and out projections).
        MLA (DeepSeek-V2, Sec. 2.1, Eq. 9-14, with the decoupled RoPE of Eq. 15-16): W^DQ h x q_l,
        W^UQ with W^QR q_l x heads (d + d_r); W^DKV with W^KR h x (kv_l + d_r); W^UK with W^UV
        kv_l x heads (d + d_v); W^O heads d_v x h. Without a query latent (q_lora_rank 0) W^Q is
        h x heads (d + d_r)."""
        h = self.hidden
        if self.mla:
            ql, kl = self.q_lora_rank, self.kv_lora_rank
            q = h * ql + ql * self.q_hidden if ql else h * self.q_hidden
            kv = h * (kl + self.qk_pos_head_dim) + kl * self.heads * (self.head_dim + self.v_head_width)
            return q + kv + self.o_hidden * h
        return h * (self.q_hidden + 2 * self.kv_hidden) + self.o_hidden * h

    def attention_params(self) -> int:
        """One layer's attention weights without the norm before it: its GEMMs, MLA's two latent
        RMSNorms (q_l + kv_l), GPT's biases (q + 2k + h)."""
        if self.mla:
            return self.attention_matrix_params() + self.q_lora_rank + self.kv_lora_rank
        bias = self.q_hidden + 2 * self.kv_hidden + self.hidden if self.arch == "gpt" else 0
        return self.attention_matrix_params() + bias

    @property
    def gated_mlp(self) -> bool:
        return self.arch == "llama"

    @property
    def tied_embeddings(self) -> bool:
        return self.arch == "gpt" if self.tie_embeddings is None else self.tie_embeddings

    def params_per_layer(self) -> int:
        """Weights (and GPT's biases) of one dense layer: attention (attention_params), MLP, two norms."""
        h, f = self.hidden, self.ffn_hidden
        if self.arch == "llama":  # no biases, SwiGLU (gate, up, down), RMSNorm (weight only)
            return self.attention_params() + 3 * h * f + 2 * h
        return self.attention_params() + 2 * h * f + f + h + 4 * h

    def mlp_matrix_params(self, ffn: int) -> int:
        """The MLP's weight matrices at width `ffn`: gate, up, down (llama) or fc1, fc2 (gpt)."""
        return (3 if self.gated_mlp else 2) * self.hidden * ffn

    @property
    def moe_layer_flags(self) -> tuple[int, ...]:
        """1 for each MoE layer, 0 for each dense one, first layer first: moe_pattern when given, else
        the first dense_layers dense and then every moe_every-th layer (Hugging Face's
        first_k_dense_replace / interleave_moe_layer_step); all 0 for a dense model."""
        if not self.experts:
            return (0,) * self.layers
        if self.moe_pattern is not None:
            return self.moe_pattern
        first = self.dense_layers + self.moe_every - 1
        return tuple(int(i >= first and (i - first) % self.moe_every == 0) for i in range(self.layers))

    @property
    def moe_layers(self) -> int:
        """How many layers are MoE (moe_layer_flags; 0 for a dense model)."""
        return sum(self.moe_layer_flags)

    @property
    def moe_share(self) -> float:
        """MoE layers per layer (the formulas spread them evenly over the stages: the pattern repeats)."""
        return self.moe_layers / self.layers

    def expert_params_per_layer(self) -> int:
        """The routed experts' weights of one MoE layer (what expert parallelism shards)."""
        return self.experts * self.mlp_matrix_params(self.expert_width)

    def moe_layer_params_besides_experts(self) -> int:
        """One MoE layer without its routed experts: attention, norms, router, shared experts (GPT's
        MLP biases are not counted for MoE layers)."""
        dense_mlp = self.params_per_layer() - self.mlp_matrix_params(self.ffn_hidden)
        if self.arch == "gpt":
            dense_mlp -= self.ffn_hidden + self.hidden  # fc1 and fc2 biases
        return dense_mlp + self.hidden * self.experts + self.mlp_matrix_params(self.shared_expert_ffn)

    def layer_params_total(self) -> int:
        """All transformer layers' weights, dense and MoE."""
        moe = self.moe_layers
        per_moe = self.moe_layer_params_besides_experts() + self.expert_params_per_layer()
        return (self.layers - moe) * self.params_per_layer() + moe * per_moe

    def active_params_total(self, tp: int = 1) -> int:
        """Weights one token passes through: every weight but the routed experts it is not sent to
        (top_k of them per MoE layer instead of all), the input embedding and the output layer
        included. Mixtral's "12.9B active of 46.7B" and DeepSeek-V3's "37B of 671B" are this count
        (37.55B for DeepSeek-V3: the report rounds it down; without the input embedding, a table
        lookup, it is 36.63B)."""
        routed_unused = (self.experts - self.top_k) * self.mlp_matrix_params(self.expert_width)
        return self.params_total(tp) - self.moe_layers * routed_unused

    def param_counts(self, tp: int = 1) -> dict[str, int]:
        """{total, active, embedding}: counts of parameters (not bytes). total: every weight of the
        model as trained (params_total; without DeepSeek-V3's multi-token-prediction module, which its
        authors count apart: 671B + 14B); active: active_params_total; embedding: the input
        embedding table (and GPT's learned positions), inside both."""
        return {
            "total": self.params_total(tp),
            "active": self.active_params_total(tp),
            "embedding": self.embedding_params(tp),
        }

    def embedding_params(self, tp: int = 1) -> int:
        """Input embedding of the padded vocabulary (plus GPT's learned positions); the output layer
        is tied for GPT."""
        pos = self.seq_len * self.hidden if self.arch == "gpt" else 0
        return self.padded_vocab(tp) * self.hidden + pos

    def output_params(self, tp: int = 1) -> int:
        """Final norm and, if untied, the output projection."""
        norm = 2 * self.hidden if self.arch == "gpt" else self.hidden
        return norm + (0 if self.tied_embeddings else self.padded_vocab(tp) * self.hidden)

    def params_total(self, tp: int = 1) -> int:
        """Every weight, the embedding of the vocabulary as padded for `tp` ranks."""
        return self.layer_params_total() + self.embedding_params(tp) + self.output_params(tp)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Model":
        return _from_dict(cls, data)


@dataclass(frozen=True)
class Link:
    """One link as a GPU sees it: bandwidth per GPU per direction, and per-message latency."""

    bandwidth_bytes_per_s: float
    latency_s: float
    name: str = ""

    def __post_init__(self):
        if not self.bandwidth_bytes_per_s > 0:
            raise SpecError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s!r}")
        if not self.latency_s >= 0:
            raise SpecError(f"link latency must be >= 0 s, got {self.latency_s!r}")

    @classmethod
    def from_dict(cls, data: dict) -> "Link":
        return _from_dict(cls, data)


@dataclass(frozen=True)
class Cluster:
    """`nodes` hosts of `gpus_per_node` GPUs (the processes a launcher starts per host), ranks placed
    host after host; the GPUs of one NVLink domain (`nvlink_domain` consecutive ranks) talk over
    `intra`, the others over `inter`."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int
    peak_flops: float  # dense bf16 FLOP/s per GPU
    intra: Link  # inside an NVLink domain (NVLink / loopback)
    inter: Link  # between domains (InfiniBand / the lab's shaped veth)
    device: str = "gpu"  # "gpu" or "cpu" (gloo over loopback)
    # the accelerator (parallel.core.devices preset): its HBM bandwidth, fp8 peak and kernel
    # efficiencies time each operator; "" = a generic GPU of peak_flops (devices.cluster_device)
    gpu: str = ""
    # GPUs that share one NVLink fabric, a property of the machine, not of the launch: 72 on a
    # GB200/GB300 NVL72 rack (18 hosts of 4 GPUs), 4 on a GB200 NVL4; None = one host (DGX/HGX: 8),
    # which then follows gpus_per_node when that is changed. Whole hosts: a multiple of gpus_per_node.
    nvlink_domain: int | None = None

    def __post_init__(self):
        _positive(self, "nodes", "gpus_per_node", "gpu_memory_bytes")
        if self.nvlink_domain is not None:
            _positive(self, "nvlink_domain")
            if self.nvlink_domain % self.gpus_per_node:
                raise SpecError(
                    f"an NVLink domain is whole hosts: {self.name}'s {self.nvlink_domain} GPUs per NVLink domain "
                    f"is not a multiple of its {self.gpus_per_node} GPUs per node"
                )
        if not self.peak_flops > 0:
            raise SpecError(f"Cluster.peak_flops must be > 0, got {self.peak_flops!r}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one NVLink domain: nvlink_domain, else one host's."""
        return self.nvlink_domain or self.gpus_per_node

    def with_nodes(self, nodes: int) -> "Cluster":
        return dataclasses.replace(self, nodes=nodes)

    def sized_for(self, world_size: int) -> "Cluster":
        """The cluster with just enough nodes for `world_size` ranks; one partial node when smaller."""
        if world_size < self.gpus_per_node:
            return dataclasses.replace(self.launched_as(max(world_size, 1)), nodes=1)
        return dataclasses.replace(self, nodes=-(-world_size // self.gpus_per_node))

    def launched_as(self, gpus_per_node: int) -> "Cluster":
        """Hosts of `gpus_per_node` ranks as a launch shapes them (one partial node, every rank of a local
        run on one machine): the NVLink domain stays while it is whole hosts of that size, else it is
        one host (None). An explicit host size goes through the constructor instead, which refuses a
        domain that is not whole hosts."""
        domain = self.nvlink_domain
        keep = domain is not None and domain % gpus_per_node == 0
        return dataclasses.replace(self, gpus_per_node=gpus_per_node, nvlink_domain=domain if keep else None)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Cluster":
        return _from_dict(cls, data, nested={"intra": Link, "inter": Link})


def _gpt3(name, layers, hidden, heads):
    return Model(name=name, layers=layers, hidden=hidden, heads=heads, vocab=51200, seq_len=2048)


def _llama3(name, layers, hidden, heads, ffn):
    return Model(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=8,
        ffn_hidden=ffn,
        vocab=128256,
        seq_len=8192,
        arch="llama",
        dropout=False,
    )


def _llama4(name, experts, moe_every):
    return Model(
        name=name,
        layers=48,
        hidden=5120,
        heads=40,
        kv_heads=8,
        ffn_hidden=16384,
        vocab=202048,
        seq_len=8192,
        arch="llama",
        dropout=False,
        experts=experts,
        top_k=1,
        expert_ffn=8192,
        shared_expert_ffn=8192,
        moe_every=moe_every,
    )


MODELS: dict[str, Model] = {
    # Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    # Table 3 (model configurations): heads, hidden, layers; sequence 2048, vocabulary 51200.
    "gpt3-22b": _gpt3("gpt3-22b", 48, 6144, 64),
    "gpt3-175b": _gpt3("gpt3-175b", 96, 12288, 96),
    "gpt3-530b": _gpt3("gpt3-530b", 105, 20480, 128),
    "gpt3-1t": _gpt3("gpt3-1t", 128, 25600, 160),
    # Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (layers, model dim, FFN dim, heads,
    # 8 key/value heads, GQA); vocabulary 128256 and context 8192 from the released params/config;
    # no dropout (the released config.json: attention_dropout 0.0; Megatron-LM's Llama-3 scripts set
    # --attention-dropout 0.0 --hidden-dropout 0.0).
    "llama3-8b": _llama3("llama3-8b", 32, 4096, 32, 14336),
    "llama3-70b": _llama3("llama3-70b", 80, 8192, 64, 28672),
    "llama3-405b": _llama3("llama3-405b", 126, 16384, 128, 53248),
    # Mixture-of-experts models. Mixtral 8x7B: Jiang et al. 2024, "Mixtral of Experts", Table 1
    # (32 layers, dim 4096, 32 heads, 8 kv heads, FFN 14336, vocab 32000, 8 experts, top-2); the
    # sequence is Megatron-LM's Mixtral example's 4096. 46.7B parameters.
    "mixtral-8x7b": Model(
        name="mixtral-8x7b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab=32000,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=8,
        top_k=2,
    ),
    # Mixtral 8x22B: Mistral AI 2024, "Cheaper, Better, Faster, Stronger" (141B parameters, 39B
    # active) and the released config.json (mistralai/Mixtral-8x22B-v0.1: 56 layers, hidden 6144,
    # 48 heads, 8 kv heads, FFN 16384, 8 experts, top-2, vocab 32768); sequence 4096 as 8x7B's.
    "mixtral-8x22b": Model(
        name="mixtral-8x22b",
        layers=56,
        hidden=6144,
        heads=48,
        kv_heads=8,
        ffn_hidden=16384,
        vocab=32768,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=8,
        top_k=2,
    ),
    # DeepSeek-V3: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), Sec. 4.2, and
    # the released config.json: 61 layers, hidden 7168, 128 heads of multi-head latent attention
    # (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim
    # 128), the first 3 layers dense (FFN 18432), then 256 routed experts of 2048 and 1 shared of
    # 2048, top-8, vocab 129280, untied; training sequence 4096. 671.0B parameters, 37.6B active
    # (Model.active_params_total; the report's "671B, 37B"); the multi-token-prediction module
    # (14B, trained beside the model) is not part of it. Megatron-LM's DeepSeek-R1 arguments
    # (examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh) give the same shape.
    "deepseek-v3": Model(
        name="deepseek-v3",
        layers=61,
        hidden=7168,
        heads=128,
        ffn_hidden=18432,
        vocab=129280,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=256,
        top_k=8,
        expert_ffn=2048,
        shared_expert_ffn=2048,
        moe_pattern=(0,) * 3 + (1,) * 58,
        router_groups=8,  # node-limited routing: 8 groups, each token to at most 4 (Sec. 2.1.2, config.json)
        router_group_topk=4,
        attention_head_dim=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_pos_head_dim=64,
        v_head_dim=128,
    ),
    # gpt-oss-120b: OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card" (116.8B parameters, 5.1B
    # active per token) and the released config.json: 36 layers, hidden 2880, 64 heads of 64, 8 kv
    # heads, 128 experts of 2880, top-4, every layer MoE, vocab 201088, untied; sequence 4096
    # (Megatron-LM's examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh). Modelled as
    # llama: its attention and expert biases (~0.1%), attention sinks and the 128-token sliding
    # window of every other layer are not.
    "gpt-oss-120b": Model(
        name="gpt-oss-120b",
        layers=36,
        hidden=2880,
        heads=64,
        kv_heads=8,
        ffn_hidden=2880,
        vocab=201088,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=128,
        top_k=4,
        attention_head_dim=64,
    ),
    # Llama 4 Scout / Maverick: torchtitan's llama4 flavours 17bx16e / 17bx128e and Meta's released
    # config.json: 48 layers, dim 5120, 40 heads, 8 kv heads, experts of 8192 with one shared expert
    # of 8192, top-1, vocab 202048; Maverick's MoE layers alternate with dense ones of 16384
    # (interleave_moe_layer_step 2); sequence 8192 (torchtitan's train configs). 109B / 400B.
    "llama4-scout": _llama4("llama4-scout", experts=16, moe_every=1),
    "llama4-maverick": _llama4("llama4-maverick", experts=128, moe_every=2),
    # Qwen3: Qwen Team 2025, "Qwen3 Technical Report", Tables 1 and 2, and the released config.json
    # (head_dim 128, vocab 151936); sequence 4096 (pre-training stage 1). 32.8B dense; 235B with
    # 128 experts of 1536, top-8, 22B active. No dropout.
    "qwen3-32b": Model(
        name="qwen3-32b",
        layers=64,
        hidden=5120,
        heads=64,
        kv_heads=8,
        ffn_hidden=25600,
        vocab=151936,
        seq_len=4096,
        arch="llama",
        dropout=False,
        attention_head_dim=128,
    ),
    # Qwen3-30B-A3B: the same report's Table 2 and config.json: 48 layers, hidden 2048, 32 heads
    # of 128, 4 kv heads, 128 experts of 768, top-8, every layer MoE, vocab 151936, untied. 30.5B,
    # 3.3B active.
    "qwen3-30b-a3b": Model(
        name="qwen3-30b-a3b",
        layers=48,
        hidden=2048,
        heads=32,
        kv_heads=4,
        ffn_hidden=6144,
        vocab=151936,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=128,
        top_k=8,
        expert_ffn=768,
        attention_head_dim=128,
    ),
    "qwen3-235b-a22b": Model(
        name="qwen3-235b-a22b",
        layers=94,
        hidden=4096,
        heads=64,
        kv_heads=4,
        ffn_hidden=12288,
        vocab=151936,
        seq_len=4096,
        arch="llama",
        dropout=False,
        experts=128,
        top_k=8,
        expert_ffn=1536,
        attention_head_dim=128,
    ),
    # What the CPU jobs train: every degree in {1, 2, 4} of dp/tp/pp/cp divides it, SP and
    # load-balanced CP included (seq 64 % (2*cp*tp) == 0 for cp, tp <= 4). fp32 on CPU; the engine
    # builds the vocabulary as given (no padding).
    "tiny": Model(name="tiny", layers=4, hidden=64, heads=4, vocab=512, seq_len=64, dtype_bytes=4, vocab_divisor=1),
    # tiny's Llama twin: GQA (8 query heads on 4 K/V heads), SwiGLU of 3h (Llama's ~8h/3 rounded to a
    # multiple of 64), RMSNorm, RoPE, no biases, no dropout, untied output layer
    "tiny-llama": Model(
        name="tiny-llama",
        layers=4,
        hidden=64,
        heads=8,
        kv_heads=4,
        ffn_hidden=192,
        vocab=512,
        seq_len=64,
        dtype_bytes=4,
        arch="llama",
        dropout=False,
        vocab_divisor=1,  # the engine does not pad (parallel.engine.api refuses vocab % tp)
    ),
}

# The global batch (sequences a step) a preset was trained with, where its authors published it: the
# search's batch when none is given. Narayanan et al. 2021 (Table 2: 175B at 1536; Table 1: 529.6B
# at 2520, 1008B at 3072); DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 4.2 (ramped from
# 3072 to 15360 over the first 469B tokens, then 15360).
TRAINED_GLOBAL_BATCH: dict[str, int] = {"gpt3-175b": 1536, "gpt3-530b": 2520, "gpt3-1t": 3072, "deepseek-v3": 15360}


def _node(
    name,
    gpu,
    memory_bytes,
    peak_tflops,
    intra_gbps,
    inter_gbps,
    *,
    gpus=8,
    domain=None,
    intra="NVLink",
    inter="InfiniBand",
):
    # Latencies: order-of-magnitude per-hop NCCL latencies (NVLink ~ 3 us, IB ~ 8 us); fit your
    # own with `python -m profiler commbench` for real numbers.
    return Cluster(
        name=name,
        nodes=1,
        gpus_per_node=gpus,
        gpu_memory_bytes=int(memory_bytes),
        peak_flops=peak_tflops * 1e12,
        intra=Link(intra_gbps * GB, 3e-6, intra),
        inter=Link(inter_gbps * GB, 8e-6, inter),
        gpu=gpu,
        nvlink_domain=domain,
    )


CLUSTERS: dict[str, Cluster] = {
    # DGX A100: NVLink3 600 GB/s bidirectional = 300 GB/s per direction; 8x HDR 200 Gb/s = 25 GB/s
    # per GPU; A100 80GB, 312 TFLOP/s dense bf16 (NVIDIA A100 datasheet).
    "dgx-a100": _node("dgx-a100", "a100-sxm-80gb", 80 * GiB, 312, 300, 25),
    # DGX A100 40GB: the same node with the 40 GB A100 (HBM2, 1.56 TB/s).
    "dgx-a100-40gb": _node("dgx-a100-40gb", "a100-sxm-40gb", 40 * GiB, 312, 300, 25),
    # DGX H100: NVLink4 900 GB/s bidirectional = 450 GB/s per direction; 8x NDR 400 Gb/s = 50 GB/s
    # per GPU; H100 SXM 80GB, 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet).
    "dgx-h100": _node("dgx-h100", "h100-sxm", 80 * GiB, 989, 450, 50),
    # DGX H200: as H100 (same NVLink4, NDR, 989 TFLOP/s) with 141 GB HBM3e (NVIDIA H200 datasheet).
    "dgx-h200": _node("dgx-h200", "h200-sxm", 141 * 10**9, 989, 450, 50),
    # DGX B200: NVLink5 1.8 TB/s bidirectional = 900 GB/s per direction; 8x ConnectX-7 400 Gb/s =
    # 50 GB/s per GPU; B200 180 GB, 2.25 PFLOP/s dense bf16 (NVIDIA DGX B200 datasheet).
    "dgx-b200": _node("dgx-b200", "b200", 180 * 10**9, 2250, 900, 50),
    # GB200 NVL72 (NVIDIA GB200 NVL72 datasheet): a rack of 18 compute trays, each a host of 4 GPUs
    # (two GB200 superchips), all 72 GPUs on one NVLink5 domain of 130 TB/s = 72 x 1.8 TB/s
    # bidirectional: 900 GB/s per GPU per direction; 13.4 TB HBM3e = 186 GB per GPU; 180 PFLOP/s
    # dense bf16 per rack (360 with sparsity) = 2.5 PFLOP/s per GPU; one ConnectX-7 400 Gb/s
    # (50 GB/s) NIC per GPU across racks. A job placed 16 trays per rack (SLURM --segment 16, two
    # spare) sees domains of 64: Cluster(..., nvlink_domain=64).
    "gb200-nvl72": _node("gb200-nvl72", "gb200", 186 * 10**9, 2500, 900, 50, gpus=4, domain=72),
    # GB300 NVL72 (NVIDIA GB300 NVL72 datasheet): the same rack of 18 hosts of 4 Blackwell Ultra
    # GPUs and NVLink5 (900 GB/s per GPU per direction); 288 GB HBM3e per GPU; 2.5 PFLOP/s dense
    # bf16 per GPU; one ConnectX-8 SuperNIC of 800 Gb/s (100 GB/s) per GPU across racks.
    "gb300-nvl72": _node("gb300-nvl72", "gb300", 288 * 10**9, 2500, 900, 100, gpus=4, domain=72),
    # AMD Instinct MI300X platform: 8 GPUs fully connected by Infinity Fabric, 7 links of 64 GB/s per
    # direction each (896 GB/s aggregate bidirectional: 448 per direction); 400 Gb/s NIC per GPU;
    # MI300X 192 GB, 1,307 TFLOP/s dense bf16 (AMD MI300X datasheet).
    "mi300x": _node("mi300x", "mi300x", 192 * 10**9, 1307.4, 448, 50, intra="Infinity Fabric", inter="RoCE"),
    # This machine: ranks are processes talking gloo over loopback (~2.2 GiB/s, ~50 us per message,
    # measured here); "GPU memory" is the host's 24 GiB; peak ~ 2 cores x 32 fp32 FLOP/cycle x 3 GHz.
    "local-cpu": Cluster(
        name="local-cpu",
        nodes=1,
        gpus_per_node=8,
        gpu_memory_bytes=24 * GiB,
        peak_flops=192e9,
        intra=Link(2.2 * GiB, 50e-6, "loopback"),
        inter=Link(0.115 * GiB, 100e-6, "shaped veth"),
        device="cpu",
    ),
}


def model_preset(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise SpecError(f"unknown model preset {name!r}; known: {', '.join(MODELS)}") from None


def cluster_preset(name: str) -> Cluster:
    try:
        return CLUSTERS[name]
    except KeyError:
        raise SpecError(f"unknown cluster preset {name!r}; known: {', '.join(CLUSTERS)}") from None
