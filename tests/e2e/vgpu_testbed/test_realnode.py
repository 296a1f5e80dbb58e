"""A DRA pod on a real bed node: the real kubelet, containerd (CDI) and runc run it.

The module starts its own cluster with one real node (`vgpu_testbed.realnode`, a simulated
a10-pcie): the node's holder namespaces, containerd, the kubelet plugin and the kubelet. Nothing
here calls the plugin by hand: the kubelet registers it through its plugins registry, calls
NodePrepareResources, containerd applies our CDI spec and the simulated driver's toolkit-like
spec, and runc starts the container.

What this proves:
1. The kubelet reports the node Ready and the plugin's slices are published.
2. A pod with a capped claim (1 GiB, 10 cores) becomes Ready; inside its container the CDI edits
   are applied (claim env, the claim dir with vgpu.conf, /etc/ld.so.preload naming the hook), a
   dynamically linked program has libvgpu.so mapped without asking for it, and NVML (the
   simulated libnvidia-ml, injected by the toolkit-like spec) shows exactly the allocated GPU
   with 1 GiB total: the cap, not the card's 23028 MiB; CUDA cannot allocate beyond it.
3. Deleting the pod unprepares the claim (CDI spec and claim dir gone).
3b. Logs and exec work through the API server (kubectl logs/exec).
4. `dev-cluster up --agents --runtime real` also runs the allocation controller: the gated
   example pod it prints is placed by the controller and runs on the real node.
5. Stopping the node leaves no process or cgroup behind; so does a SIGKILLed starter whose
   node runs a pod (containers and daemonised shims included).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.e2e.vgpu_testbed.policy_path import check_controller_identity, place_example
from tests.fixtures.cluster import admin_client, require_real_nodes
from tests.fixtures.dev_cluster import run_vgpu_dra, short_dir, up_with_agents
from vgpu_testbed import polling
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.realnode import cgroups
from vgpu_testbed.realnode.host import check_host
from vgpu_testbed.realnode.images import WORKLOAD
from vgpu_testbed.realnode.node import RealNode, cgroup_root_of, start_real_nodes

# Longer than the 60 s default: clusters with real nodes (kubelet, containerd) of its own; the first
# test starts two.
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
GIB = 1 << 30
T = TypeVar("T")
NODE = "node-1"


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 90.0) -> T:
    return polling.wait_for(what, fn, timeout, interval=0.25)


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_real_nodes()
    started = Cluster.start(
        tmp_path_factory.mktemp("real"), ["a10-pcie", "dgx-h100"], die_with_parent=True
    )
    try:
        yield started
    finally:
        assert not started.stop(keep_logs=True)


@pytest.fixture(scope="module")
def client(real_cluster: Cluster) -> Iterator[KubeClient]:
    with admin_client(real_cluster) as kc:
        yield kc


@pytest.fixture(scope="module")
def nodes(real_cluster: Cluster, client: KubeClient) -> Iterator[dict[str, RealNode]]:
    device_class = yaml.safe_load((REPO / "deploy" / "deviceclass.yaml").read_text())
    client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class)
    started = start_real_nodes(real_cluster)
    try:
        yield started
    finally:
        for one in started.values():
            one.stop()


@pytest.fixture(scope="module")
def node(nodes: dict[str, RealNode]) -> RealNode:
    """node-1, the simulated a10-pcie."""
    return nodes[NODE]


def kubelet_ready(client: KubeClient) -> bool:
    status = client.get(kube.path("v1", "nodes", NODE)).get("status", {})
    return any(
        c["type"] == "Ready" and c["status"] == "True" and c.get("reason") == "KubeletReady"
        for c in status.get("conditions", [])
    )


def pod_ready(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    pod = client.get(kube.path("v1", "pods", name, namespace=namespace))
    conditions = pod.get("status", {}).get("conditions", [])
    ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return pod if ok else None


def container_log(node: RealNode, namespace: str, pod: dict[str, Any]) -> str:
    uid = pod["metadata"]["uid"]
    path = node.layout.pod_logs / f"{namespace}_{pod['metadata']['name']}_{uid}" / "probe" / "0.log"
    if not path.is_file():
        return ""
    # CRI log lines: "<time> <stream> <F|P> <text>"
    return "\n".join(line.split(" ", 3)[3] for line in path.read_text().splitlines() if line)


PROBE = (
    "echo env:NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
    "echo preload:$(cat /etc/ld.so.preload); ls /run/vgpu-dra/claims/*/vgpu.conf | sed s/^/conf:/; "
    "sed s/^/confline:/ /run/vgpu-dra/claims/*/vgpu.conf; "
    "nvml-query; cuda-probe init alloc:805306368 alloc:536870912; echo done; exec sleep 3600"
)


def test_dra_pod_runs_on_a_real_node(
    real_cluster: Cluster, client: KubeClient, node: RealNode
) -> None:
    wait_for("the kubelet to report the node Ready", lambda: kubelet_ready(client))
    namespace = "realnode"
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": namespace}})
    wait_for(
        "the default ServiceAccount",
        lambda: _exists(client, kube.path("v1", "serviceaccounts", "default", namespace=namespace)),
    )
    client.create(
        kube.path(RESOURCE_API, "resourceclaims", namespace=namespace),
        {
            "metadata": {"name": "capped"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "vgpu.dra.dev",
                                "capacity": {"requests": {"memory": "1Gi", "cores": "10"}},
                            },
                        }
                    ]
                }
            },
        },
    )
    t0 = time.monotonic()
    client.create(
        kube.path("v1", "pods", namespace=namespace),
        {
            "metadata": {"name": "probe"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "containers": [
                    {
                        "name": "probe",
                        "image": WORKLOAD,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", PROBE],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "capped"}],
            },
        },
    )
    pod = wait_for("the pod to be Ready", lambda: pod_ready(client, namespace, "probe"))
    ready_after = time.monotonic() - t0
    claim = client.get(kube.path(RESOURCE_API, "resourceclaims", "capped", namespace=namespace))
    claim_uid = claim["metadata"]["uid"]
    allocated = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    log = wait_for("the probe's output", lambda: _done(container_log(node, namespace, pod)))
    lines = log.splitlines()

    # The CDI edits of our claim spec, applied by containerd.
    # Every claim spec says "void": the GPUs come from the claims' device nodes (CDI mode).
    assert "env:NVIDIA_VISIBLE_DEVICES=void" in lines
    assert "preload:/usr/local/vgpu-dra/lib/libvgpu.so" in lines
    assert f"conf:/run/vgpu-dra/claims/{claim_uid}/vgpu.conf" in lines
    # The hook came in through /etc/ld.so.preload, the driver through the toolkit-like spec.
    assert "hook=mapped" in lines
    gpus = [line for line in lines if line.startswith("gpu ")]
    assert "count=1" in lines, log
    fields = dict(re.findall(r"(uuid|total|used|free)=(\S+)", gpus[0]))
    # The one GPU the container sees is the claim's (vgpu.conf names it by UUID).
    device_line = next(line for line in lines if line.startswith("confline:device "))
    assert f"uuid={fields['uuid']}" in device_line.split(), device_line
    assert int(fields["total"]) == GIB, f"NVML total {fields['total']} is not the 1 GiB cap"
    # The cap holds for CUDA too: 768 MiB fit, 512 MiB more do not (2 = out of memory), on a
    # card with 23028 MiB.
    assert "alloc rc=0 bytes=805306368" in lines, log
    assert "alloc rc=2 bytes=536870912" in lines, log
    assert allocated.startswith("gpu-")
    assert node.paths.cdi_spec(claim_uid).is_file()
    print(f"pod Ready {ready_after:.1f}s after creation")

    client.delete(kube.path("v1", "pods", "probe", namespace=namespace))
    wait_for(
        "the pod to be gone",
        lambda: not _exists(client, kube.path("v1", "pods", "probe", namespace=namespace)),
    )
    wait_for("the claim to be unprepared", lambda: not node.paths.cdi_spec(claim_uid).exists())
    assert not node.paths.claim_dir(claim_uid).exists()


def test_logs_and_exec_through_the_api_server(real_cluster: Cluster, node: RealNode) -> None:
    """kubectl logs/exec: the API server reaches the kubelet at its InternalIP through the bed
    network's egress relay, verifies its CA-signed serving certificate, and authenticates with
    its kubelet client certificate."""
    from kubernetes import client as k8s
    from kubernetes.stream import stream

    api = real_cluster.api_client()
    try:
        core = k8s.CoreV1Api(api)
        pod = _pod("talker")
        pod["spec"]["terminationGracePeriodSeconds"] = 1
        pod["spec"]["containers"][0]["command"] = ["sh", "-c", "echo said-hello; exec sleep 3600"]
        core.create_namespaced_pod("default", pod)
        wait_for("the pod to be Ready", lambda: pod_ready_api(core, "talker"))
        log = wait_for(
            "the container's log", lambda: core.read_namespaced_pod_log("talker", "default")
        )
        assert log.splitlines() == ["said-hello"]
        out = stream(
            core.connect_get_namespaced_pod_exec,
            "talker",
            "default",
            command=["sh", "-c", "echo exec-$((6 * 7)); cat /proc/1/cmdline | tr '\\0' ' '"],
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )
        assert out.splitlines() == ["exec-42", "sleep 3600 "]
        core.delete_namespaced_pod("talker", "default")
    finally:
        api.close()


def pod_ready_api(core: Any, name: str) -> bool:
    statuses = core.read_namespaced_pod(name, "default").status.container_statuses or []
    return bool(statuses) and all(s.ready for s in statuses)


EXAMPLE_GPUS = {  # pod -> (GPUs it sees, NVML total per GPU or None for the whole card)
    "whole-gpu": (1, None),
    "shared-gpu": (1, GIB),
    "a10-only": (1, 4 * GIB),
    "nvlink-pair": (2, None),
}


def test_deploy_examples_run_for_real(real_cluster: Cluster, nodes: dict[str, RealNode]) -> None:
    """Every deploy/examples manifest, as it is but for the image, runs on the real nodes; each
    container sees through NVML exactly the GPUs and memory its claim was given."""
    from kubernetes import client as k8s

    kc = KubeClient.from_kubeconfig(str(real_cluster.kubeconfig))
    api = real_cluster.api_client()
    namespace = "examples"
    try:
        kc.create(kube.path("v1", "namespaces"), {"metadata": {"name": namespace}})
        wait_for(
            "the default ServiceAccount",
            lambda: _exists(kc, kube.path("v1", "serviceaccounts", "default", namespace=namespace)),
        )
        for manifest in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
            for doc in yaml.safe_load_all(manifest.read_text()):
                if doc["kind"] == "Pod":
                    doc["spec"]["terminationGracePeriodSeconds"] = 1
                    for container in doc["spec"]["containers"]:
                        container["image"] = WORKLOAD
                        container["imagePullPolicy"] = "Never"
                        container["command"] = ["sh", "-c", "nvml-query; exec sleep 3600"]
                    kc.create(kube.path("v1", "pods", namespace=namespace), doc)
                else:
                    plural = "resourceclaimtemplates"
                    kc.create(kube.path(RESOURCE_API, plural, namespace=namespace), doc)
        core = k8s.CoreV1Api(api)
        for pod, (count, total) in EXAMPLE_GPUS.items():
            wait_for(f"pod {pod} to be Ready", lambda p=pod: pod_ready(kc, namespace, p))
            log = wait_for(
                f"{pod}'s NVML view",
                lambda p=pod: _gpu_lines(core.read_namespaced_pod_log(p, namespace)),
            )
            assert f"count={count}" in log, (pod, log)
            gpus = [dict(re.findall(r"(uuid|total)=(\S+)", line)) for line in log if "gpu " in line]
            assert len(gpus) == count, (pod, log)
            if total is not None:
                assert all(int(g["total"]) == total for g in gpus), (pod, log)
            if pod == "a10-only":
                assert "name=NVIDIA A10 " in " ".join(log) + " ", log
        for pod in EXAMPLE_GPUS:
            kc.delete(kube.path("v1", "pods", pod, namespace=namespace))
        for pod in EXAMPLE_GPUS:
            wait_for(
                f"pod {pod} to be gone",
                lambda p=pod: not _exists(kc, kube.path("v1", "pods", p, namespace=namespace)),
            )
        for one in nodes.values():
            wait_for(
                f"{one.node_name}: every claim unprepared",
                lambda n=one: not list(n.paths.state_dir.glob("claims/*")),
            )
    finally:
        api.close()
        kc.close()


def _gpu_lines(log: str) -> list[str] | None:
    lines = log.splitlines()
    return lines if any(line.startswith("count=") for line in lines) else None


def test_stopping_a_real_node_leaves_nothing(real_cluster: Cluster, node: RealNode) -> None:
    pid1 = node.pid1
    root = node.cgroup_root
    assert cgroups.existing(root), "the node's cgroup root should exist while it runs"
    node.stop()
    assert not Path(f"/proc/{pid1}").exists(), "the node's PID 1 survived"
    assert not cgroups.existing(root), f"cgroups left: {cgroups.existing(root)}"
    names = {p.name for p in real_cluster.processes}
    assert not any(n.endswith(f"-{NODE}") for n in names), names


def _exists(client: KubeClient, path: str) -> bool:
    try:
        client.get(path)
    except kube.NotFound:
        return False
    return True


def _done(log: str) -> str | None:
    return log if "done" in log.splitlines() else None


STARTER = """
import sys, time
from pathlib import Path
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.realnode.node import start_real_nodes

cluster = Cluster.start(Path(sys.argv[1]), ["a10-pcie"], die_with_parent=True)
start_real_nodes(cluster)
print("READY", flush=True)
time.sleep(3600)
"""


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "sleep",
                    "image": WORKLOAD,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ]
        },
    }


def _mentions(root: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(root) in cmdline:
                found.append(int(proc.name))
    return found


def test_sigkilled_starter_leaves_no_node_behind() -> None:
    require_real_nodes()
    if check_host():
        pytest.skip(f"real nodes not possible here: {check_host()}")
    with short_dir("rn-") as short:
        _sigkill_starter(short / "crash")


def _sigkill_starter(root: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(root)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert starter.stdout is not None
        assert starter.stdout.readline().strip() == "READY"
        cluster = Cluster.attach(root)
        kc = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        try:
            wait_for("the kubelet to report the node Ready", lambda: kubelet_ready(kc))
            kc.create(kube.path("v1", "pods", namespace="default"), _pod("sleeper"))
            wait_for("the pod to be Ready", lambda: pod_ready(kc, "default", "sleeper"))
        finally:
            kc.close()
        pid1 = int((root / "nodes" / NODE / "run" / "holder.pid").read_text())
        cgroup_root = cgroup_root_of(root, NODE)
        assert cgroups.existing(cgroup_root)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        wait_for("every process of the cluster to end", lambda: not _mentions(root), timeout=30)
        wait_for("the node's PID 1 to end", lambda: not Path(f"/proc/{pid1}").exists(), 30)
        wait_for("the node's cgroups to go", lambda: not cgroups.existing(cgroup_root), 30)
    finally:
        if starter.poll() is None:
            starter.kill()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_vgpu_dra("dev-cluster", *args, cwd=cwd, timeout=300)


def test_dev_cluster_up_with_real_nodes_and_down() -> None:
    require_real_nodes()
    if check_host():
        pytest.skip(f"real nodes not possible here: {check_host()}")
    with short_dir("rn-") as short:
        root = short / "c"
        up = up_with_agents(root, "real", "a10-pcie", timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "node-1: real node ready in" in up.stdout
        assert up.stdout.splitlines()[-1] == f"export KUBECONFIG={root}/kubeconfig"
        cluster = Cluster.attach(root)
        names = {p.name for p in cluster.processes}
        assert {"containerd-node-1", "kubelet-node-1", "kubelet-plugin-node-1"} <= names
        assert "vgpu-dra-controller" in names
        status = _cli("status", "--dir", str(root), cwd=short)
        assert status.returncode == 0, status.stdout
        # The allocation controller runs with the chart's RBAC; the gated example it prints is
        # placed by it, bound by kube-scheduler and started by the real kubelet.
        check_controller_identity(cluster)
        assert place_example(cluster, up.stdout, running=True)[0] == NODE
        cgroup_root = cgroup_root_of(root, NODE)
        assert cgroups.existing(cgroup_root)
        # The node's mounts (rootfs, volumes, netns files) and the bed's links stay in the
        # namespaces the bed created: the host sees none of them, before or after.
        links_before = _host_links()
        assert not _host_mounts(root)
        assert not {"bedbr0", "cni0", "vn0"} & links_before
        down = _cli("down", "--dir", str(root), cwd=short)
        assert down.returncode == 0, down.stderr
        assert not _mentions(root)
        assert not cgroups.existing(cgroup_root)
        assert not _host_mounts(root)
        assert _host_links() <= links_before
        assert not root.exists()


def _host_mounts(root: Path) -> list[str]:
    return [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(root) in line
    ]


def _host_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}
