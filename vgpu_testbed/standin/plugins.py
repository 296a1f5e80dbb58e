"""The kubelet stand-in's gRPC side: plugin registration and the DRA node service calls.

`register()` does what the kubelet's plugin watcher does with a new registration socket
(GetInfo, validation, NotifyRegistrationStatus); the returned `Plugin` sends
NodePrepareResources / NodeUnprepareResources over the version chosen at registration, using
the generated stubs of `kubelet_plugin/proto/`. Used by `vgpu_testbed.standin.kubelet`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kubelet_plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from vgpu_testbed.standin.rules import JSON, ClaimRef, choose_version, validate_plugin_info

log = logging.getLogger("kubelet-standin")


@dataclass
class Plugin:
    """A registered DRA plugin: its endpoint, the chosen service version and a stub."""

    driver: str
    endpoint: str
    version: str
    channel: grpc.Channel
    stub: Any
    reg_inode: int

    def prepare(self, claims: Sequence[ClaimRef], timeout: float) -> dict[str, JSON]:
        pb = dra_v1_pb2 if self.version.startswith("v1.") else dra_v1beta1_pb2
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        response = self.stub.NodePrepareResources(request, timeout=timeout)
        results: dict[str, JSON] = {}
        for uid, result in response.claims.items():
            results[uid] = {
                "error": result.error,
                "devices": [
                    {
                        "requestNames": list(d.request_names),
                        "poolName": d.pool_name,
                        "deviceName": d.device_name,
                        "cdiDeviceIDs": list(d.cdi_device_ids),
                    }
                    for d in result.devices
                ],
            }
        return results

    def unprepare(self, claims: Sequence[ClaimRef], timeout: float) -> dict[str, str]:
        pb = dra_v1_pb2 if self.version.startswith("v1.") else dra_v1beta1_pb2
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        response = self.stub.NodeUnprepareResources(request, timeout=timeout)
        return {uid: result.error for uid, result in response.claims.items()}

    def close(self) -> None:
        self.channel.close()


def register(reg_socket: str, inode: int, timeout: float = 10.0) -> Plugin | None:
    """GetInfo + validation + NotifyRegistrationStatus; the Plugin when it was accepted."""
    with grpc.insecure_channel(f"unix://{reg_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=timeout)
        versions = list(info.supported_versions)
        problem = validate_plugin_info(info.type, info.name, info.endpoint, versions)
        if problem is None and not os.path.exists(info.endpoint):
            problem = f"endpoint {info.endpoint} does not exist"
        status = pluginregistration_v1_pb2.RegistrationStatus(
            plugin_registered=problem is None, error=problem or ""
        )
        stub.NotifyRegistrationStatus(status, timeout=timeout)
    if problem is not None:
        log.error("refused plugin at %s: %s", reg_socket, problem)
        return None
    version = choose_version(versions)
    assert version is not None  # validated above
    dra_channel = grpc.insecure_channel(f"unix://{info.endpoint}")
    grpc_module = dra_v1_pb2_grpc if version.startswith("v1.") else dra_v1beta1_pb2_grpc
    log.info("registered driver %s at %s using %s", info.name, info.endpoint, version)
    return Plugin(
        driver=info.name,
        endpoint=info.endpoint,
        version=version,
        channel=dra_channel,
        stub=grpc_module.DRAPluginStub(dra_channel),
        reg_inode=inode,
    )


def rpc_text(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'ERROR'}: {details}"
