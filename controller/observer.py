"""What the reconciler reports about each decision, for metrics (`controller.metrics`).

Why a module of its own: the reconciler should not know about Prometheus, and tests and a
controller without `--metrics-address` need an observer that does nothing. The reconciler calls
one method per decision outcome; everything else the metrics show (pending pods, allocated vs
capacity, fragmentation, informer health) is read from the controller's state at scrape time.

Outcomes (the `reason` of a refusal or failure is the one the Placement condition and Event use):
- `placed`: the pod's claims were written and its gate lifted;
- `refused`: no placement (`Unschedulable`, `InvalidRequest`, `ClaimAllocatedElsewhere`); the
  pod waits for a change;
- `failed`: the decision could not complete and is retried (`Conflict`: a claim changed or was
  deleted under it, or leadership was lost mid-decision; `ApiError`: the API failed).
"""

from __future__ import annotations

from typing import Protocol


class DecisionObserver(Protocol):
    def placed(self, seconds: float) -> None: ...

    def refused(self, reason: str, seconds: float) -> None: ...

    def failed(self, reason: str, seconds: float) -> None: ...


class NullObserver:
    """Observes nothing (metrics off)."""

    def placed(self, seconds: float) -> None:
        pass

    def refused(self, reason: str, seconds: float) -> None:
        pass

    def failed(self, reason: str, seconds: float) -> None:
        pass


NO_OBSERVER = NullObserver()
