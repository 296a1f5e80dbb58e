"""The shared Warning Event shape and its recording: fields, message limit, naming, and a failed
write logged rather than raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.events import MAX_MESSAGE, ObjectRef, record_warning, warning_event


class Api:
    """Records creates; refuses them when `refuse` is set, as an unreachable API server would."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.refuse:
            raise kube.Unreachable(0, "Unreachable", "POST events: connection refused")
        self.created.append((path, body))
        return body


def test_an_event_names_its_object_source_and_stamps() -> None:
    ref = ObjectRef.claim("tenant", "shared", "uid-1")
    event = warning_event(ref, "PrepareOverbooked", "x" * 5000, component="plugin", host="node-1")
    assert event["involvedObject"] == {
        "apiVersion": kube.RESOURCE_API,
        "kind": "ResourceClaim",
        "namespace": "tenant",
        "name": "shared",
        "uid": "uid-1",
    }
    assert event["metadata"]["namespace"] == "tenant"
    assert event["metadata"]["name"].startswith("shared.")
    assert len(event["message"]) == MAX_MESSAGE
    assert (event["type"], event["count"], event["reason"]) == ("Warning", 1, "PrepareOverbooked")
    assert event["source"] == {"component": "plugin", "host": "node-1"}
    assert event["reportingInstance"] == "node-1"
    assert event["firstTimestamp"] == event["lastTimestamp"]
    # Two events about one object never share a name.
    assert (
        warning_event(ref, "r", "m", component="c")["metadata"]["name"] != event["metadata"]["name"]
    )


def test_a_cluster_component_has_no_host() -> None:
    event = warning_event(ObjectRef.pod("ns", "p", "u"), "Unschedulable", "m", component="ctl")
    assert event["source"] == {"component": "ctl"} and "reportingInstance" not in event
    assert event["involvedObject"]["kind"] == "Pod"


def test_record_writes_into_the_objects_namespace_and_returns_the_name() -> None:
    api = Api()
    name = record_warning(api, ObjectRef.pod("ns", "p", "u"), "R", "m", component="ctl")  # type: ignore[arg-type]
    [(path, body)] = api.created
    assert path == kube.path("v1", "events", namespace="ns")
    assert name == body["metadata"]["name"]


def test_a_refused_write_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dra_driver.events"):
        name = record_warning(
            Api(refuse=True),  # type: ignore[arg-type]
            ObjectRef.pod("ns", "p", "u"),
            "PrepareFailedNotRescheduled",
            "m",
            component="ctl",
        )
    assert name is None
    assert "cannot record event PrepareFailedNotRescheduled on Pod ns/p" in caplog.text
