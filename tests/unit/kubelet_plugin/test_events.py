"""Prepare-failure Events: what is written, on which objects, and how repeats are folded.

The API server's side (the node may create and patch Events, the objects are right) is proven
on the test bed by tests/e2e/kubelet_plugin/test_observability.py; here a recording client shows the
writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.events import PodRef, PrepareEvents

REF = ClaimRef("tenant-a", "train", "9a0e0b7c-0000-4000-8000-000000000001")


class Recorder:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.created.append((path, obj))
        return obj

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patched.append((path, patch))
        return patch


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup() -> Iterator[tuple[PrepareEvents, Recorder, Clock]]:
    recorder, clock = Recorder(), Clock()
    events = PrepareEvents(recorder, node="node-1", clock=clock)  # type: ignore[arg-type]
    try:
        yield events, recorder, clock
    finally:
        events.close()


def test_claim_and_its_pods_get_a_readable_warning(
    setup: tuple[PrepareEvents, Recorder, Clock],
) -> None:
    events, recorder, _ = setup
    error = "would overbook device gpu-0: memory 90 bytes requested in total > capacity 80 bytes"
    events.prepare_failed(REF, "overbooked", error, [PodRef("train-0", "p-uid")])
    events.flush()
    assert [path for path, _ in recorder.created] == [
        kube.path("v1", "events", namespace="tenant-a")
    ] * 2
    claim_event, pod_event = (obj for _, obj in recorder.created)
    assert claim_event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "namespace": "tenant-a",
        "name": "train",
        "uid": REF.uid,
    }
    assert claim_event["type"] == "Warning"
    assert claim_event["reason"] == "PrepareOverbooked"
    assert claim_event["message"].startswith("cannot prepare this claim on node node-1: would")
    assert "already given to other claims" in claim_event["message"]  # what it means
    assert pod_event["involvedObject"]["kind"] == "Pod"
    assert pod_event["involvedObject"]["name"] == "train-0"
    assert pod_event["message"].startswith("cannot prepare ResourceClaim train on node node-1")
    assert claim_event["source"] == {"component": "vgpu-dra-kubelet-plugin", "host": "node-1"}


def test_repeats_fold_into_one_event_with_a_count(
    setup: tuple[PrepareEvents, Recorder, Clock],
) -> None:
    events, recorder, clock = setup
    for _ in range(5):  # the kubelet retries every few seconds
        events.prepare_failed(REF, "invalid_claim", "bad config")
    events.flush()
    assert len(recorder.created) == 1 and not recorder.patched
    clock.now += 61
    events.prepare_failed(REF, "invalid_claim", "bad config")
    events.flush()
    assert len(recorder.created) == 1
    [(path, patch)] = recorder.patched
    assert path.endswith("/events/" + recorder.created[0][1]["metadata"]["name"])
    assert patch["count"] == 6
    events.prepare_failed(REF, "invalid_claim", "another problem")  # new message: new event
    events.flush()
    assert len(recorder.created) == 2


def test_messages_are_bounded(setup: tuple[PrepareEvents, Recorder, Clock]) -> None:
    events, recorder, _ = setup
    events.prepare_failed(REF, "internal", "x" * 5000)
    events.flush()
    assert len(recorder.created[0][1]["message"]) == 1024
