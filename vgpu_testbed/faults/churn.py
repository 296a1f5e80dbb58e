"""A steady churn of mixed GPU pods in one namespace, and the ledger of what became of each.

Kinds (each pod's claims come the way users write them):
- `share`: a 1-GPU share (memory + cores) from a ResourceClaimTemplate, default path;
- `whole`: a whole GPU (no capacity asked) from a template, default path;
- `named`: a share through a ResourceClaim created for the pod, default path;
- `policy`: a share through a named claim, on the policy path (the scheduling gate; binpack or
  spread annotations): the controller allocates it;
- `link`: two GPUs inside one NVLink domain (`device-topology-mode: link`), policy path;
- `legacy`: a vgpu-manager pod written for that system (`nvidia.com/vgpu-*` limits), which the
  admission webhook translates (half of them with a policy annotation: gated too).

One thread creates a pod every `interval_s` and deletes pods a while after they run (their
`lifetime`); pods that never run are deleted after `give_up_s` with what the API said about
them. Another lists the namespace every second and records when each pod first ran, and where.
Errors of the API (down, slow, refusing) never stop either thread: a create that fails is
recorded with its message (a refusal with a reason when the API server answered it).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient

JSON = dict[str, Any]
DRIVER = "vgpu.dra.dev"
GATE = "vgpu.dra.dev/policy"
PAUSE = "registry.k8s.io/pause:3.10"
KINDS: dict[str, int] = {"share": 3, "whole": 1, "named": 1, "policy": 2, "link": 1, "legacy": 2}
TEMPLATES: dict[str, JSON] = {
    "share-small": {"count": 1, "capacity": {"requests": {"memory": "2Gi", "cores": "10"}}},
    "share-large": {"count": 1, "capacity": {"requests": {"memory": "6Gi", "cores": "25"}}},
    "whole": {"count": 1},
    # Two GPUs of the NVLink node (the A10s have no NVLink domain).
    "link2": {
        "count": 2,
        "capacity": {"requests": {"memory": "8Gi", "cores": "10"}},
        "selectors": [{"cel": {"expression": f'has(device.attributes["{DRIVER}"].nvlinkDomain)'}}],
    },
}


@dataclass
class PodRecord:
    """What the churn knows about one pod it created (or tried to)."""

    name: str
    kind: str
    created: float  # time.monotonic() of the create call
    lifetime: float
    canary: bool = False
    node_selector: str = ""
    create_error: str = ""
    refused: bool = False  # the API server answered the create with an error (a reason)
    running: float | None = None
    node: str = ""
    deleted: float | None = None
    gone: float | None = None
    given_up_reason: str = ""
    named_claim: str = ""

    @property
    def created_ok(self) -> bool:
        return not self.create_error


def exactly(spec: JSON) -> JSON:
    return {"deviceClassName": DRIVER, **spec}


def claim_template(name: str) -> JSON:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": exactly(TEMPLATES[name])}]}
            }
        },
    }


def resource_claim(name: str, memory: str, cores: str) -> JSON:
    request = exactly({"count": 1, "capacity": {"requests": {"memory": memory, "cores": cores}}})
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"vgpu-dra.test/churn": "yes"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def pod_manifest(
    name: str, kind: str, rng: random.Random, *, node: str = "", canary: bool = False
) -> tuple[JSON, JSON | None]:
    """(pod, named claim to create first or None) for a pod of `kind`."""
    labels = {"vgpu-dra.test/churn": "yes", "vgpu-dra.test/kind": kind}
    if canary:
        labels["vgpu-dra.test/canary"] = "yes"
    container: JSON = {"name": "c", "image": PAUSE}
    spec: JSON = {"terminationGracePeriodSeconds": 2, "containers": [container]}
    meta: JSON = {"name": name, "labels": labels, "annotations": {}}
    claim: JSON | None = None
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if kind == "legacy":
        container["resources"] = {
            "limits": {
                "nvidia.com/vgpu-number": "1",
                "nvidia.com/vgpu-memory": "1024",
                "nvidia.com/vgpu-cores": "10",
            }
        }
        # Half of them ask for a policy (gated, the controller places them); a canary never:
        # it measures the webhook's path alone.
        if not canary and rng.random() < 0.5:
            meta["annotations"]["nvidia.com/node-scheduler-policy"] = "binpack"
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, None
    source: JSON
    if kind in ("named", "policy"):
        claim = resource_claim(name, rng.choice(("2Gi", "4Gi")), rng.choice(("5", "10")))
        source = {"resourceClaimName": name}
    elif kind == "share":
        source = {"resourceClaimTemplateName": rng.choice(("share-small", "share-large"))}
    elif kind == "whole":
        source = {"resourceClaimTemplateName": "whole"}
    else:  # link
        source = {"resourceClaimTemplateName": "link2"}
    if kind in ("policy", "link"):
        spec["schedulingGates"] = [{"name": GATE}]
        policy = rng.choice(("binpack", "spread"))
        meta["annotations"]["vgpu.dra.dev/node-scheduler-policy"] = policy
        meta["annotations"]["vgpu.dra.dev/device-scheduler-policy"] = policy
        if kind == "link":
            meta["annotations"]["vgpu.dra.dev/device-topology-mode"] = "link"
    container["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", **source}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, claim


def condition(pod: JSON, kind: str) -> JSON:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def status_reason(pod: JSON) -> str:
    """What the pod's own status says about why it does not run ('' when nothing)."""
    for kind in ("vgpu.dra.dev/Placement", "PodScheduled"):
        cond = condition(pod, kind)
        if cond.get("status") == "False" and (cond.get("message") or cond.get("reason")):
            return f"{kind}: {cond.get('reason', '')}: {cond.get('message', '')}"[:300]
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("message"):
            return f"{waiting.get('reason')}: {waiting['message']}"[:300]
    return ""


def is_running(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Running", "Succeeded")


class Churn:
    """Creates and deletes pods in `namespace` until stopped; `records` is the ledger."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        *,
        interval_s: float = 2.0,
        lifetime_s: tuple[float, float] = (10.0, 30.0),
        give_up_s: float = 240.0,
        seed: int = 29,
        kinds: dict[str, int] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.interval_s = interval_s
        self.lifetime_s = lifetime_s
        self.give_up_s = give_up_s
        self.rng = random.Random(seed)
        self.kinds = kinds or KINDS
        self.records: dict[str, PodRecord] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self.errors: list[str] = []

    # ----- lifecycle ---------------------------------------------------------------------------

    def install(self) -> None:
        """The shared templates (idempotent)."""
        for name in TEMPLATES:
            with contextlib.suppress(kube.AlreadyExists):
                self.client.create(
                    self._path(RESOURCE_API, "resourceclaimtemplates"), claim_template(name)
                )

    def start(self) -> None:
        self.install()
        for target, name in (
            (self._create_loop, "churn-create"),
            (self._observe_loop, "churn-observe"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def pause(self) -> None:
        """Stop creating new pods (observing and deleting go on)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        self._threads.clear()

    # ----- pods -------------------------------------------------------------------------------

    def _path(self, api: str, plural: str, name: str | None = None) -> str:
        return kube.path(api, plural, name, namespace=self.namespace)

    def create(self, kind: str, *, canary: bool = False, node: str = "") -> PodRecord:
        with self.lock:
            self._seq += 1
            prefix = "canary" if canary else "churn"
            name = f"{prefix}-{kind}-{self._seq:05d}"
            lifetime = self.rng.uniform(*self.lifetime_s)
            pod, claim = pod_manifest(name, kind, self.rng, node=node, canary=canary)
        record = PodRecord(
            name, kind, time.monotonic(), lifetime, canary=canary, node_selector=node
        )
        with self.lock:
            self.records[name] = record
        try:
            if claim is not None:
                record.named_claim = name
                self.client.create(self._path(RESOURCE_API, "resourceclaims"), claim)
            self.client.create(self._path("v1", "pods"), pod)
        except kube.KubeError as exc:
            record.create_error = str(exc)[:400]
            record.refused = exc.status != 0
            if claim is not None:
                self._delete_claim(record)
        return record

    def delete(self, record: PodRecord) -> None:
        try:
            self.client.request(
                "DELETE", self._path("v1", "pods", record.name), query={"gracePeriodSeconds": 2}
            )
            record.deleted = time.monotonic()
        except kube.NotFound:
            record.deleted = record.deleted or time.monotonic()
        except kube.KubeError:
            return  # tried again on the next pass

    def _delete_claim(self, record: PodRecord) -> None:
        with contextlib.suppress(kube.KubeError):
            self.client.delete(self._path(RESOURCE_API, "resourceclaims", record.named_claim))
            record.named_claim = ""

    def _pick_kind(self) -> str:
        kinds = list(self.kinds)
        return self.rng.choices(kinds, weights=[self.kinds[k] for k in kinds])[0]

    def _create_loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_at and not self._paused.is_set():
                next_at = now + self.interval_s
                try:
                    self.create(self._pick_kind())
                except Exception as exc:  # the churn must outlive anything the API does
                    self.errors.append(f"create: {exc!r}")
            for record in self.live():
                if record.canary:
                    continue
                if record.running is not None and now - record.running > record.lifetime:
                    self.delete(record)
                elif record.running is None and now - record.created > self.give_up_s:
                    record.given_up_reason = self.why(record) or "(nothing said)"
                    self.delete(record)
            self._stop.wait(0.2)

    def live(self) -> list[PodRecord]:
        """Records of pods created and not yet deleted."""
        with self.lock:
            return [r for r in self.records.values() if r.created_ok and r.deleted is None]

    def _observe_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.observe()
            self._stop.wait(1.0)

    def observe(self) -> None:
        pods = self.client.list(self._path("v1", "pods"))
        now = time.monotonic()
        present = set()
        for pod in pods:
            name = pod["metadata"]["name"]
            present.add(name)
            record = self.records.get(name)
            if record is None:
                continue
            if record.running is None and is_running(pod):
                record.running = now
                record.node = str(pod["spec"].get("nodeName") or "")
        with self.lock:
            records = list(self.records.values())
        for record in records:
            done = record.deleted is not None and record.gone is None
            if record.created_ok and done and record.name not in present:
                record.gone = now
                if record.named_claim:
                    self._delete_claim(record)

    def why(self, record: PodRecord) -> str:
        """The reason the API gives for a pod not running: its status, else its Events."""
        try:
            pod = self.client.get(self._path("v1", "pods", record.name))
        except kube.KubeError:
            return ""
        record.node = record.node or str(pod["spec"].get("nodeName") or "")
        reason = status_reason(pod)
        if reason:
            return reason
        try:
            events = self.client.list(
                self._path("v1", "events"),
                field_selector=f"involvedObject.name={record.name}",
            )
        except kube.KubeError:
            return ""
        warnings = [e for e in events if e.get("type") == "Warning"]
        if warnings:
            last = max(warnings, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime")))
            return f"Event {last.get('reason')}: {last.get('message', '')}"[:300]
        return ""

    # ----- canaries ---------------------------------------------------------------------------

    def canary(
        self,
        kind: str,
        *,
        node: str = "",
        timeout: float = 300.0,
        on_retry: Callable[[], None] | None = None,
    ) -> float | None:
        """Create a canary of `kind` (retrying the create until the API takes it) and wait until
        it runs; the time from the call to Running, or None after `timeout`. The canary is
        deleted afterwards."""
        started = time.monotonic()
        deadline = started + timeout
        record: PodRecord | None = None
        try:
            while time.monotonic() < deadline:
                record = self.create(kind, canary=True, node=node)
                if record.created_ok:
                    break
                if on_retry is not None:
                    on_retry()
                time.sleep(0.5)
            else:
                return None
            while time.monotonic() < deadline:
                if record.running is not None:
                    return record.running - started
                with contextlib.suppress(kube.KubeError):
                    pod = self.client.get(self._path("v1", "pods", record.name))
                    if is_running(pod):
                        record.running = time.monotonic()
                        record.node = str(pod["spec"].get("nodeName") or "")
                        return record.running - started
                time.sleep(0.25)
            return None
        finally:
            if record is not None and record.created_ok:
                self.delete(record)

    # ----- the ledger -------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        with self.lock:
            records = [r for r in self.records.values() if not r.canary]
        by_kind: dict[str, dict[str, int]] = {}
        for r in records:
            counts = by_kind.setdefault(
                r.kind, {"created": 0, "ran": 0, "refused": 0, "not_created": 0, "gave_up": 0}
            )
            if not r.created_ok:
                counts["refused" if r.refused else "not_created"] += 1
                continue
            counts["created"] += 1
            if r.running is not None:
                counts["ran"] += 1
            elif r.given_up_reason:
                counts["gave_up"] += 1
        starts = [r.running - r.created for r in records if r.running is not None]
        starts.sort()
        return {
            "pods": len(records),
            "by_kind": by_kind,
            "create_to_running_p50_s": round(starts[len(starts) // 2], 2) if starts else None,
            "create_to_running_max_s": round(starts[-1], 2) if starts else None,
            "loop_errors": self.errors[-5:],
        }


def spread_kinds(kinds: dict[str, int], only: list[str] | None) -> dict[str, int]:
    """The churn's kind weights restricted to `only` (all when None)."""
    return {k: w for k, w in kinds.items() if only is None or k in only}


def quiet_namespace(client: KubeClient, namespace: str, timeout: float = 120.0) -> bool:
    """Delete every pod of `namespace` (grace 0) and wait until none is left."""
    deadline = time.monotonic() + timeout
    path = kube.path("v1", "pods", namespace=namespace)
    while time.monotonic() < deadline:
        try:
            pods = client.list(path)
        except kube.KubeError:
            time.sleep(1)
            continue
        if not pods:
            return True
        for pod in pods:
            with contextlib.suppress(kube.KubeError):
                client.request(
                    "DELETE",
                    kube.path("v1", "pods", pod["metadata"]["name"], namespace=namespace),
                    query={"gracePeriodSeconds": 0},
                )
        time.sleep(1)
    return False
