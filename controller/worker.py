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

Supervision (`dra_driver.supervision`): one object that breaks a parser costs that object (logged,
skipped) and one pod whose decision raises costs that pod (an InternalError Event, the reconciler's
`_guarded`); the reconciler, the confirmer and the rescheduler each run as a supervised step of
the pass, so an exception in one is logged, counted and backed off without stopping the others.
The worker beats after every pass and every pod decided: a pass stuck past WORKER_DEADLINE_S
makes the replica unhealthy, and its elector gives the Lease up.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from typing import Any

from controller.confirmer import Confirmer
from controller.informers import ALL, POD_WARNINGS, Informer
from controller.reconciler import Reconciler
from controller.rescheduler import Rescheduler
from dra_driver import kube
from dra_driver.allocator.model import ModelError
from dra_driver.allocator.quantity import QuantityError
from dra_driver.supervision import BACKOFF_MAX_S, BACKOFF_START_S, Supervisor

log = logging.getLogger(__name__)

JSON = dict[str, Any]
_LEADER: tuple[str, str, JSON] = ("leader", "", {})
# No pass and no pod decided for this long is a stall: a pod's writes are a few API calls of at
# most kube.DEFAULT_TIMEOUT_S (30 s) each; a healthy idle worker beats every 0.5 s.
WORKER_DEADLINE_S = 120.0


class Worker:
    def __init__(
        self,
        client: kube.KubeClient,
        reconciler: Reconciler,
        rescheduler: Rescheduler | None = None,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.rescheduler = rescheduler
        self.supervisor = supervisor or Supervisor()
        self._loop = self.supervisor.register("worker", WORKER_DEADLINE_S)
        # The parts of a pass: failures are counted per part; progress is the worker's beat
        # (a part runs only over a synced picture, so it has no deadline of its own).
        self._parts = [
            (self.supervisor.register("reconciler", math.inf), self._reconcile),
            (self.supervisor.register("confirmer", math.inf), self._confirm),
        ]
        if rescheduler is not None:
            self._parts.append((self.supervisor.register("rescheduler", math.inf), rescheduler.run))
        reconciler.progress = self._loop.beat
        # Late-bound: leader election sets reconciler.may_write after the worker is built.
        self.confirmer = Confirmer(
            client,
            reconciler.model,
            reconciler.claims,
            reconciler.remember,
            may_write=lambda: reconciler.may_write(),  # noqa: PLW0108
        )
        self.queue: queue.Queue[tuple[str, str, JSON]] = queue.Queue()
        self.informers = [
            Informer(client, r, self._enqueue, supervisor=self.supervisor) for r in ALL
        ]
        # Separate: allocation decides without it (it never blocks the policy path).
        self.warnings = (
            None
            if rescheduler is None
            else Informer(client, POD_WARNINGS, self._enqueue, supervisor=self.supervisor)
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
        try:
            self._passes(stop)
        finally:
            self._loop.end(stopped=stop.is_set())  # only an early end is a stall

    def _passes(self, stop: threading.Event) -> None:
        leading = False  # as of the last pass (the elector may release the Lease on stop first)
        backoff = BACKOFF_START_S
        while not stop.is_set():
            self._loop.beat()
            self._drain(timeout_s=0.5)
            if stop.is_set():
                break  # keep `leading` from the last pass before the stop
            if not self.synced():
                continue  # decide only over a complete picture
            leading = self.reconciler.may_write()
            finished = [loop.step(part, expected=(kube.KubeError,)) for loop, part in self._parts]
            if all(finished):
                backoff = BACKOFF_START_S
                continue
            # An API failure or an unexpected exception (logged with its traceback and counted
            # by step_once): do not hammer the API or the log. Events keep queueing meanwhile.
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        if leading:
            try:
                self.reconciler.drop_all_holds()
            except kube.KubeError as exc:
                log.warning("could not drop the placement holds on the way out: %s", exc)

    def _reconcile(self) -> None:
        if self._resync:
            self.reconciler.resync_claims()
            self._resync = False
            self.reconciler.dirty |= set(self.reconciler.pods)
            self.confirmer.dirty = True
        self.reconciler.reconcile()

    def _confirm(self) -> None:
        self.confirmer.run()  # only when a claim awaits confirmation

    def _drain(self, timeout_s: float) -> None:
        """Apply everything queued (waiting up to `timeout_s` for the first item)."""
        try:
            item = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return
        applied = 0
        while True:
            if item is _LEADER:
                self._resync = True
            else:
                self._apply(*item)
                applied += 1
                if applied % 1000 == 0:
                    self._loop.beat()  # a first list of a large cluster is progress too
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
        except (ModelError, QuantityError) as exc:  # refused with a reason: no traceback
            meta = obj.get("metadata") or {}
            log.warning("%s %s/%s skipped: %s", kind, meta.get("namespace"), meta.get("name"), exc)
        except Exception:  # one malformed object must not stop the controller
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            meta = meta if isinstance(meta, dict) else {}
            log.exception("cannot take %s %s/%s", kind, meta.get("namespace"), meta.get("name"))
