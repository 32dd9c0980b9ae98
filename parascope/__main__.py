"""`python -m parascope <command>`: the same as the `parascope` console command."""

import sys

from parascope.cli import main

if __name__ == "__main__":
    sys.exit(main())
