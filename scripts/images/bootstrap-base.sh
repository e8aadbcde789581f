#!/usr/bin/env bash
# Base images from Debian's packages, for machines that reach no image registry (this one):
#   localhost/nightjar/python:3.11-bookworm   stands in for python:3.11-slim-bookworm
#                                              (debootstrap minbase + python3, python3-venv)
#   localhost/nightjar/busybox:bookworm        stands in for busybox (busybox-static, FROM scratch)
# Each is built once and kept in the container storage; a second run only checks they exist.
# Usage: bootstrap-base.sh <builder: podman|buildah> (the one whose storage the builds use)
set -euo pipefail
BUILDER=${1:-podman}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PY_IMAGE=localhost/nightjar/python:3.11-bookworm
BB_IMAGE=localhost/nightjar/busybox:bookworm
log() { echo "[bootstrap-base] $*" >&2; }

exists() { $BUILDER image exists "$1" 2>/dev/null || $BUILDER inspect --type image "$1" >/dev/null 2>&1; }

# import_rootfs DIR IMAGE CMD: a single-layer image of DIR's contents (podman import, or buildah's
# from-scratch + add + commit where only buildah is installed; both share the container storage).
import_rootfs() {
    local dir=$1 image=$2 cmd=$3
    if command -v podman >/dev/null; then
        tar -C "$dir" --numeric-owner -c . | podman import --change 'ENV LANG=C.UTF-8' --change "CMD [\"$cmd\"]" - "$image" >/dev/null
    else
        local tarball ctr
        tarball=$(mktemp --suffix=.tar)
        tar -C "$dir" --numeric-owner -cf "$tarball" .
        ctr=$(buildah from scratch)
        buildah add "$ctr" "$tarball" / >/dev/null
        buildah config --env LANG=C.UTF-8 --cmd "$cmd" "$ctr"
        buildah commit -q "$ctr" "$image" >/dev/null
        buildah rm "$ctr" >/dev/null
        rm -f "$tarball"
    fi
}

if ! exists "$PY_IMAGE"; then
    command -v debootstrap >/dev/null || { log "debootstrap missing: run scripts/k8s/install-runtime.sh"; exit 1; }
    root=$(mktemp -d /var/tmp/nightjar-rootfs.XXXXXX)
    trap 'rm -rf "$root" "$root.log"' EXIT
    t0=$(date +%s)
    log "debootstrap $SUITE (minbase + python3) into $root"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
    # What the slim images drop too: apt lists, caches, docs, man pages, locales but C.
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
        "$root"/usr/share/info/* "$root"/var/log/* "$root.log"
    find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C*' -exec rm -rf {} +
    ln -sf python3 "$root"/usr/bin/python
    import_rootfs "$root" "$PY_IMAGE" python3
    rm -rf "$root"; trap - EXIT
    log "$PY_IMAGE built in $(( $(date +%s) - t0 )) s"
fi

if ! exists "$BB_IMAGE"; then
    root=$(mktemp -d /var/tmp/nightjar-busybox.XXXXXX)
    mkdir -p "$root/bin" "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    import_rootfs "$root" "$BB_IMAGE" sh
    rm -rf "$root"
    log "$BB_IMAGE built"
fi
echo "$PY_IMAGE $BB_IMAGE"
