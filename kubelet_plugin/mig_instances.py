"""Dynamic MIG: GPU + compute instances made at prepare, destroyed at unprepare, and a restart
that converges whatever step a SIGKILL interrupted.

Order of a prepare (per MIG device of the claim), each step durable before the next:

    ledger entry (claim owns placement P of GPU G; `kubelet_plugin.mig_ledger`, fsynced)
    -> GPU instance at exactly P (`CreateGpuInstanceWithPlacement`)
    -> one compute instance spanning it -> its MIG UUID
    ... then the Preparer writes the claim's files and its checkpoint record.

Unprepare destroys compute instances, then the GPU instance, then drops the ledger entries; the
Preparer removes the checkpoint record only after that, so an instance something still runs on
(IN_USE) fails the unprepare, and the kubelet's retry finds the claim still prepared.

Start-up (`reconcile`): on every GPU run with the dynamic strategy, an instance is kept only when
the ledger gives its placement to a claim the checkpoint holds as prepared (adopted); every other
instance is destroyed, and ledger entries of claims that are not prepared are dropped. A crash at
any step therefore ends in one of two states: the claim prepared with its instance, or neither
(the kubelet retries the prepare, which creates it afresh). A placement identifies an instance,
so there is never a second one: creation at a taken placement fails with INSUFFICIENT_RESOURCES,
and an instance found at the claim's own placement is adopted rather than made again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from dra_driver.gpu import GpuInfo
from dra_driver.mig_nvml import (
    IN_USE,
    INSUFFICIENT_RESOURCES,
    GpuInstance,
    MigNvml,
)
from dra_driver.nvml import DeviceHandle, NvmlError
from kubelet_plugin.claims import ClaimError
from kubelet_plugin.mig_ledger import LedgerEntry, MigLedger

log = logging.getLogger(__name__)

# Called after each step with its name (tests stop the process there): "ledger", "gpu-instance",
# "compute-instance", "destroyed-compute-instance", "destroyed-gpu-instance".
StepHook = Callable[[str], None]


class MigBusyError(ClaimError):
    """An instance cannot be destroyed: something still runs on it (NVML IN_USE)."""


class MigInstances:
    """Creates and destroys the instances of claims; one at a time (NVML serialises them anyway)."""

    def __init__(self, nvml: MigNvml, ledger: MigLedger, *, step: StepHook | None = None) -> None:
        self._nvml = nvml
        self._ledger = ledger
        self._step = step or (lambda _name: None)
        self._lock = threading.Lock()

    # --- prepare / unprepare -------------------------------------------------------------

    def create(self, claim: str, wanted: Iterable[LedgerEntry]) -> dict[str, str]:
        """Make (or adopt) the instance of every entry; device name -> MIG UUID.

        Raises ClaimError when a placement belongs to another claim or NVML refuses it; the
        caller then calls `destroy(claim)` to undo what was made.
        """
        uuids: dict[str, str] = {}
        with self._lock:
            for entry in wanted:
                self._refuse_overlap(claim, entry)
                self._ledger.add(entry)
                self._step("ledger")
                device = self._nvml.device_by_uuid(entry.gpu_uuid)
                gi = self._find(device, entry)
                if gi is None:
                    gi = self._create_gi(device, entry)
                    self._step("gpu-instance")
                cis = self._nvml.compute_instances(gi)
                if cis:
                    ci_id = min(ci.ci_id for ci in cis)
                else:
                    ci_id = self._nvml.create_compute_instance(gi, entry.slices).ci_id
                    self._step("compute-instance")
                uuid = self._nvml.mig_device_uuids(device).get((gi.gi_id, ci_id))
                if uuid is None:
                    raise ClaimError(
                        f"MIG device {entry.device}: NVML lists no MIG device for GPU instance "
                        f"{gi.gi_id}, compute instance {ci_id}"
                    )
                uuids[entry.device] = uuid
        return uuids

    def destroy(self, claim: str) -> None:
        """Destroy the claim's instances (those still there), then forget its entries."""
        with self._lock:
            for entry in self._ledger.of_claim(claim):
                device = self._nvml.device_by_uuid(entry.gpu_uuid)
                gi = self._find(device, entry)
                if gi is not None:
                    self._destroy_gi(gi, f"claim {claim}, device {entry.device}")
            self._ledger.drop(claim=claim)

    def owns(self, claim: str) -> bool:
        return bool(self._ledger.of_claim(claim))

    # --- start-up ------------------------------------------------------------------------

    def reconcile(self, prepared: set[str], gpus: Iterable[GpuInfo]) -> tuple[int, int]:
        """Keep the instances of prepared claims, destroy the rest; (adopted, destroyed)."""
        adopted = destroyed = 0
        with self._lock:
            owned = {
                (e.gpu_uuid, e.start, e.profile_id): e
                for e in self._ledger.entries()
                if e.claim in prepared
            }
            for gpu in gpus:
                if gpu.mig_strategy != "dynamic" or gpu.mig is None or not gpu.mig.enabled:
                    continue
                device = self._nvml.device_by_uuid(gpu.uuid)
                for profile in gpu.mig.profiles:
                    for gi in self._nvml.gpu_instances(device, profile.profile_id):
                        entry = owned.get((gpu.uuid, gi.start, gi.profile_id))
                        if entry is not None:
                            adopted += 1
                            log.info(
                                "MIG instance %s@%d of %s adopted: claim %s (%s)",
                                profile.name,
                                gi.start,
                                gpu.device_name,
                                entry.claim,
                                entry.device,
                            )
                            continue
                        log.warning(
                            "MIG instance %s@%d (GPU instance %d) of %s belongs to no prepared "
                            "claim: destroying it",
                            profile.name,
                            gi.start,
                            gi.gi_id,
                            gpu.device_name,
                        )
                        self._destroy_gi(gi, f"{gpu.device_name} at start-up")
                        destroyed += 1
            self._ledger.drop(keep=prepared)
        return adopted, destroyed

    # --- helpers -------------------------------------------------------------------------

    def _refuse_overlap(self, claim: str, entry: LedgerEntry) -> None:
        for other in self._ledger.entries():
            if other.claim == claim or other.gpu_uuid != entry.gpu_uuid:
                continue
            if other.start < entry.start + entry.size and entry.start < other.start + other.size:
                raise ClaimError(
                    f"device {entry.device}: its MIG placement (memory slices {entry.start}.."
                    f"{entry.start + entry.size - 1}) overlaps {other.device} of claim "
                    f"{other.claim}, which is prepared on this node"
                )

    def _find(self, device: DeviceHandle, entry: LedgerEntry) -> GpuInstance | None:
        for gi in self._nvml.gpu_instances(device, entry.profile_id):
            if gi.start == entry.start:
                return gi
        return None

    def _create_gi(self, device: DeviceHandle, entry: LedgerEntry) -> GpuInstance:
        try:
            return self._nvml.create_gpu_instance(device, entry.profile_id, entry.start, entry.size)
        except NvmlError as exc:
            if exc.code == INSUFFICIENT_RESOURCES:
                raise ClaimError(
                    f"device {entry.device}: NVML refuses a GPU instance at memory slices "
                    f"{entry.start}..{entry.start + entry.size - 1}: an instance the plugin "
                    f"does not own overlaps it ({exc})"
                ) from None
            raise

    def _destroy_gi(self, gi: GpuInstance, what: str) -> None:
        try:
            for ci in self._nvml.compute_instances(gi):
                self._nvml.destroy_compute_instance(ci)
                self._step("destroyed-compute-instance")
            self._nvml.destroy_gpu_instance(gi)
            self._step("destroyed-gpu-instance")
        except NvmlError as exc:
            if exc.code == IN_USE:
                raise MigBusyError(
                    f"MIG instance of {what} is still in use (NVML IN_USE: a process runs on it); "
                    "retryable"
                ) from None
            raise
