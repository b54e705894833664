#!/usr/bin/env bash
# Sets up .venv if needed, then serves the default model on 127.0.0.1:8000.
# Any arguments go to `steward serve` (e.g. ./serve.sh --port 9000).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/steward serve "$@"
