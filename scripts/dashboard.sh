#!/usr/bin/env bash
# Installs (once) and opens the dashboard on http://127.0.0.1:8501 (`parascope dashboard`, flags pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/parascope dashboard --server.port "${PORT:-8501}" "$@"
