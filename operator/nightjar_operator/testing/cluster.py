"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ controller-manager, scheduler)
1.20 built from Debian's source package by ``scripts/k8s/build-apiserver.sh``, and one of two kinds
of node:

- ``kubelet=True``: a real node (:mod:`nightjar_operator.testing.kubelet_node`): kubelet, kube-proxy,
  containerd, runc and CNI. Containers really run, from images imported into containerd. Needs root;
  one per machine. The apiserver then listens on the node address (10.245.0.1), which pods reach.
- default: the fake kubelet (:mod:`nightjar_operator.testing.fake_kubelet`), for tests that need many
  nodes or GPUs and no containers: it only *reports* pods as Running/Ready with loopback pod IPs
  (127.0.0.x); a test that needs something to answer at a pod IP starts that process itself.

Library use::

    with LocalCluster() as c:
        c.kubectl("get", "nodes")

CLI (used by ``make cluster-up`` / ``cluster-down``)::

    python -m nightjar_operator.testing.cluster up|down|env [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightjar_contract import __version__

from nightjar_operator.testing import kubelet_node

CACHE_DIR = Path(os.environ.get("NIGHTJAR_CACHE", Path.home() / ".cache" / "nightjar"))
BIN_DIR = Path(os.environ.get("NIGHTJAR_K8S_BIN", CACHE_DIR / "k8s" / "bin"))
TOOLS_DIR = CACHE_DIR / "bin"  # helm (and kubectl when the machine has none), from `make helm`
DEFAULT_STATE_DIR = CACHE_DIR / "k8s" / "run"
# Must equal RECIPE in scripts/k8s/build-apiserver.sh (a test checks): binaries built with other
# source patches (e.g. without the loopback-Endpoints one) count as missing.
BUILD_RECIPE = "2 reflect2-1.0.2 loopback-endpoints"
CONTROL_PLANE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# Stop order: the node before the control plane (its clean-up still talks to containerd).
STOP_ORDER = ("fake-kubelet", "kube-proxy", "kubelet", "containerd", "kube-scheduler",
              "kube-controller-manager", "kube-apiserver", "etcd")
SERVICE_CIDR = "10.0.0.0/24"
# Annotation a test may set on a pod (template) to choose its loopback IP(s); see fake_kubelet.
POD_IP_ANNOTATION = "nightjar.dev/test-pod-ip"
POD_READINESS_ANNOTATION = "nightjar.dev/test-readiness"


class ClusterError(RuntimeError):
    """The local cluster could not be built, started or queried."""


class BinariesMissing(ClusterError):
    """Control-plane binaries or etcd are not installed; ``make cluster-build`` fixes it."""


class KubectlError(subprocess.CalledProcessError):
    """``kubectl`` failed; str() includes its stderr, unlike CalledProcessError."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def missing_binaries(bin_dir: Path = BIN_DIR) -> list[str]:
    """Names of the executables the harness needs but cannot find (empty when ready)."""
    missing = [b for b in CONTROL_PLANE_BINARIES if not (bin_dir / b).is_file()]
    missing += [b for b in ("etcd", "openssl") if shutil.which(b) is None]
    if _kubectl_path() is None:
        missing.append("kubectl")
    return missing


def stale_build(bin_dir: Path = BIN_DIR) -> str | None:
    """A message when kube-apiserver was built with other source patches than this harness expects
    (then Services get no Endpoints for 127.0.0.x pods); ``make cluster-build`` rebuilds it."""
    found = _read(bin_dir / ".recipe")
    if (bin_dir / "kube-apiserver").is_file() and found != BUILD_RECIPE:
        return (f"kube-apiserver in {bin_dir} was built with recipe {found!r}, expected {BUILD_RECIPE!r}: "
                "run `make cluster-build` (Services will get no Endpoints for loopback pod IPs until then)")
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _kubectl_path() -> str | None:
    found = shutil.which("kubectl")
    if found:
        return found
    cached = TOOLS_DIR / "kubectl"
    return str(cached) if cached.is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], cwd: Path) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)


def _child_env() -> dict[str, str]:
    # etcd reads its settings from ETCD_* variables: never pass any through.
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}


class LocalCluster:
    """etcd + kube-apiserver + controller-manager + scheduler + node agent, on 127.0.0.1.

    Attributes once started: ``server`` (https URL), ``kubeconfig`` (admin kubeconfig path),
    ``ca_file``, ``token`` (admin bearer token, group system:masters), ``env`` (copy of os.environ
    with KUBECONFIG and PATH set for kubectl/helm), ``node_names``, ``node_ips``, ``workdir``.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        nodes: int = 1,
        bin_dir: Path = BIN_DIR,
        controllers: bool = True,
        node_agent: bool = True,
        kubelet: bool = False,
        detach: bool = False,
    ) -> None:
        """``controllers``: run controller-manager + scheduler (Deployments -> pods, endpoints, SA
        tokens). ``node_agent``: the fake kubelet registers ``nodes`` Ready nodes that report pods
        Running/Ready. ``kubelet``: one real node instead (containers run; root). ``detach``: leave
        the processes running when this object goes away (the CLI ``up``)."""
        if kubelet and nodes != 1:
            raise ValueError("a real node is one node: nodes must be 1 with kubelet=True")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="nightjar-k8s-"))
        self.nodes = nodes
        self.bin_dir = Path(bin_dir)
        self.controllers = controllers
        self.with_kubelet = kubelet
        self.with_node_agent = node_agent and not kubelet
        self.detach = detach
        self.node: kubelet_node.KubeletNode | None = (
            kubelet_node.KubeletNode(self.workdir, self.bin_dir, CACHE_DIR) if kubelet else None)
        if kubelet:
            self.node_names = [kubelet_node.NODE_NAME]
        else:
            self.node_names = [f"nightjar-node-{i}" for i in range(nodes)] if node_agent else []
        self.node_ips = [kubelet_node.NODE_IP] if kubelet else (["127.0.0.1"] if node_agent else [])
        # Where the apiserver listens: the node address when pods must reach it.
        self.host = kubelet_node.NODE_IP if kubelet else "127.0.0.1"
        self.token = ""
        self.server = ""
        self.etcd_url = ""
        self._procs: dict[str, subprocess.Popen] = {}
        self._restartable = {"kube-controller-manager", "kube-scheduler", "kube-proxy"}
        self._restarts: dict[str, int] = {}
        self._pids: dict[str, int] = {}
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig(self) -> str:
        return str(self.workdir / "admin.kubeconfig")

    @property
    def ca_file(self) -> str:
        return str(self.workdir / "pki" / "ca.crt")

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        env["PATH"] = f"{env.get('PATH', '')}{os.pathsep}{TOOLS_DIR}"
        return env

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> LocalCluster:
        missing = missing_binaries(self.bin_dir)
        if self.with_kubelet:
            why = kubelet_node.can_run()
            if why:
                raise ClusterError(why)
            missing += kubelet_node.missing(self.bin_dir)
        if missing:
            raise BinariesMissing(
                f"missing {', '.join(missing)} (looked in {self.bin_dir} and PATH); run `make cluster-build`"
                + (" and `make helm`" if "kubectl" in missing else "")
                + (" and scripts/k8s/install-runtime.sh" if self.with_kubelet else "")
            )
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        try:
            self._make_pki()
            self.timings["pki_s"] = time.monotonic() - t0
            if self.node is not None:
                self.node.prepare()  # the node address must exist before the apiserver binds it
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(Path(self.kubeconfig), self.token)
            if self.with_node_agent:
                self._start_node_agent()  # it retries until the apiserver answers
            deadline = time.monotonic() + timeout
            port = int(self.server.rsplit(":", 1)[1])
            self._wait(lambda: _port_open(port, self.host), deadline, "apiserver serving")
            self.timings["apiserver_serving_s"] = time.monotonic() - t0
            if self.controllers:
                # Not before the apiserver serves: controller-manager exits if /healthz is not OK within
                # 10 s (it is restarted then, see _wait, but that costs time).
                self._start_controllers()
            self._wait(lambda: self._get_status("/readyz") == 200, deadline, "apiserver /readyz")
            self.timings["apiserver_ready_s"] = time.monotonic() - t0
            if self.controllers:
                self.wait_service_account("default", "default", deadline=deadline)
                self.timings["default_sa_s"] = time.monotonic() - t0
            if self.with_node_agent:
                self._wait(self._nodes_ready, deadline, "fake kubelet nodes Ready and untainted")
            if self.node is not None:
                self.node.start(self._spawn, self.kubeconfig)
                self._wait(self._nodes_ready, deadline, "kubelet node Ready and untainted")
                self.timings["node_ready_s"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        self.timings["start_s"] = time.monotonic() - t0
        self._write_state()
        return self

    def stop(self) -> None:
        """Kill every process group we started (SIGKILL: nothing here needs a graceful shutdown)."""
        pids = {**self._pids}
        for name in STOP_ORDER:
            if name == "containerd" and self.node is not None:
                self.node.cleanup()  # pods' containers outlive the kubelet: remove them while containerd answers
            pid = pids.pop(name, None)
            proc = self._procs.get(name)
            # Attached (no Popen): make sure a recycled pid from a stale state file is not someone else's.
            if pid is not None and (proc is not None or _cmdline_has(pid, name.replace("-", "_") if name == "fake-kubelet" else name)):
                _kill_group(pid, proc)
        if self.node is not None:
            self.node.cleanup()
        self._procs.clear()
        self._pids.clear()
        state = self.workdir / "state.json"
        if state.exists():
            state.unlink()
        if self._own_workdir and not self.detach:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __del__(self) -> None:  # best effort; tests use the context manager or stop()
        if getattr(self, "_pids", None) and not self.detach:
            try:
                self.stop()
            except Exception:
                pass

    def alive(self) -> bool:
        return bool(self._pids) and all(_pid_alive(p) for p in self._pids.values())

    # ------------------------------------------------------------------ setup pieces
    def _make_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        # EC P-256 keys: much faster to generate than RSA, accepted for TLS and SA token signing.
        ext = pki / "server.ext"
        ext.write_text(
            f"subjectAltName=IP:127.0.0.1,IP:{self.host},IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
        )
        for key in ("ca.key", "server.key", "sa.key"):
            _run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key], pki)
        _run(["openssl", "ec", "-in", "sa.key", "-pubout", "-out", "sa.pub"], pki)
        _run(
            ["openssl", "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=nightjar-test-ca",
             "-days", "3650", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt"],
            pki,
        )
        _run(["openssl", "req", "-new", "-key", "server.key", "-subj", "/CN=kube-apiserver", "-out", "server.csr"], pki)
        _run(
            ["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "3650", "-extfile", "server.ext", "-out", "server.crt"],
            pki,
        )
        self.token = secrets.token_hex(24)
        (pki / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=_child_env(), cwd=self.workdir, start_new_session=True,  # own process group
        )
        log.close()
        self._procs[name] = proc
        self._pids[name] = proc.pid

    def _start_etcd(self) -> None:
        client, peer = _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            "etcd", "--name=nightjar", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=nightjar=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",  # test data only: no fsync keeps etcd fast on shared disks
            "--log-level=warn",
        ])
        deadline = time.monotonic() + 20
        self._wait(lambda: _port_open(client), deadline, "etcd port")

    def _start_apiserver(self) -> None:
        port = _free_port()
        self.server = f"https://{self.host}:{port}"
        pki = self.workdir / "pki"
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}", f"--secure-port={port}", "--insecure-port=0",
            f"--advertise-address={self.host}",
            f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Logs and exec reach a kubelet at its InternalIP: node names do not resolve here.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ])

    def _start_controllers(self) -> None:
        pki = self.workdir / "pki"
        # No node IPAM (CNI's host-local assigns pod IPs); node lifecycle only with a real kubelet
        # (the fake kubelet owns its nodes' health and taints itself).
        lifecycle = "" if self.with_kubelet else ",-nodelifecycle"
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--port=0", "--secure-port=0",
            f"--controllers=*,-nodeipam{lifecycle},-cloud-node-lifecycle,-attachdetach",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--concurrent-deployment-syncs=5", "--profiling=false", "--v=1",
        ])
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--port=0", "--secure-port=0",
            "--profiling=false", "--v=1",
        ])

    def _start_node_agent(self) -> None:
        self._spawn("fake-kubelet", [
            sys.executable, "-m", "nightjar_operator.testing.fake_kubelet",
            "--kubeconfig", self.kubeconfig, "--nodes", str(self.nodes),
        ])

    def _write_kubeconfig(self, path: Path, token: str, namespace: str | None = None, user: str = "admin") -> None:
        ctx: dict[str, Any] = {"cluster": "nightjar", "user": user}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "nightjar",
            "clusters": [{"name": "nightjar", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "nightjar", "context": ctx}],
        }
        path.write_text(json.dumps(cfg, indent=1))  # JSON is valid YAML for every kubeconfig reader
        path.chmod(0o600)

    def _write_state(self) -> None:
        state = {
            "server": self.server, "kubeconfig": self.kubeconfig, "ca_file": self.ca_file,
            "token": self.token, "etcd_url": self.etcd_url, "pids": self._pids,
            "node_names": self.node_names, "nodes": self.nodes, "kubelet": self.with_kubelet,
        }
        (self.workdir / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def attach(cls, workdir: str | Path) -> LocalCluster:
        """A handle on a cluster started elsewhere (``cluster up``) from its state dir."""
        workdir = Path(workdir)
        try:
            state = json.loads((workdir / "state.json").read_text())
        except FileNotFoundError as e:
            raise ClusterError(f"no cluster state in {workdir} (run `make cluster-up`)") from e
        c = cls(workdir, nodes=state["nodes"], kubelet=state.get("kubelet", False), detach=True)
        c.host = urllib.parse.urlsplit(state["server"]).hostname or c.host
        c.server, c.token, c.etcd_url = state["server"], state["token"], state["etcd_url"]
        c._pids = {k: int(v) for k, v in state["pids"].items()}
        c.node_names = state["node_names"]
        return c

    # ------------------------------------------------------------------ waiting
    def _wait(self, cond: Callable[[], bool], deadline: float, what: str) -> None:
        while True:
            for name, proc in list(self._procs.items()):
                if proc.poll() is not None:
                    if name in self._restartable and self._restarts.get(name, 0) < 3:
                        # e.g. controller-manager's 10 s apiserver-health wait ran out on a loaded machine
                        self._restarts[name] = self._restarts.get(name, 0) + 1
                        os.replace(self.log_dir / f"{name}.log", self.log_dir / f"{name}.{self._restarts[name]}.log")
                        self._spawn(name, proc.args)
                        continue
                    raise ClusterError(f"{name} exited ({proc.returncode}) while waiting for {what}:\n{self.log_tail(name)}")
            try:
                if cond():
                    return
            except (OSError, ClusterError):
                pass
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self._procs)
                raise ClusterError(f"timed out waiting for {what}\n{tails}")
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _nodes_ready(self) -> bool:
        for n in self.node_names:
            code, node = self.request("GET", f"/api/v1/nodes/{n}")
            if code != 200 or node.get("spec", {}).get("taints"):
                return False
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            if conds.get("Ready") != "True":
                return False
        return True

    # ------------------------------------------------------------------ raw REST (no client import)
    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def _get_status(self, path: str) -> int:
        code, _ = self.request("GET", path)
        return code

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """Plain HTTPS call to the apiserver as admin (or ``token``); returns (status, parsed JSON or text)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as resp:
                code, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            code, raw = e.code, e.read()
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw.decode(errors="replace")

    # ------------------------------------------------------------------ helpers for tests
    def api_client(self, kubeconfig: str | None = None):
        """A ``kubernetes.client.ApiClient`` for the admin (or the given kubeconfig)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=kubeconfig or self.kubeconfig)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60,
                kubeconfig: str | None = None) -> subprocess.CompletedProcess:
        """Run kubectl (1.32 client against the 1.20 server; skew warnings land on stderr)."""
        env = self.env
        if kubeconfig:
            env["KUBECONFIG"] = kubeconfig
        kubectl = _kubectl_path() or "kubectl"
        proc = subprocess.run([kubectl, *args], env=env, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def wait_service_account(self, namespace: str, name: str, timeout: float = 30, deadline: float | None = None) -> str:
        """Wait until the SA exists and its token secret is filled (1.20 auto-creates it); return the token."""
        deadline = deadline or time.monotonic() + timeout
        token: list[str] = []

        def ready() -> bool:
            code, sa = self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}")
            if code != 200:
                return False
            for ref in sa.get("secrets") or []:
                code, sec = self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
                tok = (sec.get("data") or {}).get("token") if code == 200 else None
                if sec.get("type") == "kubernetes.io/service-account-token" and tok:
                    token.append(base64.b64decode(tok).decode())
                    return True
            return False

        self._wait(ready, deadline, f"ServiceAccount {namespace}/{name} token secret")
        return token[0]

    def serviceaccount_kubeconfig(self, namespace: str, name: str, *, create: bool = False, timeout: float = 30) -> str:
        """Path of a kubeconfig authenticating as ServiceAccount ``namespace/name`` (its legacy token
        secret), default namespace set to ``namespace``. ``create``: create the SA if missing."""
        if create:
            code, body = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                                      {"metadata": {"name": name}})
            if code not in (201, 409):
                raise ClusterError(f"creating ServiceAccount {namespace}/{name}: {code} {body}")
        token = self.wait_service_account(namespace, name, timeout=timeout)
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, token, namespace=namespace, user=f"system:serviceaccount:{namespace}:{name}")
        return str(path)

    def create_namespace(self, name: str, *, wait_default_sa: bool = True, timeout: float = 30) -> str:
        code, body = self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        if code != 201:
            raise ClusterError(f"creating namespace {name}: {code} {body}")
        if wait_default_sa and self.controllers:
            # Pod admission in 1.20 rejects pods until the namespace's default SA has its token.
            self.wait_service_account(name, "default", timeout=timeout)
        return name

    def delete_namespace(self, name: str, *, wait: bool = False, timeout: float = 60) -> None:
        code, body = self.request("DELETE", f"/api/v1/namespaces/{name}")
        if code not in (200, 202, 404):
            raise ClusterError(f"deleting namespace {name}: {code} {body}")
        if wait:
            deadline = time.monotonic() + timeout
            self._wait(lambda: self._get_status(f"/api/v1/namespaces/{name}") == 404, deadline, f"namespace {name} gone")

    def pod_ips(self, namespace: str, label_selector: str | None = None, *, ready_only: bool = False) -> dict[str, str]:
        """name -> status.podIP of the pods (that have one) in ``namespace``."""
        q = f"?labelSelector={urllib.request.quote(label_selector)}" if label_selector else ""
        code, body = self.request("GET", f"/api/v1/namespaces/{namespace}/pods{q}")
        if code != 200:
            raise ClusterError(f"listing pods in {namespace}: {code} {body}")
        out = {}
        for pod in body["items"]:
            st = pod.get("status", {})
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))
            if st.get("podIP") and (ready or not ready_only):
                out[pod["metadata"]["name"]] = st["podIP"]
        return out


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a <defunct> zombie (PID 1 here does not reap) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline_has(pid: int, word: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return word.encode() in f.read()
    except OSError:
        return False


def _kill_group(pid: int, proc: subprocess.Popen | None, grace: float = 0.0) -> None:
    """Kill a process group. Default no grace: everything here is throwaway test state, and the
    apiserver's graceful shutdown alone takes seconds."""
    if grace > 0:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                break
        elif not _pid_alive(pid):
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # the rest of the group too, even if the leader is gone
    except ProcessLookupError:
        pass
    if proc is not None:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


# ---------------------------------------------------------------------- CLI
def _print_env(c: LocalCluster) -> None:
    print(f"export KUBECONFIG={c.kubeconfig}")
    print(f"export PATH=\"$PATH:{TOOLS_DIR}\"")


# What `make images` builds (scripts/images/build.sh): imported into the real node's containerd.
PROJECT_IMAGES = (
    kubelet_node.PAUSE_IMAGE,
    f"ghcr.io/nightjar-dev/nightjar-operator:{__version__}",
    f"ghcr.io/nightjar-dev/nightjar-worker:{__version__}-cpu",
    "ghcr.io/nightjar-dev/nightjar-models:smollm2-135m",
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nightjar_operator.testing.cluster",
                                description="Kubernetes 1.20 test cluster: one real node (kubelet, containerd), "
                                "or fake nodes where containers never run.")
    p.add_argument("command", choices=["up", "down", "env"])
    p.add_argument("--state-dir", default=os.environ.get("NIGHTJAR_K8S_STATE_DIR", str(DEFAULT_STATE_DIR)))
    p.add_argument("--fake-nodes", type=int, default=0, metavar="N",
                   help="N fake nodes (pods reported Running, nothing runs) instead of the real node")
    a = p.parse_args(argv)
    state_dir = Path(a.state_dir)
    existing: LocalCluster | None = None
    if (state_dir / "state.json").exists():
        existing = LocalCluster.attach(state_dir)
    if a.command == "up":
        if existing is not None and existing.alive() and existing._get_status("/readyz") == 200:
            print(f"# already running: {existing.server}", file=sys.stderr)
            _print_env(existing)
            return 0
        if existing is not None:
            existing.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
        real = a.fake_nodes == 0
        c = LocalCluster(state_dir, nodes=a.fake_nodes or 1, kubelet=real, detach=True).start()
        if real:
            assert c.node is not None
            built = [i for i in PROJECT_IMAGES if subprocess.run(
                ["podman", "image", "exists", i], capture_output=True).returncode == 0]
            c.node.import_images(built, log=lambda m: print(f"# {m}", file=sys.stderr))
            if len(built) < len(PROJECT_IMAGES):
                print(f"# not built (run `make images`): {sorted(set(PROJECT_IMAGES) - set(built))}", file=sys.stderr)
        print(f"# cluster up in {c.timings['start_s']:.1f}s: {c.server} (logs: {c.log_dir}); "
              + ("one real node, images imported" if real else f"{a.fake_nodes} fake node(s): containers never run"),
              file=sys.stderr)
        _print_env(c)
        return 0
    if a.command == "down":
        if existing is None:
            print("# no cluster running", file=sys.stderr)
            return 0
        existing.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
        print("# cluster stopped", file=sys.stderr)
        return 0
    if existing is None or not existing.alive():
        print("# no cluster running (make cluster-up)", file=sys.stderr)
        return 1
    _print_env(existing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
