"""The test bed's control plane is a real, correctly configured Kubernetes 1.37 with DRA.

What this proves:
1. The apiserver is v1.37.x and serves `resource.k8s.io/v1` (with ResourceSlices, DeviceClasses,
   ResourceClaims, ResourceClaimTemplates, DeviceTaintRules) as the preferred version.
2. apiserver, scheduler and controller-manager all run with the same DRA feature gates on (read
   back from each component's own `kubernetes_feature_enabled` metric, not from our flags).
3. The real kube-scheduler allocates consumable capacity: two pods asking 10Gi/30 cores each
   share one `allowMultipleAllocations` device, their claims carry `consumedCapacity` and
   distinct `shareID`s, and the pods are bound to the slice's node.
4. DRAExtendedResource: a pod asking for an extended resource backed by a DeviceClass gets a
   scheduler-made claim for a whole GPU (request-policy defaults: all memory, no cores).
5. A claim that cannot fit (80 cores when every device has < 80 left; 100Gi on 80Gi devices)
   stays unallocated and its pod Pending/Unschedulable; once the pods on one device are deleted
   the 80-core pod is scheduled — capacity is really accounted and released.
6. The nodes are usable without a kubelet (plain pods spread by CPU requests), carry their
   profile label, and a node's own identity is authenticated and limited by the Node authorizer.
7. A second start in the live directory is refused; helm installs a chart into the bed.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vgpu_testbed import polling
from vgpu_testbed.cluster import example
from vgpu_testbed.cluster.control_plane import Cluster, default_bin_dir
from vgpu_testbed.cluster.flags import FEATURE_GATES, LOCKED_ON
from vgpu_testbed.cluster.health import http_get

# Longer than the 60 s default: the first test may start the session cluster; helm installs a chart.
pytestmark = pytest.mark.timeout(180)


DRIVER = "vgpu.dra.dev"
NODE = "node-1"
SLICE = "testbed-node-1"
T = TypeVar("T")


def wait_until(what: str, fn: Callable[[], T | None], timeout: float = 45.0) -> T:
    return polling.wait_for(what, fn, timeout)


def foreign_slices(k8s: Any) -> list[str]:
    """Other ResourceSlices of our driver on node-1 (they would join the allocation)."""
    slices = client.ResourceV1Api(k8s).list_resource_slice().items
    return [
        s.metadata.name
        for s in slices
        if s.spec.driver == DRIVER and s.spec.node_name == NODE and s.metadata.name != SLICE
    ]


@pytest.fixture(scope="module")
def dra_objects(k8s: Any) -> Iterator[None]:
    """A hand-written ResourceSlice for node-1 (gpu-0, gpu-1: 80Gi, 100 cores each) and the
    DeviceClass; removed after the module so later tests (a real kubelet plugin publishing for
    node-1) start clean. The session cluster is shared: slices another module left for node-1
    would take part in allocation, so they must be gone first; an existing DeviceClass of the
    same name is used as it is (and left in place)."""
    res = client.ResourceV1Api(k8s)
    leftovers = wait_until_none(lambda: foreign_slices(k8s), timeout=30)
    assert not leftovers, f"an earlier test left ResourceSlices of {DRIVER} on {NODE}: {leftovers}"
    res.create_resource_slice(body=example.resource_slice(SLICE, NODE))
    created_class = False
    try:
        res.create_device_class(body=example.device_class())
        created_class = True
    except ApiException as err:
        if err.status != 409:
            raise
        existing = res.read_device_class(DRIVER)
        expressions = [sel.cel.expression for sel in existing.spec.selectors or [] if sel.cel]
        assert expressions == [f'device.driver == "{DRIVER}"'], expressions
    try:
        yield
    finally:
        res.delete_resource_slice(SLICE)
        if created_class:
            res.delete_device_class(DRIVER)


def wait_until_none(fn: Callable[[], list[str]], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while (found := fn()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


def make_template(k8s: Any, ns: str, name: str, memory: str, cores: int) -> None:
    body = example.claim_template(name, memory, cores)
    client.ResourceV1Api(k8s).create_namespaced_resource_claim_template(ns, body=body)


def make_pod(k8s: Any, ns: str, name: str, template: str) -> None:
    client.CoreV1Api(k8s).create_namespaced_pod(ns, body=example.pod(name, template))


def scheduled_node(k8s: Any, ns: str, pod: str) -> str | None:
    found = client.CoreV1Api(k8s).read_namespaced_pod(pod, ns)
    return found.spec.node_name if found.spec else None


def claim_of(k8s: Any, ns: str, pod: str) -> Any:
    return example.pod_claim(k8s, ns, pod)


def allocated_result(k8s: Any, ns: str, pod: str) -> Any:
    return example.allocation_of(k8s, ns, pod)


def unschedulable_message(k8s: Any, ns: str, pod: str) -> str | None:
    found = client.CoreV1Api(k8s).read_namespaced_pod(pod, ns)
    for cond in (found.status.conditions or []) if found.status else []:
        if (
            cond.type == "PodScheduled"
            and cond.status == "False"
            and cond.reason == "Unschedulable"
        ):
            return cond.message or "(no message)"
    return None


def test_apiserver_is_1_37_and_serves_resource_v1(k8s: Any) -> None:
    version = client.VersionApi(k8s).get_code()
    assert version.git_version.startswith("v1.37."), version.git_version

    groups = {g.name: g for g in client.ApisApi(k8s).get_api_versions().groups}
    resource = groups["resource.k8s.io"]
    assert resource.preferred_version.group_version == "resource.k8s.io/v1"
    assert "v1" in [v.version for v in resource.versions]

    kinds = {r.kind for r in client.ResourceV1Api(k8s).get_api_resources().resources}
    expected = {
        "ResourceSlice",
        "DeviceClass",
        "ResourceClaim",
        "ResourceClaimTemplate",
        "DeviceTaintRule",
    }
    assert expected <= kinds, kinds


def feature_metrics(url: str, token: str, **kwargs: Any) -> dict[str, bool]:
    code, body = http_get(url, token=token, timeout=10, **kwargs)
    assert code == 200, f"{url}: {code} {body[:300]}"
    gates = {}
    for line in body.splitlines():
        if line.startswith("kubernetes_feature_enabled{"):
            labels, _, value = line.rpartition(" ")
            name = labels.split('name="', 1)[1].split('"', 1)[0]
            gates[name] = float(value) == 1.0
    assert gates, f"{url} exposes no kubernetes_feature_enabled metric"
    return gates


def test_dra_feature_gates_identical_on_every_component(cluster: Cluster) -> None:
    token = cluster.admin_token()
    ports = cluster.state.ports
    per_component = {
        "kube-apiserver": feature_metrics(
            f"{cluster.server}/metrics", token, ca_file=cluster.ca_cert
        ),
        "kube-scheduler": feature_metrics(
            f"https://127.0.0.1:{ports['kube-scheduler']}/metrics", token, verify=False
        ),
        "kube-controller-manager": feature_metrics(
            f"https://127.0.0.1:{ports['kube-controller-manager']}/metrics", token, verify=False
        ),
    }
    wanted = [name for name, on in FEATURE_GATES.items() if on] + list(LOCKED_ON)
    for component, gates in per_component.items():
        off = [name for name in wanted if not gates.get(name)]
        assert not off, f"{component}: gates not enabled: {off}"
    dra = {
        component: {k: v for k, v in gates.items() if k.startswith("DRA")}
        for component, gates in per_component.items()
    }
    assert dra["kube-apiserver"] == dra["kube-scheduler"] == dra["kube-controller-manager"]


def test_slice_keeps_consumable_capacity_fields(k8s: Any, dra_objects: None) -> None:
    # With DRAConsumableCapacity off the apiserver would silently drop these fields.
    stored = client.ResourceV1Api(k8s).read_resource_slice(SLICE)
    gpu0 = stored.spec.devices[0]
    assert gpu0.allow_multiple_allocations is True
    assert gpu0.capacity["memory"].request_policy.default == "80Gi"
    assert gpu0.capacity["cores"].request_policy.valid_range.max == "100"


def test_scheduler_shares_one_device_by_consumable_capacity(
    k8s: Any, namespace: str, dra_objects: None
) -> None:
    make_template(k8s, namespace, "small", "10Gi", 30)
    for pod in ("a", "b"):
        make_pod(k8s, namespace, pod, "small")

    for pod in ("a", "b"):
        node = wait_until(f"pod {pod} bound", lambda p=pod: scheduled_node(k8s, namespace, p))
        assert node == NODE
    results = {
        pod: wait_until(f"claim of {pod}", lambda p=pod: allocated_result(k8s, namespace, p))
        for pod in ("a", "b")
    }
    share_ids = set()
    for result in results.values():
        assert (result.driver, result.pool) == (DRIVER, NODE)
        assert result.device in ("gpu-0", "gpu-1")
        assert result.consumed_capacity == {"memory": "10Gi", "cores": "30"}
        assert result.share_id, "consumable capacity allocations carry a shareID"
        share_ids.add(result.share_id)
    assert len(share_ids) == 2
    # Both fit on one device and the scheduler packs them there (first fit).
    assert results["a"].device == results["b"].device

    claim = claim_of(k8s, namespace, "a")
    assert [r.name for r in claim.status.reserved_for] == ["a"]
    selector = claim.status.allocation.node_selector.node_selector_terms[0].match_fields[0]
    assert (selector.key, selector.values) == ("metadata.name", [NODE])


def test_claim_that_cannot_fit_stays_pending_until_capacity_is_freed(
    k8s: Any, namespace: str, dra_objects: None
) -> None:
    make_template(k8s, namespace, "quarter", "10Gi", 30)
    make_template(k8s, namespace, "big-cores", "1Gi", 80)
    make_template(k8s, namespace, "too-much-memory", "100Gi", 0)
    fillers = [f"fill-{i}" for i in range(4)]
    for pod in fillers:
        make_pod(k8s, namespace, pod, "quarter")
    devices = {
        pod: wait_until(f"claim of {pod}", lambda p=pod: allocated_result(k8s, namespace, p)).device
        for pod in fillers
    }
    # 4 x 30 cores over two 100-core devices: every split leaves < 80 cores on each device.
    per_device = Counter(devices.values())
    assert sum(per_device.values()) == 4 and max(per_device.values()) <= 3

    make_pod(k8s, namespace, "big", "big-cores")
    make_pod(k8s, namespace, "huge", "too-much-memory")
    for pod in ("big", "huge"):
        message = wait_until(
            f"{pod} reported unschedulable", lambda p=pod: unschedulable_message(k8s, namespace, p)
        )
        assert scheduled_node(k8s, namespace, pod) is None, message
        claim = claim_of(k8s, namespace, pod)
        assert claim is not None and (claim.status is None or claim.status.allocation is None)

    # Free one device completely: the 80-core claim fits there now; 100Gi never fits.
    emptied = min(("gpu-0", "gpu-1"), key=lambda d: per_device.get(d, 0))
    core = client.CoreV1Api(k8s)
    for pod, dev in devices.items():
        if dev == emptied:
            core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    result = wait_until(
        "80-core claim allocated after capacity was freed",
        lambda: allocated_result(k8s, namespace, "big"),
        timeout=90,
    )
    assert result.device == emptied
    assert result.consumed_capacity == {"memory": "1Gi", "cores": "80"}
    assert wait_until("big bound", lambda: scheduled_node(k8s, namespace, "big")) == NODE
    assert scheduled_node(k8s, namespace, "huge") is None


def test_extended_resource_request_gets_a_whole_gpu(
    k8s: Any, namespace: str, dra_objects: None
) -> None:
    # DRAExtendedResource (GA in 1.37): a DeviceClass with extendedResourceName lets a pod ask
    # for `<name>: 1` in its limits; the scheduler creates the claim itself. It names no
    # capacity, so the request policy's defaults apply: all the memory, 0 cores: exclusive.
    res = client.ResourceV1Api(k8s)
    extended = "testbed.vgpu.dra.dev/gpu"
    dc = example.device_class().model_dump(by_alias=True, exclude_none=True)
    dc["metadata"]["name"] = "testbed-extended"
    dc["spec"]["extendedResourceName"] = extended
    res.create_device_class(body=client.V1DeviceClass.model_validate(dc))
    try:
        pod = example.pod("whole", "unused").model_dump(by_alias=True, exclude_none=True)
        del pod["spec"]["resourceClaims"]
        pod["spec"]["containers"][0]["resources"] = {"limits": {extended: "1"}}
        core = client.CoreV1Api(k8s)
        core.create_namespaced_pod(namespace, body=client.V1Pod.model_validate(pod))
        assert wait_until("whole bound", lambda: scheduled_node(k8s, namespace, "whole")) == NODE

        found = core.read_namespaced_pod("whole", namespace)
        claim_name = found.status.extended_resource_claim_status.resource_claim_name
        claim = res.read_namespaced_resource_claim(claim_name, namespace)
        assert (
            claim.metadata.annotations["resource.kubernetes.io/extended-resource-claim"] == "true"
        )
        (whole,) = claim.status.allocation.devices.results
        assert whole.consumed_capacity == {"memory": "80Gi", "cores": "0"}

        # Its GPU has no memory left: a 10Gi share lands on the other one.
        make_template(k8s, namespace, "share", "10Gi", 10)
        make_pod(k8s, namespace, "share", "share")
        share = wait_until("share allocated", lambda: allocated_result(k8s, namespace, "share"))
        assert share.device != whole.device
    finally:
        res.delete_device_class("testbed-extended")


def test_pods_bind_without_a_kubelet_on_either_node(k8s: Any, namespace: str) -> None:
    # Plain pods (no claims) spread over the kubelet-less nodes: the Node objects are usable.
    core = client.CoreV1Api(k8s)
    for i in range(4):
        core.create_namespaced_pod(
            namespace,
            body=client.V1Pod.model_validate(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"plain-{i}"},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.invalid/testbed/none:0",
                                "resources": {"requests": {"cpu": "12"}},
                            }
                        ]
                    },
                }
            ),
        )
    nodes = [
        wait_until(f"plain-{i} bound", lambda n=i: scheduled_node(k8s, namespace, f"plain-{n}"))
        for i in range(4)
    ]
    # 32 allocatable CPUs per node: at most two 12-CPU pods fit on one node.
    assert Counter(nodes) == {"node-1": 2, "node-2": 2}


def test_second_start_in_a_live_directory_is_refused(cluster: Cluster) -> None:
    from vgpu_testbed.cluster.control_plane import ClusterBusyError

    with pytest.raises(ClusterBusyError, match="already running"):
        Cluster.start(cluster.root, ["x"])
    assert cluster.status().healthy


def test_node_profiles_are_labelled_and_recorded(k8s: Any, cluster: Cluster) -> None:
    from vgpu_testbed.cluster.nodes import PROFILE_LABEL

    nodes = {n.metadata.name: n for n in client.CoreV1Api(k8s).list_node().items}
    recorded = {n.name: n.profile for n in cluster.nodes}
    assert recorded == {"node-1": "dgx-h100", "node-2": "a10-pcie"}
    for name, profile in recorded.items():
        assert nodes[name].metadata.labels[PROFILE_LABEL] == profile
        assert not nodes[name].spec.taints
        assert nodes[name].status.allocatable["pods"] == "110"


def test_node_identity_is_authenticated_and_limited(cluster: Cluster) -> None:
    # The per-node kubeconfig authenticates as system:node:node-1; the Node authorizer lets it
    # read its own Node but not list Secrets.
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.node_kubeconfig("node-1")))
    try:
        core = client.CoreV1Api(api)
        assert core.read_node("node-1").metadata.name == "node-1"
        with pytest.raises(ApiException) as denied:
            core.list_secret_for_all_namespaces()
        assert denied.value.status == 403
    finally:
        api.close()


def test_helm_installs_into_the_bed(
    cluster: Cluster, k8s: Any, namespace: str, tmp_path: Path
) -> None:
    # helm (built with the control plane) talks to the bed through the admin kubeconfig, so
    # the chart under deploy/ can be installed in e2e tests.
    helm = default_bin_dir() / "helm"
    if not helm.is_file():
        pytest.skip(f"{helm} not built (make controlplane)")
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: smoke\ndata:\n"
        "  release: {{ .Release.Name | quote }}\n"
    )
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }
    run = subprocess.run(
        [str(helm), "install", "demo", str(chart), "--namespace", namespace, "--wait"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    cm = client.CoreV1Api(k8s).read_namespaced_config_map("smoke", namespace)
    assert cm.data == {"release": "demo"}
    listed = subprocess.run(
        [str(helm), "list", "--namespace", namespace, "--short"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert listed.stdout.split() == ["demo"]
