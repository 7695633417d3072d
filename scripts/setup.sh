#!/usr/bin/env bash
# Create .venv and install modelhost. `setup.sh dev` also installs the test tools and the
# PostgreSQL server binaries the test suite starts a throwaway server from.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    "$python" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first, pinned: a CPU build lies on disk; an unpinned torch would pull a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "==> installing torch==2.13.0"
    pip install torch==2.13.0
fi
echo "==> installing modelhost ($mode)"
if [ "$mode" = dev ]; then
    pip install -e ".[dev]"
    # LiteLLM (a client the tests drive) caps huggingface-hub below 2, which transformers 5 needs: it is
    # installed without its pins; what it uses at run time is installed above (openai, httpx, tiktoken...).
    pip install --no-deps "litellm==1.109.1" "fastuuid>=0.14,<1" && pip install "h2>=3,<5"
    if ! { command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/initdb" ]; }; then
        echo "==> installing PostgreSQL server binaries (Debian package postgresql)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
else
    pip install -e .
fi
