"""NodePrepareResources / NodeUnprepareResources: the one place where prepare has side effects.

Called by the gRPC adapters (`kubelet_plugin.dra_service`) with claim references; returns one
outcome per claim, so a bad claim never fails its neighbours. Per claim the order is fixed, which
is what makes kubelet retries and crashes safe:

    checkpoint says prepared? -> return the recorded IDs
    read the claim (API) -> plan (pure, `kubelet_plugin.plan`) -> overbooking guard (under lock)
    -> claim dir + vgpu.conf -> CDI spec -> checkpoint (fsynced) -> answer

Unprepare removes the spec, the claim dir, then the checkpoint entry; unknown claims succeed.
`reconcile()` runs at start-up and makes the CDI root and claim dirs agree with the checkpoint.

Concurrency: claims of one call run on a thread pool; one lock guards the in-memory state and the
overbooking decision, file I/O happens outside it, and concurrent checkpoint writes coalesce into
one (group commit). A per-UID lock keeps one claim from being worked on twice at once.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dra_driver import cdi, kube, names
from dra_driver.atomicfile import fsync_dir, remove, write_atomic
from dra_driver.gpu import NodeInventory
from kubelet_plugin.checkpoint import CheckpointFile
from kubelet_plugin.claims import ClaimError, ClaimRef, fetch_claim, parse_allocation
from kubelet_plugin.plan import ClaimPlan, check_capacity, log_level, plan_claim, render_hook_config

log = logging.getLogger(__name__)

HOOK_CONFIG_FILE = "vgpu.conf"
CLAIM_DIR_MODE = 0o2770  # setgid: files the hook creates (the region) inherit the claim group
HOOK_CONFIG_MODE = 0o640
SPEC_MODE = 0o644

_T = TypeVar("_T")
ClaimSource = Callable[[ClaimRef], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """Everything prepare needs to know about this node (from the plugin's flags)."""

    driver: str
    node_name: str
    cdi_root: str
    spec: cdi.SpecSettings
    oversubscription_ratio: float = 1.0
    toolkit_spec_dirs: tuple[str, ...] = ()

    @property
    def state_dir(self) -> str:
        return self.spec.state_dir


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One entry of the kubelet's NodePrepareResourceResponse.devices."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(slots=True)
class ReconcileReport:
    removed_specs: list[str] = field(default_factory=list)
    removed_claim_dirs: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)


def kube_claim_source(client: kube.KubeClient) -> ClaimSource:
    """Claims from the API server (the production source)."""
    return lambda ref: fetch_claim(client, ref)


class Preparer:
    """Prepared-claim state of this node, backed by the checkpoint file."""

    def __init__(
        self,
        settings: NodeSettings,
        inventory: NodeInventory,
        claim_source: ClaimSource,
        *,
        max_workers: int = 16,
    ) -> None:
        self._settings = settings
        self._inventory = inventory
        self._source = claim_source
        self._checkpoint = CheckpointFile(settings.state_dir)
        self._prepared: dict[str, ClaimPlan] = self._checkpoint.load()
        self._reserved: dict[str, ClaimPlan] = {}  # passed the guard, files being written
        self._lock = threading.Lock()
        self._version = 0
        self._persisted = 0
        self._flush_lock = threading.Lock()
        self._uid_locks: dict[str, tuple[threading.Lock, int]] = {}
        self._uid_locks_guard = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="prepare")
        self._toolkit = _ToolkitIds(settings.toolkit_spec_dirs)

    # --- kubelet calls ---------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        return self._batch(refs, self._prepare_claim)

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error text ("" = success)."""
        return self._batch(refs, self._unprepare_claim)

    def prepared(self) -> dict[str, ClaimPlan]:
        """Snapshot of the prepared claims (for health, metrics and the governor)."""
        with self._lock:
            return dict(self._prepared)

    def update_inventory(self, inventory: NodeInventory) -> None:
        """Use a fresh discovery for new claims (prepared claims keep what they recorded)."""
        with self._lock:
            self._inventory = inventory

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _batch(self, refs: Sequence[ClaimRef], work: Callable[[ClaimRef], _T]) -> dict[str, _T]:
        if len(refs) <= 1:  # the common case: no thread hop on the latency path
            return {ref.uid: work(ref) for ref in refs}
        futures = {ref.uid: self._pool.submit(work, ref) for ref in refs}
        return {uid: future.result() for uid, future in futures.items()}

    # --- prepare ---------------------------------------------------------------------------

    def _prepare_claim(self, ref: ClaimRef) -> PrepareOutcome:
        try:
            _check_uid(ref)
            with self._claim_lock(ref.uid):
                return PrepareOutcome(devices=self._prepare_locked(ref))
        except (ClaimError, kube.KubeError) as exc:
            log.warning("prepare %s failed: %s", ref, exc)
            return PrepareOutcome(error=_user_error(exc, ref))
        except Exception as exc:
            log.exception("prepare %s failed unexpectedly", ref)
            return PrepareOutcome(error=f"prepare {ref}: internal error: {exc}")

    def _prepare_locked(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        with self._lock:
            known = self._prepared.get(ref.uid)
        if known is not None:
            log.debug("claim %s already prepared; returning the recorded devices", ref)
            if not self._files_present(known):  # removed behind our back: put them back
                log.warning("claim %s: CDI spec or hook config missing; rewriting", ref)
                self._write_claim_files(known)
            return self._result(known)
        claim = self._source(ref)
        allocation = parse_allocation(
            claim, ref, driver=self._settings.driver, node_name=self._settings.node_name
        )
        with self._lock:
            inventory = self._inventory
        plan = plan_claim(allocation, inventory, toolkit_ids=self._toolkit.by_uuid(inventory))
        with self._lock:
            check_capacity(
                plan,
                [*self._prepared.values(), *self._reserved.values()],
                inventory,
                oversubscription_ratio=self._settings.oversubscription_ratio,
            )
            self._reserved[plan.uid] = plan
        try:
            self._write_claim_files(plan)
            with self._lock:
                self._prepared[plan.uid] = self._reserved.pop(plan.uid)
                self._version += 1
                target = self._version
            self._flush(target)
        except BaseException:
            with self._lock:
                self._prepared.pop(plan.uid, None)
                self._version += 1
            self._remove_claim_files(plan.uid)
            raise
        finally:
            with self._lock:
                self._reserved.pop(plan.uid, None)
        log.info(
            "prepared claim %s: %s",
            ref,
            ", ".join(f"{d.device}(mem={d.memory},cores={d.cores})" for d in plan.devices),
        )
        return self._result(plan)

    def _result(self, plan: ClaimPlan) -> tuple[PreparedDevice, ...]:
        kind = self._settings.spec.kind
        return tuple(
            PreparedDevice(
                # The kubelet matches containers' `resources.claims[].request` against these,
                # which name top-level requests: `req/sub` (prioritized list) is reported as `req`.
                request_names=(device.request.split("/", 1)[0],),
                pool=device.pool,
                device=device.device,
                cdi_ids=(
                    cdi.device_id(kind, plan.cdi_device_name(device)),
                    *device.toolkit_cdi_ids,
                ),
                share_id=device.share_id,
            )
            for device in plan.devices
        )

    # --- unprepare -------------------------------------------------------------------------

    def _unprepare_claim(self, ref: ClaimRef) -> str:
        try:
            _check_uid(ref)
        except ClaimError as exc:
            return str(exc)
        try:
            with self._claim_lock(ref.uid):
                self._remove_claim_files(ref.uid)
                with self._lock:
                    known = self._prepared.pop(ref.uid, None)
                    self._version += 1
                    target = self._version
                if known is not None:
                    self._flush(target)
                    log.info("unprepared claim %s", ref)
                else:
                    log.debug("unprepare %s: not prepared here; nothing to do", ref)
            return ""
        except Exception as exc:
            log.exception("unprepare %s failed", ref)
            return f"unprepare {ref}: {exc}"

    # --- files -----------------------------------------------------------------------------

    def _write_claim_files(self, plan: ClaimPlan) -> None:
        settings = self._settings
        directory = cdi.claim_dir(settings.state_dir, plan.uid)
        write_preload_file(settings.state_dir)  # a mount source the runtime needs; cheap check
        _make_claim_dir(directory, settings.spec.claim_gid)
        # Both files are fsynced but their directories are not: the checkpoint written after them
        # is (file and directory), and start-up reconciliation rewrites any spec or config that a
        # power loss took back, so the claim's files are recoverable whenever its entry exists.
        write_atomic(
            os.path.join(directory, HOOK_CONFIG_FILE),
            render_hook_config(plan).encode(),
            mode=HOOK_CONFIG_MODE,
            gid=settings.spec.claim_gid,
            sync_dir=False,
        )
        write_atomic(
            self._spec_path(plan.uid),
            cdi.encode_spec(self._spec(plan)),
            mode=SPEC_MODE,
            sync_dir=False,
        )

    def _spec(self, plan: ClaimPlan) -> dict[str, Any]:
        level = log_level(plan)
        return cdi.build_claim_spec(
            settings=self._settings.spec,
            claim_uid=plan.uid,
            devices=[
                cdi.ClaimDevice(plan.cdi_device_name(device), device.minor)
                for device in plan.devices
            ],
            visible_uuids=plan.visible_uuids(),
            extra_env={"VGPU_LOG_LEVEL": level} if level else None,
        )

    def _spec_path(self, uid: str) -> str:
        return os.path.join(
            self._settings.cdi_root, cdi.spec_file_name(self._settings.spec.kind, uid)
        )

    def _remove_claim_files(self, uid: str) -> None:
        remove(self._spec_path(uid))
        shutil.rmtree(cdi.claim_dir(self._settings.state_dir, uid), ignore_errors=True)

    def _flush(self, target: int) -> None:
        """Persist the state at least as new as `target`; concurrent callers share one write."""
        with self._flush_lock:
            if self._persisted >= target:
                return
            with self._lock:
                snapshot = dict(self._prepared)
                version = self._version
            self._checkpoint.store(snapshot)
            self._persisted = version

    @contextmanager
    def _claim_lock(self, uid: str) -> Iterator[None]:
        with self._uid_locks_guard:
            lock, users = self._uid_locks.get(uid, (threading.Lock(), 0))
            self._uid_locks[uid] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._uid_locks_guard:
                lock, users = self._uid_locks[uid]
                if users == 1:
                    del self._uid_locks[uid]
                else:
                    self._uid_locks[uid] = (lock, users - 1)

    # --- start-up --------------------------------------------------------------------------

    def reconcile(self) -> ReconcileReport:
        """Make CDI specs and claim dirs agree with the checkpoint (run before serving)."""
        settings = self._settings
        report = ReconcileReport()
        os.makedirs(settings.cdi_root, mode=0o755, exist_ok=True)
        claims_root = os.path.join(settings.state_dir, "claims")
        os.makedirs(claims_root, mode=0o755, exist_ok=True)
        write_preload_file(settings.state_dir)
        with self._lock:
            prepared = dict(self._prepared)
        kind = settings.spec.kind
        for entry in sorted(os.listdir(settings.cdi_root)):
            uid = cdi.claim_uid_of_spec_file(kind, entry)
            if uid is not None and uid not in prepared:
                remove(os.path.join(settings.cdi_root, entry))
                report.removed_specs.append(uid)
        for entry in sorted(os.listdir(claims_root)):
            if entry not in prepared:
                shutil.rmtree(os.path.join(claims_root, entry), ignore_errors=True)
                report.removed_claim_dirs.append(entry)
        for uid, plan in prepared.items():
            if self._files_stale(plan):
                self._write_claim_files(plan)
                report.rewritten.append(uid)
        fsync_dir(settings.cdi_root)
        fsync_dir(claims_root)
        if report.removed_specs or report.removed_claim_dirs or report.rewritten:
            log.info(
                "reconciled with checkpoint (%d claims): removed orphan specs %s, orphan claim "
                "dirs %s; rewrote files of %s",
                len(prepared),
                report.removed_specs,
                report.removed_claim_dirs,
                report.rewritten,
            )
        return report

    def _files_present(self, plan: ClaimPlan) -> bool:
        conf = os.path.join(cdi.claim_dir(self._settings.state_dir, plan.uid), HOOK_CONFIG_FILE)
        return os.path.exists(conf) and os.path.exists(self._spec_path(plan.uid))

    def _files_stale(self, plan: ClaimPlan) -> bool:
        conf = os.path.join(cdi.claim_dir(self._settings.state_dir, plan.uid), HOOK_CONFIG_FILE)
        return _read(conf) != render_hook_config(plan).encode() or _read(
            self._spec_path(plan.uid)
        ) != cdi.encode_spec(self._spec(plan))


def write_preload_file(state_dir: str) -> None:
    """`<state-dir>/hook/ld.so.preload`: mounted over the container's /etc/ld.so.preload."""
    path = cdi.preload_path(state_dir)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    content = f"{names.CONTAINER_HOOK_PATH}\n".encode()
    if _read(path) != content:
        write_atomic(path, content, mode=0o644)


def _make_claim_dir(directory: str, gid: int) -> None:
    os.makedirs(directory, exist_ok=True)
    status = os.stat(directory)
    if status.st_gid != gid:
        try:
            os.chown(directory, -1, gid)
        except PermissionError:
            raise ClaimError(
                f"cannot give claim directory {directory} group {gid} (--claim-gid): the plugin "
                f"must run as root or be a member of that group"
            ) from None
    if status.st_mode & 0o7777 != CLAIM_DIR_MODE:
        os.chmod(directory, CLAIM_DIR_MODE)


def _check_uid(ref: ClaimRef) -> None:
    if not cdi.valid_claim_uid(ref.uid):
        raise ClaimError(
            f"claim {ref.namespace}/{ref.name}: invalid UID {ref.uid!r} (expected a Kubernetes "
            f"UID: letters, digits and '-')"
        )


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _user_error(exc: Exception, ref: ClaimRef) -> str:
    if isinstance(exc, kube.KubeError):
        return f"reading ResourceClaim {ref}: {exc}"
    return str(exc)


class _ToolkitIds:
    """NVIDIA Container Toolkit CDI IDs per GPU UUID, rescanned when a spec dir changes."""

    def __init__(self, spec_dirs: tuple[str, ...]) -> None:
        self._dirs = spec_dirs
        self._stamp: tuple[float, ...] | None = None
        self._ids: dict[str, str] = {}
        self._lock = threading.Lock()

    def by_uuid(self, inventory: NodeInventory) -> dict[str, tuple[str, ...]]:
        if not self._dirs:
            return {}
        stamp = tuple(_mtime(d) for d in self._dirs)
        with self._lock:
            if stamp != self._stamp:
                self._ids = cdi.nvidia_toolkit_ids(self._dirs)
                self._stamp = stamp
            ids = self._ids
        result: dict[str, tuple[str, ...]] = {}
        for gpu in inventory.gpus:
            found = ids.get(gpu.uuid) or ids.get(str(gpu.index))
            if found:
                result[gpu.uuid] = (found,)
        return result


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return -1.0
