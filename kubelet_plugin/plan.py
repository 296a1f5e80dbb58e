"""Pure prepare-time decisions: allocation + inventory + opaque config -> what to write.

`kubelet_plugin.prepare` calls these between reading the claim and writing files; nothing here does
I/O, so every decision (limits per device, merged config, the overbooking verdict, the text of
`vgpu.conf`) is unit-tested on hand-made data. The resulting `ClaimPlan` is also what the
checkpoint stores, so a restarted plugin can rewrite a claim's files without the API server.

The guard tells two refusals apart: a claim that alone asks a device for more than it has (a
hand-written allocation, a quantity at the int64 edge: `kubelet_plugin.claims` only bounds each
quantity, two shares may add up past int64) is wrong and can never be prepared here
(`ClaimError`); one that fits alone but not next to the claims already prepared is overbooked
(`OverbookedError`: capacity may free up). Python integers do not wrap, so no sum overflows on
the way, and nothing past the device's capacity reaches `vgpu.conf`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from dra_driver import capacity as device_capacity
from dra_driver import mig, names
from dra_driver.config import (
    ComputePolicy,
    ConfigError,
    Enforce,
    LogLevel,
    VgpuConfig,
    merge_configs,
    parse_config,
)
from dra_driver.gpu import GpuInfo, NodeInventory
from dra_driver.mig_slices import mig_active
from kubelet_plugin.claims import ClaimAllocation, ClaimError, OpaqueConfig

MAX_CORES = device_capacity.CORES_TOTAL


class OverbookedError(ClaimError):
    """Preparing the claim would exceed a device's capacity (prepare-time guard)."""


class DevicePlan(BaseModel):
    """One allocation result, resolved to a physical GPU with its limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request: str
    pool: str
    device: str
    share_id: str | None = None
    uuid: str
    minor: int = Field(ge=0)
    memory: int = Field(gt=0, description="bytes the tenant may use (the consumed capacity)")
    cores: int = Field(ge=0, le=MAX_CORES, description="SM percent; 0 = no cap")
    policy: ComputePolicy = "fixed"
    oversubscribe: bool = False
    log_level: LogLevel | None = None
    # Node-side memory enforcement (kubelet_plugin.enforcement): kill or only report.
    enforce: Enforce = "kill"
    # Admin access: no caps, and not counted against the device's capacity.
    admin_access: bool = False
    # IDs of the NVIDIA Container Toolkit's CDI devices for this GPU (driver libraries).
    toolkit_cdi_ids: tuple[str, ...] = ()
    # MIG (docs/mig.md): the placement this device is; `uuid` stays the parent GPU's (health,
    # enforcement and the governor find GPUs by it). `mig_dynamic`: the plugin creates the
    # instance at prepare (`kubelet_plugin.mig_instances`); `mig_uuid` is known after that.
    mig_profile: str | None = None
    mig_profile_id: int | None = None
    mig_start: int | None = None
    mig_size: int | None = None
    mig_slices: int | None = None
    mig_dynamic: bool = False
    mig_uuid: str | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig_profile_id is not None

    @property
    def cdi_name(self) -> str:
        """CDI device name, unique per claim (and per share of a device within a claim)."""
        return f"{self.device}-{self.share_id}" if self.share_id else self.device


class ClaimPlan(BaseModel):
    """Everything prepare writes for one claim; stored verbatim in the checkpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uid: str
    namespace: str
    name: str
    devices: tuple[DevicePlan, ...]

    def cdi_device_name(self, device: DevicePlan) -> str:
        return f"{self.uid}-{device.cdi_name}"

    def mig_uuids(self) -> list[str]:
        """The claim's MIG devices (`MIG-...`), in allocation order."""
        return [d.mig_uuid for d in self.devices if d.mig_uuid]

    def visible_uuids(self) -> list[str]:
        """The claim's GPUs in allocation order, each once."""
        return list(dict.fromkeys(device.uuid for device in self.devices))


def plan_claim(
    allocation: ClaimAllocation,
    inventory: NodeInventory,
    *,
    toolkit_ids: dict[str, tuple[str, ...]] | None = None,
) -> ClaimPlan:
    """Resolve every allocated device to a GPU, its limits and its merged opaque config.

    `toolkit_ids` maps a GPU UUID to the NVIDIA toolkit CDI IDs to return with it (optional).
    Raises ClaimError (naming the claim and the field) for anything that cannot be honoured.
    """
    gpus = inventory.by_device_name()
    placements = mig_placements(inventory)
    ordered = _class_then_claim(allocation.configs)
    devices: list[DevicePlan] = []
    for result in allocation.devices:
        gpu = gpus.get(result.device)
        placement = placements.get(result.device)
        if placement is not None:
            parent = gpus[placement.gpu_device]
            devices.append(
                _mig_device(
                    result.request, result.pool, result.device, parent, placement
                ).model_copy(update={"toolkit_cdi_ids": (toolkit_ids or {}).get(parent.uuid, ())})
            )
            continue
        if gpu is None:
            raise ClaimError(
                f"ResourceClaim {allocation.ref}: device {result.device!r} is not on this node "
                f"(known: {', '.join(sorted(gpus)) or 'none'})"
            )
        config = merge_configs(
            _parse_entry(entry, allocation, result.request)
            for entry in ordered
            if entry.applies_to(result.request)
        )
        cores = result.consumed.get(names.CAPACITY_CORES, 0)
        if not 0 <= cores <= MAX_CORES:
            raise ClaimError(
                f"ResourceClaim {allocation.ref}: device {result.device!r} consumes cores={cores}; "
                f"allowed 0..{MAX_CORES}"
            )
        memory = result.consumed.get(names.CAPACITY_MEMORY, gpu.memory_bytes)
        if result.admin_access:  # monitoring access: the whole device, uncapped, unreserved
            memory, cores, config = (
                gpu.memory_bytes,
                0,
                config.model_copy(
                    update={"compute_policy": "none", "memory_oversubscription": False}
                ),
            )
        if memory <= 0:
            raise ClaimError(
                f"ResourceClaim {allocation.ref}: device {result.device!r} consumes memory="
                f"{memory}; must be > 0"
            )
        devices.append(
            DevicePlan(
                request=result.request,
                pool=result.pool,
                device=result.device,
                share_id=result.share_id,
                uuid=gpu.uuid,
                minor=gpu.minor_number,
                memory=memory,
                cores=cores,
                policy=config.compute_policy,
                oversubscribe=config.memory_oversubscription,
                log_level=config.log_level,
                enforce=config.enforce,
                admin_access=result.admin_access,
                toolkit_cdi_ids=(toolkit_ids or {}).get(gpu.uuid, ()),
            )
        )
    plan = ClaimPlan(
        uid=allocation.ref.uid,
        namespace=allocation.ref.namespace,
        name=allocation.ref.name,
        devices=tuple(devices),
    )
    hook_device_lines(plan)  # rejects conflicting policies on one GPU now, not at write time
    return plan


def mig_placements(inventory: NodeInventory) -> dict[str, mig.Placement]:
    """Device name -> placement, for every preparable MIG device of the node: the published MIG
    devices, and the whole GPU of a dynamic MIG GPU (prepared as its full-GPU instance, the one
    thing CUDA can use on a GPU in MIG mode)."""
    found: dict[str, mig.Placement] = {}
    for gpu in inventory.gpus:
        if not mig_active(gpu):
            continue
        assert gpu.mig is not None
        for placement in mig.placements(gpu.device_name, gpu.uuid, gpu.mig, gpu.mig_strategy):
            found[placement.device] = placement
        full = gpu.mig.full_profile()
        if gpu.mig_strategy == "dynamic" and full is not None:
            found[gpu.device_name] = mig.Placement(
                device=gpu.device_name,
                gpu_device=gpu.device_name,
                gpu_uuid=gpu.uuid,
                profile=full,
                start=0,
            )
    return found


def _mig_device(
    request: str, pool: str, device: str, gpu: GpuInfo, placement: mig.Placement
) -> DevicePlan:
    """A MIG device: the instance is its cap (memory and SMs are the hardware's), so the hook
    gets the instance's memory as the total and no compute cap."""
    instance = placement.instance
    return DevicePlan(
        request=request,
        pool=pool,
        device=device,
        uuid=gpu.uuid,
        minor=gpu.minor_number,
        memory=placement.profile.memory_bytes,
        cores=0,
        policy="none",
        mig_profile=placement.profile.name,
        mig_profile_id=placement.profile.profile_id,
        mig_start=placement.start,
        mig_size=placement.size,
        mig_slices=placement.profile.slices,
        mig_dynamic=instance is None,
        mig_uuid=instance.uuid if instance is not None else None,
    )


def _parse_entry(entry: OpaqueConfig, allocation: ClaimAllocation, request: str) -> VgpuConfig:
    """One opaque config entry; the error says whether the claim or its DeviceClass is wrong."""
    try:
        return parse_config(entry.parameters)
    except ConfigError as exc:
        origin = (
            "config from its DeviceClass (FromClass: fix the DeviceClass, not the claim)"
            if entry.source == "FromClass"
            else "config from the claim"
        )
        raise ClaimError(
            f"ResourceClaim {allocation.ref}, request {request!r}: {origin}: {exc}"
        ) from None


def _class_then_claim(configs: Iterable[OpaqueConfig]) -> list[OpaqueConfig]:
    """Class configs first, then claim configs (claim wins); order kept within each source."""
    entries = list(configs)
    return [c for c in entries if c.source != "FromClaim"] + [
        c for c in entries if c.source == "FromClaim"
    ]


@dataclass(slots=True)
class Usage:
    """What a set of claims consumes per device (admin access does not count): the guard's
    running total, kept by the Preparer as claims are reserved and released."""

    memory: dict[str, int] = field(default_factory=dict)
    cores: dict[str, int] = field(default_factory=dict)

    def add(self, plan: ClaimPlan, sign: int = 1) -> None:
        for device in plan.devices:
            if device.admin_access or device.is_mig:  # MIG: NVML's placement rules guard it
                continue
            name = device.device
            memory = self.memory[name] = self.memory.get(name, 0) + sign * device.memory
            cores = self.cores[name] = self.cores.get(name, 0) + sign * device.cores
            if memory == cores == 0:  # nothing left on it: as if never used
                del self.memory[name], self.cores[name]

    def remove(self, plan: ClaimPlan) -> None:
        self.add(plan, -1)


def device_usage(plans: Iterable[ClaimPlan]) -> Usage:
    usage = Usage()
    for plan in plans:
        usage.add(plan)
    return usage


def check_capacity(
    plan: ClaimPlan,
    prepared: Iterable[ClaimPlan],
    inventory: NodeInventory,
    *,
    oversubscription_ratio: float = 1.0,
) -> None:
    """Refuse `plan` if it would overbook a device given the already prepared claims.

    Capacity per device is what the ResourceSlice publishes (`dra_driver.capacity`); the
    scheduler normally guarantees this, the guard catches allocations written by hand or by a
    controller working from a stale view.
    """
    others = device_usage(other for other in prepared if other.uid != plan.uid)
    check_usage(plan, others, inventory, oversubscription_ratio=oversubscription_ratio)


def check_usage(
    plan: ClaimPlan,
    others: Usage,
    inventory: NodeInventory,
    *,
    oversubscription_ratio: float = 1.0,
) -> None:
    """`check_capacity` against what the other claims use (`others` must not count `plan`)."""
    gpus = inventory.by_device_name()
    _check_own_demand(plan, inventory, oversubscription_ratio)
    mine = device_usage([plan])
    for name in mine.memory:
        capacity = device_capacity.scaled_memory(gpus[name].memory_bytes, oversubscription_ratio)
        memory = others.memory.get(name, 0) + mine.memory[name]
        cores = others.cores.get(name, 0) + mine.cores[name]
        if memory > capacity:
            raise OverbookedError(
                f"ResourceClaim {plan.namespace}/{plan.name} ({plan.uid}) would overbook device "
                f"{name}: memory {memory} bytes requested in total (this claim "
                f"{_claim_sum(plan, name, 'memory')}) > capacity {capacity} bytes"
            )
        if cores > MAX_CORES:
            raise OverbookedError(
                f"ResourceClaim {plan.namespace}/{plan.name} ({plan.uid}) would overbook device "
                f"{name}: cores {cores} requested in total (this claim "
                f"{_claim_sum(plan, name, 'cores')}) > capacity {MAX_CORES}"
            )


def _check_own_demand(plan: ClaimPlan, inventory: NodeInventory, ratio: float) -> None:
    """A claim that alone asks a device for more than it has (a hand-written allocation, a
    quantity at the int64 edge) is wrong, not overbooked: it can never be prepared here."""
    gpus = inventory.by_device_name()
    for name in dict.fromkeys(
        d.device for d in plan.devices if not d.admin_access and not d.is_mig
    ):
        capacity = device_capacity.scaled_memory(gpus[name].memory_bytes, ratio)
        memory = _claim_sum(plan, name, "memory")
        cores = _claim_sum(plan, name, "cores")
        if memory > capacity or cores > MAX_CORES:
            raise ClaimError(
                f"ResourceClaim {plan.namespace}/{plan.name} ({plan.uid}) asks device {name} "
                f"for memory {memory} bytes and cores {cores}, more than it has (memory "
                f"{capacity} bytes, cores {MAX_CORES}): the allocation cannot be honoured"
            )


def _claim_sum(plan: ClaimPlan, device_name: str, attr: str) -> int:
    return sum(int(getattr(d, attr)) for d in plan.devices if d.device == device_name)


@dataclass(frozen=True, slots=True)
class HookDevice:
    """One `device` line of vgpu.conf: the claim's limits on one GPU."""

    uuid: str
    memory: int
    cores: int
    policy: ComputePolicy
    oversubscribe: bool


def hook_device_lines(plan: ClaimPlan) -> list[HookDevice]:
    """One entry per GPU; several shares of one GPU in one claim add up (cores capped at 100)."""
    merged: dict[str, HookDevice] = {}
    for device in plan.devices:
        if device.is_mig:
            if device.mig_uuid:  # the instance's memory is the total the hook sees
                uuid = hook_uuid(device.mig_uuid)
                merged[uuid] = HookDevice(uuid, device.memory, 0, "none", False)
            continue
        seen = merged.get(device.uuid)
        if seen is None:
            merged[device.uuid] = HookDevice(
                device.uuid, device.memory, device.cores, device.policy, device.oversubscribe
            )
            continue
        if seen.policy != device.policy:
            raise ClaimError(
                f"ResourceClaim {plan.namespace}/{plan.name} ({plan.uid}): requests on device "
                f"{device.device} ask for different computePolicy values "
                f"({seen.policy!r}, {device.policy!r}); one GPU has one policy per claim"
            )
        merged[device.uuid] = HookDevice(
            device.uuid,
            seen.memory + device.memory,
            min(MAX_CORES, seen.cores + device.cores),
            seen.policy,
            seen.oversubscribe or device.oversubscribe,
        )
    return list(merged.values())


def hook_uuid(mig_uuid: str) -> str:
    """The UUID the hook matches a MIG device by: CUDA reports the instance's UUID bytes, which
    the hook prints as `GPU-<hex>` (vgpu_hook/src/state.c, format_uuid)."""
    return "GPU-" + mig_uuid.removeprefix("MIG-")


def render_hook_config(plan: ClaimPlan) -> str:
    """The text of `<state-dir>/claims/<uid>/vgpu.conf` (format version 1, read by vgpu_hook)."""
    lines = [
        "# vgpu-dra hook configuration (written by the kubelet plugin at prepare)",
        "version 1",
        f"claim {plan.uid}",
    ]
    lines += [
        f"device uuid={d.uuid} memory={d.memory} cores={d.cores} policy={d.policy} "
        f"oversubscribe={int(d.oversubscribe)}"
        for d in hook_device_lines(plan)
    ]
    return "\n".join(lines) + "\n"


def log_level(plan: ClaimPlan) -> LogLevel | None:
    """The most verbose log level any device of the claim asks for (one env var per container)."""
    order: tuple[LogLevel, ...] = ("error", "warn", "info", "debug")
    levels = [order.index(d.log_level) for d in plan.devices if d.log_level is not None]
    return order[max(levels)] if levels else None
