"""The admission webhook's decision and certificates. Pure: the real-apiserver test is in
test_webhook_cluster.py."""

from __future__ import annotations

import copy
import datetime as dt

import pytest
from nightjar_operator.handlers import webhook
from nightjar_operator.reconcile.admission import decide, response
from nightjar_operator.reconcile.validate import PodPolicy, validate

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _request(spec, operation="CREATE", old_spec=None, **meta):
    req = {"uid": "u-1", "operation": operation, "name": "pool", "namespace": "apps",
           "object": {"metadata": {"name": "pool", "namespace": "apps", **meta}, "spec": spec}}
    if old_spec is not None:
        req["oldObject"] = {"metadata": {"name": "pool"}, "spec": old_spec}
    return req


def test_a_valid_spec_is_allowed(raw_spec):
    d = decide(_request(raw_spec), PodPolicy())
    assert (d.allowed, d.reason) == (True, "valid")
    assert response(_request(raw_spec), d) == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                               "response": {"uid": "u-1", "allowed": True}}


@pytest.mark.parametrize(("change", "field"), [
    ({"draft": {"name": "x", "source": {"pvc": {"claimName": "models", "path": "target"}}}}, "spec.draft.source"),
    ({"speculation": {"maxGamma": 40}}, "spec.speculation.maxGamma"),
    ({"pod": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}, "spec.pod.volumes[0].hostPath"),
    ({"pod": {"envFrom": [{"secretRef": {"name": "s"}}]}}, "spec.pod.envFrom[0].prefix"),
])
def test_an_invalid_spec_is_refused_with_the_same_errors_as_the_reconcile(raw_spec, change, field):
    spec = {**copy.deepcopy(raw_spec), **change}
    d = decide(_request(spec), PodPolicy())
    assert not d.allowed and d.reason == "invalid"
    assert list(d.errors) == validate(spec, "pool", PodPolicy())[1]  # one definition
    st = response(_request(spec), d)["response"]["status"]
    assert st["code"] == 422 and st["reason"] == "Invalid"
    assert st["message"].startswith("NightjarDeployment 'pool' is invalid: ") and field + ": " in st["message"]
    assert field in [c["field"] for c in st["details"]["causes"]]
    assert (st["details"]["kind"], st["details"]["name"]) == ("NightjarDeployment", "pool")


def test_policy_widening_reaches_the_webhook(raw_spec):
    spec = {**raw_spec, "pod": {"volumes": [{"name": "h", "hostPath": {"path": "/data"}}]}}
    assert not decide(_request(spec), PodPolicy()).allowed
    assert decide(_request(spec), PodPolicy(frozenset({"hostPath"}))).allowed


def test_writes_that_do_not_change_the_spec_are_never_blocked(raw_spec):
    """A spec that became invalid later (stricter policy, older object) keeps getting kopf's
    annotations, finalizer and a deletion: only status reports it."""
    bad = {**raw_spec, "speculation": {"maxGamma": 40}}
    assert decide(_request(bad, "UPDATE", old_spec=bad), PodPolicy()).reason == "unchanged-spec"
    assert decide(_request(bad, "UPDATE", old_spec=raw_spec), PodPolicy()).reason == "invalid"
    assert decide(_request(bad, "UPDATE", old_spec=raw_spec, deletionTimestamp="2026-01-01T00:00:00Z"),
                  PodPolicy()).reason == "deleting"
    assert decide(_request(bad, "DELETE"), PodPolicy()).allowed
    # A name that is no DNS-1035 label is refused at apply time too.
    req = _request(raw_spec)
    req["object"]["metadata"]["name"] = "Pool_1"
    assert "metadata.name" in [e.field for e in decide(req, PodPolicy()).errors]


def test_shared_certificate_covers_the_service_and_renews_under_the_same_ca():
    hosts = ("a-release-name-that-is-long-operator-webhook.a-long-namespace-name.svc.cluster.local", "127.0.0.1")
    ca_key, ca = webhook.new_ca(NOW)
    key, cert = webhook.new_serving_cert(ca_key, ca, hosts, NOW)
    assert webhook.usable(cert, ca, hosts, NOW)
    assert not webhook.usable(cert, ca, (*hosts, "other.svc"), NOW)  # a new Service name: reissued
    assert not webhook.usable(cert, ca, hosts, NOW + dt.timedelta(days=webhook.CERT_DAYS - 59))  # due
    other_key, other_ca = webhook.new_ca(NOW)
    assert not webhook.usable(cert, other_ca, hosts, NOW)  # not signed by the CA in the bundle
    assert webhook.ca_usable(ca, NOW + dt.timedelta(days=webhook.CA_DAYS - 61))
    assert not webhook.ca_usable(b"garbage", NOW)


def test_the_server_answers_over_https_with_the_decision(raw_spec, tmp_path):
    """kopf's WebhookServer driven by our handler, on loopback with a certificate from a directory
    (the cert-manager layout), verified against its CA as the apiserver does."""
    import ssl
    import time

    import httpx
    from helpers import free_port

    ca_key, ca = webhook.new_ca(NOW.replace(year=dt.datetime.now().year))
    key, cert = webhook.new_serving_cert(ca_key, ca, ("127.0.0.1",), dt.datetime.now(dt.timezone.utc))
    for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
        (tmp_path / name).write_bytes(data)
    port = free_port()
    serving = webhook.start(webhook.WebhookSettings(port=port, addr="127.0.0.1", cert_dir=str(tmp_path)))
    try:
        bad = {**raw_spec, "speculation": {"maxGamma": 40}}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": _request(bad)}
        url = f"https://127.0.0.1:{port}/validate-nightjardeployments"
        for _ in range(50):
            try:
                r = httpx.post(url, json=review, timeout=5, trust_env=False,
                               verify=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")))
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        out = r.json()["response"]
        assert out["uid"] == "u-1" and out["allowed"] is False
        assert "spec.speculation.maxGamma" in out["status"]["message"]
    finally:
        serving.stop()
    assert not serving.thread.is_alive()
