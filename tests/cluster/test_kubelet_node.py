"""The real node's configuration (no processes started): containerd's settings the sandbox needs,
and image names as containerd stores them."""

from __future__ import annotations

import json

import pytest
from nightjar_operator.testing import kubelet_node as kn


def test_containerd_config_carries_the_sandbox_settings(tmp_path):
    node = kn.KubeletNode(tmp_path / "run", tmp_path / "bin", tmp_path / "cache")
    node.workdir.mkdir(parents=True)
    text = node._containerd_config().read_text()
    assert f'root = "{tmp_path / "cache" / "containerd"}"' in text  # images survive the cluster
    assert f'address = "{kn.CONTAINERD_SOCK}"' in text  # never the machine's own containerd socket
    assert f'sandbox_image = "{kn.PAUSE_IMAGE}"' in text
    assert "restrict_oom_score_adj = true" in text
    assert f'bin_dir = "{kn.CNI_BIN_DIR}"' in text and f'conf_dir = "{node.workdir / "cni"}"' in text


def test_cni_config_keeps_pods_on_this_machine(tmp_path):
    node = kn.KubeletNode(tmp_path / "run", tmp_path / "bin", tmp_path / "cache")
    node._cni_config()
    (bridge, portmap) = json.loads((node.workdir / "cni" / "10-nightjar.conflist").read_text())["plugins"]
    assert bridge["bridge"] == kn.BRIDGE and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": kn.POD_CIDR}]]
    assert portmap["type"] == "portmap"


def test_image_names_as_containerd_stores_them():
    assert kn._normalized("busybox:1.36") == "docker.io/library/busybox:1.36"
    assert kn._normalized("vllm/vllm-openai:v0.32.0") == "docker.io/vllm/vllm-openai:v0.32.0"
    assert kn._normalized("ghcr.io/nightjar-dev/nightjar-operator:0.1.0") == "ghcr.io/nightjar-dev/nightjar-operator:0.1.0"
    assert kn._normalized(kn.PAUSE_IMAGE) == kn.PAUSE_IMAGE


def test_a_second_node_refuses_to_start_and_leaves_the_first_alone(tmp_path, monkeypatch):
    """One real node per machine: while another node's containerd runs, prepare() refuses and
    cleanup() touches nothing (a failed start calls it)."""
    monkeypatch.setattr(kn, "RUN_DIR", tmp_path / "run-node")
    kn.RUN_DIR.mkdir()
    other = tmp_path / "other" / "node"
    (kn.RUN_DIR / "owner").write_text(str(other))
    monkeypatch.setattr(kn, "_cmdlines", lambda: {42: f"containerd\0--config\0{other}/containerd.toml\0".encode()})
    calls = []
    monkeypatch.setattr(kn, "_run", lambda *a, **k: calls.append(a))
    node = kn.KubeletNode(tmp_path / "mine", tmp_path / "bin", tmp_path / "cache")
    with pytest.raises(RuntimeError, match="already running"):
        node.prepare()
    node.cleanup()
    assert calls == [] and (kn.RUN_DIR / "owner").exists()
    # Once that containerd is gone, its leftovers are ours to clear.
    monkeypatch.setattr(kn, "_cmdlines", lambda: {})
    assert node._other_owner() is None
