#!/usr/bin/env bash
# Load the images `make images` built into a kind cluster, for users with Docker and kind.
# NOT RUN by this repository's tests (the machines that test it have no Docker); the project's own
# end-to-end test runs the same images on a real kubelet instead (tests/e2e, `make e2e`).
#
#   scripts/images/kind-load.sh [cluster-name]      (default: nightjar; `make kind-up` creates it)
set -euo pipefail
CLUSTER=${1:-nightjar}
VERSION=${VERSION:-0.1.0}
REGISTRY=${REGISTRY:-ghcr.io/nightjar-dev}
IMAGES=("$REGISTRY/nightjar-operator:$VERSION" "$REGISTRY/nightjar-worker:$VERSION-cpu" "$REGISTRY/nightjar-models:smollm2-135m")
command -v kind >/dev/null || { echo "kind-load: 'kind' is not on the PATH" >&2; exit 1; }
for img in "${IMAGES[@]}"; do
    if command -v docker >/dev/null && docker image inspect "$img" >/dev/null 2>&1; then
        kind load docker-image "$img" --name "$CLUSTER"
    else  # built with buildah/podman: hand kind an archive
        archive=$(mktemp --suffix=.tar)
        podman save --format docker-archive -o "$archive" "$img"
        kind load image-archive "$archive" --name "$CLUSTER"
        rm -f "$archive"
    fi
done
echo "loaded into kind cluster $CLUSTER: ${IMAGES[*]}"
