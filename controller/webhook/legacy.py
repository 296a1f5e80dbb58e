"""Every name other GPU-sharing systems (and our own annotations) use, in one table.

The translator, the pod validator, the webhook's `matchConditions` and the migration docs test all
read these tables, so a name added here is translated, validated, routed to the webhook and
documented together, and the four can never drift apart.

Sources (their public READMEs, checked 2026-11):
- vgpu-manager (coldzerofear/vgpu-manager README "Example of use", "Scheduling Policy", "Select
  Devices", "Compute Policy", docs/how_to_use_gpu_topology.md);
- HAMi (Project-HAMi README "Usage" and docs "Allocate device memory by percentage");
- gpu-manager, the fork with `nvidia.com/` names (coldzerofear/gpu-manager README: memory is
  registered in MiB, "以MB为单位注册"; tkestack's original uses `tencent.com/` names and 256 MiB
  units, which we do not translate);
- NVIDIA's device plugin (`nvidia.com/gpu`; shared resources renamed with replicas; MIG: the
  `mixed` strategy's `nvidia.com/mig-<profile>` resources, whose name is "mig-" + the NVML profile
  with '+' written '.' (internal/rm/rm.go AddDefaultResourcesToConfig), time-slicing's
  `renameByDefault` suffix `.shared`, and GPU feature discovery's node labels
  `nvidia.com/mig.strategy` and `nvidia.com/gpu.product`, e.g. `A100-SXM4-40GB-MIG-1g.5gb`, under
  the `single` strategy, docs/gfd_labels.md);
- HAMi's dynamic MIG (docs/dynamic-mig-support.md: `nvidia.com/gpu` + `nvidia.com/gpumem` with
  the optional pod annotation `nvidia.com/vgpu-mode: mig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from dra_driver.allocator.request import ANNOTATION_PREFIX

System = Literal["vgpu-manager", "hami", "gpu-manager", "device-plugin", "vgpu-dra"]

# The scheduler vgpu-manager pods name; it does not exist on a vgpu-dra cluster.
VGPU_SCHEDULER = "vgpu-scheduler"

# ----------------------------------------------------------------------------- resources

GPU = "nvidia.com/gpu"  # device plugin (whole GPUs) or HAMi (vGPUs), told apart by companions

VGPU_NUMBER = "nvidia.com/vgpu-number"  # vgpu-manager: GPUs
VGPU_CORES = "nvidia.com/vgpu-cores"  # vgpu-manager: % of each GPU's SMs
VGPU_MEMORY = "nvidia.com/vgpu-memory"  # vgpu-manager: MiB per GPU

HAMI_MEMORY = "nvidia.com/gpumem"  # HAMi: MiB per GPU
HAMI_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"  # HAMi: % of each GPU's memory
HAMI_CORES = "nvidia.com/gpucores"  # HAMi: % of each GPU's SMs

VCUDA_CORE = "nvidia.com/vcuda-core"  # gpu-manager: 100 per whole GPU, < 100 a share
VCUDA_MEMORY = "nvidia.com/vcuda-memory"  # gpu-manager (nvidia.com fork): MiB

# Resource names matched by prefix (name -> the system): the device plugin's MIG resources, one per
# profile of the node's boards (`nvidia.com/mig-1g.10gb`, `nvidia.com/mig-1g.10gb.me` for the
# `1g.10gb+me` profile, `nvidia.com/mig-3g.20gb.shared` when time-sliced with renameByDefault).
# A prefix, not a list: the profiles are the boards', and a pod naming one no table here knows
# must still reach the webhook (to be translated or refused by name), never be admitted as it is.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
RESOURCE_PREFIXES: dict[str, System] = {MIG_RESOURCE_PREFIX: "device-plugin"}
SHARED_SUFFIX = ".shared"  # the device plugin's renameByDefault suffix

# GPU feature discovery's node labels (device plugin `single` strategy), read from a pod's
# nodeSelector to know which MIG profile `nvidia.com/gpu` stands for.
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# Resource name -> the system it belongs to. `nvidia.com/gpu` is listed under the device plugin;
# with a HAMi companion (resource or annotation) it is HAMi's.
RESOURCES: dict[str, System] = {
    VGPU_NUMBER: "vgpu-manager",
    VGPU_CORES: "vgpu-manager",
    VGPU_MEMORY: "vgpu-manager",
    GPU: "device-plugin",
    HAMI_MEMORY: "hami",
    HAMI_MEMORY_PERCENTAGE: "hami",
    HAMI_CORES: "hami",
    VCUDA_CORE: "gpu-manager",
    VCUDA_MEMORY: "gpu-manager",
}

# ----------------------------------------------------------------------------- annotations

Concept = Literal[
    "node_policy",
    "device_policy",
    "topology",
    "include_types",
    "exclude_types",
    "include_uuids",
    "exclude_uuids",
    "compute_policy",
    "core_limit",
    "memory_percentage",
    "vgpu_mode",
]


@dataclass(frozen=True, slots=True)
class Annotation:
    key: str
    system: System
    concept: Concept


def _ours(name: str) -> str:
    return ANNOTATION_PREFIX + name


# Our name for each concept. For the concepts the controller reads these are the long names of
# the allocation-controller issue, which controller.reconciler.ALIASES maps onto the allocator's
# short names. compute_policy (and gpu-manager's core limit) go into the claim's VgpuConfig
# instead; the memory percentage becomes an annotation of the claim (its template's
# spec.metadata), which the allocation controller reads.
CANONICAL: dict[Concept, str] = {
    "node_policy": _ours("node-scheduler-policy"),
    "device_policy": _ours("device-scheduler-policy"),
    "topology": _ours("device-topology-mode"),
    "include_types": _ours("include-gpu-type"),
    "exclude_types": _ours("exclude-gpu-type"),
    "include_uuids": _ours("include-gpu-uuid"),
    "exclude_uuids": _ours("exclude-gpu-uuid"),
    "compute_policy": _ours("compute-policy"),
    "memory_percentage": _ours("memory-percentage"),
}

# The concepts the allocation controller reads from pod annotations (and so the webhook writes):
# all but those the webhook turns into the claim itself (its VgpuConfig and capacity requests).
CLAIM_CONCEPTS: frozenset[Concept] = frozenset(
    {"compute_policy", "core_limit", "memory_percentage", "vgpu_mode"}
)
CONTROLLER_CONCEPTS: frozenset[Concept] = frozenset(get_args(Concept)) - CLAIM_CONCEPTS

ANNOTATIONS: tuple[Annotation, ...] = (
    # vgpu-manager
    Annotation("nvidia.com/node-scheduler-policy", "vgpu-manager", "node_policy"),
    Annotation("nvidia.com/device-scheduler-policy", "vgpu-manager", "device_policy"),
    Annotation("nvidia.com/device-topology-mode", "vgpu-manager", "topology"),
    Annotation("nvidia.com/include-gpu-type", "vgpu-manager", "include_types"),
    Annotation("nvidia.com/exclude-gpu-type", "vgpu-manager", "exclude_types"),
    Annotation("nvidia.com/include-gpu-uuid", "vgpu-manager", "include_uuids"),
    Annotation("nvidia.com/exclude-gpu-uuid", "vgpu-manager", "exclude_uuids"),
    Annotation("nvidia.com/vgpu-compute-policy", "vgpu-manager", "compute_policy"),
    # HAMi
    Annotation("nvidia.com/use-gputype", "hami", "include_types"),
    Annotation("nvidia.com/nouse-gputype", "hami", "exclude_types"),
    Annotation("nvidia.com/use-gpuuuid", "hami", "include_uuids"),
    Annotation("nvidia.com/nouse-gpuuuid", "hami", "exclude_uuids"),
    Annotation("hami.io/node-scheduler-policy", "hami", "node_policy"),
    Annotation("hami.io/gpu-scheduler-policy", "hami", "device_policy"),
    Annotation("nvidia.com/vgpu-mode", "hami", "vgpu_mode"),  # HAMI_VGPU_MODE
    # gpu-manager
    Annotation("nvidia.com/vcuda-core-limit", "gpu-manager", "core_limit"),
    # vgpu-dra: the long names (canonical) and the allocator's short names
    *(Annotation(key, "vgpu-dra", concept) for concept, key in CANONICAL.items()),
    Annotation(_ours("node-policy"), "vgpu-dra", "node_policy"),
    Annotation(_ours("device-policy"), "vgpu-dra", "device_policy"),
    Annotation(_ours("topology"), "vgpu-dra", "topology"),
    Annotation(_ours("gpu-type"), "vgpu-dra", "include_types"),
    Annotation(_ours("gpu-uuid"), "vgpu-dra", "include_uuids"),
)

ANNOTATION_BY_KEY: dict[str, Annotation] = {a.key: a for a in ANNOTATIONS}

# Annotations that mark a pod as HAMi's even when its only resource is `nvidia.com/gpu`.
HAMI_ANNOTATIONS = frozenset(a.key for a in ANNOTATIONS if a.system == "hami")

# Allowed values per concept (None: free-form comma list or a number checked by the translator).
POLICIES = ("binpack", "spread")
TOPOLOGIES = ("none", "numa", "link", "numa-strict", "link-strict")
COMPUTE_POLICIES = ("fixed", "balance", "none")
HAMI_VGPU_MODE = "nvidia.com/vgpu-mode"  # HAMi: mig (MIG instances) | hami-core | mps
HAMI_VGPU_MODES = ("hami-core", "mig", "mps")
STRICT_TOPOLOGY_ATTRIBUTE = {"numa-strict": "numaNode", "link-strict": "nvlinkDomain"}

# Written by the webhook on every pod it translated (informational: which system it came from).
TRANSLATED_FROM = _ours("translated-from")

# Labels on the ResourceClaimTemplates the webhook creates, so its garbage collector finds them.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "vgpu-dra-webhook"


def legacy_names() -> list[str]:
    """Every name a user may bring from another system (for the docs test and the docs)."""
    names = list(RESOURCES)
    names += [MIG_RESOURCE_PREFIX, MIG_STRATEGY_LABEL, GPU_PRODUCT_LABEL]
    names += [a.key for a in ANNOTATIONS if a.system != "vgpu-dra"]
    names.append(VGPU_SCHEDULER)
    return names
