"""The default install on a real bed node: the product image in the node's containerd, the chart
with its default values, and every part running: the kubelet plugin DaemonSet, the controller
(leader on its Lease) and the admission webhook (its self-managed certificate published), a GPU
pod with a claim, a pod written for vgpu-manager applied unchanged; then a surge rollout of the
DaemonSet and an uninstall.

One real node (`vgpu_testbed.realnode`: the real kubelet, containerd with CDI, runc; a simulated
a10-pcie). The image, the values and what the bed adds to the rendered objects (host network,
the webhook called through a relay into the node, the simulated driver where NVIDIA's runtime
puts the real one) are in tests/e2e/deploy/bed_chart.py. The image is `make image`'s (a real
engine's build of the Dockerfile) where it exists and matches the sources, as in CI, which
builds it (.ci/run); elsewhere the image tree packed with the bed's interpreter stands in and
the test says so (in CI that is a failure).

What this proves:
1. The DaemonSet pod runs from the image (the init container installs the hook into the chart's
   hookDir, the plugin starts), becomes Ready through the chart's probes, registers with the
   kubelet under its pod-UID socket names, and publishes the node's slices. The chart's
   liveness and readiness probe commands, run inside the plugin container through the API
   server (`kubectl exec`), both pass.
2. Least privilege in practice: the plugin runs with the chart's ServiceAccount token (the
   kubelet's projected one, bound to the pod), unprivileged (the default `nvml.mode:
   runtimeClass`), publishes the node's slices in the shareable form and prepares claims, and
   its log shows no Forbidden answer. A pod with a claim runs; its CDI spec was written by the
   DaemonSet's plugin (it names the chart's hookDir).
3. The controller Deployment's pod (user 65532, read-only root) runs from the same image, holds
   the Lease vgpu-dra-controller, and published its webhook CA into both webhook
   configurations.
4. The webhook and the policy path: deploy/examples/legacy/vgpu-manager.yaml, applied as
   written, is translated (no legacy limits left, a claim from a template the webhook made),
   placed by the controller (schedulerName vgpu-scheduler: the policy path) and runs with the
   caps it asked for (1 GiB, 10 %) in its vgpu.conf.
5. A rollout (`maxSurge: 1, maxUnavailable: 0`): the new pod starts next to the old one, the
   old one is deleted once the new one is Ready, the new one takes over; pods with claims
   created throughout all run, no failed prepare.
6. The product image itself (when it is the one running): no test bed inside, the user and
   entry point the chart relies on, and the node runs exactly it.
7. Uninstall (the chart's objects deleted, as `helm uninstall` does; helm itself is in
   deploy/test_chart.py): the plugin pod is terminated for real, and the CDI specs and claim
   directories of the prepared claims stay on the node unchanged, their pods keep running.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.e2e.deploy import bed_chart
from tests.e2e.deploy.bed_chart import (
    CONTROLLER_LABELS,
    DRIVER,
    JSON,
    NAMESPACE,
    NODE_NAME,
    PLUGIN_LABELS,
    RELEASE,
    one_ready,
    pod_log,
    pods,
    ready,
    wait_for,
)
from tests.fixtures.chart import collection_path, helm_binary, object_path
from tests.fixtures.cluster import require_real_nodes
from tests.fixtures.image_tree import built_tree
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.fakegpu import simulator as fakegpu
from vgpu_testbed.realnode.images import WORKLOAD
from vgpu_testbed.realnode.node import RealNode, start_real_nodes

pytestmark = pytest.mark.timeout(900)


class Bed:
    """The module's cluster, its real node, and what runs there."""

    def __init__(self, cluster: Cluster, node: RealNode, archive: Path | None) -> None:
        self.cluster = cluster
        self.node = node
        self.archive = archive  # the product image's, or None: the packed tree runs
        self.webhook_port = 0
        self.objects: list[JSON] = []


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    require_real_nodes()
    helm_binary()
    tree = built_tree()
    archive, why = bed_chart.product_image(tree)
    if archive is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI builds the product image first (.ci/run): {why}", pytrace=False)
        print(f"the packed image tree stands in for the product image: {why}")
    cluster = Cluster.start(tmp_path_factory.mktemp("install"), ["a10-pcie"], die_with_parent=True)
    nodes: dict[str, RealNode] = {}
    try:
        nodes = start_real_nodes(cluster)
        node = nodes[NODE_NAME]
        # The chart's pod replaces the plugin the bed started (same state dir: it resumes).
        cluster.stop_process(node.plugin_process)
        image = bed_chart.node_image(tree, cluster.root / "images", archive)
        seconds = bed_chart.import_as_default(node, image)
        size = image.archive.stat().st_size >> 20
        print(f"imported {image.archive} ({size} MiB) in {seconds:.1f} s")
        yield Bed(cluster, node, archive)
    finally:
        for one in nodes.values():
            one.stop()
        assert not cluster.stop(keep_logs=True)


@pytest.fixture(scope="module")
def client(bed: Bed) -> Iterator[KubeClient]:
    kc = KubeClient.from_kubeconfig(str(bed.cluster.kubeconfig))
    yield kc
    kc.close()


def node_slices(client: KubeClient) -> list[JSON]:
    return [
        s
        for s in client.list(
            kube.path(RESOURCE_API, "resourceslices"), field_selector=f"spec.driver={DRIVER}"
        )
        if s["spec"].get("nodeName") == NODE_NAME
    ]


def _exists(client: KubeClient, path: str) -> bool:
    try:
        client.get(path)
    except kube.KubeError:
        return False
    return True


def new_namespace(client: KubeClient, name: str, template: bool = True) -> None:
    """A namespace with its default ServiceAccount (and the module's claim template)."""
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": name}})
    wait_for(
        f"the default ServiceAccount of {name}",
        lambda: _exists(client, kube.path("v1", "serviceaccounts", "default", namespace=name)),
    )
    if template:
        client.create(kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=name), TEMPLATE)


@pytest.fixture(scope="module")
def installed(bed: Bed, client: KubeClient, tmp_path_factory: pytest.TempPathFactory) -> JSON:
    """The chart's objects created; every part running (the plugin Ready, the controller Ready,
    its CA published into the webhook configurations). Returns the plugin pod."""
    node = bed.node
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    account = kube.path("v1", "serviceaccounts", "default", namespace=NAMESPACE)
    wait_for("the namespace's default ServiceAccount", lambda: _exists(client, account))
    client.create(kube.path("node.k8s.io/v1", "runtimeclasses"), bed_chart.runtime_class())
    # Slices of the bed's own plugin go: the DaemonSet's plugin must publish them itself.
    for found in node_slices(client):
        client.delete(kube.path(RESOURCE_API, "resourceslices", found["metadata"]["name"]))
    bed.webhook_port = bed_chart.start_webhook_relay(bed.cluster, node)
    bed.objects = bed_chart.chart_objects(tmp_path_factory.mktemp("helm"), node, bed.webhook_port)
    t0 = time.monotonic()
    for obj in bed.objects:
        client.create(collection_path(obj, NAMESPACE), obj)
    try:
        pod = wait_for("the plugin pod to be Ready", lambda: one_ready(client, PLUGIN_LABELS))
        plugin_ready = time.monotonic() - t0
        wait_for("the controller pod to be Ready", lambda: one_ready(client, CONTROLLER_LABELS))
        wait_for("the webhook's CA in its configurations", lambda: bed_chart.ca_published(
            client, bed.objects))  # fmt: skip
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{bed_chart.explain(client, node)}") from err
    print(
        f"after the chart's objects were created: plugin pod Ready {plugin_ready:.1f} s, "
        f"controller Ready and webhook CA published {time.monotonic() - t0:.1f} s; the plugin "
        f"process served its sockets {bed_chart.plugin_start_seconds(node, pod):.2f} s after it "
        "started"
    )
    return pod


def test_chart_daemonset_runs_the_plugin_and_a_gpu_pod(
    bed: Bed, client: KubeClient, installed: JSON
) -> None:
    node = bed.node
    slices = wait_for("node-1's slices from the DaemonSet's plugin", lambda: node_slices(client))
    devices = sorted(d["name"] for s in slices for d in s["spec"]["devices"])
    gpus = len(fakegpu.load_profile(node.profile).gpus)
    assert devices == sorted(f"gpu-{i}" for i in range(gpus))
    # The bed serves consumable capacity: the plugin's start-up probe chose the shareable form.
    assert all(d.get("allowMultipleAllocations") for s in slices for d in s["spec"]["devices"])
    registry = node.paths.root / "plugins_registry"
    own = bed_chart.registration_socket(node, installed)
    # Registered under its pod-UID names; the bed plugin's fixed-name socket went with it.
    assert sorted(p.name for p in registry.iterdir()) == [own.name]
    hook = node.paths.root / "hook" / "libvgpu.so"
    assert hook.is_file()  # the init container installed it
    log = pod_log(node, installed, "kubelet-plugin")
    assert "is running" in log, log[-3000:]
    # Its ServiceAccount (the projected token the kubelet mounted) allows all it does, and it
    # runs unprivileged in the nvidia RuntimeClass (the chart's default nvml.mode).
    spec = installed["spec"]
    assert spec["serviceAccountName"] == f"{RELEASE}-vgpu-dra-kubelet-plugin"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["containers"][0]["securityContext"]["privileged"] is False

    namespace = "work"
    new_namespace(client, namespace)
    claim_pod(client, namespace, "first")
    wait_for("the GPU pod to run", lambda: pod_ready(client, namespace, "first"))
    (claim,) = client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
    cdi = node.layout.cdi_dir / f"k8s.{DRIVER}-claim_{claim['metadata']['uid']}.json"
    assert str(hook) in cdi.read_text()  # written by the chart's plugin: the chart's hookDir
    log = pod_log(node, installed, "kubelet-plugin")
    assert "Forbidden" not in log, log[-3000:]


def test_the_charts_probes_pass_in_the_plugin_container(
    bed: Bed, client: KubeClient, installed: JSON
) -> None:
    """Both probe commands as the chart renders them, run in the container through the API
    server and the kubelet (the path `kubectl exec` takes; the kubelet's own probe runs them
    through the same CRI exec): exit status 0. Ready already says the readiness probe passed;
    the liveness probe starts 10 s after the container and a failure shows only as a restart."""
    (container,) = installed["spec"]["containers"]
    api = bed.cluster.api_client()
    try:
        for probe in ("livenessProbe", "readinessProbe"):
            command = container[probe]["exec"]["command"]
            code, out = exec_in(api, installed, "kubelet-plugin", command)
            assert code == 0, f"{probe} {command}: exit {code}: {out}"
        # The exit status is the probe's own: a socket nobody listens on fails it.
        code, _ = exec_in(api, installed, "kubelet-plugin", [command[0], "/tmp/nobody.sock"])
        assert code != 0
    finally:
        api.close()
    pod = client.get(kube.path("v1", "pods", installed["metadata"]["name"], namespace=NAMESPACE))
    statuses = pod["status"]["containerStatuses"]
    assert [s["restartCount"] for s in statuses] == [0]


def exec_in(api: Any, pod: JSON, container: str, command: list[str]) -> tuple[int, str]:
    """command run in the pod's container through the API server: (exit status, output)."""
    from kubernetes import client as k8s
    from kubernetes.stream import stream

    ws = stream(
        k8s.CoreV1Api(api).connect_get_namespaced_pod_exec,
        pod["metadata"]["name"],
        pod["metadata"]["namespace"],
        container=container,
        command=command,
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    try:
        ws.run_forever(timeout=60)
        assert not ws.is_open(), f"{command} still running after 60 s"
        code = ws.returncode  # before read_all(), which drops the status channel
        return int(code), str(ws.read_all())
    finally:
        ws.close()


TEMPLATE: JSON = {
    "metadata": {"name": "small"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "capacity": {"requests": {"memory": "256Mi", "cores": "5"}},
                        },
                    }
                ]
            }
        }
    },
}


def claim_pod(client: KubeClient, namespace: str, name: str) -> None:
    """A pod with a capped claim of its own (from a template, as workloads do)."""
    client.create(
        kube.path("v1", "pods", namespace=namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "containers": [
                    {
                        "name": "work",
                        "image": WORKLOAD,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}],
            },
        },
    )


def pod_ready(client: KubeClient, namespace: str, name: str) -> JSON | None:
    pod: JSON = client.get(kube.path("v1", "pods", name, namespace=namespace))
    return pod if ready(pod) else None


def test_chart_deployment_runs_the_controller_and_its_webhook(
    bed: Bed, client: KubeClient, installed: JSON
) -> None:
    """The controller Deployment's pod (non-root, read-only root) runs from the same image, is
    Ready through its HTTP probes, leads on its Lease, and published its CA."""
    pod = one_ready(client, CONTROLLER_LABELS)
    assert pod is not None
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0, pod_log(bed.node, pod, "controller")[-3000:]
    lease = client.get(
        kube.path("coordination.k8s.io/v1", "leases", "vgpu-dra-controller", namespace=NAMESPACE)
    )
    assert lease["spec"].get("holderIdentity"), lease["spec"]
    log = pod_log(bed.node, pod, "controller")
    assert f"acquired leadership of lease {NAMESPACE}/vgpu-dra-controller" in log
    secret = client.get(
        kube.path("v1", "secrets", f"{RELEASE}-vgpu-dra-webhook-tls", namespace=NAMESPACE)
    )
    assert {"ca.crt", "tls.crt", "tls.key"} <= set(secret.get("data") or {}), sorted(secret)
    assert bed_chart.ca_published(client, bed.objects)


def test_a_vgpu_manager_pod_runs_unchanged(bed: Bed, client: KubeClient, installed: JSON) -> None:
    """deploy/examples/legacy/vgpu-manager.yaml as written: translated by the webhook, placed by
    the controller (its schedulerName asks for the policy path), run with its caps."""
    namespace = "legacy"
    new_namespace(client, namespace, template=False)
    manifest = bed_chart.legacy_pod_manifest()
    name = manifest["metadata"]["name"]
    created = client.create(kube.path("v1", "pods", namespace=namespace), manifest)
    (container,) = created["spec"]["containers"]
    limits = (container.get("resources") or {}).get("limits") or {}
    assert not [k for k in limits if k.startswith("nvidia.com/")], limits
    assert created["metadata"]["annotations"]["vgpu.dra.dev/translated-from"] == "vgpu-manager"
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert [g["name"] for g in created["spec"].get("schedulingGates") or []] == [
        "vgpu.dra.dev/policy"
    ]
    pod = wait_for(f"pod {name} to run", lambda: pod_ready(client, namespace, name))
    assert not pod["spec"].get("schedulingGates")  # the controller placed it and lifted the gate
    (claim,) = client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
    conf = bed.node.paths.state_dir / "claims" / claim["metadata"]["uid"] / "vgpu.conf"
    (device,) = [line for line in conf.read_text().splitlines() if line.startswith("device ")]
    fields = dict(token.split("=", 1) for token in device.split()[1:])
    assert (int(fields["memory"]), int(fields["cores"])) == (1024 << 20, 10), device


def test_surge_rollout_loses_no_prepare(bed: Bed, client: KubeClient, installed: JSON) -> None:
    node = bed.node
    namespace = "rollout"
    new_namespace(client, namespace)
    (old,) = [p for p in pods(client, PLUGIN_LABELS) if ready(p)]
    ds_path = kube.path(
        "apps/v1", "daemonsets", f"{RELEASE}-vgpu-dra-kubelet-plugin", namespace=NAMESPACE
    )
    ds = client.get(ds_path)
    annotations = copy.deepcopy(ds["spec"]["template"]["metadata"].get("annotations") or {})
    annotations["bed/rollout"] = "1"
    t0 = time.monotonic()
    client.merge_patch(ds_path, {"spec": {"template": {"metadata": {"annotations": annotations}}}})

    # Pods with claims, created one after another throughout the rollout.
    names: list[str] = []
    while True:
        name = f"during-{len(names)}"
        claim_pod(client, namespace, name)
        names.append(name)
        found = pods(client, PLUGIN_LABELS)
        rolled = len(found) == 1 and found[0]["metadata"]["uid"] != old["metadata"]["uid"]
        if rolled and ready(found[0]) and len(names) >= 6:
            break
        assert time.monotonic() - t0 < 300, "the rollout did not finish"
        time.sleep(1.0)
    rollout_s = time.monotonic() - t0
    (new,) = pods(client, PLUGIN_LABELS)
    for name in names:
        wait_for(f"pod {name} to run", functools.partial(pod_ready, client, namespace, name))
    failed = [
        e
        for e in client.list(kube.path("v1", "events", namespace=namespace))
        if e.get("reason") == "FailedPrepareDynamicResources"
    ]
    assert failed == [], [e.get("message") for e in failed]
    new_log = pod_log(node, new, "kubelet-plugin")
    # The two pods overlapped: the new one waited for the node lock the old one held (and
    # meanwhile forwarded the kubelet's calls to it), then took over.
    assert "waiting up to" in new_log, new_log[-3000:]
    assert "took over the node" in new_log, new_log[-3000:]
    print(f"rollout: {rollout_s:.1f} s, {len(names)} pods with claims created meanwhile, all ran")


def test_the_product_image_holds_the_product_only(bed: Bed, client: KubeClient) -> None:
    """`make image`'s image, when it is the one the node runs: the user and entry point the
    chart's pods rely on, no test bed, and the plugin pod runs exactly it."""
    if bed.archive is None:
        pytest.skip("the packed image tree runs here, not the product image (`make image`)")
    config = bed_chart.archive_config(bed.archive)["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["vgpu-dra"]
    paths = [path for path, _, _ in bed_chart.archive_paths(bed.archive)]
    assert any(p.startswith(bed_chart.SITE + "kubelet_plugin/") for p in paths)
    assert [p for p in paths if "vgpu_testbed" in p or "fakegpu" in p] == []
    config_digest = bed_chart.archive_manifest(bed.archive)["Config"].removesuffix(".json")
    (plugin,) = pods(client, PLUGIN_LABELS)
    image_ids = [s["imageID"] for s in plugin["status"]["containerStatuses"]]
    assert all(config_digest.removeprefix("blobs/sha256/") in i for i in image_ids), image_ids


def digest(roots: list[Path]) -> dict[str, str]:
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for root in roots
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_uninstall_keeps_prepared_claims_on_the_node(
    bed: Bed, client: KubeClient, installed: JSON
) -> None:
    """Runs last (pytest keeps the module's order): removes the chart. The claims of the
    earlier tests' pods stay prepared: nothing on the node may go with the plugin pod."""
    node = bed.node
    claims = [
        c
        for namespace in ("work", "legacy", "rollout")
        for c in client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
    ]
    assert claims, "the earlier tests prepared claims"
    ours = [node.layout.cdi_dir / f"k8s.{DRIVER}-claim_{c['metadata']['uid']}.json" for c in claims]
    node_files = [node.layout.cdi_dir, node.paths.state_dir / "claims"]
    before = digest(node_files)
    assert {str(p) for p in ours} <= set(before)
    assert any(p.endswith("vgpu.conf") for p in before)
    assert [p for p in pods(client, PLUGIN_LABELS) if ready(p)]

    # What `helm uninstall` does: every object of the release deleted (no hooks, no Jobs: the
    # render test in deploy/test_chart.py asserts the chart has none).
    for obj in reversed(bed.objects):
        client.delete(object_path(obj, NAMESPACE))
    wait_for("the plugin pods to be gone", lambda: not _pods_left(client))
    assert digest(node_files) == before
    for claim in claims:
        (owner,) = claim["status"]["reservedFor"]
        namespace = claim["metadata"]["namespace"]
        assert pod_ready(client, namespace, owner["name"]), owner["name"]


def _pods_left(client: KubeClient) -> list[JSON]:
    return client.list(kube.path("v1", "pods", namespace=NAMESPACE), label_selector=PLUGIN_LABELS)
