"""Desired vs live: decide create / update / nothing / conflict, and build the update body. Pure.

A live object differs from what we sent by server defaults (``terminationMessagePath``, probe
``successThreshold``, ...) and by canonicalised quantities (``0.5`` -> ``500m``). So "in sync" means:
the live ``desired-hash`` annotation equals ours (catches removals) *and* the desired object is a
subset of the live one with quantities compared by value (catches edits by others: drift).
"""

from __future__ import annotations

import copy
import enum
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from nightjar_operator import constants as c


class Action(str, enum.Enum):
    CREATE = "create"
    UPDATE = "update"
    NONE = "none"
    CONFLICT = "conflict"  # a same-named object we do not own: never overwritten


_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"),
    "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QTY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number (None if it is not one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    m = _QTY.match(value.strip())
    if not m:
        return None
    try:
        num = Decimal(m.group(1))
    except InvalidOperation:
        return None
    suffix = m.group(2)
    if suffix[:1] in ("e", "E"):
        return num * (Decimal(10) ** int(suffix[1:]))
    factor = _SUFFIX.get(suffix)
    return None if factor is None else num * factor


def _equal(desired: Any, live: Any, quantity: bool) -> bool:
    if desired == live:
        return True
    if quantity:
        a, b = parse_quantity(desired), parse_quantity(live)
        return a is not None and a == b
    return False


def is_subset(desired: Any, live: Any, *, _quantity: bool = False) -> bool:
    """Every field of ``desired`` is present in ``live`` with the same value (lists: same length)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        for key, value in desired.items():
            if key not in live:
                # An empty map/list we sent may come back omitted.
                if value in ({}, []):
                    continue
                return False
            if not is_subset(value, live[key], _quantity=key in ("limits", "requests") or _quantity):
                return False
        return True
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, lv, _quantity=_quantity) for d, lv in zip(desired, live, strict=True))
    return _equal(desired, live, _quantity)


def differences(desired: Any, live: Any, path: str = "", depth: int = 6) -> list[str]:
    """Dotted paths where ``live`` does not contain ``desired`` (for events and logs)."""
    if depth == 0 or is_subset(desired, live):
        return [] if is_subset(desired, live) else [path or "<root>"]
    if isinstance(desired, dict) and isinstance(live, dict):
        out: list[str] = []
        for key, value in desired.items():
            sub = f"{path}.{key}" if path else key
            if key not in live:
                if value not in ({}, []):
                    out.append(sub)
            else:
                out.extend(differences(value, live[key], sub, depth - 1))
        return out
    if isinstance(desired, list) and isinstance(live, list) and len(desired) == len(live):
        out = []
        for i, (d, lv) in enumerate(zip(desired, live, strict=True)):
            out.extend(differences(d, lv, f"{path}[{i}]", depth - 1))
        return out
    return [path or "<root>"]


def _controller(live: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in live.get("metadata", {}).get("ownerReferences") or [] if r.get("controller")), None)


def owned_by(live: dict[str, Any], owner_uid: str) -> bool:
    """Controlled by this NightjarDeployment (its uid in the controller owner reference)."""
    ref = _controller(live)
    return ref is not None and ref.get("uid") == owner_uid


def made_by_operator(live: dict[str, Any], owner_name: str) -> bool:
    """Written by this operator for a NightjarDeployment of this name: our labels *and* our field
    manager in managedFields (an object orphaned by ``kubectl delete --cascade=orphan`` keeps both).
    Labels alone are not proof (a chart can copy them); a managedFields entry under our manager is
    only there if the operator wrote the object, or someone who could edit it anyway forged it."""
    meta = live.get("metadata", {})
    labels = meta.get("labels") or {}
    if labels.get(c.LABEL_MANAGED_BY) != c.OPERATOR_NAME or labels.get(c.LABEL_DEPLOYMENT) != owner_name:
        return False
    return any(f.get("manager") == c.FIELD_MANAGER for f in meta.get("managedFields") or [])


def adoptable(live: dict[str, Any], owner_name: str) -> bool:
    """Ours although not controlled by this owner's uid: controlled by an earlier NightjarDeployment
    of the same name (deleted and recreated before the garbage collector ran), or orphaned from one
    (``made_by_operator``). Anything else of the name (a Helm chart's Service, a hand-made
    ConfigMap) is someone else's and is never written: whoever may create a NightjarDeployment must
    not be able to replace objects they could not edit themselves."""
    ref = _controller(live)
    if ref is not None:
        return bool(ref.get("kind") == c.KIND and ref.get("name") == owner_name
                    and str(ref.get("apiVersion", "")).startswith(c.GROUP + "/"))
    return made_by_operator(live, owner_name)


def conflict_message(live: dict[str, Any]) -> str:
    """One line naming the object in the way and who holds it (for the Degraded condition)."""
    meta = live.get("metadata", {})
    ref = _controller(live)
    if ref is not None:
        held = f"controlled by {ref.get('kind')} {ref.get('name')}"
    else:
        manager = (meta.get("labels") or {}).get(c.LABEL_MANAGED_BY)
        held = f"not created by {c.OPERATOR_NAME}" + (f" (managed-by {manager})" if manager else "")
    return (f"{live.get('kind')} {meta.get('namespace')}/{meta.get('name')} exists and is {held}: "
            "left untouched; rename the NightjarDeployment or remove that object")


def plan(desired: dict[str, Any], live: dict[str, Any] | None, owner_uid: str) -> Action:
    if live is None:
        return Action.CREATE
    if not owned_by(live, owner_uid):
        owner_name = desired["metadata"]["ownerReferences"][0]["name"]
        return Action.UPDATE if adoptable(live, owner_name) else Action.CONFLICT
    want = desired["metadata"].get("annotations", {}).get(c.ANN_DESIRED_HASH)
    have = (live["metadata"].get("annotations") or {}).get(c.ANN_DESIRED_HASH)
    if want != have or not is_subset(desired, live):
        return Action.UPDATE
    return Action.NONE


# Service fields the apiserver allocates and will not let an update clear.
_SERVICE_ALLOCATED = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "healthCheckNodePort")


def update_body(desired: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """A full object for PUT (replace) carrying ``live``'s resourceVersion (optimistic concurrency).

    Our labels/annotations win over live ones, foreign ones are kept; the owner reference is ours;
    the spec/data are replaced wholesale so removals take effect, except fields the apiserver
    allocated on Services.
    """
    body = copy.deepcopy(desired)
    lmeta = live.get("metadata", {})
    meta = body["metadata"]
    meta["resourceVersion"] = lmeta.get("resourceVersion")
    meta["labels"] = {**(lmeta.get("labels") or {}), **meta.get("labels", {})}
    meta["annotations"] = {**(lmeta.get("annotations") or {}), **meta.get("annotations", {})}
    ours = {ref["uid"] for ref in meta["ownerReferences"]}
    # Drop stale controller refs (a deleted owner of the same name) and keep foreign non-controllers.
    others = [r for r in (lmeta.get("ownerReferences") or []) if r.get("uid") not in ours and not r.get("controller")]
    meta["ownerReferences"] = meta["ownerReferences"] + others
    if desired["kind"] == "Service":
        for key in _SERVICE_ALLOCATED:
            if key in live.get("spec", {}):
                body["spec"][key] = live["spec"][key]
    if desired["kind"] == "ConfigMap" and "binaryData" in live:
        body["binaryData"] = live["binaryData"]
    return body
