"""Every long-lived loop of the kubelet plugin under fault injection (issue 27).

What this proves, for each loop (`governor`, `enforcement`, `gpu-health`, `gpu-rescan`,
`slices`, `socket-watch` and the background queues `prepare-events`, `claim-containers`,
`enforcement-events`), started the way the plugin starts it, with one `Supervisor`:
1. a step that raises once is logged with its traceback and counted (`Supervisor.failures()`),
   and the loop goes on: a later step runs;
2. a step that hangs makes `Supervisor.stalled()` name the loop once its deadline has passed (a
   fake supervisor clock stands for the wait), and the watchdog fires with its name.
And for the rules the plugin builds on:
3. one bad claim (governor) or GPU (enforcement) is skipped alone, logged once: the others are
   served in the same pass;
4. an expected failure (a GPU rediscovery that fails) is reported, not counted as the loop's;
5. a loop stopped on request is never stalled, however old its last beat; a backoff longer
   than a loop's deadline is not a stall; a thread that ends early is one at once.
No test sleeps for a fixed time: each waits for its condition, with a deadline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver import supervision
from dra_driver.gpu import NodeInventory
from dra_driver.nvml import EventSet, XidEvent
from dra_driver.supervision import Supervisor
from kubelet_plugin import monitoring
from kubelet_plugin import region as rg
from kubelet_plugin.background import Background
from kubelet_plugin.backoff import Backoff
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.enforcement import ClaimCap, Enforcer, EventReporter, Report
from kubelet_plugin.events import PrepareEvents
from kubelet_plugin.governor import Governor, GpuSample
from kubelet_plugin.gpu_watch import watch_gpus
from kubelet_plugin.server import PluginServer, SocketPaths
from kubelet_plugin.slice_publisher import SlicePublisher
from kubelet_plugin.telemetry import ClaimPods
from tests.fixtures.claimdata import DRIVER, inventory
from tests.fixtures.governor_sim import SimGpu, SimNode
from vgpu_testbed.polling import wait_for

INJECTED = "injected fault"


class Clock:
    """The supervisor's clock: moved by hand to stand for a wait past a deadline."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fault:
    """Called once per step of a loop: raises on call `raise_at`, or from call `hang_at` on
    blocks until `release` is set."""

    def __init__(self, *, raise_at: int | None = None, hang_at: int | None = None) -> None:
        self.calls = 0
        self.raise_at = raise_at
        self.hang_at = hang_at
        self.hanging = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.raise_at:
            raise RuntimeError(INJECTED)
        if self.hang_at is not None and self.calls >= self.hang_at:
            self.hanging.set()
            self.release.wait(60)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's first backoff after a failed step, 0.5 s in production."""
    monkeypatch.setattr(supervision, "BACKOFF_START_S", 0.01)


# ---- the loops, each started as the plugin starts it, with a fault in its step ----------------


@dataclass
class Running:
    """A started loop: `stop` ends it (after the fault is released)."""

    stop: Callable[[], None]


class Idle:
    """A UtilSource with nothing to sample."""

    def sample(self, uuid: str, since_us: int) -> GpuSample | None:
        return None


class NoProcesses:
    def processes(self, uuid: str) -> list[tuple[int, int]] | None:
        return []


class QuietNvml:
    """The NVML calls the health watch makes when it watches no GPU."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...

    def create_event_set(self) -> EventSet:
        return EventSet("set")

    def free_event_set(self, events: EventSet) -> None: ...

    def wait_xid(self, events: EventSet, timeout_ms: int) -> XidEvent | None:
        return None


class Sink:
    def xid(self, uuid: str, xid: int) -> None: ...
    def probe(self, uuid: str, *, lost: bool, error: str) -> None: ...
    def memory(self, uuid: str, *, pending: bool, failed: bool) -> None: ...
    def expire(self) -> None: ...


class Devices:
    """`NodeDevices` as the rescan loop uses it; the fault is in folding the result in."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def rediscovered(self, fresh: NodeInventory) -> bool:
        self.fault()
        return False


@dataclass
class FakeApi:
    """The KubeClient calls of the publisher and of Event posting; `fault` in every create."""

    fault: Callable[[], None] = lambda: None
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, path: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return {"metadata": {"name": "node-1", "uid": "node-uid"}}

    def list(self, path: str, **query: Any) -> list[dict[str, Any]]:
        return list(self.slices.values())

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.fault()
        if "resourceslices" in path:
            self.slices[obj["metadata"]["name"]] = obj
        return obj

    def replace(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.slices[obj["metadata"]["name"]] = obj
        return obj

    def delete(self, path: str) -> None:
        self.slices.pop(path.rsplit("/", 1)[-1], None)


def _threads(*threads: threading.Thread) -> Callable[[], None]:
    def stop() -> None:
        for thread in threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), f"{thread.name} did not stop"

    return stop


def start_governor(fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path) -> Running:
    def caps() -> dict[str, Any]:
        fault()
        return {}

    governor = Governor(str(tmp), Idle(), caps)
    thread = threading.Thread(target=governor.run, args=(stop, 0.01), kwargs={"supervisor": sup})
    thread.start()
    return Running(_threads(thread))


def start_enforcement(fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path) -> Running:
    def plans() -> dict[str, Any]:
        fault()
        return {}

    enforcer = Enforcer(str(tmp), plans, NoProcesses(), [])
    thread = threading.Thread(target=enforcer.run, args=(stop, 0.01), kwargs={"supervisor": sup})
    thread.start()
    return Running(_threads(thread))


def start_gpu_health(fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path) -> Running:
    def uuids() -> list[str]:
        fault()
        return []

    def body() -> None:
        nvml = QuietNvml()
        watch_gpus(Sink(), uuids, stop, nvml=nvml, poll_ms=10, probe_s=0, supervisor=sup)  # type: ignore[arg-type]

    thread = threading.Thread(target=body)
    thread.start()
    return Running(_threads(thread))


def start_gpu_rescan(fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path) -> Running:
    thread = monitoring._rescan(
        Devices(fault),  # type: ignore[arg-type]
        None,
        lambda: inventory(count=1),
        stop,
        period=0.01,
        supervisor=sup,
    )
    return Running(_threads(thread))


def start_slices(fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path) -> Running:
    def source() -> NodeInventory:
        fault()
        return inventory(count=1)

    publisher = SlicePublisher(
        FakeApi(),  # type: ignore[arg-type]
        driver=DRIVER,
        node_name="node-1",
        backoff=Backoff(initial_s=0.01, maximum_s=0.02),
    )
    loop = sup.register("slices", monitoring.slices_deadline(0.01))
    thread = monitoring._thread(
        "slices",
        lambda: publisher.run(source, stop, resync_s=0.01, loop=loop),
        loop=loop,
        stop=stop,
    )
    return Running(_threads(thread))


def start_socket_watch(fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path) -> Running:
    paths = SocketPaths.for_driver(
        DRIVER, plugins_dir=str(tmp / "plugins"), registrar_dir=str(tmp / "reg")
    )
    server = PluginServer(
        driver=DRIVER, sockets=paths, preparer=None, watch_period_s=0.01, supervisor=sup
    )
    check = server.check_sockets

    def faulty_check() -> None:
        fault()
        check()

    server.check_sockets = faulty_check  # type: ignore[method-assign]
    server.start()
    return Running(lambda: server.stop(grace_s=0))


def start_prepare_events(
    fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path
) -> Running:
    events = PrepareEvents(FakeApi(fault), node="node-1", supervisor=sup)  # type: ignore[arg-type]
    feeder = _feed(stop, lambda n: events.prepare_failed(_ref(n), "internal", f"error {n}"))
    return Running(_then(feeder, events.close))


def start_claim_containers(
    fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path
) -> Running:
    def read(namespace: str, name: str) -> dict[str, Any]:
        fault()
        return {"metadata": {"uid": "other"}}

    pods = ClaimPods(read, supervisor=sup)

    def remember(n: int) -> None:
        reserved = [{"resource": "pods", "name": f"pod-{n}", "uid": f"p-{n}"}]
        claim: dict[str, Any] = {
            "metadata": {"namespace": "ns", "name": f"c-{n}"},
            "status": {"reservedFor": reserved},
        }
        pods.remember(f"u-{n}", claim)

    feeder = _feed(stop, remember)
    return Running(_then(feeder, pods.close))


def start_enforcement_events(
    fault: Fault, sup: Supervisor, stop: threading.Event, tmp: Path
) -> Running:
    reporter = EventReporter(FakeApi(fault), "node-1", supervisor=sup)  # type: ignore[arg-type]
    cap = ClaimCap("u-1", "ns", "c", "GPU-1", 1 << 30, kill=True)
    feeder = _feed(stop, lambda n: reporter.report(Report("GPUHookMissing", cap, f"finding {n}")))
    return Running(_then(feeder, reporter.close))


def _then(*calls: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for call in calls:
            call()

    return run


def _ref(n: int) -> ClaimRef:
    return ClaimRef("ns", f"claim-{n}", f"00000000-0000-4000-8000-{n:012d}")


def _feed(stop: threading.Event, submit: Callable[[int], None]) -> Callable[[], None]:
    """A queue's producer: one item every 10 ms until `stop` (the returned function joins it)."""

    def body() -> None:
        n = 0
        while not stop.wait(0.01):
            n += 1
            submit(n)

    thread = threading.Thread(target=body, name="feeder")
    thread.start()
    return _threads(thread)


Starter = Callable[[Fault, Supervisor, threading.Event, Path], Running]
LOOPS: dict[str, Starter] = {
    "governor": start_governor,
    "enforcement": start_enforcement,
    "gpu-health": start_gpu_health,
    "gpu-rescan": start_gpu_rescan,
    "slices": start_slices,
    "socket-watch": start_socket_watch,
    "prepare-events": start_prepare_events,
    "claim-containers": start_claim_containers,
    "enforcement-events": start_enforcement_events,
}


@contextmanager
def started(
    name: str, fault: Fault, tmp_path: Path
) -> Iterator[tuple[Supervisor, Clock, threading.Event]]:
    """Loop `name` running with `fault` in its step; stopped (and the fault released) after."""
    clock = Clock()
    sup = Supervisor(clock=clock)
    stop = threading.Event()
    running = LOOPS[name](fault, sup, stop, tmp_path)
    try:
        yield sup, clock, stop
    finally:
        stop.set()
        fault.release.set()
        running.stop()


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_step_that_raises_once_is_logged_counted_and_the_loop_goes_on(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fault = Fault(raise_at=2)
    with caplog.at_level(logging.INFO), started(name, fault, tmp_path) as (sup, _, _):
        wait_for(f"{name} to step again after the failure", lambda: fault.calls >= 4, interval=0.01)
        assert sup.failures() == {name: 1}
        assert sup.stalled() == []
    failed = [r for r in caplog.records if r.exc_info and INJECTED in str(r.exc_info[1])]
    assert len(failed) == 1, f"{name}: the failure is logged once, with its traceback"
    assert failed[0].levelno >= logging.ERROR


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_step_that_hangs_is_a_stall_the_watchdog_reports(name: str, tmp_path: Path) -> None:
    fault = Fault(hang_at=2)
    with started(name, fault, tmp_path) as (sup, clock, stop):
        assert fault.hanging.wait(30), f"{name} never reached its second step"
        [loop] = sup.loops()
        assert (loop.name, sup.stalled()) == (name, [])  # within its deadline: fine
        clock.now += loop.deadline_s + loop.grace_s + 1
        assert sup.stalled() == [name]
        fired: list[list[str]] = []
        sup.watchdog(stop, fired.append, period_s=0.01)
        wait_for("the watchdog", lambda: fired, interval=0.01)
        assert fired == [[name]]


# ---- one bad object costs itself, not the pass ---------------------------------------------------


def test_a_claim_whose_control_raises_is_skipped_the_others_are_governed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = SimNode(tmp_path)
    odd = node.claim("odd", 30, pid=101)
    fine = node.claim("fine", 30, pid=102)
    control = Governor._control

    def control_or_fail(self: Governor, claim: Any, *args: Any, **kwargs: Any) -> None:
        if claim.uid == "odd":
            raise RuntimeError("a region no hook writes")
        control(self, claim, *args, **kwargs)

    monkeypatch.setattr(Governor, "_control", control_or_fail)
    with caplog.at_level(logging.INFO), node.running(SimGpu({101: odd, 102: fine})) as run:
        run.ticks(10)
        with rg.Region(str(fine)) as region:
            fine_device = region.layout.devices[0]
            assert (fine_device.rate_source, fine_device.governor_stamp_ns > 0) == (
                rg.RATE_GOVERNOR,
                True,
            )
        with rg.Region(str(odd)) as region:
            assert region.layout.devices[0].governor_stamp_ns == 0  # never reached
        monkeypatch.setattr(Governor, "_control", control)
        run.ticks(1)
    skipped = [r for r in caplog.records if "claim odd skipped" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].exc_info is not None  # once, not every tick
    assert "governor: claim odd is controlled again" in caplog.text


GIB = 1 << 30


def test_a_gpu_whose_processes_cannot_be_judged_is_skipped_the_others_are_policed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kubelet_plugin.plan import ClaimPlan, DevicePlan

    proc = tmp_path / "proc"
    for pid, uid in ((100, "u-a"), (200, "u-b")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "mountinfo").write_text(
            f"1 2 0:1 / /run/vgpu-dra/claims/{uid} rw - tmpfs t rw\n"
        )

    def plan(uid: str, uuid: str) -> ClaimPlan:
        device = DevicePlan(
            request="gpu", pool="n", device="gpu-0", uuid=uuid, minor=0, memory=GIB, cores=0
        )
        return ClaimPlan(uid=uid, namespace="ns", name=uid, devices=(device,))

    class Listing:
        def processes(self, uuid: str) -> list[tuple[int, int]] | None:
            if uuid == "GPU-A":
                return [(100, "three GiB")]  # type: ignore[list-item]
            return [(200, 4 * GIB)]

    killed: list[int] = []
    plans = {"u-a": plan("u-a", "GPU-A"), "u-b": plan("u-b", "GPU-B")}
    enforcer = Enforcer(
        str(tmp_path / "state"), lambda: plans, Listing(), [], proc=str(proc), kill=killed.append
    )
    with caplog.at_level(logging.INFO):
        enforcer.tick()
        enforcer.tick()
    assert killed == [200, 200]  # GPU-B's claim is over its cap on every pass
    skipped = [r for r in caplog.records if "GPU GPU-A skipped" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].exc_info is not None


def test_a_failed_rediscovery_is_reported_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def rediscover() -> NodeInventory:
        calls.append(1)
        raise RuntimeError("NVML: driver not loaded")

    sup = Supervisor()
    stop = threading.Event()
    thread = monitoring._rescan(
        Devices(Fault()),  # type: ignore[arg-type]
        None,
        rediscover,
        stop,
        period=0.01,
        supervisor=sup,
    )
    try:
        wait_for("three rescans", lambda: len(calls) >= 3, interval=0.01)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert sup.failures() == {"gpu-rescan": 0}
    assert "GPU rediscovery failed: NVML: driver not loaded" in caplog.text


# ---- the rules of supervision the plugin relies on ----------------------------------------------


def test_a_loop_stopped_on_request_is_never_stalled() -> None:
    clock = Clock()
    sup = Supervisor(clock=clock)
    stop = threading.Event()
    stop.set()
    thread = sup.run("done", lambda: None, stop, period_s=0.01, deadline_s=1.0)
    thread.join(timeout=30)
    clock.now += 3600
    assert sup.stalled() == []
    [loop] = sup.loops()
    assert (loop.finished, loop.ended) == (True, False)


def test_a_backoff_longer_than_the_deadline_is_not_a_stall() -> None:
    """A loop failing every step waits ever longer; it is failing (counted), not stuck."""
    clock = Clock()
    sup = Supervisor(clock=clock)
    stop = threading.Event()
    loop = sup.register("failing", deadline_s=0.1)
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) <= 5:
            raise RuntimeError(INJECTED)
        stop.wait(30)  # the sixth step hangs, after the longest backoff so far

    # Period 0: every wait is the backoff (0.01 s doubling), 0.16 s after the fifth failure.
    thread = threading.Thread(
        target=sup.drive, args=(loop, step, stop), kwargs={"period_s": 0.0, "backoff_max_s": 5.0}
    )
    thread.start()
    try:
        wait_for("the sixth step", lambda: len(calls) == 6, interval=0.01)
        assert loop.failures == 5
        assert loop.grace_s == pytest.approx(0.16)
        clock.now += loop.deadline_s + 0.05  # past the deadline, within the announced backoff
        assert sup.stalled() == []
        clock.now += loop.grace_s  # no beat for the deadline after the backoff: stuck
        assert sup.stalled() == ["failing"]
    finally:
        stop.set()
        thread.join(timeout=30)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_that_ends_early_is_a_stall_at_once() -> None:
    sup = Supervisor()
    stop = threading.Event()

    def step() -> None:
        raise SystemExit("a BaseException: not survivable")

    thread = sup.run("short-lived", step, stop, period_s=0.01, deadline_s=3600)
    thread.join(timeout=30)
    assert sup.stalled() == ["short-lived"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_background_thread_that_ends_before_close_is_a_stall() -> None:
    sup = Supervisor()

    def handle(item: int) -> None:
        raise SystemExit("a BaseException ends the thread")

    work: Background[int] = Background(handle, name="queue", supervisor=sup)
    try:
        work.submit(1)
        wait_for("the queue's end to be seen", lambda: sup.stalled() == ["queue"], interval=0.01)
    finally:
        work.close()


def test_an_idle_background_queue_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubelet_plugin import background

    monkeypatch.setattr(background, "IDLE_BEAT_S", 0.01)
    clock = Clock()
    sup = Supervisor(clock=clock)
    work: Background[int] = Background(lambda item: None, name="idle", supervisor=sup)
    try:
        work.submit(1)
        work.flush()
        [loop] = sup.loops()
        beat = loop.last_beat
        clock.now += 1
        wait_for("an idle beat", lambda: loop.last_beat > beat, interval=0.01)
    finally:
        work.close()
    [loop] = sup.loops()
    assert (loop.finished, sup.stalled()) == (True, [])


def test_deadlines_cover_the_longest_legitimate_step() -> None:
    """The figures docs/kubelet-plugin.md (Supervision) states."""
    from kubelet_plugin import background, enforcement, governor, gpu_watch, server

    assert (governor.DEADLINE_S, enforcement.DEADLINE_S, gpu_watch.DEADLINE_S) == (60, 60, 60)
    assert (background.DEADLINE_S, server.WATCH_DEADLINE_S) == (90, 30)
    assert monitoring.rescan_deadline(2.0) == 122  # three 30 s children, a period, 30 s
    assert monitoring.slices_deadline(60.0) == 240  # a resync + six 30 s API calls
    assert monitoring.slices_deadline(1.0) == 210  # the 30 s backoff is the longest wait
