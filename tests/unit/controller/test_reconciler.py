"""The policy-path reconciler's decisions and writes, against an in-memory API with real
optimistic concurrency (resourceVersion checked on every write; 409 on a stale one).

Proves: a gated pod is placed and its claims written (allocation on the chosen node, reservedFor
the pod) and only our gate is removed; a pod whose claim is not there yet waits; a 409 on a claim
is retried after a fresh read; a claim deleted mid-placement leaves the claims already written
released and the model without their consumption; a crash between two claim writes (one claim
allocated for the pod, one not) converges to both on one node; a refused pod gets one Event and
one condition, is not retried without a change, and is retried when a node or slice arrives; an
API failure is retried after a doubling backoff even when no event follows; claims carry
kube-scheduler's finalizer; a node kube-scheduler refuses (signalled by its deallocation of a
claim) is replaced by the next best, both claims together, a second refusal excludes both nodes,
no other node hands the pod to kube-scheduler, a restarted controller re-places a refused pod,
kube-scheduler's own allocation ends the following, and a refusal seen before the ungated pod
event is acted on. Every case built with `reconciler()` runs twice: serial writes and writes of
different pods overlapping on a pool (`write_concurrency`), with the same results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controller.reconciler import CONDITION, FINALIZER, GATE, Defaults, Reconciler
from dra_driver import kube
from dra_driver.allocator.quantity import parse_quantity
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
HOLD = {"apiGroup": "vgpu.dra.dev", "resource": "placements", "name": "p", "uid": "uid-p-placement"}
POD_P = {"resource": "pods", "name": "p", "uid": "uid-p"}


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


WRITE_CONCURRENCY = {"value": 1}


@pytest.fixture(autouse=True, params=[1, 8], ids=["serial", "concurrent"])
def write_concurrency(request: pytest.FixtureRequest) -> Iterator[None]:
    WRITE_CONCURRENCY["value"] = request.param
    yield
    WRITE_CONCURRENCY["value"] = 1


def reconciler(
    api: FakeApi, nodes: int = 2, clock: Callable[[], float] = time.monotonic
) -> Reconciler:
    r = Reconciler(
        api,  # type: ignore[arg-type]
        Defaults({}),
        clock=clock,
        write_concurrency=WRITE_CONCURRENCY["value"],
    )
    r.on_event("DeviceClass", "apply", {**DEVICE_CLASS, "metadata": {"name": DRIVER}})
    for n in range(nodes):
        for kind, obj in node_events(n, gpus=2, shape="none"):
            r.on_event(kind, "apply", obj)
    return r


def test_places_writes_claims_and_removes_only_its_gate(api: FakeApi) -> None:
    r = reconciler(api)
    make_claim(api, "a")
    make_claim(api, "b")
    make_pod(api, "p", ["a", "b"])
    feed(r, api)
    r.reconcile()
    claims = [api.get(claim_path(n)) for n in ("a", "b")]
    assert {node_of(c) for c in claims} == {"node-00000"}
    for claim in claims:
        # The pod, and our hold until kube-scheduler binds it.
        assert claim["status"]["reservedFor"] == [POD_P, HOLD]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == DRIVER and result["request"] == "gpu"
        assert parse_quantity(result["consumedCapacity"]["memory"]) == 10 << 30
        assert result["shareID"]
    pod = api.get(pod_path("p"))
    assert pod["spec"]["schedulingGates"] == [{"name": "other/gate"}]
    # A success writes no condition (one write less per pod): the claims' hold marks it ours.
    assert "status" not in pod


def drain_rule(name: str, pool: str, device: str | None) -> JSON:
    selector = {"driver": DRIVER, "pool": pool, **({"device": device} if device else {})}
    taint = {"key": f"{DRIVER}/drain", "effect": "NoExecute"}
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector, "taint": taint}}


def test_drained_gpus_are_avoided_and_an_undrain_retries_the_waiting_pod(api: FakeApi) -> None:
    """DeviceTaintRule events (the informer's) reach the model: a drained GPU gets no claim, a
    pod with nowhere else to go is refused, and deleting the rule places it."""
    r = reconciler(api, nodes=1)
    r.on_event("DeviceTaintRule", "apply", drain_rule("d0", "node-00000", "gpu-0"))
    make_claim(api, "a", memory="80Gi")
    make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    (result,) = api.get(claim_path("a"))["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-1"
    r.on_event("DeviceTaintRule", "apply", drain_rule("pool", "node-00000", None))
    make_claim(api, "b", memory="80Gi")
    make_pod(api, "q", ["b"])
    feed(r, api)
    r.reconcile()
    assert "allocation" not in (api.get(claim_path("b")).get("status") or {})
    assert [e["reason"] for e in api.events] == ["Unschedulable"]
    r.on_event("DeviceTaintRule", "delete", {"metadata": {"name": "pool"}})
    assert (NS, "q") in r.dirty
    r.reconcile()  # gpu-0 is still drained by the first rule, gpu-1 is full
    assert "allocation" not in (api.get(claim_path("b")).get("status") or {})
    r.on_event("DeviceTaintRule", "delete", {"metadata": {"name": "d0"}})
    r.reconcile()
    (result,) = api.get(claim_path("b"))["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0" and "tolerations" not in result


def test_a_pod_whose_claim_is_missing_waits(api: FakeApi) -> None:
    r = reconciler(api)
    make_pod(api, "p", ["later"])
    feed(r, api)
    r.reconcile()
    assert GATE in [g["name"] for g in api.get(pod_path("p"))["spec"]["schedulingGates"]]
    assert api.events == []
    r.on_event("ResourceClaim", "apply", make_claim(api, "later"))
    r.reconcile()
    assert api.get(claim_path("later"))["status"]["allocation"]


def test_a_conflict_is_retried_after_a_fresh_read(api: FakeApi) -> None:
    r = reconciler(api)
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    feed(r, api)
    # Someone (e.g. a label change) updates the claim after the informer delivered it.
    stale = api.get(claim_path("a"))
    api.put(claim_path("a"), {**stale, "metadata": {**stale["metadata"], "labels": {"x": "y"}}})
    r.reconcile()
    claim = api.get(claim_path("a"))
    assert claim["status"]["allocation"] and claim["metadata"]["labels"] == {"x": "y"}


def test_a_claim_deleted_mid_placement_leaves_nothing_behind(api: FakeApi) -> None:
    r = reconciler(api, nodes=1)
    make_claim(api, "a")
    make_claim(api, "b")
    make_pod(api, "p", ["a", "b"])
    feed(r, api)
    # "b" is deleted after the informer delivered it, before the controller writes it.
    del api.objects[claim_path("b")]
    r.reconcile()
    assert "allocation" not in (api.get(claim_path("a")).get("status") or {})
    assert "reservedFor" not in (api.get(claim_path("a")).get("status") or {})
    assert GATE in [g["name"] for g in api.get(pod_path("p"))["spec"]["schedulingGates"]]
    assert all(not any(use.values()) for use in r.model.used.values())
    r.on_event("ResourceClaim", "delete", {"metadata": {"name": "b", "namespace": NS,
                                                        "uid": "uid-b"}})  # fmt: skip
    r.reconcile()  # still waiting for "b": nothing written
    assert "allocation" not in (api.get(claim_path("a")).get("status") or {})


def test_a_crash_between_claim_writes_converges(api: FakeApi) -> None:
    """The first claim was written for the pod on node-00001 by a controller that died before
    writing the second; the restarted controller places both together."""
    make_claim(api, "a", memory="30Gi")
    make_claim(api, "b", memory="30Gi")
    make_pod(api, "p", ["a", "b"])
    r1 = reconciler(api)
    feed(r1, api)
    r1.reconcile()
    first = api.get(claim_path("a"))
    api.put(claim_path("b"), {**api.get(claim_path("b")), "status": {}})  # "b" never written
    assert first["status"]["allocation"]
    pod = api.get(pod_path("p"))
    pod["spec"]["schedulingGates"] = [{"name": GATE}]  # the gate was never lifted
    api.put(pod_path("p"), pod)
    r2 = reconciler(api)
    feed(r2, api)
    r2.reconcile()
    a, b = api.get(claim_path("a")), api.get(claim_path("b"))
    assert a["status"]["allocation"] and b["status"]["allocation"]
    assert node_of(a) == node_of(b)
    assert api.get(pod_path("p"))["spec"]["schedulingGates"] == []


def test_a_refused_pod_is_reported_once_and_retried_on_change(api: FakeApi) -> None:
    r = reconciler(api, nodes=0)
    make_claim(api, "a")
    make_pod(api, "p", ["a"], topology="link-strict")
    feed(r, api)
    r.reconcile()
    assert [e["reason"] for e in api.events] == ["Unschedulable"]
    cond = api.get(pod_path("p"))["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION, "False", "Unschedulable")
    assert cond["message"] == api.events[0]["message"]
    assert not r.dirty  # no busy loop: nothing to do until something changes
    r.reconcile()
    assert len(api.events) == 1
    for kind, obj in node_events(7, gpus=2, shape="none"):
        r.on_event(kind, "apply", obj)
    assert ("tenant", "p") in r.dirty
    r.reconcile()
    # link-strict: these GPUs have no NVLink, so still refused, with a new reason reported once.
    assert len(api.events) == 2 and "NVLink" in api.events[1]["message"]


def test_a_refusal_is_replaced_by_the_placement_that_follows_it(api: FakeApi) -> None:
    """Only a success after a refusal writes the condition: the refusal must not outlive it."""
    r = reconciler(api, nodes=0)
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    assert api.get(pod_path("p"))["status"]["conditions"][0]["status"] == "False"
    for kind, obj in node_events(3):
        r.on_event(kind, "apply", obj)
    r.reconcile()  # the cached pod is still the one without the condition: no matter
    cond = api.get(pod_path("p"))["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION, "True", "Placed")
    assert cond["message"].endswith("node-00003")


def test_a_refusal_by_a_previous_controller_is_replaced_too(api: FakeApi) -> None:
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    first = reconciler(api, nodes=0)
    feed(first, api)
    first.reconcile()
    second = reconciler(api, nodes=1)
    feed(second, api)  # the pod as listed carries the refusal
    second.reconcile()
    cond = api.get(pod_path("p"))["status"]["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("True", "Placed")


def test_an_invalid_policy_annotation_fails_that_pod_only(api: FakeApi) -> None:
    r = reconciler(api)
    make_claim(api, "a")
    make_claim(api, "b")
    make_pod(api, "bad", ["a"], topology="sideways")
    make_pod(api, "good", ["b"])
    feed(r, api)
    r.reconcile()
    assert api.events[0]["reason"] == "InvalidRequest" and "sideways" in api.events[0]["message"]
    assert api.get(claim_path("b"))["status"]["allocation"]


def test_a_pod_asking_for_1e30_cpu_is_refused_and_the_next_pod_is_placed(api: FakeApi) -> None:
    """A container request beyond the model's bound (cpu "1e30", memory "1e19": API-valid)
    refuses that pod with an Event; before, it ended the worker and placement for everyone."""
    r = reconciler(api)
    make_claim(api, "a")
    make_claim(api, "b")
    hostile = make_pod(api, "huge", ["a"])
    hostile["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1e30", "memory": "1e19"}}
    api.put(pod_path("huge"), hostile)
    make_pod(api, "next", ["b"])
    feed(r, api)
    r.reconcile()
    (event,) = api.events
    assert event["reason"] == "InvalidRequest" and "1e30" in event["message"]
    assert "allocation" not in (api.get(claim_path("a")).get("status") or {})
    assert api.get(claim_path("b"))["status"]["allocation"]


def test_a_decision_that_raises_fails_that_pod_only(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What nothing foresaw (here: the allocator raising for one pod) is an InternalError Event
    on that pod, which waits for its next change; the next pod is placed."""
    r = reconciler(api)
    make_claim(api, "a")
    make_claim(api, "b")
    make_pod(api, "cursed", ["a"])
    make_pod(api, "next", ["b"])
    feed(r, api)
    place = r.allocator.place

    def flaky(pod: JSON, *args: Any, **kwargs: Any) -> Any:
        if pod["metadata"]["name"] == "cursed":
            raise OverflowError("int too big to convert")
        return place(pod, *args, **kwargs)

    monkeypatch.setattr(r.allocator, "place", flaky)
    r.reconcile()
    (event,) = api.events
    assert event["reason"] == "InternalError"
    assert "OverflowError: int too big to convert" in event["message"]
    assert api.get(claim_path("b"))["status"]["allocation"]
    assert (NS, "cursed") in r.waiting and not r.dirty


def test_an_api_failure_is_retried_after_a_backoff_without_any_event(api: FakeApi) -> None:
    now = [0.0]
    r = reconciler(api, nodes=1, clock=lambda: now[0])
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    feed(r, api)
    api.fail[claim_path("a") + "/status"] = [kube.Unreachable(0, "Unreachable", "down")] * 2
    r.reconcile()  # fails: retry due in 1s
    assert "allocation" not in (api.get(claim_path("a")).get("status") or {})
    now[0] = 0.5
    r.reconcile()
    assert len(api.fail[claim_path("a") + "/status"]) == 1  # not tried again before it is due
    now[0] = 1.0
    r.reconcile()  # fails again: next in 2s
    now[0] = 2.9
    r.reconcile()
    assert "allocation" not in (api.get(claim_path("a")).get("status") or {})
    now[0] = 3.0
    r.reconcile()
    assert api.get(claim_path("a"))["status"]["allocation"]


def test_a_stale_gated_pod_after_its_placement_causes_no_more_writes(api: FakeApi) -> None:
    r = reconciler(api)
    make_claim(api, "a")
    gated_pod = make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    assert api.get(pod_path("p"))["spec"]["schedulingGates"] == [{"name": "other/gate"}]
    writes = len(api.history)
    # The written claim arrives while the cache still holds the pod with our gate.
    r.on_event("Pod", "apply", gated_pod)
    r.on_event("ResourceClaim", "apply", api.get(claim_path("a")))
    r.reconcile()
    assert len(api.history) == writes


def test_a_gated_pod_without_claims_is_released_to_the_scheduler(api: FakeApi) -> None:
    r = reconciler(api, nodes=0)
    make_pod(api, "plain", [])
    feed(r, api)
    r.reconcile()
    assert api.get(pod_path("plain"))["spec"]["schedulingGates"] == [{"name": "other/gate"}]
    assert "status" not in api.get(pod_path("plain"))  # nothing to say: no condition
    assert api.events == []


def test_claims_carry_the_schedulers_finalizer_so_they_are_deallocated_after_their_pod(
    api: FakeApi,
) -> None:
    """Without the finalizer the resourceclaim controller never clears the allocation of a named
    claim once its pod is gone, and a claim in use could be deleted."""
    r = reconciler(api)
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    claim = api.get(claim_path("a"))
    assert claim["metadata"]["finalizers"] == [FINALIZER]
    assert claim["status"]["allocation"]


def refuse(api: FakeApi, r: Reconciler, pod: str, *, at: str, deallocate: str | None) -> JSON:
    """What kube-scheduler does with a pod whose claims pin it to a node it refuses: it marks the
    pod PodScheduled=False/Unschedulable and, when the pod is a claim's only consumer (no hold),
    its DRA PostFilter deallocates that claim first. Returns the pod as refused."""
    if deallocate is not None:
        claim = api.get(claim_path(deallocate))
        claim["status"] = {}
        r.on_event("ResourceClaim", "apply", api.put(claim_path(deallocate), claim))
    obj = api.get(pod_path(pod))
    status = obj.setdefault("status", {})
    status["conditions"] = [
        c for c in status.get("conditions") or [] if c["type"] != "PodScheduled"
    ] + [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 1 node(s) had untolerated taint",
            "lastTransitionTime": at,
        }
    ]
    refused = api.put(pod_path(pod), obj)
    r.on_event("Pod", "apply", refused)
    return refused


def lift_other_gate(api: FakeApi, r: Reconciler, pod: str) -> None:
    obj = api.get(pod_path(pod))
    obj["spec"]["schedulingGates"] = []
    r.on_event("Pod", "apply", api.put(pod_path(pod), obj))


def placed_then_ungated(api: FakeApi, nodes: int) -> Reconciler:
    """A reconciler that placed pod p's claim a, after which the pod's other gate was lifted:
    kube-scheduler now schedules p on the node its claim is allocated on."""
    r = reconciler(api, nodes=nodes)
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    lift_other_gate(api, r, "p")
    return r


def test_a_node_kube_scheduler_refuses_is_replaced_by_the_next_best(api: FakeApi) -> None:
    r = reconciler(api, nodes=3)
    for name in ("a", "b"):
        make_claim(api, name)
    make_pod(api, "p", ["a", "b"])
    feed(r, api)
    r.reconcile()
    assert {node_of(api.get(claim_path(n))) for n in "ab"} == {"node-00000"}
    lift_other_gate(api, r, "p")
    feed(r, api)  # the informers deliver our writes
    # Our hold keeps kube-scheduler from deallocating: the refusal is the pod's condition.
    stale = refuse(api, r, "p", at="2026-01-01T00:00:01Z", deallocate=None)
    r.reconcile()
    a, b = api.get(claim_path("a")), api.get(claim_path("b"))
    assert node_of(a) == node_of(b) == "node-00001"  # binpack's next node, both claims together
    for claim in (a, b):
        assert claim["status"]["reservedFor"] == [POD_P, HOLD]
    cond = {c["type"]: c for c in api.get(pod_path("p"))["status"]["conditions"]}
    assert (cond[CONDITION]["status"], cond[CONDITION]["reason"]) == ("True", "Replaced")
    assert "node-00001" in cond[CONDITION]["message"]
    assert "refused node-00000" in cond[CONDITION]["message"]
    # PodScheduled is reset, so kube-scheduler's next refusal changes the pod again.
    assert cond["PodScheduled"]["reason"] == "VgpuDraReplaced"
    # The model holds the new allocation only: node-00000 is free again.
    assert all(not any(v.values()) for k, v in r.model.used.items() if k[1] == "node-00000")
    # The refusal of node-00000 delivered again (an event older than our reset) is no new one.
    feed(r, api)
    r.on_event("Pod", "apply", stale)
    r.reconcile()
    assert node_of(api.get(claim_path("a"))) == "node-00001"
    # A second refusal excludes both nodes.
    refuse(api, r, "p", at="2026-01-01T00:00:01Z", deallocate=None)
    r.reconcile()
    assert {node_of(api.get(claim_path(n))) for n in "ab"} == {"node-00002"}
    # Bound by kube-scheduler: no longer followed, and the hold is dropped.
    feed(r, api)
    bound = api.get(pod_path("p"))
    bound["spec"]["nodeName"] = "node-00002"
    r.on_event("Pod", "apply", api.put(pod_path("p"), bound))
    assert r.placed == {}
    r.reconcile()
    for n in "ab":
        assert api.get(claim_path(n))["status"]["reservedFor"] == [POD_P]


def test_a_refused_pod_with_no_other_node_is_left_to_kube_scheduler(api: FakeApi) -> None:
    r = placed_then_ungated(api, nodes=1)
    feed(r, api)
    refuse(api, r, "p", at="2026-01-01T00:00:01Z", deallocate=None)
    r.reconcile()
    assert node_of(api.get(claim_path("a"))) == "node-00000"  # untouched
    (event,) = api.events
    assert event["reason"] == "Unschedulable"
    assert "refused node node-00000 and no other node fits" in event["message"]
    assert r.placed == {} and not r.waiting  # not retried: kube-scheduler's from here
    r.reconcile()  # the hold goes, so kube-scheduler's PostFilter may deallocate the claim
    assert api.get(claim_path("a"))["status"]["reservedFor"] == [POD_P]


def test_a_restarted_controller_replaces_a_pod_refused_after_its_placement(api: FakeApi) -> None:
    placed_then_ungated(api, nodes=2)  # the first controller, then gone
    # Not refused: a new controller only follows the pod (and keeps the hold).
    r2 = reconciler(api, nodes=2)
    feed(r2, api)
    r2.reconcile()
    assert node_of(api.get(claim_path("a"))) == "node-00000"
    assert r2.placed["uid-p"].node == "node-00000"
    assert api.get(claim_path("a"))["status"]["reservedFor"] == [POD_P, HOLD]
    # Refused while no controller ran: the new one places the claim again.
    r3 = reconciler(api, nodes=2)
    refuse(api, r3, "p", at="2026-01-01T00:00:01Z", deallocate=None)
    feed(r3, api)
    r3.reconcile()
    assert node_of(api.get(claim_path("a"))) == "node-00001"


def test_a_restarted_controller_follows_its_pods_whichever_informer_lists_first(
    api: FakeApi,
) -> None:
    """A successor knows its predecessor's pods from the hold in their claims (no condition is
    written on success), whether the pod or its claim is delivered first; it keeps the hold."""
    placed_then_ungated(api, nodes=2)
    pods_first = reconciler(api, nodes=2)
    for path, obj in sorted(api.objects.items(), key=lambda item: "/pods/" not in item[0]):
        pods_first.on_event("Pod" if "/pods/" in path else "ResourceClaim", "apply", obj)
    claims_first = reconciler(api, nodes=2)
    feed(claims_first, api)
    for r in (pods_first, claims_first):
        assert r.placed["uid-p"].node == "node-00000" and r.placed["uid-p"].restored
        r.reconcile()
        assert api.get(claim_path("a"))["status"]["reservedFor"] == [POD_P, HOLD]
    # A pod that is not ours (no hold) is not followed.
    plain = api.get(claim_path("a"))
    plain["status"]["reservedFor"] = [POD_P]
    api.put(claim_path("a"), plain)
    stranger = reconciler(api, nodes=2)
    feed(stranger, api)
    assert stranger.placed == {}


def test_a_pod_handed_over_is_not_followed_again_from_its_hold(api: FakeApi) -> None:
    r = placed_then_ungated(api, nodes=1)
    feed(r, api)
    refuse(api, r, "p", at="2026-01-01T00:00:01Z", deallocate=None)
    r.reconcile()  # no other node: handed over to kube-scheduler
    assert r.placed == {}
    # The pod's next event arrives while the claim still carries the hold (dropped only on the
    # next pass): it is not taken for a pod placed before a restart.
    r.on_event("ResourceClaim", "apply", api.get(claim_path("a")))
    r.on_event("Pod", "apply", api.get(pod_path("p")))
    assert r.placed == {}


def test_a_claim_allocated_by_kube_scheduler_itself_ends_the_re_placement(api: FakeApi) -> None:
    r = placed_then_ungated(api, nodes=2)
    feed(r, api)
    # kube-scheduler was faster: it deallocated "a" and allocated it on node-00001 itself.
    theirs = api.get(claim_path("a"))
    refuse(api, r, "p", at="2026-01-01T00:00:01Z", deallocate="a")
    theirs["metadata"] = api.get(claim_path("a"))["metadata"]
    theirs["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"
    ] = ["node-00001"]
    r.on_event("ResourceClaim", "apply", api.put(claim_path("a"), theirs))
    r.reconcile()
    assert api.get(claim_path("a")) == theirs | {"metadata": api.get(claim_path("a"))["metadata"]}
    assert r.placed == {}


def test_a_refusal_seen_before_the_ungated_pod_is_acted_on(api: FakeApi) -> None:
    """Claims and pods come from two informers: kube-scheduler's deallocation can be delivered
    before the pod event that shows the gate lifted (and a stale gated event after it)."""
    r = reconciler(api, nodes=2)
    make_claim(api, "a")
    gated = make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    for path, obj in list(api.objects.items()):
        if "/resourceclaims/" in path:
            r.on_event("ResourceClaim", "apply", obj)
    claim = api.get(claim_path("a"))
    claim["status"] = {}
    r.on_event("ResourceClaim", "apply", api.put(claim_path("a"), claim))
    r.on_event("Pod", "apply", gated)  # stale: from before the gate was lifted
    r.reconcile()
    assert node_of(api.get(claim_path("a"))) == "node-00001"


def test_claim_events_older_than_our_own_writes_are_skipped(api: FakeApi) -> None:
    """A successor finds a claim written (with a hold) by a controller that died before the
    pod's second claim: it drops the hold, releases the claim and places both. The informer then
    delivers those writes in order: the intermediate versions (allocated without the hold, then
    released) must not be taken as kube-scheduler deallocating a placed pod's claim."""
    make_claim(api, "a")
    make_claim(api, "b")
    make_pod(api, "p", ["a", "b"])
    victim = reconciler(api, nodes=2)
    feed(victim, api)
    victim.reconcile()
    b = api.get(claim_path("b"))
    api.put(claim_path("b"), {**b, "status": {}})  # the victim died before writing "b"
    pod = api.get(pod_path("p"))
    pod["spec"]["schedulingGates"] = [{"name": GATE}]  # ... and before lifting the gate
    api.put(pod_path("p"), pod)
    successor = reconciler(api, nodes=2)
    feed(successor, api)
    start = len(api.history)
    successor.reconcile()
    nodes = {node_of(api.get(claim_path(n))) for n in "ab"}
    assert len(nodes) == 1
    for path, version in api.history[start:]:  # the watch delivers every version, in order
        kind = "Pod" if "/pods/" in path else "ResourceClaim"
        successor.on_event(kind, "apply", version)
    assert not successor.refused
    successor.reconcile()
    assert {node_of(api.get(claim_path(n))) for n in "ab"} == nodes


def test_a_leader_stopping_gracefully_drops_every_hold(api: FakeApi) -> None:
    r = reconciler(api)
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    feed(r, api)
    r.reconcile()
    feed(r, api)
    assert api.get(claim_path("a"))["status"]["reservedFor"] == [POD_P, HOLD]
    r.drop_all_holds()  # e.g. an uninstall: no controller may come back to drop it
    assert api.get(claim_path("a"))["status"]["reservedFor"] == [POD_P]
    assert api.get(claim_path("a"))["status"]["allocation"]


def test_each_decision_is_one_span_with_its_outcome(api: FakeApi) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    r = Reconciler(api, Defaults({}), tracer=provider.get_tracer("test"))  # type: ignore[arg-type]
    r.on_event("DeviceClass", "apply", {**DEVICE_CLASS, "metadata": {"name": DRIVER}})
    for kind, obj in node_events(0, gpus=2, shape="none"):
        r.on_event(kind, "apply", obj)
    make_claim(api, "a")
    make_pod(api, "p", ["a"])
    make_claim(api, "huge", memory="1000Gi")
    make_pod(api, "q", ["huge"])
    feed(r, api)
    r.reconcile()
    spans = {span.attributes["k8s.pod.name"]: span for span in exporter.get_finished_spans()}
    assert sorted(spans) == ["p", "q"]
    assert {span.name for span in spans.values()} == {"place pod"}
    assert spans["p"].attributes["vgpu_dra.outcome"] == "placed"
    assert spans["q"].attributes["vgpu_dra.outcome"] == "refused"
    assert spans["p"].attributes["k8s.namespace.name"] == NS


def test_without_a_tracer_provider_no_span_is_made(api: FakeApi) -> None:
    # No provider installed in this process: the reconciler holds no tracer at all.
    assert reconciler(api)._tracer is None
