"""Start-up of the MIG side of the kubelet plugin: configured modes applied on idle GPUs
(`kubelet_plugin.mig_mode`), refusals posted as Events on the Node, the effective strategy of
every GPU, and the NVML session dynamic MIG creates instances with (`kubelet_plugin.mig_instances`).

Kept out of `main.py` so the plugin's wiring stays one call: `start_mig(...)` after discovery,
`MigStart.named(...)` around every (re)discovery, `MigStart.instances(...)` for the Preparer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from dra_driver import events, kube
from dra_driver.gpu import NodeInventory
from dra_driver.mig import MigStrategy
from dra_driver.mig_nvml import PyMigNvml
from dra_driver.nvml import NvmlError
from kubelet_plugin import mig_mode
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.mig_instances import MigInstances
from kubelet_plugin.mig_ledger import MigLedger

log = logging.getLogger(__name__)


@dataclass
class MigStart:
    strategies: dict[str, MigStrategy] = field(default_factory=dict)
    nvml: PyMigNvml | None = None

    def named(self, inventory: NodeInventory) -> NodeInventory:
        """`inventory` with each GPU's effective MIG strategy."""
        return mig_mode.with_strategies(inventory, self.strategies)

    def instances(self, state_dir: str, inventory: NodeInventory) -> MigInstances | None:
        """The instance manager when a GPU runs dynamic MIG (or the ledger names instances to
        clean up), else None."""
        ledger = MigLedger(state_dir)
        dynamic = any(gpu.mig_strategy == "dynamic" for gpu in inventory.gpus)
        if not dynamic and not ledger.entries():
            return None
        if self.nvml is None:
            nvml = PyMigNvml()
            try:
                nvml.init()
            except NvmlError as exc:
                log.error("dynamic MIG is off: NVML cannot be opened (%s)", exc)
                return None
            self.nvml = nvml
        return MigInstances(self.nvml, ledger)


def start_mig(
    *,
    flag: str,
    client: kube.KubeClient,
    driver: str,
    node_name: str,
    state_dir: str,
    discovered: NodeInventory,
    discover: Callable[[], NodeInventory],
) -> tuple[MigStart, NodeInventory]:
    """Apply the configured MIG modes; (the start, the inventory to use from now on)."""
    if not any(gpu.mig is not None for gpu in discovered.gpus):
        return MigStart(), discovered
    label = _node_label(client, node_name, mig_mode.label_key(driver))
    strategies = mig_mode.desired(discovered, mig_mode.parse_mig_mode(flag), label)
    start = MigStart(strategies)
    if not any(
        gpu.mig is not None and (strategies[gpu.uuid] != "off") != gpu.mig.enabled
        for gpu in discovered.gpus
        if gpu.uuid in strategies
    ):
        return start, discovered
    nvml = PyMigNvml()
    try:
        nvml.init()
    except NvmlError as exc:
        log.error("MIG modes not applied: NVML cannot be opened (%s)", exc)
        return start, discovered
    start.nvml = nvml
    busy = mig_mode.claims_per_gpu(CheckpointJournal(state_dir).load().values())
    changes = mig_mode.apply_modes(nvml, discovered, strategies, busy)
    for change in changes:
        if not change.applied:
            _event(client, node_name, change)
    if any(change.applied for change in changes):
        discovered = discover()
    return start, discovered


def _node_label(client: kube.KubeClient, node_name: str, key: str) -> str | None:
    try:
        node = client.get(kube.path("v1", "nodes", node_name))
    except kube.KubeError as exc:
        log.warning("cannot read node %s for its %s label: %s", node_name, key, exc)
        return None
    value = ((node.get("metadata") or {}).get("labels") or {}).get(key)
    return str(value) if value else None


def _event(client: kube.KubeClient, node_name: str, change: mig_mode.ModeChange) -> None:
    target = "enabled" if change.enable else "disabled"
    events.record_warning(
        client,
        # Node events live in the default namespace, as the kubelet's own.
        events.ObjectRef("v1", "Node", "default", node_name, node_name),
        mig_mode.EVENT_REASON,
        f"MIG mode of {change.gpu} not {target}: {change.reason}; it stays as it is",
        component="vgpu-dra-kubelet-plugin",
        host=node_name,
    )
