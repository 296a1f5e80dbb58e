"""The rescheduler's decisions against an in-memory API: which pods whose prepare failed are
recovered, when (grace time, rate), and how (owned pods evicted and their claims deallocated; a
bare pod only told what to do).

The same on the real control plane, with a real prepare failure: tests/e2e/controller/
test_reschedule.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from controller.rescheduler import NOT_RESCHEDULED, RESCHEDULED, Rescheduler, never_started
from dra_driver import kube

JSON = dict[str, Any]
NS = "tenant"
DRIVER = "vgpu.dra.dev"


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.events: list[JSON] = []
        self.deleted: list[tuple[str, JSON | None]] = []

    def get(self, path: str, **_: Any) -> JSON:
        if path not in self.objects:
            raise kube.NotFound(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    def replace(self, path: str, obj: Mapping[str, Any]) -> JSON:
        target = path.removesuffix("/status")
        current = self.objects[target]
        if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", path)
        updated = copy.deepcopy(dict(obj))
        updated["metadata"]["resourceVersion"] += "+"
        self.objects[target] = updated
        return copy.deepcopy(updated)

    def create(self, path: str, obj: Mapping[str, Any]) -> JSON:
        if path.endswith("/eviction"):
            pod = path.removesuffix("/eviction")
            assert obj["kind"] == "Eviction" and obj["metadata"]["name"] == pod.rsplit("/")[-1]
            uid = obj["deleteOptions"]["preconditions"]["uid"]
            assert uid == self.objects[pod]["metadata"]["uid"]
            self.deleted.append((pod, dict(obj)))
            del self.objects[pod]
            return {}
        assert path.endswith("/events")
        self.events.append(dict(obj))
        return dict(obj)


def pod_path(name: str) -> str:
    return kube.path("v1", "pods", name, namespace=NS)


def claim_path(name: str) -> str:
    return kube.path(kube.RESOURCE_API, "resourceclaims", name, namespace=NS)


def add_pod(api: FakeApi, name: str, *, owned: bool = True, driver: str = DRIVER) -> None:
    meta: JSON = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"}
    if owned:
        meta["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}
        ]
    api.objects[pod_path(name)] = {
        "metadata": meta,
        "spec": {
            "nodeName": "node-a",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        },
        "status": {
            "phase": "Pending",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            "containerStatuses": [{"name": "c", "state": {"waiting": {}}, "restartCount": 0}],
        },
    }
    api.objects[claim_path(f"{name}-gpu")] = {
        "metadata": {
            "name": f"{name}-gpu",
            "namespace": NS,
            "uid": f"c-{name}",
            "resourceVersion": "1",
        },
        "status": {
            "allocation": {"devices": {"results": [{"driver": driver, "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": f"uid-{name}"}],
        },
    }


def failed(name: str, reason: str = "PrepareOverbooked") -> JSON:
    return {
        "reason": reason,
        "type": "Warning",
        "message": "would overbook device gpu-0",
        "involvedObject": {"kind": "Pod", "namespace": NS, "name": name, "uid": f"uid-{name}"},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


def rescheduler(api: FakeApi, clock: Clock, **kwargs: Any) -> Rescheduler:
    return Rescheduler(api, [DRIVER], grace_s=30, clock=clock, **kwargs)  # type: ignore[arg-type]


def test_an_owned_pod_is_evicted_after_the_grace_time_and_its_claim_deallocated(
    api: FakeApi,
) -> None:
    clock = Clock()
    r = rescheduler(api, clock)
    add_pod(api, "p")
    r.on_event("apply", failed("p"))
    r.on_event("apply", failed("p", "FailedPrepareDynamicResources"))  # one candidate per pod
    clock.now += 29
    r.run()
    assert pod_path("p") in api.objects  # the kubelet may still succeed within the grace time
    clock.now += 1
    r.run()
    assert [p for p, _ in api.deleted] == [pod_path("p")]
    status = api.objects[claim_path("p-gpu")]["status"]
    assert "allocation" not in status and "reservedFor" not in status
    (event,) = api.events
    assert event["reason"] == RESCHEDULED and "ReplicaSet rs creates it again" in event["message"]
    r.on_event("apply", failed("p"))  # a late Event of the deleted pod: nothing more
    clock.now += 60
    r.run()
    assert len(api.deleted) == 1


def test_a_bare_pod_is_told_what_to_do_and_kept(api: FakeApi) -> None:
    clock = Clock()
    r = rescheduler(api, clock)
    add_pod(api, "bare", owned=False)
    r.on_event("apply", failed("bare", "PrepareFailed"))
    clock.now += 30
    r.run()
    assert api.deleted == [] and api.objects[claim_path("bare-gpu")]["status"]["allocation"]
    (event,) = api.events
    assert event["reason"] == NOT_RESCHEDULED
    assert "delete it and create it again" in event["message"] and "node-a" in event["message"]


def test_pods_that_started_or_use_other_drivers_or_failed_transiently_are_left_alone(
    api: FakeApi,
) -> None:
    clock = Clock()
    r = rescheduler(api, clock)
    add_pod(api, "started")
    api.objects[pod_path("started")]["status"]["containerStatuses"][0]["state"] = {"running": {}}
    add_pod(api, "other", driver="gpu.example.com")
    add_pod(api, "transient")
    for name in ("started", "other"):
        r.on_event("apply", failed(name))
    r.on_event("apply", failed("transient", "PrepareApiError"))  # the node retries those itself
    clock.now += 30
    r.run()
    assert api.deleted == [] and api.events == []


def test_a_standby_does_nothing_until_it_leads(api: FakeApi) -> None:
    clock = Clock()
    leader = [False]
    r = rescheduler(api, clock, may_write=lambda: leader[0])
    add_pod(api, "p")
    r.on_event("apply", failed("p"))
    clock.now += 30
    r.run()
    assert api.deleted == []
    leader[0] = True
    r.run()
    assert len(api.deleted) == 1


def test_recoveries_are_rate_limited(api: FakeApi) -> None:
    clock = Clock()
    r = rescheduler(api, clock, per_minute=2)
    for i in range(6):
        add_pod(api, f"p{i}")
        r.on_event("apply", failed(f"p{i}"))
    clock.now += 30
    r.run()
    assert len(api.deleted) == 2  # the bucket: 1 token at start + 30 s at 2 a minute
    clock.now += 29
    r.run()
    assert len(api.deleted) == 2
    clock.now += 1
    r.run()
    assert len(api.deleted) == 3
    clock.now += 600  # a long quiet time fills the bucket to one minute's worth only
    r.run()
    assert len(api.deleted) == 5
    clock.now += 30
    r.run()
    assert len(api.deleted) == 6


def test_never_started() -> None:
    assert never_started({"status": {"phase": "Pending"}})
    waiting = {"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert never_started({"status": {"phase": "Pending", "containerStatuses": [waiting]}})
    ran = {"name": "c", "state": {"waiting": {}}, "lastState": {"terminated": {"exitCode": 1}}}
    assert not never_started({"status": {"phase": "Pending", "containerStatuses": [ran]}})
    assert not never_started({"status": {"phase": "Running"}})


def test_the_policy_paths_hold_does_not_count_as_another_user(api: FakeApi) -> None:
    clock = Clock()
    r = rescheduler(api, clock)
    add_pod(api, "p")
    add_pod(api, "shared")
    users = {
        n: api.objects[claim_path(f"{n}-gpu")]["status"]["reservedFor"] for n in ("p", "shared")
    }
    hold = {"apiGroup": "vgpu.dra.dev", "resource": "placements", "name": "p", "uid": "u-hold"}
    users["p"].append(hold)
    users["shared"].append({"resource": "pods", "name": "other", "uid": "uid-other"})
    for name in ("p", "shared"):
        r.on_event("apply", failed(name))
    clock.now += 30
    r.run()
    assert "allocation" not in api.objects[claim_path("p-gpu")]["status"]
    assert api.objects[claim_path("shared-gpu")]["status"]["allocation"]  # another pod uses it
