"""The fleet loop reading worker series from a real Prometheus (``/federate``) instead of the pods."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import wait_for
from nightjar_operator.fleet.aggregate import aggregate, extract
from nightjar_operator.handlers.fleet_tick import FleetSettings, PodTarget, scrape_direct, scrape_prometheus

pytestmark = pytest.mark.prometheus

SIMWORKER = Path(__file__).with_name("simworker.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def test_federate_source_splits_series_per_pod(tmp_path):
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus not installed: run `make prometheus`", pytrace=False)
    port = _port()
    ips = [f"127.0.{random.randint(100, 200)}.{i}" for i in (11, 12)]
    procs = [subprocess.Popen([sys.executable, str(SIMWORKER), "--host", ip, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) for ip in ips]  # fmt: skip
    prom_port = _port()
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{
            "job_name": "workers",
            "static_configs": [{"targets": [f"{ip}:{port}"], "labels": {"namespace": "ns1", "pod": f"pod-{i}"}}
                               for i, ip in enumerate(ips)],
        }],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    prom = subprocess.Popen(
        [exe, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{prom_port}"
    try:
        def up() -> bool:
            try:
                r = httpx.get(url + "/api/v1/query", params={"query": "count(nightjar_planner_count)"}, timeout=2)
                res = r.json()["data"]["result"]
                return bool(res) and float(res[0]["value"][1]) > 0 and len(
                    httpx.get(url + "/api/v1/query", params={"query": "up == 1"}, timeout=2).json()["data"]["result"]) == 2
            except (httpx.HTTPError, KeyError, ValueError):
                return False

        wait_for(up, 40, "Prometheus scraping both simulated workers")
        targets = [PodTarget(f"pod-{i}", f"uid-{i}", ip, port, "stable") for i, ip in enumerate(ips)]
        targets.append(PodTarget("pod-gone", "uid-gone", "127.0.0.1", 1, "stable"))
        settings = FleetSettings(prometheus_url=url)
        via_prom = scrape_prometheus(targets, "ns1", settings)
        assert via_prom["uid-gone"] == "no series in Prometheus"
        direct = scrape_direct(targets[:2], FleetSettings())
        for uid in ("uid-0", "uid-1"):
            s = via_prom[uid]
            assert not isinstance(s, str), s
            pods = {s2.label("pod") for s2 in s.samples}
            assert pods == {f"pod-{uid[-1]}"}  # only this pod's series
            pm, dm = extract(s, 0.0), extract(direct[uid], 0.0)
            # Same families through both paths (values move between the two reads).
            assert pm.planner.keys() and set(pm.planner) <= set(dm.planner) | set(pm.planner)
            assert pm.ttft is not None and pm.tpot is not None and pm.draft_state == "resident"
            assert pm.generation_tokens and pm.steps
        st = aggregate({u: extract(via_prom[u], 0.0) for u in ("uid-0", "uid-1")})
        assert st.pods == 2 and st.requests > 0 and st.acceptance and st.planner
        # A Prometheus that cannot be reached fails every pod with a reason, never raises.
        bad = scrape_prometheus(targets[:1], "ns1", FleetSettings(prometheus_url="http://127.0.0.1:1"))
        assert bad["uid-0"].startswith("prometheus: ")
    finally:
        prom.terminate()
        for p in procs:
            p.terminate()
        for p in [prom, *procs]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
