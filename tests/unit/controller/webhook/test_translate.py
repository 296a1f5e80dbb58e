"""The mutating webhook's translation: each system's README pods become the exact DRA pods and
templates documented in docs/migration.md; bad combinations are refused with precise messages."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from controller.reconciler import ALIASES, GATE, Defaults
from controller.webhook import legacy
from controller.webhook.translate import (
    Refusal,
    TranslationSettings,
    match_conditions,
    needs_translation,
    read_pod_policy,
    template_name,
    translate_pod,
)
from dra_driver.allocator.cel import compile_selector, device_view
from dra_driver.allocator.request import ANNOTATION_PREFIX, Policy
from tests.fixtures import legacy_pods

DRIVER = "vgpu.dra.dev"
SETTINGS = TranslationSettings(
    driver=DRIVER, device_class=DRIVER, shared_resources={"nvidia.com/gpu.shared": 4}
)
MANAGED = {"app.kubernetes.io/managed-by": "vgpu-dra-webhook"}
ATTRS = f'device.attributes["{DRIVER}"]'
# A device plugin whole GPU: never a MIG device (docs/mig.md: whole GPUs have no profile).
WHOLE_GPU = [{"cel": {"expression": f"!has({ATTRS}.profile)"}}]


def _apply(pod: dict[str, Any], settings: TranslationSettings = SETTINGS) -> tuple[Any, Any]:
    translation = translate_pod(pod, settings)
    assert translation is not None
    return jsonpatch.apply_patch(pod, translation.patch), translation


def _request(count: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": "gpu",
        "exactly": {
            "deviceClassName": DRIVER,
            "allocationMode": "ExactCount",
            "count": count,
            **extra,
        },
    }


def _config(policy: str) -> list[dict[str, Any]]:
    return [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "vgpu.dra.dev/v1alpha1",
                    "kind": "VgpuConfig",
                    "computePolicy": policy,
                },
            },
        }
    ]


def _template(devices: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"devices": devices}}


# ----------------------------------------------------------------------------- README examples


def test_vgpu_manager_readme_pod_one_gpu_10_cores_1gib() -> None:
    pod = legacy_pods.load("vgpu-manager-gpu-pod")
    out, translation = _apply(pod)
    spec = _template(
        {"requests": [_request(1, capacity={"requests": {"memory": "1024Mi", "cores": "10"}})]}
    )
    name = template_name(spec)
    assert [(t.name, t.spec, dict(t.labels)) for t in translation.templates] == [
        (name, spec, MANAGED)
    ]
    assert name.startswith("vgpu-")
    assert translation.source == "vgpu-manager"
    assert out == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gpu-pod",
            "namespace": "default",
            "annotations": {"vgpu.dra.dev/translated-from": "vgpu-manager"},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "default",
                    "image": "nvidia/cuda:12.4.1-devel-ubuntu20.04",
                    "command": ["sleep", "9999999"],
                    "resources": {
                        "limits": {"cpu": "2", "memory": "4Gi"},
                        "claims": [{"name": "vgpu-default"}],
                    },
                }
            ],
            "resourceClaims": [{"name": "vgpu-default", "resourceClaimTemplateName": name}],
            "schedulingGates": [{"name": GATE}],
        },
    }
    assert translation.warnings == [
        "container default: nvidia.com/vgpu-number=1 -> claim of 1 GPU(s)",
        "container default: nvidia.com/vgpu-cores=10 -> claim cores 10 per GPU",
        "container default: nvidia.com/vgpu-memory=1024 -> claim memory 1024Mi per GPU",
        "schedulerName vgpu-scheduler -> default-scheduler, placed by the vgpu-dra allocation "
        "controller (policy path)",
        "scheduling gate vgpu.dra.dev/policy added: the allocation controller places this pod",
    ]


def test_vgpu_manager_numa_topology_is_best_effort_on_the_policy_path() -> None:
    out, translation = _apply(legacy_pods.load("vgpu-manager-numa-pod"))
    spec = _template({"requests": [_request(2, capacity={"requests": {"memory": "10000Mi"}})]})
    assert [t.spec for t in translation.templates] == [spec]
    assert out["metadata"]["annotations"] == {
        "nvidia.com/device-topology-mode": "numa",
        "vgpu.dra.dev/device-topology-mode": "numa",
        "vgpu.dra.dev/translated-from": "vgpu-manager",
    }
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    # The controller reads what the webhook wrote.
    assert Defaults({}).policy_for(out).topology == "numa"


def test_vgpu_manager_policies_become_cel_annotations_and_vgpuconfig() -> None:
    out, translation = _apply(legacy_pods.load("vgpu-manager-policies-pod"))
    attrs = 'device.attributes["vgpu.dra.dev"]'
    spec = _template(
        {
            "requests": [
                _request(
                    1,
                    selectors=[
                        {"cel": {"expression": f'{attrs}.productName.matches("(?i)(A10)")'}},
                        {"cel": {"expression": f'!{attrs}.productName.matches("(?i)(A100)")'}},
                    ],
                    capacity={"requests": {"memory": "2048Mi", "cores": "20"}},
                )
            ],
            "config": _config("balance"),
        }
    )
    assert [t.spec for t in translation.templates] == [spec]
    annotations = out["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("vgpu.dra.dev/")} == {
        "vgpu.dra.dev/node-scheduler-policy": "spread",
        "vgpu.dra.dev/device-scheduler-policy": "binpack",
        "vgpu.dra.dev/include-gpu-type": "A10",
        "vgpu.dra.dev/exclude-gpu-type": "A100",
        "vgpu.dra.dev/translated-from": "vgpu-manager",
    }
    assert Defaults({}).policy_for(out) == Policy(
        node="spread", device="binpack", include_types=("a10",), exclude_types=("a100",)
    )
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]


def test_hami_readme_pod_memory_only() -> None:
    out, translation = _apply(legacy_pods.load("hami-gpu-pod"))
    spec = _template({"requests": [_request(1, capacity={"requests": {"memory": "3000Mi"}})]})
    assert [t.spec for t in translation.templates] == [spec]
    assert translation.source == "hami"
    assert out["spec"] == {
        "containers": [
            {
                "name": "ubuntu-container",
                "image": "ubuntu:18.04",
                "command": ["bash", "-c", "sleep 86400"],
                "resources": {"claims": [{"name": "vgpu-ubuntu-container"}]},
            }
        ],
        "resourceClaims": [
            {"name": "vgpu-ubuntu-container", "resourceClaimTemplateName": template_name(spec)}
        ],
    }
    # The API server hands the webhook 3000 as "3k": that is what the fixture loader produces.
    assert legacy_pods.load("hami-gpu-pod")["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "3k",
    }


def test_hami_readme_pod_cores_types_and_policies() -> None:
    out, translation = _apply(legacy_pods.load("hami-gpucores-pod"))
    attrs = 'device.attributes["vgpu.dra.dev"]'
    spec = _template(
        {
            "requests": [
                _request(
                    2,
                    selectors=[
                        {"cel": {"expression": f'{attrs}.productName.matches("(?i)(A100|V100)")'}},
                        {"cel": {"expression": f'!{attrs}.productName.matches("(?i)(1080|2080)")'}},
                    ],
                    capacity={"requests": {"memory": "3000Mi", "cores": "30"}},
                )
            ]
        }
    )
    assert [t.spec for t in translation.templates] == [spec]
    assert Defaults({}).policy_for(out) == Policy(
        node="binpack",
        device="spread",
        include_types=("a100", "v100"),
        exclude_types=("1080", "2080"),
    )
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]


def test_hami_memory_percentage_becomes_a_claim_annotation_and_the_policy_gate() -> None:
    pod = legacy_pods.load("hami-gpumem-percentage-pod")
    out, translation = _apply(pod)
    spec = {
        "metadata": {"annotations": {"vgpu.dra.dev/memory-percentage": "50"}},
        **_template({"requests": [_request(2)]}),
    }
    assert [t.spec for t in translation.templates] == [spec]
    assert translation.templates[0].name == template_name(spec)
    # Only the allocation controller knows the chosen GPU's size: the pod waits for it.
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    assert out["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "vgpu-ubuntu-container"}]
    }
    assert (
        "container ubuntu-container: nvidia.com/gpumem-percentage=50 -> claim annotation "
        "vgpu.dra.dev/memory-percentage=50: 50 % of the memory of each GPU the allocation "
        "controller chooses"
    ) in translation.warnings


def test_memory_percentages_make_templates_of_their_own() -> None:
    pod = legacy_pods.load("hami-gpumem-percentage-pod")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    names_by_percent = {}
    for percent in ("25", "50", "100"):
        limits["nvidia.com/gpumem-percentage"] = percent
        translation = translate_pod(pod, SETTINGS)
        assert translation is not None
        names_by_percent[percent] = translation.templates[0].name
    assert len(set(names_by_percent.values())) == 3


def test_hami_memory_percentage_0_is_refused() -> None:
    pod = legacy_pods.load("hami-gpumem-percentage-pod")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "0"
    with pytest.raises(Refusal) as err:
        translate_pod(pod, SETTINGS)
    assert str(err.value) == (
        "container ubuntu-container: nvidia.com/gpumem-percentage=0: a percentage of each GPU's "
        "memory, 1..100"
    )


def test_pod_memory_percentage_applies_to_translated_containers_without_memory() -> None:
    pod = _pod({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "20"},
               annotations={"vgpu.dra.dev/memory-percentage": "30"})  # fmt: skip
    out, translation = _apply(pod)
    assert [t.spec for t in translation.templates] == [
        {
            "metadata": {"annotations": {"vgpu.dra.dev/memory-percentage": "30"}},
            **_template({"requests": [_request(1, capacity={"requests": {"cores": "20"}})]}),
        }
    ]
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    # A claim concept: it is not copied onto the pod for the controller.
    assert "vgpu.dra.dev/memory-percentage" not in {
        p["path"].rsplit("/", 1)[-1].replace("~1", "/") for p in translation.patch
    }


def test_hami_memory_percentage_100_is_the_whole_memory() -> None:
    pod = legacy_pods.load("hami-gpumem-percentage-pod")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "100"
    _, translation = _apply(pod)
    assert [t.spec for t in translation.templates] == [_template({"requests": [_request(2)]})]


def test_gpu_manager_share_with_hard_limit() -> None:
    out, translation = _apply(legacy_pods.load("gpu-manager-vcuda-pod"))
    spec = _template(
        {
            "requests": [_request(1, capacity={"requests": {"memory": "2048Mi", "cores": "50"}})],
            "config": _config("fixed"),
        }
    )
    assert [t.spec for t in translation.templates] == [spec]
    assert out["spec"]["containers"][0]["resources"] == {"claims": [{"name": "vgpu-nvidia"}]}
    assert "schedulingGates" not in out["spec"]
    assert out["metadata"]["annotations"] == {
        "nvidia.com/vcuda-core-limit": "50",
        "vgpu.dra.dev/translated-from": "gpu-manager",
    }


def test_gpu_manager_share_without_limit_is_a_soft_cap() -> None:
    pod = legacy_pods.load("gpu-manager-vcuda-pod")
    del pod["metadata"]["annotations"]
    _, translation = _apply(pod)
    assert translation.templates[0].spec["spec"]["devices"]["config"] == _config("balance")


def test_gpu_manager_whole_gpus() -> None:
    out, translation = _apply(legacy_pods.load("gpu-manager-two-gpus-pod"))
    assert [t.spec for t in translation.templates] == [_template({"requests": [_request(2)]})]
    assert out["spec"]["containers"][0]["resources"] == {"claims": [{"name": "vgpu-nvidia"}]}


def test_device_plugin_whole_gpu() -> None:
    out, translation = _apply(legacy_pods.load("device-plugin-gpu-pod"))
    spec = _template({"requests": [_request(1, selectors=WHOLE_GPU)]})
    assert [t.spec for t in translation.templates] == [spec]
    assert translation.source == "device-plugin"
    assert out["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "vgpu-cuda-container"}]
    }
    assert (
        out["spec"]["tolerations"]
        == legacy_pods.load("device-plugin-gpu-pod")["spec"]["tolerations"]
    )


def test_device_plugin_shared_resource_is_a_share_of_cores() -> None:
    _, translation = _apply(legacy_pods.load("device-plugin-shared-pod"))
    assert [t.spec for t in translation.templates] == [
        _template({"requests": [_request(1, capacity={"requests": {"cores": "25"}})]})
    ]
    assert translation.warnings[-1] == (
        "container cuda-container: nvidia.com/gpu.shared -> no memory per share configured for "
        "this shared resource: the share reserves the GPU's whole memory, so one such pod runs "
        "per GPU"
    )
    with_memory = TranslationSettings(
        driver=DRIVER,
        device_class=DRIVER,
        shared_resources={"nvidia.com/gpu.shared": 4},
        shared_memory_mib={"nvidia.com/gpu.shared": 4096},
    )
    _, translation = _apply(legacy_pods.load("device-plugin-shared-pod"), with_memory)
    assert [t.spec for t in translation.templates] == [
        _template(
            {"requests": [_request(1, capacity={"requests": {"memory": "4096Mi", "cores": "25"}})]}
        )
    ]


# ----------------------------------------------------------------------------- rules


def _pod(
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    container: dict[str, Any] = {"name": "main", "image": "x"}
    if limits is not None:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {**spec, "containers": [container]},
    }


def test_strict_topology_is_a_match_attribute_constraint_without_gate() -> None:
    pod = _pod(
        {"nvidia.com/vgpu-number": "4"},
        annotations={"nvidia.com/device-topology-mode": "link-strict"},
    )
    out, translation = _apply(pod)
    assert translation.templates[0].spec["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": "vgpu.dra.dev/nvlinkDomain"}
    ]
    assert "schedulingGates" not in out["spec"]
    numa = _pod(
        {"nvidia.com/vgpu-number": "2"},
        annotations={"vgpu.dra.dev/topology": "numa-strict"},
    )
    _, translation = _apply(numa)
    assert translation.templates[0].spec["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": "vgpu.dra.dev/numaNode"}
    ]


def test_uuid_selectors_and_native_claims_get_the_gate() -> None:
    pod = _pod(
        None,
        annotations={"nvidia.com/exclude-gpu-uuid": "GPU-aa,GPU-bb"},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "mine"}],
    )
    out, translation = _apply(pod)
    assert translation.templates == []
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    assert out["metadata"]["annotations"]["vgpu.dra.dev/exclude-gpu-uuid"] == "GPU-aa,GPU-bb"
    assert Defaults({}).policy_for(out).exclude_uuids == ("gpu-aa", "gpu-bb")

    translated = _pod({"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gpuuuid": "GPU-aa"})
    out, translation = _apply(translated)
    selectors = translation.templates[0].spec["spec"]["devices"]["requests"][0]["exactly"][
        "selectors"
    ]
    assert selectors == [
        {"cel": {"expression": 'device.attributes["vgpu.dra.dev"].uuid.matches("(?i)^(GPU-aa)$")'}}
    ]
    assert "schedulingGates" not in out["spec"]  # the template's CEL does it on either path


def test_cel_selectors_select_the_devices_the_policy_path_would() -> None:
    """The CEL the webhook writes (default path) and the allocator's policy filter agree."""
    pod = _pod(
        {"nvidia.com/gpu": "1"},
        annotations={
            "nvidia.com/use-gputype": "a10,H100 SXM",
            "nvidia.com/nouse-gputype": "A100",
            "nvidia.com/nouse-gpuuuid": "GPU-0002",
        },
    )
    _, translation = _apply(pod)
    exprs = [
        s["cel"]["expression"]
        for s in translation.templates[0].spec["spec"]["devices"]["requests"][0]["exactly"][
            "selectors"
        ]
    ]
    selectors = [compile_selector(e) for e in exprs]
    policy = Policy(
        include_types=("a10", "h100 sxm"), exclude_types=("a100",), exclude_uuids=("gpu-0002",)
    )
    products = ["NVIDIA A10", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 SXM", "NVIDIA H100 PCIe"]
    for product in products:
        for uuid in ("GPU-0001", "GPU-0002"):
            view = device_view(
                DRIVER,
                {"productName": {"string": product}, "uuid": {"string": uuid}},
                {},
                True,
            )
            assert all(s.matches(view) for s in selectors) == policy.admits(product, uuid), (
                product,
                uuid,
            )


def test_every_annotation_written_is_read_by_the_controller() -> None:
    read = set(ALIASES) | {
        ANNOTATION_PREFIX + n
        for n in ("node-policy", "device-policy", "topology", "gpu-type", "gpu-uuid")
    }
    read |= {
        ANNOTATION_PREFIX + "exclude-gpu-type",
        ANNOTATION_PREFIX + "exclude-gpu-uuid",
    }
    for concept in legacy.CONTROLLER_CONCEPTS:
        assert legacy.CANONICAL[concept] in read, concept


def test_init_containers_and_several_containers_get_their_own_claims() -> None:
    pod = _pod({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "512"})
    pod["spec"]["containers"].append(
        {
            "name": "side",
            "image": "x",
            "resources": {
                "limits": {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "512"}
            },
        }
    )
    pod["spec"]["initContainers"] = [
        {"name": "init", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    pod["spec"]["resourceClaims"] = [{"name": "other", "resourceClaimName": "x"}]
    out, translation = _apply(pod)
    shared = template_name(
        _template({"requests": [_request(1, capacity={"requests": {"memory": "512Mi"}})]})
    )
    whole = template_name(_template({"requests": [_request(1, selectors=WHOLE_GPU)]}))
    # Same shape, one template.
    assert sorted(t.name for t in translation.templates) == sorted([shared, whole])
    assert out["spec"]["resourceClaims"] == [
        {"name": "other", "resourceClaimName": "x"},
        {"name": "vgpu-init", "resourceClaimTemplateName": whole},
        {"name": "vgpu-main", "resourceClaimTemplateName": shared},
        {"name": "vgpu-side", "resourceClaimTemplateName": shared},
    ]
    assert out["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "vgpu-init"}]}
    assert out["spec"]["containers"][1]["resources"] == {"claims": [{"name": "vgpu-side"}]}


def test_requests_are_removed_too_and_must_equal_limits() -> None:
    pod = _pod({"nvidia.com/vgpu-number": "1"})
    pod["spec"]["containers"][0]["resources"]["requests"] = {
        "nvidia.com/vgpu-number": "1",
        "cpu": "1",
    }
    out, _ = _apply(pod)
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "1"},
        "claims": [{"name": "vgpu-main"}],
    }
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/vgpu-number"] = "2"
    with pytest.raises(Refusal, match=r"resources.limits\[nvidia.com/vgpu-number\]='1' and "):
        translate_pod(pod, SETTINGS)


@pytest.mark.parametrize(
    ("limits", "annotations", "message"),
    [
        (
            {"nvidia.com/vgpu-cores": "101"},
            {},
            "container main: nvidia.com/vgpu-cores=101: a percentage of one GPU, 0..100",
        ),
        (
            {"nvidia.com/vgpu-memory": "1.5"},
            {},
            "container main: resources.limits[nvidia.com/vgpu-memory]='1.5': use a whole "
            "number >= 0",
        ),
        (
            {"nvidia.com/vgpu-memory": "lots"},
            {},
            "container main: resources.limits[nvidia.com/vgpu-memory]='lots' is not a quantity; "
            "use a whole number",
        ),
        (
            {"nvidia.com/vgpu-number": "0", "nvidia.com/vgpu-memory": "1024"},
            {},
            "container main: 0 GPUs requested together with memory or cores "
            "(nvidia.com/vgpu-memory, nvidia.com/vgpu-number): ask for at least 1 GPU or drop "
            "the others",
        ),
        (
            {"nvidia.com/vcuda-core": "150"},
            {},
            "container main: nvidia.com/vcuda-core=150: use a multiple of 100 (whole GPUs) or a "
            "value below 100 (a share of one GPU)",
        ),
        (
            {"nvidia.com/vgpu-number": "1", "nvidia.com/vcuda-core": "50"},
            {},
            "container main: resources nvidia.com/vcuda-core, nvidia.com/vgpu-number mix "
            "GPU-sharing systems (gpu-manager, vgpu-manager); use the names of one system per "
            "container",
        ),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/gpumem-percentage": "5"},
            {},
            "container main: nvidia.com/gpumem and nvidia.com/gpumem-percentage cannot be used "
            "together (as in HAMi): keep one",
        ),
        (
            {"nvidia.com/vgpu-number": "1"},
            {"nvidia.com/include-gpu-type": "A100", "nvidia.com/exclude-gpu-type": "a100,T4"},
            "annotations nvidia.com/include-gpu-type='A100' and nvidia.com/exclude-gpu-type="
            "'a100,T4' both include and exclude the GPU type a100: remove it from one of them",
        ),
        (
            {"nvidia.com/vgpu-number": "1"},
            {"nvidia.com/node-scheduler-policy": "pack"},
            "annotation nvidia.com/node-scheduler-policy='pack': allowed values are binpack, "
            "spread",
        ),
        (
            {"nvidia.com/vgpu-number": "1"},
            {"nvidia.com/device-topology-mode": "ring"},
            "annotation nvidia.com/device-topology-mode='ring': allowed values are none, numa, "
            "link, numa-strict, link-strict",
        ),
        (
            {"nvidia.com/vgpu-number": "1"},
            {"nvidia.com/vgpu-compute-policy": "strict"},
            "annotation nvidia.com/vgpu-compute-policy='strict': allowed values are fixed, "
            "balance, none",
        ),
        (
            {"nvidia.com/gpu": "1"},
            {
                "hami.io/node-scheduler-policy": "spread",
                "nvidia.com/node-scheduler-policy": "binpack",
            },
            "annotations hami.io/node-scheduler-policy='spread' and "
            "nvidia.com/node-scheduler-policy='binpack' contradict each other: keep one of them",
        ),
        (
            {"nvidia.com/vcuda-core": "30"},
            {"nvidia.com/vcuda-core-limit": "60"},
            "container main: nvidia.com/vcuda-core-limit=60 differs from nvidia.com/vcuda-core=30: "
            "the cap is the reserved share here; set the limit equal to vcuda-core (hard cap) or "
            "leave it out (soft cap)",
        ),
        (
            {"nvidia.com/vcuda-core": "30"},
            {"nvidia.com/vcuda-core-limit": "30", "nvidia.com/vgpu-compute-policy": "none"},
            "annotation compute policy 'none' contradicts nvidia.com/vcuda-core-limit (which means "
            "'fixed'): keep one of them",
        ),
        (
            {"nvidia.com/gpu.shared": "5"},
            {},
            "container main: nvidia.com/gpu.shared=5: at most 4 shares (the replicas of one GPU)",
        ),
        (
            {"nvidia.com/vgpu-number": "33"},
            {},
            "container main: nvidia.com/vgpu-number=33: at most 32 GPUs per container (the API's "
            "limit on the devices of one claim, resource.k8s.io/v1 AllocationResultsMaxSize)",
        ),
        (
            {"nvidia.com/vgpu-number": "1"},
            {"nvidia.com/include-gpu-type": 'A100") || true || ("'},
            "annotation nvidia.com/include-gpu-type='A100\") || true || (\"': a comma list of GPU "
            "product names (letters, digits, space, '.', '_', '-'), e.g. 'A100,H100'",
        ),
        (
            {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1024"},
            {"vgpu.dra.dev/memory-percentage": "50"},
            "container main: GPU memory 1024 MiB and annotation vgpu.dra.dev/memory-percentage=50 "
            "cannot be used together: keep one",
        ),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "40"},
            {"vgpu.dra.dev/memory-percentage": "50"},
            "container main: nvidia.com/gpumem-percentage=40 and annotation "
            "vgpu.dra.dev/memory-percentage=50 contradict each other: keep one",
        ),
        (
            {"cpu": "1"},
            {"vgpu.dra.dev/memory-percentage": "50"},
            "annotation vgpu.dra.dev/memory-percentage=50: on a pod it applies to the claims the "
            "webhook writes for legacy GPU resources, and this pod has none; annotate the pod's "
            "own ResourceClaims or ResourceClaimTemplates with it instead (their pod needs the "
            "scheduling gate vgpu.dra.dev/policy: only the allocation controller honours it)",
        ),
    ],
)
def test_refusals_name_field_value_and_allowed(
    limits: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(Refusal) as err:
        translate_pod(_pod(limits, annotations=annotations), SETTINGS)
    assert str(err.value) == message


def test_zero_gpus_alone_is_removed_without_a_claim() -> None:
    out, translation = _apply(_pod({"nvidia.com/vgpu-number": "0", "cpu": "1"}))
    assert translation.templates == []
    assert out["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}}
    assert "resourceClaims" not in out["spec"]


def test_pods_without_legacy_names_are_untouched() -> None:
    pod = _pod({"cpu": "1", "example.com/foo": "1"}, annotations={"a": "b"})
    assert not needs_translation(pod, SETTINGS)
    assert translate_pod(pod, SETTINGS) is None


def test_our_own_annotations_on_a_native_pod_add_only_the_gate() -> None:
    pod = _pod(None, annotations={"vgpu.dra.dev/node-policy": "spread"})
    out, translation = _apply(pod)
    assert translation.patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    ]
    assert translation.source == "vgpu-dra"
    assert out["metadata"]["annotations"] == {"vgpu.dra.dev/node-policy": "spread"}
    gated = _pod(None, annotations={"vgpu.dra.dev/node-policy": "spread"})
    gated["spec"]["schedulingGates"] = [{"name": "other"}, {"name": GATE}]
    assert translate_pod(gated, SETTINGS) is None


def test_existing_gates_are_kept() -> None:
    pod = _pod({"nvidia.com/vgpu-number": "1"}, schedulerName="vgpu-scheduler")
    pod["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    out, _ = _apply(pod)
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/wait"}, {"name": GATE}]


@pytest.mark.parametrize("name", legacy_pods.names())
def test_readme_pods_translate_once(name: str) -> None:
    pod = legacy_pods.load(name)
    assert needs_translation(pod, SETTINGS)
    try:
        out, _ = _apply(copy.deepcopy(pod))
    except Refusal:
        assert name == "hami-gpumem-percentage-pod"
        return
    assert translate_pod(out, SETTINGS) is None


def test_match_conditions_are_one_named_expression() -> None:
    conditions = match_conditions(SETTINGS)
    assert [c["name"] for c in conditions] == ["vgpu-dra-legacy-gpu-pods"]
    assert '"nvidia.com/gpu.shared"' in conditions[0]["expression"]


def test_read_pod_policy_accepts_equal_values_under_different_names() -> None:
    policy = read_pod_policy(
        _pod(
            None,
            annotations={
                "nvidia.com/include-gpu-type": "A100, H100",
                "nvidia.com/use-gputype": "h100,a100",
            },
        )
    )
    assert policy.items("include_types") == ("A100", "H100")
    assert policy.systems == {"vgpu-manager", "hami"}


def test_null_or_empty_lists_and_maps_are_replaced_not_appended_to() -> None:
    pod = _pod({"nvidia.com/gpu": "1"}, annotations={}, schedulerName="vgpu-scheduler")
    pod["spec"]["resourceClaims"] = None
    pod["spec"]["schedulingGates"] = []
    out, _ = _apply(pod)
    assert out["spec"]["resourceClaims"] == [
        {
            "name": "vgpu-main",
            "resourceClaimTemplateName": out["spec"]["resourceClaims"][0][
                "resourceClaimTemplateName"
            ],
        }
    ]
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    assert out["metadata"]["annotations"] == {"vgpu.dra.dev/translated-from": "device-plugin"}


def test_long_container_names_give_valid_unique_claim_names() -> None:
    pod = _pod({"nvidia.com/gpu": "1"})
    pod["spec"]["containers"][0]["name"] = "c" * 63
    pod["spec"]["resourceClaims"] = [{"name": "vgpu-x", "resourceClaimName": "x"}]
    pod["spec"]["containers"].append(
        {"name": "x", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    )
    out, _ = _apply(pod)
    names = [c["name"] for c in out["spec"]["resourceClaims"]]
    assert len(set(names)) == 3
    assert all(len(n) <= 63 and n.replace("-", "").isalnum() for n in names)
    assert out["spec"]["containers"][1]["resources"]["claims"] == [{"name": names[2]}]


def test_compute_policy_without_translated_claims_is_a_warning() -> None:
    pod = _pod(
        None,
        annotations={"vgpu.dra.dev/compute-policy": "balance"},
        resourceClaims=[{"name": "gpu", "resourceClaimName": "mine"}],
    )
    translation = translate_pod(pod, SETTINGS)
    assert translation is not None
    assert translation.patch == []
    assert translation.warnings == [
        "the pod's compute policy annotation applies to the claims the webhook writes for legacy "
        "GPU resources, and this pod has none: set computePolicy in the VgpuConfig of its own "
        "claims (or of the DeviceClass) instead"
    ]
    # With a translated container it lands in that claim's VgpuConfig, no warning about it.
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/vgpu-number": "1"}}
    out, translation = _apply(pod)
    assert translation.templates[0].spec["spec"]["devices"]["config"] == _config("balance")
    assert not any("compute policy" in w for w in translation.warnings)
    assert translate_pod(out, SETTINGS) is None


def test_hami_companion_without_gpu_count_is_one_gpu() -> None:
    _, translation = _apply(_pod({"nvidia.com/gpucores": "20"}))
    assert [t.spec for t in translation.templates] == [
        _template({"requests": [_request(1, capacity={"requests": {"cores": "20"}})]})
    ]
    assert translation.warnings[:2] == [
        "container main: no nvidia.com/gpu -> claim of 1 GPU",
        "container main: nvidia.com/gpucores=20 -> claim cores 20 per GPU",
    ]


@pytest.mark.parametrize("value", ["²", "٣", "-0", "1000", "50%"])
def test_percentage_annotations_are_ascii_integers_0_to_100(value: str) -> None:
    pod = _pod({"nvidia.com/vcuda-core": "10"}, annotations={"nvidia.com/vcuda-core-limit": value})
    with pytest.raises(Refusal, match=r"an integer percentage 0\.\.100"):
        translate_pod(pod, SETTINGS)


def test_long_values_are_shortened_in_refusals() -> None:
    pod = _pod(
        {"nvidia.com/vgpu-number": "1"},
        annotations={"nvidia.com/node-scheduler-policy": "x" * 100_000},
    )
    with pytest.raises(Refusal) as err:
        translate_pod(pod, SETTINGS)
    assert len(str(err.value)) < 200
