"""The models the field trains now and the racks it trains them on: MoE layer patterns and multi-latent
attention read from Megatron-LM launches as Megatron-LM reads them, parameter counts against their
authors', and the NVLink domain of a GB200/GB300 NVL72 rack deciding which groups cross the slow link."""

import dataclasses
import json

import numpy as np
import pytest

from parallel.cli import plan as plan_cli
from parallel.core.comm import comm_per_step, crosses_nodes
from parallel.core.compute import attention_gemms
from parallel.core.memory import activation_components_bytes
from parallel.core.plan import Plan, PlanColumns
from parallel.core.specs import CLUSTERS, MODELS, Model, SpecError
from parallel.core.topology import placed
from parallel.importers import ImportFailed, import_text
from parallel.importers.moe_pattern import PatternError, evaluate, moe_layer_flags

V3 = MODELS["deepseek-v3"]

# DeepSeek-V3 as Megatron-LM's own arguments write it (examples/post_training/modelopt/conf/
# deepseek-ai/DeepSeek-R1.sh, the same architecture), launched on GB200 trays of 4 GPUs
V3_LAUNCH = (
    "torchrun --nproc_per_node 4 --nnodes 64 pretrain_gpt.py --num-layers 61 --hidden-size 7168 "
    "--ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128 --seq-length 4096 --swiglu --bf16 "
    "--untie-embeddings-and-output-weights --vocab-size 129280 --attention-dropout 0 --hidden-dropout 0 "
    "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
    "--qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 256 --moe-router-topk 8 "
    "--moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 --moe-router-num-groups 8 "
    "--moe-router-group-topk 4 "
    "--pipeline-model-parallel-size 4 --expert-model-parallel-size 64 "
)


# megatron/training/arguments.py: moe_freq_type / _eval_pattern (Python's eval of the list expression);
# megatron/core/models/gpt/gpt_layer_specs.py: an int N makes layer i MoE when i % N == 0
@pytest.mark.parametrize(
    "text, layers, expected",
    [
        ("([0]*3+[1]*58)", 61, [0] * 3 + [1] * 58),
        ("[0]*3+[1]*58", 61, [0] * 3 + [1] * 58),
        ("([1]*3+[0]*1)*3", 12, [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0]),  # Megatron-LM's help text
        ("([0]+[1]*23)", 24, [0] + [1] * 23),
        ("[1,0,1]", 3, [1, 0, 1]),
        ("[1, 0, ]*2", 4, [1, 0, 1, 0]),
        ("2*[0,1]", 4, [0, 1, 0, 1]),
        ("[0]*(1+1)+[1]*2", 4, [0, 0, 1, 1]),
        ("1", 4, [1, 1, 1, 1]),
        ("2", 5, [1, 0, 1, 0, 1]),
        ("3", 7, [1, 0, 0, 1, 0, 0, 1]),
    ],
)
def test_moe_layer_freq_reads_as_megatron_evaluates_it(text, layers, expected):
    assert list(moe_layer_flags(text, layers)) == expected
    if "[" in text:  # the same value Python's eval gives (what Megatron-LM runs)
        assert evaluate(text) == eval(text)  # noqa: S307 -- a fixed test literal
    else:
        assert expected == [1 if i % int(text) == 0 else 0 for i in range(layers)]


@pytest.mark.parametrize(
    "text, why",
    [
        ("[0,1]", "has 2 entries, but the model has 4 layers"),
        ("[2]*4", "only 0 (dense) and 1 (MoE)"),
        ("[[0]]*4", "only 0 (dense) and 1 (MoE)"),
        ("[(1,0)]*2", "a tuple is not a list"),
        ("[0]*[1]", "two lists cannot be multiplied"),
        ("[0]+1", "not a list and an integer"),
        ("[1]*(1<<30)", "may hold only digits"),
        ("[1]*1000000", "past any model"),
        ("[1]*10**9", "raises to a power"),
        ("[" * 200 + "]" * 200, "nested more than"),
        ("0", "must be at least 1"),
        ("abc", "expects an integer or a list expression"),
        ("[0,1", "expected ']'"),
    ],
)
def test_moe_layer_freq_refusals(text, why):
    with pytest.raises(PatternError, match=None) as err:
        moe_layer_flags(text, 4)
    assert why in str(err.value)


@pytest.mark.parametrize("freq", ['"([0]*3+[1]*58)"', "'[0]*3+[1]*58'"])
def test_deepseek_v3_launch_imports_as_the_preset(freq):
    imp = import_text(V3_LAUNCH + f"--moe-layer-freq {freq}")
    assert imp.model == V3 and imp.model.name == "deepseek-v3"
    assert imp.model.moe_layer_flags == (0,) * 3 + (1,) * 58 and imp.model.moe_layers == 58
    assert imp.world_size == 256 and imp.gpus_per_node == 4 and imp.plan.ep == 64


def test_moe_layer_freq_int_and_bad_pattern_point_at_the_line():
    imp = import_text(V3_LAUNCH + "--moe-layer-freq 2")
    assert imp.model.moe_layers == 31 and imp.model.moe_layer_flags[:4] == (1, 0, 1, 0)  # i % 2 == 0
    with pytest.raises(ImportFailed, match="line 2: --moe-layer-freq '\\[0\\]\\*3\\+\\[1\\]\\*57' has 60 entries"):
        import_text(V3_LAUNCH + '\\\n  --moe-layer-freq "[0]*3+[1]*57"', "job.sh")


def test_mla_flags_take_megatron_defaults_and_need_the_switch():
    base = V3_LAUNCH.replace("--q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 ", "")
    imp = import_text(base.replace("--qk-pos-emb-head-dim 64 --v-head-dim 128 ", ""))
    m = imp.model  # megatron/training/arguments.py _add_mla_args: q_lora None, kv_lora 32, 128, 64, 128
    assert (m.q_lora_rank, m.kv_lora_rank, m.head_dim, m.qk_pos_head_dim, m.v_head_width) == (0, 32, 128, 64, 128)
    assert any("Megatron-LM's defaults: --kv-lora-rank 32" in n for n in imp.notes)
    plain = import_text(V3_LAUNCH.replace("--multi-latent-attention ", ""))
    assert not plain.model.mla and any("without --multi-latent-attention: ignored" in n for n in plain.notes)
    with pytest.raises(ImportFailed, match="exclude one another"):
        import_text(V3_LAUNCH + "--group-query-attention --num-query-groups 8")


# megatron/training/arguments.py validate_args: with --account-for-embedding/loss-in-pipeline-split
# the embedding and the loss count as a layer each; L' % pp == 0 and (L'/pp) % N == 0; vpp = L'/pp/N
@pytest.mark.parametrize(
    "flags, per, pp, vpp",
    [
        ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", 1, 16, 8),  # 126 + 2
        ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", 2, 16, 4),
        ("--account-for-embedding-in-pipeline-split", 9, 7, 2),  # 126 + 1 = 127: refused below for pp 16
        ("", 7, 9, 2),
    ],
)
def test_layers_per_virtual_stage_counts_embedding_and_loss(flags, per, pp, vpp):
    launch = (
        "torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py --num-layers 126 --hidden-size 16384 "
        "--num-attention-heads 128 --seq-length 8192 --bf16 --tensor-model-parallel-size 8 "
        f"--pipeline-model-parallel-size {pp} --num-layers-per-virtual-pipeline-stage {per} {flags}"
    )
    if pp == 7:  # 127 layers are not divisible by 7: Megatron-LM's first assertion
        with pytest.raises(ImportFailed, match=r"layers 126 \+ 1 \(embedding\) = 127 are not divisible by pp 7"):
            import_text(launch)
        return
    imp = import_text(launch)
    counted = 126 + flags.count("account-for")
    assert imp.plan.vpp == vpp == counted // pp // per


def test_layers_per_virtual_stage_refusals_name_the_rule():
    launch = (
        "torchrun pretrain_gpt.py --num-layers 126 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
        "--pipeline-model-parallel-size 16 --num-layers-per-virtual-pipeline-stage 1"
    )
    with pytest.raises(ImportFailed, match="layers 126 are not divisible by pp 16"):
        import_text(launch)
    with pytest.raises(ImportFailed, match="give 8 per pipeline stage, not divisible by 3"):
        import_text(
            launch.replace("stage 1", "stage 3") + " --account-for-embedding-in-pipeline-split "
            "--account-for-loss-in-pipeline-split"
        )


def _v3_by_hand() -> tuple[int, int, int]:
    """DeepSeek-V3's weights from its config.json, written out independently of the Model's code."""
    h, n, vocab = 7168, 128, 129280
    attention = (
        h * 1536
        + 1536
        + 1536 * n * (128 + 64)  # W^DQ, its RMSNorm, W^UQ with the RoPE query
        + h * (512 + 64)
        + 512
        + 512 * n * (128 + 128)  # W^DKV with W^KR, its RMSNorm, W^UK and W^UV
        + n * 128 * h  # W^O
    )
    norms = 2 * h
    expert = 3 * h * 2048  # gate, up, down
    dense_layer = attention + norms + 3 * h * 18432
    moe_layer = attention + norms + h * 256 + 256 * expert + expert  # router, routed, shared
    ends = 2 * vocab * h + h  # embedding, untied output layer, final norm
    total = 3 * dense_layer + 58 * moe_layer + ends
    active = total - 58 * (256 - 8) * expert
    return total, active, vocab * h


def test_deepseek_v3_parameters_as_its_authors_count_them():
    counts = V3.param_counts()
    assert (counts["total"], counts["active"], counts["embedding"]) == _v3_by_hand()
    # DeepSeek-V3 Technical Report: "671B total parameters, of which 37B are activated for each token"
    # (the MTP module, 14B, apart). 671.03B total; 37.55B active with both embeddings, which the
    # report rounds down (36.63B without the input embedding's table lookup).
    assert counts["total"] == pytest.approx(671e9, rel=0.005)
    assert int(counts["active"] / 1e9) == 37 and counts["active"] == pytest.approx(37.55e9, rel=0.001)


@pytest.mark.parametrize(
    "name, total, active, embedding_in_active",
    [
        ("mixtral-8x7b", 46.7e9, 12.9e9, True),  # Jiang et al. 2024, Mixtral of Experts
        ("mixtral-8x22b", 141e9, 39e9, True),  # Mistral AI's announcement
        ("qwen3-30b-a3b", 30.5e9, 3.3e9, True),  # Qwen3 Technical Report, Table 2
        ("qwen3-235b-a22b", 235e9, 22e9, True),
        ("llama4-maverick", 400e9, 17e9, True),  # Meta's model card: 17B active, 400B total
        ("gpt-oss-120b", 116.83e9, 5.13e9, False),  # OpenAI's model card counts active without the embedding
    ],
)
def test_moe_presets_match_their_published_sizes(name, total, active, embedding_in_active):
    counts = MODELS[name].param_counts()
    got_active = counts["active"] - (0 if embedding_in_active else counts["embedding"])
    assert counts["total"] == pytest.approx(total, rel=0.01)
    assert got_active == pytest.approx(active, rel=0.02)


def test_mla_shapes_in_params_activations_and_gemms():
    plan = Plan(dp=1, tp=8, global_batch=1, sp=True)
    # down projections and latent norms whole on every TP rank, the rest split 8 ways
    replicated = 7168 * 1536 + 7168 * 576 + 1536 + 512
    assert V3.attention_replicated_params() == replicated
    gemms = {g.name: g for g in attention_gemms(V3, plan)}
    assert gemms["q down"].m == 4096 / 8 and gemms["q up"].n == 128 * 192 / 8 and gemms["q up"].m == 4096
    assert gemms["kv up"].n == 128 * 256 / 8 and gemms["proj"].k == 128 * 128 / 8
    parts = activation_components_bytes(V3, plan)
    s, a = 4096, 2
    assert parts["attention.qk"] == a * s * (128 * 192 / 8) * 2  # Q and K: 192 wide heads
    assert parts["attention.v"] == a * s * 128 * 128 / 8 and parts["attention.proj_input"] == a * s * 128 * 128 / 8
    latents = (2 + 2) * s * (1536 + 512) / 8 + 2 * s * 64
    assert parts["attention.qkv_input"] == 2 * s * 7168 / 8 + latents
    # the MHA approximation the preset used before held 128 x 56 heads: MLA's K/V are wider
    mha = dataclasses.replace(V3, kv_lora_rank=0, q_lora_rank=0, qk_pos_head_dim=0, v_head_dim=None)
    assert mha.attention_params() == 4 * 7168 * 128 * 128


def test_mla_tp_collectives_carry_the_latents():
    plan = Plan(dp=1, tp=8, global_batch=1, sp=True)
    cluster = CLUSTERS["dgx-h100"]
    rows = comm_per_step(dataclasses.replace(V3, layers=3, moe_pattern=None, experts=0), plan, cluster)
    latent = [r for r in rows if r["what"] == "MLA latents" and not r["overlapped"]]
    assert {r["collective"]: r["calls"] for r in latent} == {"all_gather": 3, "reduce_scatter": 3}
    assert latent[0]["bytes_per_call"] == 4096 * (1536 + 512 + 64) * 2


def test_model_fields_are_checked():
    with pytest.raises(SpecError, match="kv_heads must be heads"):
        dataclasses.replace(V3, kv_heads=8)
    with pytest.raises(SpecError, match="set kv_lora_rank too"):
        dataclasses.replace(MODELS["llama3-8b"], qk_pos_head_dim=64)
    with pytest.raises(SpecError, match="62 entries for 61 layers"):
        dataclasses.replace(V3, moe_pattern=(1,) * 62)
    with pytest.raises(SpecError, match="leave dense_layers and moe_every unset"):
        dataclasses.replace(V3, dense_layers=3)
    again = Model.from_dict(json.loads(json.dumps(V3.to_dict())))
    assert again == V3 and hash(again) == hash(V3)


def test_nvlink_domain_is_the_clusters_not_the_hosts():
    gb200 = CLUSTERS["gb200-nvl72"]
    assert gb200.gpus_per_node == 4 and gb200.domain_gpus == 72 and CLUSTERS["dgx-h100"].domain_gpus == 8
    assert gb200.intra.bandwidth_bytes_per_s == 900e9 and gb200.inter.bandwidth_bytes_per_s == 50e9
    assert CLUSTERS["gb300-nvl72"].inter.bandwidth_bytes_per_s == 100e9
    assert dataclasses.replace(CLUSTERS["dgx-h100"], gpus_per_node=16).domain_gpus == 16  # follows the host
    plan = Plan(dp=144, ep=72, global_batch=144)
    topo = placed(plan, gb200.sized_for(144))
    assert topo.domain_of(np.array([0, 71, 72, 143])).tolist() == [0, 0, 1, 1]
    assert topo.rank_table()[72]["node"] == 18 and topo.rank_table()[72]["domain"] == 1
    assert topo.crossing("ep") == 0 and topo.link("dp") == "inter"
    assert {g.link for g in topo.groups("ep")} == {"intra"}


@pytest.mark.parametrize("cluster, link", [("gb200-nvl72", "intra"), ("gb300-nvl72", "intra"), ("dgx-b200", "inter")])
def test_expert_all_to_all_on_an_nvl72_is_priced_on_nvlink(cluster, link):
    """EP 64 over 16 GB200 trays of 4 GPUs: one NVLink domain, so NVLink; over 8 DGX B200 hosts: InfiniBand."""
    m = MODELS["qwen3-30b-a3b"]
    c = CLUSTERS[cluster].sized_for(64)
    plan = Plan(dp=64, ep=64, global_batch=256, zero=1)
    ep = [r for r in comm_per_step(m, plan, c) if r["dim"] == "ep"]
    assert ep and {r["link"] for r in ep} == {link}
    on_nvlink = ep[0]["calls"] * ep[0]["bytes_per_call"] * 63 / 64 / c.intra.bandwidth_bytes_per_s
    if link == "intra":
        assert ep[0]["seconds"] == pytest.approx(on_nvlink + ep[0]["calls"] * 63 * c.intra.latency_s)
    # the vectorised search asks the same function: one flag per plan
    one = np.ones(2, dtype=np.int64)
    cols = PlanColumns(
        dp=64 * one,
        tp=one,
        pp=one,
        cp=one,
        sp=np.zeros(2, dtype=bool),
        micro_batch=one,
        vpp=one,
        zero=one,
        recompute=np.array(["none"] * 2),
        global_batch=256,
        ep=np.array([64, 4]),
    )
    assert crosses_nodes(cols, c, ("ep",)).tolist() == [link == "inter", False]


def test_a_rack_placed_16_trays_a_rack_keeps_ep64_inside():
    """DeepSeek-V3 on 256 GB200s with PP 4 x EP 64 (as NVIDIA ran it): with 72-GPU domains the EP
    groups of ranks 64-127 straddle two racks; placed 16 trays per rack (64 GPUs) none does."""
    plan = Plan(dp=64, pp=4, ep=64, global_batch=1024, first_stage_layers=16)
    full = CLUSTERS["gb200-nvl72"].sized_for(256)
    assert placed(plan, full).crossing("ep") == 3
    assert placed(plan, dataclasses.replace(full, nvlink_domain=64)).crossing("ep") == 0


def test_plan_json_reports_parameter_counts(capsys):
    code = plan_cli.main(
        [
            "--model",
            "deepseek-v3",
            "--cluster",
            "gb200-nvl72",
            "--nodes",
            "64",
            "--pp",
            "4",
            "--ep",
            "64",
            "--dp",
            "64",
            "--global-batch",
            "1024",
            "--json",
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert code in (0, 2) and rep["params"] == V3.param_counts()
    assert rep["cluster"]["nvlink_domain"] == 72 and rep["cluster"]["gpus_per_node"] == 4
