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
# One pytest process per core (MODELHOST_TEST_PROCESSES overrides), a whole test file to each at a
# time: a file's tests share their module's servers and models. Most tests wait on servers and worker
# processes, so two of them on two cores take about half the time of one.
.venv/bin/pytest -n "${MODELHOST_TEST_PROCESSES:-auto}" --dist loadfile "$@"
