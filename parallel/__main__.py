"""`python -m parallel <command>`: plan | train | search.

Each command lives in its own module with a `main(argv) -> int`, imported only when asked for, so
`plan` and `search` never import torch.
"""

import importlib
import sys

COMMANDS = {
    "plan": ("parallel.plan_cli", "validate a plan and print its memory, communication and step time"),
    "train": ("parallel.train", "train the small GPT under a plan (torchrun or the local launcher)"),
    "search": ("parallel.search", "enumerate valid plans for a model and cluster, best first"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<8} {doc}" for name, (_, doc) in COMMANDS.items()]
        print("usage: python -m parallel <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
