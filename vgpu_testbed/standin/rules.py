"""The kubelet stand-in's decisions, as pure functions over API objects (plain dicts).

Which DRA service version to use, whether a plugin's registration info is acceptable, which
claims a pod uses and whether they are ready for it, which prepared claims nobody needs any
more. Used by `vgpu_testbed.standin.kubelet` and `vgpu_testbed.standin.plugins`; unit-tested in
tests/unit/vgpu_testbed/standin/test_rules.py without servers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

PLUGIN_TYPE = "DRAPlugin"
# DRA service versions the stand-in speaks, as the kubelet 1.37 does (preference is the plugin's).
KNOWN_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


@dataclass(frozen=True, slots=True, order=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def to_json(self) -> JSON:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


def choose_version(advertised: Sequence[str]) -> str | None:
    """The first advertised DRA service version this stand-in knows (the kubelet's rule)."""
    return next((v for v in advertised if v in KNOWN_VERSIONS), None)


def validate_plugin_info(
    plugin_type: str, name: str, endpoint: str, versions: Sequence[str]
) -> str | None:
    """None when the registration info is usable, else the reason to report back."""
    if plugin_type != PLUGIN_TYPE:
        return f"plugin type {plugin_type!r} is not {PLUGIN_TYPE!r}"
    if not name:
        return "plugin reported an empty driver name"
    if not os.path.isabs(endpoint):
        return f"endpoint {endpoint!r} is not an absolute socket path"
    if choose_version(versions) is None:
        return f"none of the versions {list(versions)} is supported (known: {list(KNOWN_VERSIONS)})"
    return None


def pod_claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """Names of the ResourceClaims a pod uses, or None while a generated name is not known yet.

    Claims from templates are named in `status.resourceClaimStatuses` by the resourceclaim
    controller; an entry without a name means the pod needs no claim for that reference.
    """
    spec_claims = (pod.get("spec") or {}).get("resourceClaims") or []
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names: list[str] = []
    for ref in spec_claims:
        if ref.get("resourceClaimName"):
            names.append(str(ref["resourceClaimName"]))
            continue
        if ref.get("name") not in generated:
            return None
        claim_name = generated[ref.get("name")]
        if claim_name:
            names.append(str(claim_name))
    return names


def claim_drivers_if_ready(claim: Mapping[str, Any], pod_uid: str) -> set[str] | None:
    """Drivers of an allocated claim reserved for the pod; None if the pod must still wait."""
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        return None
    reserved = {str(r.get("uid")) for r in status.get("reservedFor") or []}
    if pod_uid not in reserved:
        return None
    results = (allocation.get("devices") or {}).get("results") or []
    return {str(r.get("driver")) for r in results}


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def claims_to_unprepare(prepared: Mapping[str, ClaimRef], in_use: set[str]) -> list[ClaimRef]:
    """Prepared claims that no active pod on the node uses any more."""
    return sorted(ref for uid, ref in prepared.items() if uid not in in_use)
