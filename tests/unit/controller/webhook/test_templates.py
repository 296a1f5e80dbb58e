"""The pure half of the template collector and the ensurer's time budget
(controller.webhook.templates); the API-server half is in tests/e2e/controller/test_webhook.py.

Proves: a template is referenced per (namespace, name) from pods' resourceClaims; one is unused
only when no pod references it and neither its creation nor its last use is within the grace
(an unreadable mark counts as just used); an ensure against an API server that never answers
fails within its budget with a message naming the template, instead of outliving the API
server's deadline for the admission.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.webhook.templates import (
    LAST_USED,
    TemplateEnsurer,
    TemplateError,
    referenced_templates,
    unused,
)
from controller.webhook.translate import ClaimTemplate
from dra_driver import kube

JSON = dict[str, Any]
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def template(namespace: str, name: str, created: str, last_used: str | None = None) -> JSON:
    metadata: JSON = {"namespace": namespace, "name": name, "creationTimestamp": created}
    if last_used is not None:
        metadata["annotations"] = {LAST_USED: last_used}
    return {"metadata": metadata}


def test_references_and_unused() -> None:
    pods = [
        {"metadata": {"namespace": "a"}, "spec": {"resourceClaims": [
            {"name": "x", "resourceClaimTemplateName": "t1"},
            {"name": "y", "resourceClaimName": "c"}]}},
        {"metadata": {"namespace": "b"}, "spec": {}},
    ]  # fmt: skip
    used = referenced_templates(pods)
    assert used == {("a", "t1")}
    old, recent = "2026-11-23T11:00:00Z", "2026-11-23T11:58:00Z"
    templates = [
        template("a", "t1", old),  # used by a pod
        template("b", "t1", old),  # same name, other namespace: unused
        template("a", "t2", recent),  # created within the grace
        template("a", "t3", old, last_used="2026-11-23T11:59:30.123456+00:00"),  # touched
        template("a", "t4", old, last_used="2026-11-23T10:00:00.000001+00:00"),
        template("a", "t5", old, last_used="garbled"),  # unreadable: keep
    ]
    names = [
        (t["metadata"]["namespace"], t["metadata"]["name"])
        for t in unused(templates, used, NOW, 600)
    ]
    assert names == [("b", "t1"), ("a", "t4")]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_an_ensure_fails_within_its_budget(silent_server: int) -> None:
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{silent_server}"
    client = kube.KubeClient(k8s.ApiClient(configuration))
    try:
        ensurer = TemplateEnsurer(client, timeout_s=0.5)
        spec = {"spec": {"devices": {"requests": []}}}
        started = time.monotonic()
        with pytest.raises(TemplateError, match="cannot create ResourceClaimTemplate ns/vgpu-x"):
            ensurer.ensure(
                "ns", [ClaimTemplate("vgpu-x", spec, {}), ClaimTemplate("vgpu-y", spec, {})]
            )
        assert time.monotonic() - started < 2.0
    finally:
        client.close()


class CountingClient:
    """Stands in for the API client's `request` (the unit under test is the ensurer's
    concurrency, not HTTP): each POST takes `delay_s`, then succeeds or raises `error`."""

    def __init__(self, delay_s: float, error: kube.KubeError | None = None) -> None:
        self.delay_s = delay_s
        self.error = error
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, **_: Any) -> JSON:
        with self._lock:
            self.calls.append((method, path))
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return {}


def _burst(ensurer: TemplateEnsurer, count: int) -> list[BaseException | None]:
    spec = {"spec": {"devices": {"requests": []}}}
    barrier = threading.Barrier(count)
    outcomes: list[BaseException | None] = [None] * count

    def one(n: int) -> None:
        barrier.wait()
        try:
            ensurer.ensure("ns", [ClaimTemplate("vgpu-same", spec, {})])
        except BaseException as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def test_a_burst_of_one_new_shape_makes_one_create_that_all_share() -> None:
    """200 admissions of one new shape at once: one create; the others wait for it."""
    client = CountingClient(delay_s=0.2)
    ensurer = TemplateEnsurer(client, timeout_s=5)  # type: ignore[arg-type]
    assert _burst(ensurer, 200) == [None] * 200
    assert client.calls == [
        ("POST", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates")
    ]


def test_when_the_shared_create_fails_every_waiter_is_refused_with_its_reason() -> None:
    client = CountingClient(delay_s=0.2, error=kube.KubeError(403, "Forbidden", "no RBAC"))
    ensurer = TemplateEnsurer(client, timeout_s=5)  # type: ignore[arg-type]
    outcomes = _burst(ensurer, 20)
    assert len(client.calls) == 1
    assert {str(o) for o in outcomes} == {
        "cannot create ResourceClaimTemplate ns/vgpu-same for the translated pod: no RBAC"
    }
    # Nothing is remembered from a failure: the next admission tries again.
    assert len(_burst(ensurer, 1)) == 1 and len(client.calls) == 2
