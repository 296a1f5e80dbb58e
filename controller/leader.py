"""Leader election on a `coordination.k8s.io/v1` Lease, so that only one replica allocates.

Why hand-written: the Python `kubernetes` package's leader election drives ConfigMap/Lease objects
through its typed clients and runs callbacks in threads it owns; what is needed here is a few
dozen lines over the JSON seam (`dra_driver.kube`) with a state the reconciler can ask before
every write.

The protocol is the one client-go uses:
- a replica holds the Lease while `spec.holderIdentity` is its identity; every update carries
  the `resourceVersion` it read, so two replicas racing for an expired Lease cannot both win
  (the loser gets 409 Conflict);
- expiry is judged on the local clock from when this replica last saw the record change (never
  by comparing the holder's timestamps with ours, which would trust clock agreement);
- the leader renews every `retry_period_s`; if it cannot renew for `renew_deadline_s` (shorter
  than `lease_duration_s`) it steps down at once, so it stops allocating before any standby can
  take over;
- on shutdown the leader releases the Lease (empty holder), so a standby takes over at once;
- a replica whose other loops stopped making progress (`fit()` false: the worker is stuck) does
  not campaign, and a leader in that state releases the Lease at once: a stuck leader must not
  keep renewing while nobody places pods (client-go ties this to its health checker too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dra_driver import kube
from dra_driver.supervision import Supervisor

log = logging.getLogger(__name__)

JSON = dict[str, Any]
LEASE_API = "coordination.k8s.io/v1"


def _micro_time(now: datetime | None = None) -> str:
    """The API's MicroTime format."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease from a thread; `is_leader()` is safe to call from any thread."""

    def __init__(
        self,
        client: kube.KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fit: Callable[[], bool] = lambda: True,
        supervisor: Supervisor | None = None,
    ) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need retry period < renew deadline < lease duration")
        self._client = client
        self._path = kube.path(LEASE_API, "leases", name, namespace=namespace)
        self._collection = kube.path(LEASE_API, "leases", namespace=namespace)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._on_change = on_change
        self._clock = clock
        self._fit = fit
        # A round is a GET and a PUT (each bounded by the client's timeout): far below this.
        self._loop = (supervisor or Supervisor()).register(
            "leader-election", max(60.0, 4 * lease_duration_s)
        )
        self._lock = threading.Lock()
        self._leader = False
        self._renewed_at = 0.0  # local time of our last successful acquire/renew
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._contacted_at: float | None = None  # last successful exchange with the API
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ state

    def is_leader(self) -> bool:
        """True while this replica holds a Lease it renewed within the renew deadline."""
        with self._lock:
            return self._leader and self._clock() - self._renewed_at < self.renew_deadline_s

    def healthy(self) -> bool:
        """Leader, or a standby that reached the Lease within one lease duration."""
        with self._lock:
            contacted = self._contacted_at
        return self.is_leader() or (
            contacted is not None and self._clock() - contacted < self.lease_duration_s
        )

    def _set_leader(self, value: bool) -> None:
        with self._lock:
            changed = self._leader != value
            self._leader = value
        if changed:
            log.info(
                "%s leadership of lease %s/%s",
                "acquired" if value else "lost",
                self.namespace,
                self.name,
            )
            if self._on_change is not None:
                self._on_change(value)

    # ------------------------------------------------------------ one round

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        now = self._clock()
        try:
            lease = self._client.get(self._path)
        except kube.NotFound:
            return self._create(now)
        except kube.KubeError as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        self._mark_contact(now)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # held by someone else and not expired
        stamp = _micro_time()
        new_spec = dict(spec)
        new_spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_duration_s),
            renewTime=stamp,
        )
        if holder != self.identity:
            new_spec["acquireTime"] = stamp
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            self._client.replace(self._path, {**lease, "spec": new_spec})
        except kube.KubeError as exc:  # Conflict: another replica wrote first
            log.debug("lease %s/%s update lost: %s", self.namespace, self.name, exc)
            return False
        with self._lock:
            self._renewed_at = now
        return True

    def _create(self, now: float) -> bool:
        stamp = _micro_time()
        lease = {
            "apiVersion": LEASE_API,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration_s),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        try:
            self._client.create(self._collection, lease)
        except kube.KubeError as exc:  # AlreadyExists: another replica created it first
            log.debug("lease %s/%s create lost: %s", self.namespace, self.name, exc)
            return False
        self._mark_contact(now)
        with self._lock:
            self._renewed_at = now
        return True

    def _mark_contact(self, now: float) -> None:
        with self._lock:
            self._contacted_at = now

    # ------------------------------------------------------------ the loop

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="leader", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def step(self) -> bool:
        """One round: acquire or renew, step down when that failed past the renew deadline or
        another replica holds the Lease; True while leader."""
        if not self._fit():
            if self._leader:
                log.error(
                    "this replica stopped making progress; giving lease %s/%s up",
                    self.namespace,
                    self.name,
                )
                self.release()
            return False
        if self.try_acquire_or_renew():
            self._set_leader(True)
        elif self._leader and not self.is_leader():
            self._set_leader(False)  # could not renew within the deadline
        elif self._leader and self._observed and self._observed[0] != self.identity:
            self._set_leader(False)  # someone else holds it now
        return self.is_leader()

    def _run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self._loop.step(self.step)
                stop.wait(self.retry_period_s)
            self.release()
        finally:
            self._loop.end(stopped=stop.is_set())

    def release(self) -> None:
        """Give the Lease up (empty holder) if this replica holds it, so a standby need not
        wait for it to expire."""
        if not self._leader:
            return
        self._set_leader(False)
        try:
            lease = self._client.get(self._path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1}
            self._client.replace(self._path, {**lease, "spec": spec})
            log.info("released lease %s/%s", self.namespace, self.name)
        except kube.KubeError as exc:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, exc)
