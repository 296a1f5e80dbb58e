"""MIG pods of the systems we replace (issue 26, item 4; docs/migration.md): the device plugin's
mixed strategy (`nvidia.com/mig-<profile>`), its single strategy (`nvidia.com/gpu` on nodes GPU
feature discovery labels), time-sliced MIG resources, and HAMi's dynamic MIG become claims whose
CEL selects exactly the devices the kubelet plugin publishes for them (docs/mig.md, "Published
devices"); what cannot be mapped is refused naming the form."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from cel_expr_python import cel

from controller.webhook import legacy
from controller.webhook.translate import (
    Refusal,
    TranslationSettings,
    match_conditions,
    needs_translation,
    translate_pod,
)
from dra_driver.allocator.cel import compile_selector, device_view

DRIVER = "vgpu.dra.dev"
SETTINGS = TranslationSettings(
    driver=DRIVER,
    device_class=DRIVER,
    shared_resources={"nvidia.com/gpu.shared": 4, "nvidia.com/mig-3g.40gb": 2},
)
A = f'device.attributes["{DRIVER}"]'
GIB = 1 << 30

# Devices as the kubelet plugin publishes them on a dynamic MIG GPU and a plain one.
WHOLE_MIG_GPU = {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "uuid": {"string": "GPU-0"}}
WHOLE_PLAIN_GPU = {"productName": {"string": "NVIDIA A10"}, "uuid": {"string": "GPU-1"}}


def _mig(profile: str, memory_mib: int, parent: str = "GPU-0") -> dict[str, Any]:
    return {
        "type": {"string": "mig"},
        "profile": {"string": profile},
        "parentUUID": {"string": parent},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "memoryBytes": {"int": memory_mib << 20},
    }


DEVICES = {
    "gpu-0": WHOLE_MIG_GPU,
    "gpu-1": WHOLE_PLAIN_GPU,
    "gpu-0-mig-1g10gb-6": _mig("1g.10gb", 9984),
    "gpu-0-mig-1g10gbme-0": _mig("1g.10gb+me", 9984),
    "gpu-0-mig-3g40gb-4": _mig("3g.40gb", 40448),
    "gpu-0-mig-7g80gb-0": _mig("7g.80gb", 81152),
}


def _pod(
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    container = {"name": "main", "image": "x", "resources": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {**spec, "containers": [container]},
    }


def _translate(pod: dict[str, Any], settings: TranslationSettings = SETTINGS) -> Any:
    translation = translate_pod(pod, settings)
    assert translation is not None
    return jsonpatch.apply_patch(pod, translation.patch), translation


def _devices(translation: Any) -> dict[str, Any]:
    (template,) = translation.templates
    devices: dict[str, Any] = template.spec["spec"]["devices"]
    return devices


def _exactly(translation: Any) -> dict[str, Any]:
    (request,) = _devices(translation)["requests"]
    assert request["name"] == "gpu"
    exactly: dict[str, Any] = request["exactly"]
    assert exactly["deviceClassName"] == DRIVER
    return exactly


def _selected(translation: Any) -> set[str]:
    """The devices of DEVICES every selector of the request admits (as kube-scheduler evaluates
    them: in order, the first false ends it, so a guard keeps later selectors from erroring)."""
    selectors = [
        compile_selector(s["cel"]["expression"]) for s in _exactly(translation).get("selectors", [])
    ]
    out = set()
    for name, attributes in DEVICES.items():
        view = device_view(DRIVER, attributes, {}, False)
        if all(s.matches(view) for s in selectors):
            out.add(name)
    return out


# ----------------------------------------------------------------------------- mixed strategy


def test_mixed_strategy_resource_is_n_mig_devices_of_its_profile() -> None:
    out, translation = _translate(_pod({"nvidia.com/mig-1g.10gb": "2", "cpu": "1"}))
    exactly = _exactly(translation)
    assert exactly["count"] == 2
    assert exactly["selectors"] == [
        {"cel": {"expression": f'has({A}.profile) && {A}.profile == "1g.10gb"'}}
    ]
    assert "capacity" not in exactly
    assert "constraints" not in _devices(translation)
    assert _selected(translation) == {"gpu-0-mig-1g10gb-6"}
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"},
        "claims": [{"name": "vgpu-main"}],
    }
    assert translation.source == "device-plugin"
    assert translation.warnings == [
        "container main: nvidia.com/mig-1g.10gb=2 -> claim of 2 MIG device(s) of profile 1g.10gb"
    ]


def test_me_profile_is_written_with_a_dot_in_the_resource_name() -> None:
    _, translation = _translate(_pod(requests={"nvidia.com/mig-1g.10gb.me": "1"}))
    assert _exactly(translation)["count"] == 1
    assert _selected(translation) == {"gpu-0-mig-1g10gbme-0"}


def test_zero_mig_devices_is_no_claim() -> None:
    out, translation = _translate(_pod({"nvidia.com/mig-1g.10gb": "0"}))
    assert translation.templates == []
    assert "resourceClaims" not in out["spec"]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"nvidia.com/mig-1g.24gb.gfx": "1"},
            "container main: 'nvidia.com/mig-1g.24gb.gfx': not a MIG resource vgpu-dra can map: "
            "the device plugin's mixed strategy names nvidia.com/mig-<g>g.<mem>gb",
        ),
        ({"nvidia.com/mig-": "1"}, "container main: 'nvidia.com/mig-': not a MIG resource"),
        (
            {'nvidia.com/mig-1g.10gb") || true || ("': "1"},
            "not a MIG resource vgpu-dra can map",
        ),
        (
            {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"},
            "container main: resources nvidia.com/gpu, nvidia.com/mig-1g.10gb: a device plugin "
            "MIG resource (nvidia.com/mig-1g.10gb) must be the container's only GPU resource",
        ),
        (
            {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"},
            "must be the container's only GPU resource",
        ),
        (
            {"nvidia.com/mig-1g.10gb": "33"},
            "container main: nvidia.com/mig-1g.10gb=33: at most 32 GPUs per container",
        ),
    ],
)
def test_unmappable_mig_resources_are_refused_by_name(limits: dict[str, str], message: str) -> None:
    with pytest.raises(Refusal) as err:
        translate_pod(_pod(limits), SETTINGS)
    assert message in str(err.value)


def test_a_memory_percentage_on_a_mig_pod_is_refused() -> None:
    pod = _pod(
        {"nvidia.com/mig-1g.10gb": "1"}, annotations={"vgpu.dra.dev/memory-percentage": "50"}
    )
    with pytest.raises(Refusal, match="a MIG device's memory is its profile's"):
        translate_pod(pod, SETTINGS)


def test_gpu_uuid_lists_select_a_mig_devices_parent() -> None:
    pod = _pod({"nvidia.com/mig-1g.10gb": "1"}, annotations={"nvidia.com/use-gpuuuid": "GPU-0"})
    _, translation = _translate(pod)
    assert _exactly(translation)["selectors"][1] == {
        "cel": {"expression": f'(has({A}.parentUUID) && {A}.parentUUID.matches("(?i)^(GPU-0)$"))'}
    }
    assert _selected(translation) == {"gpu-0-mig-1g10gb-6"}
    other = _pod({"nvidia.com/mig-1g.10gb": "1"}, annotations={"nvidia.com/use-gpuuuid": "GPU-9"})
    assert _selected(_translate(other)[1]) == set()


# ----------------------------------------------------------------------------- time-sliced MIG


def test_renamed_shared_mig_resource_is_one_exclusive_instance() -> None:
    _, translation = _translate(_pod({"nvidia.com/mig-3g.20gb.shared": "3"}))
    exactly = _exactly(translation)
    assert exactly["count"] == 1
    assert exactly["selectors"] == [
        {"cel": {"expression": f'has({A}.profile) && {A}.profile == "3g.20gb"'}}
    ]
    assert "exclusive: vgpu-dra has no shares of a MIG device yet" in translation.warnings[0]


def test_declared_shared_mig_resource_keeps_its_replica_bound() -> None:
    _, translation = _translate(_pod({"nvidia.com/mig-3g.40gb": "2"}))
    assert _exactly(translation)["count"] == 1
    assert _selected(translation) == {"gpu-0-mig-3g40gb-4"}
    assert "where the device plugin ran 2" in translation.warnings[0]
    with pytest.raises(Refusal) as err:
        translate_pod(_pod({"nvidia.com/mig-3g.40gb": "3"}), SETTINGS)
    assert str(err.value) == (
        "container main: nvidia.com/mig-3g.40gb=3: at most 2 shares (the replicas of one MIG "
        "device)"
    )


# ----------------------------------------------------------------------------- single strategy


def test_plain_gpu_is_a_whole_gpu_never_a_mig_device() -> None:
    _, translation = _translate(_pod({"nvidia.com/gpu": "1"}))
    assert _selected(translation) == {"gpu-0", "gpu-1"}


def test_single_strategy_product_label_names_the_profile() -> None:
    selector = {legacy.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "zone": "a"}
    out, translation = _translate(_pod({"nvidia.com/gpu": "3"}, nodeSelector=selector))
    assert _exactly(translation)["count"] == 3
    assert _selected(translation) == {"gpu-0-mig-1g10gb-6"}
    assert out["spec"]["nodeSelector"] == selector  # kept as the user wrote it
    assert "the nodeSelector is kept" in translation.warnings[0]


def test_single_strategy_label_alone_is_mig_devices_of_one_profile() -> None:
    selector = {legacy.MIG_STRATEGY_LABEL: "single"}
    _, translation = _translate(_pod({"nvidia.com/gpu": "2"}, nodeSelector=selector))
    assert _selected(translation) == {n for n in DEVICES if "-mig-" in n}
    assert _devices(translation)["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/profile"}
    ]
    assert "kube-scheduler chooses it" in translation.warnings[0]
    _, one = _translate(_pod({"nvidia.com/gpu": "1"}, nodeSelector=selector))
    assert "constraints" not in _devices(one)


def test_single_strategy_and_strict_topology_constraints_add_up() -> None:
    pod = _pod(
        {"nvidia.com/gpu": "2"},
        annotations={"nvidia.com/device-topology-mode": "numa-strict"},
        nodeSelector={legacy.MIG_STRATEGY_LABEL: "single"},
    )
    assert _devices(_translate(pod)[1])["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/numaNode"},
        {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/profile"},
    ]


def test_invalid_single_strategy_label_is_refused() -> None:
    selector = {legacy.GPU_PRODUCT_LABEL: "A100-SXM4-40GB-MIG-INVALID"}
    with pytest.raises(Refusal) as err:
        translate_pod(_pod({"nvidia.com/gpu": "1"}, nodeSelector=selector), SETTINGS)
    assert str(err.value).startswith(
        "container main: nvidia.com/gpu with nodeSelector "
        "nvidia.com/gpu.product='A100-SXM4-40GB-MIG-INVALID': not a MIG profile"
    )


# ----------------------------------------------------------------------------- HAMi


def test_hami_mig_mode_is_instances_with_at_least_the_memory() -> None:
    pod = _pod(
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"},
        annotations={legacy.HAMI_VGPU_MODE: "mig"},
    )
    out, translation = _translate(pod)
    exactly = _exactly(translation)
    assert exactly["count"] == 2
    assert "capacity" not in exactly  # neither memory nor cores: an instance is exclusive
    assert exactly["selectors"] == [
        {"cel": {"expression": f"has({A}.profile)"}},
        {"cel": {"expression": f"has({A}.memoryBytes) && {A}.memoryBytes >= {20000 << 20}"}},
    ]
    assert _selected(translation) == {"gpu-0-mig-3g40gb-4", "gpu-0-mig-7g80gb-0"}
    assert translation.source == "hami"
    assert any("not reserved: a MIG instance's SMs are its own" in w for w in translation.warnings)
    assert legacy.HAMI_VGPU_MODE in out["metadata"]["annotations"]  # kept, not copied


def test_hami_core_mode_excludes_mig_devices() -> None:
    pod = _pod(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"},
        annotations={legacy.HAMI_VGPU_MODE: "hami-core"},
    )
    _, translation = _translate(pod)
    assert _exactly(translation)["capacity"] == {"requests": {"memory": "1024Mi"}}
    assert _selected(translation) == {"gpu-0", "gpu-1"}


@pytest.mark.parametrize(
    ("limits", "mode", "message"),
    [
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"},
            "mig",
            "container main: nvidia.com/gpumem-percentage with annotation nvidia.com/vgpu-mode=mig",
        ),
        (
            {"nvidia.com/gpu": "1"},
            "mps",
            "annotation nvidia.com/vgpu-mode=mps: vgpu-dra has no MPS",
        ),
        (
            {"nvidia.com/gpu": "1"},
            "vgpu",
            "annotation nvidia.com/vgpu-mode='vgpu': allowed values",
        ),
        (
            {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1024"},
            "mig",
            "container main: 0 GPUs requested together with memory or cores",
        ),
    ],
)
def test_hami_mig_refusals(limits: dict[str, str], mode: str, message: str) -> None:
    with pytest.raises(Refusal) as err:
        translate_pod(_pod(limits, annotations={legacy.HAMI_VGPU_MODE: mode}), SETTINGS)
    assert str(err.value).startswith(message)


# ----------------------------------------------------------------------------- routing


def test_match_conditions_route_every_mig_resource_by_prefix() -> None:
    (condition,) = match_conditions(SETTINGS)
    program = cel.NewEnv(variables={"object": cel.Type.DYN}).compile(condition["expression"])
    for resources, routed in [
        ({"limits": {"nvidia.com/mig-1g.10gb": "1"}}, True),
        ({"requests": {"nvidia.com/mig-9g.99gb.odd": "1"}}, True),
        ({"limits": {"nvidia.com/migration": "1"}}, False),
        ({"limits": {"example.com/mig-1g.10gb": "1"}}, False),
    ]:
        pod = {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": resources}]},
        }
        assert program.eval(data={"object": pod}).value() is routed, resources
        assert needs_translation(pod, SETTINGS) is routed, resources
