"""Keeps this node's ResourceSlices in the API server equal to what its GPUs say.

Run by the kubelet plugin (`kubelet_plugin.main`) in a background thread for its own node:
`SlicePublisher(client, driver=..., node_name=...).run(discover, stop)`. Each sync builds the
desired slices (`dra_driver.slices`, pure), lists what the API holds for this driver and node, and
applies a plan (`plan_sync`, pure) that creates missing slices, replaces changed ones and deletes
extras.

Rules that keep it cheap and correct:
- Write only on a real change: slices are compared by their spec content (quantities by value,
  generation and server metadata ignored), so a restarted plugin with the same GPUs writes nothing.
- Any change bumps the pool generation, and every slice of the pool is rewritten with it (with the
  right `resourceSliceCount`): consumers use only the highest generation, so a half-written pool
  is never mistaken for a complete one. New and updated slices go first, deletions last.
- Failures (API server unreachable, conflicts, a Node not yet registered) are retried with capped,
  jittered exponential backoff (`kubelet_plugin.backoff`); the loop converges whenever the server is
  reachable again.
- Never a rewrite loop: a server that stores a slice differently from what was written (a field
  dropped by a disabled feature gate the start-up probe in `kubelet_plugin.api_support` does not
  cover) is reported once, and that content is not written again until the desired slices change.
- Supervised (`dra_driver.supervision`): `run` beats its `Loop` after every sync attempt, and
  counts the attempts that raised something unexpected (logged with the traceback) as the loop's
  failures; a sync that never returns is a stall (`kubelet_plugin.monitoring` sets the deadline).
- Someone else's deletion is repaired at once, not at the next resync: `watch_pool` watches this
  node's slices of this driver and wakes the publisher when one is deleted or changed. The kubelet
  deletes every slice of its node when it starts (a driver is unusable until it registers again),
  possibly after the plugin registered, so without the watch a restarted kubelet left the node
  without slices for up to a resync period (seen in the fault run, docs/reliability.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver import kube, slices
from dra_driver.gpu import NodeInventory
from dra_driver.kube import RESOURCE_API, KubeClient, KubeError
from dra_driver.supervision import Loop
from kubelet_plugin.api_support import whole_device_slice
from kubelet_plugin.backoff import Backoff

log = logging.getLogger(__name__)

JSON = dict[str, Any]
SLICES = "resourceslices"
WATCH_TIMEOUT_S = 300  # the server ends each watch after this; the loop lists and watches again
# The watch loop's deadline: a watch stream ends within WATCH_TIMEOUT_S (+30 s read margin) and a
# list takes one API timeout; between them at most one backoff.
WATCH_DEADLINE_S = WATCH_TIMEOUT_S + 30.0 + 3 * kube.DEFAULT_TIMEOUT_S + 60.0


@dataclass(frozen=True)
class SyncPlan:
    """What one sync must write: `generation` is the pool generation after the sync."""

    generation: int
    create: list[JSON] = field(default_factory=list)
    update: list[JSON] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def writes(self) -> bool:
        return bool(self.create or self.update or self.delete)


def _generation(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def plan_sync(desired: Sequence[JSON], existing: Sequence[JSON]) -> SyncPlan:
    """Decide the writes that turn `existing` (as listed) into `desired` (from the builder).

    Nothing to do when the names match, every slice has the desired content and all existing
    slices agree on one generation. Otherwise the pool moves to max(existing generation) + 1:
    every desired slice is created or replaced with that generation (replacements carry the
    listed resourceVersion, so a concurrent writer makes us retry instead of overwriting), and
    slices no longer desired are deleted.
    """
    by_name = {str(obj["metadata"]["name"]): obj for obj in existing}
    generations = {_generation(obj) for obj in existing}
    current = max(generations, default=0)
    desired_names = slices.names_of(desired)
    unchanged = (
        set(desired_names) == set(by_name)
        and len(generations) <= 1
        and all(
            slices.same_content(obj, by_name[name])
            for obj, name in zip(desired, desired_names, strict=True)
        )
    )
    if unchanged:
        return SyncPlan(generation=current)
    generation = current + 1
    plan = SyncPlan(generation=generation)
    for obj, name in zip(desired, desired_names, strict=True):
        stamped = _with_generation(obj, generation)
        if name in by_name:
            current_meta = by_name[name].get("metadata") or {}
            if current_meta.get("resourceVersion"):
                stamped["metadata"]["resourceVersion"] = current_meta["resourceVersion"]
            # Labels and annotations other tools added survive our rewrite; ours win on clashes.
            stamped["metadata"]["labels"] = {
                **(current_meta.get("labels") or {}),
                **(stamped["metadata"].get("labels") or {}),
            }
            if current_meta.get("annotations"):
                stamped["metadata"]["annotations"] = dict(current_meta["annotations"])
            plan.update.append(stamped)
        else:
            plan.create.append(stamped)
    plan.delete.extend(sorted(set(by_name) - set(desired_names)))
    return plan


def _fingerprint(desired: Sequence[JSON]) -> str:
    """The content of `desired` as the comparison sees it (names, specs, owners)."""
    return json.dumps(
        [
            [o["metadata"]["name"], slices.comparable_spec(o["spec"]), slices.owner_uids(o)]
            for o in desired
        ],
        sort_keys=True,
        default=str,
    )


def _with_generation(obj: JSON, generation: int) -> JSON:
    spec = dict(obj["spec"])
    spec["pool"] = {**spec["pool"], "generation": generation}
    return {**obj, "metadata": dict(obj["metadata"]), "spec": spec}


class SlicePublisher:
    """Publishes one node's pool for one driver. Not thread-safe: one publisher per thread."""

    def __init__(
        self,
        client: KubeClient,
        *,
        driver: str,
        node_name: str,
        oversubscription_ratio: float = 1.0,
        backoff: Backoff | None = None,
        max_devices_per_slice: int = slices.MAX_DEVICES_PER_SLICE,
        on_sync: Callable[[str], None] | None = None,
        whole_devices: bool = False,
        taints: Callable[[], Mapping[str, Sequence[JSON]]] | None = None,
        binding_conditions: bool = False,
    ) -> None:
        self._on_sync = on_sync  # told each sync's outcome: written, unchanged or error
        slices.scaled_memory(1 << 30, oversubscription_ratio)  # validate the ratio up front
        self._client = client
        self._driver = driver
        self._node_name = node_name
        self._ratio = oversubscription_ratio
        self._backoff = backoff or Backoff()
        self._per_slice = max_devices_per_slice
        # The server drops consumable capacity (kubelet_plugin.api_support): publish whole GPUs.
        self._whole_devices = whole_devices
        # Fingerprint of desired slices the server altered on write (a loop guard for fields the
        # start-up probe does not know about); None when the last write was stored as sent.
        self._altered_by_server: str | None = None
        self._taints = taints
        self._binding_conditions = binding_conditions
        self.generation = 0
        """Pool generation after the last successful sync (0 before the first)."""

    @property
    def field_selector(self) -> str:
        return pool_selector(self._driver, self._node_name)

    def desired(self, inventory: NodeInventory) -> list[JSON]:
        """The slices for `inventory`, owned by the Node as it exists right now."""
        node = self._client.get(kube.path("v1", "nodes", self._node_name))
        built = slices.build_slices(
            inventory,
            driver=self._driver,
            node_name=self._node_name,
            node_uid=str((node.get("metadata") or {}).get("uid") or ""),
            oversubscription_ratio=self._ratio,
            max_devices_per_slice=self._per_slice,
            taints=self._taints() if self._taints is not None else None,
            binding_conditions=self._binding_conditions,
        )
        if self._whole_devices:
            return [whole_device_slice(obj) for obj in built]
        return built

    def existing(self) -> list[JSON]:
        return self._client.list(
            kube.path(RESOURCE_API, SLICES), field_selector=self.field_selector
        )

    def sync(self, inventory: NodeInventory) -> bool:
        """Make the API match `inventory` once; True if anything was written.

        Raises KubeError (the caller retries): NotFound when the Node does not exist yet, Conflict
        when someone else changed a slice between our list and our write, Unreachable, ...
        """
        desired = self.desired(inventory)
        if self._altered_by_server == _fingerprint(desired):
            return False  # the server changes this content on every write: do not loop
        plan = plan_sync(desired, self.existing())
        collection = kube.path(RESOURCE_API, SLICES)
        altered = []
        for obj in plan.create:
            if not slices.same_content(obj, self._client.create(collection, obj)):
                altered.append(obj["metadata"]["name"])
        for obj in plan.update:
            path = kube.path(RESOURCE_API, SLICES, obj["metadata"]["name"])
            if not slices.same_content(obj, self._client.replace(path, obj)):
                altered.append(obj["metadata"]["name"])
        for name in plan.delete:
            self._client.delete(kube.path(RESOURCE_API, SLICES, name))
        self.generation = plan.generation
        self._altered_by_server = _fingerprint(desired) if altered else None
        if altered:
            log.error(
                "the API server stored %s differently from what was written (fields dropped by a "
                "disabled feature gate?); not rewriting this content until the GPUs change",
                ", ".join(altered),
            )
        if plan.writes:
            log.info(
                "published pool %s generation %d: %d created, %d updated, %d deleted",
                self._node_name,
                plan.generation,
                len(plan.create),
                len(plan.update),
                len(plan.delete),
            )
        return plan.writes

    def _observe(self, outcome: str) -> None:
        if self._on_sync is not None:
            self._on_sync(outcome)

    def run(
        self,
        inventory_source: Callable[[], NodeInventory],
        stop: threading.Event,
        *,
        resync_s: float = 60.0,
        wake: threading.Event | None = None,
        loop: Loop | None = None,
    ) -> None:
        """Sync now, then every `resync_s` seconds (or as soon as `wake` is set), until `stop`.

        A failed sync (inventory or API) is logged and retried after a backoff delay; the loop
        never dies on an error, because a node whose slices silently stop updating is worse than
        one that keeps saying what is wrong. Each attempt beats `loop`; an unexpected error
        counts as its failure.
        """
        while not stop.is_set():
            failed = False
            try:
                self._observe("written" if self.sync(inventory_source()) else "unchanged")
            except (KubeError, slices.SliceError, OSError) as exc:
                delay = self._backoff.next_delay()
                log.warning("slice sync failed (retry in %.1fs): %s", delay, exc)
                self._observe("error")
            except Exception as exc:  # inventory errors and anything unforeseen: keep running
                failed = True
                delay = self._backoff.next_delay()
                log.exception("slice sync failed unexpectedly (retry in %.1fs): %s", delay, exc)
                self._observe("error")
            else:
                self._backoff.reset()
                delay = resync_s
            if loop is not None:
                loop.beat(failed=failed)
            _wait(stop, wake, delay)


def pool_selector(driver: str, node_name: str) -> str:
    """The field selector of one node's slices of one driver (what the Node authorizer lets a
    node list and watch)."""
    return f"spec.driver={driver},spec.nodeName={node_name}"


def watch_pool(
    client: KubeClient,
    selector: str,
    wake: threading.Event,
    stop: threading.Event,
    *,
    loop: Loop | None = None,
    backoff: Backoff | None = None,
) -> None:
    """Set `wake` whenever a slice matching `selector` is deleted or modified, until `stop`.

    Our own writes wake the publisher too; its next sync then finds nothing to write (one LIST).
    A watch that ends (the server's timeout, a dropped connection, a too-old version) is started
    again from a fresh list; after a list, `wake` is set as well, since events may have been
    missed in between. Beats `loop` on every event and every list.
    """
    backoff = backoff or Backoff()
    collection = kube.path(RESOURCE_API, SLICES)
    while not stop.is_set():
        try:
            _, version = client.list_versioned(collection, field_selector=selector)
            wake.set()
            if loop is not None:
                loop.beat()
            for event in client.watch(
                collection, version, timeout_s=WATCH_TIMEOUT_S, field_selector=selector
            ):
                if stop.is_set():
                    return
                if event.get("type") in ("DELETED", "MODIFIED"):
                    wake.set()
                if loop is not None:
                    loop.beat()
            backoff.reset()
        except KubeError as exc:  # Gone, Unreachable, Forbidden: list again after a pause
            delay = backoff.next_delay()
            log.debug("slice watch ended (again in %.1fs): %s", delay, exc)
            if loop is not None:
                loop.beat()
            stop.wait(delay)
        except Exception as exc:  # unforeseen: the loop's failure, and the watch goes on
            delay = backoff.next_delay()
            log.exception("slice watch failed unexpectedly (again in %.1fs): %s", delay, exc)
            if loop is not None:
                loop.beat(failed=True)
            stop.wait(delay)


def _wait(stop: threading.Event, wake: threading.Event | None, delay: float) -> None:
    """Sleep `delay` seconds, less if `stop` or `wake` is set (a wake is consumed)."""
    if wake is None:
        stop.wait(delay)
        return
    deadline = time.monotonic() + delay
    while not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if wake.wait(min(remaining, 0.25)):
            wake.clear()
            return
