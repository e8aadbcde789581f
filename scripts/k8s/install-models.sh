#!/usr/bin/env bash
# Schemas of third-party kinds (KEDA ScaledObject, Gateway API HTTPRoute) from the npm registry, for the
# tests that validate what the operator renders for them. Cached; skipped when package.json is unchanged.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${CACHE:-$HOME/.cache/nightjar}/k8s-models"
stamp="$dest/.package.json"
mkdir -p "$dest"
cp "$here/models/validate.mjs" "$dest/"  # ESM resolves imports next to the script: it lives by node_modules
if [ -d "$dest/node_modules" ] && cmp -s "$here/models/package.json" "$stamp"; then
  echo "[k8s-models] cached: $dest"; exit 0
fi
command -v npm >/dev/null || { echo "[k8s-models] npm is missing: apt-get install nodejs npm" >&2; exit 1; }
cp "$here/models/package.json" "$dest/"
(cd "$dest" && npm install --no-audit --no-fund --silent)
cp "$here/models/package.json" "$stamp"
echo "[k8s-models] installed in $dest"
