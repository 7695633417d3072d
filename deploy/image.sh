#!/usr/bin/env bash
# Build modelhost's images with podman, without a registry (docs/deploy.md):
#   deploy/image.sh [default|vllm|cuda ...]   (default: default)
# 1. the base: a Debian rootfs made by mmdebstrap from Debian's repositories, `podman import`ed as
#    localhost/modelhost-base:bookworm (once; MODELHOST_IMAGE_REBASE=1 makes it again);
# 2. each variant from deploy/Containerfile: localhost/modelhost:<version>[-vllm|-cuda];
# 3. the default one saved as an OCI archive, build/modelhost-<version>.oci.tar (`podman load -i`).
# Environment: MODELHOST_BUILD_CA, a CA bundle for a TLS-intercepting proxy (default: this machine's
# bundle), given to the install step only as a build secret; MODELHOST_WHEELS, a folder of local wheels
# (default /opt/wheels when it holds a CPU torch 2.13.0 build), mounted read-only into the install step.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/containers.conf}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# The base's packages and mirror name its tag, so that a change to either makes a new base
# (localhost/modelhost-base:bookworm names the latest one too: the tests' stand-in images use it)
base_packages=ca-certificates,python3,python3-venv,tini,libnuma1
mirror="${MODELHOST_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base="localhost/modelhost-base:bookworm-$(printf '%s %s' "$base_packages" "$mirror" | sha256sum | cut -c1-8)"
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(default)

need() {
    local missing=()
    for program in "$@"; do command -v "$program" >/dev/null || missing+=("$program"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]} (Debian packages)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman mmdebstrap runc uidmap catatonit >/dev/null
    fi
}
# catatonit: the pause process of the pods `podman kube play` makes (tests/test_image.py)
need podman mmdebstrap runc catatonit

if [ "${MODELHOST_IMAGE_REBASE:-0}" = 1 ] || ! podman image exists "$base"; then
    echo "==> making the base image $base with mmdebstrap (Debian bookworm, minbase)"
    mkdir -p build
    rm -f build/base.tar
    # python3 (3.11, the version of the CPU torch build), venv for setup.sh, tini as PID 1, CA roots,
    # libnuma for vLLM's CPU kernels
    mmdebstrap --quiet --variant=minbase --include="$base_packages" bookworm build/base.tar "$mirror"
    podman import --quiet build/base.tar "$base" >/dev/null
    rm -f build/base.tar
fi
podman tag "$base" localhost/modelhost-base:bookworm

# the console's assets (uPlot, by npm) into src/, which the build copies: the image needs no npm
bash scripts/setup.sh console

build_args=(--format docker --layers --build-arg "BASE=$base" --build-arg "VERSION=$version" --build-arg "REVISION=$revision")
ca="${MODELHOST_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
[ -s "$ca" ] && build_args+=(--secret "id=ca,src=$ca")
wheels="${MODELHOST_WHEELS:-/opt/wheels}"
if compgen -G "$wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
    build_args+=(--volume "$(realpath "$wheels"):/wheels:ro")
else
    build_args+=(--build-arg "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu")
fi

# the builds these replace, left untagged, go at the end (modelhost's own images only: by label)
trap 'podman image prune --force --filter label=org.opencontainers.image.title=modelhost >/dev/null' EXIT
for variant in "${variants[@]}"; do
    case "$variant" in
        default) target=modelhost tag="$version" ;;
        vllm) target=modelhost-vllm tag="$version-vllm" ;;
        cuda) target=modelhost-cuda tag="$version-cuda" ;;
        *) echo "image.sh: unknown variant $variant (default, vllm, cuda)" >&2; exit 2 ;;
    esac
    echo "==> building localhost/modelhost:$tag (target $target)"
    started=$SECONDS
    podman build "${build_args[@]}" --target "$target" -f deploy/Containerfile -t "localhost/modelhost:$tag" .
    echo "==> localhost/modelhost:$tag: $(podman image inspect --format '{{.Size}}' "localhost/modelhost:$tag" |
        awk '{printf "%.2f GB", $1 / 1e9}'), built in $((SECONDS - started)) s"
    if [ "$variant" = default ]; then
        mkdir -p build
        rm -f "build/modelhost-$version.oci.tar"
        podman save --format oci-archive -o "build/modelhost-$version.oci.tar" "localhost/modelhost:$tag"
        echo "==> saved build/modelhost-$version.oci.tar ($(du -h "build/modelhost-$version.oci.tar" | cut -f1))"
    fi
done
