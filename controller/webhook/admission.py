"""What the webhook answers: AdmissionReview requests to responses, per endpoint.

Why apart from the server: the server (`controller.webhook.server`) knows HTTP and TLS; this
knows admission. The decisions themselves are pure functions of the translation
(`controller.webhook.translate`) and the validation (`controller.webhook.validation`); the only
side effect here is making the ResourceClaimTemplates of a translated pod exist
(`controller.webhook.templates`), never on a dry run.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from controller.webhook.templates import TemplateEnsurer, TemplateError
from controller.webhook.translate import Refusal, TranslationSettings, translate_pod
from controller.webhook.validation import ClusterFacts, validate_object

JSON = dict[str, Any]
ALLOWED: JSON = {"allowed": True}
VALIDATED_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "Pod"})


def denied(code: int, message: str) -> JSON:
    return {"allowed": False, "status": {"code": code, "message": message}}


class Admission:
    def __init__(
        self,
        settings: TranslationSettings,
        ensurer: TemplateEnsurer,
        facts: Callable[[], ClusterFacts],
    ) -> None:
        self._settings = settings
        self._ensurer = ensurer
        self._facts = facts

    def mutate(self, request: JSON) -> tuple[JSON, str]:
        """Translate a legacy pod on CREATE; anything else passes unchanged."""
        if (request.get("kind") or {}).get("kind") != "Pod" or request.get("operation") != "CREATE":
            return ALLOWED, "allowed"
        pod = request.get("object") or {}
        # On CREATE the pod's metadata.namespace may be empty; the request always names it.
        namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace"))
        try:
            translation = translate_pod(pod, self._settings)
        except Refusal as exc:
            return denied(400, str(exc)), "denied"
        if translation is None:
            return ALLOWED, "allowed"
        # The legacy fields are gone after the patch, so the validating webhook could no longer
        # name them: check them here (e.g. more memory than any GPU has) with the same checks.
        errors = validate_object(pod, self._facts())
        if errors:
            return denied(422, "; ".join(errors)), "denied"
        if not request.get("dryRun"):
            try:
                self._ensurer.ensure(namespace, translation.templates)
            except TemplateError as exc:
                # The API server refused the template (4xx): a refusal of this pod, with its
                # words. Unreachable or failing (5xx): our error, which the pod would meet too.
                return denied(exc.code, str(exc)), "denied" if exc.code < 500 else "error"
        response: JSON = {"allowed": True}
        if translation.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(
                json.dumps(list(translation.patch), separators=(",", ":")).encode()
            ).decode()
        if translation.warnings:
            response["warnings"] = list(translation.warnings)
        return response, "patched"

    def validate(self, request: JSON) -> tuple[JSON, str]:
        """Refuse objects whose GPU configuration is malformed, naming field, value and choices."""
        if request.get("operation") not in ("CREATE", "UPDATE"):
            return ALLOWED, "allowed"
        obj = request.get("object") or {}
        if obj.get("kind") not in VALIDATED_KINDS:
            return ALLOWED, "allowed"
        errors = validate_object(obj, self._facts())
        if errors:
            return denied(422, "; ".join(errors)), "denied"
        return ALLOWED, "allowed"
