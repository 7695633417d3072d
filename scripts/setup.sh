#!/usr/bin/env bash
# Create .venv and install modelhost. `setup.sh dev` also installs the test tools and the
# PostgreSQL server binaries the test suite starts a throwaway server from.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
# Python 3.11, 3.12 or 3.13 (pyproject's requires-python): $PYTHON, else the first one found.
python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null; then python="$candidate"; break; fi
    done
fi
[ -n "$python" ] || { echo "setup.sh: Python 3.11, 3.12 or 3.13 is needed (or name one in PYTHON)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    "$python" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first, pinned, by pip: a build already on this machine (pip's configured find-links, e.g. the CPU
# wheel in /opt/wheels) where there is one for this Python, else PyPI's, which on Linux is the CUDA
# build (several GB). An unpinned torch would pull the newest CUDA build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if pip install --no-index --no-deps torch==2.13.0 2>/dev/null; then
        pip install torch==2.13.0  # its dependencies
        echo "==> installed torch==2.13.0 from the build on this machine"
    else
        echo "==> no torch==2.13.0 build on this machine for $("$python" -V): downloading it from the package index"
        echo "    (on Linux that is the CUDA build, several GB; a CPU-only machine may install the CPU build first:"
        echo "    .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)"
        pip install torch==2.13.0
    fi
fi
# Everything else by uv: the same resolution as pip's, in about a minute instead of six. It keeps the
# torch installed above (torch>=2.13,<2.15 is satisfied). MODELHOST_INSTALLER=pip installs with pip
# alone, e.g. where a private index is configured for pip only.
if [ "${MODELHOST_INSTALLER:-uv}" = uv ]; then
    [ -x .venv/bin/uv ] || pip install "uv>=0.9"
    install() { .venv/bin/uv pip install --python .venv/bin/python -q "$@"; }
else
    install() { pip install "$@"; }
fi
echo "==> installing modelhost ($mode)"
if [ "$mode" = dev ]; then
    install -e ".[dev]"
    # LiteLLM (a client the tests drive) caps huggingface-hub below 2, which transformers 5 needs: it is
    # installed without its pins; what it uses at run time is installed above (openai, httpx, tiktoken...).
    install --no-deps "litellm==1.109.1" "fastuuid>=0.14,<1" && install "h2>=3,<5"
    if ! { command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/initdb" ]; }; then
        echo "==> installing PostgreSQL server binaries (Debian package postgresql)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
else
    install -e .
fi
# The console's third-party browser assets (uPlot, pinned by console/package-lock.json): installed by npm
# from its registry and copied into the package, where the gateway serves them itself (no CDN at run
# time). Without npm the console still works, without its plots.
vendor=src/modelhost/console/static/vendor
if command -v npm >/dev/null; then
    echo "==> installing the console's assets (npm ci in console/: uPlot)"
    if (cd console && npm ci --omit=dev --no-audit --no-fund --loglevel=error >/dev/null); then
        mkdir -p "$vendor"
        cp console/node_modules/uplot/dist/uPlot.iife.min.js console/node_modules/uplot/dist/uPlot.min.css "$vendor/"
        cp console/node_modules/uplot/LICENSE "$vendor/uPlot.LICENSE"
    else
        echo "==> npm ci failed (no registry?): the console (/console) will work WITHOUT its plots"
    fi
else
    echo "==> npm not found: the console (/console) will work WITHOUT its plots (install Node.js's npm and run"
    echo "    scripts/setup.sh again to get them)"
fi
if [ "$mode" = dev ] && ! command -v chromium >/dev/null; then
    # The console's browser tests (tests/test_console.py) drive Debian's headless Chromium with Playwright.
    if [ "$(id -u)" = 0 ]; then
        echo "==> installing Chromium (Debian package chromium) for the console's browser tests"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "==> chromium not found and not root: tests/test_console.py will be skipped (apt-get install chromium)"
    fi
fi
# Bytecode for everything installed and for our own source, compiled once here: uv writes none, and where
# PYTHONDONTWRITEBYTECODE is set nothing writes it later, so every process (each replica worker, each
# gateway) would compile transformers' and torch's sources again at import: about 2 s of CPU per
# replica start. Files already compiled are skipped; a few test files of other packages that are
# not valid Python 3 fail to compile, which is harmless.
echo "==> compiling bytecode"
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" src >/dev/null 2>&1 || true
