#!/usr/bin/env bash
# Install Prometheus + promtool from Debian (package `prometheus`), idempotently.
# The package's postinst would start a system service; tests start their own server on loopback
# with a generated config (tests/observability/promutil.py, scripts/prometheus/run.sh), so no service is started.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# No service start from the maintainer scripts (no systemd here, and none is wanted in CI).
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod +x "$policy"
    added_policy=1
fi
trap '[ "$added_policy" = 1 ] && $SUDO rm -f "$policy"' EXIT

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends prometheus; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends prometheus
fi
prometheus --version 2>&1 | head -1
promtool --version 2>&1 | head -1
