"""Legacy GPU-sharing pod -> DRA claims: the pure translation behind the mutating webhook.

`translate_pod(pod, settings)` returns the RFC 6902 JSONPatch for the incoming pod, the
ResourceClaimTemplates it references (the server makes sure they exist in the pod's namespace),
and warnings that say what each legacy field became; `None` when there is nothing to do. Anything
that cannot be honoured faithfully raises `Refusal` with a message naming the field, the value and
what to do instead: a pod is never translated into something weaker than it asked for without a
warning saying so.

Per container with legacy resources (docs/migration.md has the tables):
- one claim of its own: a pod `spec.resourceClaims[]` entry naming a template, and the container's
  `resources.claims[]`; the legacy limits and requests are removed;
- the template's request: `count` GPUs, capacity `memory` (MiB) and `cores` (% of SMs) per GPU,
  CEL selectors for the pod's GPU type / UUID include and exclude lists, a `matchAttribute`
  constraint on `numaNode` / `nvlinkDomain` for the strict topology modes, and a VgpuConfig
  (computePolicy) when the pod chose one;
- templates are named after a hash of their spec, so pods of the same shape share one.
Pod-wide: legacy policy annotations are copied to our canonical `vgpu.dra.dev/*` names (the ones
the allocation controller reads); node/device scheduling policies, the best-effort topology modes
and `schedulerName: vgpu-scheduler` add the policy gate (the default path cannot honour them).

The webhook is registered for CREATE only: a gate can be added only when a pod is created.
Reinvocation is harmless: a translated pod translates to no patch at all.

Zero and the API's limits (every pod is hostile input):
- a legacy count of 0 (`nvidia.com/gpu: 0`, `nvidia.com/vgpu-number: 0`, `nvidia.com/vcuda-core:
  0`, a shared resource at 0) gives the container no claim at all, as each source system gives
  it no GPU; 0 GPUs together with memory, cores or a memory share is refused; negative and
  fractional counts are refused. No template with a count below 1 is ever written.
- what the translation writes is checked against the API's own limits before the webhook answers,
  so a pod that would exceed one is refused naming the annotation or resource and the limit,
  instead of the template or the pod failing the API's validation after admission: a CEL selector
  expression at most `CEL_SELECTOR_MAX_LENGTH` bytes; at most `MAX_COUNT` devices per claim; the
  pod's annotations (with the ones the webhook copies) at most `ANNOTATIONS_MAX_BYTES`; claim
  names DNS labels; and, before any of that, a list annotation at most `MAX_POLICY_LIST_BYTES`
  and `MAX_POLICY_ITEMS` items (the allocation controller's own bounds).
"""

from __future__ import annotations

import hashlib
import json
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.reconciler import GATE
from controller.webhook import legacy
from controller.webhook.legacy import Concept, System
from dra_driver import config, names
from dra_driver.allocator import QuantityError, parse_quantity
from dra_driver.allocator.request import MAX_COUNT, MAX_POLICY_ITEMS, MAX_POLICY_LIST_BYTES

JSON = dict[str, Any]

DEFAULT_SCHEDULER = "default-scheduler"
CLAIM_PREFIX = "vgpu-"
TEMPLATE_PREFIX = "vgpu-"
TEMPLATE_HASH_CHARS = 20
_TEMPLATE_NAME = re.compile(rf"^{TEMPLATE_PREFIX}[0-9a-f]{{{TEMPLATE_HASH_CHARS}}}$")
REQUEST_NAME = "gpu"
MAX_NAME = 63  # a pod's resourceClaims[].name is a DNS label
MAX_MEMORY_MIB = 1 << 24  # 16 TiB per GPU: far above any GPU, far below int64 bytes
# The API's limits on what the translation writes (Kubernetes v1.37 sources):
# resource.k8s.io/v1 CELSelectorExpressionMaxLength (pkg/apis/resource/types.go; validation
# compares the expression's length in bytes) and apimachinery's TotalAnnotationSizeLimitB
# (the sum of the lengths of every annotation's key and value).
CEL_SELECTOR_MAX_LENGTH = 10 * 1024
ANNOTATIONS_MAX_BYTES = 256 * 1024

# GPU type names become parts of a CEL regular expression: only characters that need no escaping
# beyond `[.]` are accepted (product names are letters, digits, spaces, dashes, dots).
_TYPE_NAME = re.compile(r"[A-Za-z0-9 ._-]+")
_UUID = re.compile(r"[A-Za-z0-9-]+")
_PERCENT = re.compile(r"[0-9]{1,3}")
# The annotations whose value is a comma list: what each item must match, and how to say so.
_TYPE_LIST = (
    _TYPE_NAME,
    "GPU product names (letters, digits, space, '.', '_', '-'), e.g. 'A100,H100'",
)
_UUID_LIST = (
    _UUID,
    "GPU UUIDs (letters, digits, '-'), e.g. 'GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28'",
)
_COMMA_LISTS: dict[str, tuple[re.Pattern[str], str]] = {
    "include_types": _TYPE_LIST,
    "exclude_types": _TYPE_LIST,
    "include_uuids": _UUID_LIST,
    "exclude_uuids": _UUID_LIST,
}

# User values are echoed into refusals shortened: an annotation may be hundreds of KiB.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def _short(value: Any) -> str:
    return _SHORT.repr(value)


class Refusal(ValueError):
    """A pod that cannot be translated faithfully; the message is for the user."""


@dataclass(frozen=True)
class TranslationSettings:
    driver: str = names.DEFAULT_DRIVER_NAME
    device_class: str = names.DEFAULT_DRIVER_NAME
    # NVIDIA device plugin renamed shared resources -> replicas per GPU, e.g.
    # {"nvidia.com/sharedgpu": 4}.
    shared_resources: Mapping[str, int] = field(default_factory=dict)
    # MiB of GPU memory per replica of a shared resource. Without it a share reserves cores only,
    # which leaves the GPU's whole memory to the share (a request naming no memory gets all of
    # it): one such pod per GPU. Set it to let N pods share a GPU as the replicas promise.
    shared_memory_mib: Mapping[str, int] = field(default_factory=dict)
    # computePolicy written into the claim when the pod names none; None leaves it to the
    # DeviceClass / cluster default.
    default_compute_policy: str | None = None


@dataclass(frozen=True)
class ClaimTemplate:
    name: str
    spec: JSON  # the ResourceClaimTemplate's `spec`: {"spec": {"devices": {...}}}
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Translation:
    patch: list[JSON]
    templates: list[ClaimTemplate]
    warnings: list[str]
    source: str


# ----------------------------------------------------------------------------- pod policies


@dataclass(frozen=True)
class PodPolicy:
    """What a pod's annotations ask for, whatever names they used (values validated)."""

    values: Mapping[Concept, str]  # normalised annotation value per concept
    systems: frozenset[System]  # systems whose annotation names the pod uses
    # The annotation each concept was read from, as the pod wrote it (for messages).
    keys: Mapping[Concept, str] = field(default_factory=dict)

    def get(self, concept: Concept) -> str | None:
        return self.values.get(concept)

    def items(self, concept: Concept) -> tuple[str, ...]:
        return _csv(self.values.get(concept))

    @property
    def wants_policy_path(self) -> bool:
        """Policies only the allocation controller honours (the default path cannot)."""
        return (
            "node_policy" in self.values
            or "device_policy" in self.values
            or self.values.get("topology") in ("numa", "link")
        )

    @property
    def selects_devices(self) -> bool:
        return any(
            c in self.values
            for c in ("include_types", "exclude_types", "include_uuids", "exclude_uuids")
        )


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def _normalise(concept: Concept, key: str, raw: Any) -> str:
    """Check one annotation value; Refusal names the annotation, the value and what is allowed."""
    value = str(raw).strip()
    choices: tuple[str, ...] = ()
    if concept in ("node_policy", "device_policy"):
        choices = legacy.POLICIES
    elif concept == "topology":
        choices = legacy.TOPOLOGIES
    elif concept == "compute_policy":
        choices = legacy.COMPUTE_POLICIES
    elif concept == "vgpu_mode":
        choices = legacy.HAMI_VGPU_MODES
    if choices:
        if value not in choices:
            raise Refusal(
                f"annotation {key}={_short(value)}: allowed values are {', '.join(choices)}"
            )
        return value
    if concept in _COMMA_LISTS:
        pattern, what = _COMMA_LISTS[concept]
        size = len(value.encode())
        if size > MAX_POLICY_LIST_BYTES:
            raise Refusal(
                f"annotation {key}: {size} bytes; a list of GPU types or UUIDs may have at most "
                f"{MAX_POLICY_LIST_BYTES} bytes and {MAX_POLICY_ITEMS} items (GPU types match as "
                "case-insensitive substrings: 'A100' matches every A100 model)"
            )
        items = _csv(value)
        if len(items) > MAX_POLICY_ITEMS:
            raise Refusal(
                f"annotation {key}: {len(items)} items; a list of GPU types or UUIDs may have "
                f"at most {MAX_POLICY_ITEMS}"
            )
        if not items or any(not pattern.fullmatch(item) for item in items):
            raise Refusal(f"annotation {key}={_short(value)}: a comma list of {what}")
        return ",".join(items)
    # core_limit, memory_percentage: whole percentages
    if not _PERCENT.fullmatch(value) or int(value) > 100:
        low = 1 if concept == "memory_percentage" else 0
        raise Refusal(f"annotation {key}={_short(value)}: an integer percentage {low}..100")
    if concept == "memory_percentage" and int(value) == 0:
        raise Refusal(f"annotation {key}={_short(value)}: an integer percentage 1..100")
    return str(int(value))


def _same(concept: Concept, a: str, b: str) -> bool:
    if concept.endswith(("_types", "_uuids")):
        return {x.lower() for x in _csv(a)} == {x.lower() for x in _csv(b)}
    return a == b


def read_pod_policy(pod: Mapping[str, Any]) -> PodPolicy:
    """The pod's policy annotations under every name we know; Refusal on a bad value or when two
    annotations (e.g. HAMi's and vgpu-manager's, or an include and an exclude) contradict."""
    annotations = ((pod.get("metadata") or {}).get("annotations")) or {}
    values: dict[Concept, str] = {}
    first_key: dict[Concept, str] = {}
    systems: set[System] = set()
    for key in sorted(annotations):
        entry = legacy.ANNOTATION_BY_KEY.get(key)
        if entry is None:
            continue
        systems.add(entry.system)
        value = _normalise(entry.concept, key, annotations[key])
        if entry.concept in values and not _same(entry.concept, values[entry.concept], value):
            other = first_key[entry.concept]
            raise Refusal(
                f"annotations {other}={_short(annotations[other])} and "
                f"{key}={_short(annotations[key])} contradict each other: keep one of them"
            )
        values.setdefault(entry.concept, value)
        first_key.setdefault(entry.concept, key)
    pairs: tuple[tuple[Concept, Concept, str], ...] = (
        ("include_types", "exclude_types", "GPU type"),
        ("include_uuids", "exclude_uuids", "GPU UUID"),
    )
    for include, exclude, what in pairs:
        both = {x.lower() for x in _csv(values.get(include))} & {
            x.lower() for x in _csv(values.get(exclude))
        }
        if both:
            raise Refusal(
                f"annotations {first_key[include]}={_short(annotations[first_key[include]])} and "
                f"{first_key[exclude]}={_short(annotations[first_key[exclude]])} both include and "
                f"exclude the {what} {', '.join(sorted(both))}: remove it from one of them"
            )
    return PodPolicy(values=values, systems=frozenset(systems), keys=first_key)


# ----------------------------------------------------------------------------- containers


@dataclass(frozen=True)
class Shape:
    """What one container asks for, in our terms."""

    system: System
    count: int
    memory_mib: int | None  # per GPU; None = the whole memory (or memory_percent of it)
    memory_percent: int | None  # % of the chosen GPU's memory (policy path only); None = unused
    cores: int | None  # % per GPU; None = no reservation (the default 0)
    compute_policy: str | None
    removed: tuple[str, ...]  # legacy resource names taken off the container
    notes: tuple[str, ...]  # warnings: what each legacy value became
    # CEL selectors of the request beyond the pod's policy ones (MIG profile, whole GPU).
    selectors: tuple[str, ...] = ()
    mig: bool = False  # the request is for MIG devices (GPU UUID lists select their parentUUID)
    same_attribute: str | None = None  # matchAttribute over the request's devices (count > 1)


def _resources(container: Mapping[str, Any]) -> tuple[JSON, JSON]:
    res = container.get("resources") or {}
    return dict(res.get("limits") or {}), dict(res.get("requests") or {})


def _is_mig(key: str) -> bool:
    return key.startswith(legacy.MIG_RESOURCE_PREFIX)


def _legacy_keys(container: Mapping[str, Any], settings: TranslationSettings) -> list[str]:
    limits, requests = _resources(container)
    known = set(legacy.RESOURCES) | set(settings.shared_resources)
    return sorted(
        k
        for k in {*limits, *requests}
        if k in known or (isinstance(k, str) and k.startswith(tuple(legacy.RESOURCE_PREFIXES)))
    )


def _amount(container: str, key: str, limits: JSON, requests: JSON) -> int:
    """A legacy resource's value as a non-negative integer (limits win; requests must agree)."""
    values = []
    for where, source in (("limits", limits), ("requests", requests)):
        if key not in source:
            continue
        raw = source[key]
        try:
            if isinstance(raw, bool):
                raise QuantityError(repr(raw))
            milli = parse_quantity(str(raw), 3)
        except QuantityError:
            raise Refusal(
                f"container {container}: resources.{where}[{key}]={_short(raw)} is not a quantity; "
                "use a whole number"
            ) from None
        if milli < 0 or milli % 1000:
            raise Refusal(
                f"container {container}: resources.{where}[{key}]={_short(raw)}: use a whole "
                "number >= 0"
            )
        values.append(milli // 1000)
    if len(values) == 2 and values[0] != values[1]:
        raise Refusal(
            f"container {container}: resources.limits[{key}]={_short(limits[key])} and "
            f"resources.requests[{key}]={_short(requests[key])} differ: extended resources need "
            "equal requests and limits"
        )
    return values[0]


def _percent(container: str, key: str, value: int) -> int:
    if value > 100:
        raise Refusal(f"container {container}: {key}={value}: a percentage of one GPU, 0..100")
    return value


def _count(container: str, key: str, value: int) -> int:
    if value > MAX_COUNT:
        raise Refusal(
            f"container {container}: {key}={value}: at most {MAX_COUNT} GPUs per container (the "
            "API's limit on the devices of one claim, resource.k8s.io/v1 AllocationResultsMaxSize)"
        )
    return value


@dataclass
class _Ask:
    """One container's request while it is being worked out (see `Shape`)."""

    container: str
    got: dict[str, int]
    count: int = 1
    memory: int | None = None
    memory_percent: int | None = None
    cores: int | None = None
    compute: str | None = None
    notes: list[str] = field(default_factory=list)
    selectors: list[str] = field(default_factory=list)
    mig: bool = False
    same_attribute: str | None = None

    def note(self, key: str, what: str) -> None:
        self.notes.append(f"container {self.container}: {key}={self.got[key]} -> {what}")


def _system_of(
    ask: _Ask, keys: list[str], policy: PodPolicy, settings: TranslationSettings
) -> System:
    """Which system a container's resources come from; Refusal when they mix systems."""
    mig = [k for k in keys if _is_mig(k)]
    if mig and len(keys) > 1:
        raise Refusal(
            f"container {ask.container}: resources {', '.join(keys)}: a device plugin MIG "
            f"resource ({', '.join(mig)}) must be the container's only GPU resource (one MIG "
            "profile per container, as the device plugin gives a container one device type); "
            "split the container or use one resource"
        )
    if mig:
        return "device-plugin"
    shared = [k for k in keys if k in settings.shared_resources]
    systems = {legacy.RESOURCES[k] for k in keys if k in legacy.RESOURCES}
    if shared:
        systems.add("device-plugin")
    if legacy.GPU in ask.got and "hami" in systems:
        systems.discard("device-plugin")  # nvidia.com/gpu with a HAMi companion resource
    elif legacy.GPU in ask.got and "hami" in policy.systems and systems == {"device-plugin"}:
        systems = {"hami"}  # nvidia.com/gpu with HAMi annotations
    if len(systems) > 1 or (shared and len(keys) > 1):
        raise Refusal(
            f"container {ask.container}: resources {', '.join(keys)} mix GPU-sharing systems "
            f"({', '.join(sorted(systems))}); use the names of one system per container"
        )
    return systems.pop()


def _vgpu_manager(ask: _Ask) -> None:
    got, name = ask.got, ask.container
    if legacy.VGPU_NUMBER in got:
        ask.count = _count(name, legacy.VGPU_NUMBER, got[legacy.VGPU_NUMBER])
        ask.note(legacy.VGPU_NUMBER, f"claim of {ask.count} GPU(s)")
    else:
        ask.notes.append(f"container {name}: no {legacy.VGPU_NUMBER} -> claim of 1 GPU")
    if legacy.VGPU_CORES in got:
        ask.cores = _percent(name, legacy.VGPU_CORES, got[legacy.VGPU_CORES])
        ask.note(legacy.VGPU_CORES, f"claim cores {ask.cores} per GPU")
    if legacy.VGPU_MEMORY in got:
        ask.memory = got[legacy.VGPU_MEMORY]
        ask.note(legacy.VGPU_MEMORY, f"claim memory {ask.memory}Mi per GPU")


# MIG profiles as the kubelet plugin publishes them (docs/mig.md, "Published devices": the
# `profile` attribute, NVML's name without "MIG ", e.g. "1g.10gb", "1g.10gb+me"). The device
# plugin's resource names write the '+' as '.' (`nvidia.com/mig-1g.10gb.me`). Digits only, so a
# profile is safe inside a CEL string literal.
_MIG_PROFILE = r"([1-8]g\.[0-9]{1,4}gb)"
_MIG_RESOURCE = re.compile(_MIG_PROFILE + r"(\.me)?")
# GPU feature discovery's product label under the single strategy: "<board>-MIG-<profile>".
_MIG_PRODUCT = re.compile(r".*-MIG-" + _MIG_PROFILE + r"([.+]me)?")


def _attribute(driver: str, name: str) -> str:
    return f'device.attributes["{driver}"].{name}'


def _mig_selector(driver: str, profile: str | None) -> str:
    """MIG devices (of one profile); `has()` first: whole GPUs have no `profile` (docs/mig.md)."""
    attribute = _attribute(driver, "profile")
    if profile is None:
        return f"has({attribute})"
    return f'has({attribute}) && {attribute} == "{profile}"'


def _whole_gpu_selector(driver: str) -> str:
    """Whole GPUs (and their shares): never a MIG device in place of a GPU."""
    return f"!has({_attribute(driver, 'profile')})"


def _device_plugin_gpu(ask: _Ask, driver: str, node_selector: Mapping[str, Any]) -> None:
    """`nvidia.com/gpu` of the device plugin: whole GPUs, or under the `single` MIG strategy (the
    pod's nodeSelector names GPU feature discovery's labels of it) MIG devices."""
    product = node_selector.get(legacy.GPU_PRODUCT_LABEL)
    strategy = node_selector.get(legacy.MIG_STRATEGY_LABEL)
    where = f"nodeSelector {legacy.GPU_PRODUCT_LABEL}={_short(product)}"
    if isinstance(product, str) and "-MIG-" in product:
        match = _MIG_PRODUCT.fullmatch(product)
        if match is None:
            raise Refusal(
                f"container {ask.container}: {legacy.GPU} with {where}: not a MIG profile "
                "(GPU feature discovery labels a single-strategy node <board>-MIG-<g>g.<mem>gb, "
                "e.g. A100-SXM4-40GB-MIG-1g.5gb; -MIG-INVALID marks a node it could not label); "
                "name the profile with nvidia.com/mig-<g>g.<mem>gb instead"
            )
        profile = match.group(1) + ("+me" if match.group(2) else "")
        ask.mig = True
        ask.selectors.append(_mig_selector(driver, profile))
        ask.note(
            legacy.GPU,
            f"claim of {ask.count} MIG device(s) of profile {profile} (the single strategy's "
            f"device on the nodes of {where}; the nodeSelector is kept)",
        )
        return
    if strategy == "single":
        ask.mig = True
        ask.selectors.append(_mig_selector(driver, None))
        ask.same_attribute = "profile"
        ask.note(
            legacy.GPU,
            f"claim of {ask.count} MIG device(s) of one profile (nodeSelector "
            f"{legacy.MIG_STRATEGY_LABEL}=single: the device plugin gives the node's one profile, "
            "and the node is not known at admission: on a static MIG node that is its profile, "
            "on a dynamic one kube-scheduler chooses it; name it with nvidia.com/mig-<profile> "
            f"or nodeSelector {legacy.GPU_PRODUCT_LABEL}=<board>-MIG-<profile> to fix it)",
        )
        return
    ask.selectors.append(_whole_gpu_selector(driver))
    ask.note(legacy.GPU, f"{ask.count} whole GPU(s)")


def _mig_resource(ask: _Ask, key: str, settings: TranslationSettings) -> None:
    """`nvidia.com/mig-<profile>[.shared]`: the device plugin's mixed strategy (N devices), or a
    time-sliced MIG resource (`.shared`, or one declared in `shared_resources`): one device,
    exclusive, since vgpu-dra has no shares of a MIG device (docs/mig.md)."""
    name = key[len(legacy.MIG_RESOURCE_PREFIX) :]
    renamed = name.endswith(legacy.SHARED_SUFFIX)
    if renamed:
        name = name[: -len(legacy.SHARED_SUFFIX)]
    match = _MIG_RESOURCE.fullmatch(name)
    if match is None:
        raise Refusal(
            f"container {ask.container}: {_short(key)}: not a MIG resource vgpu-dra can map: "
            "the device plugin's mixed strategy names nvidia.com/mig-<g>g.<mem>gb (e.g. "
            "nvidia.com/mig-1g.10gb), nvidia.com/mig-<g>g.<mem>gb.me for a +me profile, and "
            "time-slicing adds .shared; other profile attributes (+gfx, -me, +me.all) are not "
            "published by vgpu-dra"
        )
    profile = match.group(1) + ("+me" if match.group(2) else "")
    amount = ask.got[key]
    ask.mig = True
    ask.selectors.append(_mig_selector(settings.driver, profile))
    replicas = settings.shared_resources.get(key)
    if not renamed and replicas is None:
        ask.count = _count(ask.container, key, amount)
        ask.note(key, f"claim of {ask.count} MIG device(s) of profile {profile}")
        return
    if replicas is not None and amount > replicas:
        raise Refusal(
            f"container {ask.container}: {key}={amount}: at most {replicas} shares (the "
            "replicas of one MIG device)"
        )
    ask.count = 1 if amount else 0
    ask.note(
        key,
        f"claim of 1 MIG device of profile {profile}, exclusive: vgpu-dra has no shares of a "
        "MIG device yet, so one such pod runs per instance where the device plugin ran "
        f"{replicas or 'its replicas'}",
    )


def _hami_mig(ask: _Ask, driver: str) -> None:
    """HAMi's `nvidia.com/vgpu-mode: mig`: N MIG instances, each with at least `gpumem` MiB."""
    got, name = ask.got, ask.container
    if legacy.HAMI_MEMORY_PERCENTAGE in got:
        raise Refusal(
            f"container {name}: {legacy.HAMI_MEMORY_PERCENTAGE} with annotation "
            f"{legacy.HAMI_VGPU_MODE}=mig: a MIG instance's memory is its profile's; give "
            f"{legacy.HAMI_MEMORY} (MiB, the least an instance must have) instead"
        )
    if ask.count == 0:  # left to the common zero rule (refused with memory or cores)
        ask.memory, ask.cores = got.get(legacy.HAMI_MEMORY), got.get(legacy.HAMI_CORES)
        return
    ask.mig = True
    ask.selectors.append(_mig_selector(driver, None))
    ask.note(legacy.GPU, f"claim of {ask.count} MIG device(s)")
    if legacy.HAMI_MEMORY in got:
        mib = got[legacy.HAMI_MEMORY]
        if not 0 < mib <= MAX_MEMORY_MIB:
            raise Refusal(
                f"container {name}: GPU memory {mib} MiB: give 1..{MAX_MEMORY_MIB} MiB, or "
                "leave it out for any MIG instance"
            )
        attribute = _attribute(driver, "memoryBytes")
        ask.selectors.append(f"has({attribute}) && {attribute} >= {mib * 1024 * 1024}")
        ask.note(legacy.HAMI_MEMORY, f"MIG devices of at least {mib} MiB each")
    if legacy.HAMI_CORES in got:
        ask.note(
            legacy.HAMI_CORES,
            "not reserved: a MIG instance's SMs are its own, fixed by its profile",
        )


def _hami_or_whole(
    ask: _Ask,
    system: System,
    policy: PodPolicy,
    driver: str,
    node_selector: Mapping[str, Any],
) -> None:
    got, name = ask.got, ask.container
    ask.count = _count(name, legacy.GPU, got.get(legacy.GPU, 1))
    if system == "device-plugin":
        _device_plugin_gpu(ask, driver, node_selector)
        return
    mode = policy.get("vgpu_mode")
    if mode == "mps":
        raise Refusal(
            f"annotation {legacy.HAMI_VGPU_MODE}=mps: vgpu-dra has no MPS sharing; use mig "
            "(MIG instances), hami-core (shares of whole GPUs), or leave it out"
        )
    if mode == "mig":
        _hami_mig(ask, driver)
        return
    if mode == "hami-core":
        ask.selectors.append(_whole_gpu_selector(driver))
        ask.notes.append(
            f"container {name}: annotation {legacy.HAMI_VGPU_MODE}=hami-core -> whole GPUs or "
            "shares of them, never a MIG device"
        )
    if legacy.GPU in got:
        ask.note(legacy.GPU, f"claim of {ask.count} GPU(s)")
    else:  # HAMi's default GPU count
        ask.notes.append(f"container {name}: no {legacy.GPU} -> claim of 1 GPU")
    if legacy.HAMI_MEMORY in got and legacy.HAMI_MEMORY_PERCENTAGE in got:
        raise Refusal(
            f"container {name}: {legacy.HAMI_MEMORY} and {legacy.HAMI_MEMORY_PERCENTAGE} "
            "cannot be used together (as in HAMi): keep one"
        )
    if legacy.HAMI_MEMORY in got:
        ask.memory = got[legacy.HAMI_MEMORY]
        ask.note(legacy.HAMI_MEMORY, f"claim memory {ask.memory}Mi per GPU")
    if legacy.HAMI_MEMORY_PERCENTAGE in got:
        percent = _memory_percentage(
            name, legacy.HAMI_MEMORY_PERCENTAGE, got[legacy.HAMI_MEMORY_PERCENTAGE]
        )
        if percent is None:
            ask.note(legacy.HAMI_MEMORY_PERCENTAGE, "the whole memory of each GPU")
        else:
            ask.memory_percent = percent
            ask.note(
                legacy.HAMI_MEMORY_PERCENTAGE,
                f"claim annotation {legacy.CANONICAL['memory_percentage']}={percent}: {percent} % "
                "of the memory of each GPU the allocation controller chooses",
            )
    if legacy.HAMI_CORES in got:
        ask.cores = _percent(name, legacy.HAMI_CORES, got[legacy.HAMI_CORES])
        ask.note(legacy.HAMI_CORES, f"claim cores {ask.cores} per GPU")


def _gpu_manager(ask: _Ask, policy: PodPolicy) -> None:
    got, name = ask.got, ask.container
    core = got.get(legacy.VCUDA_CORE)
    total = got.get(legacy.VCUDA_MEMORY)
    if core is None:
        raise Refusal(
            f"container {name}: {legacy.VCUDA_MEMORY} needs {legacy.VCUDA_CORE} (100 per "
            "whole GPU, below 100 a share)"
        )
    if core == 0:
        ask.count, ask.memory = 0, total
    elif core >= 100:
        if core % 100:
            raise Refusal(
                f"container {name}: {legacy.VCUDA_CORE}={core}: use a multiple of 100 "
                "(whole GPUs) or a value below 100 (a share of one GPU)"
            )
        ask.count = _count(name, legacy.VCUDA_CORE, core // 100)
        ask.note(legacy.VCUDA_CORE, f"{ask.count} whole GPU(s)")
        if total is not None:
            # gpu-manager's vcuda-memory is the container's total: split evenly per GPU.
            if total % ask.count:
                raise Refusal(
                    f"container {name}: {legacy.VCUDA_MEMORY}={total} MiB cannot be split "
                    f"evenly over {ask.count} GPUs: use a multiple of {ask.count}"
                )
            ask.memory, ask.cores = total // ask.count, 100
            ask.note(legacy.VCUDA_MEMORY, f"claim memory {ask.memory}Mi per GPU")
    else:
        ask.cores = core
        ask.note(legacy.VCUDA_CORE, f"claim of 1 GPU, cores {core}")
        if total is not None:
            ask.memory = total
            ask.note(legacy.VCUDA_MEMORY, f"claim memory {total}Mi")
        limit = policy.get("core_limit")
        if limit is None:
            ask.compute = "balance"
            ask.notes.append(
                f"container {name}: no nvidia.com/vcuda-core-limit (a soft limit) -> "
                "computePolicy balance"
            )
        elif int(limit) == core:
            ask.compute = "fixed"
            ask.notes.append(
                f"container {name}: nvidia.com/vcuda-core-limit={limit} -> computePolicy fixed"
            )
        else:
            raise Refusal(
                f"container {name}: nvidia.com/vcuda-core-limit={limit} differs from "
                f"{legacy.VCUDA_CORE}={core}: the cap is the reserved share here; set the "
                "limit equal to vcuda-core (hard cap) or leave it out (soft cap)"
            )


def _shared(ask: _Ask, key: str, settings: TranslationSettings) -> None:
    replicas = settings.shared_resources[key]
    shares = ask.got[key]
    if shares > replicas:
        raise Refusal(
            f"container {ask.container}: {key}={shares}: at most {replicas} shares (the "
            "replicas of one GPU)"
        )
    ask.count = 1 if shares else 0
    ask.cores = shares * 100 // replicas
    ask.note(key, f"claim of 1 GPU, cores {ask.cores} ({shares}/{replicas} of it)")
    per_share = settings.shared_memory_mib.get(key)
    if per_share:
        ask.memory = per_share * shares
        ask.notes.append(f"container {ask.container}: {key} -> claim memory {ask.memory}Mi")
    else:
        ask.notes.append(
            f"container {ask.container}: {key} -> no memory per share configured for this "
            "shared resource: the share reserves the GPU's whole memory, so one such pod runs "
            "per GPU"
        )


def _pod_memory_percentage(ask: _Ask, policy: PodPolicy) -> None:
    """The pod's `vgpu.dra.dev/memory-percentage` for a container that names no memory."""
    raw = policy.get("memory_percentage")
    percent = None if raw is None else _memory_percentage(ask.container, "(pod)", int(raw))
    if percent is None:
        return
    key = legacy.CANONICAL["memory_percentage"]
    if ask.memory is not None:
        raise Refusal(
            f"container {ask.container}: GPU memory {ask.memory} MiB and annotation "
            f"{key}={percent} cannot be used together: keep one"
        )
    if ask.memory_percent is not None and ask.memory_percent != percent:
        raise Refusal(
            f"container {ask.container}: {legacy.HAMI_MEMORY_PERCENTAGE}={ask.memory_percent} "
            f"and annotation {key}={percent} contradict each other: keep one"
        )
    if ask.memory_percent is None:
        ask.memory_percent = percent
        ask.notes.append(
            f"container {ask.container}: annotation {key}={percent} -> {percent} % of the memory "
            "of each GPU the allocation controller chooses"
        )


def _container_shape(
    container: Mapping[str, Any],
    keys: list[str],
    policy: PodPolicy,
    settings: TranslationSettings,
    node_selector: Mapping[str, Any],
) -> tuple[System, Shape | None]:
    """The system and shape of one container's legacy request (shape None: it asks for no GPU,
    a count of 0, and gets no claim at all)."""
    name = str(container.get("name") or "")
    limits, requests = _resources(container)
    ask = _Ask(name, {k: _amount(name, k, limits, requests) for k in keys})
    system = _system_of(ask, keys, policy, settings)
    if system == "vgpu-manager":
        _vgpu_manager(ask)
    elif system == "gpu-manager":
        _gpu_manager(ask, policy)
    elif _is_mig(keys[0]):
        _mig_resource(ask, keys[0], settings)
    elif keys[0] in settings.shared_resources:
        _shared(ask, keys[0], settings)
    else:
        _hami_or_whole(ask, system, policy, settings.driver, node_selector)
    if ask.count == 0:
        # What every source system does with a zero: no device for the container.
        if ask.memory or ask.cores or ask.memory_percent:
            raise Refusal(
                f"container {name}: 0 GPUs requested together with memory or cores "
                f"({', '.join(keys)}): ask for at least 1 GPU or drop the others"
            )
        return system, None
    if ask.mig and policy.get("memory_percentage") not in (None, "100"):
        key = policy.keys.get("memory_percentage", legacy.CANONICAL["memory_percentage"])
        raise Refusal(
            f"container {name}: annotation {key}={policy.get('memory_percentage')} with a MIG "
            f"request ({', '.join(keys)}): a MIG device's memory is its profile's; remove the "
            "annotation or ask for a GPU share"
        )
    _pod_memory_percentage(ask, policy)
    if ask.memory is not None and not 0 < ask.memory <= MAX_MEMORY_MIB:
        raise Refusal(
            f"container {name}: GPU memory {ask.memory} MiB: give 1..{MAX_MEMORY_MIB} MiB, or "
            "leave it out for the whole memory"
        )
    return system, Shape(
        system=system,
        count=ask.count,
        memory_mib=ask.memory,
        memory_percent=ask.memory_percent,
        cores=ask.cores or None,
        compute_policy=ask.compute,
        removed=tuple(keys),
        notes=tuple(ask.notes),
        selectors=tuple(ask.selectors),
        mig=ask.mig,
        same_attribute=ask.same_attribute if ask.count > 1 else None,
    )


def _memory_percentage(container: str, key: str, percent: int) -> int | None:
    """A percentage of each GPU's memory: None for 100 (the whole memory: no request at all),
    else the percentage, which the claim carries as an annotation that only the allocation
    controller (policy path) honours, since it needs the size of the GPU chosen."""
    if not 1 <= percent <= 100:
        raise Refusal(
            f"container {container}: {key}={percent}: a percentage of each GPU's memory, 1..100"
        )
    return None if percent == 100 else percent


# ----------------------------------------------------------------------------- claim templates


def _regex_alternatives(items: Iterable[str]) -> str:
    return "|".join(item.replace(".", "[.]") for item in items)


_SELECTED = {
    "include_types": ("productName", "GPU types"),
    "exclude_types": ("productName", "GPU types"),
    "include_uuids": ("uuid", "GPU UUIDs"),
    "exclude_uuids": ("uuid", "GPU UUIDs"),
}


def _selector(concept: Concept, items: tuple[str, ...], driver: str, mig: bool = False) -> str:
    """The CEL expression of one include/exclude list: GPU types match as case-insensitive
    substrings of productName, UUIDs whole. A MIG request matches GPU UUIDs against its devices'
    parentUUID (guarded: whole GPUs have none)."""
    attribute, _ = _SELECTED[concept]
    if attribute == "productName":
        pattern = f"({_regex_alternatives(items)})"
    else:
        pattern = f"^({'|'.join(items)})$"
    if attribute == "uuid" and mig:
        path = _attribute(driver, "parentUUID")
        expression = f'(has({path}) && {path}.matches("(?i){pattern}"))'
    else:
        expression = f'device.attributes["{driver}"].{attribute}.matches("(?i){pattern}")'
    return "!" + expression if concept.startswith("exclude") else expression


def _selectors(policy: PodPolicy, driver: str, mig: bool = False) -> list[JSON]:
    out: list[JSON] = []
    concepts: tuple[Concept, ...] = (
        "include_types",
        "exclude_types",
        "include_uuids",
        "exclude_uuids",
    )
    for concept in concepts:
        items = policy.items(concept)
        if not items:
            continue
        expression = _selector(concept, items, driver, mig)
        size = len(expression.encode())
        if size > CEL_SELECTOR_MAX_LENGTH:
            key = policy.keys.get(concept, legacy.CANONICAL[concept])
            _, what = _SELECTED[concept]
            raise Refusal(
                f"annotation {key}: its {len(items)} {what} become a CEL selector of {size} "
                f"bytes in the claim, above the API's limit of {CEL_SELECTOR_MAX_LENGTH} bytes "
                "per selector expression (resource.k8s.io/v1); list fewer or shorter ones "
                "(GPU types match as case-insensitive substrings: 'A100' matches every A100 "
                "model)"
            )
        out.append({"cel": {"expression": expression}})
    return out


def _compute_policy(shape: Shape, policy: PodPolicy, settings: TranslationSettings) -> str | None:
    chosen = policy.get("compute_policy")
    if shape.compute_policy and chosen and chosen != shape.compute_policy:
        raise Refusal(
            f"annotation compute policy {chosen!r} contradicts nvidia.com/vcuda-core-limit "
            f"(which means {shape.compute_policy!r}): keep one of them"
        )
    return chosen or shape.compute_policy or settings.default_compute_policy


def _template(shape: Shape, policy: PodPolicy, settings: TranslationSettings) -> ClaimTemplate:
    if not 1 <= shape.count <= MAX_COUNT:  # a bug: the shapes above never hold one
        raise ValueError(f"a claim template for {shape.count} GPUs")
    exactly: JSON = {
        "deviceClassName": settings.device_class,
        "allocationMode": "ExactCount",
        "count": shape.count,
    }
    # The shape's own selectors first: a MIG request's `has(profile)` is false on whole GPUs
    # before any other selector reads an attribute they lack.
    selectors = [{"cel": {"expression": e}} for e in shape.selectors]
    selectors += _selectors(policy, settings.driver, shape.mig)
    if selectors:
        exactly["selectors"] = selectors
    capacity: JSON = {}
    if shape.memory_mib is not None:
        capacity[names.CAPACITY_MEMORY] = f"{shape.memory_mib}Mi"
    if shape.cores is not None:
        capacity[names.CAPACITY_CORES] = str(shape.cores)
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    devices: JSON = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
    attribute = legacy.STRICT_TOPOLOGY_ATTRIBUTE.get(policy.get("topology") or "")
    same = [a for a in (attribute, shape.same_attribute) if a] if shape.count > 1 else []
    if same:
        devices["constraints"] = [
            {"requests": [REQUEST_NAME], "matchAttribute": f"{settings.driver}/{a}"} for a in same
        ]
    compute = _compute_policy(shape, policy, settings)
    if compute:
        parameters = {
            "apiVersion": names.CONFIG_API_VERSION,
            "kind": names.CONFIG_KIND,
            "computePolicy": compute,
        }
        config.parse_config(parameters)  # the kubelet plugin's own validator
        devices["config"] = [
            {
                "requests": [REQUEST_NAME],
                "opaque": {"driver": settings.driver, "parameters": parameters},
            }
        ]
    spec: JSON = {"spec": {"devices": devices}}
    if shape.memory_percent is not None:
        # Carried by every claim made from the template (contract with the allocator: a request
        # of our driver that names no memory consumes this share of the chosen device's memory).
        spec["metadata"] = {
            "annotations": {legacy.CANONICAL["memory_percentage"]: str(shape.memory_percent)}
        }
    return ClaimTemplate(
        name=template_name(spec),
        spec=spec,
        labels={legacy.MANAGED_BY_LABEL: legacy.MANAGED_BY_VALUE},
    )


def template_name(spec: Mapping[str, Any]) -> str:
    """Deterministic from the content: identical shapes share one template."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:TEMPLATE_HASH_CHARS]
    return TEMPLATE_PREFIX + digest


def is_webhook_template(name: str) -> bool:
    return bool(_TEMPLATE_NAME.match(name))


# ----------------------------------------------------------------------------- the pod


def _escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def _claim_name(container: str, taken: set[str]) -> str:
    name = CLAIM_PREFIX + container
    if len(name) > MAX_NAME or name in taken:
        name = CLAIM_PREFIX + hashlib.sha256(container.encode()).hexdigest()[:12]
    n = 1
    base = name
    while name in taken:
        name = f"{base}-{n}"
        n += 1
    taken.add(name)
    return name


def _without(mapping: Mapping[str, Any], keys: Iterable[str]) -> JSON:
    drop = set(keys)
    return {k: v for k, v in mapping.items() if k not in drop}


def needs_translation(pod: Mapping[str, Any], settings: TranslationSettings) -> bool:
    """Cheap pre-check, the Python twin of `match_conditions()`."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") == legacy.VGPU_SCHEDULER:
        return True
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if any(key in legacy.ANNOTATION_BY_KEY for key in annotations):
        return True
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if _legacy_keys(container, settings):
            return True
    return False


@dataclass
class _Work:
    """The translation of one pod as it is built up."""

    patch: list[JSON] = field(default_factory=list)
    templates: dict[str, ClaimTemplate] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    systems: list[str] = field(default_factory=list)  # per translated container
    # A claim carries a memory percentage, which only the allocation controller honours.
    memory_percent: bool = False


def _translate_containers(
    spec: Mapping[str, Any], policy: PodPolicy, settings: TranslationSettings, work: _Work
) -> None:
    """Per container: a claim from a template instead of the legacy resources."""
    existing_claims = list(spec.get("resourceClaims") or [])
    taken = {str(c.get("name")) for c in existing_claims}
    node_selector = spec.get("nodeSelector")
    if not isinstance(node_selector, Mapping):
        node_selector = {}
    new_claims: list[JSON] = []
    for field_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field_name) or []):
            keys = _legacy_keys(container, settings)
            if not keys:
                continue
            system, shape = _container_shape(container, keys, policy, settings, node_selector)
            res = dict(container.get("resources") or {})
            limits, requests = _resources(container)
            new_res = _without(res, ("limits", "requests"))
            if _without(limits, keys):
                new_res["limits"] = _without(limits, keys)
            if _without(requests, keys):
                new_res["requests"] = _without(requests, keys)
            work.systems.append(system)
            if shape is None:
                work.warnings.append(
                    f"container {container.get('name')}: {', '.join(keys)} ask for no GPU: "
                    "removed, the container gets none"
                )
            else:
                template = _template(shape, policy, settings)
                work.templates.setdefault(template.name, template)
                work.memory_percent |= shape.memory_percent is not None
                claim = _claim_name(str(container.get("name") or index), taken)
                new_claims.append({"name": claim, "resourceClaimTemplateName": template.name})
                new_res["claims"] = [*(res.get("claims") or []), {"name": claim}]
                work.warnings.extend(shape.notes)
            work.patch.append(
                {"op": "add", "path": f"/spec/{field_name}/{index}/resources", "value": new_res}
            )
    if not new_claims:
        return
    if spec.get("resourceClaims"):  # append; absent, null or empty: set the whole list
        work.patch.extend(
            {"op": "add", "path": "/spec/resourceClaims/-", "value": c} for c in new_claims
        )
    else:
        work.patch.append({"op": "add", "path": "/spec/resourceClaims", "value": new_claims})


def _translate_annotations(meta: Mapping[str, Any], policy: PodPolicy, work: _Work) -> str:
    """Our canonical annotation names for the policies the pod asks for; returns the source."""
    annotations = dict(meta.get("annotations") or {})
    # A concept already given under one of our names (short or long) is left as the user wrote it.
    ours = {
        entry.concept
        for entry in map(legacy.ANNOTATION_BY_KEY.get, annotations)
        if entry is not None and entry.system == "vgpu-dra"
    }
    wanted: dict[str, str] = {
        legacy.CANONICAL[concept]: value
        for concept, value in policy.values.items()
        if concept in legacy.CONTROLLER_CONCEPTS and concept not in ours
    }
    foreign = policy.systems - {"vgpu-dra"}
    source = work.systems[0] if work.systems else min(foreign, default="vgpu-dra")
    if (work.patch or foreign) and legacy.TRANSLATED_FROM not in annotations:
        wanted[legacy.TRANSLATED_FROM] = source
    added = {k: v for k, v in wanted.items() if k not in annotations}
    if added and meta.get("annotations"):
        work.patch.extend(
            {"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v}
            for k, v in sorted(added.items())
        )
    elif added:
        work.patch.append({"op": "add", "path": "/metadata/annotations", "value": added})
    _annotations_fit({**annotations, **added}, added)
    work.warnings.extend(
        f"annotation {k}={v} set for the allocation controller"
        for k, v in sorted(added.items())
        if k != legacy.TRANSLATED_FROM
    )
    return str(annotations.get(legacy.TRANSLATED_FROM) or source)


def _annotations_fit(annotations: Mapping[str, Any], added: Mapping[str, str]) -> None:
    """The pod's annotations after the patch within the API's total, or a Refusal that says so
    (the API server would refuse the translated pod with a message naming none of ours)."""
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size <= ANNOTATIONS_MAX_BYTES:
        return
    copied = ", ".join(sorted(k for k in added if k != legacy.TRANSLATED_FROM)) or "none"
    raise Refusal(
        f"the pod's annotations would total {size} bytes once translated, above the API's "
        f"limit of {ANNOTATIONS_MAX_BYTES} bytes (metadata.annotations, keys and values); the "
        f"webhook adds {copied} (copies of the pod's policy annotations under their "
        "vgpu.dra.dev names): shorten the annotations, or write the policy under its "
        "vgpu.dra.dev name only"
    )


def _onto_policy_path(spec: Mapping[str, Any], policy: PodPolicy, work: _Work) -> None:
    """vgpu-scheduler -> the default scheduler; policies the default path cannot honour (and
    memory percentages: kube-scheduler cannot size them) -> gate."""
    vgpu_scheduler = spec.get("schedulerName") == legacy.VGPU_SCHEDULER
    if vgpu_scheduler:
        work.patch.append(
            {"op": "replace", "path": "/spec/schedulerName", "value": DEFAULT_SCHEDULER}
        )
        work.warnings.append(
            f"schedulerName {legacy.VGPU_SCHEDULER} -> {DEFAULT_SCHEDULER}, placed by the vgpu-dra "
            "allocation controller (policy path)"
        )
    # Device selection is in our templates' CEL; the pod's own claims need the controller for it.
    native_claims = any(
        not is_webhook_template(str(c.get("resourceClaimTemplateName") or ""))
        for c in spec.get("resourceClaims") or []
    )
    gated = any(g.get("name") == GATE for g in spec.get("schedulingGates") or [])
    if gated or not (
        vgpu_scheduler
        or policy.wants_policy_path
        or (policy.selects_devices and native_claims)
        or work.memory_percent
    ):
        return
    gate = {"name": GATE}
    if spec.get("schedulingGates"):
        work.patch.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    else:
        work.patch.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    work.warnings.append(f"scheduling gate {GATE} added: the allocation controller places this pod")


def _unapplied_memory_percentage(spec: Mapping[str, Any], policy: PodPolicy, work: _Work) -> None:
    """The pod's memory percentage goes into the claims the webhook writes; a pod with none
    (and none written before: a translated pod admitted again) is refused: the user's own
    claims must carry it themselves, and silently giving them the whole memory would not do."""
    percent = policy.get("memory_percentage")
    if percent is None or int(percent) == 100 or work.memory_percent:
        return
    if any(
        is_webhook_template(str(c.get("resourceClaimTemplateName") or ""))
        for c in spec.get("resourceClaims") or []
    ):
        return
    key = legacy.CANONICAL["memory_percentage"]
    raise Refusal(
        f"annotation {key}={percent}: on a pod it applies to the claims the webhook writes for "
        "legacy GPU resources, and this pod has none; annotate the pod's own ResourceClaims "
        "or ResourceClaimTemplates with it instead (their pod "
        f"needs the scheduling gate {GATE}: only the allocation controller honours it)"
    )


def _unapplied_compute_policy(spec: Mapping[str, Any], policy: PodPolicy, work: _Work) -> None:
    """A compute policy goes into the VgpuConfig of the claims the webhook writes; on a pod with
    none, it would change nothing, which the user is told rather than left to find out."""
    if policy.get("compute_policy") is None and policy.get("core_limit") is None:
        return
    if work.templates or any(
        is_webhook_template(str(c.get("resourceClaimTemplateName") or ""))
        for c in spec.get("resourceClaims") or []
    ):
        return
    work.warnings.append(
        "the pod's compute policy annotation applies to the claims the webhook writes for legacy "
        "GPU resources, and this pod has none: set computePolicy in the VgpuConfig of its own "
        "claims (or of the DeviceClass) instead"
    )


def translate_pod(pod: Mapping[str, Any], settings: TranslationSettings) -> Translation | None:
    """The patch that turns a legacy pod into a DRA pod; None when there is nothing to change or
    say (a Translation may carry only warnings, with an empty patch)."""
    if not needs_translation(pod, settings):
        return None
    policy = read_pod_policy(pod)
    spec = pod.get("spec") or {}
    work = _Work()
    _translate_containers(spec, policy, settings, work)
    source = _translate_annotations(pod.get("metadata") or {}, policy, work)
    _onto_policy_path(spec, policy, work)
    _unapplied_compute_policy(spec, policy, work)
    _unapplied_memory_percentage(spec, policy, work)
    if not work.patch and not work.warnings:
        return None
    return Translation(
        patch=work.patch,
        templates=list(work.templates.values()),
        warnings=work.warnings,
        source=source,
    )


# ----------------------------------------------------------------------------- matchConditions


def _cel_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in sorted(items)) + "]"


def match_conditions(settings: TranslationSettings) -> list[JSON]:
    """The MutatingWebhookConfiguration's `matchConditions`: only pods that `needs_translation`
    accepts reach the webhook (generated from the same tables, so the two cannot drift)."""
    resources = _cel_list({*legacy.RESOURCES, *settings.shared_resources})
    annotations = _cel_list(legacy.ANNOTATION_BY_KEY)

    prefixes = " || ".join(
        f"r.startsWith({json.dumps(p)})" for p in sorted(legacy.RESOURCE_PREFIXES)
    )

    def named(part: str) -> str:
        """The container's limits or requests name a legacy resource, or one with a prefix."""
        where = f"c.resources.{part}"
        return (
            f"(has({where}) && ({resources}.exists(r, r in {where}) || "
            f"{where}.exists(r, {prefixes})))"
        )

    def containers(field_name: str) -> str:
        per_container = f"has(c.resources) && ({named('limits')} || {named('requests')})"
        return (
            f"(has(object.spec.{field_name}) && "
            f"object.spec.{field_name}.exists(c, {per_container}))"
        )

    expression = " || ".join(
        [
            "(has(object.spec.schedulerName) && "
            f'object.spec.schedulerName == "{legacy.VGPU_SCHEDULER}")',
            "(has(object.metadata.annotations) && "
            f"{annotations}.exists(a, a in object.metadata.annotations))",
            containers("containers"),
            containers("initContainers"),
        ]
    )
    return [{"name": "vgpu-dra-legacy-gpu-pods", "expression": expression}]
