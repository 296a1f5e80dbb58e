"""Fixtures for the kubelet plugin's integration tests: the real control plane (claims are read
from a real kube-apiserver), the plugin's real gRPC servers on unix sockets, and the Go
conformance tools built from the upstream modules (k8s.io/kubelet, the CDI reference library).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver import cdi, kube
from dra_driver.gpu import NodeInventory
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.health import HealthBoard
from kubelet_plugin.prepare import NodeSettings, Preparer, kube_claim_source
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import DRIVER, HOOK_LIB, NODE, GiB, inventory
from tests.fixtures.prepare import KIND, node_settings

ROOT = Path(__file__).resolve().parents[3]
# `python -c LAUNCHER ARGS...`: the real plugin main on a hand-made two-GPU inventory.
LAUNCHER = """
import sys
from tests.fixtures.claimdata import inventory
import kubelet_plugin.main as main
main._discover_function = lambda: (lambda: inventory(count=2))
sys.exit(main.main(sys.argv[1:]))
"""


@pytest.fixture(scope="session")
def conformance_bin() -> Path:
    """Build (or reuse) hack/conformance's tools; skip without Go unless in CI."""
    if shutil.which("go") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have Go to build hack/conformance", pytrace=False)
        pytest.skip("Go is not installed: cannot build the conformance tools (hack/conformance)")
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "conformance" / "build.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"hack/conformance/build.sh failed:\n{done.stderr[-3000:]}", pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kube_client(cluster: Any) -> Iterator[kube.KubeClient]:
    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@dataclass
class RunningPlugin:
    root: Path
    settings: NodeSettings
    sockets: SocketPaths
    preparer: Preparer
    server: PluginServer
    board: HealthBoard
    inventory: NodeInventory

    @property
    def cdi_root(self) -> Path:
        return Path(self.settings.cdi_root)

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.state_dir)

    def spec_file(self, uid: str) -> Path:
        return self.cdi_root / cdi.spec_file_name(KIND, uid)


@pytest.fixture
def plugin(kube_client: kube.KubeClient) -> Iterator[RunningPlugin]:
    """The plugin's servers and Preparer in this process, for a hand-made 4-GPU inventory, with
    claims read from the real API server. Short socket paths (unix sockets allow 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="vgpu-plugin-"))
    inv = inventory(count=4, memory=16 * GiB)
    settings = node_settings(root, claim_gid=4242)
    sockets = SocketPaths.for_driver(
        DRIVER, plugins_dir=str(root / "plugins"), registrar_dir=str(root / "registry")
    )
    preparer = Preparer(settings, inv, kube_claim_source(kube_client))
    preparer.reconcile()
    board = HealthBoard(NODE, inv)
    server = PluginServer(driver=DRIVER, sockets=sockets, preparer=preparer, health=board)
    server.start()
    try:
        yield RunningPlugin(root, settings, sockets, preparer, server, board, inv)
    finally:
        server.stop(grace_s=1)
        preparer.close()
        shutil.rmtree(root, ignore_errors=True)


def prepare(dra_socket: Path, refs: list[ClaimRef]) -> dict[str, str]:
    """NodePrepareResources over the plugin's socket; claim UID -> error ("" = prepared)."""
    with grpc.insecure_channel(f"unix://{dra_socket}") as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[
                    dra_v1_pb2.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs
                ]
            ),
            timeout=30,
        )
    return {uid: answer.error for uid, answer in response.claims.items()}


def run_json(argv: list[str]) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{argv[0]} failed: {done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def plugin_process_argv(root: Path, kubeconfig: Path | str, node: str, *extra: str) -> list[str]:
    """`vgpu-dra kubelet-plugin` with every path under `root` (short: unix sockets allow 107
    bytes) and no slice publishing; `extra` flags are appended."""
    return [
        sys.executable,
        "-m",
        "dra_driver.cli",
        "kubelet-plugin",
        f"--node-name={node}",
        f"--kubeconfig={kubeconfig}",
        f"--plugin-dir={root}/plugins/vgpu.dra.dev",
        f"--registrar-dir={root}/registry",
        f"--cdi-root={root}/cdi",
        f"--state-dir={root}/state",
        f"--hook-path={HOOK_LIB}",
        "--no-publish-slices",
        *extra,
    ]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextmanager
def plugin_process(
    argv: list[str], env: dict[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The plugin process, output to `log_path`; killed if still running at the end, and the
    tail of its log printed (pytest shows it when the test fails)."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        print(log_path.read_text()[-3000:])


class LaunchedPlugin:
    """One plugin process (LAUNCHER: main's wiring on a hand-made inventory) on the state dir and
    CDI root under `root`, with its sockets in `plugin_dir` and `registrar_dir`; several of them
    share one node's state in test_single_instance and test_rolling_update."""

    def __init__(
        self,
        root: Path,
        cluster: Any,
        log_path: Path,
        plugin_dir: Path,
        registrar_dir: Path,
        *extra: str,
    ) -> None:
        self.log_path = log_path
        argv = [
            sys.executable,
            "-c",
            LAUNCHER,
            f"--node-name={NODE}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--plugin-dir={plugin_dir}",
            f"--registrar-dir={registrar_dir}",
            f"--cdi-root={root}/cdi",
            f"--state-dir={root}/state",
            f"--hook-path={HOOK_LIB}",
            "--no-nvidia-cdi",
            "--no-governor",
            "--no-publish-slices",
            *extra,
        ]
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Killed if still running; its log closed."""
        self.kill()
        self._log.close()


def prepared_files(root: Path, uid: str) -> bool:
    """The claim's CDI spec and its vgpu.conf exist under a LaunchedPlugin's `root`."""
    spec = root / "cdi" / cdi.spec_file_name(KIND, uid)
    return spec.exists() and (root / "state" / "claims" / uid / "vgpu.conf").exists()
