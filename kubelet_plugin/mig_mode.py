"""MIG mode per GPU from configuration: `--mig-mode` (chart value `kubeletPlugin.migMode`) and the
node label `<driver>/mig-mode`, applied at start-up and only on idle GPUs.

`--mig-mode` is a comma list of `<gpu>=<strategy>` (`<gpu>`: `all`, an NVML index, a UUID or a
device name) or a bare strategy for all GPUs; strategies are `off`, `static`, `dynamic`
(`dra_driver.mig`). The node label, when set (`off|static|dynamic`), wins
for every GPU: an operator relabels one node without touching the DaemonSet. Empty (the default)
leaves every GPU in the MIG mode it is in, published `static` when MIG is on.

A mode change is made only when the GPU is idle: no claim of the checkpoint is prepared on it (a
prepared container may not have started yet), it has no MIG instance (turning MIG off), and NVML
applies it at once (`nvmlDeviceSetMigMode` activation status SUCCESS, i.e. no process holds the
GPU). Otherwise the change is refused: the pending mode NVML may have recorded is set back to the
current one (no surprise at the next GPU reset), the GPU stays as it is and is published as it
is, and the reason is logged and posted as a Warning Event on the Node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.gpu import GpuInfo, NodeInventory
from dra_driver.mig import STRATEGIES, MigStrategy
from dra_driver.mig_nvml import IN_USE, MigNvml
from dra_driver.nvml import NvmlError

log = logging.getLogger(__name__)

EVENT_REASON = "MigModeChangeRefused"


def label_key(driver: str) -> str:
    """The node label that sets the MIG strategy of all the node's GPUs."""
    return f"{driver}/mig-mode"


def _strategy(text: str, where: str) -> MigStrategy:
    for strategy in STRATEGIES:
        if text == strategy:
            return strategy
    raise ValueError(f"{where}: MIG strategy must be one of {', '.join(STRATEGIES)}, got {text!r}")


def parse_mig_mode(text: str) -> dict[str, MigStrategy]:
    """`--mig-mode` -> selector -> strategy; ValueError naming the flag for bad text."""
    result: dict[str, MigStrategy] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        selector, _, value = part.rpartition("=")
        result[selector.strip() or "all"] = _strategy(value.strip(), "--mig-mode")
    return result


def desired(
    inventory: NodeInventory, flag: Mapping[str, MigStrategy], label: str | None
) -> dict[str, MigStrategy]:
    """GPU UUID -> the strategy configured for it (GPUs without MIG, and GPUs nothing is
    configured for, are left out: they stay as they are)."""
    node_wide = _strategy(label, "node label") if label else None
    result: dict[str, MigStrategy] = {}
    for gpu in inventory.gpus:
        if not gpu.mig_capable or gpu.mig is None:
            continue
        keys = (gpu.uuid, gpu.device_name, str(gpu.index), "all")
        chosen = node_wide or next((flag[k] for k in keys if k in flag), None)
        if chosen is not None:
            result[gpu.uuid] = chosen
    return result


def with_strategies(
    inventory: NodeInventory, strategies: Mapping[str, MigStrategy]
) -> NodeInventory:
    """Each GPU's effective strategy: the configured one where its MIG mode matches it; a GPU
    whose change was refused keeps what its mode says (MIG on: static; off: off)."""
    gpus = []
    for gpu in inventory.gpus:
        enabled = gpu.mig is not None and gpu.mig.enabled
        wanted = strategies.get(gpu.uuid)
        if wanted is None or (wanted == "off") == enabled:
            wanted = "static" if enabled else "off"
        gpus.append(gpu.model_copy(update={"mig_strategy": wanted}))
    return inventory.model_copy(update={"gpus": tuple(gpus)})


@dataclass(frozen=True, slots=True)
class ModeChange:
    gpu: str  # device name
    enable: bool
    applied: bool
    reason: str = ""


def apply_modes(
    nvml: MigNvml,
    inventory: NodeInventory,
    strategies: Mapping[str, MigStrategy],
    busy: Callable[[GpuInfo], int],
) -> list[ModeChange]:
    """Set the MIG mode of every GPU whose configured strategy needs another mode, where idle.

    `busy(gpu)`: how many prepared claims use the GPU (from the checkpoint).
    """
    changes: list[ModeChange] = []
    for gpu in inventory.gpus:
        wanted = strategies.get(gpu.uuid)
        if wanted is None or gpu.mig is None:
            continue
        enable = wanted != "off"
        if enable == gpu.mig.enabled:
            continue
        change = _change(nvml, gpu, enable, busy(gpu))
        changes.append(change)
        if change.applied:
            log.info("%s: MIG mode %s", gpu.device_name, "enabled" if enable else "disabled")
        else:
            log.warning(
                "%s: MIG mode change to %s refused: %s; the GPU stays as it is",
                gpu.device_name,
                "enabled" if enable else "disabled",
                change.reason,
            )
    return changes


def _change(nvml: MigNvml, gpu: GpuInfo, enable: bool, claims: int) -> ModeChange:
    assert gpu.mig is not None
    if claims:
        return ModeChange(gpu.device_name, enable, False, f"{claims} prepared claim(s) use it")
    if not enable and gpu.mig.instances:
        return ModeChange(
            gpu.device_name,
            enable,
            False,
            f"it has {len(gpu.mig.instances)} MIG instance(s); destroy them first",
        )
    try:
        handle = nvml.device_by_uuid(gpu.uuid)
        status = nvml.set_mig_mode(handle, enable)
        if status == 0:
            return ModeChange(gpu.device_name, enable, True)
        # Pending until the GPU is idle: take it back, so no reset applies it behind our back.
        nvml.set_mig_mode(handle, gpu.mig.enabled)
        why = "processes are running on it" if status == IN_USE else f"NVML status {status}"
        return ModeChange(gpu.device_name, enable, False, why)
    except NvmlError as exc:
        return ModeChange(gpu.device_name, enable, False, f"NVML refused: {exc}")


def claims_per_gpu(plans: Iterable[Any]) -> Callable[[GpuInfo], int]:
    """`busy` for `apply_modes` from checkpointed plans (`kubelet_plugin.plan.ClaimPlan`)."""
    counts: dict[str, int] = {}
    for plan in plans:
        for uuid in {d.uuid for d in plan.devices}:
            counts[uuid] = counts.get(uuid, 0) + 1
    return lambda gpu: counts.get(gpu.uuid, 0)
