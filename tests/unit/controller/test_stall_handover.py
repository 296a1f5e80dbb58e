"""A stuck leader hands over: the wiring of controller/main.py, with a worker whose pass hangs.

Proves: while the leader's worker is stuck in a pass past its deadline, the supervisor names it,
the leader's elector gives the Lease up on its next round (it does not wait for the lease to
expire), the standby takes it on its next round, and the stuck replica does not campaign again
while stuck. The rounds are driven by hand on a fake clock (the elector's own loop is not started),
over the in-memory Lease of tests/unit/controller/fakes.py (optimistic concurrency included).
"""

from __future__ import annotations

import threading
from typing import Any

from controller.leader import LeaderElector
from controller.reconciler import Defaults, Reconciler
from controller.worker import WORKER_DEADLINE_S, Worker
from dra_driver.supervision import Supervisor
from tests.unit.controller.fakes import Leases
from vgpu_testbed.polling import wait_for


class NoApi:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected API call {name}")


def _replica(
    leases: Leases, identity: str, supervisor: Supervisor, now: list[float]
) -> LeaderElector:
    return LeaderElector(
        leases,  # type: ignore[arg-type]
        namespace="ns",
        name="lease",
        identity=identity,
        lease_duration_s=15,
        renew_deadline_s=10,
        retry_period_s=2,
        clock=lambda: now[0],
        fit=supervisor.healthy,  # as controller/main.py wires it
        supervisor=supervisor,
    )


def _round(elector: LeaderElector) -> bool:
    """One round as the elector's own loop makes it (a supervised step, a beat): leader after?"""
    elector._loop.step(elector.step)
    return elector.is_leader()


def test_a_leader_whose_worker_hangs_gives_the_lease_to_the_standby() -> None:
    now = [1000.0]
    leases = Leases()
    stuck = Supervisor(clock=lambda: now[0])
    reconciler = Reconciler(NoApi(), Defaults({}))  # type: ignore[arg-type]
    worker = Worker(NoApi(), reconciler, supervisor=stuck)  # type: ignore[arg-type]
    entered, release = threading.Event(), threading.Event()

    def hang() -> None:
        entered.set()
        release.wait(10)

    reconciler.reconcile = hang  # type: ignore[method-assign]
    leader = _replica(leases, "a", stuck, now)
    standby = _replica(leases, "b", Supervisor(clock=lambda: now[0]), now)
    assert _round(leader) and not _round(standby)

    for informer in worker.informers:
        informer.synced.set()
    stop = threading.Event()
    thread = threading.Thread(target=worker._run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert entered.wait(10)
        stalled_at = now[0] + WORKER_DEADLINE_S
        taken_at = None
        while now[0] < stalled_at + 30:  # both replicas run a round every retry period (2 s)
            now[0] += 2
            _round(leader)
            if _round(standby) and taken_at is None:
                taken_at = now[0]
            if now[0] <= stalled_at:
                assert leader.is_leader() and not standby.is_leader()  # slow is not stuck
        assert "worker" in stuck.stalled() and not leader.is_leader()
        assert taken_at is not None and taken_at - stalled_at <= 4  # a round, not 15 s of lease
        for _ in range(30):  # still stuck: it does not campaign
            now[0] += 2
            assert not _round(leader) and _round(standby)
        release.set()
        wait_for("the worker beating again", lambda: "worker" not in stuck.stalled(), timeout=10)
    finally:
        release.set()
        stop.set()
        thread.join(5)
