"""The `container` label of a claim's metrics: which containers of its pod use the claim
(`kubelet_plugin.telemetry.containers_using`, `ClaimPods` with a pod reader).

Proves: named claims and claims made from a template (through `status.resourceClaimStatuses`)
are matched, init containers included, containers using other claims are not; the pod is read
off the prepare path and only for a claim reserved for exactly one pod; a pod that cannot be
read, or a pod of the same name with another UID, leaves the label empty; a claim forgotten
before its lookup finishes does not come back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from kubelet_plugin.telemetry import ClaimPods, containers_using

JSON = dict[str, Any]


def pod(uid: str = "p-uid") -> JSON:
    return {
        "metadata": {"name": "web", "namespace": "t", "uid": uid},
        "spec": {
            "initContainers": [{"name": "warmup", "resources": {"claims": [{"name": "gpu"}]}}],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpu"}, {"name": "nic"}]}},
                {"name": "side", "resources": {"claims": [{"name": "nic"}]}},
                {"name": "plain"},
            ],
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "gpu-template"},
                {"name": "nic", "resourceClaimName": "shared-nic"},
            ],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "web-gpu-x1"}]},
    }


def claim(name: str, *pods: tuple[str, str]) -> JSON:
    reserved = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
    return {"metadata": {"name": name, "namespace": "t"}, "status": {"reservedFor": reserved}}


def test_containers_using_a_claim() -> None:
    assert containers_using(pod(), "web-gpu-x1") == ["warmup", "main"]  # from the template
    assert containers_using(pod(), "shared-nic") == ["main", "side"]
    assert containers_using(pod(), "someone-elses") == []
    unresolved = pod()
    del unresolved["status"]  # the template's claim not recorded yet: unknown, not guessed
    assert containers_using(unresolved, "web-gpu-x1") == []


class Reader:
    """Pods by (namespace, name); counts reads; can hold a read until released."""

    def __init__(self, pods: dict[tuple[str, str], JSON]) -> None:
        self.pods = pods
        self.reads = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, namespace: str, name: str) -> JSON:
        self.reads += 1
        self.gate.wait(10)
        if (namespace, name) not in self.pods:
            raise kube.KubeError(403, "Forbidden", "pods is forbidden")
        return self.pods[(namespace, name)]


@pytest.fixture
def reader() -> Reader:
    return Reader({("t", "web"): pod()})


@pytest.fixture
def pods(reader: Reader) -> Iterator[ClaimPods]:
    claim_pods = ClaimPods(reader)
    yield claim_pods
    reader.gate.set()
    claim_pods.close()


def test_the_label_names_the_containers_of_the_one_pod(pods: ClaimPods, reader: Reader) -> None:
    pods.remember("u1", claim("web-gpu-x1", ("web", "p-uid")))
    assert pods.container_label("u1") in ("", "warmup,main")  # never blocks prepare
    pods.flush()
    assert pods.container_label("u1") == "warmup,main"
    pods.remember("u1", claim("web-gpu-x1", ("web", "p-uid")))  # prepared again
    pods.flush()
    assert reader.reads == 1  # known: not read again


def test_unknown_when_the_pod_cannot_be_read_or_is_another(pods: ClaimPods, reader: Reader) -> None:
    pods.remember("u1", claim("c", ("hidden", "h-uid")))  # 403
    pods.remember("u2", claim("web-gpu-x1", ("web", "other-uid")))  # recreated pod
    pods.remember("u3", claim("shared-nic", ("web", "p-uid"), ("db", "d-uid")))  # two pods
    pods.flush()
    assert [pods.container_label(u) for u in ("u1", "u2", "u3")] == ["", "", ""]
    assert reader.reads == 2  # a claim of several pods is not looked up at all


def test_a_claim_forgotten_during_its_lookup_stays_forgotten(
    pods: ClaimPods, reader: Reader
) -> None:
    reader.gate.clear()
    pods.remember("u1", claim("web-gpu-x1", ("web", "p-uid")))
    pods.forget("u1")  # unprepared while the pod is being read
    reader.gate.set()
    pods.flush()
    assert pods.container_label("u1") == ""


def test_without_a_reader_there_is_no_thread_and_no_label() -> None:
    before = threading.active_count()
    plain = ClaimPods()
    plain.remember("u1", claim("c", ("web", "p-uid")))
    assert plain.container_label("u1") == "" and threading.active_count() == before
    plain.close()
