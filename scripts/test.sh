#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, test. Any failure (pytest's exit 5 too) fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELHOST_SETUP_VLLM=0 bash scripts/setup.sh dev
# vLLM's environment (.venv-vllm, 2 to 7 minutes cold) installs in the background while the lint and the
# tests run (`setup.sh vllm`, niced: the tests keep their CPU): its output goes to .venv-vllm.setup.log,
# its state to .venv-vllm.setup (`installing <pid>`, then `ok` or `failed: <reason>`), which the tests
# that need vLLM wait on (tests/vllm_setup.py). A failed install fails no test run: those tests skip,
# saying why. MODELHOST_SETUP_VLLM=0 installs nothing of vLLM.
vllm_pid=
if [ "${MODELHOST_SETUP_VLLM:-1}" != 0 ]; then
    echo "==> installing vLLM (.venv-vllm) in the background: log in .venv-vllm.setup.log"
    # its own process group (setsid), so that an interrupted run stops pip / uv too
    if command -v setsid >/dev/null; then
        setsid -w nice -n 10 bash scripts/setup.sh vllm >.venv-vllm.setup.log 2>&1 </dev/null &
    else
        nice -n 10 bash scripts/setup.sh vllm >.venv-vllm.setup.log 2>&1 </dev/null &
    fi
    vllm_pid=$!
fi
vllm_outcome() {
    local rc=$?
    if [ -n "$vllm_pid" ]; then
        if kill -0 "$vllm_pid" 2>/dev/null; then echo "==> waiting for the vLLM install (.venv-vllm.setup.log)"; fi
        wait "$vllm_pid" 2>/dev/null || true
        local status
        status=$(cat .venv-vllm.setup 2>/dev/null || echo "no status written")
        echo "==> vLLM (.venv-vllm), installed in the background: $status"
        case "$status" in ok) ;; *) tail -n 15 .venv-vllm.setup.log | sed 's/^/    /' ;; esac
    fi
    exit "$rc"
}
trap vllm_outcome EXIT
mypy_pid=
trap '[ -z "$mypy_pid" ] || kill "$mypy_pid" 2>/dev/null; [ -z "$vllm_pid" ] || kill -TERM -- "-$vllm_pid" 2>/dev/null || kill -TERM "$vllm_pid" 2>/dev/null; exit 130' INT TERM
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "==> ruff"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
echo "==> import contracts"
.venv/bin/lint-imports
# mypy checks the package from scratch on a fresh clone (about 35 to 75 s of one core here), so it runs
# beside pytest: its report is printed, and its verdict counted, once both have ended. Its cache is kept
# in the user's cache folder (as the tests' built models are), not in the clone: a fresh clone then checks
# only what changed since the last run anywhere on this machine (about 1 s), and the cores go to pytest.
# mypy checks each cached module against its source's hash, so another clone's entries are safe to meet.
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modelhost/mypy}"
mypy_log=$(mktemp)
echo "==> mypy (beside pytest: its report follows pytest's)"
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
echo "==> pytest"
# One pytest process per core (MODELHOST_TEST_PROCESSES overrides), a whole test file to each at a
# time: a file's tests share their module's servers and models, the slowest files first (tests/conftest.py
# orders them; pytest-xdist's own reordering by test count is turned off). Most tests wait on servers and worker
# processes, so two of them on two cores take about half the time of one.
pytest_rc=0
.venv/bin/pytest -n "${MODELHOST_TEST_PROCESSES:-auto}" --dist loadfile --no-loadscope-reorder "$@" || pytest_rc=$?
# The gateway's CPU per request against its committed budget (bench/cpu_budget.py, about a minute; on a
# quiet machine, after the suite): a change that makes every request dearer fails here. Skipped when
# pytest was given arguments (a part of the suite) or MODELHOST_CPU_BUDGET=0.
budget_rc=0
if [ "$#" = 0 ] && [ "${MODELHOST_CPU_BUDGET:-1}" != 0 ]; then
    echo "==> gateway CPU per request against its budget (bench/cpu_budget.json)"
    .venv/bin/python -m bench.cpu_budget --check || budget_rc=$?
fi
echo "==> mypy"
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
mypy_pid=
cat "$mypy_log"
rm -f "$mypy_log"
if [ "$pytest_rc" != 0 ]; then exit "$pytest_rc"; fi
if [ "$budget_rc" != 0 ]; then exit "$budget_rc"; fi
exit "$mypy_rc"
