"""torchtitan's Python config registries: read as data, never run (parallel.importers.torchtitan_registry),
into the same plan a TOML of the same settings gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from parallel.cli import plan as plan_cli
from parallel.core.specs import MODELS
from parallel.importers import SUFFIXES, ImportFailed, config_names, detect, import_plan, import_text
from parallel.importers.limits import MAX_INPUT_CHARS

DATA = Path(__file__).resolve().parents[1] / "data" / "imports"
LLAMA3 = DATA / "torchtitan_registry_llama3.py"


@pytest.mark.parametrize(
    "config,preset,tp,recompute,mb",
    [
        ("llama3_8b", "llama3-8b", 1, "full", 1),  # per-op selective AC: a share of the layers recomputed
        ("llama3_70b", "llama3-70b", 8, "full", 8),
        ("llama3_405b", "llama3-405b", 8, "full", 2),
    ],
)
def test_registry_configs_give_the_presets_and_degrees(config, preset, tp, recompute, mb):
    imp = import_plan(LLAMA3, config=config)
    assert imp.kind == "torchtitan" and imp.model == dataclasses.replace(MODELS[preset], vocab_divisor=1)
    p = imp.plan
    assert (p.tp, p.sp, p.micro_batch, p.recompute) == (tp, tp > 1, mb, recompute)
    assert (p.recompute_layers is not None) == (config == "llama3_8b")  # full AC recomputes every layer
    assert imp.world_size is None  # data_parallel_shard_degree -1: the GPUs left over
    assert any(f"torchtitan config {config}" in n for n in imp.notes)


def test_the_same_settings_as_a_toml_give_the_same_plan():
    toml = """
[model]
name = "llama3"
flavor = "70B"
[training]
local_batch_size = 8
seq_len = 8192
[parallelism]
tensor_parallel_degree = 8
[activation_checkpoint]
mode = "full"
"""
    assert import_plan(LLAMA3, config="llama3_70b").plan == import_text(toml, "a.toml").plan


def test_async_tp_from_compile_and_float8_from_converters():
    imp = import_plan(LLAMA3, config="llama3_405b")
    assert imp.plan.tp_overlap
    (fp8,) = [n for n in imp.notes if "Float8LinearConverter" in n]
    assert "not modelled: time and memory priced as bf16" in fp8 and imp.plan.fp8 == "none"


def test_a_derived_config_reads_its_base_then_its_edits():
    imp = import_plan(LLAMA3, config="llama3_8b_mxfp8")
    assert imp.plan == import_plan(LLAMA3, config="llama3_8b").plan
    assert any("MXFP8LinearConverter" in n for n in imp.notes)


def test_several_configs_and_none_named_lists_them():
    with pytest.raises(ImportFailed, match="4 torchtitan configs in it; name one of: llama3_8b, llama3_8b_mxfp8"):
        import_plan(LLAMA3)
    with pytest.raises(ImportFailed, match="no torchtitan config 'llama3_1t'.*llama3_70b"):
        import_plan(LLAMA3, config="llama3_1t")


REGISTRY = """
from torchtitan.trainer import Trainer

def deepseek_v3_16b() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("16B", attn_backend="flex"),
        training=TrainingConfig(
            num_tokens_per_microbatch_per_dp_rank=2 * 4096,
            max_context_length=4096,
            num_tokens_per_train_step={step},
        ),
        parallelism=ParallelismConfig(
            pipeline_parallel_degree={pp},
            num_pp_microbatches=8,
            pipeline_parallel_schedule="Interleaved1F1B",
            expert_parallel_degree=8,
            data_parallel_shard_degree=8,
        ),
    )


def deepseek_v3_16b_hybridep() -> Trainer.Config:
    config = deepseek_v3_16b()
    config.model_spec = model_registry("16B", moe_comm_backend="hybridep")
    config.parallelism.tensor_parallel_degree = {tp}
    return config
"""


def test_pipeline_microbatches_and_tokens_a_step():
    imp = import_text(REGISTRY.format(step=2**22, pp=4, tp=1), "reg.py", config="deepseek_v3_16b")
    p = imp.plan
    # 8,192 tokens a microbatch = 2 sequences; 8 pipeline microbatches a DP rank; 4M tokens = 1,024 sequences
    assert (p.pp, p.micro_batch, p.global_batch, p.ep, p.vpp) == (4, 2, 1024, 8, 2)
    assert imp.local_batch == 16 and imp.world_size == 8 * 4
    assert p.moe_dispatcher == "alltoall" and any("attn_backend 'flex'" in n for n in imp.notes)


def test_an_edited_copy_changes_only_what_it_sets():
    imp = import_text(REGISTRY.format(step=-1, pp=1, tp=2), "reg.py", config="deepseek_v3_16b_hybridep")
    assert (imp.plan.moe_dispatcher, imp.plan.tp, imp.plan.ep) == ("flex", 2, 8)
    assert imp.plan.global_batch == 2 * 8  # -1: microbatch x dp


def test_values_it_cannot_evaluate_are_named_and_left_at_their_default(tmp_path):
    marker = tmp_path / "ran"
    text = f"""
def llama3_8b() -> Trainer.Config:
    open({str(marker)!r}, "w").write("ran")
    return Trainer.Config(
        model_spec=model_registry("8B"),
        parallelism=ParallelismConfig(tensor_parallel_degree=os.cpu_count(), data_parallel_shard_degree=2),
    )
"""
    imp = import_text(text, "reg.py")
    assert imp.plan.tp == 1 and imp.world_size == 2
    assert any("tensor_parallel_degree = os.cpu_count(...) is not a value the reader evaluates" in n for n in imp.notes)
    assert not marker.exists()  # read, never run


@pytest.mark.parametrize(
    "text,message",
    [
        ("def llama3_8b() -> Trainer.Config:\n    return (\n", "reg.py line 2: not valid Python"),
        ("x = 1\n", "no torchtitan config in it"),
        (
            "def mystery_7b() -> Trainer.Config:\n    return Trainer.Config(model_spec=model_registry('7B'))\n",
            "mystery_7b: the model is read from the config's name, and it names none of the torchtitan models "
            "the planner knows",
        ),
        ("def llama3_8b() -> Trainer.Config:\n    pass\n", "reg.py line 1: llama3_8b returns nothing the reader"),
        (
            "def llama3_8b() -> Trainer.Config:\n    return Trainer.Config()\n",
            "reg.py line 1: llama3_8b: model_spec is not set; the reader takes the model's flavour from",
        ),
        (
            "def gpt_oss_debug() -> Trainer.Config:\n    return Trainer.Config(model_spec=model_registry('debug'))\n",
            r"line 2: no shape for torchtitan model 'gpt_oss' flavour 'debug' \(known: gpt_oss: 120b, 20b\)\n",
        ),
        (
            "def llama3_8b() -> Trainer.Config:\n    return Trainer.Config(model_spec=spec('8B'))\n",
            r"line 2: llama3_8b: model_spec is spec\(...\), not a model_registry\(flavor, ...\) call",
        ),
        (
            "def llama3_8b() -> Trainer.Config:\n    return Trainer.Config(model_spec=model_registry('8B'),\n"
            "        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=5000, max_context_length=4096))\n",
            "reg.py line 3: llama3_8b: 5,000 tokens a microbatch",
        ),
    ],
)
def test_bad_registries_name_their_line(text, message):
    with pytest.raises(ImportFailed, match=message):
        import_text(text, "reg.py")


def test_python_files_are_torchtitan_registries():
    assert SUFFIXES[".py"] == "torchtitan" and detect("", "config_registry.py") == "torchtitan"
    assert detect(LLAMA3.read_text()) == "torchtitan"


def test_cli_config_flag(capsys):
    assert plan_cli.main(["--import", str(LLAMA3), "--config", "llama3_70b", "--nodes", "8", "--json"]) == 0
    assert '"tp": 8' in capsys.readouterr().out
    assert plan_cli.main(["--import", str(LLAMA3), "--nodes", "8"]) == 2
    assert "name one of: llama3_8b" in capsys.readouterr().err


def test_gpt_oss_20b_has_its_model_cards_sizes():
    # OpenAI's gpt-oss model card, Table 1: 20.91B total, 3.61B active (the unembedding counted, the embedding not)
    text = "def gpt_oss_20b() -> Trainer.Config:\n    return Trainer.Config(model_spec=model_registry('20b'))\n"
    m = import_text(text, "reg.py").model
    assert m.params_total() / 1e9 == pytest.approx(20.91, rel=0.005)
    assert (m.active_params_total() - m.vocab * m.hidden) / 1e9 == pytest.approx(3.61, rel=0.01)


def test_module_constants_and_edits_of_a_section_left_at_its_default():
    text = """
SEQ = 4096
MICRO = 2


def llama3_8b() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("8B"),
        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=MICRO * SEQ, max_context_length=SEQ),
    )


def llama3_8b_tp2() -> Trainer.Config:
    config = llama3_8b()
    config.parallelism.tensor_parallel_degree = 2
    config.activation_checkpoint = FullAC.Config()
    return config
"""
    imp = import_text(text, "reg.py", config="llama3_8b_tp2")
    assert (imp.plan.tp, imp.plan.micro_batch, imp.model.seq_len, imp.plan.recompute) == (2, 2, 4096, "full")
    assert imp.plan.recompute_layers is None


def test_arithmetic_is_bounded():
    squares = "\n".join(f"    x{i + 1} = x{i} * x{i}" for i in range(40))
    text = (
        "def llama3_8b() -> Trainer.Config:\n    x0 = 99999999\n" + squares + "\n"
        "    return Trainer.Config(model_spec=model_registry('8B'),\n"
        "        parallelism=ParallelismConfig(tensor_parallel_degree=x40, data_parallel_shard_degree=2))\n"
    )
    imp = import_text(text, "reg.py")  # 2**40-digit numbers would never finish
    assert imp.plan.tp == 1 and any("tensor_parallel_degree = x39 * x39 is not a value" in n for n in imp.notes)


def test_config_names_are_listed_only_for_texts_an_import_may_take():
    text = LLAMA3.read_text()
    assert config_names(text) == ("llama3_8b", "llama3_8b_mxfp8", "llama3_70b", "llama3_405b")
    assert config_names(text + "#" * MAX_INPUT_CHARS) == ()  # past the bound: not parsed at all
    assert config_names("def broken(:\n") == ()
