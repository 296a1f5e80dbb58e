"""The binding-condition confirmer: which pending allocations are confirmed and which are failed
as overbooked, against committed ones and against each other, in allocation order.

On the real control plane (kube-scheduler waiting in PreBind): tests/e2e/controller/
test_both_paths.py.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from controller.confirmer import CONFIRMED, OVERBOOKED, Confirmer, state
from controller.reconciler import Defaults, Reconciler
from controller.worker import Worker
from dra_driver import kube
from dra_driver.allocator.model import ClusterModel
from tests.fixtures.allocator_cluster import DRIVER, node_events

JSON = dict[str, Any]
GIB = 1 << 30


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self._rv = itertools.count(1)

    def replace(self, path: str, obj: Mapping[str, Any]) -> JSON:
        target = path.removesuffix("/status")
        current = self.objects.get(target)
        if current is None:
            raise kube.NotFound(404, "NotFound", path)
        if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", path)
        updated = copy.deepcopy(dict(obj))
        updated["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[target] = updated
        return copy.deepcopy(updated)


def claim(
    api: FakeApi,
    claims: dict[tuple[str, str], JSON],
    name: str,
    device: str,
    memory_gib: int,
    *,
    conditions: bool = True,
    at: str = "2026-01-01T00:00:00Z",
) -> None:
    result: JSON = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "node-00000",
        "device": device,
        "shareID": f"share-{name}",
        "consumedCapacity": {"memory": f"{memory_gib}Gi", "cores": "10"},
    }
    if conditions:
        result["bindingConditions"] = [CONFIRMED]
        result["bindingFailureConditions"] = [OVERBOOKED]
    obj = {
        "metadata": {"name": name, "namespace": "t", "uid": f"uid-{name}", "resourceVersion": "0"},
        "status": {
            "allocation": {"devices": {"results": [result]}, "allocationTimestamp": at},
            "reservedFor": [{"resource": "pods", "name": name, "uid": f"pod-{name}"}],
        },
    }
    path = kube.path(kube.RESOURCE_API, "resourceclaims", name, namespace="t")
    api.objects[path] = obj
    claims[("t", name)] = obj


@pytest.fixture
def setup() -> tuple[FakeApi, dict[tuple[str, str], JSON], Confirmer]:
    model = ClusterModel()
    for kind, obj in node_events(0):  # 8 x H100 80GB
        model.apply(kind, obj)
    api = FakeApi()
    claims: dict[tuple[str, str], JSON] = {}

    def remember(obj: JSON) -> None:
        claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    return api, claims, Confirmer(api, model, claims, remember)  # type: ignore[arg-type]


def written(api: FakeApi, name: str) -> JSON:
    return api.objects[kube.path(kube.RESOURCE_API, "resourceclaims", name, namespace="t")]


def conditions(api: FakeApi, name: str) -> dict[str, str]:
    (entry,) = written(api, name)["status"]["devices"]
    return {c["type"]: c["message"] for c in entry["conditions"] if c["status"] == "True"}


def test_a_default_path_allocation_overlapping_a_policy_path_one_is_failed(
    setup: tuple[FakeApi, dict[tuple[str, str], JSON], Confirmer],
) -> None:
    api, claims, confirmer = setup
    claim(api, claims, "policy", "gpu-0", 60, conditions=False)  # the controller's own
    claim(api, claims, "late", "gpu-0", 30)  # kube-scheduler's, made without seeing "policy"
    claim(api, claims, "fine", "gpu-1", 30)
    for obj in claims.values():
        confirmer.on_claim(obj)
    assert confirmer.run() == {"confirmed": 1, "overbooked": 1}
    assert list(conditions(api, "fine")) == [CONFIRMED]
    (message,) = conditions(api, "late").values()
    assert list(conditions(api, "late")) == [OVERBOOKED]
    assert "gpu-0" in message and str(90 * GIB) in message and str(80 * GIB) in message
    (entry,) = written(api, "late")["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (
        DRIVER, "node-00000", "gpu-0", "share-late"
    )  # fmt: skip
    assert confirmer.run() == {"confirmed": 0, "overbooked": 0}  # nothing new: no work


def decide(
    setup: tuple[FakeApi, dict[tuple[str, str], JSON], Confirmer], *made: tuple[str, int, str]
) -> None:
    """Claims `(name, GiB, allocated at)` on gpu-0, made in this order, seen by the confirmer,
    which then decides once."""
    api, claims, confirmer = setup
    for name, gib, at in made:
        claim(api, claims, name, "gpu-0", gib, at=at)
    for obj in claims.values():
        confirmer.on_claim(obj)
    confirmer.run()


def test_pending_allocations_are_decided_in_allocation_order(
    setup: tuple[FakeApi, dict[tuple[str, str], JSON], Confirmer],
) -> None:
    api, _, _ = setup
    decide(setup, ("second", 50, "2026-01-01T00:00:02Z"), ("first", 50, "2026-01-01T00:00:01Z"))
    assert list(conditions(api, "first")) == [CONFIRMED]
    assert list(conditions(api, "second")) == [OVERBOOKED]
    assert state(written(api, "first")) == "committed"
    assert state(written(api, "second")) == "failed"


def test_failed_claims_hold_nothing_and_a_standby_writes_nothing(
    setup: tuple[FakeApi, dict[tuple[str, str], JSON], Confirmer],
) -> None:
    api, claims, confirmer = setup
    decide(setup, ("a", 50, "2026-01-01T00:00:01Z"), ("b", 50, "2026-01-01T00:00:02Z"))
    # The failed one stays failed (kube-scheduler clears it); a new one fits next to "a".
    claims[("t", "a")] = written(api, "a")
    claims[("t", "b")] = written(api, "b")
    claim(api, claims, "c", "gpu-0", 30, at="2026-01-01T00:00:03Z")
    confirmer.may_write = lambda: False
    confirmer.on_claim(claims[("t", "c")])
    assert confirmer.run() == {"confirmed": 0, "overbooked": 0}
    assert "devices" not in written(api, "c")["status"]
    confirmer.may_write = lambda: True
    assert confirmer.run() == {"confirmed": 1, "overbooked": 0}


def test_an_api_failure_leaves_the_claim_to_decide_again(
    setup: tuple[FakeApi, dict[tuple[str, str], JSON], Confirmer],
) -> None:
    api, claims, confirmer = setup
    claim(api, claims, "a", "gpu-0", 10)
    confirmer.on_claim(claims[("t", "a")])
    real = api.replace

    def refuse(path: str, obj: Mapping[str, Any]) -> JSON:
        raise kube.KubeError(403, "Forbidden", "resourceclaims/driver")

    api.replace = refuse  # type: ignore[method-assign]
    with pytest.raises(kube.KubeError):
        confirmer.run()
    api.replace = real  # type: ignore[method-assign]
    assert confirmer.run() == {"confirmed": 1, "overbooked": 0}


def test_a_confirmation_counts_before_the_informer_delivers_it() -> None:
    """The storm's double-booking, forced: the confirmer confirms "x" (kube-scheduler's, 50Gi of
    gpu-0); before the watch brings "x" back with its condition, kube-scheduler's "w" (50Gi of
    gpu-0, allocated in the same second, a uid that sorts first) arrives and the confirmer runs
    again. "x" is committed from its confirmation on, so "w" is failed; were "x" still pending
    in the confirmer's view, "w" would come first and be confirmed too: 100Gi on an 80GB GPU."""
    api = FakeApi()
    reconciler = Reconciler(api, Defaults({}))  # type: ignore[arg-type]
    worker = Worker(api, reconciler)  # type: ignore[arg-type]
    for kind, obj in node_events(0):
        worker._apply(kind, "apply", obj)
    seen: dict[tuple[str, str], JSON] = {}  # the objects as the informer delivers them
    claim(api, seen, "x", "gpu-0", 50)
    worker._apply("ResourceClaim", "apply", seen[("t", "x")])
    assert worker.confirmer.run() == {"confirmed": 1, "overbooked": 0}
    claim(api, seen, "w", "gpu-0", 50)  # same allocationTimestamp; "uid-w" < "uid-x"
    worker._apply("ResourceClaim", "apply", seen[("t", "w")])
    assert worker.confirmer.run() == {"confirmed": 0, "overbooked": 1}
    assert list(conditions(api, "x")) == [CONFIRMED]
    assert list(conditions(api, "w")) == [OVERBOOKED]
    # The watch then delivers the older "x" (as first seen) late, and the confirmed one: the
    # older one is not taken over the confirmation.
    worker._apply("ResourceClaim", "apply", seen[("t", "x")])
    assert state(reconciler.claims[("t", "x")]) == "committed"
    worker._apply("ResourceClaim", "apply", written(api, "x"))
    assert state(reconciler.claims[("t", "x")]) == "committed"
