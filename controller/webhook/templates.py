"""The ResourceClaimTemplates of translated pods: created on admission, collected when unused.

Why a module of its own: the translation (`controller.webhook.translate`) is pure and only names
the templates a pod needs; someone must make them exist before the pod does (the API server
creates the pod's claims from them right after admission) and remove them once no pod uses them,
without ever deleting one that a pod still being admitted is about to use.

The protocol that makes the race safe, between `TemplateEnsurer` (every replica, per admission)
and `TemplateCollector` (leader only, periodic):
- a template's name is a hash of its content (the translation's doing), so "exists" means "is
  right": creating one that exists is AlreadyExists and fine;
- an admission that finds the template existing *touches* it: the annotation `LAST_USED` is set
  to now, which also changes its resourceVersion;
- the collector deletes a template only if no pod references it and it was neither created nor
  touched within `grace_s`, and deletes with the resourceVersion it judged as a precondition. A
  touch between its judgement and its delete makes the delete a Conflict: the template stays.
  A delete that wins means the next admission creates it again (the touch gets NotFound).
  `grace_s` must exceed the time from admission to the pod's creation (the webhook timeout).
- To keep writes off the hot path, an ensurer remembers what it created or touched and skips
  both for `grace_s / 4`: well inside the grace, so the collector cannot have judged it unused.
- Concurrent admissions of one new shape (a burst of identical pods) make one create-or-touch,
  not one each: the others wait for it and share its outcome. Without that, 200 at once each
  created (AlreadyExists), read and wrote the template back, and each write made the others'
  writes Conflict and retry, until admissions ran out of time (bench/webhook_bench.py saw it).

Dry-run admissions never reach here (the server checks `request.dryRun`): `sideEffects:
NoneOnDryRun`.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from dra_driver import kube
from dra_driver.kube import RESOURCE_API
from dra_driver.supervision import Supervisor

log = logging.getLogger("vgpu-dra.webhook.templates")

JSON = dict[str, Any]
LAST_USED = "vgpu.dra.dev/last-used"
DEFAULT_GRACE_S = 600.0
GC_LOOP = "webhook-template-gc"
# How long one pass may take beyond its period before the loop counts as stalled: two lists and
# a delete per unused template, each bounded by the client's own timeout (30 s).
LOOP_STEP_DEADLINE_S = 300.0


class Template(Protocol):
    """What the translation hands over (controller.webhook.translate.ClaimTemplate)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> Mapping[str, Any]: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


class TemplateError(Exception):
    """A template could not be made to exist; the admission is refused with this message and
    `code`: the API server's own 4xx when it refused the template (Invalid, Forbidden by a
    quota: about the request, not about us), else 500 (unreachable, timed out, a 5xx)."""

    def __init__(self, message: str, code: int = 500) -> None:
        super().__init__(message)
        self.code = code


def _stamp(now: dt.datetime) -> str:
    # Microseconds: a touch must change the object (and so its resourceVersion) even within the
    # second it was created or last touched; an identical value would be a no-op patch.
    return now.isoformat(timespec="microseconds")


def _left(deadline: float) -> float:
    """Seconds until `deadline` (<= 0 makes the client refuse to send: no time left)."""
    return deadline - time.monotonic()


def _collection(namespace: str) -> str:
    return kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace)


def _object(namespace: str, name: str) -> str:
    return kube.path(RESOURCE_API, "resourceclaimtemplates", name, namespace=namespace)


class _Flight:
    """One ensure of a template in progress, which concurrent admissions wait for."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: TemplateError | None = None


class TemplateEnsurer:
    """Makes the templates of an admission exist (and marks them used)."""

    def __init__(
        self,
        client: kube.KubeClient,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        timeout_s: float = 5.0,
        on_create: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._fresh_s = grace_s / 4
        self._timeout_s = timeout_s
        self._on_create = on_create or (lambda: None)
        self._clock = clock
        self._recent: dict[tuple[str, str], float] = {}
        # (namespace, name) -> the ensure in flight and, once it is done, its error (None: ok)
        self._flights: dict[tuple[str, str], _Flight] = {}
        self._lock = threading.Lock()

    def ensure(self, namespace: str, templates: Iterable[Template]) -> None:
        """Make every template exist; all within `timeout_s` (less than the API server's
        deadline for the admission, so a slow API server fails this admission with a reason
        instead of timing the webhook out)."""
        deadline = time.monotonic() + self._timeout_s
        for template in templates:
            key = (namespace, template.name)
            with self._lock:
                seen = self._recent.get(key)
                if seen is not None and self._clock() - seen < self._fresh_s:
                    continue
                flight = self._flights.get(key)
                ours = flight is None
                if flight is None:
                    flight = self._flights[key] = _Flight()
            if ours:
                self._fly(namespace, template, deadline, flight)
            elif not flight.done.wait(max(0.0, _left(deadline))):
                raise TemplateError(
                    f"timed out waiting for ResourceClaimTemplate {namespace}/{template.name}"
                )
            elif flight.error is not None:
                raise TemplateError(str(flight.error), flight.error.code)

    def _fly(self, namespace: str, template: Template, deadline: float, flight: _Flight) -> None:
        key = (namespace, template.name)
        try:
            self._ensure_one(namespace, template, deadline)
        except TemplateError as exc:
            flight.error = exc
            raise
        except BaseException as exc:  # a bug: the waiters must not wait for ever
            flight.error = TemplateError(f"template {namespace}/{template.name}: {exc}")
            raise
        else:
            with self._lock:
                self._recent[key] = self._clock()
                if len(self._recent) > 10_000:  # bounded: forget the oldest half
                    for old in sorted(self._recent, key=self._recent.__getitem__)[:5_000]:
                        del self._recent[old]
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()

    def _ensure_one(self, namespace: str, template: Template, deadline: float) -> None:
        now = _stamp(dt.datetime.now(dt.UTC))
        body = {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": template.name,
                "namespace": namespace,
                "labels": dict(template.labels),
                "annotations": {LAST_USED: now},
            },
            "spec": dict(template.spec),
        }
        try:
            for _ in range(5):  # create / touch / again after a collector's delete or a race
                try:
                    self._client.request(
                        "POST", _collection(namespace), body=body, timeout_s=_left(deadline)
                    )
                    self._on_create()
                    log.info("created ResourceClaimTemplate %s/%s", namespace, template.name)
                    return
                except kube.AlreadyExists:
                    pass
                if self._touch(namespace, template.name, now, deadline):
                    return
        except kube.KubeError as exc:
            raise TemplateError(
                f"cannot create ResourceClaimTemplate {namespace}/{template.name} for the "
                f"translated pod: {exc.message or exc}",
                code=exc.status if 400 <= exc.status < 500 else 500,
            ) from exc
        raise TemplateError(
            f"ResourceClaimTemplate {namespace}/{template.name} keeps disappearing; retry"
        )

    def _touch(self, namespace: str, name: str, now: str, deadline: float) -> bool:
        """Set LAST_USED on the existing template; False when it is gone or changed meanwhile.

        A read-modify-write (PUT with the resourceVersion read), not a merge patch: a patch makes
        the API server re-encode the object, which reorders the opaque VgpuConfig parameters'
        JSON, and an immutable spec whose raw parameters changed byte-wise is refused. A PUT
        sends the parameters back as they were read.
        """
        resource = _object(namespace, name)
        try:
            current = self._client.request("GET", resource, timeout_s=_left(deadline))
        except kube.NotFound:
            return False  # collected between our create and this touch: create it again
        metadata = current.setdefault("metadata", {})
        metadata.setdefault("annotations", {})[LAST_USED] = now
        try:
            self._client.request("PUT", resource, body=current, timeout_s=_left(deadline))
        except (kube.NotFound, kube.Conflict):
            return False  # gone, or touched by another admission after our read: again
        return True


def referenced_templates(pods: Iterable[JSON]) -> set[tuple[str, str]]:
    """(namespace, template name) of every template a pod references."""
    used: set[tuple[str, str]] = set()
    for pod in pods:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = claim.get("resourceClaimTemplateName")
            if name:
                used.add((namespace, str(name)))
    return used


def unused(
    templates: Iterable[JSON], used: set[tuple[str, str]], now: dt.datetime, grace_s: float
) -> list[JSON]:
    """The templates no pod references that were neither created nor touched within grace_s."""
    found = []
    for template in templates:
        metadata = template.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        if key in used:
            continue
        stamps = [
            metadata.get("creationTimestamp"),
            (metadata.get("annotations") or {}).get(LAST_USED),
        ]
        latest = max((_parse(s) for s in stamps if s), default=None)
        if latest is None or (now - latest).total_seconds() >= grace_s:
            found.append(template)
    return found


def _parse(stamp: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.now(dt.UTC)  # unreadable: treat as just used (keep it)


class TemplateCollector:
    """Deletes managed templates that no pod uses (leader only; see the module docstring)."""

    def __init__(
        self,
        client: kube.KubeClient,
        label_selector: str,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        may_write: Callable[[], bool] = lambda: True,
        on_delete: Callable[[], None] | None = None,
    ) -> None:
        self._client = client
        self._selector = label_selector
        self._grace_s = grace_s
        self._may_write = may_write
        self._on_delete = on_delete or (lambda: None)

    def collect(self) -> list[tuple[str, str]]:
        """One pass; the (namespace, name) of the templates deleted."""
        if not self._may_write():
            return []
        return self.delete(self.candidates())

    def candidates(self) -> list[JSON]:
        """The managed templates no pod uses, outside the grace period, as read now."""
        # Templates first, pods second: a pod created after the pod list was read was admitted
        # after the template list, so its template was touched or created after we read it, and
        # the resourceVersion precondition in `delete` protects it.
        templates = self._client.list(
            kube.path(RESOURCE_API, "resourceclaimtemplates"), label_selector=self._selector
        )
        if not templates:
            return []
        used = referenced_templates(self._client.list(kube.path("v1", "pods")))
        return unused(templates, used, dt.datetime.now(dt.UTC), self._grace_s)

    def delete(self, candidates: Iterable[JSON]) -> list[tuple[str, str]]:
        """Delete each candidate unless it changed since it was read (touched: in use again)."""
        deleted = []
        for template in candidates:
            if not self._may_write():
                break
            metadata = template["metadata"]
            namespace, name = metadata["namespace"], metadata["name"]
            try:
                self._client.request(
                    "DELETE",
                    _object(namespace, name),
                    body={
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "preconditions": {"resourceVersion": metadata["resourceVersion"]},
                    },
                )
            except (kube.Conflict, kube.NotFound):
                continue  # touched (in use again) or already gone
            self._on_delete()
            deleted.append((namespace, name))
            log.info("deleted unused ResourceClaimTemplate %s/%s", namespace, name)
        return deleted

    def run(
        self,
        stop: threading.Event,
        interval_s: float,
        *,
        supervisor: Supervisor | None = None,
    ) -> threading.Thread:
        """Collect every `interval_s` until `stop`, as the supervised loop `webhook-template-gc`
        (`dra_driver.supervision`): an API error is logged in one line, anything else with its
        traceback and counted; either way the next pass comes after a backoff."""
        return (supervisor or Supervisor()).run(
            GC_LOOP,
            self._collect_step,
            stop,
            period_s=interval_s,
            deadline_s=interval_s + LOOP_STEP_DEADLINE_S,
            expected=(kube.KubeError,),
        )

    def _collect_step(self) -> None:
        self.collect()
