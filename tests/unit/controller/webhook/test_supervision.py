"""The webhook's long-lived loops survive what they do not expect (issue 27), without a cluster.

Proves, for each loop (dra_driver.supervision is the rule):
1. `webhook-facts`, `webhook-template-gc`, `webhook-certs`: a step that raises an unexpected
   exception is logged with its traceback and counted, and the loop goes on (the next step
   succeeds); the certificate sync skips its first pass (the caller synced);
2. the server (`webhook`): an unexpected exception while accepting a connection or serving one
   ends that connection only, logged and counted on the loop; the next connection is served;
   the loop beats while it turns and stays unstalled, and is reported stalled once its thread
   has died;
3. an AdmissionReview nested too deeply for the decoder is answered (HTTP 200), and a VgpuConfig
   in it is refused by name ("nested too deeply").
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.webhook import certs, facts
from controller.webhook.admission import Admission
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.server import WebhookServer
from controller.webhook.templates import TemplateCollector
from controller.webhook.translate import TranslationSettings
from controller.webhook.validation import ClusterFacts
from dra_driver import kube
from dra_driver.supervision import Supervisor
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]
DAY = dt.timedelta(days=1)
NAMES = certs.Names.for_service("hook", "ns", ["127.0.0.1"])


def failures(supervisor: Supervisor, name: str) -> int:
    return supervisor.failures().get(name, 0)


# ---------------------------------------------------------------- 1: the periodic loops


class FlakyClient:
    """A KubeClient stand-in whose first `list` raises a bug of ours (not an API error)."""

    def __init__(self) -> None:
        self.lists = 0

    def list(self, path: str, **_: Any) -> list[JSON]:
        self.lists += 1
        if self.lists == 1:
            raise RuntimeError("a bug in a step")
        if path.endswith("resourceslices"):
            return [
                {"spec": {"driver": "vgpu.dra.dev", "devices": [
                    {"capacity": {"memory": {"value": "80Gi"}}}]}},
            ]  # fmt: skip
        return []


def test_the_facts_loop_survives_an_unexpected_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor, stop = Supervisor(), threading.Event()
    cache = facts.FactsCache(FlakyClient(), "vgpu.dra.dev")  # type: ignore[arg-type]
    thread = cache.run(stop, 0.05, supervisor=supervisor)
    try:
        wait_for("a refresh after the failed one", lambda: cache.current().largest_gpu_memory_mib)
        assert cache.current().largest_gpu_memory_mib == 80 * 1024
        assert failures(supervisor, "webhook-facts") == 1
        assert "Traceback" in caplog.text and "a bug in a step" in caplog.text
        assert supervisor.stalled() == []
    finally:
        stop.set()
        thread.join(timeout=5)


def test_facts_skip_an_object_of_an_unexpected_shape_and_keep_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = {"spec": {"driver": "d", "devices": [{"capacity": {"memory": {"value": "24Gi"}},
            "attributes": {"productName": {"string": "A10"}}}]}}  # fmt: skip
    bent = [
        "not an object",
        {"metadata": {"name": "odd"}, "spec": {"driver": "d", "devices": "many"}},
        {"spec": {"driver": "d", "devices": [{"attributes": {"memoryBytes": {"int": "lots"}}}]}},
    ]
    classes = [{"spec": {"selectors": "x"}}, {"spec": {"selectors": [{"cel": {"expression":
               'device.driver == "d"'}}]}}]  # fmt: skip
    found = facts.facts_from([*bent, good], classes, "d")
    assert found.largest_gpu_memory_mib == 24 * 1024
    assert found.gpu_types == frozenset({"A10"})
    assert "ResourceSlice odd skipped for validation" in caplog.text


class CollectorClient:
    def __init__(self) -> None:
        self.calls = 0

    def list(self, path: str, **_: Any) -> list[JSON]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug in a pass")
        return []


def test_the_template_collector_survives_an_unexpected_exception() -> None:
    supervisor, stop = Supervisor(), threading.Event()
    client = CollectorClient()
    collector = TemplateCollector(client, "a=b")  # type: ignore[arg-type]
    thread = collector.run(stop, 0.05, supervisor=supervisor)
    try:
        wait_for("a pass after the failed one", lambda: client.calls >= 3)
        assert failures(supervisor, "webhook-template-gc") == 1
    finally:
        stop.set()
        thread.join(timeout=5)


def test_an_api_error_is_expected_logged_in_one_line_and_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Down:
        calls = 0

        def list(self, path: str, **_: Any) -> list[JSON]:
            Down.calls += 1
            raise kube.Unreachable(0, "", "connection refused")

    supervisor, stop = Supervisor(), threading.Event()
    thread = TemplateCollector(Down(), "a=b").run(stop, 0.01, supervisor=supervisor)  # type: ignore[arg-type]
    try:
        wait_for("two passes", lambda: Down.calls >= 2)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert failures(supervisor, "webhook-template-gc") == 0
    assert "connection refused" in caplog.text and "Traceback" not in caplog.text


def test_the_certificate_sync_skips_its_first_pass_and_survives_a_bug() -> None:
    class Source:
        syncs = 0

        def sync(self) -> None:
            Source.syncs += 1
            if Source.syncs == 1:
                raise RuntimeError("a bug in a sync")

    supervisor, stop = Supervisor(), threading.Event()
    started = time.monotonic()
    thread = certs.keep_synced(Source(), stop, 0.2, supervisor=supervisor)  # type: ignore[arg-type]
    try:
        wait_for("a sync after the failed one", lambda: Source.syncs >= 2)
        assert time.monotonic() - started >= 0.2  # the first pass came after one interval
        assert failures(supervisor, "webhook-certs") == 1
    finally:
        stop.set()
        thread.join(timeout=5)


# ---------------------------------------------------------------- 2, 3: the server


class Holder(certs.ContextHolder):
    """Raises a bug of ours for the next `fail` connections, then serves as usual."""

    fail = 0

    def current(self) -> ssl.SSLContext | None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("a bug while accepting")
        return super().current()


class Served:
    def __init__(
        self,
        tmp_path: Path,
        mutate: Callable[[JSON], tuple[JSON, str]],
        validate: Callable[[JSON], tuple[JSON, str]] | None = None,
    ) -> None:
        ca = certs.new_ca(DAY * 2)
        self.holder = Holder()
        self.holder.load(*certs.new_serving(ca[0], ca[1], NAMES, DAY))
        bundle = tmp_path / "ca.pem"
        bundle.write_bytes(ca[0])
        self.context = ssl.create_default_context(cafile=str(bundle))
        self.supervisor = Supervisor()
        self.server = WebhookServer(
            ("127.0.0.1", 0),
            self.holder,
            mutate=mutate,
            validate=validate or mutate,
            metrics=WebhookMetrics(),
            supervisor=self.supervisor,
        )

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        host, port = self.server.address
        conn = http.client.HTTPSConnection(host, port, context=self.context, timeout=10)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(
        mutate: Callable[[JSON], tuple[JSON, str]],
        validate: Callable[[JSON], tuple[JSON, str]] | None = None,
    ) -> Served:
        served = Served(tmp_path, mutate, validate)
        served.server.start()
        started.append(served)
        return served

    yield start
    for served in started:
        served.server.stop()


def review(uid: str, obj: JSON | None = None, **request: Any) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"kind": "Pod"}, "namespace": "ns",
                    "operation": "CREATE", "object": obj or {}, **request},
    }  # fmt: skip
    return json.dumps(body).encode()


def allowed(request: JSON) -> tuple[JSON, str]:
    if request.get("name") == "unanswerable":  # not JSON: fails after the review, in the answer
        return {"allowed": True, "warnings": [object()]}, "allowed"
    return {"allowed": True}, "allowed"


def test_a_connection_failing_unexpectedly_ends_alone_and_is_counted(
    serve: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    served = serve(allowed)
    with pytest.raises((http.client.HTTPException, OSError)):
        served.post("/mutate-pods", review("a", name="unanswerable"))
    wait_for("the failure counted", lambda: failures(served.supervisor, "webhook") == 1)
    assert "failed unexpectedly" in caplog.text and "Traceback" in caplog.text
    status, body = served.post("/mutate-pods", review("b"))
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
    assert served.supervisor.stalled() == []


def test_an_accept_failing_unexpectedly_costs_one_connection_and_is_counted(
    serve: Callable[..., Served],
) -> None:
    served = serve(allowed)
    served.holder.fail = 1
    with pytest.raises((http.client.HTTPException, OSError)):
        served.post("/mutate-pods", review("a"))
    wait_for("the failure counted", lambda: failures(served.supervisor, "webhook") == 1)

    def answered() -> bool:
        try:
            return served.post("/mutate-pods", review("b"))[0] == 200
        except (http.client.HTTPException, OSError):
            return False

    wait_for("the next connection served", answered, timeout=10)
    assert served.supervisor.stalled() == []


def test_the_servers_loop_beats_while_it_turns_and_stalls_once_it_ends(
    serve: Callable[..., Served],
) -> None:
    served = serve(allowed)
    (loop,) = served.supervisor.loops()
    assert loop.name == "webhook"
    before = loop.last_beat
    wait_for("the loop beating", lambda: loop.last_beat > before, timeout=10)
    assert served.supervisor.stalled() == []
    served.server._httpd.shutdown()  # the accepting thread ends without `stop`: nothing serves
    wait_for("the loop reported stalled", lambda: served.supervisor.stalled() == ["webhook"])
    assert not served.server.serving()  # the controller's readiness check


def deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def claim(parameters: Any, driver: str = "vgpu.dra.dev") -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": driver,
                        "parameters": parameters}}]}},
    }  # fmt: skip


def deep_review(uid: str, parameters: Any, driver: str = "vgpu.dra.dev") -> bytes:
    """An AdmissionReview whose claim's parameters nest deeper than json.loads can take: built
    as text, since json.dumps cannot write it either."""
    marker = "__DEEP__"
    text = review(uid, claim(marker, driver), kind={"kind": "ResourceClaim"}).decode()
    return text.replace(json.dumps(marker), parameters).encode()


def test_a_review_nested_too_deeply_is_answered_and_its_config_refused_by_name(
    serve: Callable[..., Served],
) -> None:
    admission = Admission(TranslationSettings(), None, lambda: ClusterFacts(None))  # type: ignore[arg-type]
    served = serve(admission.mutate, admission.validate)
    levels = 5000
    nested = "[" * levels + "1" + "]" * levels
    with pytest.raises(RecursionError):
        json.loads(nested)
    parameters = '{"apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig", "x": ' + nested
    status, body = served.post("/validate", deep_review("d", parameters + "}"))
    assert status == 200
    response = json.loads(body)["response"]
    assert response["uid"] == "d"
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert (
        "spec.devices.config[0].opaque.parameters: nested too deeply"
        in (response["status"]["message"])
    )
    # Another driver's config is that driver's business, however deep.
    status, body = served.post("/validate", deep_review("e", nested, driver="other.example.com"))
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
    # A deep structure that fits the decoder is judged as before: an unknown field.
    shallow = json.dumps({"apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig",
                          "x": deep(2)})  # fmt: skip
    status, body = served.post("/validate", deep_review("f", shallow))
    assert "unknown field 'x'" in json.loads(body)["response"]["status"]["message"]


def test_garbage_is_still_a_400(serve: Callable[..., Served]) -> None:
    served = serve(allowed)
    assert served.post("/validate", b"{" * 10)[0] == 400
    assert served.post("/validate", b"\xff\xfe")[0] == 400


def test_no_log_record_leaks_the_deep_body(
    serve: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    admission = Admission(TranslationSettings(), None, lambda: ClusterFacts(None))  # type: ignore[arg-type]
    served = serve(admission.mutate, admission.validate)
    nested = "[" * 3000 + "]" * 3000
    served.post("/validate", deep_review("g", '{"kind": ' + nested + "}"))
    assert "[[[[[[[[[[" not in caplog.text
