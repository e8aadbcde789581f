"""A stand-in kubelet for the loopback test cluster. CONTAINERS NEVER RUN: there is no container
runtime here. The agent only does the API-side half of a kubelet's job so the real controllers behave:

- registers ``N`` Nodes (``nightjar-node-<i>``) with cpu/memory/pods and ``nvidia.com/gpu`` capacity,
  condition Ready=True, and removes the ``node.kubernetes.io/not-ready`` taint the apiserver adds;
- keeps each node's Ready heartbeat and its Lease in ``kube-node-lease`` fresh;
- for each pod bound to one of its nodes: assigns a loopback pod IP (127.0.0.2, .3, ... in order, or
  the one a test chose with the pod annotation ``nightjar.dev/test-pod-ip``: an IP, or a comma list,
  the first one not held by another live pod wins), and reports the pod Running with all containers
  started and ready. The endpoints controller then puts those IPs into Service endpoints, so a test
  can serve real HTTP on ``<podIP>:<port>`` (the whole 127.0.0.0/8 is local on Linux);
- readiness per pod annotation ``nightjar.dev/test-readiness``: ``always`` (default), ``never``
  (Running, not Ready), or ``probe`` (Ready while the pod's ``httpGet`` readinessProbe answers 2xx/3xx
  at its pod IP, checked every second: for tests that run the real worker process at the pod IP);
- finishes deletions a kubelet would finish: a pod with a deletionTimestamp is deleted at once
  (grace 0) and its IP is freed.

Runs as a subprocess of :class:`nightjar_operator.testing.cluster.LocalCluster`::

    python -m nightjar_operator.testing.fake_kubelet --kubeconfig admin.kubeconfig --nodes 1
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

POD_IP_ANNOTATION = "nightjar.dev/test-pod-ip"
POD_READINESS_ANNOTATION = "nightjar.dev/test-readiness"
NODE_IP = "127.0.0.1"
KUBELET_VERSION = "v1.20.2"
NODE_CAPACITY = {"cpu": "32", "memory": "256Gi", "pods": "250", "ephemeral-storage": "500Gi", "nvidia.com/gpu": "8"}
HEARTBEAT_S = 10.0
PROBE_S = 1.0
RESYNC_S = 30.0

log = logging.getLogger("nightjar.fake_kubelet")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> datetime:
    return datetime.now(timezone.utc)


def loopback_pool(start: str = "127.0.0.2") -> Iterator[str]:
    """127.0.0.2 .. 127.255.255.254, skipping .0 and .255 last octets."""
    ip = ipaddress.IPv4Address(start)
    end = ipaddress.IPv4Address("127.255.255.254")
    while ip <= end:
        if ip.packed[3] not in (0, 255):
            yield str(ip)
        ip += 1


class IpAllocator:
    """Pod uid -> loopback IP. Pure logic (thread-safety is the caller's lock)."""

    def __init__(self, start: str = "127.0.0.2") -> None:
        self.start = start
        self.by_uid: dict[str, str] = {}

    def used(self) -> set[str]:
        return set(self.by_uid.values())

    def get(self, uid: str, requested: str | None = None) -> str:
        if uid in self.by_uid:
            return self.by_uid[uid]
        used = self.used()
        if requested:
            choices = [c.strip() for c in requested.split(",") if c.strip()]
            for c in choices:
                if not ipaddress.ip_address(c).is_loopback:
                    raise ValueError(f"{POD_IP_ANNOTATION}={requested!r}: {c} is not a loopback address")
            # First free one; if the test pinned more pods than IPs, they share the first.
            ip = next((c for c in choices if c not in used), choices[0])
        else:
            ip = next(c for c in loopback_pool(self.start) if c not in used)
        self.by_uid[uid] = ip
        return ip

    def adopt(self, uid: str, ip: str) -> None:
        self.by_uid.setdefault(uid, ip)

    def free(self, uid: str) -> str | None:
        return self.by_uid.pop(uid, None)


def http_probe_ok(pod: client.V1Pod, ip: str, timeout: float = 0.5) -> bool:
    """Run the first httpGet readinessProbe of the pod's containers against ``ip``; no probe -> True."""
    for c in pod.spec.containers:
        probe = c.readiness_probe
        if probe is None or probe.http_get is None:
            continue
        port = probe.http_get.port
        if isinstance(port, str) and not port.isdigit():
            port = next((p.container_port for p in c.ports or [] if p.name == port), None)
            if port is None:
                return False
        scheme = (probe.http_get.scheme or "HTTP").lower()
        url = f"{scheme}://{ip}:{int(port)}{probe.http_get.path or '/'}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return 200 <= r.status < 400
        except Exception:
            return False
    return True


class NodeAgent:
    def __init__(self, api: client.ApiClient, nodes: int = 1, ip_start: str = "127.0.0.2") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.node_names = [f"nightjar-node-{i}" for i in range(nodes)]
        self.ips = IpAllocator(ip_start)
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.probe_pods: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name)

    # ---------------------------------------------------------------- nodes
    def _node_conditions(self) -> list[dict[str, Any]]:
        now = _now()
        conds = [("Ready", "True", "KubeletReady", "nightjar node agent (containers do not run)")]
        conds += [(t, "False", f"KubeletHas{r}", "") for t, r in
                  (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                   ("PIDPressure", "SufficientPID"))]
        return [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": now,
                 "lastTransitionTime": now} for t, s, r, m in conds]

    def _node_status(self, name: str, with_transition: bool) -> dict[str, Any]:
        conds = self._node_conditions()
        if not with_transition:
            for c in conds:
                c.pop("lastTransitionTime")
        return {
            "capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY, "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": "nightjar",
                "osImage": "nightjar node agent (no container runtime)", "containerRuntimeVersion": "none://0",
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    def register_nodes(self) -> None:
        for name in self.node_names:
            body = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                    "nightjar.dev/test-node": "true"}},
            }
            try:
                self.core.create_node(body)
            except ApiException as e:
                if e.status != 409:
                    raise
            # The TaintNodesByCondition admission adds not-ready:NoSchedule at creation; no
            # nodelifecycle controller runs to lift it, so the agent does.
            self.core.patch_node(name, {"spec": {"taints": None}})
            self.core.patch_node_status(name, {"status": self._node_status(name, with_transition=True)})
            self._renew_lease(name)
            log.info("node %s registered Ready", name)

    def heartbeat(self) -> None:
        for name in self.node_names:
            try:
                self.core.patch_node_status(name, {"status": {"conditions": [
                    {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in self._node_conditions()]}})
                self._renew_lease(name)
            except ApiException as e:
                if e.status == 404:  # someone deleted the node: register it again
                    self.register_nodes()
                else:
                    log.warning("heartbeat %s: %s", name, e.reason)

    def _renew_lease(self, name: str) -> None:
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _now_micro()}
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", client.V1Lease(
                metadata=client.V1ObjectMeta(name=name), spec=client.V1LeaseSpec(**{
                    "holder_identity": name, "lease_duration_seconds": 40, "renew_time": _now_micro()})))

    # ---------------------------------------------------------------- pods
    def sync_pod(self, pod: client.V1Pod, deleted: bool = False) -> None:
        """Level-based: bring one pod's reported status in line with what a kubelet would report."""
        uid, ns, name = pod.metadata.uid, pod.metadata.namespace, pod.metadata.name
        with self.lock:
            if deleted:
                self._release(uid, ns, name)
                return
            if pod.spec.node_name not in self.node_names:
                return
            if pod.metadata.deletion_timestamp is not None:
                # A kubelet would stop the containers, then delete for good; nothing runs here.
                try:
                    self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0,
                                                    body=client.V1DeleteOptions(grace_period_seconds=0))
                except ApiException as e:
                    if e.status != 404:
                        raise
                self._release(uid, ns, name)
                return
            if pod.status.phase in ("Succeeded", "Failed"):
                self._release(uid, ns, name)
                return
            ann = pod.metadata.annotations or {}
            try:
                ip = self.ips.get(uid, ann.get(POD_IP_ANNOTATION))
            except ValueError as e:
                log.error("pod %s/%s: %s", ns, name, e)
                return
            mode = ann.get(POD_READINESS_ANNOTATION, "always")
            if mode == "probe":
                self.probe_pods[uid] = (ns, name)
                ready = http_probe_ok(pod, ip)
            else:
                self.probe_pods.pop(uid, None)
                ready = mode != "never"
            if self._up_to_date(pod, ip, ready):
                return
            self._patch_running(pod, ip, ready)

    def _release(self, uid: str, ns: str, name: str) -> None:
        self.probe_pods.pop(uid, None)
        ip = self.ips.free(uid)
        if ip:
            log.info("pod %s/%s gone: freed %s", ns, name, ip)

    @staticmethod
    def _up_to_date(pod: client.V1Pod, ip: str, ready: bool) -> bool:
        st = pod.status
        if st.phase != "Running" or st.pod_ip != ip:
            return False
        conds = {c.type: c.status for c in st.conditions or []}
        want = "True" if ready else "False"
        if conds.get("Ready") != want or conds.get("ContainersReady") != want:
            return False
        names = {c.name for c in pod.spec.containers}
        have = {c.name: c.ready for c in st.container_statuses or []}
        return set(have) == names and all(v == ready for v in have.values())

    def _patch_running(self, pod: client.V1Pod, ip: str, ready: bool) -> None:
        now = _now()
        r = "True" if ready else "False"
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else now
        conds = [
            {"type": "Initialized", "status": "True", "lastTransitionTime": started},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
            {"type": "ContainersReady", "status": r, "lastTransitionTime": now},
            {"type": "Ready", "status": r, "lastTransitionTime": now},
        ]
        running = {"running": {"startedAt": started}}
        statuses = [{
            "name": c.name, "image": c.image or "", "imageID": "", "ready": ready, "started": True,
            "restartCount": 0, "containerID": f"nightjar://{pod.metadata.uid}/{c.name}", "state": running,
        } for c in pod.spec.containers]
        init = [{
            "name": c.name, "image": c.image or "", "imageID": "", "ready": True, "restartCount": 0,
            "containerID": f"nightjar://{pod.metadata.uid}/{c.name}",
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started}},
        } for c in pod.spec.init_containers or []]
        status = {
            "phase": "Running", "hostIP": NODE_IP, "podIP": ip, "podIPs": [{"ip": ip}], "startTime": started,
            "conditions": conds, "containerStatuses": statuses, "qosClass": pod.status.qos_class or "BestEffort",
        }
        if init:
            status["initContainerStatuses"] = init
        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
            log.info("pod %s/%s Running ready=%s ip=%s", pod.metadata.namespace, pod.metadata.name, ready, ip)
        except ApiException as e:
            if e.status != 404:
                log.warning("patch pod %s/%s: %s %s", pod.metadata.namespace, pod.metadata.name, e.status, e.reason)

    def resync(self) -> str:
        pods = self.core.list_pod_for_all_namespaces()
        live = set()
        with self.lock:
            for pod in pods.items:
                live.add(pod.metadata.uid)
                if pod.status.pod_ip and pod.spec.node_name in self.node_names and not pod.metadata.deletion_timestamp:
                    self.ips.adopt(pod.metadata.uid, pod.status.pod_ip)  # survive an agent restart
            for uid in set(self.ips.by_uid) - live:
                self.ips.free(uid)
                self.probe_pods.pop(uid, None)
        for pod in pods.items:
            self.sync_pod(pod)
        return pods.metadata.resource_version

    # ---------------------------------------------------------------- loops
    def watch_pods(self) -> None:
        rv = self.resync()
        last_resync = time.monotonic()
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=20,
                                   allow_watch_bookmarks=True):
                    obj = ev["object"]
                    if ev["type"] == "BOOKMARK":
                        rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
                        continue
                    if ev["type"] == "ERROR":
                        raise ApiException(status=410, reason="watch error")
                    rv = obj.metadata.resource_version
                    self.sync_pod(obj, deleted=ev["type"] == "DELETED")
                    if self.stop.is_set():
                        break
                if time.monotonic() - last_resync > RESYNC_S:
                    rv, last_resync = self.resync(), time.monotonic()
            except ApiException as e:
                if e.status != 410:
                    log.warning("watch: %s %s", e.status, e.reason)
                    time.sleep(0.5)
                rv, last_resync = self.resync(), time.monotonic()
            except Exception as e:  # connection reset etc.: relist and carry on
                log.warning("watch: %r", e)
                time.sleep(0.5)
                try:
                    rv, last_resync = self.resync(), time.monotonic()
                except Exception:
                    pass
            finally:
                w.stop()

    def tick(self) -> None:
        last_hb = time.monotonic()
        while not self.stop.wait(PROBE_S):
            try:
                if time.monotonic() - last_hb >= HEARTBEAT_S:
                    self.heartbeat()
                    last_hb = time.monotonic()
                for uid, (ns, name) in list(self.probe_pods.items()):
                    try:
                        pod = self.core.read_namespaced_pod(name, ns)
                    except ApiException as e:
                        if e.status == 404:
                            with self.lock:
                                self._release(uid, ns, name)
                        continue
                    self.sync_pod(pod)
            except Exception as e:
                log.warning("tick: %r", e)

    def run(self, startup_timeout: float = 300.0) -> None:
        # Started alongside the apiserver (importing the client takes a while): retry until it answers.
        deadline = time.monotonic() + startup_timeout
        while True:
            try:
                self.register_nodes()
                break
            except Exception as e:
                if time.monotonic() > deadline:
                    raise
                log.debug("apiserver not ready yet: %r", e)
                time.sleep(0.3)
        threading.Thread(target=self.tick, name="tick", daemon=True).start()
        self.watch_pods()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--ip-start", default="127.0.0.2")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    agent = NodeAgent(config.new_client_from_config(config_file=a.kubeconfig), nodes=a.nodes, ip_start=a.ip_start)
    signal.signal(signal.SIGTERM, lambda *_: (agent.stop.set(), sys.exit(0)))
    agent.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
