"""A stalled API server cannot hold prepare past the kubelet's deadline (issue 15.7).

The server is real as far as the client can tell: a loopback TCP listener that accepts every
connection and never answers (what a wedged apiserver looks like from the node). The plugin's
own wiring is used end to end: kubeconfig -> KubeClient -> claim source -> Preparer -> the DRA
gRPC server on a unix socket, called with a deadline the way the kubelet calls it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dra_driver import kube
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.prepare import Preparer, kube_claim_source
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import DRIVER, GiB, claim, inventory, result
from tests.fixtures.prepare import Claims, node_settings


class StalledServer:
    """Accepts connections, reads nothing, answers nothing; counts connections."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        # shutdown() wakes the blocked accept() (close() alone does not), so the thread ends.
        self._listener.shutdown(socket.SHUT_RDWR)
        self._thread.join()
        self._listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def stalled() -> Iterator[StalledServer]:
    server = StalledServer()
    yield server
    server.close()


def kubeconfig(tmp_path: Path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return str(path)


def test_a_request_that_gets_no_answer_is_sent_once(
    tmp_path: Path, stalled: StalledServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No urllib3 retry multiplies the timeout: one connection, one timeout, then an error."""
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    client = kube.KubeClient.from_kubeconfig(kubeconfig(tmp_path, stalled.port), timeout_s=0.5)
    try:
        with pytest.raises(kube.Unreachable, match="timed out"):
            client.get("/api/v1/namespaces/default")
        assert len(stalled.accepted) == 1
    finally:
        client.close()


def test_prepare_fails_the_claim_within_the_deadline_and_known_claims_still_answer(
    tmp_path: Path, stalled: StalledServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    settings = node_settings(tmp_path)
    # Prepared while the API server was fine (recorded in the checkpoint).
    claims = Claims()
    known = claims.add(claim([result("gpu-0", memory="1Gi")], name="known"))
    before = Preparer(settings, inventory(memory=16 * GiB), claims)
    before.reconcile()
    assert before.prepare([known])[known.uid].error == ""
    before.close()

    # The restarted plugin, whose API server now hangs (the client's own timeout is 30 s).
    client = kube.KubeClient.from_kubeconfig(kubeconfig(tmp_path, stalled.port))
    preparer = Preparer(settings, inventory(memory=16 * GiB), kube_claim_source(client))
    sockets = SocketPaths.for_driver(
        DRIVER, plugins_dir=str(tmp_path / "plugins"), registrar_dir=str(tmp_path / "reg")
    )
    server = PluginServer(driver=DRIVER, sockets=sockets, preparer=preparer)
    server.start()
    new = ClaimRef("default", "new", "0b9c7f0e-2a55-4f5e-9c59-3d5cbd1d6f10")
    try:
        with grpc.insecure_channel(f"unix://{sockets.dra}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[
                    dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid)
                    for r in (known, new)
                ]
            )
            started = time.monotonic()
            # Raises DEADLINE_EXCEEDED if prepare waits for the stalled server.
            response = stub.NodePrepareResources(request, timeout=3.0)
            elapsed = time.monotonic() - started
        assert response.claims[known.uid].error == ""
        assert [d.device_name for d in response.claims[known.uid].devices] == ["gpu-0"]
        error = response.claims[new.uid].error
        assert "the API server did not answer within" in error and "retryable" in error, error
        assert elapsed < 3.0
        assert len(stalled.accepted) == 1  # asked once, not retried
    finally:
        server.stop(grace_s=0)
        preparer.close()
        client.close()


class RecordingSource:
    """A claim source that remembers the time budget each read was given."""

    def __init__(self, claims: Claims) -> None:
        self.claims = claims
        self.budgets: list[float | None] = []

    def __call__(self, ref: ClaimRef, timeout_s: float | None) -> dict[str, object]:
        self.budgets.append(timeout_s)
        return self.claims(ref, timeout_s)


@pytest.mark.parametrize("timeout", [None, 3.0])
def test_the_read_budget_follows_the_callers_deadline(
    tmp_path: Path, timeout: float | None
) -> None:
    """A call without a deadline (gRPC reports ~292 years left) leaves the client's default
    timeout in charge, not an absurd budget; a call with a deadline gets less than is left."""
    claims = Claims()
    source = RecordingSource(claims)
    preparer = Preparer(node_settings(tmp_path), inventory(memory=16 * GiB), source)
    preparer.reconcile()
    sockets = SocketPaths.for_driver(
        DRIVER, plugins_dir=str(tmp_path / "plugins"), registrar_dir=str(tmp_path / "reg")
    )
    server = PluginServer(driver=DRIVER, sockets=sockets, preparer=preparer, watch_period_s=0)
    server.start()
    ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
    try:
        with grpc.insecure_channel(f"unix://{sockets.dra}") as channel:
            response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)]
                ),
                timeout=timeout,
            )
        assert response.claims[ref.uid].error == ""
        [budget] = source.budgets
        if timeout is None:
            assert budget is None  # the client's own timeout (30 s, no read retries) applies
        else:
            # gRPC sends the deadline as a relative timeout that the server counts from its own
            # receipt of the call, so the server may see up to the transit time more than the
            # client's 3 s (seen: 3.008 s under load); 80 % of that is the budget.
            assert budget is not None and 0 < budget <= timeout * 0.8 + 0.05
    finally:
        server.stop(grace_s=0)
        preparer.close()
