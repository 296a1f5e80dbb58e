"""The slice publisher against the real kube-apiserver (which validates every slice we write).

What this proves:
1. A first sync publishes one pool the API accepts, with the owner reference to the Node.
2. A new publisher with the same inventory (a plugin restart) writes nothing: no resourceVersion
   changes.
3. An inventory change bumps the pool generation on every slice of the pool.
4. A pool larger than 128 devices is split into several slices with one generation and the
   right resourceSliceCount; shrinking deletes the extra slice.
5. A slice edited or deleted behind the publisher's back is repaired by `run()`'s resync.
6. Deleting the Node garbage-collects its slices (the owner reference works end to end).

Each test uses its own Node object and a driver name of its own, so nothing here touches the
pools that the kubelet plugins of other e2e tests publish.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from kubelet_plugin.slice_publisher import SlicePublisher
from tests.fixtures.inventories import synthetic_inventory

# Longer than the 60 s default: the first test may start the session cluster.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


GIB = 1 << 30
SLICES = kube.path(RESOURCE_API, "resourceslices")


@pytest.fixture
def node(client: KubeClient) -> Iterator[str]:
    """A throwaway Node (slices need one for their owner reference)."""
    name = f"slices-{uuid.uuid4().hex[:8]}"
    client.create(
        kube.path("v1", "nodes"),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
    )
    yield name
    client.delete(kube.path("v1", "nodes", name))


@pytest.fixture
def driver() -> str:
    return f"t{uuid.uuid4().hex[:6]}.slices.vgpu.dra.dev"


def listed(client: KubeClient, driver: str, node: str) -> list[dict[str, Any]]:
    return client.list(SLICES, field_selector=f"spec.driver={driver},spec.nodeName={node}")


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


def test_publish_then_restart_writes_nothing(client: KubeClient, node: str, driver: str) -> None:
    inventory = synthetic_inventory(8)
    first = SlicePublisher(client, driver=driver, node_name=node)
    assert first.sync(inventory) is True
    (obj,) = listed(client, driver, node)
    assert obj["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in obj["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    node_uid = client.get(kube.path("v1", "nodes", node))["metadata"]["uid"]
    (owner,) = obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, node_uid)

    restarted = SlicePublisher(client, driver=driver, node_name=node)
    assert restarted.sync(inventory) is False
    (again,) = listed(client, driver, node)
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert restarted.generation == 1


def test_inventory_change_bumps_the_generation(client: KubeClient, node: str, driver: str) -> None:
    publisher = SlicePublisher(client, driver=driver, node_name=node)
    publisher.sync(synthetic_inventory(2))
    assert publisher.sync(synthetic_inventory(2, memory=40 * GIB)) is True
    (obj,) = listed(client, driver, node)
    assert obj["spec"]["pool"]["generation"] == 2
    assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] in (str(40 * GIB), "40Gi")
    oversubscribed = SlicePublisher(client, driver=driver, node_name=node, oversubscription_ratio=2)
    assert oversubscribed.sync(synthetic_inventory(2, memory=40 * GIB)) is True
    (obj,) = listed(client, driver, node)
    assert obj["spec"]["pool"]["generation"] == 3


def test_large_pools_are_split_and_shrink_cleanly(
    client: KubeClient, node: str, driver: str
) -> None:
    publisher = SlicePublisher(client, driver=driver, node_name=node)
    assert publisher.sync(synthetic_inventory(130)) is True  # > 128: the API refuses bigger slices
    objs = listed(client, driver, node)
    assert sorted(len(o["spec"]["devices"]) for o in objs) == [2, 128]
    assert {o["spec"]["pool"]["generation"] for o in objs} == {1}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {2}

    assert publisher.sync(synthetic_inventory(100)) is True
    (obj,) = listed(client, driver, node)
    assert obj["spec"]["pool"] == {"name": node, "generation": 2, "resourceSliceCount": 1}
    assert len(obj["spec"]["devices"]) == 100


def test_run_repairs_slices_changed_behind_its_back(
    client: KubeClient, node: str, driver: str
) -> None:
    publisher = SlicePublisher(client, driver=driver, node_name=node)
    stop = threading.Event()
    thread = threading.Thread(
        target=publisher.run, args=(lambda: synthetic_inventory(3), stop), kwargs={"resync_s": 0.3}
    )
    thread.start()
    try:
        wait_for(lambda: len(listed(client, driver, node)) == 1)
        (obj,) = listed(client, driver, node)
        name = obj["metadata"]["name"]
        obj["spec"]["devices"] = obj["spec"]["devices"][:1]  # someone drops two GPUs
        client.replace(kube.path(RESOURCE_API, "resourceslices", name), obj)
        wait_for(lambda: len(listed(client, driver, node)[0]["spec"]["devices"]) == 3)
        assert listed(client, driver, node)[0]["spec"]["pool"]["generation"] == 2
        client.delete(kube.path(RESOURCE_API, "resourceslices", name))
        wait_for(lambda: len(listed(client, driver, node)) == 1)
        assert listed(client, driver, node)[0]["spec"]["pool"]["generation"] == 1
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_deleting_the_node_garbage_collects_its_slices(client: KubeClient, driver: str) -> None:
    name = f"slices-gc-{uuid.uuid4().hex[:8]}"
    client.create(
        kube.path("v1", "nodes"), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    SlicePublisher(client, driver=driver, node_name=name).sync(synthetic_inventory(1))
    assert len(listed(client, driver, name)) == 1
    client.delete(kube.path("v1", "nodes", name))
    wait_for(lambda: not listed(client, driver, name), timeout=60)


def test_a_missing_node_is_an_error_not_an_ownerless_slice(client: KubeClient, driver: str) -> None:
    publisher = SlicePublisher(client, driver=driver, node_name="no-such-node")
    with pytest.raises(kube.NotFound):
        publisher.sync(synthetic_inventory(1))
    assert not listed(client, driver, "no-such-node")


class RacingClient(KubeClient):
    """A real client that lets another writer change a slice right after our LIST, once."""

    race = True

    def list(
        self,
        resource_path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        items = super().list(
            resource_path, label_selector=label_selector, field_selector=field_selector
        )
        if self.race and items:
            self.race = False
            name = items[0]["metadata"]["name"]
            self.merge_patch(
                kube.path(RESOURCE_API, "resourceslices", name),
                {"metadata": {"labels": {"touched-by": "someone-else"}}},
            )
        return items


def test_a_concurrent_writer_causes_a_conflict_then_convergence(
    cluster: Any, client: KubeClient, node: str, driver: str
) -> None:
    SlicePublisher(client, driver=driver, node_name=node).sync(synthetic_inventory(2))
    racing = RacingClient(KubeClient.from_kubeconfig(str(cluster.kubeconfig)).api_client)
    publisher = SlicePublisher(racing, driver=driver, node_name=node)
    changed = synthetic_inventory(2, memory=16 * GIB)
    with pytest.raises(kube.Conflict):
        publisher.sync(changed)  # our PUT carried the resourceVersion we listed: refused
    assert publisher.sync(changed) is True
    (obj,) = listed(client, driver, node)
    assert obj["spec"]["pool"]["generation"] == 2
    assert obj["metadata"]["labels"]["touched-by"] == "someone-else"  # nothing overwritten blindly
