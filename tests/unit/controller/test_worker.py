"""The worker's routing: Events go to the rescheduler (never into the allocator's model), claims
awaiting a binding condition wake the confirmer, and the Events informer is apart from the ones
allocation waits for (a controller without the right to watch Events still allocates)."""

from __future__ import annotations

from typing import Any

from controller.confirmer import CONFIRMED
from controller.reconciler import Defaults, Reconciler
from controller.rescheduler import Rescheduler
from controller.worker import Worker


class NoApi:
    """Nothing here may reach the API."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected API call {name}")


def test_events_claims_and_informers_are_routed_apart() -> None:
    api = NoApi()
    reconciler = Reconciler(api, Defaults({}))  # type: ignore[arg-type]
    rescheduler = Rescheduler(api, ["vgpu.dra.dev"], may_write=lambda: False)  # type: ignore[arg-type]
    worker = Worker(api, reconciler, rescheduler)  # type: ignore[arg-type]
    assert worker.warnings is not None and worker.warnings not in worker.informers
    event = {
        "metadata": {"name": "e", "namespace": "t", "uid": "ev"},
        "reason": "PrepareOverbooked",
        "involvedObject": {"kind": "Pod", "namespace": "t", "name": "p", "uid": "pod-uid"},
    }
    worker._apply("Event", "apply", event)
    assert rescheduler.next_due() is not None
    pending = {
        "metadata": {"name": "c", "namespace": "t", "uid": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": "vgpu.dra.dev",
                            "pool": "n",
                            "device": "gpu-0",
                            "bindingConditions": [CONFIRMED],
                        }
                    ]
                }
            }
        },
    }
    assert not worker.confirmer.dirty
    worker._apply("ResourceClaim", "apply", pending)
    assert worker.confirmer.dirty
    assert ("t", "c") in reconciler.claims
    without = Worker(api, Reconciler(api, Defaults({})))
    assert without.warnings is None
    without._apply("Event", "apply", event)  # dropped: no rescheduler
