#!/usr/bin/env bash
# Sets up .venv with the test dependencies if needed, then runs lint and the test suite.
# Any arguments go to pytest (e.g. ./test.sh -k health).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh test
.venv/bin/ruff check steward tests bench
.venv/bin/ruff format --check steward tests bench
exec .venv/bin/python -m pytest "$@"
