"""What the validating webhook needs to know about the cluster's GPUs and DeviceClasses, kept
fresh in the background.

Why: "memory above any GPU in the cluster" and "unknown GPU type" can only be judged against the
published inventory, and an admission must not list every ResourceSlice on its hot path. The
facts are recomputed from the driver's ResourceSlices every `interval_s` by one thread; an
admission reads the last result (a failed refresh keeps the previous one).

The thread is the supervised loop `webhook-facts` (`dra_driver.supervision`): an API error is
logged in one line, anything else with its traceback and counted, and the next refresh follows a
backoff. One slice or class of an unexpected shape is skipped with a log line, never the
refresh: the other objects still count.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from controller.webhook.validation import ClusterFacts
from dra_driver import kube
from dra_driver.allocator.model import parse_quantity
from dra_driver.kube import RESOURCE_API
from dra_driver.supervision import Supervisor

log = logging.getLogger("vgpu-dra.webhook.facts")

JSON = dict[str, Any]
MIB = 1024 * 1024
LOOP = "webhook-facts"
# How long one refresh may take beyond its period before the loop counts as stalled: two lists,
# each bounded by the client's own timeout (30 s), and the arithmetic over them.
LOOP_STEP_DEADLINE_S = 300.0


def _slice_devices(obj: Any, driver: str) -> tuple[int, set[str]]:
    """Largest memory (MiB) and the product names of one ResourceSlice of `driver`."""
    largest = 0
    types: set[str] = set()
    spec = obj.get("spec") or {}
    if spec.get("driver") != driver:
        return largest, types
    for device in spec.get("devices") or []:
        attributes = device.get("attributes") or {}
        product = (attributes.get("productName") or {}).get("string")
        if product:
            types.add(str(product))
        memory = ((device.get("capacity") or {}).get("memory") or {}).get("value")
        try:
            size = int(parse_quantity(str(memory))) if memory is not None else 0
        except ValueError:
            size = 0
        if not size:
            size = int((attributes.get("memoryBytes") or {}).get("int") or 0)
        largest = max(largest, size // MIB)
    return largest, types


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("name")) if isinstance(meta, dict) else "?"


def facts_from(slices: Iterable[JSON], classes: Iterable[JSON], driver: str) -> ClusterFacts:
    """Largest allocatable memory (MiB) and the product names of the driver's devices, and the
    DeviceClasses that select the driver (their requests are checked against that memory). An
    object of an unexpected shape is skipped (logged): it cannot hide the others."""
    largest = 0
    types: set[str] = set()
    for obj in slices:
        try:
            size, found = _slice_devices(obj, driver)
        except (AttributeError, TypeError, ValueError) as exc:
            log.warning(
                "ResourceSlice %s skipped for validation: unexpected shape (%s)", _name(obj), exc
            )
            continue
        largest = max(largest, size)
        types |= found
    ours = {driver}  # the chart's first class is named after the driver
    for device_class in classes:
        try:
            selectors = (device_class.get("spec") or {}).get("selectors") or []
            if any(f'"{driver}"' in str((s.get("cel") or {}).get("expression")) for s in selectors):
                ours.add(str(device_class["metadata"]["name"]))
        except (AttributeError, TypeError, KeyError) as exc:
            log.warning(
                "DeviceClass %s skipped for validation: unexpected shape (%s)",
                _name(device_class),
                exc,
            )
    return ClusterFacts(
        largest_gpu_memory_mib=largest or None,
        gpu_types=frozenset(types),
        driver=driver,
        device_classes=frozenset(ours),
    )


class FactsCache:
    """The latest ClusterFacts, refreshed from the API server by a background thread."""

    def __init__(self, client: kube.KubeClient, driver: str) -> None:
        self._client = client
        self._driver = driver
        self._facts = facts_from((), (), driver)
        self._lock = threading.Lock()

    def current(self) -> ClusterFacts:
        with self._lock:
            return self._facts

    def refresh(self) -> None:
        slices = self._client.list(kube.path(RESOURCE_API, "resourceslices"))
        classes = self._client.list(kube.path(RESOURCE_API, "deviceclasses"))
        facts = facts_from(slices, classes, self._driver)
        with self._lock:
            self._facts = facts

    def run(
        self,
        stop: threading.Event,
        interval_s: float,
        *,
        supervisor: Supervisor | None = None,
    ) -> threading.Thread:
        """Refresh now and every `interval_s` until `stop`, as the supervised loop
        `webhook-facts` of `supervisor` (a private one when None)."""
        return (supervisor or Supervisor()).run(
            LOOP,
            self.refresh,
            stop,
            period_s=interval_s,
            deadline_s=interval_s + LOOP_STEP_DEADLINE_S,
            expected=(kube.KubeError,),
        )
