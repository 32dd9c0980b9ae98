"""Importers: real Megatron-LM scripts and torchtitan configs (tests/data/imports, each citing
its source), plan JSON round trips, `python -m parallel plan --import`, and bad input that names its line."""

import dataclasses
import json
from pathlib import Path

import pytest

from parallel.cli import plan as plan_cli
from parallel.core.specs import CLUSTERS, MODELS
from parallel.importers import SUFFIXES, ImportFailed, detect, import_plan, import_text, place

DATA = Path(__file__).parents[1] / "data" / "imports"
H100 = CLUSTERS["dgx-h100"]


def test_megatron_gpt3_175b_example():
    imp = import_plan(DATA / "megatron_gpt3_175b.sh")
    assert imp.kind == "megatron" and imp.model == MODELS["gpt3-175b"]  # vocab 50257 padded to 51200 at tp 8
    p = imp.plan
    assert (p.tp, p.pp, p.cp, p.sp, p.micro_batch, p.global_batch, p.zero, p.recompute) == (
        8,
        16,
        1,
        False,
        1,
        1536,
        0,
        "none",
    )
    # published for 1 node x 8 GPUs, which cannot hold tp x pp = 128: the world size is left to the caller
    assert imp.world_size is None and "cannot hold tp×pp×cp = 128" in imp.world_from
    placed, cluster = place(imp, H100, nodes=64)
    assert placed.plan.dp == 4 and cluster.gpus == 512
    s = imp.summary()
    recognised = {r["option"]: r["value"] for r in s["recognised"]}
    assert s["unknown"] == [] and recognised["--tensor-model-parallel-size"] == 8
    assert recognised["--rampup-batch-size"] == ["16", "16", "5859375"]
    assert any("padded to 51200" in n for n in s["notes"])
    assert s["options"] == {} and (imp.plan.attention, imp.plan.dropout) == ("fused", None)


def test_megatron_llama3_8b_example():
    imp = import_plan(DATA / "megatron_llama3_8b_h100_fp8.sh")
    assert imp.model == MODELS["llama3-8b"]  # GQA 8, SwiGLU ffn 14336, untied, vocab 128256 from the mock-data branch
    assert imp.world_size == 8 and (imp.nodes, imp.gpus_per_node) == (1, 8)
    p = imp.plan
    assert (p.dp, p.tp, p.cp, p.sp, p.zero, p.global_batch) == (8, 1, 1, False, 1, 128)
    notes = " ".join(imp.notes)
    assert "--sequence-parallel with tp = 1: Megatron-LM turns it off" in notes and "--fp8-format hybrid" in notes
    assert imp.options == {} and (p.attention, p.dropout) == ("fused", False)
    assert imp.recognised["--fp8-format"] == "hybrid"  # a quoted array element holding two words


def test_megatron_strings_eval_and_unknowable_gpus_per_node():
    imp = import_plan(DATA / "megatron_llama3_strings_eval.sh")
    p, m = imp.plan, imp.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len) == (80, 8192, 64, 8, 28672, 2048)
    # the vocabulary as the tokenizer gives it; the model pads it as Megatron-LM does (128256 -> 129024 at tp 8)
    assert m.vocab == 128256 and m.padded_vocab(p.tp) == 129024 and m.name == "llama3-70b (seq_len=2048)"
    assert (p.tp, p.pp, p.sp, p.zero, p.micro_batch, p.global_batch) == (8, 1, True, 1, 1, 8)
    assert imp.world_size is None and imp.nodes == 1  # GPUS_PER_NODE comes from `python3 -c ...`
    assert any("command substitution; it is not run" in n for n in imp.notes)
    placed, cluster = place(imp, H100, nodes=1)
    assert placed.plan.dp == 1 and placed.world_size == 8


def test_megatron_sc21_sbatch_srun_sh_c():
    imp = import_plan(DATA / "megatron_sc21_figure15.sh")
    assert imp.world_size == 64 and (imp.nodes, imp.gpus_per_node) == (8, 8)
    p, m = imp.plan, imp.model
    assert (p.dp, p.tp, p.pp, p.micro_batch, p.global_batch, p.recompute) == (32, 2, 1, 1, 32, "full")
    assert (m.layers, m.hidden, m.heads, m.vocab, m.dtype_bytes, m.arch) == (32, 3840, 32, 50257, 2, "gpt")
    assert m.padded_vocab(p.tp) == 50432  # GPT-2 BPE padded to a multiple of 128 x tp 2


@pytest.mark.parametrize(
    "name,preset,tp,recompute,local",
    [
        ("torchtitan_llama3_8b.toml", "llama3-8b", 1, "full", 1),  # selective AC: every 2nd layer recomputed
        ("torchtitan_llama3_70b.toml", "llama3-70b", 8, "full", 8),
        ("torchtitan_llama3_405b.toml", "llama3-405b", 8, "full", 2),
    ],
)
def test_torchtitan_llama3_configs(name, preset, tp, recompute, local):
    imp = import_plan(DATA / name)
    # torchtitan does not pad the vocabulary: the preset's shape, built unpadded
    assert imp.kind == "torchtitan" and imp.model == dataclasses.replace(MODELS[preset], vocab_divisor=1)
    assert imp.world_size is None and "a preset for" in imp.world_from  # data_parallel_shard_degree = -1
    placed, cluster = place(imp, H100, nodes=8)
    p = placed.plan
    assert (p.dp, p.tp, p.sp, p.recompute, p.micro_batch) == (64 // tp, tp, tp > 1, recompute, local)
    assert p.global_batch == local * p.dp and p.zero == 3  # FSDP over the 64/tp data-parallel ranks
    assert imp.unknown == () and imp.options == {} and (p.attention, p.dropout) == ("fa2", False)
    assert p.grad_reduce_overlap and p.param_gather_overlap  # FSDP2's prefetch and reduce-scatters in backward
    if name.endswith("8b.toml"):
        assert p.recompute_layers == MODELS[preset].layers // 2  # selective_ac_option "2": every 2nd block


def test_torchtitan_explicit_degrees_fix_the_world_and_hsdp_pp_interleaved():
    text = """
[model]
name = "llama3"
flavor = "70B"
[training]
local_batch_size = 16
global_batch_size = 512
seq_len = 4096
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 4
tensor_parallel_degree = 8
pipeline_parallel_degree = 4
pipeline_parallel_microbatch_size = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_layers_per_stage = 5
frobnicate = true
[activation_checkpoint]
mode = "none"
[mystery]
x = 1
"""
    imp = import_text(text, "hsdp.toml")
    p = imp.plan
    assert imp.world_size == 2 * 4 * 8 * 4 and p.dp == 8 and p.zero == 3
    assert (p.pp, p.vpp, p.micro_batch, p.global_batch, p.recompute) == (4, 4, 2, 512, "none")
    assert imp.model.seq_len == 4096 and imp.model.name == "llama3-70b (seq_len=4096)"
    assert set(imp.unknown) == {"[parallelism] frobnicate", "[mystery]"}
    assert any(n.startswith("HSDP") for n in imp.notes)


def test_plan_json_round_trip_through_the_plan_cli(tmp_path, capsys):
    argv = (
        "--model gpt3-175b --cluster dgx-h100 --nodes 64 --dp 8 --tp 8 --pp 8 --sp --global-batch 1536 --json".split()
    )
    assert plan_cli.main(argv) == 0
    report = capsys.readouterr().out
    path = tmp_path / "plan.json"
    path.write_text(report)
    assert plan_cli.main(["--import", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    first = json.loads(report)
    assert again["plan"] == first["plan"] and again["cluster"] == first["cluster"]
    assert again["step_time_s"] == first["step_time_s"] and again["imported"]["kind"] == "plan-json"


def test_bare_plan_json_takes_the_model_from_flags(tmp_path, capsys):
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"dp": 2, "tp": 4, "pp": 1, "global_batch": 8, "unexpected": 1}))
    assert plan_cli.main(["--import", str(path), "--model", "gpt3-22b", "--json"]) in (0, 2)
    rep = json.loads(capsys.readouterr().out)
    assert rep["model"]["name"] == "gpt3-22b" and rep["world_size"] == 8
    assert rep["imported"]["unknown"] == ["plan.unexpected"]


def test_plan_cli_import_contract(capsys):
    code = plan_cli.main(["--import", str(DATA / "megatron_gpt3_175b.sh"), "--nodes", "64", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["valid"] and rep["world_size"] == 512 and rep["plan"]["dp"] == 4
    assert rep["imported"]["kind"] == "megatron" and rep["imported"]["world_from"].startswith("64 nodes × 8")
    # the world size from the file (1 node x 8 GPUs) when --nodes is not given
    code = plan_cli.main(["--import", str(DATA / "megatron_llama3_8b_h100_fp8.sh"), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rep["world_size"] == 8 and rep["cluster"]["nodes"] == 1 and rep["plan"]["dp"] == 8
    # the file's flash attention and zero dropout are the modelling assumptions
    saved = {r["component"]: r["bytes_per_layer"] for r in rep["activation_components"]}
    assert saved["attention.scores"] == 0 and saved["residual.dropout_masks"] == 0
    assert plan_cli.main(["--import", str(DATA / "megatron_sc21_figure15.sh")]) == 0
    assert "world size 64: VALID" in capsys.readouterr().out


def test_plan_cli_import_needs_a_world_size(capsys):
    assert plan_cli.main(["--import", str(DATA / "torchtitan_llama3_70b.toml")]) == 2
    err = capsys.readouterr().err
    assert "leaves the world size open (the file's comment: a preset for 64 A100 GPUs)" in err
    assert "give --nodes N" in err and "Traceback" not in err
    assert plan_cli.main(["--import", str(DATA / "megatron_gpt3_175b.sh"), "--json"]) == 2
    assert "cannot hold tp×pp×cp = 128" in json.loads(capsys.readouterr().out)["errors"][0]


def test_unknown_flags_are_listed_not_fatal():
    imp = import_text(
        "torchrun --nproc_per_node=4 --nnodes=2 pretrain_gpt.py --tensor-model-parallel-size 4 "
        "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --bf16 "
        "--frobnicate 3 4 --my-new-flag --lr 1e-4 --micro-batch-size 2 --global-batch-size 64"
    )
    assert imp.unknown == ("--frobnicate", "--my-new-flag") and imp.world_size == 8
    assert imp.plan.dp == 2 and imp.plan.micro_batch == 2


def test_interleaved_and_mapping_flags():
    imp = import_text(
        """#!/bin/bash
PP=4
ARGS=(--pipeline-model-parallel-size $PP --num-layers-per-virtual-pipeline-stage 3 --use-tp-pp-dp-mapping
      --tensor-model-parallel-size 2 --context-parallel-size 2 --sequence-parallel --recompute-activations)
python -m torch.distributed.run --nproc-per-node 8 --nnodes 4 pretrain_gpt.py "${ARGS[@]}" \\
   --num-layers 48 --hidden-size 6144 --num-attention-heads 64 --seq-length 4096 --bf16 \\
   --global-batch-size 256
""",
        "team.sh",
    )
    p = imp.plan
    assert (p.dp, p.tp, p.pp, p.cp, p.vpp, p.sp, p.recompute, p.order) == (
        2,
        2,
        4,
        2,
        4,
        True,
        "selective",
        "tp-cp-ep-pp-dp",
    )


@pytest.mark.parametrize(
    "text,line,message",
    [
        (
            'TP=8\nARGS="--tensor-model-parallel-size $TP\ntorchrun pretrain_gpt.py $ARGS\n',
            2,
            "unterminated double quote",
        ),
        ("ARGS=(\n  --num-layers 2\n", 1, "array `(` is never closed"),
        ('if [ "$X" == 1 ]; then\n  TP=2\n', 1, "`if` is never closed"),
        (
            "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \\\n"
            "  --tensor-model-parallel-size eight\n",
            2,
            "--tensor-model-parallel-size expects an integer, got 'eight'",
        ),
        (
            "MP_ARGS=(\n  --tensor-model-parallel-size ${TP}\n  --pipeline-model-parallel-size 2\n)\n"
            "torchrun pretrain_gpt.py ${MP_ARGS[@]} --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64\n",
            2,
            "--tensor-model-parallel-size needs a value (TP is not set in the script)",
        ),
        (
            "TP=$(python get_tp.py)\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers 2\n",
            2,
            "takes its value from `$(python get_tp.py)`, a command this importer does not run",
        ),
        (
            "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --hidden-size 64\n",
            1,
            "the launch command gives no --num-layers, --num-attention-heads, --seq-length",
        ),
        (
            "torchrun pretrain_gpt.py --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3 \\\n"
            " --num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 64\n",
            1,
            "layers 8 give 4 per pipeline stage, not divisible by 3",
        ),
    ],
)
def test_malformed_megatron_points_at_the_line(text, line, message):
    with pytest.raises(ImportFailed) as err:
        import_text(text, "job.sh")
    msg = str(err.value)
    assert message in msg and f"job.sh line {line}:" in msg
    assert f"{line:>4} | " in msg  # the offending line is shown


def test_no_megatron_command():
    with pytest.raises(ImportFailed, match="no Megatron-LM launch found"):
        import_text("echo hello\nls -l\n", "job.sh")


@pytest.mark.parametrize(
    "text,line,message",
    [
        ("[parallelism]\ntensor_parallel_degree = \n", 2, "not valid TOML"),
        (
            '[model]\nflavor = "8B"\n[parallelism]\ntensor_parallel_degree = "8"\n',
            4,
            "[parallelism] tensor_parallel_degree = '8' must be a positive integer",
        ),
        (
            '[model]\nname = "llama3"\nflavor = "tinymodel"\n',
            3,
            "no shape for torchtitan model 'llama3' flavour 'tinymodel'",
        ),
        (
            '[model]\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 3\n'
            "[training]\nlocal_batch_size = 8\n",
            5,
            "local batch 8 is not divisible by pipeline_parallel_microbatch_size 3",
        ),
    ],
)
def test_malformed_toml_points_at_the_line(text, line, message):
    with pytest.raises(ImportFailed) as err:
        import_text(text, "job.toml")
    msg = str(err.value)
    assert message in msg and f"job.toml line {line}:" in msg and f"{line:>4} | " in msg


def test_malformed_json_points_at_the_line():
    with pytest.raises(ImportFailed) as err:
        import_text('{\n  "plan": {"dp": 2,\n  "tp": }\n}', "plan.json")
    assert "plan.json line 3: not valid JSON" in str(err.value)


def test_cli_reports_bad_files_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.sh"
    bad.write_text('ARGS="--num-layers 2\n')
    assert plan_cli.main(["--import", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.sh line 1: unterminated double quote" in err and "Traceback" not in err
    assert plan_cli.main(["--import", str(tmp_path / "missing.sh")]) == 2
    assert "cannot read it" in capsys.readouterr().err


@pytest.mark.parametrize(
    "suffix,kind",
    [(s, "megatron") for s in (".sh", ".bash", ".slurm", ".sbatch")]
    + [(".toml", "torchtitan"), (".json", "plan-json")],
)
def test_every_suffix_names_its_kind(suffix, kind):
    assert SUFFIXES[suffix] == kind and detect("", f"job{suffix.upper()}") == kind


@pytest.mark.parametrize("name,kind", [("a.sh", "megatron"), ("a.toml", "torchtitan"), ("a.json", "plan-json")])
def test_detect_by_suffix_and_by_content(name, kind):
    assert detect("", name) == kind
    text = (
        (
            DATA / {"megatron": "megatron_gpt3_175b.sh", "torchtitan": "torchtitan_llama3_8b.toml"}.get(kind, "x")
        ).read_text()
        if kind != "plan-json"
        else '{"plan": {}}'
    )
    assert detect(text) == kind
