"""The whole node path on the test bed: simulated GPUs -> kubelet plugin -> slices -> real
kube-scheduler -> kubelet stand-in -> NodePrepareResources -> CDI specs, and back on deletion.

Two nodes of the session cluster get their agents (`vgpu_testbed.standin.node_agents`): node-1 is a
simulated `dgx-h100`, node-2 an `a10-pcie`; each runs its own `vgpu-dra kubelet-plugin` process
with its own directories and a kubelet stand-in speaking the real registration and DRA gRPC
protocols with the node's credentials. Claims come from deploy/deviceclass.yaml and the
deploy/examples/*.yaml manifests, applied as they are, so the examples are proven to work.

What this proves:
1. The published slices describe the simulated machines (devices, attributes, capacities).
2. Each example is allocated by the real scheduler and prepared: whole GPU, 1Gi + 10 cores,
   two GPUs in one NVLink domain (matchAttribute), A10 only (CEL on productName); the CDI spec
   and vgpu.conf carry the allocated limits and GPUs.
3. Deleting a pod unprepares its claim: CDI spec, claim dir and checkpoint entry are gone.
4. SIGKILL of the plugin in the middle of a large prepare batch loses nothing: after a restart
   every pod is prepared, checkpoint, CDI specs and claim dirs agree, and a retried prepare
   returns the same CDI device IDs.
5. A hot-removed GPU leaves the published pool at the next rescan, with a generation bump and
   without renaming the GPUs after it, and comes back when it is added again (a GPU that falls
   off the bus stays published with a NoExecute taint instead:
   tests/e2e/kubelet_plugin/test_health.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.fixtures.workloads import (
    DRIVER,
    EXAMPLES,
    apply,
    claim_pod,
    claim_template,
    driver_on_nodes,
    gpu_request,
    pod_claim,
    pod_gone,
    running_pod,
)
from vgpu_testbed.polling import wait_for
from vgpu_testbed.standin.node_agents import NodeAgents

# Longer than the 60 s default: module fixtures start two nodes' agents (the first test also the
# session cluster); the batch test waits up to 120 s for 48 claims.
pytestmark = pytest.mark.timeout(300)


GIB = 1 << 30
RESYNC = ["--resync-seconds", "1"]  # re-discover GPUs every second (default 60)


@pytest.fixture(scope="module")
def agents(cluster: Any, client: KubeClient) -> Iterator[dict[str, NodeAgents]]:
    """Agents for node-1 (dgx-h100) and node-2 (a10-pcie) plus the DeviceClass; all removed
    afterwards (slices too), so later modules see the nodes as the test bed made them."""
    # The stand-in: this module drives the gRPC by hand and reads the stand-in's pod records.
    with driver_on_nodes(
        cluster, client, ["node-1", "node-2"], RESYNC, runtime="standin"
    ) as started:
        yield started


def node_devices(client: KubeClient, node: str) -> dict[str, dict[str, Any]]:
    objs = client.list(
        kube.path(RESOURCE_API, "resourceslices"),
        field_selector=f"spec.driver={DRIVER},spec.nodeName={node}",
    )
    return {d["name"]: d for o in objs for d in o["spec"]["devices"]}


def attr(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name)
    return None if value is None else next(iter(value.values()))


def vgpu_conf_devices(node_agents: NodeAgents, claim_uid: str) -> list[dict[str, str]]:
    text = (node_agents.paths.claim_dir(claim_uid) / "vgpu.conf").read_text()
    devices = []
    for line in text.splitlines():
        if line.startswith("device "):
            devices.append(dict(token.split("=", 1) for token in line.split()[1:]))
    return devices


def cdi_env(node_agents: NodeAgents, claim_uid: str) -> dict[str, str]:
    spec = json.loads(node_agents.paths.cdi_spec(claim_uid).read_text())
    env = spec.get("containerEdits", {}).get("env", [])
    return dict(item.split("=", 1) for item in env)


def cdi_gpu_nodes(node_agents: NodeAgents, claim_uid: str) -> set[str]:
    """The GPU device nodes the claim's CDI devices inject: the GPUs its container sees."""
    spec = json.loads(node_agents.paths.cdi_spec(claim_uid).read_text())
    assert cdi_env(node_agents, claim_uid)["NVIDIA_VISIBLE_DEVICES"] == "void"
    return {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}


def checkpoint_claims(node_agents: NodeAgents) -> dict[str, Any]:
    return dict(CheckpointJournal(str(node_agents.paths.checkpoint.parent)).load())


def prepared_example(
    client: KubeClient, agents: dict[str, NodeAgents], namespace: str, example: str
) -> tuple[NodeAgents, dict[str, Any], list[dict[str, str]]]:
    """Apply an example, wait until its pod runs: (node agents, claim, vgpu.conf devices)."""
    apply(client, EXAMPLES / f"{example}.yaml", namespace)
    pod = running_pod(client, namespace, example)
    claim = pod_claim(client, pod)
    node_agents = agents[pod["spec"]["nodeName"]]
    uid = claim["metadata"]["uid"]
    assert node_agents.paths.cdi_spec(uid).is_file()
    record = json.loads(node_agents.paths.pod_record(namespace, example).read_text())
    (claim_record,) = record["claims"]
    ids = [i for d in claim_record["devices"] for i in d["cdiDeviceIDs"]]
    assert ids and all(i.startswith(f"k8s.{DRIVER}/claim=") for i in ids)
    return node_agents, claim, vgpu_conf_devices(node_agents, uid)


# ---------------------------------------------------------------- 1. slices


def test_slices_describe_the_simulated_machines(
    client: KubeClient, agents: dict[str, NodeAgents]
) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu  # the profiles are the ground truth

    h100 = wait_for("node-1 slices", lambda: node_devices(client, "node-1"))
    a10 = wait_for("node-2 slices", lambda: node_devices(client, "node-2"))
    assert sorted(h100) == [f"gpu-{i}" for i in range(8)]
    assert sorted(a10) == [f"gpu-{i}" for i in range(4)]

    profile = fakegpu.load_profile("dgx-h100")
    for index, gpu in enumerate(profile.gpus):
        device = h100[f"gpu-{index}"]
        assert attr(device, "uuid") == gpu.uuid
        assert attr(device, "productName") == "NVIDIA H100 80GB HBM3"
        assert attr(device, "architecture") == "Hopper"
        assert attr(device, "smCount") == 132
        assert attr(device, "cudaComputeCapability") == "9.0.0"
        assert attr(device, "numaNode") == (0 if index < 4 else 1)
        assert attr(device, "nvlinkDomain") == 0
        assert attr(device, "resource.kubernetes.io/pciBusID")
        assert attr(device, "resource.kubernetes.io/pcieRoot").startswith("pci")
        assert attr(device, "memoryBytes") == gpu.memory_bytes
        memory = device["capacity"]["memory"]["value"]
        assert kube_quantity(memory) == gpu.memory_bytes // (1 << 20) * (1 << 20)
    for device in a10.values():
        assert attr(device, "productName") == "NVIDIA A10"
        assert attr(device, "nvlinkDomain") is None
        assert attr(device, "smCount") == 72


def kube_quantity(text: str) -> int:
    from dra_driver.allocator import parse_quantity

    return parse_quantity(text)


# ---------------------------------------------------------------- 2. the examples


def test_whole_gpu(client: KubeClient, agents: dict[str, NodeAgents], namespace: str) -> None:
    node_agents, claim, devices = prepared_example(client, agents, namespace, "whole-gpu")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = node_devices(client, node_agents.node_name)[result["device"]]
    (conf,) = devices
    assert conf["uuid"] == attr(device, "uuid")
    assert int(conf["memory"]) == kube_quantity(device["capacity"]["memory"]["value"])
    assert conf["cores"] == "0"
    assert len(cdi_gpu_nodes(node_agents, claim["metadata"]["uid"])) == 1


def test_shared_slice_of_a_gpu(
    client: KubeClient, agents: dict[str, NodeAgents], namespace: str
) -> None:
    node_agents, claim, devices = prepared_example(client, agents, namespace, "shared-gpu")
    (conf,) = devices
    assert (conf["memory"], conf["cores"]) == (str(GIB), "10")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result.get("shareID")
    device = node_devices(client, node_agents.node_name)[result["device"]]
    assert conf["uuid"] == attr(device, "uuid")
    assert len(cdi_gpu_nodes(node_agents, claim["metadata"]["uid"])) == 1


def test_two_gpus_in_one_nvlink_domain(
    client: KubeClient, agents: dict[str, NodeAgents], namespace: str
) -> None:
    node_agents, claim, devices = prepared_example(client, agents, namespace, "nvlink-pair")
    assert node_agents.node_name == "node-1"  # the A10 node has no NVLink
    results = claim["status"]["allocation"]["devices"]["results"]
    slice_devices = node_devices(client, "node-1")
    chosen = [slice_devices[r["device"]] for r in results]
    assert len({r["device"] for r in results}) == 2
    assert len({attr(d, "nvlinkDomain") for d in chosen}) == 1
    uuids = {attr(d, "uuid") for d in chosen}
    assert {d["uuid"] for d in devices} == uuids
    assert len(cdi_gpu_nodes(node_agents, claim["metadata"]["uid"])) == 2


def test_cel_selector_on_product_name(
    client: KubeClient, agents: dict[str, NodeAgents], namespace: str
) -> None:
    node_agents, _, devices = prepared_example(client, agents, namespace, "a10-only")
    assert node_agents.node_name == "node-2"
    (conf,) = devices
    assert conf["memory"] == str(4 * GIB) and conf["cores"] == "0"


# ---------------------------------------------------------------- 3. deletion


def test_pod_deletion_unprepares_the_claim(
    client: KubeClient, agents: dict[str, NodeAgents], namespace: str
) -> None:
    node_agents, claim, _ = prepared_example(client, agents, namespace, "shared-gpu")
    uid = claim["metadata"]["uid"]
    assert uid in checkpoint_claims(node_agents)
    client.delete(kube.path("v1", "pods", "shared-gpu", namespace=namespace))  # graceful
    # Unprepare removes the spec, then the claim dir, then the checkpoint entry: await all three.
    wait_for(
        "claim unprepared (spec, claim dir and checkpoint entry gone)",
        lambda: (
            not node_agents.paths.cdi_spec(uid).exists()
            and not node_agents.paths.claim_dir(uid).exists()
            and uid not in checkpoint_claims(node_agents)
        ),
    )

    wait_for(
        "the stand-in to confirm the pod's termination",
        lambda: pod_gone(client, namespace, "shared-gpu"),
    )


# ---------------------------------------------------------------- 4. crash in a batch

BATCH = 48


def batch_pod(name: str) -> dict[str, Any]:
    pod = claim_pod(name, {"resourceClaimTemplateName": "small"})
    pod["spec"]["nodeSelector"] = {"vgpu.dra.dev/fakegpu-profile": "dgx-h100"}
    return pod


def node_consistency(node_agents: NodeAgents) -> tuple[set[str], set[str], set[str]]:
    """(checkpoint claims, claims with a CDI spec, claims with a claim dir)."""
    prefix = node_agents.paths.cdi_spec("X").name[: -len("X.json")]
    specs = {
        p.name[len(prefix) : -len(".json")]
        for p in node_agents.paths.cdi_root.glob(prefix + "*.json")
    }
    claims_dir = node_agents.paths.state_dir / "claims"
    dirs = {p.name for p in claims_dir.iterdir()} if claims_dir.is_dir() else set()
    return set(checkpoint_claims(node_agents)), specs, dirs


def prepare_directly(node_agents: NodeAgents, claims: list[dict[str, Any]]) -> dict[str, list[str]]:
    """A retried NodePrepareResources, as the kubelet sends after a timeout: uid -> CDI IDs."""
    with grpc.insecure_channel(f"unix://{node_agents.paths.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[
                dra_v1_pb2.Claim(
                    namespace=c["metadata"]["namespace"],
                    uid=c["metadata"]["uid"],
                    name=c["metadata"]["name"],
                )
                for c in claims
            ]
        )
        response = stub.NodePrepareResources(request, timeout=45)
    out = {}
    for uid, result in response.claims.items():
        assert not result.error, result.error
        out[uid] = sorted(i for d in result.devices for i in d.cdi_device_ids)
    return out


def test_sigkill_during_a_prepare_batch_loses_nothing(
    client: KubeClient, agents: dict[str, NodeAgents], namespace: str
) -> None:
    node_agents = agents["node-1"]
    template = claim_template("small", gpu_request(memory="1Gi", cores="1"))
    client.create(kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace), template)
    before = set(checkpoint_claims(node_agents))

    # With the plugin down, the stand-in collects every pod's claims; when the plugin comes
    # back (one worker, so the batch takes a while) they arrive in one NodePrepareResources call.
    node_agents.kill_plugin()
    for i in range(BATCH):
        client.create(kube.path("v1", "pods", namespace=namespace), batch_pod(f"p{i}"))

    def all_allocated() -> list[dict[str, Any]] | None:
        claims = client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
        ready = [c for c in claims if (c.get("status") or {}).get("reservedFor")]
        return ready if len(ready) == BATCH else None

    claims = wait_for("every batch claim allocated and reserved", all_allocated, timeout=120)
    node_agents.plugin_args = [*RESYNC, "--workers", "1"]
    node_agents.start_plugin()

    def some_prepared() -> int:
        return len(set(checkpoint_claims(node_agents)) - before)

    wait_for(
        "a sixth of the batch to be prepared",
        lambda: some_prepared() >= BATCH // 6,
        timeout=60,
        interval=0.01,
    )
    node_agents.kill_plugin()
    prepared_at_kill = some_prepared()  # what survived the kill

    node_agents.plugin_args = list(RESYNC)
    node_agents.start_plugin()
    for i in range(BATCH):
        running_pod(client, namespace, f"p{i}")

    uids = {c["metadata"]["uid"] for c in claims}
    checkpoint, specs, dirs = node_consistency(node_agents)
    assert uids <= checkpoint
    assert checkpoint == specs == dirs, "checkpoint, CDI specs and claim dirs disagree"
    for uid in uids:
        assert (node_agents.paths.claim_dir(uid) / "vgpu.conf").is_file()

    recorded = {}
    for i in range(BATCH):
        record = json.loads(node_agents.paths.pod_record(namespace, f"p{i}").read_text())
        (claim_record,) = record["claims"]
        recorded[claim_record["uid"]] = sorted(
            i for d in claim_record["devices"] for i in d["cdiDeviceIDs"]
        )
    assert prepare_directly(node_agents, claims) == recorded
    print(f"claims prepared when SIGKILL hit: {prepared_at_kill} of {BATCH}")
    assert BATCH // 6 <= prepared_at_kill < BATCH, "the kill did not land inside the batch"


# ---------------------------------------------------------------- 5. inventory changes


def test_a_removed_gpu_leaves_the_pool_and_comes_back(
    client: KubeClient, agents: dict[str, NodeAgents]
) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    node_agents = agents["node-2"]

    def pool() -> tuple[int, list[str]]:
        objs = client.list(
            kube.path(RESOURCE_API, "resourceslices"),
            field_selector=f"spec.driver={DRIVER},spec.nodeName=node-2",
        )
        generation = max(o["spec"]["pool"]["generation"] for o in objs)
        return generation, sorted(d["name"] for o in objs for d in o["spec"]["devices"])

    def pool_if(device: str, present: bool) -> tuple[int, list[str]] | None:
        current = pool()
        return current if (device in current[1]) == present else None

    generation, devices = wait_for("node-2 pool", pool)
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    fakegpu.set_gpu_removed(node_agents.gpu_env, 2, True)  # hot-unplugged
    try:
        lost_generation, during = wait_for(
            "gpu-2 to leave the pool", lambda: pool_if("gpu-2", False)
        )
        assert lost_generation > generation
        # NVML now enumerates the last GPU at index 2; its device name stays gpu-3.
        assert during == ["gpu-0", "gpu-1", "gpu-3"]
    finally:
        fakegpu.set_gpu_removed(node_agents.gpu_env, 2, False)
    back_generation, devices = wait_for("gpu-2 to come back", lambda: pool_if("gpu-2", True))
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert back_generation > lost_generation
