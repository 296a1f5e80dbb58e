"""Rolling update on one node: a new plugin instance takes over from a running one, no call lost.

Real `vgpu-dra kubelet-plugin` processes (main's wiring; GPU discovery replaced by a hand-made
inventory as in test_single_instance) against the real API server, sharing one node's registrar
dir, plugin dir, state dir and CDI root, as two pods of a DaemonSet surge do. The test plays the
kubelet's part that matters here, as kubelet 1.37 does it (pkg/kubelet/cm/dra/plugin): each
instance registers under its own socket names, and calls go to the newest registered instance.

What this proves:
1. `--instance-id` gives each instance its own registration socket and DRA endpoint (the kubelet
   refuses a second registration of the same endpoint); both exist at once.
2. While the old instance holds the node lock the new one does not touch the state: calls sent
   to the new one are forwarded to the old one, which prepares them with its state.
3. A stream of prepares sent to the new instance across the old one's SIGTERM loses none: every
   call answers without error, every claim is in the checkpoint with its CDI spec and claim dir,
   and the new instance (now the lock holder) unprepares a claim the old one prepared.
4. Sockets of a dead (SIGKILLed) instance are removed when the new instance takes over; the old
   instance removed its own on exit.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver import kube
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.fixtures.claimdata import create_allocated_claim, result
from tests.integration.kubelet_plugin.conftest import LaunchedPlugin, prepared_files, wait_for

DRIVER = "vgpu.dra.dev"


class Instance(LaunchedPlugin):
    """One plugin pod's process: the node's shared dirs, sockets named after `instance`."""

    def __init__(self, root: Path, instance: str, cluster: Any, *extra: str) -> None:
        self.instance = instance
        self.dra = root / "plugins" / f"dra-{instance}.sock"
        self.reg = root / "registry" / f"{DRIVER}-{instance}-reg.sock"
        super().__init__(
            root,
            cluster,
            root / f"{instance}.log",
            root / "plugins",
            root / "registry",
            f"--instance-id={instance}",
            "--state-lock-timeout=120",
            "--log-level=debug",
            *extra,
        )

    def call(self, method: str, ref: ClaimRef, timeout: float = 45.0) -> str:
        """One kubelet call (45 s: the kubelet's default DRA call timeout); the claim's error."""
        claims = [dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)]
        with grpc.insecure_channel(f"unix://{self.dra}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            if method == "prepare":
                request: Any = dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
                response: Any = stub.NodePrepareResources(request, timeout=timeout)
            else:
                request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims)
                response = stub.NodeUnprepareResources(request, timeout=timeout)
        return str(response.claims[ref.uid].error)


class PrepareStream:
    """What the kubelet sends to the newest instance: prepares, one after another, in a thread;
    at least `minimum` of them, until `finish()`."""

    def __init__(
        self, target: Instance, new_claim: Callable[[int], ClaimRef], minimum: int = 12
    ) -> None:
        self.refs: list[ClaimRef] = []
        self.errors: list[str] = []
        self._target = target
        self._new_claim = new_claim
        self._minimum = minimum
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prepare-stream")
        self._thread.start()

    def _run(self) -> None:
        index = 1
        while not self._done.is_set() or len(self.refs) < self._minimum:
            ref = self._new_claim(index)
            index += 1
            try:
                error = self._target.call("prepare", ref)
            except grpc.RpcError as exc:
                error = f"gRPC {exc}"
            self.refs.append(ref)
            if error:
                self.errors.append(f"{ref.uid}: {error}")

    def finish(self) -> None:
        self._done.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the prepare stream hung"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vgpu-ru-"))  # short: unix socket paths
    for sub in ("cdi", "registry"):
        (path / sub).mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_new_instance_takes_over_without_losing_a_prepare(
    cluster: Any, kube_client: kube.KubeClient, namespace: str, root: Path
) -> None:
    def new_claim(index: int) -> ClaimRef:
        return create_allocated_claim(
            kube_client, namespace, [result(f"gpu-{index % 2}", memory="64Mi")]
        )

    old = Instance(root, "old-pod-uid", cluster)
    instances = [old]
    try:
        wait_for(old.reg.exists, what="the old instance's sockets")
        first = new_claim(0)
        assert old.call("prepare", first) == ""

        # A pod of an earlier rollout that was SIGKILLed while waiting: its sockets stay behind.
        dead = Instance(root, "dead-pod-uid", cluster)
        instances.append(dead)
        wait_for(lambda: "taking the node lock" in dead.log(), what="the dead instance to serve")
        dead.kill()
        assert dead.reg.exists() and dead.dra.exists()

        new = Instance(root, "new-pod-uid", cluster)
        instances.append(new)
        wait_for(new.reg.exists, what="the new instance's sockets")
        wait_for(lambda: "waiting up to" in new.log(), what="the new instance to wait for the lock")
        assert old.reg.exists() and old.dra.exists()  # both registered at once, unique names

        stream = PrepareStream(new, new_claim)
        try:
            wait_for(lambda: len(stream.refs) >= 4, timeout=60, what="prepares before handover")
            # The old instance served them: the new one forwarded, it has not taken over.
            assert "took over the node" not in new.log()
            assert new.log().count("NodePrepareResources forwarded to the lock holder") >= 4
            for ref in list(stream.refs):
                assert prepared_files(root, ref.uid)

            assert old.stop() == 0  # SIGTERM, as the DaemonSet controller deletes the old pod
            wait_for(lambda: "took over the node" in new.log(), timeout=60, what="the take-over")
        finally:
            stream.finish()

        assert stream.errors == []
        every = [first, *stream.refs]
        assert sorted(CheckpointJournal(str(root / "state")).load()) == sorted(r.uid for r in every)
        for ref in every:
            assert prepared_files(root, ref.uid), ref.uid
        # Prepared by the old instance, unprepared by the new one from its checkpoint.
        assert new.call("unprepare", first) == ""
        assert not prepared_files(root, first.uid)

        # Sockets: the old removed its own; the dead one's were removed at the take-over.
        for gone in (old.reg, old.dra, dead.reg, dead.dra):
            assert not gone.exists(), gone
        assert "removed stale socket" in new.log()
        assert new.reg.exists() and new.dra.exists()
        assert sorted(p.name for p in (root / "registry").iterdir()) == [new.reg.name]
        assert new.stop() == 0
        assert not new.reg.exists() and not new.dra.exists()
    finally:
        for instance in instances:
            instance.close()
            print(f"--- {instance.instance}\n{instance.log()[-3000:]}")


def test_waiting_instance_stopped_before_it_takes_over_leaves_the_holder_alone(
    cluster: Any, kube_client: kube.KubeClient, namespace: str, root: Path
) -> None:
    """A rollout rolled back: the waiting instance exits on SIGTERM at once; state untouched."""
    old = Instance(root, "old-pod-uid", cluster)
    new: Instance | None = None
    try:
        wait_for(old.reg.exists, what="the old instance's sockets")
        ref = create_allocated_claim(kube_client, namespace, [result("gpu-0", memory="64Mi")])
        assert old.call("prepare", ref) == ""
        new = Instance(root, "new-pod-uid", cluster)
        wait_for(lambda: "waiting up to" in new.log(), what="the new instance to wait")
        started = time.monotonic()
        assert new.stop() == 0
        assert time.monotonic() - started < 10
        assert not new.reg.exists() and not new.dra.exists()
        assert old.call("unprepare", ref) == ""  # the holder still serves, with its state
        assert not prepared_files(root, ref.uid)
        assert old.stop() == 0
    finally:
        for instance in (old, new):
            if instance is not None:
                instance.close()
                print(f"--- {instance.instance}\n{instance.log()[-3000:]}")
