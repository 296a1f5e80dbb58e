"""Hostile pods at the translation (controller.webhook.translate), without a cluster (issue 27).

Proves:
1. a legacy count of 0 in any system's resource (`nvidia.com/gpu`, `vgpu-number`,
   `vcuda-core`, a shared resource), in limits or requests, gives the container no claim and no
   template, its pod records the system it came from; 0 with memory, cores or a memory share is
   refused; negative, fractional, boolean and int64-overflowing counts are refused naming the
   resource;
2. no template is ever written with a count below 1 or above 32 (the API's devices per claim);
3. the 100 KiB `nvidia.com/use-gputype` of the issue is refused naming the annotation and the
   bound; a list under the bounds whose CEL selector would exceed the API's 10 KiB is refused
   naming the annotation, its size and the limit, and one just under the limit is translated;
4. a pod whose annotations, with the ones the webhook copies, would exceed the API's 256 KiB is
   refused naming the copies; one that fits is translated;
5. the same bounds hold for the validating webhook's reading of a pod (read_pod_policy).
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from controller.webhook import legacy
from controller.webhook.translate import (
    ANNOTATIONS_MAX_BYTES,
    CEL_SELECTOR_MAX_LENGTH,
    Refusal,
    TranslationSettings,
    read_pod_policy,
    translate_pod,
)
from dra_driver.allocator.request import MAX_POLICY_ITEMS, MAX_POLICY_LIST_BYTES

JSON = dict[str, Any]
SETTINGS = TranslationSettings(shared_resources={"nvidia.com/gpu.shared": 4})


def pod(limits: JSON | None = None, requests: JSON | None = None, **annotations: str) -> JSON:
    resources: JSON = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    meta: JSON = {"name": "p"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
    }


def refusal(obj: JSON) -> str:
    with pytest.raises(Refusal) as refused:
        translate_pod(obj, SETTINGS)
    return str(refused.value)


# ---------------------------------------------------------------- 1, 2: zero and counts

ZEROS = {
    "device-plugin": {"nvidia.com/gpu": "0"},
    "vgpu-manager": {"nvidia.com/vgpu-number": "0"},
    "gpu-manager": {"nvidia.com/vcuda-core": "0"},
    "device-plugin-shared": {"nvidia.com/gpu.shared": "0"},
    "hami-cores-zero": {"nvidia.com/gpu": "0", "nvidia.com/gpucores": "0"},
    "hami-whole-memory": {"nvidia.com/gpu": "0", "nvidia.com/gpumem-percentage": "100"},
}
SOURCE = {"device-plugin-shared": "device-plugin", "hami-cores-zero": "hami",
          "hami-whole-memory": "hami"}  # fmt: skip


@pytest.mark.parametrize("where", ["limits", "requests"])
@pytest.mark.parametrize("case", sorted(ZEROS))
def test_a_zero_count_gives_the_container_no_claim(case: str, where: str) -> None:
    legacy_pod = pod(**{where: {**ZEROS[case], "cpu": "1"}})  # type: ignore[arg-type]
    translation = translate_pod(legacy_pod, SETTINGS)
    assert translation is not None
    assert translation.templates == []
    out = jsonpatch.apply_patch(legacy_pod, translation.patch)
    assert "resourceClaims" not in out["spec"]
    resources = out["spec"]["containers"][0]["resources"]
    assert "claims" not in resources
    assert resources == {where: {"cpu": "1"}}  # the legacy names are gone, cpu stays
    assert out["metadata"]["annotations"][legacy.TRANSLATED_FROM] == SOURCE.get(case, case)
    assert any(
        "ask for no GPU: removed, the container gets none" in w for w in translation.warnings
    )


def test_a_zero_next_to_a_real_request_gives_only_the_real_one_a_claim() -> None:
    legacy_pod = pod({"nvidia.com/gpu": "1"})
    legacy_pod["spec"]["containers"].append(
        {"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "0"}}}
    )
    translation = translate_pod(legacy_pod, SETTINGS)
    assert translation is not None
    out = jsonpatch.apply_patch(legacy_pod, translation.patch)
    (claim,) = out["spec"]["resourceClaims"]
    main, side = out["spec"]["containers"]
    assert main["resources"]["claims"] == [{"name": claim["name"]}]
    assert side["resources"] == {}
    (template,) = translation.templates
    assert template.spec["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1024"},
        {"nvidia.com/gpu": "0", "nvidia.com/gpucores": "10"},
        {"nvidia.com/gpu": "0", "nvidia.com/gpumem-percentage": "50"},
        {"nvidia.com/vgpu-number": "0", "nvidia.com/vgpu-memory": "1024"},
        {"nvidia.com/vcuda-core": "0", "nvidia.com/vcuda-memory": "1024"},
    ],
)
def test_zero_gpus_with_memory_or_cores_is_refused(limits: JSON) -> None:
    message = refusal(pod(limits))
    assert "0 GPUs requested together with memory or cores" in message
    assert "ask for at least 1 GPU or drop the others" in message


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("-1", "use a whole number >= 0"),
        ("1.5", "use a whole number >= 0"),
        ("500m", "use a whole number >= 0"),
        (True, "is not a quantity"),
        ("9223372036854775808", "is not a quantity"),
        ("1e400", "is not a quantity"),
        ("one", "is not a quantity"),
    ],
)
def test_a_count_that_is_not_a_whole_number_is_refused(value: Any, words: str) -> None:
    message = refusal(pod({"nvidia.com/gpu": value}))
    assert "resources.limits[nvidia.com/gpu]" in message
    assert words in message


def test_more_than_32_gpus_per_container_is_refused_32_is_translated() -> None:
    translation = translate_pod(pod({"nvidia.com/gpu": "32"}), SETTINGS)
    assert translation is not None
    (template,) = translation.templates
    assert template.spec["spec"]["devices"]["requests"][0]["exactly"]["count"] == 32
    for limits in ({"nvidia.com/gpu": "33"}, {"nvidia.com/vcuda-core": "3300"}):
        assert "at most 32 GPUs per container" in refusal(pod(limits))


# ---------------------------------------------------------------- 3: CEL selectors


def test_the_issues_100_kib_gpu_type_list_is_refused_naming_the_annotation() -> None:
    message = refusal(pod({"nvidia.com/gpu": "1"}, **{"nvidia.com/use-gputype": "A" * 102400}))
    assert message.startswith("annotation nvidia.com/use-gputype: 102400 bytes")
    assert f"at most {MAX_POLICY_LIST_BYTES} bytes and {MAX_POLICY_ITEMS} items" in message
    assert len(message) < 400  # the value is not echoed


def test_too_many_items_are_refused() -> None:
    types = ",".join(f"T{i}" for i in range(MAX_POLICY_ITEMS + 1))
    message = refusal(pod({"nvidia.com/gpu": "1"}, **{"nvidia.com/use-gputype": types}))
    assert f"{MAX_POLICY_ITEMS + 1} items" in message


def _dotted_types(count: int, length: int) -> str:
    """`count` GPU type names of `length` characters, half of them dots (each dot becomes `[.]`
    in the regular expression: the selector is about twice the annotation)."""
    name = ("a." * length)[:length]
    return ",".join(f"{i}{name}"[:length] for i in range(count))


@pytest.mark.parametrize(
    "key", ["nvidia.com/use-gputype", "nvidia.com/exclude-gpu-type", "vgpu.dra.dev/gpu-type"]
)
def test_a_list_whose_selector_exceeds_the_apis_limit_is_refused(key: str) -> None:
    types = _dotted_types(200, 39)
    assert len(types) <= MAX_POLICY_LIST_BYTES
    message = refusal(pod({"nvidia.com/vgpu-number": "1"}, **{key: types}))
    assert message.startswith(f"annotation {key}: its 200 GPU types become a CEL selector of ")
    assert f"above the API's limit of {CEL_SELECTOR_MAX_LENGTH} bytes" in message
    size = int(message.split("CEL selector of ")[1].split(" ")[0])
    assert size > CEL_SELECTOR_MAX_LENGTH


def test_uuids_whose_selector_exceeds_the_limit_are_refused() -> None:
    # 249 UUIDs fit the list's 10 KiB (10208 bytes); with the expression around them, not.
    uuids = ",".join(f"GPU-{i:08x}-33f3-99dd-e08b-ea4beb0e0d28" for i in range(249))
    assert len(uuids) <= MAX_POLICY_LIST_BYTES
    message = refusal(pod({"nvidia.com/gpu": "1"}, **{"nvidia.com/use-gpuuuid": uuids}))
    assert message.startswith("annotation nvidia.com/use-gpuuuid: its 249 GPU UUIDs become")


def test_a_selector_just_under_the_limit_is_translated() -> None:
    prefix = 'device.attributes["vgpu.dra.dev"].productName.matches("(?i)('
    room = CEL_SELECTOR_MAX_LENGTH - len(prefix) - len(')")')
    assert room % 100  # the last name is not empty
    types = ",".join(["A" * 99] * (room // 100) + ["B" * (room % 100)])
    legacy_pod = pod({"nvidia.com/gpu": "1"}, **{"nvidia.com/use-gputype": types})
    translation = translate_pod(legacy_pod, SETTINGS)
    assert translation is not None
    (template,) = translation.templates
    (selector,) = template.spec["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert len(selector["cel"]["expression"]) == CEL_SELECTOR_MAX_LENGTH
    # One byte more is refused.
    over = pod({"nvidia.com/gpu": "1"}, **{"nvidia.com/use-gputype": types + "B"})
    assert f"CEL selector of {CEL_SELECTOR_MAX_LENGTH + 1} bytes" in refusal(over)


# ---------------------------------------------------------------- 4: annotations in total


def test_annotations_beyond_the_apis_total_once_copied_are_refused() -> None:
    types = ",".join(["A" * 99] * 80)  # 8079 bytes: within every list bound
    filler = "x" * (ANNOTATIONS_MAX_BYTES - len(types) - 2000)
    legacy_pod = pod(
        {"nvidia.com/gpu": "1"},
        **{"nvidia.com/use-gputype": types, "example.com/filler": filler},
    )
    message = refusal(legacy_pod)
    assert f"above the API's limit of {ANNOTATIONS_MAX_BYTES} bytes" in message
    assert "the webhook adds vgpu.dra.dev/include-gpu-type" in message
    # Without the copy it fits: the same pod with the policy under our name translates.
    ours = pod(
        {"nvidia.com/gpu": "1"},
        **{"vgpu.dra.dev/include-gpu-type": types, "example.com/filler": filler},
    )
    assert translate_pod(ours, SETTINGS) is not None


# ---------------------------------------------------------------- 5: the validating side


def test_the_validating_reader_applies_the_same_bounds() -> None:
    with pytest.raises(Refusal, match=r"annotation nvidia\.com/nouse-gputype: 102400 bytes"):
        read_pod_policy(pod(None, **{"nvidia.com/nouse-gputype": "A" * 102400}))
