"""Leader election over an in-memory Lease with the API server's optimistic concurrency, on a
fake clock.

Proves: the first replica creates and holds the Lease; a second stays standby while it is
renewed; a holder that stops renewing loses `is_leader()` after the renew deadline, before a
standby may take over after the lease duration; two standbys racing for an expired Lease cannot
both win (the stale write gets 409); a released Lease is taken at once; bad timings are refused;
a replica that stopped making progress gives the Lease up and does not campaign; a round that
raises does not end the elector.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from controller.leader import LeaderElector
from dra_driver import kube
from dra_driver.supervision import Supervisor
from tests.unit.controller.fakes import Leases
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(leases: Leases, clock: Clock, identity: str, **options: Any) -> LeaderElector:
    timings = {"lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2}
    return LeaderElector(
        leases,  # type: ignore[arg-type]
        namespace="ns",
        name="lease",
        identity=identity,
        clock=clock,
        **{**timings, **options},
    )


def holder(leases: Leases) -> str:
    (lease,) = leases.objects.values()
    return str(lease["spec"]["holderIdentity"])


def test_one_leader_standby_waits_for_expiry() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.step() and holder(leases) == "a"
    assert a.is_leader()
    assert not b.step()
    for _ in range(10):  # a renews every 2s: b never gets it
        clock.now += 2
        assert a.step()
        assert not b.step()
    # a stops renewing (hung or partitioned): it steps down after the renew deadline ...
    clock.now += 10
    assert not a.is_leader()
    # ... while b, which last saw a change 10s ago, still waits for the lease duration.
    assert not b.step()
    clock.now += 5
    assert b.step() and holder(leases) == "b"
    assert (
        leases.objects["/apis/coordination.k8s.io/v1/namespaces/ns/leases/lease"]["spec"][
            "leaseTransitions"
        ]
        == 1
    )
    assert not a.step()


def test_racing_standbys_cannot_both_win() -> None:
    leases, clock = Leases(), Clock()
    a, b, c = (elector(leases, clock, n) for n in "abc")
    assert a.step()
    assert not b.step() and not c.step()
    clock.now += 16
    # b and c both read the expired lease; b writes first, c's write carries a stale version.
    path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lease"
    stale = leases.get(path)
    assert b.step()
    with pytest.raises(kube.Conflict):
        leases.replace(path, {**stale, "spec": {**stale["spec"], "holderIdentity": "c"}})
    assert not c.step()
    assert holder(leases) == "b"


def test_a_released_lease_is_taken_at_once() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.step()
    assert not b.step()
    a.release()
    assert holder(leases) == "" and not a.is_leader()
    assert b.step() and holder(leases) == "b"


def test_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(
            Leases(),  # type: ignore[arg-type]
            namespace="ns",
            name="l",
            identity="x",
            lease_duration_s=10,
            renew_deadline_s=10,
        )


def test_a_replica_that_stopped_making_progress_gives_the_lease_up() -> None:
    """A stuck leader (its worker stalled: `fit()` false) releases at once, so a standby takes
    over on its next round instead of after the lease duration; while unfit it never campaigns."""
    leases, clock = Leases(), Clock()
    fit = {"a": True}
    a = elector(leases, clock, "a", fit=lambda: fit["a"])
    b = elector(leases, clock, "b")
    assert a.step() and not b.step()
    fit["a"] = False
    assert not a.step()
    assert holder(leases) == "" and not a.is_leader()
    assert b.step() and holder(leases) == "b"  # at once, no expiry wait
    clock.now += 60  # b stops renewing; a, still unfit, does not take the expired Lease
    assert not a.step() and holder(leases) == "b"


def test_a_round_that_raises_does_not_end_the_elector() -> None:
    """The elector's thread survives a round that raises what nobody expected (counted)."""

    class Flaky(Leases):
        calls = 0

        def get(self, path: str, **kw: Any) -> JSON:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("a bug in one round")
            return super().get(path, **kw)

    supervisor = Supervisor()
    leases = Flaky()
    timings = {"lease_duration_s": 3, "renew_deadline_s": 2, "retry_period_s": 0.05}
    a = elector(leases, time.monotonic, "a", supervisor=supervisor, **timings)  # type: ignore[arg-type]
    stop = threading.Event()
    a.start(stop)
    try:
        wait_for("leadership", a.is_leader, timeout=10, interval=0.01)
        assert supervisor.failures() == {"leader-election": 1}
        assert supervisor.stalled() == []
    finally:
        stop.set()
        a.join(5)
    assert holder(leases) == ""  # released on the way out
