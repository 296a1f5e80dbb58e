"""Properties of the translation over random pods: it only ever refuses with `Refusal`, its output
is final (a reinvocation changes nothing), the templates it writes are claims the allocator and
the validator accept, identical shapes share a template, and the CEL `matchConditions` route
exactly the pods `needs_translation` accepts."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from cel_expr_python import cel
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.webhook import legacy
from controller.webhook.translate import (
    Refusal,
    TranslationSettings,
    is_webhook_template,
    match_conditions,
    needs_translation,
    translate_pod,
)
from controller.webhook.validation import ClusterFacts, validate_object
from dra_driver.allocator.request import parse_claim

DRIVER = "vgpu.dra.dev"
SHARED = "nvidia.com/gpu.shared"
SETTINGS = TranslationSettings(driver=DRIVER, device_class=DRIVER, shared_resources={SHARED: 4})
CLASSES = {DRIVER: {"metadata": {"name": DRIVER}, "spec": {}}}

OTHER_KEYS = ["cpu", "memory", "example.com/fpga"]
MIG_KEYS = [
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-1g.10gb.me",
    "nvidia.com/mig-3g.20gb.shared",
    "nvidia.com/mig-1g.24gb.gfx",
    "nvidia.com/mig-",
]
# Per system the keys a container of that system uses; a few containers mix them on purpose.
SYSTEM_KEYS = [
    [legacy.VGPU_NUMBER, legacy.VGPU_CORES, legacy.VGPU_MEMORY],
    [legacy.GPU, legacy.HAMI_MEMORY, legacy.HAMI_CORES, legacy.HAMI_MEMORY_PERCENTAGE],
    [legacy.VCUDA_CORE, legacy.VCUDA_MEMORY],
    [legacy.GPU],
    [SHARED],
    [*legacy.RESOURCES, SHARED],
    # the device plugin's MIG resources (a prefix, not a table), well formed or not
    MIG_KEYS,
    [legacy.GPU, *MIG_KEYS],
]
COUNTS = st.integers(min_value=0, max_value=4).map(str)
PERCENT = st.sampled_from(["0", "10", "30", "50", "100"])
MEMORY = st.sampled_from(["1", "1024", "3k", "10k", "81920"])
GOOD_VALUES: dict[str, st.SearchStrategy[str]] = {
    legacy.VGPU_NUMBER: COUNTS,
    legacy.GPU: COUNTS,
    SHARED: COUNTS,
    legacy.VGPU_CORES: PERCENT,
    legacy.HAMI_CORES: PERCENT,
    legacy.HAMI_MEMORY_PERCENTAGE: PERCENT,
    legacy.VGPU_MEMORY: MEMORY,
    legacy.HAMI_MEMORY: MEMORY,
    legacy.VCUDA_MEMORY: MEMORY,
    legacy.VCUDA_CORE: st.sampled_from(["0", "30", "50", "100", "200"]),
}
BAD_VALUES = st.one_of(
    st.sampled_from(["1.5", "-1", "abc", "", "1e3", "1Ki", "99999999999999999999", "150", "101"]),
    st.integers(min_value=-5, max_value=5000),
)
CONCEPT_VALUES: dict[str, list[str]] = {
    "node_policy": ["binpack", "spread"],
    "device_policy": ["binpack", "spread"],
    "topology": ["none", "numa", "link", "numa-strict", "link-strict"],
    "include_types": ["A100", "A10,H100", "T4"],
    "exclude_types": ["V100", "2080"],
    "include_uuids": ["GPU-1,GPU-2"],
    "exclude_uuids": ["GPU-3"],
    "compute_policy": ["fixed", "balance", "none"],
    "core_limit": ["10", "50"],
    "memory_percentage": ["100", "50"],
    "vgpu_mode": ["hami-core", "mig", "mps"],
}
BAD_ANNOTATION_VALUES = st.one_of(
    st.sampled_from(["", "x y", '")', "pack", "A100", "GPU-1"]), st.text(max_size=8)
)
# GPU feature discovery's labels of the device plugin's single MIG strategy, and hostile forms.
NODE_SELECTORS: list[Any] = [
    None,
    {},
    {legacy.MIG_STRATEGY_LABEL: "single"},
    {legacy.GPU_PRODUCT_LABEL: "A100-SXM4-40GB-MIG-1g.5gb"},
    {legacy.GPU_PRODUCT_LABEL: "A100-SXM4-40GB-MIG-INVALID"},
    {legacy.GPU_PRODUCT_LABEL: "A100-SXM4-40GB"},
    {legacy.GPU_PRODUCT_LABEL: 7},
    "not a map",
]
ANNOTATION_KEYS = [*legacy.ANNOTATION_BY_KEY, "example.com/other", legacy.TRANSLATED_FROM]


@st.composite
def annotation_maps(draw: st.DrawFn) -> dict[str, str]:
    out = {}
    for key in draw(st.lists(st.sampled_from(ANNOTATION_KEYS), max_size=3, unique=True)):
        entry = legacy.ANNOTATION_BY_KEY.get(key)
        if entry is None or draw(st.integers(0, 9)) == 0:
            out[key] = draw(BAD_ANNOTATION_VALUES)
        else:
            out[key] = draw(st.sampled_from(CONCEPT_VALUES[entry.concept]))
    return out


@st.composite
def resource_maps(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.sampled_from(SYSTEM_KEYS)) + OTHER_KEYS
    out: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        good = GOOD_VALUES.get(key, st.just("1"))
        out[key] = draw(BAD_VALUES if draw(st.integers(0, 9)) == 0 else good)
    return out


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=3))):
        container: dict[str, Any] = {"name": f"{prefix}{i}", "image": "x"}
        resources: dict[str, Any] = {}
        limits = draw(resource_maps())
        if limits:
            resources["limits"] = limits
        if draw(st.booleans()):
            same = draw(st.integers(0, 4)) > 0
            resources["requests"] = dict(limits) if same else draw(resource_maps())
        keep_empty: bool = draw(st.booleans())
        if resources or keep_empty:
            container["resources"] = resources
        out.append(container)
    return out


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    annotations = draw(annotation_maps())
    keep_empty: bool = draw(st.booleans())
    if annotations or keep_empty:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": draw(containers("c"))}
    init = draw(containers("i"))
    if init:
        spec["initContainers"] = init
    scheduler = draw(st.sampled_from([None, "vgpu-scheduler", "default-scheduler"]))
    if scheduler:
        spec["schedulerName"] = scheduler
    if draw(st.booleans()):
        spec["resourceClaims"] = [{"name": "own", "resourceClaimTemplateName": "mine"}]
    node_selector = draw(st.sampled_from(NODE_SELECTORS))
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if draw(st.booleans()):
        gate = draw(st.sampled_from(["other", "vgpu.dra.dev/policy"]))
        spec["schedulingGates"] = [{"name": gate}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@settings(max_examples=300, deadline=None)
@given(pods())
def test_translation_refuses_only_with_refusal_and_is_final(pod: dict[str, Any]) -> None:
    original = copy.deepcopy(pod)
    try:
        translation = translate_pod(pod, SETTINGS)
    except Refusal as exc:
        assert str(exc)
        return
    assert pod == original  # the input is never modified
    if translation is None:
        return
    out = jsonpatch.apply_patch(pod, translation.patch)
    # Nothing legacy is left on any container.
    for container in [*out["spec"]["containers"], *out["spec"].get("initContainers", [])]:
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            assert not set(resources.get(part) or {}) & {*legacy.RESOURCES, SHARED}
    # Each claim a container names exists on the pod; each webhook claim has its template.
    claims = {c["name"]: c for c in out["spec"].get("resourceClaims", [])}
    names = {t.name for t in translation.templates}
    for container in [*out["spec"]["containers"], *out["spec"].get("initContainers", [])]:
        for ref in (container.get("resources") or {}).get("claims") or []:
            assert ref["name"] in claims
    for claim in claims.values():
        template = claim.get("resourceClaimTemplateName", "")
        if is_webhook_template(template):
            assert template in names
    # Reinvocation (another webhook changed the pod after us) changes nothing.
    again = translate_pod(out, SETTINGS)
    assert again is None or again.patch == []
    # The templates are claims the allocator parses and the validating webhook admits.
    for template in translation.templates:
        claim = {
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": template.spec["spec"],
        }
        parse_claim(claim, CLASSES)
        as_object = {"kind": "ResourceClaimTemplate", "metadata": {"name": template.name}}
        assert validate_object({**as_object, "spec": template.spec}, ClusterFacts(None)) == []


@settings(max_examples=200, deadline=None)
@given(pods(), st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20))
def test_same_shape_same_template(pod: dict[str, Any], other_name: str) -> None:
    renamed = copy.deepcopy(pod)
    renamed["metadata"] = {**renamed["metadata"], "name": other_name, "namespace": "elsewhere"}
    for field in ("containers", "initContainers"):
        for container in renamed["spec"].get(field) or []:
            container["name"] = "x" + container["name"]
    try:
        first = translate_pod(pod, SETTINGS)
    except Refusal:
        return
    second = translate_pod(renamed, SETTINGS)
    assert (first is None) == (second is None)
    if first is not None and second is not None:
        assert [t.name for t in first.templates] == [t.name for t in second.templates]
        assert [t.spec for t in first.templates] == [t.spec for t in second.templates]


_PROGRAM: Any = None


def _match(pod: dict[str, Any]) -> bool:
    global _PROGRAM  # noqa: PLW0603 - compiled once for the module
    if _PROGRAM is None:
        conditions = match_conditions(SETTINGS)
        assert len(conditions) == 1
        env = cel.NewEnv(variables={"object": cel.Type.DYN})
        _PROGRAM = env.compile(conditions[0]["expression"])
    result = _PROGRAM.eval(data={"object": pod})
    assert result.type() == cel.Type.BOOL, result.value()
    return bool(result.value())


@settings(max_examples=300, deadline=None)
@given(pods())
def test_match_conditions_accept_exactly_what_needs_translation_does(pod: dict[str, Any]) -> None:
    # Quantities reach CEL as strings, as the API server serializes them.
    for field in ("containers", "initContainers"):
        for container in pod["spec"].get(field) or []:
            for part in ("limits", "requests"):
                values = (container.get("resources") or {}).get(part)
                if values:
                    container["resources"][part] = {k: str(v) for k, v in values.items()}
    assert _match(pod) == needs_translation(pod, SETTINGS)


def test_match_conditions_examples() -> None:
    bare: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert not _match(bare)
    shared = copy.deepcopy(bare)
    shared["spec"]["containers"][0]["resources"] = {"limits": {SHARED: "1"}}
    assert _match(shared)
    scheduler = copy.deepcopy(bare)
    scheduler["spec"]["schedulerName"] = "vgpu-scheduler"
    assert _match(scheduler)
    translated = copy.deepcopy(bare)
    translated["metadata"]["annotations"] = {legacy.TRANSLATED_FROM: "hami"}
    assert not _match(translated)
