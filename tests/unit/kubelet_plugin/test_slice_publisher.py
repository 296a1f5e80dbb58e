"""The publisher's pure decisions: the sync plan (create/update/delete, generation) and backoff."""

from __future__ import annotations

import copy
import random
import threading
from typing import Any

import pytest

from dra_driver import slices
from dra_driver.gpu import NodeInventory
from dra_driver.kube import Unreachable
from kubelet_plugin.backoff import Backoff
from kubelet_plugin.slice_publisher import plan_sync, pool_selector, watch_pool
from tests.fixtures.inventories import synthetic_inventory

GIB = 1 << 30


def desired(inv: NodeInventory, per_slice: int = 128) -> list[dict[str, Any]]:
    return slices.build_slices(
        inv,
        driver="vgpu.dra.dev",
        node_name="node-1",
        node_uid="uid-1",
        max_devices_per_slice=per_slice,
    )


def served(objs: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    """What the API would list after those objects were written at `generation`."""
    out = []
    for n, obj in enumerate(objs):
        copy_ = copy.deepcopy(obj)
        copy_["spec"]["pool"]["generation"] = generation
        copy_["metadata"]["resourceVersion"] = str(100 + n)
        copy_["metadata"]["uid"] = f"slice-{n}"
        out.append(copy_)
    return out


def test_first_sync_creates_everything_at_generation_one() -> None:
    plan = plan_sync(desired(synthetic_inventory(3)), [])
    assert plan.generation == 1
    assert [o["metadata"]["name"] for o in plan.create] == ["node-1-vgpu-dra-dev-0"]
    assert plan.create[0]["spec"]["pool"]["generation"] == 1
    assert not plan.update and not plan.delete and plan.writes


def test_unchanged_content_means_no_writes() -> None:
    want = desired(synthetic_inventory(3))
    plan = plan_sync(want, served(want, 4))
    assert not plan.writes
    assert plan.generation == 4


def test_a_change_bumps_the_generation_of_every_slice_in_the_pool() -> None:
    before = served(desired(synthetic_inventory(4), per_slice=2), 2)
    after = desired(synthetic_inventory(4, memory=16 * GIB), per_slice=2)
    plan = plan_sync(after, before)
    assert plan.generation == 3
    assert len(plan.update) == 2 and not plan.create and not plan.delete
    for obj, old in zip(plan.update, before, strict=True):
        assert obj["spec"]["pool"]["generation"] == 3
        # replacements carry the listed resourceVersion: a concurrent writer causes a conflict
        assert obj["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"]
    assert after[0]["spec"]["pool"]["generation"] == 0  # the plan does not mutate its input


def test_shrinking_deletes_extra_slices_and_updates_the_count() -> None:
    before = served(desired(synthetic_inventory(4), per_slice=2), 1)
    plan = plan_sync(desired(synthetic_inventory(2), per_slice=2), before)
    assert plan.generation == 2
    assert plan.delete == ["node-1-vgpu-dra-dev-1"]
    assert plan.update[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_mixed_generations_are_repaired_even_if_content_matches() -> None:
    want = desired(synthetic_inventory(4), per_slice=2)
    listed = served(want, 5)
    listed[1]["spec"]["pool"]["generation"] = 4  # a half-finished earlier sync
    plan = plan_sync(want, listed)
    assert plan.generation == 6 and len(plan.update) == 2


def test_foreign_slice_names_of_this_node_and_driver_are_removed() -> None:
    want = desired(synthetic_inventory(1))
    listed = served(want, 1)
    stale = copy.deepcopy(listed[0])
    stale["metadata"]["name"] = "node-1-old-naming-0"
    plan = plan_sync(want, [*listed, stale])
    assert plan.delete == ["node-1-old-naming-0"] and plan.generation == 2


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    backoff = Backoff(initial_s=1.0, maximum_s=8.0, jitter=0.2, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    for delay, base in zip(delays, [1, 2, 4, 8, 8, 8, 8, 8], strict=True):
        assert base * 0.8 <= delay <= min(8.0, base * 1.2)
    assert len(set(delays)) > 4  # jitter actually spreads the values
    backoff.reset()
    assert backoff.next_delay() <= 1.2


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s=0)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=1.5)


def test_run_survives_an_unreachable_api_server_with_growing_delays() -> None:
    import socket
    import threading

    from kubernetes import client as k8s

    from dra_driver.kube import KubeClient
    from kubelet_plugin.slice_publisher import SlicePublisher

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = k8s.Configuration()
    config.host = f"http://127.0.0.1:{port}"
    kube_client = KubeClient(k8s.ApiClient(config), timeout_s=2)
    backoff = Backoff(initial_s=0.01, maximum_s=0.05, rng=random.Random(1))
    publisher = SlicePublisher(kube_client, driver="vgpu.dra.dev", node_name="n", backoff=backoff)
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(lambda: synthetic_inventory(1), stop))
    thread.start()
    try:
        deadline = 50
        while backoff.failures < 4 and deadline:
            stop.wait(0.1)
            deadline -= 1
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert backoff.failures >= 4
    assert publisher.generation == 0


def test_updates_keep_labels_and_annotations_other_tools_added() -> None:
    before = served(desired(synthetic_inventory(1)), 1)
    before[0]["metadata"]["labels"] = {"team": "ml", "vgpu.dra.dev/node": "stale"}
    before[0]["metadata"]["annotations"] = {"note": "hi"}
    (update,) = plan_sync(desired(synthetic_inventory(1, memory=8 * GIB)), before).update
    assert update["metadata"]["labels"]["team"] == "ml"
    assert update["metadata"]["labels"]["vgpu.dra.dev/node"] == "node-1"  # ours win
    assert update["metadata"]["annotations"] == {"note": "hi"}


class WatchingClient:
    """Lists and watches from scripts: each watch yields its events, then ends the stream or
    raises; `stop` is set once the scripts run out."""

    def __init__(self, streams: list[list[dict[str, Any]] | Exception], stop: Any) -> None:
        self.streams = streams
        self.stop = stop
        self.lists = 0
        self.wakes_seen: list[bool] = []

    def list_versioned(self, path: str, *, field_selector: str) -> tuple[list[Any], str]:
        assert field_selector == pool_selector("vgpu.dra.dev", "node-1")
        self.lists += 1
        return [], str(self.lists)

    def watch(self, path: str, version: str, **kw: Any) -> Any:
        assert version == str(self.lists)
        if not self.streams:
            self.stop.set()
            return
        stream = self.streams.pop(0)
        if isinstance(stream, Exception):
            raise stream
        yield from stream


def test_the_pool_watch_wakes_the_publisher_on_deletions_and_relists_after_errors() -> None:
    stop, wake = threading.Event(), threading.Event()
    seen: list[tuple[str, bool]] = []

    class Recording(WatchingClient):
        def watch(self, path: str, version: str, **kw: Any) -> Any:
            wake.clear()  # a list always wakes; what matters is each event's own effect
            for event in super().watch(path, version, **kw):
                yield event
                seen.append((event["type"], wake.is_set()))
                wake.clear()

    client = Recording(
        [
            [{"type": "BOOKMARK"}, {"type": "ADDED"}, {"type": "DELETED"}],
            Unreachable(0, "Unreachable", "connection reset"),
            [{"type": "MODIFIED"}],
        ],
        stop,
    )
    watch_pool(
        client,  # type: ignore[arg-type]
        pool_selector("vgpu.dra.dev", "node-1"),
        wake,
        stop,
        backoff=Backoff(initial_s=0.001, maximum_s=0.001),
    )
    assert seen == [("BOOKMARK", False), ("ADDED", False), ("DELETED", True), ("MODIFIED", True)]
    assert client.lists == 4  # once per watch, the failed one included
