"""The operator at fleet scale, as deployed: two ``nightjar-operator run --leader-elect`` processes
against the real apiserver, 200 NightjarDeployments, then the leader killed.

Reported (printed, and the ``RESULT`` line at the end): time from each create to the first
Ready-or-Progressing condition, p50/p99; time to Ready=True; the leader's memory and threads after
every object was handled and the fleet loop went round; the handover time after a SIGKILL.
Asserted: every object is handled, only the leader writes, the leader's threads do not grow with the
number of objects (one fleet loop, not a thread per object), the follower takes over and repairs
drift, and no object ever has two worker Deployments.

``NIGHTJAR_SCALE_OBJECTS`` changes the count (200 by default).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import condition, cr, free_port, wait_for
from nightjar_operator import constants as c
from nightjar_operator.handlers.k8s import Api, make_api_client
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.cluster

N = int(os.environ.get("NIGHTJAR_SCALE_OBJECTS", "200"))
LEASE = "nightjar-operator"


def _proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


class Operator:
    def __init__(self, ident: str, namespace: str, kubeconfig: str, tmp: Path) -> None:
        self.ident, self.log = ident, tmp / f"operator-{ident}.log"
        self.metrics_port = free_port()
        env = {**os.environ, "KUBECONFIG": kubeconfig, "POD_NAME": ident,
               "NIGHTJAR_FLEET_INTERVAL_S": "5", "NIGHTJAR_FLEET_SCRAPE_TIMEOUT_S": "1"}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nightjar_operator.cli", "run", "--leader-elect", "-n", namespace,
             "--lease-namespace", namespace, "--metrics-port", str(self.metrics_port), "--liveness",
             f"http://127.0.0.1:{free_port()}/healthz"],
            env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name == name:
                    return float(smp.value)
        raise AssertionError(f"{name} not exported")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _holder(api: Api, namespace: str) -> str | None:
    try:
        lease = api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
    except Exception:  # noqa: BLE001 - not created yet
        return None
    return (lease.get("spec") or {}).get("holderIdentity")


def _list(api: Api, path: str) -> list[dict[str, Any]]:
    return api.request("GET", path).get("items", [])


def _deployments_per_owner(api: Api, namespace: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in _list(api, f"/apis/apps/v1/namespaces/{namespace}/deployments"):
        for ref in d["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == c.KIND:
                out[ref["uid"]] = out.get(ref["uid"], 0) + 1
    return out


def test_200_objects_two_replicas_and_a_killed_leader(k8s, crd, namespace, tmp_path):
    api = Api(make_api_client(k8s.kubeconfig))
    crs = f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{namespace}/{c.PLURAL}"
    ops = {i: Operator(i, namespace, k8s.kubeconfig, tmp_path) for i in ("op-a", "op-b")}
    try:
        holder = wait_for(lambda: _holder(api, namespace), 60, "a leader")
        leader = next(o for o in ops.values() if holder.startswith(o.ident + "_"))
        follower = next(o for o in ops.values() if o is not leader)
        wait_for(lambda: "running the operator" in leader.text(), 30, "the leader's operator")
        # Every replica serves /metrics, the standby too: a Service over both has no failing target.
        # (Polled: on two loaded cores the standby can still be importing when the leader runs.)
        def roles() -> tuple[float, float]:
            return leader.metric("nightjar_operator_leader"), follower.metric("nightjar_operator_leader")

        wait_for(lambda: (r := roles()) == (1, 0) and r, 30, "leader 1 and standby 0 on /metrics",
                 tolerate=(httpx.TransportError,))
        base_threads = int(_proc_status(leader.proc.pid)["Threads"])

        created: dict[str, float] = {}
        for i in range(N):
            body = cr(f"m{i:03d}", replicas=1)
            api.request("POST", crs, body)
            created[body["metadata"]["name"]] = time.monotonic()
        handled: dict[str, float] = {}
        ready: dict[str, float] = {}

        def all_seen() -> bool:
            now = time.monotonic()
            for obj in _list(api, crs):
                name = obj["metadata"]["name"]
                if name not in handled and any(condition(obj, t).get("status") == "True" for t in ("Ready", "Progressing")):
                    handled[name] = now
                if name not in ready and condition(obj, "Ready").get("status") == "True":
                    ready[name] = now
            return len(ready) == N

        wait_for(all_seen, 60 + 1.0 * N, f"{N} objects Ready", interval=0.25, proc=leader.proc, log=leader.log)
        lat = [handled[n] - created[n] for n in created]
        lat_ready = [ready[n] - created[n] for n in created]
        time.sleep(12)  # two fleet rounds over every object
        st = _proc_status(leader.proc.pid)
        rss_mib, threads = int(st["VmRSS"].split()[0]) / 1024, int(st["Threads"])

        # Only the leader wrote; one worker Deployment per object.
        assert "created Deployment" not in follower.text(), follower.text()[-3000:]
        per_owner = _deployments_per_owner(api, namespace)
        assert len(per_owner) == N and set(per_owner.values()) == {1}, per_owner
        # One fleet loop: the threads do not grow with the objects (a daemon per object added N).
        assert threads < base_threads + 40, (base_threads, threads)
        round_s = leader.metric("nightjar_operator_fleet_round_seconds")
        assert leader.metric("nightjar_operator_fleet_objects") == N

        # Kill the leader: the follower takes over, repairs drift and handles a new object.
        killed_at = time.monotonic()
        os.killpg(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait(10)
        new = wait_for(lambda: (h := _holder(api, namespace)) and h.startswith(follower.ident + "_") and h,
                       60, "the follower holding the lease")  # fmt: skip
        wait_for(lambda: "running the operator" in follower.text(), 30, "the new leader's operator")
        assert follower.metric("nightjar_operator_leader") == 1
        handover_s = time.monotonic() - killed_at
        api.request("DELETE", f"/apis/apps/v1/namespaces/{namespace}/deployments/m000")
        body = cr(f"m{N:03d}", replicas=1)
        api.request("POST", crs, body)
        t0 = time.monotonic()
        wait_for(lambda: condition(api.get(c.KIND, namespace, body["metadata"]["name"]), "Ready").get("status") == "True",
                 120, "a new object Ready under the new leader", proc=follower.proc, log=follower.log)  # fmt: skip
        new_ready_s = time.monotonic() - t0
        wait_for(lambda: api.get("Deployment", namespace, "m000"), 60, "the deleted child re-created")
        per_owner = _deployments_per_owner(api, namespace)
        assert len(per_owner) == N + 1 and set(per_owner.values()) == {1}, per_owner
        assert new != holder

        p50, p99 = statistics.median(lat), _quantile(lat, 0.99)
        r50, r99 = statistics.median(lat_ready), _quantile(lat_ready, 0.99)
        print(f"\n{N} NightjarDeployments, 2 operator replicas (leader election), 1.20 apiserver:")
        print(f"  create -> Ready-or-Progressing: p50 {p50:.2f} s, p99 {p99:.2f} s")
        print(f"  create -> Ready=True:           p50 {r50:.2f} s, p99 {r99:.2f} s")
        print(f"  leader after 2 fleet rounds:    RSS {rss_mib:.0f} MiB, {threads} threads ({base_threads} idle); "
              f"a fleet round over all objects {round_s:.2f} s")
        print(f"  SIGKILL -> follower operating:  {handover_s:.1f} s; new object Ready {new_ready_s:.2f} s later")
        print(f"RESULT objects={N} handled_p50_s={p50:.2f} handled_p99_s={p99:.2f} ready_p50_s={r50:.2f} "
              f"ready_p99_s={r99:.2f} leader_rss_mib={rss_mib:.0f} leader_threads={threads} fleet_round_s={round_s:.2f} handover_s={handover_s:.1f}")
        assert p99 < 60, lat
    finally:
        for o in ops.values():
            o.stop()
