"""Can this node take this pod at all, devices aside? The checks kube-scheduler would make.

nodeSelector, required node affinity (matchExpressions and matchFields on metadata.name), node
taints against the pod's tolerations (NoSchedule and NoExecute; the unschedulable flag counts as
the `node.kubernetes.io/unschedulable` taint), and cpu/memory requests against allocatable minus
what bound pods request. A placement the allocator picks must survive these, or the pod would
sit allocated on a node that refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

JSON = dict[str, Any]
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """True when one toleration matches the taint (key, operator Equal/Exists, value, effect)."""
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = tol.get("key") or ""
        operator = tol.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def blocking_taint(
    taints: Sequence[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint not tolerated, or None."""
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return taint
    return None


def _requirement(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key = str(req.get("key"))
    operator = req.get("operator")
    wanted = [str(v) for v in req.get("values") or []]
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def affinity_matches(pod_spec: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """nodeSelector and requiredDuringSchedulingIgnoredDuringExecution (terms are ORed)."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": name}
    for term in terms:
        exprs = term.get("matchExpressions") or []
        field_exprs = term.get("matchFields") or []
        if not exprs and not field_exprs:
            continue  # an empty term matches nothing
        if all(_requirement(r, labels) for r in exprs) and all(
            _requirement(r, fields) for r in field_exprs
        ):
            return True
    return False


def static_misfit(
    pod_spec: Mapping[str, Any],
    name: str,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, Any]],
    unschedulable: bool,
) -> str | None:
    """Why the node cannot take the pod regardless of load, or None (selector/affinity/taints)."""
    tolerations = pod_spec.get("tolerations") or []
    if unschedulable and not tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return "unschedulable"
    if not affinity_matches(pod_spec, name, labels):
        return "node selector/affinity"
    taint = blocking_taint(taints, tolerations)
    if taint is not None:
        return f"taint {taint.get('key')}"
    return None
