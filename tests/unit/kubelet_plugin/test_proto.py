"""The committed gRPC stubs match the .proto files, and the wire names match the kubelet's.

The kubelet finds methods by full name (`/<package>.<Service>/<Method>`) and decodes fields by
number, so both are pinned here against the published k8s.io/kubelet v0.37.1 APIs. The Go
conformance client (tests/integration/kubelet_plugin/) proves the same against the real generated
code.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FileDescriptor

from kubelet_plugin.proto import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "kubelet_plugin" / "proto"


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        ["bash", str(ROOT / "hack" / "gen-protos.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    generated = sorted(p.name for p in (tmp_path / "kubelet_plugin" / "proto").iterdir())
    committed = sorted(
        p.name for p in PROTO_DIR.iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi", "_grpc.py"))
    )
    assert generated == committed
    _, mismatch, errors = filecmp.cmpfiles(
        tmp_path / "kubelet_plugin" / "proto", PROTO_DIR, generated, shallow=False
    )
    assert mismatch == [] and errors == [], "run hack/gen-protos.sh and commit the result"


def full_methods(descriptor: FileDescriptor) -> list[str]:
    return [
        f"/{service.full_name}/{method.name}"
        for service in descriptor.services_by_name.values()
        for method in service.methods
    ]


def test_full_method_names_match_the_kubelet() -> None:
    assert full_methods(pluginregistration_v1_pb2.DESCRIPTOR) == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]
    for module, version in ((dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")):
        assert full_methods(module.DESCRIPTOR) == [
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources",
        ]
    assert full_methods(dra_health_v1_pb2.DESCRIPTOR) == [
        "/v1.DRAResourceHealth/NodeWatchResources"
    ]
    assert full_methods(dra_health_v1alpha1_pb2.DESCRIPTOR) == [
        "/v1alpha1.DRAResourceHealth/NodeWatchResources"
    ]


def numbers(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_field_numbers_match_the_kubelet() -> None:
    reg = pluginregistration_v1_pb2
    assert numbers(reg.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert numbers(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    for module in (dra_v1_pb2, dra_v1beta1_pb2):
        assert numbers(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert numbers(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert numbers(module.NodeUnprepareResourceResponse) == {"error": 1}
        assert numbers(module.NodePrepareResourcesRequest) == {"claims": 1}
        assert numbers(module.NodePrepareResourcesResponse) == {"claims": 1}
    base = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert numbers(dra_v1beta1_pb2.Device) == base
    assert numbers(dra_v1_pb2.Device) == {**base, "share_id": 5}
    for module in (dra_health_v1_pb2, dra_health_v1alpha1_pb2):
        assert numbers(module.DeviceHealth) == {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        }
        assert numbers(module.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
        assert module.HealthStatus.Value("UNHEALTHY") == 2


def test_v1_and_v1beta1_share_the_wire_shape() -> None:
    """A v1beta1 response decodes as v1 (what a kubelet on either version relies on)."""
    old = dra_v1beta1_pb2.NodePrepareResourcesResponse()
    old.claims["uid-1"].devices.add(
        request_names=["gpu"], pool_name="node-1", device_name="gpu-0", cdi_device_ids=["a/b=c"]
    )
    new = dra_v1_pb2.NodePrepareResourcesResponse.FromString(old.SerializeToString())
    assert list(new.claims["uid-1"].devices[0].cdi_device_ids) == ["a/b=c"]
