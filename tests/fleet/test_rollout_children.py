"""Pure parts of the rollout I/O: the stable spec during a rollout and the candidate's children."""

from __future__ import annotations

import pytest
from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec
from nightjar_operator.fleet.rollout import plan, stable_spec
from nightjar_operator.handlers.fleet_tick import FleetSettings
from nightjar_operator.handlers.rollout_io import candidate_children, desired_revision
from nightjar_operator.reconcile.children import Owner


def spec(draft: str = "draft-1", replicas: int = 4) -> NightjarDeploymentSpec:
    return NightjarDeploymentSpec.model_validate({
        "target": {"name": "t", "source": {"imagePath": "/models/t"}},
        "draft": {"name": draft, "source": {"imagePath": f"/models/{draft}"}},
        "replicas": replicas,
        "image": "ghcr.io/nightjar-dev/nightjar-worker:0.1.0-cpu",
        "rollout": {"steps": [25, 100], "analysisWindowSeconds": 60},
    })  # fmt: skip


def test_stable_spec_keeps_the_stable_pair_and_share():
    old, new = spec("draft-1"), spec("draft-2")
    assert stable_spec(new, None) is new  # no rollout state yet: the spec as it is
    p0 = plan(None, desired_revision(old), 4, [25, 100], 60, 0.0, None)
    status = {"rollout": p0.state.to_status()}
    assert stable_spec(old, status) == old
    p1 = plan(p0.state, desired_revision(new), 4, [25, 100], 60, 1.0, None)
    during = stable_spec(new, {"rollout": p1.state.to_status()})
    assert during.draft.name == "draft-1" and during.replicas == 3 and during.target == new.target
    assert during.image == new.image


def test_candidate_children_are_on_their_own_track():
    owner = Owner("chat", "ns", "uid-1")
    cm, dep = candidate_children(owner, spec("draft-2"), 1, priors=None)
    assert cm["metadata"]["name"] == "chat-candidate-config" and dep["metadata"]["name"] == "chat-candidate"
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["selector"]["matchLabels"][c.LABEL_TRACK] == "candidate"
    assert dep["spec"]["template"]["metadata"]["labels"][c.LABEL_TRACK] == "candidate"
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["config"]["configMap"]["name"] == "chat-candidate-config"
    assert dep["metadata"]["annotations"][c.ANN_DRAFT] == "draft-2"
    # The Service selector (reconcile) matches both tracks.
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels[c.LABEL_DEPLOYMENT] == "chat" and labels[c.LABEL_NAME] == c.WORKER_APP
    # Carrying live priors over does not change the desired hash (priors are not spec).
    pri = {"bucket_edges": [1, 2], "entries": [{"bucket_lo": 1, "gamma": 1, "mean_loss_s": 0.01, "count": 2.0}]}
    cm2, _ = candidate_children(owner, spec("draft-2"), 1, priors=pri)
    assert cm2["metadata"]["annotations"][c.ANN_DESIRED_HASH] == cm["metadata"]["annotations"][c.ANN_DESIRED_HASH]
    assert "priors" in cm2["data"][c.CONFIG_KEY]


def test_fleet_settings_from_env_name_the_variable():
    s = FleetSettings.from_env({"NIGHTJAR_FLEET_INTERVAL_S": "2", "NIGHTJAR_FLEET_SCRAPE_PORT": "9100"})
    assert s.interval_s == 2 and s.scrape_port == 9100
    with pytest.raises(ValueError, match="NIGHTJAR_FLEET_INTERVAL_S"):
        FleetSettings.from_env({"NIGHTJAR_FLEET_INTERVAL_S": "-1"})


def test_strategy_replace_has_no_candidate():
    old = spec("draft-1")
    new = NightjarDeploymentSpec.model_validate({**spec("draft-2").wire(), "rollout": {"strategy": "Replace"}})
    p0 = plan(None, desired_revision(old), 4, [25, 100], 60, 0.0, None)
    assert stable_spec(new, {"rollout": p0.state.to_status()}) is new
    p1 = plan(p0.state, desired_revision(new), 4, None, 60, 1.0, None)
    assert p1.state.candidate is None and p1.state.stable.revision == desired_revision(new).revision
