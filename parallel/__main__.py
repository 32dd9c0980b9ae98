"""`python -m parallel <command>`: plan | train | search.

Each command lives in its own module with a `main(argv) -> int`, imported only when asked for, so
`plan` and `search` never import torch.
"""

import sys

from parallel.subcommands import dispatch

COMMANDS = {
    "plan": ("parallel.plan_cli", "validate a plan and print its memory, communication and step time"),
    "train": ("parallel.train", "train the small GPT under a plan (torchrun or the local launcher)"),
    "search": ("parallel.search", "enumerate valid plans for a model and cluster, best first"),
}


def main(argv=None) -> int:
    return dispatch("python -m parallel", COMMANDS, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
