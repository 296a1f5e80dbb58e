"""Two plugin processes on one state dir: the second cannot corrupt the first (issue 15.5).

Real `vgpu-dra kubelet-plugin` processes (main's wiring; GPU discovery replaced by a hand-made
inventory as in test_lifecycle) against the real API server, prepared over their gRPC sockets.
A second instance with `--state-lock-timeout=0` exits naming the holder's pid and leaves the
first one's claims alone; one that waits takes over only after the first exits, and then finds
every claim the first prepared (none deleted as an "orphan", no checkpoint entry lost).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.claims import ClaimRef
from tests.fixtures.claimdata import create_allocated_claim, result
from tests.integration.kubelet_plugin.conftest import (
    LaunchedPlugin,
    prepare,
    prepared_files,
    wait_for,
)


class Instance(LaunchedPlugin):
    """One plugin process with its own sockets and a shared state dir and CDI root."""

    def __init__(self, root: Path, name: str, cluster: Any, *extra: str) -> None:
        self.dir = root / name
        self.dir.mkdir()
        self.dra = self.dir / "plugins" / "dra.sock"
        self.reg = self.dir / "registry" / "vgpu.dra.dev-reg.sock"
        super().__init__(
            root,
            cluster,
            self.dir / "plugin.log",
            self.dir / "plugins",
            self.dir / "registry",
            *extra,
        )

    def prepare(self, ref: ClaimRef) -> str:
        return prepare(self.dra, [ref])[ref.uid]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vgpu-2x-"))  # short: unix socket paths
    (path / "cdi").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
            instance.close()
            print(f"--- {instance.dir.name}\n{instance.log()[-2000:]}")
