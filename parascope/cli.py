"""`parascope <command> [options]`: the dashboard, and every command of `python -m parallel` and
`python -m profiler`, each the same as its `python -m` form.

    parascope dashboard [streamlit flags]      # serve the dashboard on http://127.0.0.1:8501
    parascope plan --model gpt3-175b --dp 8 --tp 8 --pp 8 --sp --cluster dgx-h100 --nodes 64 ...
    parascope search | train | run | analyze | calibrate | whatif | commbench | lab | tpsweep ...

Subcommands are imported only when asked for, so `plan`, `search` and `analyze` never import torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from parallel.cli import COMMANDS as PARALLEL_COMMANDS
from parallel.cli.dispatch import dispatch
from profiler.cli import COMMANDS as PROFILER_COMMANDS

COMMANDS = {
    "dashboard": ("parascope.cli", "serve the dashboard (streamlit flags pass through; default 127.0.0.1:8501)"),
    **PARALLEL_COMMANDS,
    **PROFILER_COMMANDS,
}
# Server settings of the repository's .streamlit/config.toml, given as flags so that an installed
# `parascope dashboard` started from any directory serves the same way.
DASHBOARD_DEFAULTS = {
    "--server.address": "127.0.0.1",
    "--server.port": "8501",
    "--server.maxUploadSize": "1024",
    "--browser.gatherUsageStats": "false",
}


def app_path() -> Path:
    """The dashboard's app.py: installed as parascope/dashboard/app.py (pyproject maps the repository's
    app.py and pages/ there), or beside this package in a source checkout."""
    try:
        spec = importlib.util.find_spec("parascope.dashboard.app")
    except ModuleNotFoundError:  # an editable install or a plain checkout: no parascope.dashboard
        spec = None
    if spec is not None and spec.origin and Path(spec.origin).is_file():
        return Path(spec.origin)
    return Path(__file__).resolve().parents[1] / "app.py"


def dashboard_argv(flags: list[str]) -> list[str]:
    """`streamlit run APP` with our defaults for every server flag the caller did not give."""
    given = {f.split("=", 1)[0] for f in flags if f.startswith("--")}
    defaults = [f"{k}={v}" for k, v in DASHBOARD_DEFAULTS.items() if k not in given]
    return [sys.executable, "-m", "streamlit", "run", str(app_path()), *defaults, *flags]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "dashboard":
        command = dashboard_argv(argv[1:])
        os.execv(command[0], command)  # the server replaces this process: Ctrl-C and exit codes are its own
    return dispatch("parascope", COMMANDS, argv)
