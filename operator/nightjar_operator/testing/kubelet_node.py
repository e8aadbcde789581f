"""One real node for the test cluster: containerd + runc + CNI (bridge, host-local, portmap), a kubelet
and kube-proxy (both built from the same Kubernetes 1.20 sources as the apiserver). Containers really
run: pods pull nothing (no registry is reachable), they use images imported into containerd with
:meth:`KubeletNode.import_images`.

Network layout (all inside this machine):

- ``NODE_IP`` (10.245.0.1/32) is added to ``lo``: the apiserver and the kubelet bind there, so pods
  (whose loopback is their own) reach the apiserver through the ``kubernetes`` Service, which
  kube-proxy DNATs to ``NODE_IP``;
- pods get addresses in ``POD_CIDR`` on the bridge ``BRIDGE``; the host reaches them directly;
  there is no masquerading out of the bridge, so pods reach nothing off this machine;
- kube-proxy (iptables mode, ``--masquerade-all``) makes ClusterIP Services answer from the host
  and from pods.

Needs root, the binaries from ``make cluster-build`` (kubelet, kube-proxy) and the Debian packages from
``scripts/k8s/install-runtime.sh`` (containerd, runc, CNI plugins, podman). :func:`missing` says what
is absent; :meth:`KubeletNode.cleanup` removes every pod, network and iptables rule it made, so a
node that is stopped leaves nothing running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

NODE_NAME = "nightjar-node"
NODE_IP = "10.245.0.1"
POD_CIDR = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
BRIDGE = "nj0"
CNI_BIN_DIR = "/usr/lib/cni"
RUN_DIR = Path("/run/nightjar-node")
CONTAINERD_SOCK = RUN_DIR / "containerd" / "containerd.sock"
PAUSE_IMAGE = "localhost/nightjar/pause:3.9"
K8S_NAMESPACE = "k8s.io"  # containerd namespace the CRI plugin uses


def missing(bin_dir: Path) -> list[str]:
    """What a real node needs and this machine lacks (empty when it can start one)."""
    out = [b for b in ("kubelet", "kube-proxy") if not (bin_dir / b).is_file()]
    out += [b for b in ("containerd", "runc", "ctr", "podman", "iptables", "ip") if shutil.which(b) is None]
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        out.append(f"CNI plugins in {CNI_BIN_DIR}")
    return out


def can_run() -> str | None:
    """Why a real node cannot run here, or None."""
    if os.geteuid() != 0:
        return "a real node (containerd, kubelet, network namespaces, iptables) needs root"
    return None


def _run(*cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout)


class KubeletNode:
    """The node's configuration files and its clean-up; the processes are spawned by the cluster
    (``spawn(name, argv)``) so that they are tracked and killed with the control plane."""

    def __init__(self, workdir: Path, bin_dir: Path, cache_dir: Path) -> None:
        self.workdir = workdir / "node"
        self.bin_dir = bin_dir
        # Persistent across clusters: imported images (gigabytes) are kept, like a node's image store.
        self.containerd_root = cache_dir / "containerd"

    # ------------------------------------------------------------------ configuration
    def _containerd_config(self) -> Path:
        cfg = _run("containerd", "config", "default").stdout
        subs = {
            r'^root = ".*"$': f'root = "{self.containerd_root}"',
            r'^state = ".*"$': f'state = "{RUN_DIR / "containerd"}"',
            r'^(\s*)address = "/run/containerd/containerd.sock"$': rf'\1address = "{CONTAINERD_SOCK}"',
            r'^(\s*)sandbox_image = ".*"$': rf'\1sandbox_image = "{PAUSE_IMAGE}"',
            # The sandbox has no CAP_SYS_RESOURCE: without this every pod sandbox fails with
            # "runc create failed: can't get final child's PID from pipe: EOF".
            r"^(\s*)restrict_oom_score_adj = false$": r"\1restrict_oom_score_adj = true",
            r'^(\s*)bin_dir = "/opt/cni/bin"$': rf'\1bin_dir = "{CNI_BIN_DIR}"',
            r'^(\s*)conf_dir = "/etc/cni/net.d"$': rf'\1conf_dir = "{self.workdir / "cni"}"',
        }
        for pat, repl in subs.items():
            cfg, n = re.subn(pat, repl, cfg, count=1, flags=re.M)
            if n != 1:
                raise RuntimeError(f"containerd's default config changed: {pat!r} not found")
        path = self.workdir / "containerd.toml"
        path.write_text(cfg)
        return path

    def _cni_config(self) -> None:
        conf = {
            "cniVersion": "0.4.0",
            "name": "nightjar",
            "plugins": [
                {
                    "type": "bridge", "bridge": BRIDGE, "isGateway": True, "hairpinMode": True,
                    # No masquerading: pods reach this machine and each other, nothing beyond.
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.workdir / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        d = self.workdir / "cni"
        d.mkdir(parents=True, exist_ok=True)
        (d / "10-nightjar.conflist").write_text(json.dumps(conf, indent=1))

    def _network(self) -> None:
        addrs = _run("ip", "-o", "addr", "show", "dev", "lo").stdout
        if f" {NODE_IP}/32 " not in addrs:
            _run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        # Pod-to-Service traffic on one bridge must pass iptables (kube-proxy's DNAT and its return).
        nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if nf.exists():
            nf.write_text("1")

    # ------------------------------------------------------------------ processes
    def prepare(self) -> None:
        """Claim the machine's one node, clear a killed node's leftovers, set up the node address
        (the apiserver binds it next) and the CNI config."""
        other = self._other_owner()
        if other:
            raise RuntimeError(f"a real test node is already running (state in {other}): "
                               "one per machine; stop it with `make cluster-down`")
        self.cleanup()  # leftovers of a node that was killed without clean-up
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        (RUN_DIR / "owner").write_text(str(self.workdir))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        self._network()
        self._cni_config()

    def start(self, spawn: Callable[[str, list[str]], None], kubeconfig: str) -> None:
        """Spawn containerd, then kubelet and kube-proxy (not waiting for the node to be Ready)."""
        spawn("containerd", ["containerd", "--config", str(self._containerd_config())])
        self._wait_socket()
        root = self.workdir / "kubelet"
        spawn("kubelet", [
            str(self.bin_dir / "kubelet"),
            f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}", f"--address={NODE_IP}", "--read-only-port=0",
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{CONTAINERD_SOCK}",
            "--runtime-request-timeout=10m",
            # cgroup v1 with a hybrid mount and no systemd: cgroupfs, no QoS hierarchy of our own.
            "--cgroup-driver=cgroupfs", "--cgroups-per-qos=false", "--enforce-node-allocatable=",
            "--fail-swap-on=false", "--network-plugin=cni", f"--cni-bin-dir={CNI_BIN_DIR}",
            f"--cni-conf-dir={self.workdir / 'cni'}", f"--pod-infra-container-image={PAUSE_IMAGE}",
            f"--root-dir={root}", f"--cert-dir={root / 'pki'}",
            # A test machine's disk is shared: never evict or garbage-collect the imported images.
            "--image-gc-high-threshold=100", "--image-gc-low-threshold=99", "--eviction-hard=",
            # ConfigMap volumes (the fleet's priors) refresh within seconds, not a minute.
            "--sync-frequency=10s", "--serialize-image-pulls=false", "--max-pods=60", "--v=1",
        ])
        spawn("kube-proxy", [
            str(self.bin_dir / "kube-proxy"),
            f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
            "--proxy-mode=iptables", f"--cluster-cidr={CLUSTER_CIDR}", "--masquerade-all",
            # Leave the machine's conntrack sysctls alone (no CAP_SYS_RESOURCE, shared machine).
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249", "--v=1",
        ])

    def _wait_socket(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if CONTAINERD_SOCK.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"containerd did not answer on {CONTAINERD_SOCK} within {timeout:.0f}s")

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        return _run("ctr", "--address", str(CONTAINERD_SOCK), "-n", K8S_NAMESPACE, *args, check=check, timeout=timeout)

    # ------------------------------------------------------------------ images
    def import_images(self, refs: list[str], log: Callable[[str], None] = print) -> dict[str, float]:
        """Copy images from the builder's store (podman) into containerd, skipping those already there
        with the same image ID. Returns seconds per imported image."""
        stamps_file = self.containerd_root / "nightjar-imported.json"
        try:
            stamps = json.loads(stamps_file.read_text())
        except (OSError, ValueError):
            stamps = {}
        present = set(self.ctr("images", "ls", "-q").stdout.split())
        took: dict[str, float] = {}
        for ref in refs:
            found = _run("podman", "image", "inspect", "--format", "{{.Id}}", ref, check=False)
            if found.returncode != 0:
                raise RuntimeError(f"image {ref} is not built: run `make images`")
            image_id = found.stdout.strip()
            if stamps.get(ref) == image_id and _normalized(ref) in present:
                continue
            t0 = time.monotonic()
            archive = self.containerd_root / "import.tar"
            try:
                _run("podman", "save", "--format", "docker-archive", "-o", str(archive), ref, timeout=1200)
                self.ctr("images", "import", str(archive), timeout=1200)
            finally:
                archive.unlink(missing_ok=True)
            stamps[ref] = image_id
            stamps_file.write_text(json.dumps(stamps, indent=1))
            took[ref] = time.monotonic() - t0
            log(f"imported {ref} into containerd in {took[ref]:.0f}s")
        return took

    # ------------------------------------------------------------------ clean-up
    def _other_owner(self) -> str | None:
        """The state dir of another node whose containerd still runs on this machine, if any."""
        try:
            owner = (RUN_DIR / "owner").read_text().strip()
        except OSError:
            return None
        if not owner or owner == str(self.workdir):
            return None
        marker = f"{owner}/containerd.toml".encode()
        return owner if any(marker in cmd for cmd in _cmdlines().values()) else None

    def cleanup(self) -> None:
        """Remove what a node leaves behind once its processes are gone or going: pod containers
        (their shims outlive containerd), mounts under the kubelet's root, network namespaces,
        kube-proxy's iptables chains, the bridge and the node address. Safe to call twice; does
        nothing while another live node owns the machine."""
        if self._other_owner():
            return
        if CONTAINERD_SOCK.exists() and self.ctr("version", check=False, timeout=5).returncode == 0:
            for task in self.ctr("tasks", "ls", "-q", check=False, timeout=30).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
            time.sleep(0.2)
            for task in self.ctr("tasks", "ls", "-q", check=False, timeout=30).stdout.split():
                self.ctr("tasks", "delete", "-f", task, check=False, timeout=30)
            for cont in self.ctr("containers", "ls", "-q", check=False, timeout=30).stdout.split():
                self.ctr("containers", "delete", cont, check=False, timeout=30)
        _kill_shims()
        for line in reversed(Path("/proc/mounts").read_text().splitlines()):
            mnt = line.split()[1].replace("\\040", " ")
            if mnt.startswith((str(self.workdir), str(RUN_DIR))):
                _run("umount", "-l", mnt, check=False)
        for ns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").is_dir() else []:
            _run("ip", "netns", "delete", ns.name, check=False)
        if (self.bin_dir / "kube-proxy").is_file():
            _run(str(self.bin_dir / "kube-proxy"), "--cleanup", check=False, timeout=60)
        _flush_kube_chains()  # the kubelet's own (KUBE-MARK-*, canaries) stay after kube-proxy's clean-up
        _run("ip", "link", "delete", BRIDGE, check=False)
        _run("ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo", check=False)
        shutil.rmtree(RUN_DIR, ignore_errors=True)


def _normalized(ref: str) -> str:
    """containerd's full name for an image reference (docker.io/library/ for bare names)."""
    name = ref.split("@", 1)[0]
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{ref}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{ref}"
    return ref


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
    return out


def _kill_shims() -> None:
    """containerd-shim processes serving our containerd (they carry its socket's directory)."""
    marker = str(RUN_DIR).encode()
    for pid, cmd in _cmdlines().items():
        if b"containerd-shim" in cmd and marker in cmd:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def _flush_kube_chains() -> None:
    for table in ("nat", "filter", "mangle"):
        rules = _run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        for rule in rules:  # jumps into KUBE-* chains from the built-in ones
            if rule.startswith("-A ") and " -j KUBE-" in rule and not rule.split()[1].startswith("KUBE-"):
                _run("iptables", "-t", table, *rule.replace("-A ", "-D ", 1).split(), check=False)
        chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
        for chain in chains:
            _run("iptables", "-t", table, "-F", chain, check=False)
        for chain in chains:
            _run("iptables", "-t", table, "-X", chain, check=False)
