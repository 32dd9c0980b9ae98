"""Dispatch `python -m <package> <command> ...` to a module per command, imported only when asked
for (so `plan`, `search` and `analyze` never pay for importing torch). Pure: stdlib only."""

from __future__ import annotations

import importlib
import os
import sys

INVOKED: list[str] = []  # how the user typed the program ('parascope', 'python -m parallel'): set by dispatch


def prog_name(default: str) -> str:
    """A subcommand's usage name as the user typed it: 'python -m parallel search' is 'parascope
    search' when `parascope search` ran it."""
    if INVOKED:
        for prefix in ("python -m parallel", "python -m profiler"):
            if default.startswith(prefix + " "):
                return INVOKED[-1] + default[len(prefix) :]
    return default


def dispatch(prog: str, commands: dict[str, tuple[str, str]], argv: list[str]) -> int:
    """Run `commands[argv[0]]`'s module's `main(argv[1:])`; print usage (exit 2) for anything else.
    Output piped into `head` and closed early ends quietly, as a Unix tool does."""
    try:
        return _dispatch(prog, commands, argv)
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so the exit-time flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _dispatch(prog: str, commands: dict[str, tuple[str, str]], argv: list[str]) -> int:
    INVOKED[:] = [prog]
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        width = max(map(len, commands)) + 2
        lines = [f"  {name:<{width}}{doc}" for name, (_, doc) in commands.items()]
        print(f"usage: {prog} <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(commands[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
