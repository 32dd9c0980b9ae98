"""The attention kernel a Megatron-LM launch runs, read from --transformer-impl, --attention-backend
and --use-flash-attn as Megatron-LM and Transformer Engine choose it."""

import pytest

from parallel.core import compute
from parallel.core.devices import DEVICES
from parallel.importers import import_text
from parallel.importers.megatron import attention_kernel

BASE = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
    "--seq-length 64 --micro-batch-size 1 --global-batch-size 8 --vocab-size 512 --bf16 "
)


@pytest.mark.parametrize(
    "flags,kernel",
    [
        ("", "fused"),  # the plan's default: Transformer Engine's auto backend
        ("--use-flash-attn", "fused"),  # under TE (the default impl) it changes nothing: TE picks cuDNN
        ("--transformer-impl transformer_engine --use-flash-attn", "fused"),
        ("--attention-backend flash", "fused"),  # TE's FlashAttention: FA3 on Hopper
        ("--attention-backend fused", "fused"),
        ("--attention-backend auto", "fused"),
        ("--attention-backend unfused", "unfused"),
        ("--transformer-impl local --use-flash-attn", "fa2"),  # the flash-attn package itself
        ("--transformer-impl local", "unfused"),
        ("--attention-backend local", "unfused"),
    ],
)
def test_the_importer_prices_the_kernel_the_framework_runs(flags, kernel):
    imp = import_text(BASE + flags, "run.sh")
    assert imp.plan.attention == kernel
    assert "--transformer-impl" not in imp.unknown


def test_no_attention_flag_leaves_the_plan_default_and_says_nothing():
    assert attention_kernel(None, None, None) == (None, "")


def test_the_fused_kernel_is_faster_than_flashattention2_on_hopper_at_long_sequence():
    # the H200 measurements behind the device table (bench/gpu_kernels.py): cuDNN 0.493, FA2 0.284 of peak
    h100 = DEVICES["h100-sxm"]
    fused = compute.attention_rate(h100, 65536, 128, "fused")
    fa2 = compute.attention_rate(h100, 65536, 128, "fa2")
    assert fused / fa2 == pytest.approx(0.493 / 0.284, rel=0.02)
    a100 = DEVICES["a100-sxm-80gb"]  # no cuDNN/FA3 advantage on Ampere: one FlashAttention-2 class rate
    assert a100.fa2_efficiency == a100.attention_efficiency
