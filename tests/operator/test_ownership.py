"""No takeover by name: which live objects the operator may write (reconcile/diff.py). Pure."""

from __future__ import annotations

import copy

import pytest
from nightjar_operator import constants as c
from nightjar_operator.handlers.sync import conflicts
from nightjar_operator.reconcile import diff
from nightjar_operator.reconcile.children import Owner, desired_config_map, desired_service
from nightjar_operator.reconcile.status import Observed, compute_status, get_condition
from nightjar_operator.reconcile.validate import parse_spec

OWNER = Owner(name="victim", namespace="apps", uid="uid-1")


def _spec(raw):
    spec, errs = parse_spec(raw)
    assert spec is not None, errs
    return spec


def _live(obj, **meta):
    live = copy.deepcopy(obj)
    live["metadata"].update(resourceVersion="7", uid="child-uid", **meta)
    return live


def helm_service() -> dict:
    """What `helm install victim ...` leaves: its own labels, no owner, helm as field manager."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "victim", "namespace": "apps", "resourceVersion": "7",
                     "labels": {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/name": "victim"},
                     "annotations": {"meta.helm.sh/release-name": "victim"},
                     "managedFields": [{"manager": "helm", "operation": "Update", "apiVersion": "v1"}]},
        "spec": {"ports": [{"port": 9999}], "selector": {"app": "victim"}},
    }


def test_an_unowned_object_of_the_same_name_is_a_conflict():
    desired = desired_service(OWNER)
    assert diff.plan(desired, helm_service(), OWNER.uid) is diff.Action.CONFLICT
    msg = diff.conflict_message(helm_service())
    assert msg.startswith("Service apps/victim exists") and "managed-by Helm" in msg and "untouched" in msg


def test_our_labels_alone_do_not_make_an_object_ours(raw_spec):
    """A chart can copy the operator's labels: without our field manager it is still someone else's."""
    desired = desired_config_map(OWNER, _spec(raw_spec))
    forged = _live(desired, ownerReferences=[], managedFields=[{"manager": "kubectl-client-side-apply"}])
    assert diff.plan(desired, forged, OWNER.uid) is diff.Action.CONFLICT
    # Orphaned by `kubectl delete njd --cascade=orphan`: our labels and our field manager -> adopted.
    orphan = _live(desired, ownerReferences=[], managedFields=[{"manager": c.FIELD_MANAGER, "operation": "Update"}])
    assert diff.plan(desired, orphan, OWNER.uid) is diff.Action.UPDATE
    # ... but not by a NightjarDeployment of another name.
    other = Owner(name="other", namespace="apps", uid="uid-2")
    assert diff.plan(desired_config_map(other, _spec(raw_spec)), orphan, other.uid) is diff.Action.CONFLICT


def test_controller_references_decide(raw_spec):
    desired = desired_config_map(OWNER, _spec(raw_spec))
    ours = _live(desired)
    assert diff.plan(desired, ours, OWNER.uid) is diff.Action.NONE
    # A recreated NightjarDeployment of the same name (new uid) takes over its predecessor's child.
    stale = _live(desired, ownerReferences=[{**OWNER.reference(), "uid": "old-uid"}])
    assert diff.plan(desired, stale, OWNER.uid) is diff.Action.UPDATE
    # Another controller, even a NightjarDeployment-looking one from another group: never.
    for ref in ({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "victim"},
                {"apiVersion": "nightjar.dev.evil.example/v1", "kind": c.KIND, "name": "victim"},
                {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "someone-else"}):
        foreign = _live(desired, ownerReferences=[{**ref, "uid": "x", "controller": True}])
        assert diff.plan(desired, foreign, OWNER.uid) is diff.Action.CONFLICT, ref
        assert f"controlled by {ref['kind']} {ref['name']}" in diff.conflict_message(foreign)
    # Our uid as a mere (non-controller) reference does not make it ours either.
    weak = _live(desired, ownerReferences=[{**OWNER.reference(), "controller": False}], labels={})
    assert diff.plan(desired, weak, OWNER.uid) is diff.Action.CONFLICT


def test_one_conflict_stops_every_write_and_degrades_naming_the_object(raw_spec):
    spec = _spec(raw_spec)
    wanted = [desired_config_map(OWNER, spec), desired_service(OWNER)]
    live = {("ConfigMap", "victim-config"): None, ("Service", "victim"): helm_service()}
    found = conflicts(wanted, live, OWNER)
    assert len(found) == 1 and found[0].startswith("Service apps/victim ")
    body = {"metadata": {"name": "victim", "namespace": "apps", "generation": 1}, "spec": raw_spec}
    status = compute_status(body, Observed(conflicts=found), now="2026-01-01T00:00:00Z")
    deg = get_condition(status["conditions"], c.COND_DEGRADED)
    assert (deg["status"], deg["reason"]) == ("True", "Conflict") and "Service apps/victim" in deg["message"]
    assert get_condition(status["conditions"], c.COND_READY)["reason"] == "Conflict"


@pytest.mark.parametrize("kind", ["Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler"])
def test_update_body_never_runs_for_a_conflict(kind):
    # The only path to update_body is Action.UPDATE; a foreign object with our name is CONFLICT.
    desired = {"kind": kind, "metadata": {"name": "victim", "ownerReferences": [OWNER.reference()],
                                          "annotations": {c.ANN_DESIRED_HASH: "h"}}, "spec": {}}
    live = {"kind": kind, "metadata": {"name": "victim", "namespace": "apps"}, "spec": {}}
    assert diff.plan(desired, live, OWNER.uid) is diff.Action.CONFLICT
