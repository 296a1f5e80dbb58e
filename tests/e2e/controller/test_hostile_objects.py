"""Hostile objects against the allocation controller, on the real API server.

One controller process (the chart's RBAC, leader election) sees a stream of objects the API
accepts but nothing in the controller expected, each followed by an ordinary gated pod that must
be placed. At the end the same process is still the leader, never restarted, and `/healthz` and
`/readyz` answer 200: no object stopped a loop.

The stream (each case was seen or could stop placement before; issue "No object can stop
placement"):
1. gated pods whose containers ask for quantities at every edge (`cpu: 1e30`, `memory: 1e19`,
   int64's maximum and one past it, a nano): refused with an InvalidRequest Event naming the
   quantity; before, `pod_requests` raised and ended the worker;
2. a ResourceClaim whose opaque config nests 3,000 levels (the API takes it: 6 KB): the claims
   watch and list cut the deep part, so the next claims are seen; before, the watch failed to
   decode forever;
3. another driver's ResourceSlice with capacities and request policies at int64's edge: skipped
   with a reason; before, the model's arithmetic overflowed;
4. a pod bound by name to a GPU-less node asking for `cpu: 1e30`: counted as filling that node;
5. a claim whose capacity request is 8 EiB, and one with a 100 KB CEL-sized policy annotation:
   refused with a reason;
6. a gated pod whose claim is deleted right after the pod is created (mid-placement);
7. wide objects: a pod with 200 annotations of 1 KiB and a claim with the largest opaque config
   the API takes.
And the kubelet plugin's side: claims whose config no prepare can honour (nested 2,999 levels, a
9 KB field) fail with an Event naming why, an ordinary pod runs after each, and the same plugin
process serves throughout with no loop failed or stalled.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.slices import build_slices
from dra_driver.status import fetch_metrics
from tests.fixtures.allocator_cluster import SHAPES, device_class, inventory
from tests.fixtures.controller import (
    DRIVER,
    Controller,
    controller_account,
    drop_holds,
    leader,
    node_with_plugin,
    remove_driver,
    started,
)
from tests.fixtures.workloads import pause_pod, resource_claim, running_pod
from vgpu_testbed.cluster import boot as cluster_boot
from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.polling import wait_for
from vgpu_testbed.standin.node_agents import NodeAgents

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON = dict[str, Any]
GATE = "vgpu.dra.dev/policy"
CLAIMS = "resourceclaims"
INT64_MAX = str((1 << 63) - 1)
INT64_OVER = str(1 << 63)


@dataclass
class Bed:
    prefix: str
    driver: str
    system_ns: str
    kubeconfig: Path
    logs: Path

    @property
    def gpu_node(self) -> str:
        return f"{self.prefix}-gpu"

    @property
    def cpu_node(self) -> str:
        return f"{self.prefix}-cpu"


@pytest.fixture(scope="module")
def bed(
    cluster: Any, client: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    """A node with 4 A10s of a throwaway driver, a node without GPUs, the controller's account."""
    prefix = f"h{uuid.uuid4().hex[:5]}"
    driver = f"{prefix}.ctl.vgpu.dra.dev"
    home = tmp_path_factory.mktemp("hostile")
    with controller_account(client, cluster, home, prefix) as account:
        b = Bed(prefix, driver, account.system_ns, account.kubeconfig, account.logs)
        foreign = f"{prefix}.foreign.example.com"
        try:
            client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class(driver))
            api_client = cluster.api_client()
            try:
                cluster_boot.create_nodes(
                    api_client,
                    [cluster_nodes.NodeSpec(n, f"t-{n}") for n in (b.gpu_node, b.cpu_node)],
                )
            finally:
                api_client.close()
            uid = client.get(kube.path("v1", "nodes", b.gpu_node))["metadata"]["uid"]
            inv = inventory(7, 4, "NVIDIA A10", SHAPES["none"])
            for obj in build_slices(inv, driver=driver, node_name=b.gpu_node, node_uid=uid):
                client.create(kube.path(RESOURCE_API, "resourceslices"), obj)
            yield b
        finally:
            remove_driver(client, driver)
            remove_driver(client, foreign)
            for node in (b.gpu_node, b.cpu_node):
                client.delete(kube.path("v1", "nodes", node))


@pytest.fixture(scope="module")
def controller(bed: Bed, client: KubeClient) -> Iterator[Controller]:
    c = Controller(bed, "hostile")
    try:
        started(client, bed, c)
        yield c
    finally:
        c.kill()


def _claim(name: str, driver: str, memory: str = "1Gi") -> JSON:
    return resource_claim(
        name, {"deviceClassName": driver, "capacity": {"requests": {"memory": memory}}}
    )


def _gated(name: str, claims: list[str]) -> JSON:
    pod = pause_pod(name, {c: {"resourceClaimName": c} for c in claims})
    pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": "example.com/keep"}]
    return pod


def _create(client: KubeClient, ns: str, plural: str, obj: JSON) -> JSON:
    api = "v1" if plural == "pods" else RESOURCE_API
    return client.create(kube.path(api, plural, namespace=ns), obj)


def _ungated(client: KubeClient, ns: str, name: str) -> bool:
    pod = client.get(kube.path("v1", "pods", name, namespace=ns))
    return GATE not in [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def _events(client: KubeClient, ns: str, pod: str) -> list[JSON]:
    return [
        e
        for e in client.list(kube.path("v1", "events", namespace=ns))
        if e["involvedObject"].get("name") == pod and e["type"] == "Warning"
    ]


def _refused(client: KubeClient, ns: str, pod: str, reason: str, text: str) -> JSON:
    def event() -> JSON | None:
        for e in _events(client, ns, pod):
            if e["reason"] == reason and text in e["message"]:
                return e
        return None

    return wait_for(f"{reason} Event on {pod} naming {text!r}", event, timeout=30)


class Placer:
    """Ordinary gated pods, one after each hostile object: each must be placed."""

    def __init__(self, client: KubeClient, ns: str, bed: Bed) -> None:
        self.client, self.ns, self.bed, self.n = client, ns, bed, 0

    def one(self) -> None:
        self.n += 1
        name = f"ok-{self.n}"
        _create(self.client, self.ns, CLAIMS, _claim(name, self.bed.driver, "256Mi"))
        _create(self.client, self.ns, "pods", _gated(name, [name]))
        wait_for(f"{name} placed", lambda: _ungated(self.client, self.ns, name), timeout=30)
        # Placed pods keep their claim's capacity: give it back for the next cases.
        self.client.delete(kube.path("v1", "pods", name, namespace=self.ns))
        self.client.delete(kube.path(RESOURCE_API, CLAIMS, name, namespace=self.ns))


def _probe(controller: Controller, path: str) -> int:
    match = re.search(r"probes on (http://[\d.]+:\d+)", controller.text())
    assert match is not None, controller.text()
    try:
        with urllib.request.urlopen(match.group(1) + path, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_stream_of_hostile_objects_stops_no_loop(
    client: KubeClient, bed: Bed, controller: Controller, namespace: str
) -> None:
    placer = Placer(client, namespace, bed)
    placer.one()
    holder = leader(client, bed)
    pid = controller.proc.pid
    for case in (
        _quantities_at_every_edge,
        _a_claim_nested_3000_levels,
        _a_foreign_slice_at_the_int64_edge,
        _a_pod_bound_by_name_asking_for_1e30,
        _requests_and_annotations_beyond_limits,
        _a_claim_deleted_mid_placement,
        _wide_objects,
    ):
        case(client, namespace, bed)
        placer.one()
    # The same process, still the leader, healthy and ready: no loop stopped or restarted.
    assert controller.proc.poll() is None and controller.proc.pid == pid
    assert leader(client, bed) == holder
    assert _probe(controller, "/healthz") == 200
    assert _probe(controller, "/readyz") == 200
    assert "stopped making progress" not in controller.text()
    drop_holds(client, namespace)


def _quantities_at_every_edge(client: KubeClient, ns: str, bed: Bed) -> None:
    placer = Placer(client, ns, bed)
    for i, (cpu, memory) in enumerate(
        [("1e30", "1Gi"), ("1", "1e19"), (INT64_MAX, "1Gi"), ("1", INT64_OVER), ("1n", "1e30")]
    ):
        name = f"edge-{i}"
        _create(client, ns, CLAIMS, _claim(name, bed.driver))
        pod = _gated(name, [name])
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
        _create(client, ns, "pods", pod)
        # The API stores quantities canonically (1e19 -> 10E): the reason is what is matched.
        _refused(client, ns, name, "InvalidRequest", "requests: quantity")
        placer.one()


def _a_claim_nested_3000_levels(client: KubeClient, ns: str, bed: Bed) -> None:
    """The API takes it (6 KB); the watch and lists must go on past it, before and after its
    deletion."""
    deep = _claim("deep", bed.driver)
    deep["spec"]["devices"]["config"] = [{"opaque": {"driver": bed.driver, "parameters": 0}}]
    # An object (the API wants one) around 2,999 levels of lists: 6 KB, under its 10 KiB.
    nested = '{"a":' + "[" * 2999 + "]" * 2999 + "}"
    body = json.dumps(deep).replace('"parameters": 0', '"parameters": ' + nested)
    # Sent as text: JSON is YAML, and a serialised body passes the client's encoder, which would
    # refuse the depth.
    client.request(
        "POST",
        kube.path(RESOURCE_API, CLAIMS, namespace=ns),
        body=body,  # type: ignore[arg-type]
        content_type="application/yaml",
        prune_deep=True,  # the answer is the object, as deep
    )
    Placer(client, ns, bed).one()  # the claims watch goes on past the deep claim
    client.delete(kube.path(RESOURCE_API, CLAIMS, "deep", namespace=ns))


def _a_foreign_slice_at_the_int64_edge(client: KubeClient, ns: str, bed: Bed) -> None:
    client.create(
        kube.path(RESOURCE_API, "resourceslices"),
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{bed.prefix}-foreign"},
            "spec": {
                "driver": f"{bed.prefix}.foreign.example.com",
                "nodeName": bed.gpu_node,
                "pool": {"name": bed.gpu_node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "edge",
                        "allowMultipleAllocations": True,
                        "capacity": {
                            "mem": {
                                "value": INT64_MAX,
                                "requestPolicy": {
                                    "default": INT64_MAX,
                                    "validRange": {"min": "1", "max": INT64_MAX, "step": "3"},
                                },
                            },
                            "count": {"value": INT64_MAX},
                        },
                    }
                ],
            },
        },
    )


def _a_pod_bound_by_name_asking_for_1e30(client: KubeClient, ns: str, bed: Bed) -> None:
    bound = pause_pod("bound", {})
    bound["spec"]["nodeName"] = bed.cpu_node
    bound["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1e30", "memory": "1e19"}}
    _create(client, ns, "pods", bound)


def _requests_and_annotations_beyond_limits(client: KubeClient, ns: str, bed: Bed) -> None:
    _create(client, ns, CLAIMS, _claim("exa", bed.driver, "8Ei"))
    _create(client, ns, "pods", _gated("exa", ["exa"]))
    _refused(client, ns, "exa", "InvalidRequest", "capacity.requests")  # stored: int64 max
    _create(client, ns, CLAIMS, _claim("long", bed.driver))
    pod = _gated("long", ["long"])
    pod["metadata"]["annotations"] = {"vgpu.dra.dev/include-gpu-type": "A10," * 25_000}
    _create(client, ns, "pods", pod)
    _refused(client, ns, "long", "InvalidRequest", "include-gpu-type")


def _a_claim_deleted_mid_placement(client: KubeClient, ns: str, bed: Bed) -> None:
    _create(client, ns, CLAIMS, _claim("gone", bed.driver))
    _create(client, ns, "pods", _gated("gone", ["gone"]))
    client.delete(kube.path(RESOURCE_API, CLAIMS, "gone", namespace=ns))


def _wide_objects(client: KubeClient, ns: str, bed: Bed) -> None:
    wide = _gated("wide", ["wide"])
    wide["metadata"]["annotations"] = {f"example.com/k{i}": "x" * 1024 for i in range(200)}
    config = {"apiVersion": "example.com/v1", "kind": "Junk", "items": ["y" * 90] * 100}
    claim = _claim("wide", bed.driver)
    claim["spec"]["devices"]["config"] = [{"opaque": {"driver": bed.driver, "parameters": config}}]
    _create(client, ns, CLAIMS, claim)
    _create(client, ns, "pods", wide)


NODE = "node-1"  # a session-cluster node, served here by our kubelet plugin


def _plugin_pid(cluster: Any, agents: NodeAgents) -> int:
    (record,) = [p for p in cluster.processes if p.name == agents.plugin_process]
    return int(record.pid)


def _node_claim(name: str, config: Any = None) -> JSON:
    claim = _claim(name, DRIVER, "256Mi")
    if config is not None:
        claim["spec"]["devices"]["config"] = [{"opaque": {"driver": DRIVER, "parameters": config}}]
    return claim


def _node_pod(name: str) -> JSON:
    return pause_pod(name, {name: {"resourceClaimName": name}})


def _prepare_refused(client: KubeClient, ns: str, name: str, text: str) -> None:
    def event() -> JSON | None:
        for e in client.list(kube.path("v1", "events", namespace=ns)):
            if e["involvedObject"].get("name") == name and text in e["message"]:
                return e
        return None

    wait_for(f"a prepare failure of {name} naming {text!r}", event, timeout=60)


def test_hostile_claims_fail_alone_on_the_node(
    cluster: Any, client: KubeClient, namespace: str
) -> None:
    """The plugin's side of the run: claims the API accepts but no prepare can honour (an opaque
    config nested 2,999 levels, a VgpuConfig with a 9 KB field) fail with a Warning Event that
    says why; an ordinary pod runs after each; the same plugin process serves throughout and none
    of its loops failed or stalled."""
    ns = namespace
    with node_with_plugin(cluster, client, NODE) as agents:
        wait_for("node-1's plugin serving metrics", agents.metrics_url, timeout=60)
        pid = _plugin_pid(cluster, agents)
        served = 0

        def ordinary() -> None:
            nonlocal served
            served += 1
            name = f"ok-{served}"
            _create(client, ns, CLAIMS, _node_claim(name))
            _create(client, ns, "pods", _node_pod(name))
            running_pod(client, ns, name)
            client.delete(kube.path("v1", "pods", name, namespace=ns))

        ordinary()
        deep = _node_claim("deep", 0)
        nested = '{"a":' + "[" * 2999 + "]" * 2999 + "}"
        body = json.dumps(deep).replace('"parameters": 0', '"parameters": ' + nested)
        client.request(
            "POST",
            kube.path(RESOURCE_API, CLAIMS, namespace=ns),
            body=body,  # type: ignore[arg-type]
            content_type="application/yaml",
            prune_deep=True,
        )
        _create(client, ns, "pods", _node_pod("deep"))
        _prepare_refused(client, ns, "deep", "nested too deeply")
        ordinary()
        config = {
            "apiVersion": "vgpu.dra.dev/v1alpha1",
            "kind": "VgpuConfig",
            "computePolicy": "x" * 9_000,  # near the API's 10 KiB for parameters
        }
        _create(client, ns, CLAIMS, _node_claim("long", config))
        _create(client, ns, "pods", _node_pod("long"))
        _prepare_refused(client, ns, "long", "computePolicy")
        ordinary()
        url = agents.metrics_url()
        assert url is not None
        samples = fetch_metrics(url)
        failures = {lb["loop"]: v for n, lb, v in samples if n == "vgpu_dra_loop_failures_total"}
        stalled = {lb["loop"]: v for n, lb, v in samples if n == "vgpu_dra_loop_stalled"}
        assert failures and not any(failures.values()), failures
        assert stalled and not any(stalled.values()), stalled
        assert _plugin_pid(cluster, agents) == pid
