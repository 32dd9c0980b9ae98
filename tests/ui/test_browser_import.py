"""Plan review's import in a real browser, by upload: the path a user takes with a Megatron-LM launch file,
which AppTest cannot drive (it has no file upload). A `.sbatch` whose training command is built in a
variable and submitted with `sbatch --wrap`, then a file of model arguments alone, which asks for the
Nodes before it gives a plan; a torchtitan config registry (.py), one config picked from it.

Uses tests/ui/test_browser.py's server and Chromium (Debian's, through Playwright's Python API).

    .venv/bin/python -m pytest tests/ui/test_browser_import.py -m slow
"""

from __future__ import annotations

import pytest

from tests.ui import test_browser as tb
from tests.ui.test_review_page import MODEL_ARGS
from tests.unit.test_import import DATA

pytestmark = pytest.mark.slow

browser = tb.browser  # the module-scoped headless Chromium fixture

# the training command built in a string and handed to `sbatch --wrap`, as Megatron-LM's Megatron-FSDP
# example builds TRAINING_CMD (there run through a heredoc)
WRAPPED = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
ARGS=(
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096
    --micro-batch-size 1 --global-batch-size 256 --bf16 --vocab-size 32000
)
TRAINING_CMD="cd /workspace/megatron; python pretrain_gpt.py ${ARGS[@]}"
sbatch --wrap "$TRAINING_CMD"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("import")
    env = {"PARASCOPE_RUNS": str(root / "runs"), "PARASCOPE_UPLOADS": str(root / "up"), "PARASCOPE_DATA": str(root)}
    with tb._streamlit(tmp_path_factory, env=env) as url:
        yield url


def _upload_view(server, browser):
    """(a page on Plan review's Import with Upload chosen, the browser errors it raises)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server}/plan_review?view=import", timeout=tb.PAGE_TIMEOUT_MS)
    tb._wait_for_script(page)
    page.locator('[data-testid="stMain"]').get_by_text("Upload", exact=True).click()
    tb._wait_for_script(page)
    return page, errors


def _read(page, path, nodes: int | None = None) -> str:
    """Upload `path`, set Nodes when given, press Read it: the page's text once the script has settled."""
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    tb._wait_for_script(page)
    if nodes is not None:
        field = page.get_by_role("spinbutton", name="Nodes (0: from the file)")
        field.fill(str(nodes))
        field.press("Enter")
        tb._wait_for_script(page)
    page.get_by_role("button", name="Read it").click()
    tb._wait_for_script(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    return page.locator('[data-testid="stMain"]').inner_text()


def test_upload_a_launch_held_in_a_variable_then_arguments_alone(server, browser, tmp_path):
    (tmp_path / "pretrain.sbatch").write_text(WRAPPED)
    (tmp_path / "model.sh").write_text(MODEL_ARGS)
    page, errors = _upload_view(server, browser)

    shown = _read(page, tmp_path / "pretrain.sbatch")
    assert "megatron L32 h4096 a32, DP2 TP4+SP PP2 gb256, global batch 256, 16 GPUs" in shown
    assert "line 9: the launch read from the variable $TRAINING_CMD (not run by the script here)" in shown

    shown = _read(page, tmp_path / "model.sh")
    assert "model.sh: read as megatron L24 h2048 a16, but the arguments come with no launch command" in shown
    assert "Set Nodes to the nodes of 8 GPUs it runs on" in shown and "Add to compare" not in shown
    shown = _read(page, tmp_path / "model.sh", nodes=2)
    assert "megatron L24 h2048 a16, DP16" in shown and "16 GPUs (2 nodes × 8 GPUs per node)" in shown
    assert "--padded-vocab-size 102400: the vocabulary as given, not padded further" in shown
    assert not errors, errors


def test_upload_a_torchtitan_registry_pick_a_config_and_switch_files(server, browser, tmp_path):
    """A torchtitan config registry by upload: its configs in the Config box, the Nodes asked for (the
    registry leaves data_parallel_shard_degree at -1), the plan named after the config; then another file
    uploaded over it: the plan read from the registry is not shown as the new file's."""
    (tmp_path / "model.sh").write_text(MODEL_ARGS)
    page, errors = _upload_view(server, browser)

    shown = _read(page, DATA / "torchtitan_registry_llama3.py")
    assert "torchtitan_registry_llama3.py: read as llama3-8b, but data_parallel_shard_degree = -1" in shown
    assert "Set Nodes to the nodes of 8 GPUs it runs on" in shown and "Add to compare" not in shown
    config = page.locator('[data-testid="stSelectbox"]').filter(has_text="Config").locator("input")
    config.click()
    options = page.get_by_role("option").all_inner_texts()
    assert options == ["llama3_8b", "llama3_8b_mxfp8", "llama3_70b", "llama3_405b"]
    page.get_by_role("option", name="llama3_70b", exact=True).click()
    tb._wait_for_script(page)
    assert "Changed since the last Read it" in page.locator('[data-testid="stMain"]').inner_text()

    shown = _read(page, DATA / "torchtitan_registry_llama3.py", nodes=8)
    assert "torchtitan: llama3-70b, DP8 TP8+SP ZeRO-3 rc-full" in shown and "64 GPUs (8 nodes × 8 GPUs" in shown
    assert "Add to compare as 'llama3_70b'" in shown

    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(tmp_path / "model.sh"))
    tb._wait_for_script(page)
    shown = page.locator('[data-testid="stMain"]').inner_text()
    assert "llama3-70b" not in shown and "Add to compare" not in shown and "Config" not in shown
    assert "Changed since the last Read it: press Read it to read this file with these settings." in shown
    assert not errors, errors
