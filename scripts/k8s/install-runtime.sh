#!/usr/bin/env bash
# Install and configure what a real node needs on this machine: containerd + runc + the CNI plugins
# (bridge, host-local, loopback, portmap), and buildah/podman to build the project's images, all from
# Debian's packages. Idempotent; needs root (or sudo). See docs/test-cluster.md ("Real pods").
#
# Two settings are not defaults, both forced by the sandbox this runs in (no CAP_SYS_RESOURCE,
# hybrid cgroup v1 mount):
#   - OCI rlimits below the hard limits (podman/buildah `default_ulimits`), else every RUN fails;
#   - containerd's `restrict_oom_score_adj = true`, else every pod sandbox fails with
#     "runc create failed: can't get final child's PID from pipe: EOF".
# containerd itself is configured by the cluster harness (its own config and state dirs per
# cluster); this script only installs the binaries.
set -euo pipefail
log() { echo "[install-runtime] $*" >&2; }
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { log "needs root (or sudo) to install containerd, runc and podman"; exit 1; }
    SUDO=sudo
else
    SUDO=""
fi

PKGS=(containerd runc containernetworking-plugins podman buildah debootstrap busybox-static iptables conntrack uidmap fuse-overlayfs)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The Debian package starts containerd from systemd where there is one; the harness runs its own.

CONF=/etc/containers/containers.conf
if ! grep -qs '^default_ulimits' "$CONF"; then
    log "writing $CONF (runc, rlimits below the sandbox's hard limits)"
    $SUDO mkdir -p /etc/containers
    $SUDO tee -a "$CONF" >/dev/null <<'TOML'
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
TOML
fi
# No registry is reachable here: short names must not trigger a prompt or a pull.
REG=/etc/containers/registries.conf.d/50-nightjar.conf
if [ ! -f "$REG" ]; then
    $SUDO mkdir -p "$(dirname "$REG")"
    echo 'short-name-mode = "permissive"' | $SUDO tee "$REG" >/dev/null
fi
for b in containerd runc ctr buildah podman; do command -v "$b" >/dev/null || { log "missing $b after install"; exit 1; }; done
log "ready: $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), buildah $(buildah --version | awk '{print $3}')"
