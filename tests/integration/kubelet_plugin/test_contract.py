"""The prepare -> container contract, end to end with nothing hand-written in between:

claim allocated in the real API server -> kubelet's own gRPC client (hack/conformance) ->
the plugin prepares it on a simulated node (inventory discovered through the fake NVML) ->
the CDI spec the plugin wrote is applied as a container runtime would (vgpu_testbed.container:
private mount namespace, /etc/ld.so.preload bind-mounted) -> a CUDA driver-API program inside
sees the claim's memory cap, enforced by vgpu_hook reading the plugin's vgpu.conf.

What this proves: the files the plugin writes are exactly what the hook needs (mount layout,
preload, NVIDIA_VISIBLE_DEVICES, vgpu.conf syntax and values) — a change on either side that
breaks the contract fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cdi, kube
from dra_driver.gpu import NodeInventory
from kubelet_plugin.prepare import NodeSettings, Preparer, kube_claim_source
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import DRIVER, NODE, create_allocated_claim, result
from tests.fixtures.simulated import CONTAINERS, require_simulated_gpus, simulated_node_env
from tests.integration.kubelet_plugin.conftest import KIND, ROOT, run_json

HOOK_DIR = ROOT / "vgpu_hook"
PROBE = HOOK_DIR / "build" / "cuda_probe"
HOOK_LIB = HOOK_DIR / "build" / "libvgpu.so"
MIB = 1 << 20


def field(line: str, key: str) -> int:
    for token in line.split():
        if token.startswith(key + "="):
            return int(token.split("=", 1)[1])
    raise AssertionError(f"no {key}= in {line!r}")


@pytest.fixture
def simulated_node() -> Iterator[tuple[Path, dict[str, str], NodeInventory]]:
    require_simulated_gpus(root_for=CONTAINERS)
    subprocess.run(["make", "-s", "-C", str(HOOK_DIR)], check=True)
    root = Path(tempfile.mkdtemp(prefix="vgpu-contract-"))
    env = {**os.environ, **simulated_node_env(root)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dra_driver.inventory import discover; print(discover().model_dump_json())",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    try:
        yield root, env, NodeInventory.model_validate_json(done.stdout)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_hook_enforces_the_limits_the_plugin_prepared(
    conformance_bin: Path,
    kube_client: kube.KubeClient,
    namespace: str,
    simulated_node: tuple[Path, dict[str, str], NodeInventory],
) -> None:
    root, env, inventory = simulated_node
    assert [g.device_name for g in inventory.gpus] == ["gpu-0", "gpu-1"]
    settings = NodeSettings(
        driver=DRIVER,
        node_name=NODE,
        cdi_root=str(root / "cdi"),
        spec=cdi.SpecSettings(kind=KIND, state_dir=str(root / "state"), hook_path=str(HOOK_LIB)),
    )
    preparer = Preparer(settings, inventory, kube_claim_source(kube_client))
    preparer.reconcile()
    sockets = SocketPaths.for_driver(
        DRIVER, plugins_dir=str(root / "plugins"), registrar_dir=str(root / "registry")
    )
    server = PluginServer(driver=DRIVER, sockets=sockets, preparer=preparer)
    server.start()
    try:
        ref = create_allocated_claim(
            kube_client, namespace, [result("gpu-1", memory="1Gi", cores=0, share_id=None)]
        )
        out = run_json(
            [
                str(conformance_bin / "kubeletclient"),
                "-registration-socket",
                sockets.registration,
                "-prepare",
                f"{ref.namespace}/{ref.name}/{ref.uid}",
            ]
        )
        [device] = out["prepare"][ref.uid]["devices"]
        [cdi_id] = device["cdiDeviceIDs"]
        spec_file = root / "cdi" / cdi.spec_file_name(KIND, ref.uid)
        spec: dict[str, Any] = json.loads(spec_file.read_text())
        device_name = cdi_id.split("=", 1)[1]

        from vgpu_testbed.container import run_with_claims

        done = run_with_claims(
            [(spec, [device_name])],
            [str(PROBE), "init", "total", "info", "alloc:629145600", "alloc:629145600", "info"],
            base_env={**env, "VGPU_LOG_LEVEL": "warn"},
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert field(lines[1], "bytes") == 1 << 30, lines  # the GPU looks as large as the cap
        assert field(lines[2], "total") == 1 << 30, lines
        assert field(lines[3], "rc") == 0, lines
        assert field(lines[4], "rc") == 2, f"second 600 MiB must exceed the 1 GiB cap: {lines}"
        assert (1 << 30) - field(lines[5], "free") >= 600 * MIB
    finally:
        server.stop(grace_s=1)
        preparer.close()
