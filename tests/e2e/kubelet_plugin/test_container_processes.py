"""Tenants in real containers, as NVML, the per-GPU metrics and node-side enforcement see them.

node-2 (a simulated `a10-pcie`) runs for real: the kubelet, containerd and runc start the pods,
each container in a PID namespace of its own below the node's (`vgpu_testbed.realnode`), where the
kubelet plugin runs. The simulated driver must then do what the real one does for a node: name
every process by its pid in the node's namespace, whatever namespace the process lives in
(docs/simulated-gpus.md, "Processes in PID namespaces"). Before it did, the plugin's NVML could
not find a container's process under the pid the container recorded, freed its memory, and
showed the GPU idle and empty while the claim's own accounting said it held memory.

What this proves:
1. A program in a pod holding 300 MiB under its claim (through the hook) is listed by NVML on
   the node under its node pid, with its 300 MiB; that pid is the program in the node's /proc
   and its mountinfo names the claim (what enforcement attributes processes by); the host (the
   test's namespace) sees the same process under its host pid. The plugin's per-GPU metrics
   show the memory (GPU and claim agree), and nothing once the program ends.
2. A kernel loop in the pod's container shows in the plugin's GPU utilisation and, through the
   per-process samples NVML attributes by node pid, in the claim's utilisation (a compute-capped
   claim, so the governor measures it).
3. Node-side enforcement: a program in a pod that goes around the hook (`cuda_bypass`: libcuda's
   own cuMemAlloc_v2) and holds 3 GiB on its 1 GiB claim is SIGKILLed by the plugin, which names
   it by its node pid; the claim gets the GPUMemoryCapExceeded Event.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.status import fetch_metrics
from tests.fixtures.cluster import require_real_nodes
from tests.fixtures.workloads import driver_on_nodes, gpu_request, resource_claim
from vgpu_testbed.polling import wait_for
from vgpu_testbed.realnode.images import WORKLOAD
from vgpu_testbed.realnode.node import RealNode

# Longer than the 60 s default: the module starts a real node (kubelet, containerd, plugin).
pytestmark = pytest.mark.timeout(300)

NODE = "node-2"
MIB = 1 << 20
GIB = 1 << 30
REPO = Path(__file__).resolve().parents[3]
PROGRAMS = REPO / "hack" / "fakegpu" / "build" / "cuda_programs"
HELD = 300 * MIB


@pytest.fixture(scope="module")
def node(cluster: Any, client: KubeClient) -> Iterator[RealNode]:
    require_real_nodes()
    with driver_on_nodes(cluster, client, [NODE], [], runtime="real") as started:
        agents = started[NODE]
        assert isinstance(agents, RealNode)
        yield agents


def uuid_of(index: int) -> str:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    return fakegpu.load_profile("a10-pcie").gpus[index].uuid


def start_pod(
    client: KubeClient,
    namespace: str,
    name: str,
    command: list[str],
    *,
    gpu: int,
    memory: str,
    cores: str | None = None,
    programs: bool = False,
) -> None:
    """A pod on node-2 running `command` in the workload image with a claim on GPU `gpu` (by
    UUID); with `programs`, the simulated driver's test programs are mounted at /programs."""
    request = gpu_request(uuid=uuid_of(gpu), memory=memory, cores=cores)
    client.create(
        kube.path(RESOURCE_API, "resourceclaims", namespace=namespace),
        resource_claim(name, request),
    )
    container: dict[str, Any] = {
        "name": "tenant",
        "image": WORKLOAD,
        "imagePullPolicy": "Never",
        "command": command,
        "resources": {"claims": [{"name": "gpu"}]},
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "containers": [container],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
    }
    if programs:
        container["volumeMounts"] = [{"name": "programs", "mountPath": "/programs"}]
        spec["volumes"] = [
            {"name": "programs", "hostPath": {"path": str(PROGRAMS), "type": "Directory"}}
        ]
    client.create(
        kube.path("v1", "pods", namespace=namespace), {"metadata": {"name": name}, "spec": spec}
    )


def claim_uid(client: KubeClient, namespace: str, name: str) -> str:
    claim = client.get(kube.path(RESOURCE_API, "resourceclaims", name, namespace=namespace))
    return str(claim["metadata"]["uid"])


def running(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = client.get(kube.path("v1", "pods", name, namespace=namespace))
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    return wait_for(f"pod {namespace}/{name} Running", check, 120)


# NVML as the plugin sees it: run inside the node (its PID and mount namespaces, its /proc).
NODE_VIEW = """
import json, sys, pynvml as n
from kubelet_plugin.enforcement import claims_of_mountinfo
n.nvmlInit()
h = n.nvmlDeviceGetHandleByUUID(sys.argv[1].encode())
procs = {p.pid: p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)}
def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
print(json.dumps({
    "used": n.nvmlDeviceGetMemoryInfo(h).used,
    "procs": {str(pid): {
        "bytes": used,
        "cmdline": read(f"/proc/{pid}/cmdline").split("\\0")[0],
        "claims": sorted(claims_of_mountinfo(read(f"/proc/{pid}/mountinfo"))),
    } for pid, used in procs.items()},
}))
"""


def node_view(node: RealNode, uuid: str) -> dict[str, Any]:
    done = subprocess.run(
        node.enter([sys.executable, "-c", textwrap.dedent(NODE_VIEW), uuid]),
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


def gpu_series(node: RealNode, uuid: str) -> dict[str, float]:
    """The plugin's per-GPU series (`vgpu_dra_gpu_*`) of one GPU, by name."""
    return {
        name: value
        for name, labels, value in fetch_metrics(f"http://{node.metrics_address()}/metrics")
        if name.startswith("vgpu_dra_gpu_") and labels.get("gpu") == uuid.lower()
    }


def claim_series(node: RealNode, claim: str) -> dict[str, float]:
    """The plugin's per-claim series (`vgpu_dra_claim_*`) of one claim (one GPU), by name."""
    return {
        name: value
        for name, labels, value in fetch_metrics(f"http://{node.metrics_address()}/metrics")
        if name.startswith("vgpu_dra_claim_") and labels.get("claim") == claim
    }


def test_node_names_a_container_tenant_by_its_node_pid(
    client: KubeClient, node: RealNode, namespace: str
) -> None:
    gpu = uuid_of(1)
    # cuda-hold waits for a line on stdin before it exits: `sleep |` keeps its stdin open.
    start_pod(
        client,
        namespace,
        "holder",
        ["sh", "-c", f"sleep 3600 | cuda-hold 0 {HELD}"],
        gpu=1,
        memory="1Gi",
    )
    running(client, namespace, "holder")
    uid = claim_uid(client, namespace, "holder")

    def holding() -> dict[str, Any] | None:
        view = node_view(node, gpu)
        return view if view["used"] == HELD else None

    view = wait_for("the pod's program to hold its memory", holding, 60)
    ((pid, proc),) = view["procs"].items()
    assert proc["bytes"] == HELD
    assert proc["cmdline"].endswith("cuda-hold")  # the node's /proc: this pid is the program
    assert proc["claims"] == [uid]  # and its mounts name its claim: enforcement's view
    assert int(pid) > 1  # not its container pid (1 is the container's sh)

    # The host's view of the same node: the same process, under its host pid.
    from vgpu_testbed.fakegpu import simulator as fakegpu

    status = fakegpu.gpu_status(node.gpu_env)
    (host,) = [g for g in status["gpus"] if g["uuid"] == gpu]
    ((host_proc),) = host["processes"]
    assert host_proc["memory_used"] == HELD and host["memory_used"] == HELD
    host_cmd = Path(f"/proc/{host_proc['pid']}/cmdline").read_bytes().split(b"\0")[0]
    assert host_cmd.endswith(b"cuda-hold")

    # The plugin's metrics: the GPU's memory (NVML) and the claim's (the hook's accounting) agree.
    series = claim_series(node, "holder")
    assert series["vgpu_dra_claim_memory_used_bytes"] == HELD
    gpus = gpu_series(node, gpu)
    assert gpus["vgpu_dra_gpu_memory_used_bytes"] == HELD

    client.request(
        "DELETE",
        kube.path("v1", "pods", "holder", namespace=namespace),
        query={"gracePeriodSeconds": 0},
    )
    wait_for(
        "the GPU's memory to be free",
        lambda: gpu_series(node, gpu).get("vgpu_dra_gpu_memory_used_bytes") == 0,
        60,
    )


def test_kernel_loop_in_a_container_shows_in_gpu_and_claim_utilisation(
    client: KubeClient, node: RealNode, namespace: str
) -> None:
    gpu = uuid_of(2)
    start_pod(
        client,
        namespace,
        "spinner",
        ["sh", "-c", "exec cuda-spin 0 3600"],
        gpu=2,
        memory="1Gi",
        cores="50",
    )
    running(client, namespace, "spinner")

    def busy() -> dict[str, float] | None:
        gpus = gpu_series(node, gpu)
        claim = claim_series(node, "spinner")
        util = claim.get("vgpu_dra_claim_utilization_ratio", 0.0)
        gpu_util = gpus.get("vgpu_dra_gpu_utilization_ratio", 0.0)
        return {**gpus, **claim} if gpu_util > 0.2 and util > 0.2 else None

    seen = wait_for("the container's kernels in the GPU and claim utilisation", busy, 60)
    # Capped at 50 % of the SMs by the hook: both read about half (generous bounds).
    assert 0.2 < seen["vgpu_dra_gpu_utilization_ratio"] <= 0.8
    assert 0.2 < seen["vgpu_dra_claim_utilization_ratio"] <= 0.8


def test_enforcement_kills_a_container_tenant_that_bypasses_the_hook(
    client: KubeClient, node: RealNode, namespace: str
) -> None:
    if not (PROGRAMS / "cuda_bypass").is_file():
        pytest.skip("the simulated driver's test programs are not built (make native)")
    start_pod(
        client,
        namespace,
        "bypass",
        ["/programs/cuda_bypass", "0", str(3 * GIB), "600"],
        gpu=3,
        memory="1Gi",
        programs=True,
    )
    running(client, namespace, "bypass")
    uid = claim_uid(client, namespace, "bypass")

    def terminated() -> dict[str, Any] | None:
        pod = client.get(kube.path("v1", "pods", "bypass", namespace=namespace))
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            done = (status.get("state") or {}).get("terminated")
            if done is not None:
                return dict(done)
        return None

    done = wait_for("the plugin to kill the tenant", terminated, 90)
    assert done["exitCode"] == 128 + 9, done  # SIGKILL

    def over_cap() -> dict[str, Any] | None:
        events = client.list(kube.path("v1", "events", namespace=namespace))
        for event in events:
            if (
                event["involvedObject"].get("uid") == uid
                and event["reason"] == "GPUMemoryCapExceeded"
            ):
                return dict(event)
        return None

    event = wait_for("the GPUMemoryCapExceeded Event on the claim", over_cap, 60)
    assert "uses 3072 MiB" in event["message"], event["message"]
    killed = event["message"].split("killed ", 1)[1].split(",")[0].strip()
    assert int(killed) > 1, event["message"]  # its node pid, not its container pid (1)
    wait_for(
        "the GPU's memory to be free",
        lambda: gpu_series(node, uuid_of(3)).get("vgpu_dra_gpu_memory_used_bytes") == 0,
        30,
    )
