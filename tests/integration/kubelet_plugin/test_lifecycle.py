"""The plugin as a process and its health stream.

1. `vgpu-dra kubelet-plugin` (main's real wiring: flags, reconcile, servers, slice publisher
   thread, signals) started as a subprocess against the real API server publishes this node's
   ResourceSlice, serves both sockets with private permissions, reconciles orphans left in its
   CDI root at start, and on SIGTERM exits 0 and removes its sockets. GPU discovery is the one
   part replaced (a hand-made inventory, injected by a two-line launcher), because NVML is
   covered by the inventory tests and the simulated-GPU e2e tests.
2. DRAResourceHealth: the first message lists every device HEALTHY; a GPU that disappears from
   discovery is streamed as UNHEALTHY, over both the v1 and v1alpha1 services.
3. The same with nothing replaced: the plugin process on simulated GPUs (fake NVML loaded by the
   real loader) streams UNHEALTHY for a GPU-fault XID (not for an application XID) and for a
   GPU that falls off the bus; after repair and a restart every GPU is HEALTHY again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from dra_driver import kube
from kubelet_plugin.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
)
from tests.fixtures.claimdata import HOOK_LIB, inventory
from tests.fixtures.simulated import require_simulated_gpus, simulated_node_env
from tests.integration.kubelet_plugin.conftest import (
    LAUNCHER,
    ROOT,
    RunningPlugin,
    plugin_process,
    plugin_process_argv,
    wait_for,
)


def test_plugin_process_lifecycle(cluster: Any, kube_client: kube.KubeClient) -> None:
    root = Path(tempfile.mkdtemp(prefix="vgpu-main-"))
    cdi_root = root / "cdi"
    cdi_root.mkdir()
    shared_registry = root / "registry"
    shared_registry.mkdir(mode=0o750)  # the kubelet's directory: the plugin must not chmod it
    shared_registry.chmod(0o750)
    orphan = cdi_root / "k8s.vgpu.dra.dev-claim_11111111-2222-3333-4444-555555555555.json"
    orphan.write_text("{}")
    argv = [
        sys.executable,
        "-c",
        LAUNCHER,
        "--node-name=node-2",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--plugin-dir={root}/plugins/vgpu.dra.dev",
        f"--registrar-dir={root}/registry",
        f"--cdi-root={cdi_root}",
        f"--state-dir={root}/state",
        f"--hook-path={HOOK_LIB}",
        "--no-nvidia-cdi",
        "--no-governor",
    ]
    dra = root / "plugins" / "vgpu.dra.dev" / "dra.sock"
    reg = root / "registry" / "vgpu.dra.dev-reg.sock"
    try:
        with plugin_process(argv, {}, root / "plugin.log") as proc:
            wait_for(reg.exists, what="the registration socket")
            assert dra.exists()
            assert not orphan.exists(), "start-up reconciliation keeps orphan specs"
            for sock in (dra, reg):
                assert oct(sock.stat().st_mode & 0o777) == oct(0o600)
            assert oct(dra.parent.stat().st_mode & 0o777) == oct(0o700)
            assert oct(shared_registry.stat().st_mode & 0o777) == oct(0o750)

            def published() -> list[dict[str, Any]]:
                return kube_client.list(
                    kube.path(kube.RESOURCE_API, "resourceslices"),
                    field_selector="spec.nodeName=node-2",
                )

            wait_for(lambda: len(published()) == 1, what="the ResourceSlice of node-2")
            [slice_] = published()
            slice_uid = slice_["metadata"]["uid"]
            assert [d["name"] for d in slice_["spec"]["devices"]] == ["gpu-0", "gpu-1"]

            # The kubelet deletes its node's slices when it starts: the plugin publishes again
            # at once (its watch), not at the next resync (--resync-seconds, 60 s here).
            kube_client.delete(
                kube.path(kube.RESOURCE_API, "resourceslices", slice_["metadata"]["name"])
            )
            wait_for(
                lambda: [s["metadata"]["uid"] for s in published()] not in ([], [slice_uid]),
                timeout=20,
                what="the deleted ResourceSlice published again",
            )

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            assert not dra.exists() and not reg.exists()
    finally:
        for item in published_slices(kube_client):
            kube_client.delete(kube.path(kube.RESOURCE_API, "resourceslices", item))


def published_slices(client: kube.KubeClient) -> list[str]:
    items = client.list(
        kube.path(kube.RESOURCE_API, "resourceslices"), field_selector="spec.nodeName=node-2"
    )
    return [item["metadata"]["name"] for item in items]


def test_health_stream_reports_changes(plugin: RunningPlugin) -> None:
    for pb, pb_grpc in (
        (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
        (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
    ):
        plugin.board.observe(plugin.inventory)  # everything healthy again
        with grpc.insecure_channel(f"unix://{plugin.sockets.dra}") as channel:
            stream = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                pb.NodeWatchResourcesRequest(), timeout=20
            )
            first = next(stream)
            assert {
                (d.device.pool_name, d.device.device_name, d.health) for d in first.devices
            } == {("node-1", f"gpu-{i}", pb.HEALTHY) for i in range(4)}
            assert all(d.health_check_timeout_seconds > 0 for d in first.devices)

            without_gpu1 = inventory(count=4, memory=16 << 30).model_copy(
                update={"gpus": tuple(g for g in plugin.inventory.gpus if g.index != 1)}
            )
            timer = threading.Timer(0.2, plugin.board.observe, args=(without_gpu1,))
            timer.start()
            update = next(stream)
            timer.join()
            health = {d.device.device_name: d.health for d in update.devices}
            assert health["gpu-1"] == pb.UNHEALTHY
            assert health["gpu-0"] == pb.HEALTHY
            stream.cancel()


def test_bad_flags_exit_with_a_clear_message() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "kubelet-plugin", "--oversubscription-ratio=0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODE_NAME": "node-x"},
        check=False,
    )
    assert done.returncode == 2
    assert "--oversubscription-ratio must be a number from 1.0 to 64, got 0.5" in done.stderr


def health(message: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in message.devices}


def wait_for_health(
    stream: Any, done: Callable[[dict[str, tuple[int, str]]], bool]
) -> dict[str, tuple[int, str]]:
    while True:  # the stream's own timeout bounds the wait
        update = health(next(stream))
        if done(update):
            return update


def watch(channel: grpc.Channel) -> Any:
    return dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        dra_health_v1_pb2.NodeWatchResourcesRequest(), timeout=60
    )


def test_gpu_faults_on_simulated_node_are_streamed_unhealthy(cluster: Any) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    require_simulated_gpus()
    root = Path(tempfile.mkdtemp(prefix="vgpu-sim-"))
    gpu_env = simulated_node_env(root)
    argv = plugin_process_argv(root, cluster.kubeconfig, "node-1", "--no-governor")
    dra = root / "plugins" / "vgpu.dra.dev" / "dra.sock"
    registration = root / "registry" / "vgpu.dra.dev-reg.sock"
    log_path = root / "plugin.log"
    healthy, unhealthy = dra_health_v1_pb2.HEALTHY, dra_health_v1_pb2.UNHEALTHY
    with plugin_process(argv, gpu_env, log_path) as proc:
        wait_for(registration.exists, what="registration")
        with grpc.insecure_channel(f"unix://{dra}") as channel:
            stream = watch(channel)
            assert {k: v[0] for k, v in health(next(stream)).items()} == {
                "gpu-0": healthy,
                "gpu-1": healthy,
            }
            # XID 13 (an application's illegal access) leaves the GPU healthy; XID 48 (double-bit
            # ECC error) taints it (NoExecute, kubelet health UNHEALTHY) until the GPU is reset.
            fakegpu.inject_xid(gpu_env, 0, 13)
            fakegpu.inject_xid(gpu_env, 0, 48)
            status, message = health(next(stream))["gpu-0"]
            assert status == unhealthy and "XID 48" in message
            # A GPU that falls off the bus (lost: NVML fails, XID 79) is reported as well.
            fakegpu.set_gpu_lost(gpu_env, 1, True)
            wait_for_health(stream, lambda h: h["gpu-1"][0] == h["gpu-0"][0] == unhealthy)
            # ...and healthy again once it answers, without a restart.
            fakegpu.set_gpu_lost(gpu_env, 1, False)
            update = wait_for_health(stream, lambda h: h["gpu-1"][0] == healthy)
            assert update["gpu-0"][0] == unhealthy
            stream.cancel()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert not dra.exists()
    # A restart does not un-taint the GPU with a fatal XID (device-health.json).
    with plugin_process(argv, gpu_env, log_path) as proc:
        wait_for(registration.exists, what="registration")
        with grpc.insecure_channel(f"unix://{dra}") as channel:
            stream = watch(channel)
            first = health(next(stream))
            assert first["gpu-0"][0] == unhealthy and "XID 48" in first["gpu-0"][1]
            assert first["gpu-1"][0] == healthy
            stream.cancel()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_unreadable_kubeconfig_exits_with_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("this is not a kubeconfig")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            LAUNCHER,
            "--node-name=n",
            f"--kubeconfig={bad}",
            f"--state-dir={tmp_path}/state",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"cannot load Kubernetes credentials (--kubeconfig {bad})" in done.stderr
    assert "Traceback" not in done.stderr
