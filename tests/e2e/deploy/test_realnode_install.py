"""The install path on a real bed node: image tree -> OCI image -> containerd -> the chart's
DaemonSet pod -> slices -> a GPU pod prepared through it; then a surge rollout of the DaemonSet.

One real node (`vgpu_testbed.realnode`: the real kubelet, containerd with CDI, runc; a simulated
a10-pcie). The image is the file tree `make image-tree` builds (what the Dockerfile copies),
packed with the bed's interpreter as an OCI archive (`realnode.plugin_image`) and imported into
the node's containerd. The chart is rendered by the real helm binary with the node's directories
as its host paths and `nvml.mode=hostDevices` (privileged, /dev and the driver library dir
mounted); the objects are created in the bed's API server and the bed's DaemonSet controller,
scheduler and kubelet do the rest.

What the bed cannot give a chart pod, and the test adds to the rendered DaemonSet (nothing else
is changed):
- `hostNetwork: true` and KUBERNETES_SERVICE_HOST/PORT = the node's 127.0.0.1 relay of the API
  server: the bed has no kube-proxy (a Service IP leads nowhere) and the API server's
  certificate names 127.0.0.1 only.
- the simulated driver's state: its VGPU_SIM_* environment and a hostPath mount of its files
  (a real node's driver needs neither).

What this proves:
1. The DaemonSet pod runs from the image (init container installs the hook into the chart's
   hookDir, the plugin starts), becomes Ready through the chart's probes, registers with the
   kubelet under its pod-UID socket names, and publishes the node's slices.
   The chart's own liveness and readiness probe commands, run inside the running plugin
   container through the API server (`kubectl exec`), both pass.
2. Least privilege in practice: the plugin runs with the chart's ServiceAccount token (the
   kubelet's projected one, bound to the pod), publishes the node's slices in the shareable form
   the bed's API server serves (consumable capacity) and prepares claims, and its log shows no
   Forbidden answer. A pod with a claim runs; its CDI spec was written by the DaemonSet's plugin
   (it names the chart's hookDir).
3. A rollout (`maxSurge: 1, maxUnavailable: 0`): the DaemonSet controller starts the new pod
   next to the old one, deletes the old one once the new one is Ready, and the new one takes
   over; pods with claims created throughout the rollout all run, and the kubelet reports no
   failed prepare (no FailedPrepareDynamicResources event).
4. Uninstall (the chart's objects deleted, as `helm uninstall` does; helm itself is in
   deploy/test_chart.py): the plugin pod is terminated for real, and the CDI specs and claim
   directories of the prepared claims stay on the node unchanged, their pods keep running.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from kubelet_plugin.server import SocketPaths
from tests.fixtures.chart import JSON, by_kind, collection_path, object_path, render
from tests.fixtures.cluster import require_real_nodes
from tests.fixtures.image_tree import built_tree
from vgpu_testbed import polling
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.cluster.flags import free_ports
from vgpu_testbed.fakegpu import simulator as fakegpu
from vgpu_testbed.realnode.images import WORKLOAD, import_images
from vgpu_testbed.realnode.node import RealNode, start_real_nodes
from vgpu_testbed.realnode.plugin_image import PLUGIN_IMAGE, build_plugin_image

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[3]
NODE = "node-1"
NAMESPACE = "vgpu-dra"
RELEASE = "bed"
DRIVER = "vgpu.dra.dev"
PLUGIN_LABELS = "app.kubernetes.io/component=kubelet-plugin"
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 180.0) -> T:
    return polling.wait_for(what, fn, timeout, interval=0.5)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, RealNode]]:
    require_real_nodes()
    tree = built_tree()
    cluster = Cluster.start(tmp_path_factory.mktemp("install"), ["a10-pcie"], die_with_parent=True)
    nodes: dict[str, RealNode] = {}
    try:
        nodes = start_real_nodes(cluster)
        node = nodes[NODE]
        # The chart's pod replaces the plugin the bed started (same state dir: it resumes).
        cluster.stop_process(node.plugin_process)
        image = build_plugin_image(tree, cluster.root / "images")
        import_images(node.ctr_bin / "ctr", node.layout.containerd_socket, [image])
        yield cluster, node
    finally:
        for one in nodes.values():
            one.stop()
        assert not cluster.stop(keep_logs=True)


@pytest.fixture(scope="module")
def client(bed: tuple[Cluster, RealNode]) -> Iterator[KubeClient]:
    kc = KubeClient.from_kubeconfig(str(bed[0].kubeconfig))
    yield kc
    kc.close()


def chart_objects(home: Path, node: RealNode) -> list[JSON]:
    """The chart rendered for the bed node, plus what only the bed needs (module docstring)."""
    values = {
        "image": {
            "repository": PLUGIN_IMAGE.rsplit(":", 1)[0],
            "tag": PLUGIN_IMAGE.rsplit(":", 1)[1],
            "pullPolicy": "Never",
        },
        "kubeletPlugin": {
            "kubeletDir": str(node.paths.root),  # the kubelet's --root-dir
            "cdiRoot": str(node.layout.cdi_dir),  # containerd's CDI dir
            "stateDir": str(node.paths.state_dir),
            "hookDir": str(node.paths.root / "hook"),
            "nvidiaCdiSpecDirs": [str(node.layout.cdi_dir)],
            "nvml": {"mode": "hostDevices", "driverLibDir": str(fakegpu.library_dir())},
            "resyncSeconds": 5,
            "takeoverTimeoutSeconds": 120,
        },
        # One replica: with the host's network two would share one health port on one node.
        "controller": {"enabled": True, "replicas": 1, "healthPort": free_ports(1)[0]},
        # The API server cannot reach the webhook's Service here (no Service routing; the node
        # relay refuses it), and the fail-closed claim validation would refuse this module's
        # claims: scope the webhook to namespaces with a label no test sets, as test_chart does
        # (tests/e2e/controller/test_webhook.py covers the webhook through the bed's URL).
        "webhook": {"namespaceSelector": {"matchLabels": {"vgpu-dra.test/webhook": "on"}}},
    }
    docs = render(home, values, namespace=NAMESPACE, release=RELEASE)
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    port = node.bed.state.ports["kube-apiserver"]
    for workload in [ds, *by_kind(docs, "Deployment")]:
        spec = workload["spec"]["template"]["spec"]
        spec["hostNetwork"] = True
        for one in spec["containers"]:
            one["env"] += [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
            ]
    sim_files = sorted(
        {str(Path(v).parent) for k, v in node.gpu_env.items() if k != "LD_LIBRARY_PATH"}
    )
    container["env"] += [
        *(
            {"name": k, "value": v}
            for k, v in sorted(node.gpu_env.items())
            if k != "LD_LIBRARY_PATH"
        ),
    ]
    for index, directory in enumerate(sim_files):
        name = f"simulated-driver-{index}"
        pod["volumes"].append({"name": name, "hostPath": {"path": directory}})
        container["volumeMounts"].append({"name": name, "mountPath": directory})
    return docs


def plugin_pods(client: KubeClient) -> list[JSON]:
    pods = client.list(kube.path("v1", "pods", namespace=NAMESPACE), label_selector=PLUGIN_LABELS)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def ready(pod: JSON) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pod_log(node: RealNode, pod: JSON, container: str) -> str:
    meta = pod["metadata"]
    directory = node.layout.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    logs = sorted((directory / container).glob("*.log"))
    return "\n".join(p.read_text() for p in logs)


def node_slices(client: KubeClient) -> list[JSON]:
    return [
        s
        for s in client.list(
            kube.path(RESOURCE_API, "resourceslices"), field_selector=f"spec.driver={DRIVER}"
        )
        if s["spec"].get("nodeName") == NODE
    ]


def claim_pod(client: KubeClient, namespace: str, name: str) -> None:
    """A pod with a capped claim of its own (from a template, as workloads do)."""
    client.create(
        kube.path("v1", "pods", namespace=namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": NODE},
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
    pod = client.get(kube.path("v1", "pods", name, namespace=namespace))
    return pod if ready(pod) else None


@pytest.fixture(scope="module")
def installed(
    bed: tuple[Cluster, RealNode], client: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> JSON:
    """The chart's objects created; returns the DaemonSet's first Ready pod."""
    _, node = bed
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    account = kube.path("v1", "serviceaccounts", "default", namespace=NAMESPACE)
    wait_for("the namespace's default ServiceAccount", lambda: _exists(client, account))
    # Slices of the bed's own plugin go: the DaemonSet's plugin must publish them itself.
    for found in node_slices(client):
        client.delete(kube.path(RESOURCE_API, "resourceslices", found["metadata"]["name"]))
    t0 = time.monotonic()
    for obj in chart_objects(tmp_path_factory.mktemp("helm"), node):
        client.create(collection_path(obj, NAMESPACE), obj)
    pod = wait_for("the DaemonSet's plugin pod to be Ready", lambda: _one_ready(client))
    print(f"plugin pod Ready {time.monotonic() - t0:.1f} s after the chart's objects were created")
    return pod


def _one_ready(client: KubeClient) -> JSON | None:
    pods = [p for p in plugin_pods(client) if ready(p)]
    return pods[0] if len(pods) == 1 else None


def _exists(client: KubeClient, path: str) -> bool:
    try:
        client.get(path)
    except kube.KubeError:
        return False
    return True


def test_chart_daemonset_runs_the_plugin_and_a_gpu_pod(
    bed: tuple[Cluster, RealNode], client: KubeClient, installed: JSON
) -> None:
    _, node = bed
    uid = installed["metadata"]["uid"]
    slices = wait_for("node-1's slices from the DaemonSet's plugin", lambda: node_slices(client))
    devices = sorted(d["name"] for s in slices for d in s["spec"]["devices"])
    gpus = len(fakegpu.load_profile(node.profile).gpus)
    assert devices == sorted(f"gpu-{i}" for i in range(gpus))
    # The bed serves consumable capacity: the plugin's start-up probe chose the shareable form.
    assert all(d.get("allowMultipleAllocations") for s in slices for d in s["spec"]["devices"])
    registry = node.paths.root / "plugins_registry"
    own = SocketPaths.for_instance(
        DRIVER,
        plugin_dir=str(node.paths.root / "plugins" / DRIVER),
        registrar_dir=str(registry),
        instance=uid,
    )
    # Registered under its pod-UID names; the bed plugin's fixed-name socket went with it.
    assert sorted(p.name for p in registry.iterdir()) == [Path(own.registration).name]
    hook = node.paths.root / "hook" / "libvgpu.so"
    assert hook.is_file()  # the init container installed it
    log = pod_log(node, installed, "kubelet-plugin")
    assert "is running" in log, log[-3000:]
    # Its ServiceAccount (the projected token the kubelet mounted) allows all it does.
    assert installed["spec"]["serviceAccountName"] == f"{RELEASE}-vgpu-dra-kubelet-plugin"

    namespace = "work"
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": namespace}})
    client.create(kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace), TEMPLATE)
    wait_for(
        "the default ServiceAccount",
        lambda: _exists(client, kube.path("v1", "serviceaccounts", "default", namespace=namespace)),
    )
    claim_pod(client, namespace, "first")
    wait_for("the GPU pod to run", lambda: pod_ready(client, namespace, "first"))
    (claim,) = client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
    spec = node.layout.cdi_dir / f"k8s.{DRIVER}-claim_{claim['metadata']['uid']}.json"
    assert str(hook) in spec.read_text()  # written by the chart's plugin: the chart's hookDir
    log = pod_log(node, installed, "kubelet-plugin")
    assert "Forbidden" not in log, log[-3000:]


def test_the_charts_probes_pass_in_the_plugin_container(
    bed: tuple[Cluster, RealNode], client: KubeClient, installed: JSON
) -> None:
    """Both probe commands as the chart renders them, run in the container through the API
    server and the kubelet (the path `kubectl exec` takes; the kubelet's own probe runs them
    through the same CRI exec): exit status 0. Ready already says the readiness probe passed;
    the liveness probe starts 10 s after the container and a failure shows only as a restart."""
    cluster, _ = bed
    (container,) = installed["spec"]["containers"]
    api = cluster.api_client()
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


def test_chart_deployment_runs_the_controller(
    bed: tuple[Cluster, RealNode], client: KubeClient, installed: JSON
) -> None:
    """The controller Deployment's pod (non-root, read-only root) runs from the same image and
    becomes Ready through its HTTP probes."""
    _, node = bed

    def controller_ready() -> JSON | None:
        pods = client.list(
            kube.path("v1", "pods", namespace=NAMESPACE),
            label_selector="app.kubernetes.io/component=controller",
        )
        return next((p for p in pods if ready(p)), None)

    pod = wait_for("the controller pod to be Ready", controller_ready)
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0, pod_log(node, pod, "controller")[-3000:]


def test_surge_rollout_loses_no_prepare(
    bed: tuple[Cluster, RealNode], client: KubeClient, installed: JSON
) -> None:
    _, node = bed
    namespace = "rollout"
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": namespace}})
    client.create(kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace), TEMPLATE)
    wait_for(
        "the default ServiceAccount",
        lambda: _exists(client, kube.path("v1", "serviceaccounts", "default", namespace=namespace)),
    )
    (old,) = [p for p in plugin_pods(client) if ready(p)]
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
        pods = plugin_pods(client)
        rolled = len(pods) == 1 and pods[0]["metadata"]["uid"] != old["metadata"]["uid"]
        if rolled and ready(pods[0]) and len(names) >= 6:
            break
        assert time.monotonic() - t0 < 300, "the rollout did not finish"
        time.sleep(1.0)
    rollout_s = time.monotonic() - t0
    (new,) = plugin_pods(client)
    for name in names:
        wait_for(f"pod {name} to run", lambda n=name: pod_ready(client, namespace, n))
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


def digest(roots: list[Path]) -> dict[str, str]:
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for root in roots
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_uninstall_keeps_prepared_claims_on_the_node(
    bed: tuple[Cluster, RealNode],
    client: KubeClient,
    installed: JSON,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Runs last (pytest keeps the module's order): removes the chart. The claims of the
    earlier tests' pods stay prepared: nothing on the node may go with the plugin pod."""
    _, node = bed
    claims = [
        c
        for namespace in ("work", "rollout")
        for c in client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
    ]
    assert claims, "the earlier tests prepared claims"
    ours = [node.layout.cdi_dir / f"k8s.{DRIVER}-claim_{c['metadata']['uid']}.json" for c in claims]
    node_files = [node.layout.cdi_dir, node.paths.state_dir / "claims"]
    before = digest(node_files)
    assert {str(p) for p in ours} <= set(before)
    assert any(p.endswith("vgpu.conf") for p in before)
    running = [p for p in plugin_pods(client) if ready(p)]
    assert running

    # What `helm uninstall` does: every object of the release deleted (no hooks, no Jobs: the
    # render test in deploy/test_chart.py asserts the chart has none).
    for obj in reversed(chart_objects(tmp_path_factory.mktemp("helm"), node)):
        client.delete(object_path(obj, NAMESPACE))
    wait_for("the plugin pods to be gone", lambda: not _pods_left(client))
    assert digest(node_files) == before
    for claim in claims:
        (owner,) = claim["status"]["reservedFor"]
        namespace = claim["metadata"]["namespace"]
        assert pod_ready(client, namespace, owner["name"]), owner["name"]


def _pods_left(client: KubeClient) -> list[JSON]:
    return client.list(kube.path("v1", "pods", namespace=NAMESPACE), label_selector=PLUGIN_LABELS)
