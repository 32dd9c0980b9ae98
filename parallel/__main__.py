"""`python -m parallel <command>`: plan | train | search.

Each command lives in its own module with a `main(argv) -> int`, imported only when asked for, so
`plan` and `search` never import torch.
"""

import sys

from parallel.cli import COMMANDS
from parallel.cli.dispatch import dispatch


def main(argv=None) -> int:
    return dispatch("python -m parallel", COMMANDS, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
