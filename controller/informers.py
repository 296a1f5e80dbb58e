"""Informers: keep a local copy of one kind current with list + watch, and report every change.

Why hand-written over `kubernetes.watch.Watch`: that helper drives the generated typed API
functions and turns every object into a model class, while everything here (the allocator's
model, the reconciler) speaks the API's own JSON dicts through the one seam `dra_driver.kube`.
The protocol itself is small: list (the collection's resourceVersion), watch from it with
bookmarks (`KubeClient.watch`), remember the latest version seen (bookmarks advance it while
nothing changes), list again on 410 Gone, reconnect with capped exponential backoff when the
connection fails. A relist reports deletions of objects that vanished while the watch was down,
so the consumer never keeps a ghost.

Each informer runs in its own daemon thread and only calls `sink(kind, op, obj)` with op
"apply" or "delete"; the consumer (the controller's single worker) serialises the changes.

Hostile input: every object any tenant can create passes through here. JSON nested deeper than
the decoder takes is cut by `kube.decode_json` (the rest of the object, and of the list, arrives);
an event that is not an object is skipped with a log line; any other exception is logged with its
traceback, counted as the informer's loop failure (`dra_driver.supervision`) and answered like a
failed connection: a backoff, then a fresh list. The informer beats on every event and every
(re)connection, so a watch that hangs past its read timeout makes the process unhealthy.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver import kube
from dra_driver.supervision import Supervisor

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Sink = Callable[[str, str, JSON], None]
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# Beyond the watch's own timeout and its read margin (kube.watch: +30 s), a reconnect backoff
# and a first list: no beat for this long means the thread is stuck.
STALL_MARGIN_S = 120.0
OPTIONAL_RETRY_S = BACKOFF_MAX_S


@dataclass(frozen=True, slots=True)
class Resource:
    """One watched kind: its name as the allocator model knows it and its collection path."""

    kind: str
    api_version: str
    plural: str
    field_selector: str | None = None  # only the objects it selects are listed and watched
    # Optional: a cluster that does not serve the kind (an older Kubernetes, the feature off) or
    # does not let us read it (RBAC of an older chart) counts as having none of it; the informer
    # is synced and asks again every OPTIONAL_RETRY_S.
    optional: bool = False

    @property
    def path(self) -> str:
        return kube.path(self.api_version, self.plural)


# What the allocation controller watches (cluster-wide).
PODS = Resource("Pod", "v1", "pods")
NODES = Resource("Node", "v1", "nodes")
SLICES = Resource("ResourceSlice", kube.RESOURCE_API, "resourceslices")
CLAIMS = Resource("ResourceClaim", kube.RESOURCE_API, "resourceclaims")
CLASSES = Resource("DeviceClass", kube.RESOURCE_API, "deviceclasses")
# An admin's taints on devices (`vgpu-dra drain`; GA in Kubernetes 1.37, DRADeviceTaintRules).
TAINT_RULES = Resource("DeviceTaintRule", kube.RESOURCE_API, "devicetaintrules", optional=True)
ALL = (NODES, SLICES, CLASSES, TAINT_RULES, CLAIMS, PODS)
# Warning Events about pods, for the rescheduler (controller.rescheduler).
POD_WARNINGS = Resource("Event", "v1", "events", "involvedObject.kind=Pod,type=Warning")


def _identity(obj: JSON) -> JSON:
    """What a delete needs (consumers read only the identity): keeping whole objects here would
    double the controller's memory on large clusters."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}}


def _key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class Informer:
    """List + watch of one resource, feeding `sink`; `synced` is set after the first full list."""

    def __init__(
        self,
        client: kube.KubeClient,
        resource: Resource,
        sink: Sink,
        *,
        watch_timeout_s: int = 300,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.resource = resource
        self._loop = (supervisor or Supervisor()).register(
            f"informer-{resource.plural}", watch_timeout_s + BACKOFF_MAX_S + STALL_MARGIN_S
        )
        self.synced = threading.Event()
        self._client = client
        self._sink = sink
        self._watch_timeout = watch_timeout_s
        self._known: dict[str, JSON] = {}  # key -> identity reported (for relist deletions)
        self._version = ""
        self._thread: threading.Thread | None = None
        self.relists = 0  # lists done (1 + one per 410 Gone / failure before a list)
        self.expired = 0  # watches ended by 410 Gone (a relist follows)
        self.failures = 0  # list/watch calls that failed (reconnected after a backoff)
        self.unavailable = False  # an optional kind the server does not serve or let us read

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(stop,), name=f"informer-{self.resource.plural}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        try:
            self._watch_loop(stop)
        finally:
            self._loop.end(stopped=stop.is_set())  # only an early end is a stall

    def _watch_loop(self, stop: threading.Event) -> None:
        backoff = BACKOFF_START_S
        need_list = True
        while not stop.is_set():
            self._loop.beat()
            try:
                if need_list:
                    if not self._list():
                        if stop.wait(OPTIONAL_RETRY_S):
                            return
                        continue
                    need_list = False
                for event in self._client.watch(
                    self.resource.path,
                    self._version,
                    timeout_s=self._watch_timeout,
                    field_selector=self.resource.field_selector,
                ):
                    self._loop.beat()
                    self._on_event(event)
                    backoff = BACKOFF_START_S
                    if stop.is_set():
                        return
                continue
            except kube.Gone:
                log.info(
                    "%s: watch version %s expired; listing again",
                    self.resource.plural,
                    self._version,
                )
                need_list = True
                self.expired += 1
                continue
            except kube.KubeError as exc:
                self.failures += 1
                log.warning("%s: %s; retrying in %.1fs", self.resource.plural, exc, backoff)
                # An optional kind that went away (or became forbidden): the list says so.
                need_list = need_list or (self.resource.optional and exc.status in (403, 404))
            except Exception:
                # Not the API's doing: an object or an event nothing here expected. Count it,
                # then start over from a fresh list (the watch position may be what broke).
                self.failures += 1
                self._loop.beat(failed=True)
                log.exception(
                    "%s: unexpected failure; listing again in %.1fs", self.resource.plural, backoff
                )
                need_list = True
            # Jitter keeps several informers from reconnecting in lockstep.
            if stop.wait(backoff * (0.5 + random.random() / 2)):
                return
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _list(self) -> bool:
        """List and report; False when an optional kind is not available (reported as empty)."""
        try:
            items, version = self._client.list_versioned(
                self.resource.path, field_selector=self.resource.field_selector
            )
        except kube.KubeError as exc:
            if not self.resource.optional or exc.status not in (403, 404):
                raise
            if not self.unavailable:
                log.warning(
                    "%s: not available (%s); taken as none, asking again every %.0fs",
                    self.resource.plural,
                    exc,
                    OPTIONAL_RETRY_S,
                )
            self.unavailable = True
            for old in self._known.values():
                self._sink(self.resource.kind, "delete", old)
            self._known = {}
            self.synced.set()
            return False
        if self.unavailable:
            log.info("%s: available now", self.resource.plural)
            self.unavailable = False
        self.relists += 1
        items = [obj for obj in items if self._is_object(obj)]
        fresh = {_key(obj): _identity(obj) for obj in items}
        for key, old in list(self._known.items()):
            if key not in fresh:
                self._sink(self.resource.kind, "delete", old)
        for obj in items:
            self._sink(self.resource.kind, "apply", obj)
        self._known = fresh
        self._version = version
        self.synced.set()
        return True

    def _is_object(self, obj: Any) -> bool:
        """An API object with a metadata map; anything else is skipped with a log line."""
        if isinstance(obj, dict) and isinstance(obj.get("metadata", {}), dict):
            return True
        log.warning("%s: skipped an item that is not an object: %.200r", self.resource.plural, obj)
        return False

    def _on_event(self, event: JSON) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if not self._is_object(obj):
            return
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._version = str(version)
        if kind == "BOOKMARK":
            return
        if kind == "DELETED":
            self._known.pop(_key(obj), None)
            self._sink(self.resource.kind, "delete", obj)
        elif kind in ("ADDED", "MODIFIED"):
            self._known[_key(obj)] = _identity(obj)
            self._sink(self.resource.kind, "apply", obj)
