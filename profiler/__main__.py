"""`python -m profiler <command>`: run | commbench | analyze | lab | tpsweep.

Each command lives in its own module with a `main(argv) -> int`; it is imported only when asked for,
so `analyze` never pays for importing torch.
"""

import importlib
import sys

COMMANDS = {
    "run": ("profiler.run_cli", "profile a parallel job on every rank into a run directory"),
    "commbench": ("profiler.commbench", "time collectives and fit latency/bandwidth per link"),
    "analyze": ("profiler.analyze_cli", "load and analyse per-rank Kineto traces"),
    "lab": ("profiler.lab", "two-node lab: network namespaces joined by a shaped link"),
    "tpsweep": ("profiler.tpsweep", "measure TP scaling across the lab's node boundary"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {doc}" for name, (_, doc) in COMMANDS.items()]
        print("usage: python -m profiler <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
