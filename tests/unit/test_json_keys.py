"""Every `python -m parallel ... --json` output (and `parascope`'s, the same mains) uses one key style:
snake_case, at every depth, each key listed in docs/json-output.md's `## parallel` section."""

import json
import re

import pytest

from parallel.cli import plan as plan_cli
from parallel.cli import search as search_cli
from parallel.core.comm import DIMS
from parallel.core.report import REPORT_KEYS
from parascope import cli as parascope_cli
from tests.conftest import ROOT
from tests.unit.test_calibrated import CAL

KEY = re.compile(r"^[a-z][a-z0-9_]*$")
IMPORTS = ROOT / "tests" / "data" / "imports"
GPT3 = "--model gpt3-175b --cluster dgx-h100 --nodes 64 --dp 8 --tp 8 --pp 8 --sp --global-batch 1536".split()
L70 = "--model llama3-70b --cluster dgx-h100 --nodes 8 --global-batch 512 --top 5".split()
RUNS = {
    "plan": (plan_cli.main, GPT3),
    "plan, mixture of experts and CP": (
        plan_cli.main,
        "--model mixtral-8x7b --cluster dgx-h100 --nodes 8 --dp 4 --tp 4 --pp 2 --cp 2 --ep 8 --sp "
        "--global-batch 256".split(),
    ),
    "plan --import a Megatron-LM script": (plan_cli.main, ["--import", str(IMPORTS / "megatron_gpt3_175b.sh"), "--nodes", "64"]),
    "plan --import a torchtitan TOML": (plan_cli.main, ["--import", str(IMPORTS / "torchtitan_llama4_17bx16e.toml"), "--nodes", "8"]),
    "plan --calibration": (plan_cli.main, "--model tiny --global-batch 4 --cluster local-cpu --calibration {cal}".split()),
    "plan, invalid": (plan_cli.main, "--model gpt3-175b --nodes 60 --dp 8 --tp 8 --pp 8".split()),
    "plan, cannot be split": (plan_cli.main, "--model gpt3-175b --tp 5".split()),
    "search": (search_cli.main, L70),
    "search --explain": (search_cli.main, [*L70, "--explain"]),
    "search --against": (search_cli.main, [*L70, "--against", "dp=8,tp=8,pp=1,sp=1,micro_batch=1,zero=1"]),
    "search, mixture of experts": (
        search_cli.main,
        "--model mixtral-8x7b --cluster dgx-h100 --gpus 64 --global-batch 256 --top 3".split(),
    ),
    "parascope plan": (lambda argv: parascope_cli.main(["plan", *argv]), GPT3),
    "parascope search": (lambda argv: parascope_cli.main(["search", *argv]), [*L70, "--explain"]),
}  # fmt: skip
# objects whose keys are another schema's (the plan's, a spec's, a calibration file's runs)
FOREIGN = ("plan", "model", "cluster", "sources")


def keys(doc, path="", out=None) -> dict[str, str]:
    """Every key in `doc` at any depth -> the first path it was found at; FOREIGN objects are walked for
    the style but marked, so the documentation check skips their keys."""
    out = {} if out is None else out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.setdefault(k, f"{path}.{k}")
            keys(v, f"{path}.{k}" if k not in FOREIGN else f"{path}.{k}!", out)
    elif isinstance(doc, list):
        for v in doc:
            keys(v, f"{path}[]", out)
    return out


def parallel_section() -> str:
    text = (ROOT / "docs" / "json-output.md").read_text()
    section = text.split("\n## parallel\n", 1)[1].split("\n## ", 1)[0]
    # `exposed_{dim}_s` stands for one key per dimension
    return section + " ".join(
        f"`{k.replace('{dim}', d)}`" for k in re.findall(r"`(\w*\{dim\}\w*)`", section) for d in DIMS
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    cal = tmp_path_factory.mktemp("cal") / "calibration.json"
    cal.write_text(json.dumps({**CAL.to_dict(), "sources": [{"path": "runs/a", "plan": "DP1 TP1 PP2 mb1"}]}))
    return {name: (main, [a.format(cal=cal) for a in argv]) for name, (main, argv) in RUNS.items()}


@pytest.mark.parametrize("name", RUNS)
def test_every_key_is_snake_case_and_documented(name, outputs, capsys):
    main, argv = outputs[name]
    main([*argv, "--json"])
    doc = json.loads(capsys.readouterr().out)
    found = keys(doc)
    assert found, f"{name}: no keys in {doc!r:.200}"
    bad = {k: p for k, p in found.items() if not KEY.match(k)}
    assert not bad, f"{name}: keys not snake_case: {bad}"
    if name.startswith(("plan", "parascope plan")):
        assert set(doc) <= set(REPORT_KEYS), (
            f"{name}: top-level keys outside REPORT_KEYS: {set(doc) - set(REPORT_KEYS)}"
        )
    listed = parallel_section()
    own = {k: p for k, p in found.items() if "!" not in p and k not in DIMS}
    missing = sorted(k for k in own if f"`{k}`" not in listed)
    assert not missing, f"{name}: keys missing from docs/json-output.md's parallel section: {missing}"


def test_a_non_snake_case_key_is_found_at_any_depth():
    doc = {"ok": [{"deep": {"median skew ms": 1}}], "plan": {"Bad": 1}}
    assert {k for k in keys(doc) if not KEY.match(k)} == {"median skew ms", "Bad"}


def test_the_cluster_objects_keys_are_its_documented_ones(capsys):
    """`cluster` is the Cluster's own schema (FOREIGN above); its row in docs/json-output.md names every
    key, the NVLink domain included, for a DGX (one host: null) and an NVL72 rack alike."""
    row = next(line for line in parallel_section().splitlines() if line.startswith("| `cluster` |"))
    for cluster in ("dgx-h100", "gb200-nvl72"):
        plan_cli.main([*GPT3[:2], "--cluster", cluster, *GPT3[4:], "--json"])
        doc = json.loads(capsys.readouterr().out)["cluster"]
        found = {*doc, *doc["intra"], *doc["inter"]}
        assert found == set(re.findall(r"`(\w+)`", row)) - {"cluster"}
        assert doc["nvlink_domain"] == (72 if cluster == "gb200-nvl72" else None)
