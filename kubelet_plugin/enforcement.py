"""Node-side memory enforcement: catch what the in-container hook cannot (bypass, no hook at all).

Why: the hook (`vgpu_hook`) is a cooperative limit. A program that calls the driver without the
loader's preload (a static binary, a cleared `/etc/ld.so.preload`, a raw syscall path) or an image
where the hook never loads allocates freely. Only the node sees the truth: NVML's per-process
memory. Every `period` seconds the enforcer:
1. takes each prepared claim's memory cap per GPU from the Preparer's in-memory plans (the same
   merged device lines `vgpu.conf` states; admin-access devices are uncapped);
2. asks NVML which processes use each of those GPUs and how much memory each holds;
3. attributes each process to claims by its mounts: the CDI spec bind-mounts every claim's
   directory at `/run/vgpu-dra/claims/<uid>` in the container, so `/proc/<pid>/mountinfo` names
   the claims of a process whether or not it loaded the hook (host pids, any pid namespace);
4. a process of a claim that is neither in the claim region's slots nor holding the region open
   (the governor's attribution, `kubelet_plugin.governor.pids_holding`) runs without the hook:
   reported once per process;
5. a claim whose processes together hold more than its cap plus a tolerance is reported and, with
   `enforce: kill` (the default), its processes are SIGKILLed (those without the hook first, then
   the largest) until the rest fits; with `enforce: report` only reported.

Reports go to `Reporter`s: a log line always, a Kubernetes Event on the ResourceClaim
(`EventReporter`, with the node's credentials, posted from a background queue so that an API
server that is slow to answer never holds a tick up) when the plugin has an API client, and the
plugin's metrics (`MetricsReporter`).

Supervision (`dra_driver.supervision`, loop `enforcement`): one GPU whose processes or claims
make the pass raise is skipped for that tick (logged with its traceback the first time), the
other GPUs are still policed; a tick that raises as a whole is counted and backed off. Every
tick is a beat: no tick within `DEADLINE_S` (an NVML call or a /proc read that never returns)
is a stall, and the plugin restarts.

What it cannot catch (docs/health.md): usage between two ticks, memory NVML does not attribute to
a process (some driver-internal allocations), and processes whose claim directory is not mounted
(a process outside any claim's container is nobody's to police).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dra_driver import kube, names
from dra_driver.events import ObjectRef, record_warning
from dra_driver.nvml import DeviceHandle, Nvml, NvmlError, PyNvml, session
from dra_driver.supervision import Supervisor
from kubelet_plugin.background import Background
from kubelet_plugin.governor import pids_holding
from kubelet_plugin.plan import ClaimPlan, hook_device_lines

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 0.5
LOOP = "enforcement"
# A tick is one NVML process list per capped GPU, /proc reads and kills: milliseconds, seconds on
# a GPU in trouble (Events are posted off the tick). 60 s (120 periods) without a finished tick
# is a call that does not return: a stall.
DEADLINE_S = 60.0
MIB = 1 << 20
# Over the cap by less than this is not a violation: NVML counts per-process context memory the
# hook does not (hundreds of MiB on real GPUs), and a share of rounding.
TOLERANCE_FRACTION = 0.02
TOLERANCE_BYTES = 64 * MIB
CONTEXT_ALLOWANCE_BYTES = 512 * MIB  # per process on the GPU

REASON_OVER_CAP = "GPUMemoryCapExceeded"
REASON_NO_HOOK = "GPUHookMissing"


# ---- pure decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimCap:
    """A claim's memory cap on one GPU and what to do when it is exceeded."""

    uid: str
    namespace: str
    name: str
    uuid: str
    memory: int
    kill: bool


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int
    hooked: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one claim's processes on one GPU amount to, and whom to kill."""

    cap: ClaimCap
    used: int
    allowed: int
    kill: tuple[int, ...]

    @property
    def over(self) -> bool:
        return self.used > self.allowed


def memory_caps(plans: Mapping[str, ClaimPlan]) -> list[ClaimCap]:
    """The capped (non-admin) GPUs of every prepared claim, merged per GPU like vgpu.conf."""
    caps = []
    for uid, plan in plans.items():
        admin = {d.uuid for d in plan.devices if d.admin_access}
        kill = {d.uuid: d.enforce == "kill" for d in plan.devices}
        for line in hook_device_lines(plan):
            if line.uuid not in admin:
                caps.append(
                    ClaimCap(
                        uid, plan.namespace, plan.name, line.uuid, line.memory, kill[line.uuid]
                    )
                )
    return caps


def allowed_bytes(cap: int, processes: int) -> int:
    """The most a claim's processes may hold on a GPU before it counts as over its cap."""
    tolerance = max(TOLERANCE_BYTES, int(cap * TOLERANCE_FRACTION))
    return cap + tolerance + CONTEXT_ALLOWANCE_BYTES * processes


def judge(cap: ClaimCap, processes: Sequence[GpuProcess]) -> Verdict:
    """Over the cap? Then whom to kill (with `kill`): processes without the hook first, then the
    largest, until what remains fits."""
    used = sum(p.used_bytes for p in processes)
    allowed = allowed_bytes(cap.memory, len(processes))
    if used <= allowed or not cap.kill:
        return Verdict(cap, used, allowed, ())
    victims: list[int] = []
    remaining = list(processes)
    for proc in sorted(processes, key=lambda p: (p.hooked, -p.used_bytes, p.pid)):
        if sum(p.used_bytes for p in remaining) <= allowed_bytes(cap.memory, len(remaining)):
            break
        victims.append(proc.pid)
        remaining.remove(proc)
    return Verdict(cap, used, allowed, tuple(victims))


def claims_of_mountinfo(text: str) -> set[str]:
    """Claim UIDs whose directories are mounted at `/run/vgpu-dra/claims/<uid>` (mountinfo's
    fifth field is the mount point)."""
    prefix = names.CONTAINER_CLAIMS_DIR + "/"
    found = set()
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and fields[4].startswith(prefix):
            uid = fields[4][len(prefix) :]
            if uid and "/" not in uid:
                found.add(uid)
    return found


# ---- reporting --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    reason: str
    cap: ClaimCap
    message: str
    pids: tuple[int, ...] = ()


class Reporter(Protocol):
    def report(self, report: Report) -> None: ...


class LogReporter:
    def report(self, report: Report) -> None:
        log.warning(
            "claim %s/%s (%s): %s",
            report.cap.namespace,
            report.cap.name,
            report.cap.uid,
            report.message,
        )


class MetricsReporter:
    """Counts reports and kills (kubelet_plugin.metrics `observe_enforcement`)."""

    def __init__(self, observe: Callable[[str, int], None]) -> None:
        self._observe = observe

    def report(self, report: Report) -> None:
        # Only an over-cap report's pids were killed; a missing-hook report names the process.
        self._observe(report.reason, len(report.pids) if report.reason == REASON_OVER_CAP else 0)


class EventReporter:
    """A Warning Event on the ResourceClaim, created with the plugin's (node's) credentials
    from a background queue (`kubelet_plugin.background`, loop `enforcement-events`): the tick
    only queues it."""

    def __init__(
        self,
        client: kube.KubeClient,
        node_name: str,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._client = client
        self._node = node_name
        self._work: Background[Report] = Background(
            self._post, name="enforcement-events", supervisor=supervisor
        )

    def report(self, report: Report) -> None:
        if not self._work.submit(report):
            log.debug("enforcement: event queue full; %s not posted", report.reason)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued Event was posted (tests, shutdown)."""
        self._work.flush(timeout_s)

    def close(self) -> None:
        self._work.close()

    def _post(self, report: Report) -> None:
        cap = report.cap
        record_warning(
            self._client,
            ObjectRef.claim(cap.namespace, cap.name, cap.uid),
            report.reason,
            report.message,
            component=names.OTEL_SERVICE_KUBELET_PLUGIN,
            host=self._node,
        )


# ---- the enforcer -------------------------------------------------------------------------------


class ProcessSource(Protocol):
    def processes(self, uuid: str) -> list[tuple[int, int]] | None:
        """(host pid, bytes) of each process on the GPU; None when NVML cannot say."""
        ...


class NvmlProcesses:
    """ProcessSource over the NVML seam; the caller holds the NVML session."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._handles: dict[str, DeviceHandle] = {}

    def processes(self, uuid: str) -> list[tuple[int, int]] | None:
        try:
            handle = self._handles.get(uuid)
            if handle is None:
                handle = self._handles[uuid] = self._nvml.device_by_uuid(uuid)
            return [(p.pid, p.used_bytes) for p in self._nvml.running_processes(handle)]
        except NvmlError as exc:
            log.debug("enforcement: processes of %s: %s", uuid, exc)
            return None


@dataclass
class Enforcer:
    """One `tick()` = one pass over every capped claim; the thread body is `run()`."""

    state_dir: str
    plans: Callable[[], Mapping[str, ClaimPlan]]
    source: ProcessSource
    reporters: Sequence[Reporter]
    proc: str = "/proc"
    kill: Callable[[int], None] = field(default=lambda pid: os.kill(pid, signal.SIGKILL))
    _reported_unhooked: set[tuple[str, int]] = field(default_factory=set)
    _reported_over: set[tuple[str, str]] = field(default_factory=set)
    _failing: set[str] = field(default_factory=set)  # GPUs whose last pass raised (logged once)

    def tick(self) -> list[Verdict]:
        caps = memory_caps(self.plans())
        by_gpu: dict[str, list[ClaimCap]] = {}
        for cap in caps:
            by_gpu.setdefault(cap.uuid, []).append(cap)
        verdicts = []
        over_now: set[tuple[str, str]] = set()
        for gpu, gpu_caps in by_gpu.items():
            try:
                verdicts += self._police(gpu, gpu_caps, over_now)
            except Exception:  # one GPU's odd processes must not stop the others' enforcement
                # Its findings stand until it can be judged again (no repeated reports).
                over_now |= {key for key in self._reported_over if key[1] == gpu}
                if gpu not in self._failing:
                    self._failing.add(gpu)
                    log.exception("enforcement: GPU %s skipped (logged once)", gpu)
                continue
            if gpu in self._failing:
                self._failing.discard(gpu)
                log.info("enforcement: GPU %s is policed again", gpu)
        self._reported_over &= over_now  # a claim that fits again is reported again next time
        prepared = {cap.uid for cap in caps}
        self._reported_unhooked = {k for k in self._reported_unhooked if k[0] in prepared}
        return verdicts

    def _police(
        self, gpu: str, gpu_caps: Sequence[ClaimCap], over_now: set[tuple[str, str]]
    ) -> list[Verdict]:
        """Judge (and enforce) every capped claim on one GPU; adds the over-cap ones."""
        listed = self.source.processes(gpu)
        if not listed:
            return []
        verdicts = []
        owners = {pid: self._claims_of(pid) for pid, _ in listed}
        for cap in gpu_caps:
            mine = [(pid, used) for pid, used in listed if cap.uid in owners[pid]]
            if not mine:
                continue
            hooked = self._hooked(cap.uid, [pid for pid, _ in mine])
            processes = [GpuProcess(pid, used, pid in hooked) for pid, used in mine]
            self._report_unhooked(cap, processes)
            verdict = judge(cap, processes)
            verdicts.append(verdict)
            if verdict.over:
                over_now.add((cap.uid, cap.uuid))
                self._enforce(verdict)
        return verdicts

    def run(
        self,
        stop: threading.Event,
        period: float = DEFAULT_PERIOD_S,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        """Tick every `period` until `stop` is set, as the supervised loop `enforcement`."""
        supervisor = supervisor or Supervisor()
        supervisor.pace(LOOP, self.tick, stop, period_s=lambda: period, deadline_s=DEADLINE_S)

    def _claims_of(self, pid: int) -> set[str]:
        try:
            with open(f"{self.proc}/{pid}/mountinfo", encoding="utf-8", errors="replace") as fh:
                return claims_of_mountinfo(fh.read())
        except OSError:
            return set()

    def _hooked(self, uid: str, pids: Iterable[int]) -> set[int]:
        """Which of these node pids run the hook: the kernel's word (they hold the claim's
        region open), never the region's own pid slots, which the tenant can write and which
        hold pids of the container's namespace, not the node's."""
        path = os.path.join(self.state_dir, "claims", uid, "region")
        return pids_holding(path, set(pids), self.proc)

    def _report_unhooked(self, cap: ClaimCap, processes: Sequence[GpuProcess]) -> None:
        for proc in processes:
            key = (cap.uid, proc.pid)
            if proc.hooked or key in self._reported_unhooked:
                continue
            self._reported_unhooked.add(key)
            self._send(
                Report(
                    REASON_NO_HOOK,
                    cap,
                    f"process {proc.pid} uses GPU {cap.uuid} without the vgpu hook "
                    f"({proc.used_bytes // MIB} MiB); its memory and compute caps are enforced "
                    "only by the node",
                    (proc.pid,),
                )
            )

    def _enforce(self, verdict: Verdict) -> None:
        cap = verdict.cap
        killed = []
        for pid in verdict.kill:
            if cap.uid not in self._claims_of(pid):  # exited, or the pid was reused meanwhile
                continue
            try:
                self.kill(pid)
            except ProcessLookupError:
                continue
            except OSError as exc:
                log.error("enforcement: cannot kill %d of claim %s: %s", pid, cap.uid, exc)
                continue
            killed.append(pid)
        key = (cap.uid, cap.uuid)
        if not killed and key in self._reported_over:
            return
        self._reported_over.add(key)
        if killed:
            action = "killed " + ", ".join(map(str, killed))
        elif cap.kill:
            action = "its processes exited before they could be killed"
        else:
            action = "reported only (enforce: report)"
        self._send(
            Report(
                REASON_OVER_CAP,
                cap,
                f"uses {verdict.used // MIB} MiB on GPU {cap.uuid}, over its cap of "
                f"{cap.memory // MIB} MiB (tolerated up to {verdict.allowed // MIB} MiB): {action}",
                tuple(killed),
            )
        )

    def _send(self, report: Report) -> None:
        for reporter in self.reporters:
            try:
                reporter.report(report)
            except Exception:  # a failing reporter must not stop enforcement
                log.exception("enforcement: reporter failed")


def start_enforcer(
    state_dir: str,
    plans: Callable[[], Mapping[str, ClaimPlan]],
    stop: threading.Event,
    reporters: Sequence[Reporter],
    *,
    nvml: Nvml | None = None,
    period: float = DEFAULT_PERIOD_S,
    supervisor: Supervisor | None = None,
) -> threading.Thread:
    """Run the enforcer in a daemon thread with its own NVML session until `stop` is set.

    The loop is supervised (registered) once the session is open: a node whose NVML cannot be
    opened runs without enforcement (a warning), which is not a stall.
    """

    def body() -> None:
        try:
            with session(nvml or PyNvml()) as opened:  # NvmlError: from opening it only
                enforcer = Enforcer(state_dir, plans, NvmlProcesses(opened), reporters)
                enforcer.run(stop, period, supervisor=supervisor)  # raises nothing
        except NvmlError as exc:
            log.warning("memory enforcement disabled: NVML: %s", exc)

    thread = threading.Thread(target=body, name="enforcement", daemon=True)
    thread.start()
    return thread
