# ruff: noqa: N802  (gRPC servicer methods carry the proto's method names)
"""The kubelet stand-in's plugin side over real gRPC on unix sockets, with a minimal plugin.

The plugin here is a tiny registration + DRA v1beta1 server written for the test (the project's
real plugin is driven end to end in tests/e2e/kubelet_plugin/test_node_path.py, which always
negotiates
v1). What this proves:
1. The stand-in picks the first version it knows from the advertised list: a plugin offering
   only `v1beta1.DRAPlugin` gets v1beta1 calls (method path of the v1beta1 service), and the
   claims travel as {namespace, uid, name}.
2. A plugin with the wrong type is told so through NotifyRegistrationStatus(false, reason) and
   never used.
3. A re-created registration socket (plugin restart) is registered again; a removed one
   unregisters the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from dra_driver.kube import KubeClient
from kubelet_plugin.proto import (
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from vgpu_testbed.standin.kubelet import KubeletStandin
from vgpu_testbed.standin.rules import ClaimRef

DRIVER = "test.dra.dev"


@dataclass
class Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    plugin_type: str
    endpoint: str
    versions: list[str]
    info_calls: int = 0
    statuses: list[tuple[bool, str]] = field(default_factory=list)

    def GetInfo(self, request: Any, context: Any) -> Any:
        self.info_calls += 1
        return pluginregistration_v1_pb2.PluginInfo(
            type=self.plugin_type,
            name=DRIVER,
            endpoint=self.endpoint,
            supported_versions=self.versions,
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.statuses.append((request.plugin_registered, request.error))
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


@dataclass
class DraV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    prepared: list[tuple[str, str, str]] = field(default_factory=list)

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1beta1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            self.prepared.append((claim.namespace, claim.uid, claim.name))
            device = dra_v1beta1_pb2.Device(
                request_names=["gpu"],
                pool_name="node-x",
                device_name="gpu-0",
                cdi_device_ids=[f"k8s.test/claim={claim.uid}-gpu-0"],
            )
            response.claims[claim.uid].devices.append(device)
        return response


@dataclass
class FakePlugin:
    reg: Registration
    dra: DraV1beta1
    reg_socket: Path
    servers: list[grpc.Server]


def serve(tmp_path: Path, plugin_type: str, versions: list[str]) -> FakePlugin:
    dra_socket = tmp_path / "plugin" / "dra.sock"
    reg_socket = tmp_path / "registry" / f"{DRIVER}-reg.sock"
    dra_socket.parent.mkdir(exist_ok=True)
    reg_socket.parent.mkdir(exist_ok=True)
    reg = Registration(plugin_type, str(dra_socket), versions)
    dra = DraV1beta1()
    dra_server = grpc.server(ThreadPoolExecutor(max_workers=2))
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(dra, dra_server)
    dra_server.add_insecure_port(f"unix://{dra_socket}")
    dra_server.start()
    reg_server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(reg, reg_server)
    reg_server.add_insecure_port(f"unix://{reg_socket}")
    reg_server.start()
    return FakePlugin(reg, dra, reg_socket, [dra_server, reg_server])


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[KubeletStandin]:
    config = k8s.Configuration()
    config.host = "http://127.0.0.1:9"  # registration never talks to the API server
    kube_client = KubeClient(k8s.ApiClient(config))
    stand_in = KubeletStandin(
        kube_client,
        node_name="node-x",
        registrar_dir=tmp_path / "registry",
        state_dir=tmp_path / "kubelet",
    )
    yield stand_in
    stand_in.close()
    kube_client.close()


def test_first_known_version_is_used_and_claims_travel_intact(
    tmp_path: Path, standin: KubeletStandin
) -> None:
    plugin = serve(tmp_path, "DRAPlugin", ["v2.DRAPlugin", "v1beta1.DRAPlugin"])
    try:
        standin.scan_registrations()
        assert plugin.reg.statuses == [(True, "")]
        registered = standin.plugins[DRIVER]
        assert registered.version == "v1beta1.DRAPlugin"
        results = registered.prepare([ClaimRef("ns", "claim-a", "uid-a")], timeout=10)
        assert plugin.dra.prepared == [("ns", "uid-a", "claim-a")]
        assert results["uid-a"]["devices"][0]["cdiDeviceIDs"] == ["k8s.test/claim=uid-a-gpu-0"]
        assert results["uid-a"]["error"] == ""
    finally:
        for server in plugin.servers:
            server.stop(None)


def test_a_plugin_of_the_wrong_type_is_refused_with_a_reason(
    tmp_path: Path, standin: KubeletStandin
) -> None:
    plugin = serve(tmp_path, "CSIPlugin", ["v1.DRAPlugin"])
    try:
        standin.scan_registrations()
        ((registered, reason),) = plugin.reg.statuses
        assert registered is False and "CSIPlugin" in reason
        assert DRIVER not in standin.plugins
    finally:
        for server in plugin.servers:
            server.stop(None)


def test_restart_reregisters_and_removal_unregisters(
    tmp_path: Path, standin: KubeletStandin
) -> None:
    first = serve(tmp_path, "DRAPlugin", ["v1beta1.DRAPlugin"])
    standin.scan_registrations()
    standin.scan_registrations()  # nothing changed: no second GetInfo
    assert first.reg.info_calls == 1
    for server in first.servers:
        server.stop(None)
    first.reg_socket.unlink(missing_ok=True)  # grpc removes it on stop; a crash would not
    standin.scan_registrations()
    assert DRIVER not in standin.plugins

    second = serve(tmp_path, "DRAPlugin", ["v1beta1.DRAPlugin"])
    try:
        standin.scan_registrations()
        assert second.reg.info_calls == 1 and second.reg.statuses == [(True, "")]
        assert DRIVER in standin.plugins
    finally:
        for server in second.servers:
            server.stop(None)
