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
