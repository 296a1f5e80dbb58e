"""Hostile objects at the admission (controller.webhook.admission, .templates, .server), without
a cluster (issue 27).

Proves:
1. the issue's pod with a 100 KiB `nvidia.com/use-gputype` is refused (allowed: false, code 400)
   naming the annotation and the bound, before any template is made: never a 500;
2. `nvidia.com/gpu: 0` is admitted with its legacy resource removed and no claim;
3. a template the API server refuses (4xx: Invalid, Forbidden by a quota) refuses the pod with
   the API server's code and words, decision `denied`; an API server that fails or cannot be
   reached (5xx, no answer) is still an `error` (code 500); the waiters of a shared template
   ensure get the same code;
4. a bug in a review is a refusal naming the admission's uid, its details only in the log.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterable
from typing import Any

import jsonpatch
import pytest

from controller.webhook.admission import Admission
from controller.webhook.server import review_safely
from controller.webhook.templates import Template, TemplateEnsurer, TemplateError
from controller.webhook.translate import TranslationSettings, translate_pod
from controller.webhook.validation import ClusterFacts
from dra_driver import kube

JSON = dict[str, Any]
SETTINGS = TranslationSettings()


class Ensurer:
    def __init__(self, error: TemplateError | None = None) -> None:
        self.calls: list[list[str]] = []
        self.error = error

    def ensure(self, namespace: str, templates: Iterable[Template]) -> None:
        self.calls.append([t.name for t in templates])
        if self.error is not None:
            raise self.error


def admission(ensurer: Ensurer) -> Admission:
    return Admission(SETTINGS, ensurer, lambda: ClusterFacts(None))  # type: ignore[arg-type]


def pod(limits: JSON, **annotations: str) -> JSON:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }  # fmt: skip


def request(obj: JSON) -> JSON:
    return {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "t",
            "object": obj}  # fmt: skip


# ---------------------------------------------------------------- 1, 2


def test_the_issues_100_kib_gpu_type_is_a_clear_refusal_not_a_500() -> None:
    ensurer = Ensurer()
    legacy = pod({"nvidia.com/gpu": "1"}, **{"nvidia.com/use-gputype": "A100," * 20480})
    response, decision = admission(ensurer).mutate(request(legacy))
    assert decision == "denied"
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    message = response["status"]["message"]
    assert message.startswith("annotation nvidia.com/use-gputype: 102400 bytes")
    assert "at most 10240 bytes and 256 items" in message
    assert ensurer.calls == []  # refused before any template was made


def test_gpu_zero_is_admitted_without_a_claim() -> None:
    ensurer = Ensurer()
    legacy = pod({"nvidia.com/gpu": "0", "cpu": "1"})
    response, decision = admission(ensurer).mutate(request(legacy))
    assert decision == "patched" and response["allowed"] is True
    patched = jsonpatch.apply_patch(legacy, json.loads(base64.b64decode(response["patch"])))
    assert "resourceClaims" not in patched["spec"]
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}}
    assert ensurer.calls in ([], [[]])  # nothing to make


# ---------------------------------------------------------------- 3: template errors


@pytest.mark.parametrize(
    ("error", "code", "decision"),
    [
        (kube.KubeError(422, "Invalid", "spec.spec.devices.requests[0]: Invalid value"), 422,
         "denied"),
        (kube.KubeError(403, "Forbidden", "exceeded quota: count/resourceclaimtemplates"), 403,
         "denied"),
        (kube.KubeError(503, "ServiceUnavailable", "etcd is down"), 500, "error"),
        (kube.Unreachable(0, "", "connection refused"), 500, "error"),
    ],
)  # fmt: skip
def test_a_refused_template_refuses_the_pod_with_the_api_servers_code(
    error: kube.KubeError, code: int, decision: str
) -> None:
    class Client:
        def request(self, method: str, path: str, **_: Any) -> JSON:
            raise error

    ensurer = TemplateEnsurer(Client())  # type: ignore[arg-type]
    legacy = pod({"nvidia.com/vgpu-number": "1"})
    translation = translate_pod(legacy, SETTINGS)
    assert translation is not None
    with pytest.raises(TemplateError) as failed:
        ensurer.ensure("t", translation.templates)
    assert failed.value.code == code
    response, got = Admission(SETTINGS, ensurer, lambda: ClusterFacts(None)).mutate(request(legacy))
    assert got == decision
    assert response["allowed"] is False
    assert response["status"]["code"] == code
    assert error.message in response["status"]["message"]


def test_the_waiters_of_a_shared_ensure_get_its_code() -> None:
    entered, release = threading.Event(), threading.Event()

    class Client:
        def request(self, method: str, path: str, **_: Any) -> JSON:
            entered.set()
            release.wait(5)
            raise kube.KubeError(422, "Invalid", "no")

    ensurer = TemplateEnsurer(Client())  # type: ignore[arg-type]
    translation = translate_pod(pod({"nvidia.com/vgpu-number": "1"}), SETTINGS)
    assert translation is not None
    codes: list[int] = []

    def ensure() -> None:
        try:
            ensurer.ensure("t", translation.templates)
        except TemplateError as exc:
            codes.append(exc.code)

    first = threading.Thread(target=ensure)
    first.start()
    assert entered.wait(5)
    second = threading.Thread(target=ensure)
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert codes == [422, 422]


# ---------------------------------------------------------------- 4: bugs


def test_a_bug_in_a_review_is_a_refusal_naming_the_uid(caplog: pytest.LogCaptureFixture) -> None:
    def review(request: JSON) -> tuple[JSON, str]:
        raise KeyError("secret detail")

    response, decision = review_safely("mutate", review, {"uid": "u-42"})
    assert decision == "error"
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "admission uid u-42" in message and "secret detail" not in message
    assert "secret detail" in caplog.text and "Traceback" in caplog.text
