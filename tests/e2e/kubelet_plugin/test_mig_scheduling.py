"""Dynamic MIG on a real node with the real kube-scheduler (issue 26, item 2; docs/mig.md).

node-1 (a simulated `dgx-h100`, eight H100 80 GB) runs for real (kubelet, containerd, runc) with
its kubelet plugin started `--mig-mode 0=dynamic` (the bed's `mig_mode`, docs/testbed.md, "A node
in MIG mode"): GPU 0 is switched to MIG mode at start-up and published as partitionable devices
(a counter set, one device per placement, the whole GPU consuming every counter); GPUs 1-7 stay
plain GPUs with shares. kube-scheduler allocates every claim here (no policy path).

What this proves:
1. A pod whose claim selects a 1g.10gb MIG device by CEL (`profile`, `parentUUID`) runs; in its
   container the simulated CUDA (the toolkit-like CDI spec's libcuda, under the hook) sees one
   device whose cuDeviceTotalMem is the instance's memory (the device's `memoryBytes`,
   9984 MiB), with the instance's MIG UUID; the container's CUDA_VISIBLE_DEVICES is that
   MIG-<uuid>. When the pod is deleted the instance is destroyed: NVML on the node lists no GPU
   instance on GPU 0 and the plugin's ledger is empty.
2. kube-scheduler refuses the whole GPU 0 while one of its MIG devices is allocated (the pod
   stays Pending, PodScheduled=False/Unschedulable from the scheduler), and runs it once the
   MIG pod is gone; the reverse: a MIG pod of GPU 0 stays Pending while the whole GPU is
   allocated, and runs once the whole-GPU pod is gone.
3. Start latency, creation to Running as the API shows it: dynamic MIG pods vs plain share pods
   (1 GiB on GPU 1) on the same node, alternated; printed (docs/mig.md keeps the figures).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.cluster import require_real_nodes
from tests.fixtures.workloads import DRIVER, claim_template, driver_on_nodes, pod_gone
from vgpu_testbed.polling import wait_for
from vgpu_testbed.realnode.images import WORKLOAD
from vgpu_testbed.realnode.node import RealNode

# Longer than the 60 s default: the module starts a real node and runs a dozen pods.
pytestmark = pytest.mark.timeout(300)

NODE = "node-1"
MIB = 1 << 20
REPO = Path(__file__).resolve().parents[3]
PROFILE = "1g.10gb"
INSTANCE_BYTES = 9984 * MIB  # H100 80 GB, 1g.10gb (docs/mig.md, the profile table)
LATENCY_ROUNDS = 3
A = f'device.attributes["{DRIVER}"]'


def uuid_of(index: int) -> str:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    return fakegpu.load_profile("dgx-h100").gpus[index].uuid


def mig_selector(profile: str = PROFILE, gpu: int = 0) -> str:
    # Whole GPUs carry no `profile`: without has() kube-scheduler fails the claim with "CEL
    # runtime error: no such key" on the first of them (docs/mig.md, "Selecting devices").
    return f'has({A}.profile) && {A}.profile == "{profile}" && {A}.parentUUID == "{uuid_of(gpu)}"'


def whole_gpu_selector(gpu: int = 0) -> str:
    # MIG devices carry no `uuid`: has() keeps the expression from failing on them.
    return f'has({A}.uuid) && {A}.uuid == "{uuid_of(gpu)}" && !has({A}.profile)'


def request(selector: str, memory: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": selector}}],
    }
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return exactly


@pytest.fixture(scope="module")
def node(cluster: Any, client: KubeClient) -> Iterator[RealNode]:
    require_real_nodes()
    with driver_on_nodes(cluster, client, [NODE], [], runtime="real", mig_mode="0=dynamic") as s:
        agents = s[NODE]
        assert isinstance(agents, RealNode)
        wait_for("GPU 0's MIG devices in node-1's slices", lambda: published(client), 60)
        yield agents


def published(client: KubeClient) -> bool:
    slices = client.list(
        kube.path(RESOURCE_API, "resourceslices"), field_selector=f"spec.nodeName={NODE}"
    )
    names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
    return "gpu-0" in names and any(n.startswith("gpu-0-mig-1g10gb-") for n in names)


PROBE = (
    "echo env:CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; "
    "echo env:NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
    "cuda-probe init total uuid; nvml-query; echo done; exec sleep 3600"
)


def start_pod(
    client: KubeClient, namespace: str, name: str, exactly: dict[str, Any], *, probe: bool = False
) -> float:
    """A pod on node-1 with a claim from its own template; returns when it was created
    (time.monotonic()). With `probe`, its container prints what CUDA and NVML see."""
    client.create(
        kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace),
        claim_template(name, exactly),
    )
    command = ["sh", "-c", PROBE] if probe else ["sh", "-c", "exec sleep 3600"]
    pod = {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "c",
                    "image": WORKLOAD,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    created = time.monotonic()
    client.create(kube.path("v1", "pods", namespace=namespace), pod)
    return created


def get_pod(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return client.get(kube.path("v1", "pods", name, namespace=namespace))


def running(client: KubeClient, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = get_pod(client, namespace, name)
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    return wait_for(f"pod {namespace}/{name} Running", check, timeout, interval=0.05)


def unschedulable(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """The scheduler's PodScheduled=False condition of a Pending pod."""

    def check() -> dict[str, Any] | None:
        pod = get_pod(client, namespace, name)
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return dict(c)
        return None

    condition = wait_for(f"the scheduler to refuse {namespace}/{name}", check, 60)
    pod = get_pod(client, namespace, name)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName"), pod["spec"]
    return condition


def delete_pod(client: KubeClient, namespace: str, name: str) -> None:
    client.delete(kube.path("v1", "pods", name, namespace=namespace))
    wait_for(f"pod {namespace}/{name} gone", lambda: pod_gone(client, namespace, name), 60)


def allocated_device(client: KubeClient, namespace: str, pod: dict[str, Any]) -> str:
    (status,) = pod["status"]["resourceClaimStatuses"]
    path = kube.path(
        RESOURCE_API, "resourceclaims", status["resourceClaimName"], namespace=namespace
    )
    claim = client.get(path)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def device_attributes(client: KubeClient, device: str) -> dict[str, Any]:
    slices = client.list(
        kube.path(RESOURCE_API, "resourceslices"), field_selector=f"spec.nodeName={NODE}"
    )
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                return {k: next(iter(v.values())) for k, v in d["attributes"].items()}
    raise AssertionError(f"device {device} is not published")


def container_output(client: KubeClient, namespace: str, name: str) -> list[str]:
    def done() -> list[str] | None:
        path = kube.path("v1", "pods", name, namespace=namespace, subresource="log")
        lines = client.get_text(path).splitlines()
        return lines if "done" in lines else None

    return wait_for(f"the probe's output in {namespace}/{name}", done, 60)


# NVML on the node (its namespaces, the plugin's view): GPU 0's instances.
NODE_VIEW = """
import json
from dra_driver.inventory import discover
from dra_driver.mig_nvml import PyMigNvml
nvml = PyMigNvml()
nvml.init()
gpu = discover(nvml=nvml).gpus[0]
print(json.dumps({
    "enabled": gpu.mig is not None and gpu.mig.enabled,
    "instances": [i.model_dump() for i in gpu.mig.instances] if gpu.mig else [],
}))
nvml.shutdown()
"""


def node_view(node: RealNode) -> dict[str, Any]:
    done = subprocess.run(
        node.enter([sys.executable, "-c", textwrap.dedent(NODE_VIEW)]),
        env={**os.environ, **node.gpu_env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    view: dict[str, Any] = json.loads(done.stdout)
    return view


def ledger(node: RealNode) -> list[Any]:
    path = node.paths.state_dir / "mig-instances.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    entries = data.get("entries", data) if isinstance(data, dict) else data
    return list(entries)


def test_a_1g_pod_sees_the_instance_and_its_instance_goes_with_it(
    node: RealNode, client: KubeClient, namespace: str
) -> None:
    start_pod(client, namespace, "mig", request(mig_selector()), probe=True)
    pod = running(client, namespace, "mig")
    device = allocated_device(client, namespace, pod)
    attributes = device_attributes(client, device)
    assert device.startswith("gpu-0-mig-1g10gb-"), device
    assert attributes["profile"] == PROFILE
    assert attributes["memoryBytes"] == INSTANCE_BYTES

    # The instance exists on the node, created at the allocated placement, in the ledger.
    view = node_view(node)
    assert view["enabled"]
    (instance,) = view["instances"]
    assert instance["start"] == attributes["placementStart"], (instance, attributes)
    assert instance["uuid"] and instance["uuid"].startswith("MIG-")
    assert len(ledger(node)) == 1

    lines = container_output(client, namespace, "mig")
    log = "\n".join(lines)
    assert f"env:CUDA_VISIBLE_DEVICES={instance['uuid']}" in lines, log
    assert "init rc=0" in lines, log
    # The simulated CUDA enumerates the instance: its memory is the device's total, its UUID
    # the instance's (CUDA gives a MIG device's UUID bytes; the probe prints them as GPU-...).
    assert f"total rc=0 bytes={INSTANCE_BYTES}" in lines, log
    assert f"uuid rc=0 GPU-{instance['uuid'].removeprefix('MIG-')}" in lines, log

    delete_pod(client, namespace, "mig")
    # Dynamic MIG: unprepare destroyed the instance; nothing left in NVML nor in the ledger.
    assert node_view(node)["instances"] == []
    assert ledger(node) == []


def test_scheduler_keeps_whole_gpu_and_mig_devices_apart(
    node: RealNode, client: KubeClient, namespace: str
) -> None:
    del node
    # A MIG device allocated: the whole GPU waits.
    start_pod(client, namespace, "mig-holder", request(mig_selector()))
    running(client, namespace, "mig-holder")
    start_pod(client, namespace, "whole", request(whole_gpu_selector()))
    condition = unschedulable(client, namespace, "whole")
    assert condition["reason"] == "Unschedulable", condition
    assert "cannot allocate all claims" in condition["message"], condition
    print(f"whole GPU refused: {condition['message']}")
    delete_pod(client, namespace, "mig-holder")
    pod = running(client, namespace, "whole")
    assert allocated_device(client, namespace, pod) == "gpu-0"

    # The reverse: the whole GPU allocated, a MIG device of it waits.
    start_pod(client, namespace, "mig-waiter", request(mig_selector()))
    condition = unschedulable(client, namespace, "mig-waiter")
    assert condition["reason"] == "Unschedulable", condition
    assert "cannot allocate all claims" in condition["message"], condition
    print(f"MIG device refused: {condition['message']}")
    delete_pod(client, namespace, "whole")
    pod = running(client, namespace, "mig-waiter")
    assert allocated_device(client, namespace, pod).startswith("gpu-0-mig-1g10gb-")
    delete_pod(client, namespace, "mig-waiter")


def test_start_latency_dynamic_mig_vs_share(
    node: RealNode, client: KubeClient, namespace: str
) -> None:
    timings: dict[str, list[float]] = {"mig": [], "share": []}
    share = request(f'has({A}.uuid) && {A}.uuid == "{uuid_of(1)}"', memory="1Gi")
    for round_ in range(LATENCY_ROUNDS):
        for kind, exactly in (("mig", request(mig_selector())), ("share", share)):
            name = f"{kind}-{round_}"
            created = start_pod(client, namespace, name, exactly)
            running(client, namespace, name)
            timings[kind].append(time.monotonic() - created)
            delete_pod(client, namespace, name)
    assert node_view(node)["instances"] == []
    for kind, values in timings.items():
        print(
            f"{kind}: creation to Running median {statistics.median(values):.2f} s "
            f"({', '.join(f'{v:.2f}' for v in values)})"
        )
    # Not a benchmark bound: the MIG pod's extra work (ledger, GI, CI) is milliseconds.
    assert statistics.median(timings["mig"]) < statistics.median(timings["share"]) + 5.0


CASE_PROBE = (
    "echo env:CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}; "
    "echo env:NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
    "cuda-probe init total uuid; nvml-query | grep -E '^(count|gpu )'; echo done; exec sleep 3600"
)


def test_a_mig_claim_next_to_a_share_claim_hides_the_share_from_cuda(
    node: RealNode, client: KubeClient, namespace: str
) -> None:
    """The documented limit (docs/mig.md, "A container with a MIG claim and another claim").
    The runtime applies the env of the container's claims' CDI specs one after the other, the
    last value of a name wins, and the kubelet (1.37, `dra.Manager.GetResources`) lists the
    claims in Go map order, i.e. at random per container. Only a MIG claim sets
    CUDA_VISIBLE_DEVICES, so CUDA in the container sees the MIG instance and never the share's
    GPU; NVIDIA_VISIBLE_DEVICES is the MIG list or "void", whichever claim came last, and what
    NVML lists follows it."""
    share = request(f'has({A}.uuid) && {A}.uuid == "{uuid_of(1)}"', memory="1Gi")
    for name, exactly in (("mig", request(mig_selector())), ("share", share)):
        client.create(
            kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace),
            claim_template(name, exactly),
        )
    pod = {
        "metadata": {"name": "both"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "c",
                    "image": WORKLOAD,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", CASE_PROBE],
                    "resources": {"claims": [{"name": "mig"}, {"name": "share"}]},
                }
            ],
            "resourceClaims": [
                {"name": c, "resourceClaimTemplateName": c} for c in ("mig", "share")
            ],
        },
    }
    client.create(kube.path("v1", "pods", namespace=namespace), pod)
    running(client, namespace, "both")
    lines = container_output(client, namespace, "both")
    print("both:", lines)
    log = "\n".join(lines)
    (instance,) = node_view(node)["instances"]
    mig_uuid = instance["uuid"]
    # CUDA: the MIG claim's instance alone (one MIG entry, one device); the share's GPU, whose
    # device node and vgpu.conf are in the container, is not enumerated.
    assert f"env:CUDA_VISIBLE_DEVICES={mig_uuid}" in lines, log
    assert f"total rc=0 bytes={INSTANCE_BYTES}" in lines, log
    assert f"uuid rc=0 GPU-{mig_uuid.removeprefix('MIG-')}" in lines, log
    share_gpu = [x for x in lines if x.startswith("gpu ") and f"uuid={uuid_of(1)} " in x]
    if "env:NVIDIA_VISIBLE_DEVICES=void" in lines:  # the share claim's env came last
        assert "count=2" in lines, log  # NVML: both device nodes' GPUs, the share capped
        assert len(share_gpu) == 1 and f"total={1 << 30} " in share_gpu[0], log
    else:  # the MIG claim's came last: NVML lists the instance's parent only
        assert f"env:NVIDIA_VISIBLE_DEVICES={mig_uuid}" in lines, log
        assert "count=1" in lines and not share_gpu, log
    delete_pod(client, namespace, "both")
    assert node_view(node)["instances"] == []
    assert ledger(node) == []
