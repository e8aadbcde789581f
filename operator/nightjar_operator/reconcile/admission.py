"""The validating admission webhook's decision: the same ``validate()`` the reconcile runs. Pure.

``kubectl apply`` (and Argo CD, Flux) then gets the field's message at apply time instead of a
synced resource that is only reported ``InvalidSpec`` in status. The reconcile keeps its own check
and status report for specs that became invalid later (a stricter operator, a narrower pod policy,
or objects created while the webhook was not installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nightjar_operator import constants as c
from nightjar_operator.reconcile.validate import FieldError, PodPolicy, validate

ADMISSION_VERSION = "admission.k8s.io/v1"
WEBHOOK_NAME = f"validate.{c.GROUP}"  # the webhook's name in the ValidatingWebhookConfiguration
WEBHOOK_PATH = "/validate-nightjardeployments"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str  # for the metric: valid | invalid | unchanged-spec | deleting | not-checked
    errors: tuple[FieldError, ...] = ()


def decide(request: Mapping[str, Any], policy: PodPolicy) -> Decision:
    """Allow or refuse one AdmissionRequest for a NightjarDeployment."""
    operation = request.get("operation")
    obj = request.get("object") or {}
    if operation not in ("CREATE", "UPDATE"):
        return Decision(True, "not-checked")
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Decision(True, "deleting")  # finalizer removal must never be blocked
    if operation == "UPDATE" and (request.get("oldObject") or {}).get("spec") == obj.get("spec"):
        # Metadata only (kopf's annotations and finalizer, labels): a spec that became invalid
        # later is reported in status, not frozen against every other write.
        return Decision(True, "unchanged-spec")
    _, errors = validate(obj.get("spec"), str(meta.get("name") or request.get("name") or ""), policy)
    return Decision(not errors, "invalid" if errors else "valid", tuple(errors))


def response(request: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """The AdmissionReview the apiserver expects back; a refusal carries each field as a cause, and
    its message (what kubectl prints) names every field."""
    body: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": decision.allowed}
    if not decision.allowed:
        name = ((request.get("object") or {}).get("metadata") or {}).get("name") or request.get("name") or ""
        body["status"] = {
            "code": 422,
            "reason": "Invalid",
            "message": f"{c.KIND} {name!r} is invalid: " + "; ".join(str(e) for e in decision.errors),
            # As the apiserver's own validation errors: kubectl then prints
            # `The NightjarDeployment "x" is invalid: <field>: <message>` (one line per field).
            "details": {"name": name, "group": c.GROUP, "kind": c.KIND,
                        "causes": [{"type": "FieldValueInvalid", "field": e.field, "message": e.message}
                                   for e in decision.errors]},
        }
    return {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": body}
