"""What must hold while faults come and go, checked all the time from the API and from the nodes'
files (a thread, every few seconds), and what must hold once the system settled.

Always (every check):
- `api-no-overcommit`: per device, the capacity consumed by committed allocations (their
  results' `consumedCapacity`; a result without it holds the whole device) is within the
  capacity its ResourceSlice publishes, for `memory` and `cores`. With binding conditions a
  kube-scheduler allocation is committed once the controller confirmed it (`confirmed`);
  before that it is a proposal, which the controller fails as Overbooked when it does not fit.
- `node-no-overcommit`: per GPU of each node, the `device` lines of the `vgpu.conf` files of
  the claims in the plugin's checkpoint add up to at most the GPU's memory and 100 cores.
After a grace period (garbage collection, the kubelet's retries and the plugin's restart have
had their time; a state that lasts longer is reported once, with its age):
- `no-prepared-claim-without-pod`: every claim in a node's checkpoint belongs to a pod bound to
  that node whose claim still has that UID;
- `no-leaked-files`: every claim CDI spec and claim dir (with its region) on a node belongs to a
  claim in its checkpoint;
- `prepared-claim-has-files`: every checkpointed claim has its spec and vgpu.conf;
- `node-slices-published` (its own, shorter grace: `slices_grace_s`): every node whose plugin
  runs has its ResourceSlices in the API (without them no new GPU pod can land there).
At settle points (`check_pods`):
- `no-pod-stuck-without-reason`: a pod not running after `stuck_s` has a reason in its status
  (a False PodScheduled or Placement condition with a message, a waiting container's message)
  or a Warning Event.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import kube
from dra_driver.allocator import parse_quantity
from dra_driver.kube import RESOURCE_API
from kubelet_plugin.checkpoint import CheckpointError, CheckpointJournal
from kubelet_plugin.plan import ClaimPlan
from vgpu_testbed.faults.bed import CDI_CLAIM_PREFIX, ChaosBed
from vgpu_testbed.faults.churn import Churn

JSON = dict[str, Any]
DRIVER = "vgpu.dra.dev"
MAX_CORES = 100
ALWAYS = ("api-no-overcommit", "node-no-overcommit")
GRACED = (
    "no-prepared-claim-without-pod",
    "no-leaked-files",
    "prepared-claim-has-files",
    "node-slices-published",
)
SETTLED = ("no-pod-stuck-without-reason",)
# Judged by a fault itself (the node reboot): claims prepared before it are prepared again.
BY_FAULT = ("prepared-again-after-reboot",)
ALL = (*ALWAYS, *GRACED, *SETTLED, *BY_FAULT)


@dataclass
class Violation:
    invariant: str
    at_s: float  # seconds since the checker started
    detail: str


@dataclass
class Capacity:
    """A device's published capacity and its UUID."""

    memory: int
    cores: int
    uuid: str


def device_capacities(slices: Iterable[JSON]) -> dict[tuple[str, str], Capacity]:
    """(pool, device) -> capacity, from the driver's ResourceSlices."""
    found: dict[tuple[str, str], Capacity] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or []:
            capacity = device.get("capacity") or {}
            memory = parse_quantity(str((capacity.get("memory") or {}).get("value", "0")))
            cores = parse_quantity(str((capacity.get("cores") or {}).get("value", MAX_CORES)))
            uuid = str(((device.get("attributes") or {}).get("uuid") or {}).get("string", ""))
            found[(pool, str(device["name"]))] = Capacity(memory, cores, uuid)
    return found


def confirmed(claim: JSON, result: JSON) -> bool:
    """An allocation result counts once it is committed: it carries no binding conditions, or
    the claim's `status.devices` says CapacityConfirmed for it. A kube-scheduler allocation that
    still waits in PreBind is a proposal the controller may yet fail as Overbooked."""
    if not result.get("bindingConditions"):
        return True
    for entry in (claim.get("status") or {}).get("devices") or []:
        if all(entry.get(k) == result.get(k) for k in ("driver", "pool", "device", "shareID")):
            return any(
                c.get("type") == "vgpu.dra.dev/CapacityConfirmed" and c.get("status") == "True"
                for c in entry.get("conditions") or []
            )
    return False


def api_overcommit(claims: Iterable[JSON], capacity: dict[tuple[str, str], Capacity]) -> list[str]:
    """Devices whose committed allocations consume more than they publish (one line each)."""
    used: dict[tuple[str, str], list[int]] = {}
    holders: dict[tuple[str, str], list[str]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != DRIVER or result.get("adminAccess"):
                continue
            if not confirmed(claim, result):
                continue
            key = (str(result.get("pool")), str(result.get("device")))
            cap = capacity.get(key)
            if cap is None:
                continue
            consumed = result.get("consumedCapacity")
            if consumed is None:
                memory, cores = cap.memory, cap.cores
            else:
                memory = parse_quantity(str(consumed.get("memory", "0")))
                cores = parse_quantity(str(consumed.get("cores", "0")))
            total = used.setdefault(key, [0, 0])
            total[0] += memory
            total[1] += cores
            meta = claim.get("metadata") or {}
            holders.setdefault(key, []).append(f"{meta.get('namespace')}/{meta.get('name')}")
    problems = []
    for key, (memory, cores) in used.items():
        cap = capacity[key]
        if memory > cap.memory or cores > cap.cores:
            problems.append(
                f"{key[0]}/{key[1]}: memory {memory} > {cap.memory} or cores {cores} > "
                f"{cap.cores}; claims {sorted(holders[key])}"
            )
    return problems


def conf_devices(text: str) -> list[tuple[str, int, int]]:
    """(uuid, memory, cores) of each `device` line of a vgpu.conf."""
    found = []
    for line in text.splitlines():
        if not line.startswith("device "):
            continue
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        found.append(
            (fields.get("uuid", ""), int(fields.get("memory", 0)), int(fields.get("cores", 0)))
        )
    return found


@dataclass
class NodeFiles:
    """A node's plugin state as its files show it."""

    checkpoint: dict[str, ClaimPlan]
    specs: set[str]  # claim UIDs with a CDI spec
    claim_dirs: set[str]
    confs: dict[str, str]  # uid -> vgpu.conf text (checkpointed claims with one)


def read_node(state_dir: Path, cdi_root: Path) -> NodeFiles:
    checkpoint = CheckpointJournal(str(state_dir)).load()
    specs = {
        p.name[len(CDI_CLAIM_PREFIX) : -len(".json")]
        for p in cdi_root.glob(f"{CDI_CLAIM_PREFIX}*.json")
    }
    claims_root = state_dir / "claims"
    dirs = {p.name for p in claims_root.iterdir()} if claims_root.is_dir() else set()
    confs = {}
    for uid in checkpoint:
        with contextlib.suppress(OSError):
            confs[uid] = (claims_root / uid / "vgpu.conf").read_text()
    return NodeFiles(checkpoint, specs, dirs, confs)


def node_overcommit(files: NodeFiles, by_uuid: dict[str, Capacity]) -> list[str]:
    used: dict[str, list[int]] = {}
    for text in files.confs.values():
        for uuid, memory, cores in conf_devices(text):
            total = used.setdefault(uuid, [0, 0])
            total[0] += memory
            total[1] += cores
    problems = []
    for uuid, (memory, cores) in used.items():
        cap = by_uuid.get(uuid)
        if cap is not None and (memory > cap.memory or cores > MAX_CORES):
            problems.append(
                f"GPU {uuid}: vgpu.conf memory {memory} > {cap.memory} or cores "
                f"{cores} > {MAX_CORES}"
            )
    return problems


def pod_claims(pods: Iterable[JSON]) -> set[tuple[str, str]]:
    """(namespace, claim name) of every claim the pods use (named and generated)."""
    found = set()
    for pod in pods:
        ns = str(pod["metadata"].get("namespace"))
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            if ref.get("resourceClaimName"):
                found.add((ns, str(ref["resourceClaimName"])))
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("resourceClaimName"):
                found.add((ns, str(status["resourceClaimName"])))
    return found


@dataclass
class Checker:
    """Runs the checks every `period_s` in a thread and keeps what it found."""

    bed: ChaosBed
    period_s: float = 5.0
    grace_s: float = 150.0
    stuck_s: float = 150.0
    slices_grace_s: float = 20.0
    violations: list[Violation] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    _first_seen: dict[tuple[str, str], float] = field(default_factory=dict)
    _reported: set[tuple[str, str]] = field(default_factory=set)
    _capacity: dict[tuple[str, str], Capacity] = field(default_factory=dict)
    _started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="invariants", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_once()
            except kube.KubeError:
                self.skipped += 1  # the API is down or slow: the node files are checked anyway
            except Exception as exc:  # a checker that dies checks nothing: record, go on
                self.violate("checker-error", repr(exc))
            self._stop.wait(self.period_s)

    def count(self, name: str) -> None:
        self.checks[name] = self.checks.get(name, 0) + 1

    def violate(self, invariant: str, detail: str) -> None:
        with self._lock:
            self.violations.append(
                Violation(invariant, round(time.monotonic() - self._started, 1), detail[:600])
            )

    def _graced(
        self,
        invariant: str,
        key: str,
        detail: str,
        present: set[tuple[str, str]],
        grace_s: float | None = None,
    ) -> None:
        """Report `key` once it has been wrong for longer than the grace period."""
        ident = (invariant, key)
        present.add(ident)
        now = time.monotonic()
        first = self._first_seen.setdefault(ident, now)
        grace = self.grace_s if grace_s is None else grace_s
        if now - first > grace and ident not in self._reported:
            self._reported.add(ident)
            self.violate(invariant, f"{detail} (for {now - first:.0f}s)")

    def check_once(self) -> None:
        client = self.bed.client
        node_files: dict[str, NodeFiles] = {}
        for name, node in self.bed.nodes.items():
            try:
                node_files[name] = read_node(node.paths.state_dir, node.paths.cdi_root)
            except (CheckpointError, OSError) as exc:
                self.violate("node-files-readable", f"{name}: {exc}")
        slices: list[JSON] | None = None
        with contextlib.suppress(kube.KubeError):
            slices = client.list(kube.path(RESOURCE_API, "resourceslices"))
            self._capacity = device_capacities(slices) or self._capacity
        by_uuid = {c.uuid: c for c in self._capacity.values()}
        for name, files in node_files.items():
            self.count("node-no-overcommit")
            for problem in node_overcommit(files, by_uuid):
                self.violate("node-no-overcommit", f"{name}: {problem}")
        present: set[tuple[str, str]] = set()
        for name, files in node_files.items():
            self.count("no-leaked-files")
            self.count("prepared-claim-has-files")
            for uid in (files.specs | files.claim_dirs) - set(files.checkpoint):
                self._graced(
                    "no-leaked-files",
                    f"{name}/{uid}",
                    f"{name}: claim {uid} has files but no checkpoint entry",
                    present,
                )
            for uid in set(files.checkpoint) - (files.specs & set(files.confs)):
                self._graced(
                    "prepared-claim-has-files",
                    f"{name}/{uid}",
                    f"{name}: checkpointed claim {uid} misses its spec or vgpu.conf",
                    present,
                )
        if slices is not None:
            publishing = {
                str((obj.get("spec") or {}).get("nodeName"))
                for obj in slices
                if (obj.get("spec") or {}).get("driver") == DRIVER
            }
            for name, node in self.bed.nodes.items():
                if node.inner_pid(node.plugin_process) is None:
                    continue  # no plugin (killed, rebooting): nothing to publish them
                self.count("node-slices-published")
                if name not in publishing:
                    self._graced("node-slices-published", name,
                                 f"{name}: plugin running, no ResourceSlice in the API", present,
                                 self.slices_grace_s)  # fmt: skip
        # From here on the API is needed (a KubeError skips the rest of this pass).
        claims = client.list(kube.path(RESOURCE_API, "resourceclaims"))
        self.count("api-no-overcommit")
        for problem in api_overcommit(claims, self._capacity):
            self.violate("api-no-overcommit", problem)
        uids = {
            (str(c["metadata"]["namespace"]), str(c["metadata"]["name"])): str(c["metadata"]["uid"])
            for c in claims
        }
        for name, files in node_files.items():
            pods = client.list(kube.path("v1", "pods"), field_selector=f"spec.nodeName={name}")
            used = pod_claims(pods)
            self.count("no-prepared-claim-without-pod")
            for uid, plan in files.checkpoint.items():
                key = (plan.namespace, plan.name)
                if key not in used or uids.get(key) != uid:
                    self._graced(
                        "no-prepared-claim-without-pod",
                        f"{name}/{uid}",
                        f"{name}: claim {plan.namespace}/{plan.name} ({uid}) prepared, "
                        "no pod of this node uses it",
                        present,
                    )
        for ident in list(self._first_seen):
            if ident not in present:
                del self._first_seen[ident]
                self._reported.discard(ident)

    def check_pods(self, churn: Churn) -> list[str]:
        """Pods alive longer than `stuck_s` without running and without a reason."""
        self.count("no-pod-stuck-without-reason")
        stuck = []
        now = time.monotonic()
        for record in churn.live():
            if record.running is None and now - record.created > self.stuck_s:
                reason = churn.why(record)
                if not reason:
                    stuck.append(record.name)
                    self.violate(
                        "no-pod-stuck-without-reason",
                        f"{record.name} ({record.kind}) pending "
                        f"{now - record.created:.0f}s with no reason",
                    )
        return stuck

    def report(self) -> dict[str, Any]:
        with self._lock:
            found = list(self.violations)
        held = {name: not any(v.invariant == name for v in found) for name in ALL}
        return {
            "held": held,
            "checks": dict(self.checks),
            "passes_skipped_api_down": self.skipped,
            "violations": [v.__dict__ for v in found],
        }

    def since(self, count: int) -> list[Violation]:
        with self._lock:
            return list(self.violations[count:])
