#!/usr/bin/env bash
# Installs (once) and runs the whole test suite, browser pass and multi-process runs included.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 "$@"
