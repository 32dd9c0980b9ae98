"""`python -m parallel plan`: the JSON contract, exit codes, readable errors; the pure layer stays pure."""

import json
import subprocess
import sys

import pytest

from parallel.cli import plan as plan_cli
from tests.conftest import ROOT

EXAMPLE = "--model gpt3-175b --cluster dgx-h100 --nodes 64 --dp 8 --tp 8 --pp 8 --sp --micro-batch 1 --global-batch 1536".split()
KEYS = {
    "valid",
    "errors",
    "warnings",
    "world_size",
    "activation_bytes_per_layer",
    "memory_per_gpu_bytes",
    "ranks",
    "groups",
    "comm_per_step",
    "bubble_fraction",
    "step_time_s",
}


def run_json(capsys, argv):
    code = plan_cli.main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_issue_example_json_contract(capsys):
    code, rep = run_json(capsys, EXAMPLE)
    assert code == 0 and rep["valid"] is True
    assert KEYS <= set(rep)
    assert rep["world_size"] == 512 and len(rep["ranks"]) == 512
    assert set(rep["memory_per_gpu_bytes"]) == {"params", "grads", "optimizer", "activations", "total"}
    assert rep["ranks"][9] == {"rank": 9, "node": 1, "local_rank": 1, "domain": 1, "dp": 1, "pp": 0, "cp": 0, "tp": 1}
    assert set(rep["groups"]) == {"tp", "pp", "dp", "cp"}
    assert rep["groups"]["tp"][0] == {"ranks": list(range(8)), "nodes": [0], "domains": [0], "link": "intra"}
    assert rep["groups"]["pp"][0]["link"] == "inter"
    for row in rep["comm_per_step"]:
        assert {"dim", "collective", "calls", "bytes_per_call", "link", "seconds"} <= set(row)
    # TP+SP: the layers' gathers and scatters are sp; the loss's all-reduces over TP stay tp
    assert {r["dim"] for r in rep["comm_per_step"]} == {"tp", "sp", "pp", "dp"}
    assert rep["bubble_fraction"] == pytest.approx(7 / 192)
    assert rep["step_time_s"] > 0
    # 175B, TP8+SP: sbh(34/8 + 5as/(ht)) with 2-byte activations
    # flash attention: no s x s scores, an fp32 log-sum-exp per query row and head instead
    assert rep["activation_bytes_per_layer"] == pytest.approx(2048 * 12288 * 34 / 8 + 4 * 96 * 2048 / 8)
    code, table2 = run_json(capsys, [*EXAMPLE, "--attention", "unfused"])  # Korthikanti et al.'s Table 2
    assert table2["activation_bytes_per_layer"] == pytest.approx(2048 * 12288 * (34 / 8 + 5 * 96 * 2048 / (12288 * 8)))


def test_text_output_has_tables(capsys):
    assert plan_cli.main(EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "VALID" in out and "memory per GPU" in out and "communication per step" in out and "step time" in out


def test_invalid_plan_exits_2_with_errors_in_json(capsys):
    code, rep = run_json(capsys, ["--model", "gpt3-175b", "--nodes", "60", "--dp", "8", "--tp", "8", "--pp", "8"])
    assert code == 2 and rep["valid"] is False
    assert "dp×tp×pp×cp = 8×8×8×1 = 512, but the cluster has 60×8 = 480 GPUs" in rep["errors"]


def test_uncomputable_plan_gives_nulls_not_numbers(capsys):
    code, rep = run_json(capsys, ["--model", "gpt3-175b", "--tp", "5"])
    assert code == 2 and rep["memory_per_gpu_bytes"] is None and rep["step_time_s"] is None


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "gpt9"], "unknown model preset 'gpt9'"),
        (["--layers", "4", "--hidden", "64"], "missing --heads --seq-len --vocab"),
        (["--model", "tiny", "--cluster", "dgx-z"], "unknown cluster preset"),
        (["--model", "tiny", "--dp", "0"], "--dp 0 must be a positive integer"),
        (["--model", "tiny", "--mfu", "2"], "--mfu must be in [0.001, 1]"),
        (["--model", "tiny", "--links", "/nonexistent.json"], "not a commbench result"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, argv, message):
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_explicit_model_and_overrides(capsys):
    code, rep = run_json(
        capsys, "--layers 4 --hidden 64 --heads 4 --seq-len 64 --vocab 512 --tp 2 --cluster local-cpu".split()
    )
    assert code == 0 and rep["model"]["ffn_hidden"] == 256 and rep["cluster"]["gpus_per_node"] == 2
    code, rep = run_json(capsys, "--model gpt3-175b --seq-len 4096 --tp 8 --pp 16 --dp 4 --global-batch 256".split())
    assert rep["model"]["seq_len"] == 4096 and "seq_len=4096" in rep["model"]["name"]


def test_fitted_links_replace_the_preset(capsys, tmp_path):
    bench = tmp_path / "commbench.json"
    bench.write_text(
        json.dumps(
            {
                "links": {
                    "intra": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 2e9},
                    "inter": {"latency_s": 1e-4, "bandwidth_bytes_per_s": 1e8},
                }
            }
        )
    )
    code, rep = run_json(capsys, ["--model", "tiny", "--cluster", "local-cpu", "--tp", "2", "--links", str(bench)])
    assert code == 0 and rep["cluster"]["intra"]["bandwidth_bytes_per_s"] == 2e9
    assert rep["cluster"]["inter"]["latency_s"] == 1e-4


def test_cli_as_a_process_never_tracebacks():
    proc = subprocess.run(
        [sys.executable, "-m", "parallel", "plan", "--model", "gpt3-175b", "--dp", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "invalid int value" in proc.stderr


PURE = [
    "parallel.core.specs",
    "parallel.core.plan",
    "parallel.core.topology",
    "parallel.core.memory",
    "parallel.core.comm",
    "parallel.core.perf",
    "parallel.core.validate",
    "parallel.core.report",
    "parallel.cli.args",
    "parallel.cli.plan",
    "runfiles.annotations",
]


def test_pure_modules_import_neither_torch_nor_streamlit():
    code = (
        "import sys, importlib\n"
        f"for m in {PURE!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'streamlit'))\n"
        "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
