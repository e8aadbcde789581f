"""The fleet loop on the real apiserver, with real ``/metrics`` endpoints at the pods' loopback IPs.

Containers never run on the test cluster: the node agent reports the worker pods Running/Ready and
gives each a 127.0.0.x IP. At those IPs the tests start simulated workers (``simworker.py``: the
worker's own metrics module driven by the step-level simulator) or, in the ``engine`` test, the real
``nightjar-worker serve`` on the bundled CPU pair. The operator (in-process ``KopfRunner``) scrapes
them with a 1 s interval and short windows.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import helpers
import pytest
import yaml
from helpers import condition, free_port, wait_for
from kopf.testing import KopfRunner
from nightjar_contract.planner import PlannerConfig, PlannerPriors
from nightjar_operator import constants as c
from nightjar_operator.fleet.priors import PriorsConfig
from nightjar_operator.handlers.k8s import Api, make_api_client
from prometheus_client import REGISTRY

pytestmark = pytest.mark.cluster

SIMWORKER = Path(__file__).with_name("simworker.py")
SLO = {"ttftP95Ms": 300, "tpotP95Ms": 40, "attainment": 0.9}






def cr(name: str, **spec: Any) -> dict[str, Any]:
    return helpers.cr(name, **{"slo": SLO, **spec})




def sample(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


class Endpoints:
    """Processes and sockets this test started at pod IPs; all stopped at the end."""

    def __init__(self, port: int, tmp: Path) -> None:
        self.port, self.tmp = port, tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.socks: list[socket.socket] = []

    def simworker(self, ip: str, scale: float = 1.0, offload_reason: str = "enabled") -> None:
        self.set_scale(ip, scale)
        if ip in self.procs and self.procs[ip].poll() is None:
            return  # the IP was reused for a new pod: the same endpoint now answers for it
        log = open(self.tmp / f"simworker-{ip}.log", "w")  # noqa: SIM115 - lives as long as the process
        self.procs[ip] = subprocess.Popen(
            [sys.executable, str(SIMWORKER), "--host", ip, "--port", str(self.port), "--control", str(self._ctl(ip)),
             "--offload-reason", offload_reason],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

        def up() -> bool:
            try:
                with socket.create_connection((ip, self.port), timeout=0.5):
                    return True
            except OSError:
                assert self.procs[ip].poll() is None, (self.tmp / f"simworker-{ip}.log").read_text()
                return False

        wait_for(up, 30, f"simworker on {ip}")

    def hang(self, ip: str) -> None:
        """Accepts TCP connections (kernel backlog) and never answers: a scrape can only time out."""
        s = socket.socket()
        s.bind((ip, self.port))
        s.listen(16)
        self.socks.append(s)

    def _ctl(self, ip: str) -> Path:
        return self.tmp / f"control-{ip}.json"

    def set_scale(self, ip: str, scale: float) -> None:
        tmp = self._ctl(ip).with_suffix(".tmp")
        tmp.write_text(json.dumps({"latency_scale": scale}))
        os.replace(tmp, self._ctl(ip))

    def close(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        for s in self.socks:
            s.close()


@pytest.fixture
def fleet(k8s, crd, namespace, monkeypatch, tmp_path):
    port = free_port()
    for k, v in {
        "NIGHTJAR_FLEET_INTERVAL_S": "1",
        "NIGHTJAR_FLEET_SLO_WINDOW_S": "4",
        "NIGHTJAR_FLEET_SCRAPE_PORT": str(port),
        "NIGHTJAR_FLEET_SCRAPE_TIMEOUT_S": "1",
    }.items():
        monkeypatch.setenv(k, v)
    ep = Endpoints(port, tmp_path)
    try:
        yield Fleet(k8s, Api(make_api_client(k8s.kubeconfig)), namespace, ep)
    finally:
        ep.close()


class Fleet:
    def __init__(self, k8s, api: Api, ns: str, ep: Endpoints) -> None:
        self.k8s, self.api, self.ns, self.ep = k8s, api, ns, ep
        self.run_args = ["run", "--standalone", "--namespace", ns, "-m", "nightjar_operator.main"]

    def apply(self, obj: dict[str, Any]) -> None:
        self.k8s.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(obj))

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.k8s.kubectl("patch", "njd", name, "-n", self.ns, "--type", "merge", "-p", json.dumps({"spec": spec}))

    def njd(self, name: str) -> dict[str, Any]:
        obj = self.api.get(c.KIND, self.ns, name)
        assert obj is not None
        return obj

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.api.get(kind, self.ns, name)

    def pod_ips(self, selector: str, n: int, timeout: float = 40) -> dict[str, str]:
        def enough() -> dict[str, str] | None:
            ips = self.k8s.pod_ips(self.ns, selector, ready_only=True)
            return ips if len(ips) == n else None

        return wait_for(enough, timeout, f"{n} ready pods with IPs for {selector}")

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.api.request("GET", f"/api/v1/namespaces/{self.ns}/events",
                                 query={"fieldSelector": f"involvedObject.name={name}"})["items"]  # fmt: skip
        return [e for e in items if e["involvedObject"]["kind"] == c.KIND]


def track_selector(name: str, track: str) -> str:
    return f"{c.LABEL_DEPLOYMENT}={name},{c.LABEL_TRACK}={track}"


# ----------------------------------------------------------------------------------------------- tests


def test_priors_slo_and_an_unreachable_pod(fleet: Fleet):
    name = "fleet"
    fleet.apply(cr(name, replicas=3))
    with KopfRunner(fleet.run_args, timeout=90) as runner:
        pods = fleet.pod_ips(track_selector(name, c.TRACK_STABLE), 3)
        (hung_pod, hung_ip), *good = sorted(pods.items())
        fleet.ep.hang(hung_ip)
        # One worker cannot offload (as a CUDA worker of this build): the spec's offload Auto is
        # reported as unavailable, naming the reason, while both keep serving.
        for (_, ip), reason in zip(good, ("enabled", "cuda_kv_release_unverified"), strict=True):
            fleet.ep.simworker(ip, offload_reason=reason)

        # Priors aggregated from the two live workers reach the ConfigMap the workers watch.
        def priors() -> PlannerPriors | None:
            cm = fleet.get("ConfigMap", c.config_map_name(name))
            doc = yaml.safe_load(((cm or {}).get("data") or {}).get(c.CONFIG_KEY) or "{}") or {}
            pri = PlannerPriors.model_validate(doc["priors"]) if doc.get("priors") else None
            # the first rounds may aggregate only a few cells: the simulated workers are still learning
            return pri if pri is not None and len(pri.entries) >= 5 else None

        pri = wait_for(priors, 60, "priors of at least 5 cells in the ConfigMap")
        assert pri.bucket_edges == list(PlannerConfig().edges())
        cap = PriorsConfig().max_pseudo_count
        assert all(0 < e.count <= cap and 0 <= e.gamma <= 4 for e in pri.entries)
        cfg = yaml.safe_load(fleet.get("ConfigMap", c.config_map_name(name))["data"][c.CONFIG_KEY])
        # the planner's SLO objective too: the targets and the share of requests they are for
        assert cfg["slo"] == {"ttft_p95_ms": 300, "tpot_p95_ms": 40, "attainment": 0.9}

        # SLOMet with measured p95s and attainment; the hung pod is reported, the others measured.
        def slo(status: str) -> dict[str, Any] | None:
            cond = condition(fleet.njd(name), "SLOMet")
            return cond if cond.get("status") == status else None

        # Level-based: a resync may still carry a transient scrape error of a worker that was just
        # starting; what must hold is the steady state, with exactly the hung pod failing.
        def met_with_one_hung() -> dict[str, Any] | None:
            cond = slo("True")
            return cond if cond and f"scrape failed for 1/3 pods: {hung_pod}" in cond["message"] else None

        met = wait_for(met_with_one_hung, 45, "SLOMet=True with only the hung pod failing")
        msg = met["message"]
        assert "ttft p95=" in msg and "tpot p95=" in msg and "attainment=" in msg, msg
        assert f"scrape failed for 1/3 pods: {hung_pod} (timeout)" in msg, msg
        mem = condition(fleet.njd(name), "ElasticMemory")
        assert mem["status"] == "False" and mem["reason"] == "Unavailable", mem
        assert "1/2 pods serve with the draft always resident (1 pods: cuda_kv_release_unverified)" in mem["message"]
        st = fleet.njd(name)["status"]["fleet"]
        assert st["pods"] == 3 and st["podsScraped"] == 2 and st["requests"] > 0
        assert st["offload"] == {"enabled": 1, "cuda_kv_release_unverified": 1}
        assert st["scrapeErrors"] == [f"{hung_pod}: timeout"]
        labels = {"namespace": fleet.ns, "deployment": name}
        assert (sample("nightjar_operator_scrape_failures_total", **labels) or 0) >= 1
        assert (sample("nightjar_operator_slo_attainment_ratio", **labels) or 0) >= 0.9

        # Push latency over the targets: SLOMet flips within the (4 s) window.
        for _, ip in good:
            fleet.ep.set_scale(ip, 20.0)
        missed = wait_for(lambda: slo("False"), 30, "SLOMet=False")
        assert missed["reason"] == "TargetsMissed" and missed["lastTransitionTime"] >= met["lastTransitionTime"]
        assert (sample("nightjar_operator_slo_attainment_ratio", **labels) or 1) < 0.9
        assert (sample("nightjar_operator_slo_met", **labels)) == 0
    assert "Traceback" not in runner.output, runner.output[-3000:]


def _start_rollout(fleet: Fleet, name: str) -> None:
    fleet.apply(cr(name, replicas=2, rollout={"steps": [50, 100], "analysisWindowSeconds": 10}))


def _wait_adopted(fleet: Fleet, name: str) -> None:
    wait_for(lambda: ((fleet.njd(name).get("status") or {}).get("rollout") or {}).get("stable"), 30, "stable revision")


def _new_draft(fleet: Fleet, name: str) -> None:
    fleet.patch(name, {"draft": {"name": "draft-2", "source": {"imagePath": "/models/draft-2"}}})


def _dep_pair(dep: dict[str, Any] | None) -> tuple[str | None, int | None]:
    ann = ((dep or {}).get("metadata") or {}).get("annotations") or {}
    return ann.get(c.ANN_DRAFT), ((dep or {}).get("spec") or {}).get("replicas")


def test_bad_candidate_is_rolled_back(fleet: Fleet):
    name = "bad"
    _start_rollout(fleet, name)
    with KopfRunner(fleet.run_args, timeout=90) as runner:
        for ip in fleet.pod_ips(track_selector(name, c.TRACK_STABLE), 2).values():
            fleet.ep.simworker(ip)
        _wait_adopted(fleet, name)
        _new_draft(fleet, name)
        cand = wait_for(lambda: fleet.get("Deployment", f"{name}-candidate"), 20, "candidate Deployment")
        assert _dep_pair(cand) == ("draft-2", 1)
        # The stable Deployment keeps the old pair and the stable share (50% of 2 -> 1).
        wait_for(lambda: _dep_pair(fleet.get("Deployment", name)) == ("draft-1", 1), 20, "stable scaled to 1")
        (cip,) = fleet.pod_ips(track_selector(name, "candidate"), 1).values()
        fleet.ep.simworker(cip, scale=20.0)  # a candidate that breaks the SLO

        ro = wait_for(lambda: (r := fleet.njd(name)["status"].get("rollout") or {}).get("phase") == "RolledBack" and r,
                      40, "rollback")  # fmt: skip
        assert ro["lastDecision"]["action"] == "RolledBack"
        assert "candidate SLO attainment" in ro["lastDecision"]["reason"], ro
        assert ro["stable"]["pair"]["draft"]["name"] == "draft-1" and ro.get("candidate") is None
        wait_for(lambda: fleet.get("Deployment", f"{name}-candidate") is None, 20, "candidate deleted")
        wait_for(lambda: _dep_pair(fleet.get("Deployment", name)) == ("draft-1", 2), 20, "stable back to 2")
        ev = {(e["type"], e["reason"]) for e in fleet.events(name)}
        assert ("Normal", "RolloutStarted") in ev and ("Warning", "RolloutRolledBack") in ev, ev
        # Level-based: the same (failed) spec does not start the candidate again.
        time.sleep(3)
        assert fleet.get("Deployment", f"{name}-candidate") is None
        out = fleet.k8s.kubectl("get", "njd", name, "-n", fleet.ns).stdout
        assert "STABLE" in out and "CANDIDATE" in out and "target-1/draft-1" in out, out
    assert "Traceback" not in runner.output, runner.output[-3000:]


def test_good_candidate_is_promoted_across_an_operator_restart(fleet: Fleet):
    name = "good"
    _start_rollout(fleet, name)
    with KopfRunner(fleet.run_args, timeout=90):
        for ip in fleet.pod_ips(track_selector(name, c.TRACK_STABLE), 2).values():
            fleet.ep.simworker(ip)
        _wait_adopted(fleet, name)
        _new_draft(fleet, name)
        (cip,) = fleet.pod_ips(track_selector(name, "candidate"), 1).values()
        fleet.ep.simworker(cip)
        out = fleet.k8s.kubectl("get", "njd", name, "-n", fleet.ns, "-o", "wide").stdout
        assert "target-1/draft-2" in out and "target-1/draft-1" in out, out
        # Step 1 (50%) passes -> step 2 (100%): the candidate takes every replica.
        wait_for(lambda: (fleet.njd(name)["status"].get("rollout") or {}).get("step") == 1, 40, "step 2")
        wait_for(lambda: _dep_pair(fleet.get("Deployment", f"{name}-candidate")) == ("draft-2", 2), 20, "candidate at 2")
        for ip in fleet.pod_ips(track_selector(name, "candidate"), 2).values():
            if ip != cip:
                fleet.ep.simworker(ip)
    # The operator stops mid-step; the state is in status.
    ro = fleet.njd(name)["status"]["rollout"]
    assert ro["phase"] == "Progressing" and ro["step"] == 1 and ro["weight"] == 100

    with KopfRunner(fleet.run_args, timeout=90) as runner:
        ro = wait_for(lambda: (r := fleet.njd(name)["status"]["rollout"]).get("phase") == "Stable" and r, 45, "promotion")
        assert ro["lastDecision"]["action"] == "Promoted", ro
        assert ro["stable"]["pair"]["draft"]["name"] == "draft-2"
        wait_for(lambda: _dep_pair(fleet.get("Deployment", name)) == ("draft-2", 2), 20, "stable on the new pair")
        wait_for(lambda: fleet.get("Deployment", f"{name}-candidate") is None, 30, "candidate removed")
        assert fleet.njd(name)["status"]["stable"]["pair"] == "target-1/draft-2"
        ev = {e["reason"] for e in fleet.events(name)}
        assert {"RolloutStarted", "RolloutAdvanced", "RolloutPromoted"} <= ev, ev
    assert "window of step 2 restarted" in runner.output
    assert "Traceback" not in runner.output, runner.output[-3000:]


def test_canary_share_as_httproute_weights(fleet: Fleet, routing_crds):
    """spec.routing with an HTTPRoute over two InferencePools (each with its own endpoint picker):
    the canary's share is a weight in the route, the stable Deployment keeps all its replicas and
    the candidate gets its share; reverting the pair takes the candidate's pool and weight away."""
    name = "weighted"
    routing = {"httpRoute": {"parentRefs": [{"name": "inference-gateway"}]},
               "inferencePool": {"endpointPicker": {"name": "weighted-epp"},
                                 "candidateEndpointPicker": {"name": "weighted-epp-canary"}}}  # fmt: skip

    def weights() -> list[tuple[str, int]]:
        r = fleet.get("HTTPRoute", name) or {"spec": {"rules": [{"backendRefs": []}]}}
        return [(b["name"], b["weight"]) for b in r["spec"]["rules"][0]["backendRefs"]]

    fleet.apply(cr(name, replicas=2, routing=routing, rollout={"steps": [50, 100], "analysisWindowSeconds": 600}))
    with KopfRunner(fleet.run_args, timeout=90) as runner:
        for ip in fleet.pod_ips(track_selector(name, c.TRACK_STABLE), 2).values():
            fleet.ep.simworker(ip)
        _wait_adopted(fleet, name)
        wait_for(lambda: weights() == [(name, 100)], 20, "the route to the stable pool")
        _new_draft(fleet, name)
        wait_for(lambda: weights() == [(name, 50), (c.candidate_name(name), 50)], 20, "weights 50/50")
        pool = fleet.get("InferencePool", c.candidate_name(name))
        assert pool["spec"]["selector"]["matchLabels"][c.LABEL_TRACK] == c.TRACK_CANDIDATE
        assert pool["spec"]["endpointPickerRef"]["name"] == "weighted-epp-canary"
        cand = wait_for(lambda: fleet.get("Deployment", c.candidate_name(name)), 20, "candidate Deployment")
        assert _dep_pair(cand) == ("draft-2", 1)
        fleet.pod_ips(track_selector(name, c.TRACK_CANDIDATE), 1)
        # The stable revision is not scaled down to its share (the replica split would make it 1).
        assert _dep_pair(fleet.get("Deployment", name)) == ("draft-1", 2)
        assert len(fleet.pod_ips(track_selector(name, c.TRACK_STABLE), 2)) == 2

        fleet.patch(name, {"draft": {"name": "draft-1", "source": {"imagePath": "/models/draft-1"}}})
        wait_for(lambda: weights() == [(name, 100)], 30, "the candidate's weight removed")
        wait_for(lambda: fleet.get("InferencePool", c.candidate_name(name)) is None, 30, "the candidate's pool removed")
        wait_for(lambda: fleet.get("Deployment", c.candidate_name(name)) is None, 30, "the candidate removed")
    assert "Traceback" not in runner.output, runner.output[-3000:]


@pytest.mark.engine
def test_real_worker_metrics_reach_priors_and_slo(fleet: Fleet, tmp_path, monkeypatch):
    """The real ``nightjar-worker serve`` (bundled CPU pair) at a pod IP; the ConfigMap it would mount is
    synced into its config file (what the kubelet does), so the fleet's priors reach its planner."""
    import httpx
    from nightjar_contract.runtime import WorkerRuntimeConfig
    from nightjar_worker.runtime_config import read_status, write_config_atomically
    from nightjar_worker.serve import ServerProcess

    class PodServer(ServerProcess):
        def __init__(self, ip: str, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.ip = ip

        @property
        def url(self) -> str:
            return f"http://{self.ip}:{self.port}"

    monkeypatch.setenv("NIGHTJAR_FLEET_SLO_WINDOW_S", "3600")  # a CPU worker is slow: keep every request
    monkeypatch.setenv("NIGHTJAR_FLEET_SCRAPE_TIMEOUT_S", "5")  # and answers /metrics slowly while decoding
    # The engine exports its planner snapshot every 200 steps (first at step 1): a short CPU run
    # yields little evidence, so accept entries from a single observation here.
    monkeypatch.setenv("NIGHTJAR_FLEET_PRIORS_MIN_COUNT", "0.5")
    name = "real"
    fleet.apply(cr(name, replicas=1, slo={"ttftP95Ms": 60000, "tpotP95Ms": 5000, "attainment": 0.5}))
    cfg_file = tmp_path / "nightjar.yaml"
    # the pair's draft prefill price (a profiled pair's priors carry one): the planner holds it until
    # it learns its own, exports it, and the fleet hands it on with its priors
    write_config_atomically(cfg_file, WorkerRuntimeConfig(
        priors={"bucket_edges": list(PlannerConfig().edges()), "draft_prefill_s_per_token": 0.0042}))
    with KopfRunner(fleet.run_args, timeout=90) as runner:
        (ip,) = fleet.pod_ips(track_selector(name, c.TRACK_STABLE), 1).values()
        srv = PodServer(ip, ["--host", ip, "--config", str(cfg_file), "--kv-cache-gib", "1"], port=fleet.ep.port,
                        log_path=tmp_path / "worker.log")  # fmt: skip
        stop = threading.Event()

        def kubelet_sync() -> None:  # the ConfigMap volume, as a kubelet would refresh it
            last = None
            while not stop.wait(0.5):
                cm = fleet.get("ConfigMap", c.config_map_name(name))
                text = ((cm or {}).get("data") or {}).get(c.CONFIG_KEY)
                if text and text != last:
                    tmp = cfg_file.with_suffix(".tmp")
                    tmp.write_text(text)
                    os.replace(tmp, cfg_file)
                    last = text

        sync = threading.Thread(target=kubelet_sync, daemon=True)
        with srv:
            sync.start()
            model = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]["id"]
            # the window's baseline is the first scrape: a request that finishes before it is never
            # counted, so the load starts only once the worker has been scraped
            wait_for(lambda: (fleet.njd(name)["status"].get("fleet") or {}).get("podsScraped", 0) >= 1,
                     60, "a first scrape of the worker")  # fmt: skip

            def load() -> None:
                for i in range(3):
                    httpx.post(srv.url + "/v1/completions", timeout=300, json={
                        "model": model, "prompt": f"def f{i}(n):", "max_tokens": 16, "temperature": 0})

            threads = [threading.Thread(target=load) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # all 6 requests have finished: wait for a scrape after that (one during the load sees
            # first tokens, TTFT, before any request finished and recorded its TPOT)
            st = wait_for(lambda: (s := fleet.njd(name)["status"].get("fleet") or {}).get("requests", 0) >= 6 and s,
                          60, "the load's requests measured from the real worker")  # fmt: skip
            assert st["podsScraped"] == 1 and st["ttftP95Ms"] > 0 and st["tpotP95Ms"] > 0, st
            cond = condition(fleet.njd(name), "SLOMet")
            assert cond["status"] in ("True", "False") and "attainment=" in cond["message"], cond
            doc = wait_for(lambda: (d := yaml.safe_load(fleet.get("ConfigMap", c.config_map_name(name))["data"][c.CONFIG_KEY]))
                           .get("priors") and d, 30, "priors from the real planner")  # fmt: skip
            assert doc["priors"]["entries"]
            assert doc["priors"]["draft_prefill_s_per_token"] == pytest.approx(0.0042)

            def applied() -> bool:  # the worker's planner took the fleet's priors (config watcher)
                st = read_status(srv.state_dir) or {}
                return bool(((st.get("applied") or {}).get("priors") or {}).get("entries"))

            wait_for(applied, 30, "worker applied the fleet priors")
        stop.set()
    assert "Traceback" not in runner.output, runner.output[-3000:]
