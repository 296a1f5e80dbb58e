"""The allocation controller's one worker: informer events in, decisions out, in one thread.

Why one thread: the allocator's model is mutated by every event and read by every decision; with
a single consumer of one queue a decision always sees a consistent cluster. Only the API writes
of placed pods leave this thread (the reconciler's `--write-concurrency` pool, under its one
lock); every write of a pass has finished before the pass ends and the next events are applied.
Informers (one thread each) only enqueue; the worker drains everything queued, then reconciles
the pods those changes made worth another look, then lets the rescheduler (when on) handle the
pods whose prepare failed and whose grace time is over. Allocations awaiting their binding
condition are confirmed (or failed as overbooked) in the same pass (`controller.confirmer`).
Standby replicas keep the model current too, so a new leader starts deciding at once, after
reading every claim again (`resync_claims`).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from controller.confirmer import Confirmer
from controller.informers import ALL, POD_WARNINGS, Informer
from controller.reconciler import Reconciler
from controller.rescheduler import Rescheduler
from dra_driver import kube

log = logging.getLogger(__name__)

JSON = dict[str, Any]
_LEADER: tuple[str, str, JSON] = ("leader", "", {})


class Worker:
    def __init__(
        self,
        client: kube.KubeClient,
        reconciler: Reconciler,
        rescheduler: Rescheduler | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.rescheduler = rescheduler
        # Late-bound: leader election sets reconciler.may_write after the worker is built.
        self.confirmer = Confirmer(
            client,
            reconciler.model,
            reconciler.claims,
            reconciler.remember,
            may_write=lambda: reconciler.may_write(),  # noqa: PLW0108
        )
        self.queue: queue.Queue[tuple[str, str, JSON]] = queue.Queue()
        self.informers = [Informer(client, r, self._enqueue) for r in ALL]
        # Separate: allocation decides without it (it never blocks the policy path).
        self.warnings = (
            None if rescheduler is None else Informer(client, POD_WARNINGS, self._enqueue)
        )
        self._thread: threading.Thread | None = None
        self._resync = False  # a new leader reads every claim again before deciding

    def _enqueue(self, kind: str, op: str, obj: JSON) -> None:
        self.queue.put((kind, op, obj))

    def became_leader(self, leader: bool) -> None:
        """Leader-election callback (any thread): the worker resyncs claims, then decides."""
        if leader:
            self.queue.put(_LEADER)

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def start(self, stop: threading.Event) -> None:
        for informer in self.informers:
            informer.start(stop)
        if self.warnings is not None:
            self.warnings.start(stop)
        self._thread = threading.Thread(target=self._run, args=(stop,), name="worker", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        leading = False  # as of the last pass (the elector may release the Lease on stop first)
        while not stop.is_set():
            self._drain(timeout_s=0.5)
            if stop.is_set():
                break  # keep `leading` from the last pass before the stop
            if not self.synced():
                continue  # decide only over a complete picture
            try:
                if self._resync:
                    self.reconciler.resync_claims()
                    self._resync = False
                    self.reconciler.dirty |= set(self.reconciler.pods)
                    self.confirmer.dirty = True
                leading = self.reconciler.may_write()
                self.reconciler.reconcile()
                self.confirmer.run()  # only when a claim awaits confirmation
                if self.rescheduler is not None:
                    self.rescheduler.run()  # only pods whose grace time is over
            except kube.KubeError as exc:
                log.warning("reconcile: %s", exc)
                stop.wait(1.0)  # the API is failing: do not hammer it
        if leading:
            try:
                self.reconciler.drop_all_holds()
            except kube.KubeError as exc:
                log.warning("could not drop the placement holds on the way out: %s", exc)

    def _drain(self, timeout_s: float) -> None:
        """Apply everything queued (waiting up to `timeout_s` for the first item)."""
        try:
            item = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return
        while True:
            if item is _LEADER:
                self._resync = True
            else:
                self._apply(*item)
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, op: str, obj: JSON) -> None:
        try:
            if kind == POD_WARNINGS.kind:
                if self.rescheduler is not None:
                    self.rescheduler.on_event(op, obj)
                return
            self.reconciler.on_event(kind, op, obj)
            if kind == "ResourceClaim" and op != "delete":
                self.confirmer.on_claim(obj)
        except Exception:  # one malformed object must not stop the controller
            meta = obj.get("metadata") or {}
            log.exception("cannot take %s %s/%s", kind, meta.get("namespace"), meta.get("name"))
