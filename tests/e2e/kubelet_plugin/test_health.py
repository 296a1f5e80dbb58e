"""Device health on the test bed: simulated GPU faults -> device taints -> the real kube-scheduler
and kube-controller-manager (device taint eviction) act on them; hot-plug updates the pool.

node-2 (a simulated `a10-pcie`, 4 GPUs) runs for real (`tests.fixtures.workloads.driver_on_nodes`:
kubelet, containerd, runc, the kubelet plugin with a 20 s XID quiet period). GPUs are found by
UUID (the profile is the ground truth), never by device name.

What this proves:
1. A recoverable XID (94) taints the GPU NoSchedule: new whole-GPU claims land on its three
   healthy peers, a fourth stays unschedulable while a GPU is free-but-tainted, and schedules onto
   that GPU once the quiet period lifts the taint.
2. A request that tolerates the taint still gets the tainted GPU; the same request without the
   toleration does not.
3. A fatal XID (48) taints NoExecute and the pod using the GPU is evicted; the taint survives a
   plugin restart; hot-removing the GPU drops it from the pool within 5 s and adding it back (a
   re-enumeration, as after a reset) publishes it again untainted.
4. A GPU that falls off the bus stays published with a NoExecute `unreachable` taint, lifted when
   it answers again, without a restart.
5. Node-side enforcement in the plugin process: a container of a prepared claim that never loads
   the hook and allocates past its cap is SIGKILLed, and Events (hook missing, cap exceeded) are
   recorded on the claim with the node's credentials.
6. A GPU added after the plugin started is published by the rescan, under its old name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.workloads import (
    DRIVER,
    driver_on_nodes,
    gpu_pod,
    pod_gone,
    running_pod,
)
from vgpu_testbed.polling import wait_for
from vgpu_testbed.standin.node_agents import NodeAgents

# Longer than the 60 s default: module fixtures start node agents; tests inject GPU faults and wait
# for taints to persist and lift.
pytestmark = pytest.mark.timeout(300)

NODE = "node-2"
QUIET_S = 20


@pytest.fixture(scope="module")
def agents(cluster: Any, client: KubeClient) -> Iterator[NodeAgents]:
    plugin_args = ["--xid-quiet-seconds", str(QUIET_S), "--no-governor"]
    with driver_on_nodes(cluster, client, [NODE], plugin_args) as started:
        yield started[NODE]


def uuid_of(index: int) -> str:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    return str(fakegpu.load_profile("a10-pcie").gpus[index].uuid)


def devices_by_uuid(client: KubeClient) -> dict[str, dict[str, Any]]:
    objs = client.list(
        kube.path(RESOURCE_API, "resourceslices"),
        field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}",
    )
    return {
        d["attributes"]["uuid"]["string"]: d for o in objs for d in o["spec"].get("devices") or []
    }


def taints_of(client: KubeClient, uuid: str) -> list[tuple[str, str, str]] | None:
    """(key, value, effect) of the GPU's taints; None when the GPU is not published."""
    device = devices_by_uuid(client).get(uuid)
    if device is None:
        return None
    return [(t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints") or []]


def await_taints(client: KubeClient, uuid: str, want: list[tuple[str, str, str]]) -> None:
    wait_for(f"taints {want} on {uuid}", lambda: taints_of(client, uuid) == want or None)


def allocated_uuid(client: KubeClient, namespace: str, name: str) -> str:
    pod = running_pod(client, namespace, name)
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = client.get(
        kube.path(RESOURCE_API, "resourceclaims", status["resourceClaimName"], namespace=namespace)
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    by_name = {d["name"]: uuid for uuid, d in devices_by_uuid(client).items()}
    return by_name[result["device"]]


def unschedulable(client: KubeClient, namespace: str, name: str) -> bool:
    pod = client.get(kube.path("v1", "pods", name, namespace=namespace))
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def test_no_schedule_taint_steers_claims_to_healthy_peers_until_it_lifts(
    client: KubeClient, agents: NodeAgents, namespace: str
) -> None:
    sick = uuid_of(0)
    wait_for("node-2 slices", lambda: len(devices_by_uuid(client)) == 4)
    agents_env = agents.gpu_env
    from vgpu_testbed.fakegpu import simulator as fakegpu

    fakegpu.inject_xid(agents_env, 0, 94)
    await_taints(client, sick, [(f"{DRIVER}/xid", "xid-94", "NoSchedule")])
    for n in range(3):
        gpu_pod(client, namespace, f"whole-{n}")
    placed = {allocated_uuid(client, namespace, f"whole-{n}") for n in range(3)}
    assert placed == {uuid_of(i) for i in (1, 2, 3)}
    fakegpu.inject_xid(agents_env, 0, 94)  # restart the quiet period for the next step
    gpu_pod(client, namespace, "fourth")
    wait_for(
        "the fourth pod to be unschedulable", lambda: unschedulable(client, namespace, "fourth")
    )
    assert taints_of(client, sick)  # still tainted: the taint, not capacity, kept it out
    await_taints(client, sick, [])  # the quiet period lifts it
    assert allocated_uuid(client, namespace, "fourth") == sick


def test_a_request_that_tolerates_the_taint_still_gets_the_gpu(
    client: KubeClient, agents: NodeAgents, namespace: str
) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    sick = uuid_of(1)
    fakegpu.inject_xid(agents.gpu_env, 1, 94)
    await_taints(client, sick, [(f"{DRIVER}/xid", "xid-94", "NoSchedule")])
    gpu_pod(client, namespace, "tolerant", uuid=sick, tolerate=f"{DRIVER}/xid", memory="1Gi")
    gpu_pod(client, namespace, "intolerant", uuid=sick, memory="1Gi")
    assert allocated_uuid(client, namespace, "tolerant") == sick
    wait_for(
        "the intolerant pod to be unschedulable",
        lambda: unschedulable(client, namespace, "intolerant"),
    )


def test_no_execute_evicts_survives_restart_and_a_re_enumeration_lifts_it(
    client: KubeClient, agents: NodeAgents, namespace: str
) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    sick = uuid_of(2)
    gpu_pod(client, namespace, "victim", uuid=sick, memory="1Gi")
    assert allocated_uuid(client, namespace, "victim") == sick
    fakegpu.inject_xid(agents.gpu_env, 2, 48)
    fault = [(f"{DRIVER}/gpu-fault", "xid-48", "NoExecute")]
    await_taints(client, sick, fault)

    wait_for(
        "the pod on the faulty GPU to be evicted", lambda: pod_gone(client, namespace, "victim")
    )
    # A restart keeps the taint: the new plugin republishes it next to a fresh change.
    agents.start_plugin()
    fakegpu.inject_xid(agents.gpu_env, 3, 94)
    await_taints(client, uuid_of(3), [(f"{DRIVER}/xid", "xid-94", "NoSchedule")])
    assert taints_of(client, sick) == fault
    # Hot-remove: gone from the pool within 5 s; added back (re-enumerated): published, clean.
    # (bench/health.py measures the latency; here a generous bound keeps the test robust.)
    fakegpu.set_gpu_removed(agents.gpu_env, 2, True)
    wait_for("the removed GPU to leave the pool", lambda: taints_of(client, sick) is None, 20)
    fakegpu.set_gpu_removed(agents.gpu_env, 2, False)
    await_taints(client, sick, [])


def test_a_lost_gpu_is_no_execute_until_it_answers_again(
    client: KubeClient, agents: NodeAgents
) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    lost = uuid_of(3)
    fakegpu.set_gpu_lost(agents.gpu_env, 3, True)
    try:
        wait_for(
            "the lost GPU tainted unreachable",
            lambda: (
                (f"{DRIVER}/unreachable", "fallen-off-bus", "NoExecute")
                in (taints_of(client, lost) or [])
            ),
        )
    finally:
        fakegpu.set_gpu_lost(agents.gpu_env, 3, False)

    def lifted() -> bool:
        taints = taints_of(client, lost)
        return taints is not None and all(t[0] != f"{DRIVER}/unreachable" for t in taints)

    wait_for("the unreachable taint lifted", lifted)


TENANT = """
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 30)) == 0
print("allocated", flush=True)
time.sleep(120)
"""


def test_the_plugin_kills_a_container_without_the_hook_over_its_cap_and_records_events(
    client: KubeClient, agents: NodeAgents, namespace: str
) -> None:
    """The plugin's enforcement thread, with the claim prepared through the real path: a
    process on the node gets the plugin's CDI spec minus the `/etc/ld.so.preload` mount (an
    image where the hook never loads) and allocates 3 GiB on its 1 GiB claim through libcuda.
    The bed applies those edits itself (`vgpu_testbed.container`): no runtime starts a container
    without a mount its CDI spec names."""
    import json
    import os
    import subprocess
    import sys

    from vgpu_testbed.container import container_command

    gpu_pod(client, namespace, "capped", uuid=uuid_of(1), memory="1Gi")
    pod = running_pod(client, namespace, "capped")
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = client.get(
        kube.path(RESOURCE_API, "resourceclaims", status["resourceClaimName"], namespace=namespace)
    )
    uid = claim["metadata"]["uid"]
    spec = json.loads(agents.paths.cdi_spec(uid).read_text())
    edits = spec["containerEdits"]
    edits["mounts"] = [m for m in edits["mounts"] if m["containerPath"] != "/etc/ld.so.preload"]
    # On the node, where the plugin sees its processes (a real node's own PID namespace).
    tenant = subprocess.Popen(
        agents.enter(
            container_command(
                spec, [d["name"] for d in spec["devices"]], [sys.executable, "-c", TENANT]
            )
        ),
        env={**os.environ, **agents.gpu_env},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tenant.stdout is not None and tenant.stdout.readline().strip() == "allocated"
        assert tenant.wait(timeout=60) == -9  # SIGKILL from the plugin
    finally:
        if tenant.poll() is None:
            tenant.kill()
            tenant.wait()

    def reasons() -> set[str] | None:
        events = client.list(kube.path("v1", "events", namespace=namespace))
        found = {e["reason"] for e in events if e["involvedObject"].get("uid") == uid}
        return found if {"GPUHookMissing", "GPUMemoryCapExceeded"} <= found else None

    wait_for("the enforcement events on the claim", reasons)


def test_a_gpu_added_after_start_is_published_without_a_restart(
    client: KubeClient, agents: NodeAgents
) -> None:
    """NVML enumerates GPUs once per process and the plugin keeps it initialised: only the
    rescan in a child process sees a GPU that was not there when the plugin started."""
    from vgpu_testbed.fakegpu import simulator as fakegpu

    late = uuid_of(3)
    wait_for("node-2 slices", lambda: len(devices_by_uuid(client)) == 4)
    names_before = {u: d["name"] for u, d in devices_by_uuid(client).items()}
    fakegpu.set_gpu_removed(agents.gpu_env, 3, True)
    try:
        agents.start_plugin()
        wait_for("the pool without the late GPU", lambda: late not in devices_by_uuid(client))
    finally:
        fakegpu.set_gpu_removed(agents.gpu_env, 3, False)
    wait_for("the late GPU published", lambda: late in devices_by_uuid(client))
    assert {u: d["name"] for u, d in devices_by_uuid(client).items()} == names_before
