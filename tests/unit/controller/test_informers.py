"""An informer's protocol against a scripted server: list, watch from the list's version,
bookmarks advance the version, a dropped connection resumes from the last version seen (no
relist), 410 Gone relists and reports objects that vanished meanwhile as deleted.

An unexpected failure relists after a backoff instead of ending the thread (supervision).

(The real API server's side of it runs in tests/e2e/controller/test_policy_path.py.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller import informers
from controller.informers import PODS, TAINT_RULES, Informer
from dra_driver import kube
from dra_driver.supervision import Supervisor
from tests.unit.controller.fakes import Script, pod

JSON = dict[str, Any]


def test_list_watch_bookmark_resume_and_relist() -> None:
    stop = threading.Event()
    script = Script(stop)
    seen: list[tuple[str, str, str]] = []
    informer = Informer(
        script,  # type: ignore[arg-type]
        PODS,
        lambda kind, op, obj: seen.append((op, obj["metadata"]["name"], kind)),
    )
    informer.start(stop)
    informer.join(timeout=20)
    assert stop.is_set() and informer.synced.is_set()
    # Watch 1 from the list's version; after the drop, resume from the bookmark's (no relist);
    # after 410, from the second list's version.
    assert script.watch_from == ["10", "20", "40"]
    assert informer.relists == 2
    assert seen == [
        ("apply", "a", "Pod"),
        ("apply", "b", "Pod"),
        ("apply", "a", "Pod"),  # MODIFIED
        ("delete", "b", "Pod"),  # vanished while the watch was down
        ("apply", "a", "Pod"),
        ("apply", "c", "Pod"),
        ("delete", "a", "Pod"),
    ]


def test_watch_error_events_become_typed_errors() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    with pytest.raises(kube.Gone):
        kube._watch_event(gone)
    with pytest.raises(kube.KubeError) as err:
        kube._watch_event({"type": "ERROR", "object": {"code": 500, "message": "etcd down"}})
    assert err.value.status == 500 and "etcd down" in str(err.value)
    event = {"type": "ADDED", "object": {"metadata": {"name": "x"}}}
    assert kube._watch_event(event) is event


def test_an_unexpected_failure_relists_instead_of_ending_the_informer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sink or an event that raises what nobody expected costs a backoff and a fresh list (it
    is counted and logged); items that are not objects are skipped. Before, the thread ended and
    the kind was never seen again."""
    stop = threading.Event()
    lists = [([pod("a", "5"), "junk"], "10"), ([pod("a", "5"), pod("b", "12")], "20")]
    watched: list[str] = []

    class Api:
        def list_versioned(self, path: str, **_: Any) -> tuple[list[Any], str]:
            return lists.pop(0)

        def watch(self, path: str, version: str, **_: Any) -> Iterator[JSON]:
            watched.append(version)
            if len(watched) == 1:
                yield {"type": "ADDED", "object": ["not", "an", "object"]}
                yield {"type": "ADDED", "object": pod("boom", "11")}
            else:
                stop.set()
                yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "21"}}}

    seen: list[str] = []

    def sink(kind: str, op: str, obj: JSON) -> None:
        if obj["metadata"]["name"] == "boom" and op == "apply":
            raise RuntimeError("a consumer bug")
        seen.append(f"{op} {obj['metadata']['name']}")

    supervisor = Supervisor()
    informer = Informer(Api(), PODS, sink, supervisor=supervisor)  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        informer._run(stop)
    assert seen == ["apply a", "delete boom", "apply a", "apply b"]
    assert watched == ["10", "20"]  # relisted after the failure, watched from the new list
    assert informer.failures == 1 and supervisor.failures() == {"informer-pods": 1}
    assert "a consumer bug" in caplog.text and "not an object" in caplog.text
    assert supervisor.stalled() == []  # ended because stop was set: not a stall


@pytest.mark.parametrize("status", [404, 403])
def test_an_optional_kind_the_server_lacks_counts_as_none_and_is_asked_again(
    status: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeviceTaintRules on a Kubernetes older than 1.37 (404) or under an older chart's RBAC
    (403): the informer is synced with nothing (the controller becomes ready), logs it once,
    asks again, and reports what it had as deleted; once served, it lists and watches."""
    monkeypatch.setattr(informers, "OPTIONAL_RETRY_S", 0.01)
    stop = threading.Event()
    rule = {"metadata": {"name": "r", "uid": "u-r", "resourceVersion": "7"}}
    answers: list[Any] = [
        ([rule], "7"),
        kube.KubeError(status, "NotFound", "the server could not find the requested resource"),
        kube.KubeError(status, "NotFound", "the server could not find the requested resource"),
        ([rule], "9"),
    ]

    class Api:
        def list_versioned(self, path: str, **_: Any) -> tuple[list[Any], str]:
            assert path == "/apis/resource.k8s.io/v1/devicetaintrules"
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer  # type: ignore[no-any-return]

        def watch(self, path: str, version: str, **_: Any) -> Iterator[JSON]:
            if version == "7":  # the first watch breaks: the kind went away (a downgrade)
                raise kube.Gone(410, "Expired", "too old")
            stop.set()
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "10"}}}

    seen: list[tuple[str, str]] = []
    informer = Informer(
        Api(),  # type: ignore[arg-type]
        TAINT_RULES,
        lambda kind, op, obj: seen.append((kind, op)),
    )
    with caplog.at_level("WARNING"):
        informer._run(stop)
    assert informer.synced.is_set() and not informer.unavailable
    assert seen == [
        ("DeviceTaintRule", "apply"),
        ("DeviceTaintRule", "delete"),  # not served any more: what it had is gone
        ("DeviceTaintRule", "apply"),
    ]
    assert caplog.text.count("not available") == 1
    assert answers == []


def test_a_required_kind_the_server_lacks_is_not_synced() -> None:
    stop = threading.Event()

    class Api:
        def list_versioned(self, path: str, **_: Any) -> tuple[list[Any], str]:
            stop.set()
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")

    informer = Informer(Api(), PODS, lambda *_: None)  # type: ignore[arg-type]
    informer._run(stop)
    assert not informer.synced.is_set() and informer.failures == 1
