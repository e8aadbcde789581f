#!/usr/bin/env bash
# Run a Prometheus on loopback that scrapes local Nightjar workers (and optionally the operator)
# with the chart's recording rules and alerts, e.g. next to `make demo` or `nightjar-worker serve`.
#
#   scripts/prometheus/run.sh [--port 9090] [--deployment NAME] [--operator HOST:PORT] WORKER_HOST:PORT...
#
# The config is generated under $NIGHTJAR_PROM_DIR (default ~/.cache/nightjar/prometheus); the
# scrape relabelling matches the chart's PodMonitor (nightjar_deployment label, vllm_* -> vllm:*).
# Runs in the foreground; needs `make prometheus`.
set -euo pipefail

port=9090 deployment=local operator="" workers=()
while [ $# -gt 0 ]; do
    case "$1" in
        --port) port=$2; shift 2 ;;
        --deployment) deployment=$2; shift 2 ;;
        --operator) operator=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) workers+=("$1"); shift ;;
    esac
done
if [ ${#workers[@]} -eq 0 ] && [ -z "$operator" ]; then
    echo "run.sh: give at least one worker HOST:PORT (or --operator HOST:PORT)" >&2
    exit 2
fi
command -v prometheus >/dev/null || { echo "run.sh: prometheus not installed: make prometheus" >&2; exit 1; }

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${NIGHTJAR_PROM_DIR:-$HOME/.cache/nightjar/prometheus}
mkdir -p "$dir/data"
cfg=$dir/prometheus.yml
{
    echo "global: {scrape_interval: 5s, evaluation_interval: 5s}"
    echo "rule_files:"
    for f in "$root"/charts/nightjar/rules/*.yaml; do echo "  - $f"; done
    echo "scrape_configs:"
    if [ ${#workers[@]} -gt 0 ]; then
        echo "  - job_name: nightjar-workers"
        echo "    static_configs:"
        echo "      - targets: [$(IFS=,; echo "${workers[*]}")]"
        echo "        labels: {namespace: local, nightjar_deployment: $deployment}"
        echo "    metric_relabel_configs:"
        echo "      - {source_labels: [__name__], regex: 'vllm_(.+)', target_label: __name__, replacement: 'vllm:\$1'}"
    fi
    if [ -n "$operator" ]; then
        echo "  - job_name: nightjar-operator-metrics"
        echo "    honor_labels: true"
        echo "    static_configs: [{targets: [$operator]}]"
    fi
} > "$cfg"
promtool check config "$cfg" >/dev/null
echo "prometheus on http://127.0.0.1:$port (config $cfg)" >&2
exec prometheus --config.file="$cfg" --storage.tsdb.path="$dir/data" --web.listen-address="127.0.0.1:$port"
