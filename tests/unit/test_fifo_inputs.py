"""A FIFO (or a device) given where a file is expected is refused at once, never read: a read would
block the CLI forever."""

import os

import pytest

from parallel.cli import plan as plan_cli
from profiler.analyzers.run_inputs import plan_file
from profiler.traces.errors import PlanMismatchError


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "plan.json"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "tiny", "--import", "{fifo}"],
        ["--model", "tiny", "--calibration", "{fifo}"],
        ["--model", "tiny", "--device-fit", "{fifo}"],
    ],
    ids=["import", "calibration", "device-fit"],
)
def test_plan_cli_refuses_a_fifo(fifo, argv, capsys):
    assert plan_cli.main([a.format(fifo=fifo) for a in argv]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_analyze_plan_file_refuses_a_fifo(fifo, tmp_path, capsys):
    with pytest.raises(PlanMismatchError, match="not a regular file"):
        plan_file(str(fifo))
