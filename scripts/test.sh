#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, test. Any failure (pytest's exit 5 too) fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "==> ruff"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
echo "==> mypy"
.venv/bin/mypy
echo "==> import contracts"
.venv/bin/lint-imports
echo "==> pytest"
# Three processes, each taking whole modules (their live servers are module fixtures); arguments given
# to this script come after (`bash scripts/test.sh -n 0 tests/test_chat.py`) and win.
.venv/bin/pytest -n "${MODELHOST_TEST_PROCESSES:-3}" --dist loadfile "$@"
