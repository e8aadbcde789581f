#!/usr/bin/env bash
# Push the images `make images` built to $REGISTRY (the one documented way to get them into your
# registry: `make images REGISTRY=registry.example.com/nightjar push`), then print the chart values
# and the NightjarDeployment fields that name them.
#
#   scripts/images/push.sh [operator] [worker-cpu] [worker-cuda] [models]
#
# Env: REGISTRY (ghcr.io/nightjar-dev), VERSION (0.1.0), BUILDER (buildah, podman or docker: the
# first found), DRY_RUN=1 prints the commands instead of running them. Log in to the registry first
# (`podman login`, `docker login`). The pause image is the local node's sandbox and is not pushed.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/images/tags.sh
log() { echo "[push] $*" >&2; }

if [ -n "${BUILDER:-}" ]; then :
elif command -v buildah >/dev/null; then BUILDER=buildah
elif command -v podman >/dev/null; then BUILDER=podman
elif command -v docker >/dev/null; then BUILDER=docker
else log "no image tool: install buildah, podman or docker"; exit 1
fi

want=("$@")
[ "${#want[@]}" -gt 0 ] || want=(operator worker-cpu models)
for name in "${want[@]}"; do
    [ -n "${TAG[$name]:-}" ] || { log "unknown or local-only image $name (operator, worker-cpu, worker-cuda, models)"; exit 2; }
    cmd=("$BUILDER" push "${TAG[$name]}")
    if [ -n "${DRY_RUN:-}" ]; then echo "${cmd[*]}"; else log "${cmd[*]}"; "${cmd[@]}"; fi
done
cat <<EOT
# Use them:
#   helm install nightjar charts/nightjar -n nightjar-system --create-namespace \\
#     --set operator.image.repository=$REGISTRY/nightjar-operator
#   NightjarDeployment: spec.image: ${TAG[worker-cpu]} (CUDA: ${TAG[worker-cuda]}),
#     spec.{target,draft}.source.image.reference: ${TAG[models]}
EOT
