# Sourced by build.sh, push.sh and kind-load.sh: the images' names, defined once. They are the
# chart's and the CRD samples' defaults, so a local build needs no override. Env: VERSION (0.1.0),
# REGISTRY (ghcr.io/nightjar-dev).
VERSION=${VERSION:-0.1.0}
REGISTRY=${REGISTRY:-ghcr.io/nightjar-dev}
MODELS_TAG=smollm2-135m  # the bundled pair's model image (images/models.Containerfile)
declare -A TAG=(
    [operator]="$REGISTRY/nightjar-operator:$VERSION"
    [worker-cpu]="$REGISTRY/nightjar-worker:$VERSION-cpu"
    [worker-cuda]="$REGISTRY/nightjar-worker:$VERSION"
    [models]="$REGISTRY/nightjar-models:$MODELS_TAG"
)
