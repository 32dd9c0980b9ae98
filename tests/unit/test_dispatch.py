"""parallel.cli.dispatch: every subcommand's usage line names the program the user typed."""

import pytest

from parallel.__main__ import main as parallel_main
from parascope import cli as parascope_cli
from profiler.__main__ import main as profiler_main


@pytest.mark.parametrize("command", ["search", "plan", "analyze", "hang", "calibrate", "whatif", "run"])
def test_usage_names_the_program_typed(command, capsys):
    with pytest.raises(SystemExit):
        parascope_cli.main([command, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: parascope {command} ")
    run = parallel_main if command in ("search", "plan") else profiler_main
    with pytest.raises(SystemExit):
        run([command, "--help"])
    prog = "parallel" if command in ("search", "plan") else "profiler"
    assert capsys.readouterr().out.startswith(f"usage: python -m {prog} {command} ")
