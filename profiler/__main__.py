"""`python -m profiler <command>`: run | commbench | analyze | calibrate | whatif | lab | tpsweep.

Each command lives in its own module with a `main(argv) -> int`; it is imported only when asked for,
so `analyze` never pays for importing torch.
"""

import sys

from parallel.cli.dispatch import dispatch
from profiler.cli import COMMANDS


def main(argv=None) -> int:
    return dispatch("python -m profiler", COMMANDS, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
