"""NodePrepareResources / NodeUnprepareResources: the one place where prepare has side effects.

Called by the gRPC adapters (`kubelet_plugin.dra_service`) with claim references; returns one
outcome per claim, so a bad claim never fails its neighbours. Per claim the order is fixed, which
is what makes kubelet retries and crashes safe:

    hook library usable? (`kubelet_plugin.hookcheck`, fail closed) -> checkpoint says prepared?
    -> return the recorded IDs
    read the claim (API, bounded by the kubelet call's deadline) -> plan (pure,
    `kubelet_plugin.plan`) -> overbooking guard (under lock) -> claim dir + vgpu.conf -> CDI spec
    -> checkpoint record (journal line, fdatasync'ed) -> answer

Unprepare removes the spec, the claim dir, then the checkpoint entry; unknown claims succeed.
`reconcile()` runs at start-up and makes the CDI root and claim dirs agree with the checkpoint.

Concurrency: claims of one call run on a thread pool; one lock guards the in-memory state and the
overbooking decision, file I/O happens outside it, and concurrent checkpoint records coalesce into
one append and one sync (group commit). A per-UID lock keeps one claim from being worked on twice
at once.
"""

from __future__ import annotations

import contextvars
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from opentelemetry import trace

from dra_driver import cdi, kube
from dra_driver.gpu import NodeInventory
from dra_driver.tracing import installed_tracer
from kubelet_plugin.boot import BootRecord
from kubelet_plugin.checkpoint import CheckpointJournal, Record
from kubelet_plugin.claimfiles import ClaimFiles, ReconcileReport
from kubelet_plugin.claims import ClaimError, ClaimRef, clip, fetch_claim, parse_allocation
from kubelet_plugin.hookcheck import HookLibraryCheck, HookLibraryError
from kubelet_plugin.mig_instances import MigInstances
from kubelet_plugin.mig_ledger import LedgerEntry
from kubelet_plugin.plan import ClaimPlan, OverbookedError, check_usage, device_usage, plan_claim

log = logging.getLogger(__name__)


_T = TypeVar("_T")
# Reads a claim; the float is the time budget in seconds (None: the source's own default).
ClaimSource = Callable[[ClaimRef, float | None], dict[str, Any]]
# Of the kubelet call's remaining time, this share (at most API_MARGIN_S) is kept back for
# answering: a claim GET that runs out of time fails that claim, it never makes the call late.
API_MARGIN_SHARE = 0.2
API_MARGIN_S = 1.0


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
    # Why it failed, one word for metrics and events ("" on success): see `failure_reason`.
    reason: str = ""


class PrepareObserver(Protocol):
    """Told about every claim prepared or unprepared (metrics, Events); must not raise."""

    def prepared(self, ref: ClaimRef, outcome: PrepareOutcome, seconds: float) -> None: ...

    def unprepared(self, ref: ClaimRef, error: str, seconds: float) -> None: ...


def kube_claim_source(client: kube.KubeClient) -> ClaimSource:
    """Claims from the API server (the production source)."""
    return lambda ref, timeout_s: fetch_claim(client, ref, timeout_s)


class Preparer:
    """Prepared-claim state of this node, backed by the checkpoint file."""

    def __init__(
        self,
        settings: NodeSettings,
        inventory: NodeInventory,
        claim_source: ClaimSource,
        *,
        max_workers: int = 16,
        hook_check: HookLibraryCheck | None = None,
        observer: PrepareObserver | None = None,
        tracer: trace.Tracer | None = None,
        mig: MigInstances | None = None,
    ) -> None:
        self._settings = settings
        # Dynamic MIG (docs/mig.md): instances made between the guard and the claim's files.
        self._mig = mig
        self._observer = observer
        # Tracing is off unless a tracer is given or a provider was installed before this
        # (dra_driver.tracing): then no span is even created, since the OpenTelemetry API's
        # no-op spans still cost ~5-25 us each (bench/telemetry_bench.py).
        self._tracer = tracer if tracer is not None else installed_tracer(TRACER_NAME)
        self._inventory = inventory
        self._source = claim_source
        self._checkpoint = CheckpointJournal(settings.state_dir)
        self._prepared: dict[str, ClaimPlan] = self._checkpoint.load()
        self._checkpoint.open(self._prepared)
        self._pending: list[Record] = []  # changes not yet in the journal (under _lock)
        self._reserved: dict[str, ClaimPlan] = {}  # passed the guard, files being written
        # What prepared and reserved claims consume per device: the overbooking guard's total,
        # kept as claims come and go (a batch of n claims checks in O(n), not O(n^2)).
        self._usage = device_usage(self._prepared.values())
        self._lock = threading.Lock()
        self._version = 0
        self._persisted = 0
        self._flush_lock = threading.Lock()
        self._uid_locks: dict[str, tuple[threading.Lock, int]] = {}
        self._uid_locks_guard = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="prepare")
        self._toolkit = _ToolkitIds(settings.toolkit_spec_dirs)
        self._files = ClaimFiles(cdi_root=settings.cdi_root, spec=settings.spec)
        self._hook = hook_check or HookLibraryCheck(settings.spec.hook_path)

    # --- kubelet calls ---------------------------------------------------------------------

    def prepare(
        self, refs: Sequence[ClaimRef], *, time_remaining_s: float | None = None
    ) -> dict[str, PrepareOutcome]:
        """Prepare each claim; `time_remaining_s` is what is left of the kubelet's deadline."""
        api_deadline = None
        if time_remaining_s is not None:
            margin = min(API_MARGIN_S, time_remaining_s * API_MARGIN_SHARE)
            # Never longer than the client's own timeout (a far deadline is no reason to wait).
            budget = min(time_remaining_s - margin, kube.DEFAULT_TIMEOUT_S)
            api_deadline = time.monotonic() + budget
        return self._batch(refs, lambda ref: self._observed_prepare(ref, api_deadline))

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error text ("" = success)."""
        return self._batch(refs, self._observed_unprepare)

    def prepared(self) -> dict[str, ClaimPlan]:
        """Snapshot of the prepared claims (for health, metrics and the governor)."""
        with self._lock:
            return dict(self._prepared)

    def inventory(self) -> NodeInventory:
        """The inventory new claims are planned against (for metrics)."""
        with self._lock:
            return self._inventory

    def update_inventory(self, inventory: NodeInventory) -> None:
        """Use a fresh discovery for new claims (prepared claims keep what they recorded)."""
        with self._lock:
            self._inventory = inventory

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._checkpoint.close()

    def _batch(self, refs: Sequence[ClaimRef], work: Callable[[ClaimRef], _T]) -> dict[str, _T]:
        if len(refs) <= 1:  # the common case: no thread hop on the latency path
            return {ref.uid: work(ref) for ref in refs}
        # Each claim runs in a copy of the caller's context, so its span is a child of the call's.
        futures = {
            ref.uid: self._pool.submit(contextvars.copy_context().run, work, ref) for ref in refs
        }
        return {uid: future.result() for uid, future in futures.items()}

    # --- prepare ---------------------------------------------------------------------------

    def _observed_prepare(self, ref: ClaimRef, api_deadline: float | None) -> PrepareOutcome:
        started = time.perf_counter()
        if self._tracer is None:
            outcome = self._prepare_claim(ref, api_deadline)
        else:
            attrs = _span_attrs(ref)
            with self._tracer.start_as_current_span("prepare claim", attributes=attrs) as span:
                outcome = self._prepare_claim(ref, api_deadline)
                span.set_attribute("vgpu_dra.outcome", outcome.reason or "prepared")
                span.set_attribute("vgpu_dra.devices", [d.device for d in outcome.devices])
                if outcome.error:
                    span.set_status(trace.StatusCode.ERROR, outcome.error)
        if self._observer is not None:
            self._observer.prepared(ref, outcome, time.perf_counter() - started)
        return outcome

    def _prepare_claim(self, ref: ClaimRef, api_deadline: float | None) -> PrepareOutcome:
        try:
            _check_uid(ref)
            self._hook.verify()  # fail closed: a hook that cannot load means no caps
            with self._claim_lock(ref.uid):
                return PrepareOutcome(devices=self._prepare_locked(ref, api_deadline))
        except (ClaimError, kube.KubeError) as exc:
            log.warning("prepare %s failed: %s", ref, exc)
            return PrepareOutcome(error=_user_error(exc, ref), reason=failure_reason(exc))
        except HookLibraryError as exc:
            log.error("prepare %s refused: %s", ref, exc)
            return PrepareOutcome(error=f"prepare {ref} refused: {exc}", reason="hook_library")
        except OSError as exc:
            log.exception("prepare %s failed writing files", ref)
            return PrepareOutcome(error=f"prepare {ref}: {_os_error(exc)}", reason="node_io")
        except Exception as exc:
            log.exception("prepare %s failed unexpectedly", ref)
            return PrepareOutcome(
                error=f"prepare {ref}: internal error: {exc}", reason=failure_reason(exc)
            )

    def _prepare_locked(
        self, ref: ClaimRef, api_deadline: float | None
    ) -> tuple[PreparedDevice, ...]:
        with self._lock:
            known = self._prepared.get(ref.uid)
        if known is not None:
            log.debug("claim %s already prepared; returning the recorded devices", ref)
            if not self._files.present(known):  # removed behind our back: put them back
                log.warning("claim %s: CDI spec or hook config missing; rewriting", ref)
                self._files.write(known)
            return self._result(known)
        budget = None if api_deadline is None else api_deadline - time.monotonic()
        if budget is not None and budget <= 0:
            raise ClaimError(
                f"prepare {ref}: the kubelet's deadline passed before the claim could be read "
                f"(retryable, the kubelet retries the prepare)"
            )
        with self._step("read ResourceClaim"):
            claim = self._source(ref, budget)
        allocation = parse_allocation(
            claim, ref, driver=self._settings.driver, node_name=self._settings.node_name
        )
        with self._lock:
            inventory = self._inventory
        plan = plan_claim(allocation, inventory, toolkit_ids=self._toolkit.by_uuid(inventory))
        with self._lock:
            check_usage(
                plan,
                self._usage,  # prepared and reserved claims, never this one (per-UID lock)
                inventory,
                oversubscription_ratio=self._settings.oversubscription_ratio,
            )
            self._reserved[plan.uid] = plan
            self._usage.add(plan)
        try:
            if any(d.mig_dynamic for d in plan.devices):
                with self._step("create MIG instances"):
                    plan = self._create_mig(plan)
                with self._lock:
                    self._reserved[plan.uid] = plan
            with self._step("write claim files"):
                self._files.write(plan)
            with self._lock:
                self._prepared[plan.uid] = self._reserved.pop(plan.uid)
                target = self._record(("put", plan))
            with self._step("write checkpoint"):
                self._flush(target)
        except BaseException:
            with self._lock:
                if self._prepared.pop(plan.uid, None) is not None:
                    self._record(("del", plan.uid))
                    self._usage.remove(plan)
            self._files.remove(plan.uid)
            self._destroy_mig(plan.uid)
            raise
        finally:
            with self._lock:
                if self._reserved.pop(plan.uid, None) is not None:  # failed before it counted
                    self._usage.remove(plan)
        if log.isEnabledFor(logging.DEBUG):  # success is the common case: failures are warnings
            log.debug(
                "prepared claim %s: %s",
                ref,
                ", ".join(f"{d.device}(mem={d.memory},cores={d.cores})" for d in plan.devices),
            )
        return self._result(plan)

    def _create_mig(self, plan: ClaimPlan) -> ClaimPlan:
        """Create (or adopt) the claim's dynamic MIG instances; the plan with their UUIDs."""
        if self._mig is None:
            raise ClaimError(
                f"claim {plan.namespace}/{plan.name}: a dynamic MIG device is allocated but this "
                "plugin has no NVML to create instances with"
            )
        wanted = [
            LedgerEntry(
                claim=plan.uid,
                device=d.device,
                gpu_uuid=d.uuid,
                profile_id=d.mig_profile_id or 0,
                start=d.mig_start or 0,
                size=d.mig_size or 1,
                slices=d.mig_slices or 1,
            )
            for d in plan.devices
            if d.mig_dynamic
        ]
        uuids = self._mig.create(plan.uid, wanted)
        devices = tuple(
            d.model_copy(update={"mig_uuid": uuids[d.device]}) if d.device in uuids else d
            for d in plan.devices
        )
        return plan.model_copy(update={"devices": devices})

    def _destroy_mig(self, uid: str) -> None:
        """Undo a failed prepare's instances; a failure here is left to the start-up
        reconciliation (the ledger still names them)."""
        if self._mig is None or not self._mig.owns(uid):
            return
        try:
            self._mig.destroy(uid)
        except Exception:
            log.exception("claim %s: cannot destroy its MIG instances after a failed prepare", uid)

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

    def _observed_unprepare(self, ref: ClaimRef) -> str:
        started = time.perf_counter()
        if self._tracer is None:
            error = self._unprepare_claim(ref)
        else:
            attrs = _span_attrs(ref)
            with self._tracer.start_as_current_span("unprepare claim", attributes=attrs) as span:
                error = self._unprepare_claim(ref)
                if error:
                    span.set_status(trace.StatusCode.ERROR, error)
        if self._observer is not None:
            self._observer.unprepared(ref, error, time.perf_counter() - started)
        return error

    def _unprepare_claim(self, ref: ClaimRef) -> str:
        try:
            _check_uid(ref)
        except ClaimError as exc:
            return str(exc)
        try:
            with self._claim_lock(ref.uid):
                self._files.remove(ref.uid)
                # Instances first: one still in use fails the call, and the claim stays
                # prepared for the kubelet's retry (kubelet_plugin.mig_instances).
                if self._mig is not None and self._mig.owns(ref.uid):
                    self._mig.destroy(ref.uid)
                with self._lock:
                    known = self._prepared.pop(ref.uid, None)
                    target = 0
                    if known is not None:
                        target = self._record(("del", ref.uid))
                        self._usage.remove(known)
                if known is not None:
                    self._flush(target)
                    log.debug("unprepared claim %s", ref)
                else:
                    log.debug("unprepare %s: not prepared here; nothing to do", ref)
            return ""
        except OSError as exc:
            log.exception("unprepare %s failed", ref)
            return f"unprepare {ref}: {_os_error(exc)}"
        except Exception as exc:
            log.exception("unprepare %s failed", ref)
            return f"unprepare {ref}: {exc}"

    # --- state ---------------------------------------------------------------------------

    def _record(self, record: Record) -> int:
        """Queue a change for the journal (caller holds _lock); returns its version."""
        self._pending.append(record)
        self._version += 1
        return self._version

    def _flush(self, target: int) -> None:
        """Persist the state at least as new as `target`; concurrent callers share one write.

        Usually one journal append (one fdatasync) for every change queued so far; a full
        snapshot instead when the journal is long or an append failed half-way.
        """
        with self._flush_lock:
            if self._persisted >= target:
                return
            with self._lock:
                records, self._pending = self._pending, []
                version = self._version
                snapshot = dict(self._prepared) if self._checkpoint.wants_compaction else None
            try:
                if snapshot is not None:
                    self._checkpoint.compact(snapshot)
                else:
                    self._checkpoint.append(records)
            except BaseException:
                # Other claims' records went with this write: the next flush rewrites the
                # whole state (a snapshot) so theirs are not lost.
                self._checkpoint.mark_broken()
                raise
            self._persisted = version

    def _step(self, name: str) -> AbstractContextManager[object]:
        """A child span of the claim's span when tracing is on, else nothing at all."""
        if self._tracer is None:
            return _NO_SPAN
        return self._tracer.start_as_current_span(name)

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

    def reconcile(self, *, boot_id: str | None = None) -> ReconcileReport:
        """Make CDI specs and claim dirs agree with the checkpoint (run before serving).

        With `boot_id` (`kubelet_plugin.boot`): claims prepared in another boot of the node are
        forgotten first (their files go as orphans), so the kubelet's next call prepares them
        from the API; the boot is recorded once the checkpoint and files agree.
        """
        record = BootRecord(self._settings.state_dir)
        recorded = record.recorded() if boot_id else None
        with self._lock:
            if boot_id and recorded and recorded != boot_id and self._prepared:
                log.warning(
                    "the node rebooted since %d claims were prepared (boot %s, now %s): "
                    "forgetting them; the kubelet has them prepared again",
                    len(self._prepared),
                    recorded,
                    boot_id,
                )
                self._prepared.clear()
                self._usage = device_usage(())
                self._checkpoint.compact(self._prepared)
            prepared = dict(self._prepared)
        report = self._files.reconcile(prepared)
        if self._mig is not None:
            adopted, destroyed = self._mig.reconcile(set(prepared), self._inventory.gpus)
            if adopted or destroyed:
                log.info("MIG instances: %d adopted, %d destroyed", adopted, destroyed)
        if report.removed_specs or report.removed_claim_dirs or report.rewritten:
            log.info(
                "reconciled with checkpoint (%d claims): removed orphan specs %s, orphan claim "
                "dirs %s; rewrote files of %s",
                len(prepared),
                report.removed_specs,
                report.removed_claim_dirs,
                report.rewritten,
            )
        if boot_id and recorded != boot_id:
            record.store(boot_id)
        return report


def _check_uid(ref: ClaimRef) -> None:
    if not cdi.valid_claim_uid(ref.uid):
        raise ClaimError(
            f"claim {clip(ref.namespace)}/{clip(ref.name)}: invalid UID {clip(ref.uid)!r} "
            f"(expected a Kubernetes UID: letters, digits and '-')"
        )


def _os_error(exc: OSError) -> str:
    """A file error as the operator needs it: which path, and for a full disk, what to do."""
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return (
            f"no space left on the filesystem of{where or ' the state or CDI directory'}: free "
            f"space there (the claim is retried by the kubelet)"
        )
    return f"cannot write{where}: {exc.strerror or exc}"


_NO_SPAN = nullcontext()
TRACER_NAME = "vgpu-dra.kubelet-plugin"


def _span_attrs(ref: ClaimRef) -> dict[str, str]:
    return {
        "vgpu_dra.claim.uid": ref.uid,
        "vgpu_dra.claim.namespace": ref.namespace,
        "vgpu_dra.claim.name": ref.name,
    }


def failure_reason(exc: BaseException) -> str:
    """One bounded word per kind of prepare failure (a metrics label and an Event reason)."""
    if isinstance(exc, OverbookedError):
        return "overbooked"
    if isinstance(exc, ClaimError):
        return "invalid_claim"
    if isinstance(exc, kube.KubeError):
        return "api_error"
    return "internal"


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
