#!/usr/bin/env bash
# Open WebUI's own environment .venv-openwebui, for the client test that drives it against a live
# modelhost (tests/test_client_openwebui.py, `make test-clients`; issue 59). Its pins (fastapi,
# transformers, pydantic...) are not ours, so it never goes into .venv. Made once, as .venv-vllm is:
# - .venv-openwebui/.modelhost-openwebui: the spec installed (open-webui==0.12.4), once `open-webui`
#   runs; without it the environment is not finished (a later run carries on) and the test skips;
# - torch, which Open WebUI's local retrieval imports, from a build on this machine where pip finds one
#   (the CPU build in pip's find-links), else the package index's (on Linux the CUDA build, several GB).
# About 2.4 GB; with uv's cache warm, seconds, cold several minutes. Nothing of modelhost is installed
# there: the test starts Open WebUI as a program of its own, pointed at modelhost by its environment.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENWEBUI_VERSION=0.12.4
wanted="open-webui==$OPENWEBUI_VERSION"
venv=.venv-openwebui
marker=$venv/.modelhost-openwebui
if [ -x $venv/bin/open-webui ] && [ "$(cat "$marker" 2>/dev/null)" = "$wanted" ]; then
    echo "==> $venv has $wanted"
    exit 0
fi
# Open WebUI 0.12 needs Python 3.11 or 3.12 (its requires-python: <3.13)
python="${PYTHON_OPENWEBUI:-}"
if [ -z "$python" ]; then
    for candidate in python3.11 python3.12; do
        if command -v "$candidate" >/dev/null; then python="$candidate"; break; fi
    done
fi
[ -n "$python" ] || { echo "setup-openwebui.sh: Open WebUI needs Python 3.11 or 3.12 (or name one in PYTHON_OPENWEBUI)" >&2; exit 1; }
echo "==> installing $wanted into $venv for the client tests (once: about 2.4 GB)"
started=$SECONDS
rm -f "$marker"
[ -x $venv/bin/python ] || "$python" -m venv $venv
vpip() { $venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! $venv/bin/python -c "import torch" 2>/dev/null; then
    vpip install --no-index --no-deps torch==2.13.0 2>/dev/null &&
        echo "==> torch==2.13.0 from the build on this machine" ||
        echo "==> no torch build on this machine: the package index's, with Open WebUI's dependencies"
fi
# uv where .venv has it (the same resolution as pip's, in a fraction of the time), else pip. Either keeps
# the torch installed above: it satisfies Open WebUI's (sentence-transformers', accelerate's) ranges.
if [ "${MODELHOST_INSTALLER:-uv}" = uv ] && [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install --python $venv/bin/python -q "$wanted"
else
    vpip install "$wanted"
fi
$venv/bin/open-webui --help >/dev/null || { echo "setup-openwebui.sh: the installed open-webui does not run" >&2; exit 1; }
echo "$wanted" > "$marker"
echo "==> $venv has $wanted ($(du -sh $venv | cut -f1), $((SECONDS - started)) s)"
