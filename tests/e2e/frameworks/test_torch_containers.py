"""PyTorch from PyPI, unmodified, inside capped containers on a real test-bed node.

node-2 (a simulated `a10-pcie`, four 24 GiB A10s) runs for real: the kubelet has our plugin
prepare each pod's ResourceClaims, containerd applies the claims' CDI specs (the hook through
/etc/ld.so.preload) and the node's NVIDIA-toolkit-like spec (the simulated libcuda and
libnvidia-ml), runc starts the container. The container's image is the bed's workload image;
the application is the torch environment of `make torch` and its Python, mounted read-only from
the host at the same paths, with the simulator's libcudart.so.13 as its CUDA runtime
(vgpu_testbed.torchapp; docs/frameworks.md, "In containers on real nodes"). The program is
tests/fixtures/torch_checks.py, mounted read-only; its JSON is read from the pod's log through
the API server (the kubelet's log endpoint).

What this proves, in the container:
1. A 1 GiB claim: torch.cuda.is_available(), one device, total_memory and mem_get_info equal to
   the cap (1,073,741,824 bytes); torch.empty of the whole cap works, one byte more raises
   torch.cuda.OutOfMemoryError whose message gives the cap's figures ("total capacity of
   1024.00 MiB"), empty_cache gives the memory back to the claim; set_per_process_memory_fraction
   (0.5) admits half and refuses more; NVML (libnvidia-ml from the CDI spec, as nvidia-smi reads
   it) and torch agree on total and used; a vLLM-style profiling sequence (budget 0.9 x total)
   adds up; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate/cuMemMap) the
   cap holds the same, in torch's 20 MiB pages.
2. Two torch processes in one container share the claim's cap: 600 MiB and the remaining 424 MiB
   fit (the second sees 0 bytes free), a third process's 2 MiB is refused with the cap's figures.
3. A container with two claims (1 GiB on one GPU, 2 GiB on another) sees two devices, each with
   its own claim's cap, which holds on each.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.names import CONTAINER_HOOK_PATH
from tests.fixtures.cluster import require_real_nodes
from tests.fixtures.workloads import driver_on_nodes, gpu_request, resource_claim
from vgpu_testbed.polling import wait_for
from vgpu_testbed.realnode.images import WORKLOAD
from vgpu_testbed.realnode.node import RealNode
from vgpu_testbed.realnode.toolkit_cdi import CONTAINER_LIB_DIR
from vgpu_testbed.torchapp import CONTAINER_CUDART_DIR, TorchApp, find_torch

# Longer than the 60 s default: the module starts a real node, each test runs torch in a pod.
pytestmark = pytest.mark.timeout(300)

NODE = "node-2"
MIB = 1 << 20
GIB = 1 << 30
REPO = Path(__file__).resolve().parents[3]
CHECKS = REPO / "tests" / "fixtures" / "torch_checks.py"
CHECKS_IN = "/checks/torch_checks.py"  # where the pods mount it
ALL = "device,elementwise,alloc,fraction,vllm,nvml"
POD_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def torch() -> TorchApp:
    app = find_torch()
    if app is None:
        reason = "the torch environment is not installed (make torch; make test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return app


@pytest.fixture(scope="module")
def node(cluster: Any, client: KubeClient, torch: TorchApp) -> Iterator[RealNode]:
    require_real_nodes()
    with driver_on_nodes(cluster, client, [NODE], [], runtime="real") as started:
        agents = started[NODE]
        assert isinstance(agents, RealNode)
        yield agents


def uuid_of(index: int) -> str:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    return fakegpu.load_profile("a10-pcie").gpus[index].uuid


def run_torch_pod(
    client: KubeClient,
    torch: TorchApp,
    namespace: str,
    name: str,
    *,
    script: str,
    claims: dict[str, tuple[int, str]],
) -> str:
    """Run `script` (busybox sh; `$PY` is the torch environment's python, `$CHECKS` the checks)
    in a pod on node-2 whose container holds one claim per entry of `claims` (claim name ->
    (GPU index, memory)); wait for the pod to succeed and return its log."""
    for claim, (gpu, memory) in claims.items():
        client.create(
            kube.path(RESOURCE_API, "resourceclaims", namespace=namespace),
            resource_claim(claim, gpu_request(uuid=uuid_of(gpu), memory=memory)),
        )
    container: dict[str, Any] = {
        "name": "torch",
        "image": WORKLOAD,
        "imagePullPolicy": "Never",
        "command": [
            "sh",
            "-c",
            f"PY={shlex.quote(str(torch.python))}; CHECKS={CHECKS_IN}\n{script}",
        ],
        "resources": {"claims": [{"name": claim} for claim in claims]},
        "volumeMounts": [{"name": "checks", "mountPath": CHECKS_IN, "readOnly": True}],
    }
    pod: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [container],
            "resourceClaims": [{"name": claim, "resourceClaimName": claim} for claim in claims],
            "volumes": [{"name": "checks", "hostPath": {"path": str(CHECKS), "type": "File"}}],
        },
    }
    torch.add_to(pod, container)
    client.create(kube.path("v1", "pods", namespace=namespace), pod)
    pod_path = kube.path("v1", "pods", name, namespace=namespace)

    def finished() -> str | None:
        phase = (client.get(pod_path).get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(f"pod {namespace}/{name} to finish", finished, POD_TIMEOUT_S)
    log = client.get_text(kube.path("v1", "pods", name, namespace=namespace, subresource="log"))
    assert phase == "Succeeded", f"pod {name} {phase}:\n{log}"
    return log


def results(log: str) -> list[dict[str, Any]]:
    """The JSON objects the pod printed, in order (other lines: warnings on stderr)."""
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def test_torch_in_a_container_keeps_to_its_claims_cap(
    client: KubeClient, node: RealNode, torch: TorchApp, namespace: str
) -> None:
    cap = GIB
    script = f"""set -e
"$PY" -W ignore "$CHECKS" --cap {cap} --checks {ALL}
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$PY" -W ignore "$CHECKS" --cap {cap} \\
    --checks device,alloc
"""
    log = run_torch_pod(
        client, torch, namespace, "torch-cap", script=script, claims={"cap": (0, "1Gi")}
    )
    plain, expandable = results(log)

    dev = plain["device"]
    assert dev["is_available"] and dev["count"] == 1, dev
    assert dev["uuid"] == uuid_of(0) and dev["name"] == "NVIDIA A10", dev
    assert dev["total_memory"] == cap and dev["mem_get_info"] == [cap, cap], dev
    # The application's runtime (the simulator's, mounted with torch), the driver from the
    # node's toolkit-like CDI spec and the hook from the claim's (through /etc/ld.so.preload).
    assert set(dev["libraries"]) == {
        f"{CONTAINER_CUDART_DIR}/libcudart.so.13",
        f"{CONTAINER_LIB_DIR}/libcuda.so.1",
        CONTAINER_HOOK_PATH,
    }, dev
    alloc = plain["alloc"]
    assert alloc["whole_bytes"] == cap and alloc["whole"]["ok"], alloc
    assert alloc["free_full"] == 0, alloc
    assert alloc["past"]["oom"], alloc  # one byte past the cap
    assert alloc["past"]["figures"]["total"] == "1024.00 MiB", alloc
    assert alloc["reserved_cached"] > 0 and alloc["free_cached"] < cap  # torch's cache holds it
    assert alloc["free_after_empty_cache"] == cap  # ... and empty_cache gives it to the claim
    fraction = plain["fraction"]
    assert fraction["within"]["ok"] and fraction["beyond"]["oom"], fraction
    assert fraction["beyond"]["figures"]["allowed"] == "512.00 MiB", fraction
    nvml = plain["nvml"]
    assert nvml["nvml"]["total"] == nvml["torch"]["total"] == cap, nvml
    assert nvml["nvml"]["used"] == nvml["torch"]["used"] == cap // 4, nvml  # what it holds
    vllm = plain["vllm"]
    assert vllm["total"] == cap and vllm["budget"] == int(0.9 * cap) and vllm["ok"], vllm
    assert plain["elementwise"]["ok"] and plain["ok"], plain

    # Expandable segments: 51 of torch's 20 MiB pages (1020 MiB) fit the 1 GiB cap, not 52.
    assert expandable["alloc_conf"] == "expandable_segments:True"
    alloc = expandable["alloc"]
    assert expandable["device"]["total_memory"] == cap
    assert alloc["whole_bytes"] == 1020 * MIB and alloc["whole"]["ok"], alloc
    assert alloc["free_full"] == cap - 1020 * MIB, alloc
    assert alloc["past"]["oom"] and alloc["past"]["figures"]["total"] == "1024.00 MiB", alloc
    assert alloc["free_after_empty_cache"] == cap and expandable["ok"], expandable


# Three torch processes in one container: two hold memory (each until a line on its stdin, a
# FIFO the script keeps open), the third asks for more. A holder that dies before it reports
# ends the wait (kill -0) and the script.
SHARE_SCRIPT = """set -e
mkfifo /tmp/in1 /tmp/in2
exec 3<>/tmp/in1 4<>/tmp/in2
hold() {  # hold BYTES N: start holder N, wait for its report
    "$PY" -W ignore "$CHECKS" --hold "$1" </tmp/in$2 >/tmp/out$2 &
    pid=$!
    until [ -s /tmp/out$2 ]; do
        kill -0 $pid 2>/dev/null || { echo "holder $2 died"; exit 1; }
        sleep 0.1
    done
}
hold %(first)d 1
hold %(second)d 2
cat /tmp/out1 /tmp/out2
"$PY" -W ignore "$CHECKS" --hold %(third)d </dev/null
echo >&3
echo >&4
wait
"""


def test_two_processes_in_a_container_share_its_cap(
    client: KubeClient, node: RealNode, torch: TorchApp, namespace: str
) -> None:
    cap = GIB
    script = SHARE_SCRIPT % {"first": 600 * MIB, "second": 424 * MIB, "third": 2 * MIB}
    log = run_torch_pod(
        client, torch, namespace, "torch-share", script=script, claims={"share": (1, "1Gi")}
    )
    first, second, third = results(log)
    assert first["held"]["ok"] and first["total"] == cap, first
    assert first["free"] == cap - 600 * MIB, first
    assert second["held"]["ok"] and second["total"] == cap, second
    assert second["free"] == 0, second  # exactly the rest of the claim
    assert first["pid"] != second["pid"] != third["pid"]
    assert not third["held"]["ok"] and third["held"]["oom"], third
    assert third["held"]["figures"]["total"] == "1024.00 MiB", third


def test_a_container_with_two_claims_sees_two_capped_devices(
    client: KubeClient, node: RealNode, torch: TorchApp, namespace: str
) -> None:
    # CUDA orders the devices as NVML does, by PCI bus: GPU 2 is device 0, GPU 3 device 1.
    script = f"""set -e
"$PY" -W ignore "$CHECKS" --device 0 --cap {GIB} --checks device,alloc,nvml
"$PY" -W ignore "$CHECKS" --device 1 --cap {2 * GIB} --checks device,alloc,nvml
"""
    claims = {"small": (2, "1Gi"), "large": (3, "2Gi")}
    log = run_torch_pod(client, torch, namespace, "torch-two", script=script, claims=claims)
    small, large = results(log)
    # torch's figures: MiB up to 1 GiB, GiB above (format_size).
    for out, cap, gpu, text in ((small, GIB, 2, "1024.00 MiB"), (large, 2 * GIB, 3, "2.00 GiB")):
        dev = out["device"]
        assert dev["count"] == 2 and dev["uuid"] == uuid_of(gpu), dev
        assert dev["total_memory"] == cap and dev["mem_get_info"] == [cap, cap], dev
        alloc = out["alloc"]
        assert alloc["whole"]["ok"] and alloc["free_full"] == 0, alloc
        assert alloc["past"]["oom"], alloc
        assert alloc["past"]["figures"]["total"] == text, alloc
        assert out["nvml"]["nvml"]["total"] == cap, out["nvml"]
        assert out["ok"], out
