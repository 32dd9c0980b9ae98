"""`python -m profiler <command>`: run | commbench | analyze | lab | tpsweep.

Each command lives in its own module with a `main(argv) -> int`; it is imported only when asked for,
so `analyze` never pays for importing torch.
"""

import sys

from parallel.subcommands import dispatch

COMMANDS = {
    "run": ("profiler.run_cli", "profile a parallel job on every rank into a run directory"),
    "commbench": ("profiler.commbench", "time collectives and fit latency/bandwidth per link"),
    "analyze": ("profiler.analyze_cli", "load and analyse per-rank Kineto traces"),
    "lab": ("profiler.lab", "two-node lab: network namespaces joined by a shaped link"),
    "tpsweep": ("profiler.tpsweep", "measure TP scaling across the lab's node boundary"),
}


def main(argv=None) -> int:
    return dispatch("python -m profiler", COMMANDS, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
