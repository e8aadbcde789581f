#!/usr/bin/env bash
# Build the project's images with whatever builder the machine has (buildah, podman or docker).
#
#   scripts/images/build.sh [operator] [worker-cpu] [worker-cuda] [models] [pause]
#
# Base images are build arguments with the ecosystem's defaults (python:3.11-slim-bookworm,
# busybox:1.36, vllm/vllm-openai). Where those cannot be pulled (no registry reachable), the python
# and busybox bases are bootstrapped from Debian's packages (bootstrap-base.sh). Layers are cached
# (--layers): a rebuild with no change takes seconds. Env:
#   VERSION (0.1.0), REGISTRY (ghcr.io/nightjar-dev), MODELS_DIR (the bundled pair, `make models`),
#   PIP_WHEELS (a directory of wheels mounted into the worker build; default /opt/wheels if present),
#   IMAGES_BASE=auto|registry|debian (auto: registry when the default base pulls, else debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/images/tags.sh
CACHE=${NIGHTJAR_CACHE:-$HOME/.cache/nightjar}
MODELS_DIR=${MODELS_DIR:-$CACHE/models}
PIP_WHEELS=${PIP_WHEELS-$( [ -d /opt/wheels ] && echo /opt/wheels )}
IMAGES_BASE=${IMAGES_BASE:-auto}
REVISION=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
log() { echo "[images] $*" >&2; }

if [ -n "${BUILDER:-}" ]; then :
elif command -v buildah >/dev/null; then BUILDER=buildah
elif command -v podman >/dev/null; then BUILDER=podman
elif command -v docker >/dev/null; then BUILDER=docker
else log "no image builder: install buildah, podman or docker (scripts/k8s/install-runtime.sh)"; exit 1
fi
case $BUILDER in
    buildah) BUILD=(buildah bud --layers --format oci); INSPECT=(buildah inspect --type image) ;;
    podman)  BUILD=(podman build --layers --format oci); INSPECT=(podman image inspect) ;;
    docker)  BUILD=(docker build); INSPECT=(docker image inspect) ;;
esac

TAG[pause]="localhost/nightjar/pause:3.9"  # the local node's sandbox image, never pushed
PY_BASE=python:3.11-slim-bookworm
BB_BASE=busybox:1.36
have_base() { "${INSPECT[@]}" "$1" >/dev/null 2>&1 || timeout 120 "$BUILDER" pull -q "$1" >/dev/null 2>&1; }
if [ "$IMAGES_BASE" = auto ]; then
    if have_base "$PY_BASE" && have_base "$BB_BASE"; then IMAGES_BASE=registry; else IMAGES_BASE=debian; fi
fi
if [ "$IMAGES_BASE" = debian ]; then
    [ "$BUILDER" != docker ] || { log "IMAGES_BASE=debian needs buildah or podman"; exit 1; }
    read -r PY_BASE BB_BASE < <(bash scripts/images/bootstrap-base.sh "$BUILDER")
    log "no registry reachable: bases bootstrapped from Debian ($PY_BASE, $BB_BASE)"
fi

image_size() {
    if command -v podman >/dev/null; then podman image inspect --format '{{.Size}}' "$1"
    else docker image inspect --format '{{.Size}}' "$1"; fi 2>/dev/null || echo 0
}

build() {  # name containerfile context [extra args...]
    local name=$1 file=$2 ctx=$3; shift 3
    local t0; t0=$(date +%s)
    "${BUILD[@]}" -q -f "$file" -t "${TAG[$name]}" \
        --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" "$@" "$ctx" >/dev/null
    local size; size=$(image_size "${TAG[$name]}")
    log "$(printf '%-12s %-52s %6s MB  %3s s' "$name" "${TAG[$name]}" $((size / 1000000)) $(( $(date +%s) - t0 )))"
}

PIP_CACHE="$CACHE/pip-images"
mkdir -p "$PIP_CACHE"
# buildah/podman: RUN --mount=type=cache would keep downloads in the builder's own cache; a host
# directory survives `buildah prune` and is shared by both images.
PIP_VOL=()
[ "$BUILDER" = docker ] || PIP_VOL=(--volume "$PIP_CACHE:/root/.cache/pip")

# pip inside the build trusts what pip here trusts (e.g. a TLS-inspecting proxy's CA).
PIP_CERT=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$PIP_CERT" ] && [ "$BUILDER" != docker ]; then
    PIP_VOL+=(--volume "$PIP_CERT:/etc/pip-ca.crt:ro" --build-arg PIP_CERT=/etc/pip-ca.crt)
fi

want=("$@")
[ "${#want[@]}" -gt 0 ] || want=(operator worker-cpu models pause)
for name in "${want[@]}"; do
    case $name in
        operator)
            build operator images/operator.Containerfile . --build-arg BASE_IMAGE="$PY_BASE" "${PIP_VOL[@]}" ;;
        worker-cpu)
            extra=()
            if [ -n "$PIP_WHEELS" ]; then
                [ "$BUILDER" != docker ] || { log "PIP_WHEELS needs buildah or podman (a build-time volume)"; exit 1; }
                extra=(--volume "$PIP_WHEELS:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels --build-arg TORCH_INDEX_URL=)
            fi
            build worker-cpu images/worker-cpu.Containerfile . --build-arg BASE_IMAGE="$PY_BASE" "${PIP_VOL[@]}" "${extra[@]}" ;;
        worker-cuda)
            build worker-cuda images/worker-cuda.Containerfile . ;;
        models)
            for m in smollm2-135m-instruct smollm2-135m-draft; do
                [ -f "$MODELS_DIR/$m/config.json" ] || { log "missing $MODELS_DIR/$m: run \`make models\`"; exit 1; }
            done
            # Hard links: the build context is the two model directories and nothing else, for free.
            stage="$CACHE/images/models-context"
            rm -rf "$stage" && mkdir -p "$stage"
            cp -al "$MODELS_DIR/smollm2-135m-instruct" "$MODELS_DIR/smollm2-135m-draft" "$stage/"
            chmod -R a+rX "$stage"  # shared inodes: the cached originals become world-readable too
            build models images/models.Containerfile "$stage" --build-arg BASE_IMAGE="$BB_BASE" \
                --build-arg MODELS="SmolLM2-135M-Instruct and its truncated draft" ;;
        pause)
            build pause images/pause.Containerfile images --build-arg BASE_IMAGE="$BB_BASE" ;;
        *) log "unknown image $name (operator, worker-cpu, worker-cuda, models, pause)"; exit 2 ;;
    esac
done
