"""In-memory stand-ins for the API that the controller's unit tests share (this directory only).

- `FakeApi`: objects by REST path, with the API server's optimistic concurrency (resourceVersion
  checked on every write, 409 on a stale one), and the helpers that put claims and gated pods in
  it and feed them to a reconciler as the informers would;
- `Script`: lists and watch streams served in order, for an informer;
- `Leases`: Lease objects with the same concurrency, for leader election.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from controller.reconciler import GATE, Reconciler
from dra_driver import kube
from tests.fixtures.allocator_cluster import DRIVER

JSON = dict[str, Any]
NS = "tenant"


class FakeApi:
    """Objects by REST path; writes check resourceVersion like the API server."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.history: list[tuple[str, JSON]] = []  # every version stored, in order (a watch)
        self.events: list[JSON] = []
        self.fail: dict[str, list[kube.KubeError]] = {}  # path -> errors to raise first
        self._rv = itertools.count(100)

    def put(self, path: str, obj: JSON) -> JSON:
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        self.objects[path] = obj
        self.history.append((path, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def _raise_planned(self, path: str) -> None:
        if self.fail.get(path):
            raise self.fail[path].pop(0)

    def get(self, path: str, **_: Any) -> JSON:
        if path not in self.objects:
            raise kube.NotFound(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    def list(self, path: str, **_: Any) -> list[JSON]:
        return [copy.deepcopy(o) for p, o in self.objects.items() if p.startswith(path)]

    def replace(self, path: str, obj: Mapping[str, Any]) -> JSON:
        self._raise_planned(path)
        target = path.removesuffix("/status")
        if target not in self.objects:
            raise kube.NotFound(404, "NotFound", path)
        current = self.objects[target]
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", path)
        updated = dict(current)
        if path.endswith("/status"):
            updated["status"] = copy.deepcopy(obj.get("status"))
        else:
            updated = copy.deepcopy(dict(obj))
        return self.put(target, updated)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> JSON:
        current = self.objects[path]
        want = patch.get("metadata", {}).get("resourceVersion")
        if want and want != current["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", path)
        updated = copy.deepcopy(current)
        gates = patch["spec"]["schedulingGates"]
        updated["spec"]["schedulingGates"] = gates or []
        return self.put(path, updated)

    def strategic_patch(self, path: str, patch: Mapping[str, Any]) -> JSON:
        target = copy.deepcopy(self.objects[path.removesuffix("/status")])
        conditions = target.setdefault("status", {}).setdefault("conditions", [])
        for cond in patch["status"]["conditions"]:
            conditions[:] = [c for c in conditions if c["type"] != cond["type"]] + [cond]
        return self.put(path.removesuffix("/status"), target)

    def create(self, path: str, obj: Mapping[str, Any]) -> JSON:
        assert path.endswith("/events"), path
        self.events.append(dict(obj))
        return dict(obj)


def claim_path(name: str) -> str:
    return kube.path(kube.RESOURCE_API, "resourceclaims", name, namespace=NS)


def pod_path(name: str) -> str:
    return kube.path("v1", "pods", name, namespace=NS)


def make_claim(api: FakeApi, name: str, memory: str = "10Gi") -> JSON:
    return api.put(
        claim_path(name),
        {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "capacity": {"requests": {"memory": memory}},
                            },
                        }
                    ]
                }
            },
        },
    )


def make_pod(api: FakeApi, name: str, claims: list[str], **annotations: str) -> JSON:
    return api.put(
        pod_path(name),
        {
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-{name}",
                "annotations": {f"vgpu.dra.dev/{k}": v for k, v in annotations.items()},
            },
            "spec": {
                "schedulingGates": [{"name": "other/gate"}, {"name": GATE}],
                "containers": [{"name": "c"}],
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            },
        },
    )


def feed(r: Reconciler, api: FakeApi) -> None:
    """What the informers would deliver: every claim and pod as the API holds it now."""
    for path, obj in list(api.objects.items()):
        r.on_event("Pod" if "/pods/" in path else "ResourceClaim", "apply", obj)


def node_of(claim: JSON) -> str:
    term = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    return str(term["matchFields"][0]["values"][0])


def pod(name: str, rv: str) -> JSON:
    return {"metadata": {"name": name, "namespace": "n", "uid": f"u-{name}", "resourceVersion": rv}}


class Script:
    """Lists and watch streams served in order; records the versions watches started from."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.lists: list[tuple[list[JSON], str]] = [
            ([pod("a", "5"), pod("b", "6")], "10"),
            ([pod("a", "5"), pod("c", "30")], "40"),  # after 410: b vanished, c appeared
        ]
        self.watch_from: list[str] = []

    def list_versioned(
        self, path: str, *, field_selector: str | None = None
    ) -> tuple[list[JSON], str]:
        return self.lists.pop(0)

    def watch(
        self, path: str, version: str, *, timeout_s: int, field_selector: str | None = None
    ) -> Iterator[JSON]:
        self.watch_from.append(version)
        n = len(self.watch_from)
        if n == 1:
            yield {"type": "MODIFIED", "object": pod("a", "11")}
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}
            raise kube.Unreachable(0, "Unreachable", "connection reset")
        if n == 2:
            raise kube.Gone(410, "Expired", "too old resource version")
        yield {"type": "DELETED", "object": pod("a", "41")}
        self.stop.set()


class Leases:
    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self._rv = itertools.count(1)

    def _store(self, path: str, obj: Mapping[str, Any]) -> JSON:
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def get(self, path: str, **_: Any) -> JSON:
        if path not in self.objects:
            raise kube.NotFound(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    def create(self, collection: str, obj: Mapping[str, Any]) -> JSON:
        path = f"{collection}/{obj['metadata']['name']}"
        if path in self.objects:
            raise kube.AlreadyExists(409, "AlreadyExists", path)
        return self._store(path, obj)

    def replace(self, path: str, obj: Mapping[str, Any]) -> JSON:
        if obj["metadata"]["resourceVersion"] != self.objects[path]["metadata"]["resourceVersion"]:
            raise kube.Conflict(409, "Conflict", path)
        return self._store(path, obj)
