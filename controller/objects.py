"""Reads of the API objects the controller decides over: pods, claims and their conditions.

Why a module of its own: the reconciler (decisions), the writes (effects) and the hold
bookkeeping all ask the same questions of the same JSON (is this pod gated, which claims does it
use, on which node is this claim allocated, for whom); answered once here, as pure functions of
the objects, they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dra_driver import names

JSON = dict[str, Any]
GATE = names.SCHEDULING_GATE


def now() -> str:
    """The API's time format, for conditions and allocation timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: Mapping[str, Any]) -> JSON:
    return dict(obj.get("metadata") or {})


def nsname(obj: Mapping[str, Any]) -> tuple[str, str]:
    m = meta(obj)
    return str(m.get("namespace") or ""), str(m.get("name") or "")


def version(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as the integer etcd makes it (0 when absent or odd)."""
    try:
        return int(str(meta(obj).get("resourceVersion") or "0"))
    except ValueError:
        return 0


def is_gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == GATE for g in gates)


def claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """Names of the pod's claims, or None while a template's claim is not created yet."""
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    found = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            found.append(str(entry["resourceClaimName"]))
        elif entry.get("resourceClaimTemplateName"):
            generated = statuses.get(entry.get("name"))
            if not generated:
                return None
            found.append(str(generated))
    return found


def allocated(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def allocated_for(claim: Mapping[str, Any], pod_uid: str) -> bool:
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return allocated(claim) and any(r.get("uid") == pod_uid for r in reserved)


def node_of(claim: Mapping[str, Any]) -> str:
    """The node an allocation names ("?" when it names none)."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return "?"


def condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def refused_by_scheduler(pod: Mapping[str, Any]) -> bool:
    """kube-scheduler marked the pod PodScheduled=False/Unschedulable."""
    cond = condition(pod, "PodScheduled")
    return (cond.get("status"), cond.get("reason")) == ("False", "Unschedulable")


def excluding(pod: Mapping[str, Any], nodes: set[str]) -> JSON:
    """`pod` with a required node affinity that also rules out `nodes` (ANDed into each term)."""
    spec = dict(pod.get("spec") or {})
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    rule = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), rule]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity
    return {**pod, "spec": spec}
