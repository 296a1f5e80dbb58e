"""The kubelet stand-in's decisions: which plugin version, which claims a pod needs and when,
which prepared claims to release. The gRPC and API sides run in
tests/e2e/kubelet_plugin/test_node_path.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from vgpu_testbed.standin import rules as ks
from vgpu_testbed.standin.kubelet import parse_args
from vgpu_testbed.standin.rules import ClaimRef


def test_the_first_advertised_version_we_know_wins() -> None:
    assert ks.choose_version(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    assert ks.choose_version(["v2.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert ks.choose_version(["v1.DRAResourceHealth"]) is None


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("CSIPlugin", "d", "/s", ["v1.DRAPlugin"]), "not 'DRAPlugin'"),
        (("DRAPlugin", "", "/s", ["v1.DRAPlugin"]), "empty driver name"),
        (("DRAPlugin", "d", "rel/s", ["v1.DRAPlugin"]), "not an absolute"),
        (("DRAPlugin", "d", "/s", ["v9.DRAPlugin"]), "none of the versions"),
    ],
)
def test_bad_registration_info_is_refused_with_a_reason(
    args: tuple[str, str, str, list[str]], problem: str
) -> None:
    reason = ks.validate_plugin_info(*args)
    assert reason is not None and problem in reason
    assert ks.validate_plugin_info("DRAPlugin", "d", "/s", ["v1.DRAPlugin"]) is None


def pod(claims: list[dict[str, str]], statuses: list[dict[str, Any]] | None) -> dict[str, Any]:
    status = {} if statuses is None else {"resourceClaimStatuses": statuses}
    return {"spec": {"resourceClaims": claims}, "status": status}


def test_claim_names_come_from_direct_refs_and_generated_names() -> None:
    refs = [
        {"name": "a", "resourceClaimName": "shared-claim"},
        {"name": "b", "resourceClaimTemplateName": "tmpl"},
        {"name": "c", "resourceClaimTemplateName": "tmpl2"},
    ]
    statuses = [{"name": "b", "resourceClaimName": "pod-b-x1"}, {"name": "c"}]
    # "c" has a status without a name: the pod needs no claim for it
    assert ks.pod_claim_names(pod(refs, statuses)) == ["shared-claim", "pod-b-x1"]


def test_a_template_claim_not_generated_yet_means_wait() -> None:
    refs = [{"name": "b", "resourceClaimTemplateName": "tmpl"}]
    assert ks.pod_claim_names(pod(refs, None)) is None
    assert ks.pod_claim_names(pod([], None)) == []


def claim(*, allocated: bool, reserved_for: list[str], drivers: list[str]) -> dict[str, Any]:
    status: dict[str, Any] = {"reservedFor": [{"uid": u} for u in reserved_for]}
    if allocated:
        status["allocation"] = {"devices": {"results": [{"driver": d} for d in drivers]}}
    return {"status": status}


def test_a_claim_is_ready_only_when_allocated_and_reserved_for_the_pod() -> None:
    ready = claim(allocated=True, reserved_for=["p1"], drivers=["vgpu.dra.dev"])
    assert ks.claim_drivers_if_ready(ready, "p1") == {"vgpu.dra.dev"}
    assert ks.claim_drivers_if_ready(ready, "p2") is None
    unallocated = claim(allocated=False, reserved_for=["p1"], drivers=[])
    assert ks.claim_drivers_if_ready(unallocated, "p1") is None


def test_only_claims_no_active_pod_uses_are_released() -> None:
    prepared = {
        "u1": ClaimRef("ns", "c1", "u1"),
        "u2": ClaimRef("ns", "c2", "u2"),
        "u3": ClaimRef("ns", "c3", "u3"),
    }
    assert ks.claims_to_unprepare(prepared, {"u2"}) == [prepared["u1"], prepared["u3"]]
    assert ks.claims_to_unprepare(prepared, {"u1", "u2", "u3"}) == []


def test_pod_states() -> None:
    assert ks.is_terminating({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert not ks.is_terminating({"metadata": {}})
    assert ks.is_finished({"status": {"phase": "Succeeded"}})
    assert not ks.is_finished({"status": {"phase": "Running"}})


def test_arguments_are_validated() -> None:
    base = ["--node-name", "n", "--kubeconfig", "k", "--registrar-dir", "r", "--state-dir", "s"]
    assert parse_args(base).poll_interval == 0.5
    with pytest.raises(SystemExit):
        parse_args([*base, "--poll-interval", "0"])
