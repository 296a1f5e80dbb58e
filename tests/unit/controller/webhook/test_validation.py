"""The validating webhook's checks: VgpuConfigs refused exactly as the kubelet plugin's prepare
would refuse them (same parser), contradictory pod annotations, memory above any GPU."""

from __future__ import annotations

from typing import Any

import pytest

from controller.webhook.validation import ClusterFacts, validate_object
from dra_driver import config
from tests.fixtures import legacy_pods

DRIVER = "vgpu.dra.dev"
FACTS = ClusterFacts(largest_gpu_memory_mib=81920, gpu_types=frozenset({"NVIDIA A100"}))
UNKNOWN = ClusterFacts(largest_gpu_memory_mib=None)


def _opaque(parameters: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": parameters}}


def _vgpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig", **fields}


def _claim(devices: dict[str, Any], kind: str = "ResourceClaim", name: str = "c") -> dict[str, Any]:
    spec = {"devices": devices}
    if kind == "ResourceClaimTemplate":
        spec = {"spec": spec}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def _request(**exactly: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": DRIVER, **exactly}}


def test_device_class_with_bad_compute_policy() -> None:
    cls = {
        "kind": "DeviceClass",
        "metadata": {"name": "gpus"},
        "spec": {"config": [_opaque(_vgpu(computePolicy="strict"))]},
    }
    assert validate_object(cls, FACTS) == [
        "DeviceClass gpus: spec.config[0].opaque.parameters: invalid VgpuConfig: field "
        "'computePolicy' has invalid value 'strict'; allowed: fixed|balance|none"
    ]


def test_claim_and_template_configs_use_the_prepare_parser() -> None:
    bad = _vgpu(computePolicy="fixed", memoryOversubscripton=True)
    for kind, path in (
        ("ResourceClaim", "spec.devices"),
        ("ResourceClaimTemplate", "spec.spec.devices"),
    ):
        obj = _claim({"requests": [_request()], "config": [_opaque(_vgpu()), _opaque(bad)]}, kind)
        # The exact text the kubelet plugin reports at prepare, with where it is in the object.
        with pytest.raises(config.ConfigError) as err:
            config.parse_config(bad)
        assert validate_object(obj, FACTS) == [
            f"{kind} c: {path}.config[1].opaque.parameters: {err.value}"
        ]
        assert "unknown field 'memoryOversubscripton' (known fields: apiVersion, kind, " in str(
            err.value
        )


def test_other_drivers_configs_are_not_ours_to_judge() -> None:
    obj = _claim({"requests": [_request()], "config": [_opaque({"x": 1}, driver="gpu.nvidia.com")]})
    assert validate_object(obj, FACTS) == []


def test_config_that_is_not_an_object() -> None:
    obj = _claim({"requests": [_request()], "config": [_opaque("computePolicy: fixed")]})
    assert validate_object(obj, FACTS) == [
        "ResourceClaim c: spec.devices.config[0].opaque.parameters: opaque config parameters must "
        "be an object with apiVersion 'vgpu.dra.dev/v1alpha1' and kind 'VgpuConfig', got str"
    ]


def test_valid_objects_pass() -> None:
    obj = _claim(
        {
            "requests": [_request(capacity={"requests": {"memory": "80Gi", "cores": "100"}})],
            "config": [_opaque(_vgpu(computePolicy="balance", memoryOversubscription=True))],
        },
        "ResourceClaimTemplate",
    )
    assert validate_object(obj, FACTS) == []
    assert validate_object({"kind": "ConfigMap", "data": {}}, FACTS) == []


def test_claim_memory_above_any_gpu_and_cores_above_100() -> None:
    obj = _claim(
        {
            "requests": [
                _request(capacity={"requests": {"memory": "81921Mi", "cores": "101"}}),
                {
                    "name": "alt",
                    "firstAvailable": [
                        {
                            "name": "big",
                            "deviceClassName": DRIVER,
                            "capacity": {"requests": {"vgpu.dra.dev/memory": "100Gi"}},
                        },
                        {
                            "name": "other",
                            "deviceClassName": "foreign",
                            "capacity": {"requests": {"memory": "1Ti"}},
                        },
                    ],
                },
            ]
        }
    )
    assert validate_object(obj, FACTS) == [
        "ResourceClaim c: spec.devices.requests[0].exactly.capacity.requests[memory]=81921Mi: more "
        "memory than any GPU in the cluster has (largest: 81920Mi)",
        "ResourceClaim c: spec.devices.requests[0].exactly.capacity.requests[cores]=101: cores "
        "are a percentage of one GPU, 0..100",
        "ResourceClaim c: spec.devices.requests[1].firstAvailable[0].capacity.requests"
        "[vgpu.dra.dev/memory]=100Gi: more memory than any GPU in the cluster has (largest: "
        "81920Mi)",
    ]
    # Without slices the memory check is skipped, the cores check is not.
    assert len(validate_object(obj, UNKNOWN)) == 1


def test_pod_annotation_contradictions() -> None:
    pod = legacy_pods.load("vgpu-manager-policies-pod")
    assert validate_object(pod, FACTS) == []
    pod["metadata"]["annotations"]["nvidia.com/use-gputype"] = "A100"
    assert validate_object(pod, FACTS) == [
        "Pod policies-pod: annotations nvidia.com/include-gpu-type='A10' and "
        "nvidia.com/use-gputype='A100' contradict each other: keep one of them"
    ]


def test_pod_include_and_exclude_the_same_uuid() -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "annotations": {
                "vgpu.dra.dev/gpu-uuid": "GPU-1,GPU-2",
                "vgpu.dra.dev/exclude-gpu-uuid": "gpu-2",
            },
        },
        "spec": {"containers": []},
    }
    assert validate_object(pod, FACTS) == [
        "Pod p: annotations vgpu.dra.dev/gpu-uuid='GPU-1,GPU-2' and "
        "vgpu.dra.dev/exclude-gpu-uuid='gpu-2' both include and exclude the GPU UUID gpu-2: "
        "remove it from one of them"
    ]


def test_pod_unknown_policy_name() -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "annotations": {"hami.io/gpu-scheduler-policy": "topology-aware"},
        },
        "spec": {"containers": []},
    }
    assert validate_object(pod, FACTS) == [
        "Pod p: annotation hami.io/gpu-scheduler-policy='topology-aware': allowed values are "
        "binpack, spread"
    ]


def test_pod_memory_above_any_gpu() -> None:
    pod = legacy_pods.load("vgpu-manager-gpu-pod")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/vgpu-memory"] = "82k"
    assert validate_object(pod, FACTS) == [
        "Pod gpu-pod: spec.containers[0].resources.limits[nvidia.com/vgpu-memory]=82k MiB: more "
        "memory than any GPU in the cluster has (largest: 81920 MiB)"
    ]
    assert validate_object(pod, UNKNOWN) == []


def _percent_claim(value: str, *requests: dict[str, Any], kind: str = "ResourceClaim") -> Any:
    claim = _claim({"requests": list(requests)}, kind=kind)
    annotations = {"vgpu.dra.dev/memory-percentage": value}
    if kind == "ResourceClaimTemplate":
        claim["spec"]["metadata"] = {"annotations": annotations}
    else:
        claim["metadata"]["annotations"] = annotations
    return claim


def test_memory_percentage_on_a_claim_with_a_request_naming_no_memory_passes() -> None:
    for kind in ("ResourceClaim", "ResourceClaimTemplate"):
        claim = _percent_claim(
            "50",
            _request(capacity={"requests": {"memory": "1Gi"}}),
            {"name": "b", "exactly": {"deviceClassName": DRIVER}},
            kind=kind,
        )
        assert validate_object(claim, FACTS) == []


@pytest.mark.parametrize(
    ("value", "requests", "message"),
    [
        (
            "0",
            [_request()],
            "ResourceClaim c: metadata.annotations[vgpu.dra.dev/memory-percentage]='0': an "
            "integer percentage of each GPU's memory, 1..100",
        ),
        (
            "50%",
            [_request()],
            "ResourceClaim c: metadata.annotations[vgpu.dra.dev/memory-percentage]='50%': an "
            "integer percentage of each GPU's memory, 1..100",
        ),
        (
            "50",
            [_request(capacity={"requests": {"memory": "1Gi"}})],
            "ResourceClaim c: metadata.annotations[vgpu.dra.dev/memory-percentage]='50': applies "
            "to the requests of DeviceClass vgpu.dra.dev that name no capacity memory, and this "
            "claim has none; drop the annotation, or drop the memory request (a percentage and "
            "an absolute amount cannot be used together)",
        ),
        (
            "50",
            [{"name": "gpu", "exactly": {"deviceClassName": "other.example.com"}}],
            "ResourceClaim c: metadata.annotations[vgpu.dra.dev/memory-percentage]='50': applies "
            "to the requests of DeviceClass vgpu.dra.dev that name no capacity memory, and this "
            "claim has none; drop the annotation, or drop the memory request (a percentage and "
            "an absolute amount cannot be used together)",
        ),
    ],
)
def test_memory_percentage_on_a_claim_it_cannot_apply_to(
    value: str, requests: list[dict[str, Any]], message: str
) -> None:
    assert validate_object(_percent_claim(value, *requests), FACTS) == [message]


def test_memory_percentage_on_the_template_itself_is_misplaced() -> None:
    template = _claim({"requests": [_request()]}, kind="ResourceClaimTemplate", name="t")
    template["metadata"]["annotations"] = {"vgpu.dra.dev/memory-percentage": "50"}
    assert validate_object(template, FACTS) == [
        "ResourceClaimTemplate t: metadata.annotations[vgpu.dra.dev/memory-percentage]: the "
        "template's own annotations do not reach its claims; put it under "
        "spec.metadata.annotations"
    ]
