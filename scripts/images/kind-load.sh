#!/usr/bin/env bash
# Load the images `make images` built into a kind cluster, for users with Docker and kind.
# NOT RUN by this repository's tests (the machines that test it have no Docker); the project's own
# end-to-end test runs the same images on a real kubelet instead (tests/e2e, `make e2e`).
#
#   scripts/images/kind-load.sh [cluster-name]      (default: nightjar; `make kind-up` creates it)
set -euo pipefail
CLUSTER=${1:-nightjar}
cd "$(dirname "$0")/../.."
source scripts/images/tags.sh
IMAGES=("${TAG[operator]}" "${TAG[worker-cpu]}" "${TAG[models]}")
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
