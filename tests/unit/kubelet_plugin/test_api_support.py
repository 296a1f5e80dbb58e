"""Version support (kubelet_plugin.api_support): reading the probe's echo, and the whole-device
form that a server without consumable capacity stores unchanged, so the publisher never loops."""

from __future__ import annotations

import copy
import threading
from typing import Any

from dra_driver import slices
from dra_driver.kube import Unreachable
from kubelet_plugin.api_support import (
    SliceForm,
    form_from_echo,
    probe_slice,
    wait_for_form,
    whole_device_slice,
)
from kubelet_plugin.backoff import Backoff
from kubelet_plugin.slice_publisher import plan_sync
from tests.fixtures.inventories import synthetic_inventory

JSON = dict[str, Any]


def stored_without_gate(obj: JSON, generation: int) -> JSON:
    """What an API server with DRAConsumableCapacity off keeps of a written slice: the two
    gated fields dropped (as its dropDisabledFields does), generation and metadata set."""
    kept = copy.deepcopy(obj)
    for device in kept["spec"]["devices"]:
        device.pop("allowMultipleAllocations", None)
        for capacity in device.get("capacity", {}).values():
            capacity.pop("requestPolicy", None)
    kept["spec"]["pool"]["generation"] = generation
    kept["metadata"]["resourceVersion"] = "7"
    return kept


def built() -> list[JSON]:
    return slices.build_slices(
        synthetic_inventory(2), driver="vgpu.dra.dev", node_name="node-1", node_uid="uid-1"
    )


def test_probe_echo_with_both_fields_means_shared() -> None:
    sent = probe_slice("vgpu.dra.dev", "node-1")
    assert form_from_echo(copy.deepcopy(sent)) is SliceForm.SHARED


def test_probe_echo_missing_either_field_means_whole() -> None:
    sent = probe_slice("vgpu.dra.dev", "node-1")
    assert form_from_echo(stored_without_gate(sent, 0)) is SliceForm.WHOLE
    only_policy_dropped = copy.deepcopy(sent)
    del only_policy_dropped["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]
    assert form_from_echo(only_policy_dropped) is SliceForm.WHOLE


def test_shared_form_on_a_server_without_the_gate_would_rewrite_forever() -> None:
    # The bug this module prevents: the read-back never equals what was written.
    desired = built()
    assert plan_sync(desired, [stored_without_gate(o, 1) for o in desired]).writes


def test_whole_form_is_stored_unchanged_so_a_resync_writes_nothing() -> None:
    desired = [whole_device_slice(o) for o in built()]
    plan = plan_sync(desired, [stored_without_gate(o, 1) for o in desired])
    assert not plan.writes
    for obj in desired:
        for device in obj["spec"]["devices"]:
            assert "allowMultipleAllocations" not in device
            assert all("requestPolicy" not in c for c in device["capacity"].values())
            # Capacities stay published as plain values (whole GPUs still say their size).
            assert set(device["capacity"]) == {"memory", "cores"}


def test_whole_device_slice_leaves_its_input_alone() -> None:
    original = built()
    before = copy.deepcopy(original)
    whole_device_slice(original[0])
    assert original == before


class FlakyServer:
    """Answers the probe's POST after `failures` unreachable attempts; records the query."""

    def __init__(self, failures: int, echo: JSON | None = None) -> None:
        self.failures = failures
        self.echo = echo
        self.queries: list[Any] = []

    def request(self, method: str, path: str, **kwargs: Any) -> JSON:
        self.queries.append((method, path, kwargs.get("query")))
        if self.failures:
            self.failures -= 1
            raise Unreachable(0, "Unreachable", "connection refused")
        return self.echo if self.echo is not None else copy.deepcopy(kwargs["body"])


def test_wait_for_form_retries_until_the_server_answers_with_a_dry_run() -> None:
    server = FlakyServer(failures=2)
    form = wait_for_form(
        server,  # type: ignore[arg-type]
        driver="vgpu.dra.dev",
        node_name="node-1",
        stop=threading.Event(),
        backoff=Backoff(initial_s=0.001, maximum_s=0.001),
    )
    assert form is SliceForm.SHARED
    assert (
        server.queries
        == [("POST", "/apis/resource.k8s.io/v1/resourceslices", {"dryRun": "All"})] * 3
    )


def test_wait_for_form_gives_up_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    server = FlakyServer(failures=0)
    assert wait_for_form(server, driver="d", node_name="n", stop=stop) is None  # type: ignore[arg-type]
    assert server.queries == []
