"""Megatron-LM launches the script does not run itself: a command built in a variable and started
from an sbatch heredoc, or a file of model arguments alone; and the flags such files use."""

import pytest

from parallel.core.specs import CLUSTERS
from parallel.importers import ImportFailed, import_text, place

# a command built in a string and submitted through a heredoc, as Megatron-LM's Megatron-FSDP examples do
HEREDOC = """#!/bin/bash
TP=2
ARGS=(
    --tensor-model-parallel-size ${TP}
    --num-layers 24 --hidden-size 2048 --num-attention-heads 16
    --seq-length 4096 --max-position-embeddings 4096
    --micro-batch-size 1 --global-batch-size 64 --bf16 --vocab-size 32000
)
TRAINING_CMD="
cd /workspace/megatron;
export PYTHONPATH=/workspace/megatron:${PYTHONPATH};
python /workspace/megatron/pretrain_gpt.py ${ARGS[@]}"
sbatch <<EOF
#!/bin/bash
srun --mpi=pmix bash -x -c "${TRAINING_CMD}"
EOF
"""

# model arguments alone, in one string, with a list-valued flag that is not valid shell when re-parsed
MODEL_ARGS = """#!/bin/bash
MODEL_ARGS=" \\
    --num-layers 27 --hidden-size 2048 --num-attention-heads 16 \\
    --ffn-hidden-size 10944 --swiglu --untie-embeddings-and-output-weights \\
    --num-experts 64 --moe-ffn-hidden-size 1408 --moe-router-topk 6 \\
    --moe-layer-freq ([0]+[1]*26) \\
    --seq-length 4096 --bf16 --padded-vocab-size 102400 \\
"
"""


# a small dense model's arguments, for the tests of one flag each
TINY = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --micro-batch-size 1 --vocab-size 32000"


def launch(flags: str, per_node: int | None = None) -> str:
    """A torchrun launch of TINY with `flags` (and --nproc_per_node when given)."""
    torchrun = f"torchrun --nproc_per_node {per_node}" if per_node else "torchrun"
    return f"{torchrun} pretrain_gpt.py {TINY} {flags}\n"


def test_bash_with_options_before_c_runs_its_string():
    imp = import_text(HEREDOC, "job.sh")
    assert (imp.model.layers, imp.model.hidden, imp.model.heads) == (24, 2048, 16)
    assert (imp.plan.tp, imp.plan.global_batch) == (2, 64)


def test_launch_built_in_a_variable_and_not_run_is_read_from_it():
    text = HEREDOC.split("sbatch <<EOF")[0] + 'sbatch --nodes 2 --wrap "$TRAINING_CMD"\n'
    imp = import_text(text, "job.sh")
    assert (imp.model.layers, imp.plan.tp) == (24, 2)
    assert any("line 9: the launch read from the variable $TRAINING_CMD" in n for n in imp.notes)


def test_a_file_of_model_arguments_alone():
    imp = import_text(MODEL_ARGS, "model.sh")
    m = imp.model
    assert (m.layers, m.experts, m.top_k) == (27, 64, 6)
    assert m.moe_pattern is not None and not m.moe_pattern[0] and all(m.moe_pattern[1:])  # first layer dense
    assert imp.world_size is None  # no launcher: the world comes from the user (--nodes / --gpus)


def test_a_run_command_wins_over_a_variable_holding_flags():
    text = MODEL_ARGS + (
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
        "--num-attention-heads 4 --seq-length 128 --micro-batch-size 1 --vocab-size 1000\n"
    )
    assert import_text(text, "job.sh").model.layers == 2


def test_padded_vocab_size_is_taken_as_given():
    imp = import_text(MODEL_ARGS, "model.sh")
    assert imp.model.vocab == 102400 and imp.model.padded_vocab(imp.plan.tp) == 102400
    assert any("--padded-vocab-size 102400" in n for n in imp.notes)


def test_quick_geglu_is_a_gated_mlp():
    base = "--ffn-hidden-size 4096 --untie-embeddings-and-output-weights"
    geglu = import_text(launch(f"{base} --quick-geglu"), "a.sh").model
    swiglu = import_text(launch(f"{base} --swiglu"), "b.sh").model
    gelu = import_text(launch(base), "c.sh").model
    assert geglu.arch == swiglu.arch == "llama" and gelu.arch == "gpt"
    assert geglu.param_counts(1) == swiglu.param_counts(1)


def test_hybrid_mamba_models_are_refused_by_name():
    text = MODEL_ARGS.replace("--num-layers 27", "--num-layers 27 --hybrid-layer-pattern MEM*EME --mamba-num-heads 64")
    with pytest.raises(ImportFailed, match="--hybrid-layer-pattern: a hybrid Mamba-Transformer model"):
        import_text(text, "nemotron_h.sh")


def test_gpt_oss_120b_arguments_count_as_its_model_card():
    # gpt-oss-120b's shape (its config.json) as Megatron-LM arguments: a gated MLP by --quick-geglu and
    # the tokenizer's vocabulary by --padded-vocab-size; OpenAI's model card: 116.83B parameters
    text = (
        'MODEL_ARGS="--num-layers 36 --hidden-size 2880 --ffn-hidden-size 2880 --num-attention-heads 64 '
        "--group-query-attention --num-query-groups 8 --kv-channels 64 --num-experts 128 "
        "--moe-ffn-hidden-size 2880 --moe-router-topk 4 --untie-embeddings-and-output-weights "
        '--quick-geglu --padded-vocab-size 201088 --seq-length 4096 --bf16"\n'
    )
    total = import_text(text, "gpt-oss-120b.sh").model.param_counts(1)["total"]
    assert total == pytest.approx(116.83e9, rel=0.005)


def test_embedding_and_loss_in_split_have_no_effect_at_pp_1():
    # Megatron-core adds them to the layers to split, then builds every layer on the one stage
    imp = import_text(
        launch("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"), "job.sh"
    )
    assert imp.plan.pp == 1 and not imp.plan.embedding_in_split and not imp.plan.loss_in_split
    assert any("at pp 1: no effect" in n for n in imp.notes)


def test_arguments_alone_ask_for_the_gpus_and_say_there_is_no_launch():
    imp = import_text(MODEL_ARGS, "model.sh")
    assert imp.world_from == "the arguments come with no launch command to say how many GPUs they run on"
    assert "line 2: the arguments read from the variable $MODEL_ARGS (no launch command)" in imp.notes
    with pytest.raises(ImportFailed, match="model.sh: the arguments come with no launch command .*give --nodes N"):
        place(imp, CLUSTERS["dgx-h100"])
    placed, cluster = place(imp, CLUSTERS["dgx-h100"], 2)
    assert (placed.world_size, placed.plan.dp, cluster.nodes) == (16, 16, 2)
    # a launcher that leaves the GPU count out is still "the launch command"
    launched = import_text(
        "python pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128\n", "job.sh"
    )
    assert launched.world_from == "the launch command does not say how many GPUs it runs on"


@pytest.mark.parametrize(
    "flags,sms",
    [
        ("--moe-flex-dispatcher-num-sms 32", 32),
        ("--moe-hybridep-num-sms 24", 24),  # deprecated, routed as Megatron-core routes it
        ("--moe-deepep-num-sms 16 --moe-flex-dispatcher-num-sms 40", 40),  # the unified flag wins
        ("", None),
    ],
)
def test_the_flex_dispatchers_sm_count_is_read(flags, sms):
    moe = f"--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 --moe-token-dispatcher-type flex {flags}"
    assert import_text(launch(moe, per_node=8), "job.sh").plan.dispatch_sms == sms


def test_conflicting_deprecated_sm_counts_are_refused():
    text = launch("--num-experts 8 --moe-token-dispatcher-type flex --moe-deepep-num-sms 16 --moe-hybridep-num-sms 24")
    with pytest.raises(ImportFailed, match="differ; Megatron-core refuses"):
        import_text(text, "job.sh")


def test_a_bare_list_expression_after_a_flag_is_its_value():
    # Megatron-LM's own docs print the training command with the list unquoted
    text = (
        "python pretrain_gpt.py --num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 \\\n"
        "  --micro-batch-size 1 --vocab-size 32000 --num-experts 8 --moe-router-topk 2 \\\n"
        "  --moe-layer-freq ([0]*2+[1]*6) \\\n"
        "  --bf16\n"
    )
    m = import_text(text, "job.sh").model
    assert m.moe_pattern == (0, 0, 1, 1, 1, 1, 1, 1) and m.dtype_bytes == 2  # the flag after it still read


@pytest.mark.parametrize(
    "text",
    [
        "python pretrain_gpt.py --num-layers 8 (echo x)\n",  # not a list expression
        "python pretrain_gpt.py x ([0]*2)\n",  # not after a flag
    ],
)
def test_other_bare_parentheses_stay_a_shell_error(text):
    with pytest.raises(ImportFailed, match="unexpected"):
        import_text(text, "job.sh")


def test_adam_moments_under_the_precision_aware_optimizer():
    def imported(flags):
        return import_text(launch(f"--bf16 --use-distributed-optimizer {flags}", per_node=8), "job.sh")

    on = imported("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype fp8")
    assert (on.plan.exp_avg_dtype, on.plan.exp_avg_sq_dtype) == ("bf16", "fp8")
    off = imported("--exp-avg-dtype bf16")  # Megatron-LM uses them only when asked
    assert off.plan.exp_avg_dtype == "fp32" and any("without --use-precision-aware-optimizer" in n for n in off.notes)
    with pytest.raises(ImportFailed, match="--exp-avg-dtype must be one of"):
        imported("--use-precision-aware-optimizer --exp-avg-dtype int4")


def test_an_offloaded_optimizer_is_said_to_be_unmodelled():
    offload = "--optimizer-cpu-offload --optimizer-offload-fraction 0.5 --overlap-cpu-optimizer-d2h-h2d"
    imp = import_text(launch(f"--use-precision-aware-optimizer {offload}"), "job.sh")
    assert any("--optimizer-cpu-offload (50% of the optimizer on the CPU) is not modelled" in n for n in imp.notes)


def test_shared_expert_overlap_is_said_to_be_unmodelled():
    moe = "--num-experts 8 --moe-shared-expert-intermediate-size 512 --moe-token-dispatcher-type alltoall"
    notes = import_text(launch(f"{moe} --moe-shared-expert-overlap"), "job.sh").notes
    assert any("--moe-shared-expert-overlap is not modelled" in n for n in notes)
