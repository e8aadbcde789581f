"""The loopback test cluster itself: real apiserver + controllers; the node agent reports pods
Running/Ready with 127.0.0.x IPs (containers never run: any server at a pod IP is started by the test)."""

from __future__ import annotations

import base64
import ipaddress
import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import free_port, wait_for
from nightjar_operator.testing import POD_IP_ANNOTATION, POD_READINESS_ANNOTATION, KubectlError

pytestmark = pytest.mark.cluster






class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server API
        body = f"hello from {self.server.server_address[0]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(ip: str, port: int) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((ip, port), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def get_json(k8s, *args) -> dict:
    return json.loads(k8s.kubectl(*args, "-o", "json").stdout)


def deployment(name: str, replicas: int, port: int, annotations: dict | None = None, gpu: int = 0) -> str:
    pod_meta: dict = {"labels": {"app": name}}
    if annotations:
        pod_meta["annotations"] = annotations
    container: dict = {"name": "web", "image": "example.invalid/never-pulled:1", "ports": [{"containerPort": port}]}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpu)}}
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": pod_meta, "spec": {"containers": [container]}}},
    })


def test_apiserver_answers(k8s):
    code, version = k8s.request("GET", "/version")
    assert code == 200 and version["gitVersion"].startswith("v1.20.")
    assert k8s.request("GET", "/readyz")[0] == 200
    assert k8s.server.startswith("https://127.0.0.1:")
    out = k8s.kubectl("get", "--raw", "/healthz").stdout
    assert out.strip() == "ok"
    # An unauthenticated client is refused: the token file is the only way in.
    assert k8s.request("GET", "/api/v1/namespaces", token="not-a-token")[0] == 401


def test_nodes_ready_with_gpu_capacity(k8s):
    nodes = get_json(k8s, "get", "nodes")["items"]
    assert [n["metadata"]["name"] for n in nodes] == k8s.node_names
    for n in nodes:
        conds = {c["type"]: c["status"] for c in n["status"]["conditions"]}
        assert conds["Ready"] == "True"
        assert not n["spec"].get("taints")
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert {"type": "InternalIP", "address": k8s.node_ips[0]} in n["status"]["addresses"]


def test_deployment_pods_service_endpoints_and_real_http(k8s, namespace):
    port = free_port()
    k8s.kubectl("-n", namespace, "apply", "-f", "-", input=deployment("web", 3, port, gpu=1))
    k8s.kubectl("-n", namespace, "expose", "deployment", "web", f"--port={port}")

    dep = wait_for(lambda: (d := get_json(k8s, "-n", namespace, "get", "deploy", "web"))["status"].get(
        "readyReplicas") == 3 and d, what="readyReplicas == 3")
    assert dep["status"]["availableReplicas"] == 3
    rs = get_json(k8s, "-n", namespace, "get", "rs", "-l", "app=web")["items"]
    assert len(rs) == 1 and rs[0]["status"]["readyReplicas"] == 3

    pods = get_json(k8s, "-n", namespace, "get", "pods", "-l", "app=web")["items"]
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 3
    for p in pods:
        assert p["status"]["phase"] == "Running"
        assert p["spec"]["nodeName"] in k8s.node_names
        assert ipaddress.ip_address(p["status"]["podIP"]) in ipaddress.ip_network("127.0.0.0/8")
        assert p["status"]["podIP"] != "127.0.0.1"
        assert all(cs["ready"] and "running" in cs["state"] for cs in p["status"]["containerStatuses"])
    assert k8s.pod_ips(namespace, "app=web", ready_only=True) == {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}

    # The real endpoints controller picks the agent's IPs up.
    def endpoint_ips():
        code, ep = k8s.request("GET", f"/api/v1/namespaces/{namespace}/endpoints/web")
        if code == 404:  # the endpoints controller has not written it yet
            return []
        return sorted(a["ip"] for s in ep.get("subsets") or [] for a in s.get("addresses") or [])

    wait_for(lambda: endpoint_ips() == sorted(ips), what="endpoints == pod IPs")
    ep = get_json(k8s, "-n", namespace, "get", "endpoints", "web")
    ep_port = ep["subsets"][0]["ports"][0]["port"]
    assert ep_port == port

    # Nothing listens there until the test serves: containers do not run.
    addr = ep["subsets"][0]["addresses"][0]["ip"]
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{addr}:{ep_port}/", timeout=2)
    srv = serve(addr, ep_port)
    try:
        with urllib.request.urlopen(f"http://{addr}:{ep_port}/", timeout=5) as r:
            assert r.read().decode() == f"hello from {addr}"
    finally:
        srv.shutdown()
        srv.server_close()

    # Scale down: the agent finishes deletions (no pod stuck Terminating), endpoints follow.
    k8s.kubectl("-n", namespace, "scale", "deployment", "web", "--replicas=1")
    wait_for(lambda: len(get_json(k8s, "-n", namespace, "get", "pods", "-l", "app=web")["items"]) == 1,
             what="pods deleted on scale-down")
    wait_for(lambda: len(endpoint_ips()) == 1, what="endpoints shrink")


def test_pinned_pod_ip_and_probe_readiness(k8s, namespace):
    """A test can pick the pod IP (annotation) and let readiness follow a real HTTP server there."""
    port = free_port()
    ip = "127.0.9.7"
    ann = {POD_IP_ANNOTATION: ip, POD_READINESS_ANNOTATION: "probe"}
    dep = json.loads(deployment("probed", 1, port, annotations=ann))
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/", "port": port}, "periodSeconds": 1}
    k8s.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(dep))

    def pod():
        items = get_json(k8s, "-n", namespace, "get", "pods", "-l", "app=probed")["items"]
        return items[0] if items and items[0]["status"].get("podIP") else None

    p = wait_for(pod, what="pod with IP")
    assert p["status"]["podIP"] == ip and p["status"]["phase"] == "Running"
    time.sleep(1.5)  # a few probe rounds: still not ready, nothing serves
    ready = {c["type"]: c["status"] for c in pod()["status"]["conditions"]}
    assert ready["Ready"] == "False"
    assert get_json(k8s, "-n", namespace, "get", "deploy", "probed")["status"].get("readyReplicas") is None

    srv = serve(ip, port)
    try:
        wait_for(lambda: get_json(k8s, "-n", namespace, "get", "deploy", "probed")["status"].get("readyReplicas") == 1,
                 what="ready once the server answers")
    finally:
        srv.shutdown()
        srv.server_close()
    wait_for(lambda: get_json(k8s, "-n", namespace, "get", "deploy", "probed")["status"].get("readyReplicas") is None,
             what="not ready once the server is gone")


def test_serviceaccount_kubeconfig_rbac(k8s, namespace):
    kc = k8s.serviceaccount_kubeconfig(namespace, "reader", create=True)
    with pytest.raises(KubectlError) as err:
        k8s.kubectl("get", "pods", kubeconfig=kc)
    assert "forbidden" in err.value.stderr.lower()
    assert "system:serviceaccount:" + namespace + ":reader" in err.value.stderr

    k8s.kubectl("-n", namespace, "create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
    k8s.kubectl("-n", namespace, "create", "rolebinding", "reader", "--role=pod-reader",
                f"--serviceaccount={namespace}:reader")
    wait_for(lambda: k8s.kubectl("get", "pods", kubeconfig=kc, check=False).returncode == 0, timeout=10,
             what="RBAC grant to take effect")
    # Still nothing beyond the grant.
    denied = k8s.kubectl("get", "secrets", kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    # The token really is the SA's legacy token secret.
    sa = get_json(k8s, "-n", namespace, "get", "sa", "reader")
    secret = get_json(k8s, "-n", namespace, "get", "secret", sa["secrets"][0]["name"])
    assert base64.b64decode(secret["data"]["token"]).decode() in open(kc).read()


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.harness.nightjar.dev"},
    "spec": {
        "group": "harness.nightjar.dev", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "required": ["size"], "properties": {
                    "size": {"type": "integer", "minimum": 1}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}


def test_crd_and_custom_resource(k8s, namespace):
    """Custom-resource POSTs crash an apiserver built with the vendored reflect2 1.0.1 (see build script)."""
    k8s.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    try:
        k8s.kubectl("wait", "--for=condition=Established", "crd/widgets.harness.nightjar.dev", "--timeout=30s")
        cr = {"apiVersion": "harness.nightjar.dev/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 3}}
        k8s.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(cr))
        k8s.kubectl("-n", namespace, "apply", "--server-side", "-f", "-", input=json.dumps(cr))
        assert get_json(k8s, "-n", namespace, "get", "wdg", "w1")["spec"]["size"] == 3
        bad = dict(cr, metadata={"name": "w2"}, spec={"size": 0})
        res = k8s.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(bad), check=False)
        assert res.returncode != 0 and "spec.size" in res.stderr
        assert k8s.request("GET", "/readyz")[0] == 200  # the server survived
    finally:
        k8s.kubectl("delete", "crd", "widgets.harness.nightjar.dev", "--wait=false", check=False)
