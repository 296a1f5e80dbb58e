"""Placement holds: the controller's second consumer in the claims it allocates.

Why: kube-scheduler's DRA PostFilter deallocates a refused pod's claim only when the pod is its
sole consumer. Without a second entry in `status.reservedFor` it would do so on the first
refusal and, retrying at once, allocate the claim itself (first fit) before the controller could
place it again. So every claim the controller allocates also reserves a "placement" for its pod,
from the gate's lifting until kube-scheduler binds the pod; the resourceclaim controller keeps
entries that are not pods. The hold is also how a restarted controller finds the pods it placed
(their claims carry it), so there is no window in which a restart loses one.

This module says what a hold is and which ones are stale; the reconciler decides when to drop
them and `controller.writes` writes the claims.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from dra_driver import names

JSON = dict[str, Any]
GROUP = names.API_DOMAIN
RESOURCE = "placements"
SUFFIX = "-placement"  # a hold's uid: its pod's uid and this


def entry(pod_name: str, pod_uid: str) -> JSON:
    """The `reservedFor` entry that holds a claim for pod `pod_name`."""
    return {"apiGroup": GROUP, "resource": RESOURCE, "name": pod_name, "uid": pod_uid + SUFFIX}


def is_hold(ref: Mapping[str, Any]) -> bool:
    return ref.get("apiGroup") == GROUP and ref.get("resource") == RESOURCE


def pod_uid(ref: Mapping[str, Any]) -> str:
    """The uid of the pod a hold entry is for."""
    return str(ref.get("uid")).removesuffix(SUFFIX)


def held(claim: Mapping[str, Any]) -> bool:
    """The claim carries a hold (ours, for some pod)."""
    return any(is_hold(r) for r in (claim.get("status") or {}).get("reservedFor") or [])


def holds_for(claim: Mapping[str, Any], uid: str) -> bool:
    """The claim carries our hold for the pod with `uid`."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return any(is_hold(r) and r.get("uid") == uid + SUFFIX for r in reserved)


def kept(claim: Mapping[str, Any], following: Collection[str]) -> list[JSON] | None:
    """The claim's reservations without the holds of pods no longer followed (bound, gone,
    handed over), or None when there is nothing to drop."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    keep = [r for r in reserved if not is_hold(r) or pod_uid(r) in following]
    return None if len(keep) == len(reserved) else keep
