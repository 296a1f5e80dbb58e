"""The reconciler with overlapping pod writes (`write_concurrency` > 1), against the in-memory API.

Proves: with every decision made before any write lands, the placements equal the serial ones
(a decided placement is reserved in the model, so no capacity is handed out twice), and the
writes of different pods are really in flight together; a write failure of one pod in the middle
releases only that pod's claims and reservation and the pod is retried on the next change; a
claim deleted while its pod's writes are in flight leaves nothing behind; leadership lost while a
batch is in flight stops the writes and the pods are decided again by the next leader; a pod
sharing a claim with a write in flight is decided over the written claim, as serially.
(test_reconciler.py runs all of its cases with both concurrencies too.)
"""

from __future__ import annotations

import threading
from typing import Any

from controller.confirmer import CONFIRMED, OVERBOOKED
from controller.reconciler import GATE, Defaults, Reconciler
from controller.worker import Worker
from dra_driver import kube
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, node_events
from tests.unit.controller.fakes import (
    NS,
    FakeApi,
    claim_path,
    feed,
    make_claim,
    make_pod,
    node_of,
    pod_path,
)

JSON = dict[str, Any]
PODS = 8


class HeldApi(FakeApi):
    """Claim writes wait until `release` is set (or 5 s pass), so that decisions can be made
    while earlier pods' writes are still in flight; records how many decisions were made when
    the first claim write went through (serially: one, after the 5 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.decided_before_first_write: int | None = None
        self.decisions = 0
        self._lock = threading.Lock()

    def replace(self, path: str, obj: Any) -> JSON:
        if "/resourceclaims/" in path:
            self.release.wait(5)
            with self._lock:
                if self.decided_before_first_write is None:
                    self.decided_before_first_write = self.decisions
        with self._lock:
            return super().replace(path, obj)

    def merge_patch(self, path: str, patch: Any) -> JSON:
        with self._lock:
            return super().merge_patch(path, patch)

    def strategic_patch(self, path: str, patch: Any) -> JSON:
        with self._lock:
            return super().strategic_patch(path, patch)


def build(api: FakeApi, concurrency: int, nodes: int = 1) -> Reconciler:
    r = Reconciler(api, Defaults({}), write_concurrency=concurrency)  # type: ignore[arg-type]
    r.on_event("DeviceClass", "apply", {**DEVICE_CLASS, "metadata": {"name": DRIVER}})
    for n in range(nodes):
        for kind, obj in node_events(n, gpus=2, shape="none"):
            r.on_event(kind, "apply", obj)
    return r


def hold_writes_until_all_decided(api: HeldApi, r: Reconciler, decisions: int) -> None:
    place = r.allocator.place

    def counting(*args: Any, **kwargs: Any) -> Any:
        try:
            return place(*args, **kwargs)
        finally:
            api.decisions += 1
            if api.decisions == decisions:
                api.release.set()

    r.allocator.place = counting  # type: ignore[method-assign]


def fill(api: FakeApi, pods: int = PODS, memory: str = "30Gi") -> None:
    # One node of two 80 GiB GPUs holds four 30 GiB claims: the other pods must be refused.
    for i in range(pods):
        make_claim(api, f"c{i}", memory=memory)
        make_pod(api, f"p{i}", [f"c{i}"])


def placements(api: FakeApi) -> dict[str, tuple[str, str] | None]:
    out: dict[str, tuple[str, str] | None] = {}
    for i in range(PODS):
        alloc = (api.get(claim_path(f"c{i}")).get("status") or {}).get("allocation")
        claim = api.get(claim_path(f"c{i}"))
        out[f"c{i}"] = (
            None if not alloc else (node_of(claim), alloc["devices"]["results"][0]["device"])
        )
    return out


def counted(r: Reconciler) -> set[str]:
    """The claims whose consumption the model counts."""
    return {uid for uid, consumption in r.model._claims.items() if consumption}


def gated(api: FakeApi, pod: str) -> bool:
    return GATE in [g["name"] for g in api.get(pod_path(pod))["spec"]["schedulingGates"]]


def test_concurrent_writes_give_the_serial_placements_and_overlap() -> None:
    serial_api = FakeApi()
    fill(serial_api)
    serial = build(serial_api, 1)
    feed(serial, serial_api)
    serial.reconcile()

    api = HeldApi()
    fill(api)
    r = build(api, PODS)
    hold_writes_until_all_decided(api, r, PODS)
    feed(r, api)
    r.reconcile()

    assert api.decided_before_first_write == PODS  # every decision made while writes waited
    assert placements(api) == placements(serial_api)
    assert sum(1 for p in placements(api).values() if p) == 4
    assert [gated(api, f"p{i}") for i in range(PODS)] == [
        gated(serial_api, f"p{i}") for i in range(PODS)
    ]
    assert r.waiting == serial.waiting and len(r.waiting) == PODS - 4
    # Every placed claim counted once in the model, nothing reserved left over.
    used = sum(sum(u.values()) for u in r.model.used.values())
    assert used == sum(sum(u.values()) for u in serial.model.used.values()) > 0


def test_a_write_failure_releases_only_that_pod_and_it_is_retried() -> None:
    api = HeldApi()
    fill(api, memory="10Gi")
    r = build(api, 4)
    hold_writes_until_all_decided(api, r, 4)  # the first four in flight together
    feed(r, api)
    api.fail[claim_path("c3") + "/status"] = [kube.Conflict(409, "Conflict", "x")] * 5
    r.reconcile()
    assert not (api.get(claim_path("c3")).get("status") or {}).get("allocation")
    assert gated(api, "p3") and (NS, "p3") in r.waiting
    others = [i for i in range(PODS) if i != 3]
    assert all(not gated(api, f"p{i}") for i in others)
    assert all(api.get(claim_path(f"c{i}"))["status"]["allocation"] for i in others)
    # Its reservation is gone: the model counts exactly the seven claims written.
    consumers = counted(r)
    assert consumers == {f"uid-c{i}" for i in others}
    # Retried on the next change, and placed.
    r.on_event("ResourceClaim", "apply", api.get(claim_path("c3")))
    r.reconcile()
    assert api.get(claim_path("c3"))["status"]["allocation"] and not gated(api, "p3")


def test_a_claim_deleted_mid_write_leaves_nothing_behind() -> None:
    api = HeldApi()
    make_claim(api, "a")
    make_claim(api, "b")
    make_pod(api, "p", ["a", "b"])
    make_claim(api, "c")
    make_pod(api, "q", ["c"])
    r = build(api, 4)
    hold_writes_until_all_decided(api, r, 2)
    feed(r, api)
    del api.objects[claim_path("b")]  # gone after the informer delivered it
    r.reconcile()
    assert "allocation" not in (api.get(claim_path("a")).get("status") or {})
    assert gated(api, "p") and (NS, "p") in r.waiting
    assert api.get(claim_path("c"))["status"]["allocation"] and not gated(api, "q")
    consumers = counted(r)
    assert consumers == {"uid-c"}


def test_leadership_lost_mid_batch_stops_the_writes_and_the_next_leader_decides() -> None:
    api = HeldApi()
    fill(api, memory="10Gi")
    leading = [True]
    r = build(api, 4)
    r.may_write = lambda: leading[0]
    place = r.allocator.place
    decisions = [0]

    def losing(*args: Any, **kwargs: Any) -> Any:
        decisions[0] += 1
        if decisions[0] == 3:
            leading[0] = False  # the lease ran out while two pods' writes were in flight
            api.release.set()
        return place(*args, **kwargs)

    r.allocator.place = losing  # type: ignore[method-assign]
    feed(r, api)
    r.reconcile()
    # A pod whose writes had passed the leadership check before the loss is placed whole (as
    # serially); any other is untouched and decided again; nobody decides after the third.
    allocated = set()
    for i in range(PODS):
        claim = api.get(claim_path(f"c{i}"))
        if (claim.get("status") or {}).get("allocation"):
            assert i < 2 and not gated(api, f"p{i}")
            allocated.add(f"uid-c{i}")
        else:
            assert gated(api, f"p{i}")
            assert (NS, f"p{i}") in (r.waiting if i < 3 else r.dirty)
    assert decisions[0] == 3
    consumers = counted(r)
    assert consumers == allocated
    nxt = build(api, 4)
    feed(nxt, api)
    nxt.reconcile()
    assert not any(gated(api, f"p{i}") for i in range(PODS))


def test_a_pod_sharing_a_claim_in_flight_is_decided_over_the_written_claim() -> None:
    api = HeldApi()
    make_claim(api, "shared")
    make_pod(api, "p", ["shared"])
    make_pod(api, "q", ["shared"])
    r = build(api, 4)
    hold_writes_until_all_decided(api, r, 1)
    feed(r, api)
    r.reconcile()
    assert not gated(api, "p")
    assert gated(api, "q") and [e["reason"] for e in api.events] == ["ClaimAllocatedElsewhere"]


def test_placements_count_for_the_confirmer_before_the_informer_delivers_them() -> None:
    """The confirmer runs after a batch of overlapped writes, before any of them comes back
    through the watch: kube-scheduler's allocation on the GPU the batch just filled is failed as
    overbooked, not confirmed (every placement the controller decided is committed from its
    write on)."""
    api = FakeApi()
    fill(api, pods=4)  # 4 x 30Gi: two per 80 GiB GPU (spread)
    r = build(api, PODS)
    worker = Worker(api, r)  # type: ignore[arg-type]
    feed(r, api)
    r.reconcile()
    taken = [api.get(claim_path(f"c{i}"))["status"]["allocation"] for i in range(4)]
    devices = [a["devices"]["results"][0]["device"] for a in taken]
    assert sorted(devices) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    node = node_of(api.get(claim_path("c0")))
    theirs = make_claim(api, "k", memory="30Gi")
    theirs["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": node,
                        "device": "gpu-0",
                        "shareID": "share-k",
                        "consumedCapacity": {"memory": "30Gi"},
                        "bindingConditions": [CONFIRMED],
                        "bindingFailureConditions": [OVERBOOKED],
                    }
                ]
            },
            "allocationTimestamp": "2026-01-01T00:00:00Z",
        }
    }
    worker._apply("ResourceClaim", "apply", api.put(claim_path("k"), theirs))
    assert worker.confirmer.run() == {"confirmed": 0, "overbooked": 1}
    (entry,) = api.get(claim_path("k"))["status"]["devices"]
    assert [c["type"] for c in entry["conditions"] if c["status"] == "True"] == [OVERBOOKED]
