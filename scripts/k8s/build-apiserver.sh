#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager and kube-scheduler (Kubernetes 1.20) from Debian
# bookworm's `kubernetes` source package, once, and cache them under ~/.cache/nightjar/k8s/bin.
# Also installs the runtime tools the harness needs: etcd-server and openssl.
#
# Why from source: no registry reachable here ships a prebuilt apiserver/envtest, and Docker
# (kind) does not run. See docs/test-cluster.md.
#
# Idempotent: a second run with the binaries present only checks the apt packages.
set -euo pipefail

K8S_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${NIGHTJAR_CACHE:-$HOME/.cache/nightjar}/k8s"
BIN="$CACHE/bin"
SRC="$CACHE/src"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { echo "[build-apiserver] $*" >&2; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

apt_install() {
    # Install only what is missing; apt-get update at most once per run.
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ -z "${APT_UPDATED:-}" ]; then $SUDO apt-get update -qq; APT_UPDATED=1; fi
        log "apt-get install ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# Runtime tools, needed even when the binaries are cached.
apt_install etcd-server openssl

# Bump when the source patches below change: cached binaries with another recipe are rebuilt.
# (Only kube-apiserver carries patches; the other two are rebuilt only when missing.)
RECIPE="2 reflect2-1.0.2 loopback-endpoints"
needed=()
for b in "${BINARIES[@]}"; do
    if [ ! -x "$BIN/$b" ]; then
        needed+=("$b")
    elif [ "$b" = kube-apiserver ] && [ "$(cat "$BIN/.recipe" 2>/dev/null)" != "$RECIPE" ]; then
        needed+=("$b")
    fi
done
if [ "${#needed[@]}" = 0 ]; then
    log "cached: $BIN (${BINARIES[*]})"
    exit 0
fi

start=$(date +%s)

# 1. deb-src lines (the machine's sources are deb-only).
SRC_LIST=/etc/apt/sources.list.d/nightjar-deb-src.sources
if ! grep -rqs '^deb-src .*bookworm\|^Types:.*deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding deb-src entries in $SRC_LIST"
    # deb822 with the same Signed-By as the machine's deb entries (apt rejects mixed values).
    $SUDO tee "$SRC_LIST" >/dev/null <<'LIST'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
LIST
    APT_UPDATED=""
fi
if [ -z "${APT_UPDATED:-}" ]; then $SUDO apt-get update -qq; APT_UPDATED=1; fi

# 2. Toolchain + the reflect2 1.0.2 sources (replacement for the vendored 1.0.1, see below).
apt_install golang-go golang-github-modern-go-reflect2-dev dpkg-dev make rsync

# 3. Source package (download only; we unpack it ourselves).
mkdir -p "$SRC" "$BIN"
cd "$SRC"
if ! ls kubernetes_*.dsc >/dev/null 2>&1; then
    log "apt-get source --download-only kubernetes=$K8S_VERSION"
    apt-get source -qq --download-only "kubernetes=$K8S_VERSION"
fi
TREE="$SRC/tree"
if [ ! -f "$TREE/.unpacked" ]; then
    rm -rf "$TREE"
    log "unpacking"
    dpkg-source --no-check --no-copy -x kubernetes_*.dsc "$TREE" >/dev/null
    touch "$TREE/.unpacked"
fi

# 4. Pitfall: vendored github.com/modern-go/reflect2 v1.0.1 makes kube-apiserver SIGSEGV
#    (runtime.mapiterinit) on the first custom-resource POST when built with Go >= 1.18.
#    Debian ships 1.0.2 sources, which fix it; swap them in (no *_test.go).
R2="$TREE/vendor/github.com/modern-go/reflect2"
if [ ! -f "$R2/.debian-1.0.2" ]; then
    log "replacing vendored reflect2 with Debian's 1.0.2"
    rm -f "$R2"/*.go "$R2"/*.s
    dpkg -L golang-github-modern-go-reflect2-dev \
        | grep -E '/github.com/modern-go/reflect2/[^/]+\.(go|s)$' | grep -v '_test\.go$' \
        | while read -r f; do cp "$f" "$R2/"; done
    ls "$R2"/*.go >/dev/null
    touch "$R2/.debian-1.0.2"
fi

# 5. Test-only patch: core validation rejects loopback addresses in Endpoints ("may not be in the
#    loopback range"), but the node agent's pod IPs are 127.0.0.x so that tests can serve real HTTP at
#    them without root or network setup. Allow loopback in validateNonSpecialIP (EndpointSlices and pod
#    IPs already accept it). Nothing else changes.
VAL="$TREE/pkg/apis/core/validation/validation.go"
if [ ! -f "$TREE/.patched-loopback" ]; then
    log "patching Endpoints validation to accept loopback pod IPs"
    python3 - "$VAL" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
pat = re.compile(r"\n\tif ip\.IsLoopback\(\) \{\n\t\tallErrs = append\(allErrs, field\.Invalid\(fldPath, ipAddress, \"may not be in the loopback range \(127\.0\.0\.0/8\)\"\)\)\n\t\}")
s, n = pat.subn("\n\t// nightjar test build: loopback allowed (pod IPs are 127.0.0.x)", s)
if n != 1:
    sys.exit(f"loopback check not found exactly once in {p} ({n})")
open(p, "w").write(s)
PY
    touch "$TREE/.patched-loopback"
fi

# 6. Build (static, no cgo), niced: the machine is shared.
log "building ${needed[*]} (about 8+ minutes cold on an idle 2-core machine)"
cd "$TREE"
# No GOFLAGS here: hack/lib/golang.sh folds GOFLAGS into its -tags list and breaks on extra flags.
unset GOFLAGS
export GOTOOLCHAIN=local GOCACHE="$CACHE/gocache"
CGO_ENABLED=0 nice -n 10 make WHAT="${needed[*]/#/cmd/}" >"$CACHE/build.log" 2>&1 \
    || { tail -40 "$CACHE/build.log" >&2; exit 1; }
for b in "${needed[@]}"; do
    out=$(find "$TREE/_output" -type f -name "$b" -perm -u+x | head -1)
    [ -n "$out" ] || { log "missing build output $b"; exit 1; }
    install -m 0755 "$out" "$BIN/$b.tmp" && mv "$BIN/$b.tmp" "$BIN/$b"
done
echo "$RECIPE" >"$BIN/.recipe"
"$BIN/kube-apiserver" --version >&2
log "built in $(( $(date +%s) - start ))s; cached in $BIN"
# Keep the cache small: the tree and go build cache are not needed once the binaries exist.
if [ "${NIGHTJAR_KEEP_K8S_SRC:-0}" != 1 ]; then rm -rf "$TREE" "$CACHE/gocache"; fi
