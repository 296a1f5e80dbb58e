"""Two plugin processes on one state dir: the second cannot corrupt the first (issue 15.5).

Real `vgpu-dra kubelet-plugin` processes (main's wiring; GPU discovery replaced by a hand-made
inventory as in test_lifecycle) against the real API server, prepared over their gRPC sockets.
A second instance with `--state-lock-timeout=0` exits naming the holder's pid and leaves the
first one's claims alone; one that waits takes over only after the first exits, and then finds
every claim the first prepared (none deleted as an "orphan", no checkpoint entry lost).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver import cdi, kube
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.fixtures.claimdata import HOOK_LIB, NODE, create_allocated_claim, result
from tests.integration.kubelet_plugin.conftest import KIND, LAUNCHER, ROOT, wait_for


class Instance:
    """One plugin process with its own sockets and a shared state dir and CDI root."""

    def __init__(self, root: Path, name: str, cluster: Any, *extra: str) -> None:
        self.dir = root / name
        self.dir.mkdir()
        self.log_path = self.dir / "plugin.log"
        self.dra = self.dir / "plugins" / "dra.sock"
        self.reg = self.dir / "registry" / "vgpu.dra.dev-reg.sock"
        argv = [
            sys.executable,
            "-c",
            LAUNCHER,
            f"--node-name={NODE}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--plugin-dir={self.dir}/plugins",
            f"--registrar-dir={self.dir}/registry",
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

    def prepare(self, ref: ClaimRef) -> str:
        with grpc.insecure_channel(f"unix://{self.dra}") as channel:
            response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)]
                ),
                timeout=30,
            )
        return str(response.claims[ref.uid].error)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vgpu-2x-"))  # short: unix socket paths
    (path / "cdi").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def prepared_files(root: Path, uid: str) -> bool:
    spec = root / "cdi" / cdi.spec_file_name(KIND, uid)
    return spec.exists() and (root / "state" / "claims" / uid / "vgpu.conf").exists()


def test_second_instance_cannot_corrupt_the_first(
    cluster: Any, kube_client: kube.KubeClient, namespace: str, root: Path
) -> None:
    first = Instance(root, "a", cluster)
    instances = [first]
    try:
        wait_for(first.reg.exists, what="the first instance's sockets")
        one = create_allocated_claim(kube_client, namespace, [result("gpu-0", memory="1Gi")])
        assert first.prepare(one) == ""

        refused = Instance(root, "b", cluster, "--state-lock-timeout=0")
        instances.append(refused)
        assert refused.proc.wait(timeout=60) == 1
        assert f"in use by another kubelet plugin (pid {first.proc.pid}" in refused.log()
        assert not refused.reg.exists()

        waiting = Instance(root, "c", cluster, "--state-lock-timeout=120")
        instances.append(waiting)
        wait_for(
            lambda: f"held by pid {first.proc.pid}; waiting" in waiting.log(),
            what="the third instance to wait for the lock",
        )
        two = create_allocated_claim(kube_client, namespace, [result("gpu-1", memory="1Gi")])
        assert first.prepare(two) == ""  # the first keeps working while the third waits
        for ref in (one, two):
            assert prepared_files(root, ref.uid)
        assert sorted(CheckpointJournal(str(root / "state")).load()) == sorted([one.uid, two.uid])

        assert first.stop() == 0
        wait_for(waiting.reg.exists, what="the third instance to take over")
        assert "0 orphan specs and 0 orphan claim dirs removed" in waiting.log()
        assert sorted(CheckpointJournal(str(root / "state")).load()) == sorted([one.uid, two.uid])
        for ref in (one, two):
            assert prepared_files(root, ref.uid)
            assert waiting.prepare(ref) == ""  # answered from its checkpoint
        assert waiting.stop() == 0
    finally:
        for instance in instances:
            instance.kill()
            print(f"--- {instance.dir.name}\n{instance.log()[-2000:]}")
