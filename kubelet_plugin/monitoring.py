"""The kubelet plugin's background threads for its devices: rescan, health watch, slice publishing.

Called once by `kubelet_plugin.main` (`start(...)`), which keeps only the wiring of flags. Threads:
- `gpu-rescan`: every `rescan_s` asks `kubelet_plugin.gpu_changes.ChangeCheck` (in-process: NVML
  answers of the known GPUs, the kernel driver's GPU list) whether the GPUs may have changed, and
  only then re-enumerates them in a child process (`kubelet_plugin.rediscover`) and folds the
  result into `NodeDevices` (hot-plug, GPUs that come back); without a check, every period; a
  failed rediscovery makes the kubelet health UNKNOWN for every device;
- `gpu-health` (with health on): the NVML health monitor (`kubelet_plugin.gpu_watch`) feeding
  device taints;
- `slices` (with slice publishing on): first the probe of what the API server stores
  (`kubelet_plugin.api_support`: consumable capacity or whole GPUs), then the publisher, woken at
  once whenever `NodeDevices` changes and otherwise resyncing every `resync_s`;
- `slice-watch` (with slice publishing on): watches the node's slices and wakes `slices` when one
  is deleted or changed by someone else (the kubelet wipes its node's slices when it starts);
- `enforcement` (with enforcement on): node-side memory enforcement over the prepared claims
  (`kubelet_plugin.enforcement`), reporting to the log and as Events on the claims.
Each change of the published GPUs is also handed to the Preparer (`update_inventory`), so prepare
accepts a hot-plugged GPU and refuses a removed one.

Every thread is a loop of the plugin's `Supervisor` (`dra_driver.supervision`): a step that
raises something unexpected is logged with its traceback, counted
(`vgpu_dra_loop_failures_total{loop}`) and backed off, and the loop goes on; a loop with no
finished step within its deadline, or whose thread ends before `stop`, is stalled, and the
plugin's watchdog (`kubelet_plugin.main`) restarts the process. Deadlines are the longest
legitimate step plus the longest wait between two steps (docs/kubelet-plugin.md, Supervision):
`gpu-rescan` `rescan_deadline(rescan_s)`, `slices` `slices_deadline(resync_s)`, `gpu-health` and
`enforcement` their modules' `DEADLINE_S`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dra_driver import kube
from dra_driver.gpu import NodeInventory
from dra_driver.supervision import Loop, Supervisor
from kubelet_plugin import rediscover as rediscovery
from kubelet_plugin import taint_store
from kubelet_plugin.backoff import Backoff
from kubelet_plugin.devices import NodeDevices
from kubelet_plugin.gpu_changes import ChangeCheck
from kubelet_plugin.gpu_watch import watch_gpus
from kubelet_plugin.health import HealthBoard
from kubelet_plugin.plan import ClaimPlan
from kubelet_plugin.taints import TaintState

log = logging.getLogger(__name__)

# A rescan runs up to three child processes (`kubelet_plugin.rediscover`), each killed after its
# timeout; starting and killing them takes a few seconds more on a loaded node.
RESCAN_CHILDREN = 3
RESCAN_SLACK_S = 30.0
# A slice sync is a GET of the Node, a LIST and one write per changed slice (a node publishes a
# handful), each bounded by the API client's timeout.
SLICE_SYNC_CALLS = 6


def rescan_deadline(rescan_s: float) -> float:
    """`gpu-rescan`: its children's timeouts, the wait between two rescans and some slack."""
    return RESCAN_CHILDREN * rediscovery.TIMEOUT_S + rescan_s + RESCAN_SLACK_S


def slices_deadline(resync_s: float) -> float:
    """`slices`: the longest wait between syncs (the resync period or the longest backoff),
    plus one sync's calls at the client's timeout."""
    longest_wait = max(resync_s, Backoff.maximum_s)
    return longest_wait + SLICE_SYNC_CALLS * kube.DEFAULT_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    driver: str
    node_name: str
    state_dir: str
    oversubscription_ratio: float
    publish_slices: bool
    health: bool
    resync_s: float
    rescan_s: float
    quiet_s: float
    enforcement: bool = True
    binding_conditions: bool = False  # dra_driver.slices.CONDITION_CONFIRMED


def start(
    settings: MonitorSettings,
    *,
    inventory: NodeInventory,
    client: kube.KubeClient,
    board: HealthBoard | None,
    update_inventory: Callable[[NodeInventory], None],
    rediscover: Callable[[], NodeInventory],
    stop: threading.Event,
    prepared: Callable[[], Mapping[str, ClaimPlan]] | None = None,
    on_slice_sync: Callable[[str], None] | None = None,
    on_enforcement: Callable[[str, int], None] | None = None,
    supervisor: Supervisor | None = None,
    changes: ChangeCheck | None = None,
) -> tuple[NodeDevices, list[threading.Thread]]:
    supervisor = supervisor or Supervisor()
    wake = threading.Event()
    devices: NodeDevices

    def changed() -> None:
        update_inventory(devices.inventory())
        wake.set()

    if settings.health:
        path: str | None = taint_store.store_path(settings.state_dir)
        state = taint_store.load(str(path), quiet_s=settings.quiet_s)
    else:
        path, state = None, TaintState(quiet_s=settings.quiet_s)
    devices = NodeDevices(
        inventory,
        driver=settings.driver,
        state=state,
        store_path=path,
        board=board,
        on_change=changed,
    )
    threads = [
        _rescan(
            devices,
            board,
            rediscover,
            stop,
            period=settings.rescan_s,
            supervisor=supervisor,
            changes=changes,
        )
    ]
    if settings.health:
        threads.append(
            _thread(
                "gpu-health",
                lambda: watch_gpus(devices, devices.uuids, stop, supervisor=supervisor),
            )
        )
    if settings.publish_slices:
        loop = supervisor.register("slices", slices_deadline(settings.resync_s))
        threads.append(
            _thread(
                "slices",
                lambda: _publish(
                    settings,
                    client=client,
                    devices=devices,
                    stop=stop,
                    wake=wake,
                    on_sync=on_slice_sync,
                    loop=loop,
                ),
                loop=loop,
                stop=stop,
            )
        )
        # Not joined at shutdown: a watch cannot be interrupted, and the thread holds no state.
        _watch_slices(settings, client, wake, stop, supervisor)
    if settings.enforcement and prepared is not None:
        from kubelet_plugin.enforcement import (
            EventReporter,
            LogReporter,
            MetricsReporter,
            Reporter,
            start_enforcer,
        )

        reporters: list[Reporter] = [
            LogReporter(),
            EventReporter(client, settings.node_name, supervisor=supervisor),
        ]
        if on_enforcement is not None:
            reporters.append(MetricsReporter(on_enforcement))
        threads.append(
            start_enforcer(settings.state_dir, prepared, stop, reporters, supervisor=supervisor)
        )
    return devices, threads


def _publish(
    settings: MonitorSettings,
    *,
    client: kube.KubeClient,
    devices: NodeDevices,
    stop: threading.Event,
    wake: threading.Event,
    on_sync: Callable[[str], None] | None,
    loop: Loop,
) -> None:
    """Publish the node's slices in the form the API server stores (never a rewrite loop)."""
    from kubelet_plugin.api_support import SliceForm, wait_for_form
    from kubelet_plugin.slice_publisher import SlicePublisher

    form = wait_for_form(
        client, driver=settings.driver, node_name=settings.node_name, stop=stop, loop=loop
    )
    if form is None:  # stopped before the server answered
        return
    publisher = SlicePublisher(
        client,
        driver=settings.driver,
        node_name=settings.node_name,
        oversubscription_ratio=settings.oversubscription_ratio,
        whole_devices=form is SliceForm.WHOLE,
        taints=devices.taints,
        on_sync=on_sync,
        binding_conditions=settings.binding_conditions,
    )
    publisher.run(devices.inventory, stop, resync_s=settings.resync_s, wake=wake, loop=loop)


def _watch_slices(
    settings: MonitorSettings,
    client: kube.KubeClient,
    wake: threading.Event,
    stop: threading.Event,
    supervisor: Supervisor,
) -> threading.Thread:
    """The loop `slice-watch`: wakes the publisher when the node's slices change under it."""
    from kubelet_plugin.slice_publisher import WATCH_DEADLINE_S, pool_selector, watch_pool

    loop = supervisor.register("slice-watch", WATCH_DEADLINE_S)
    selector = pool_selector(settings.driver, settings.node_name)
    return _thread(
        "slice-watch",
        lambda: watch_pool(client, selector, wake, stop, loop=loop),
        loop=loop,
        stop=stop,
    )


def _rescan(
    devices: NodeDevices,
    board: HealthBoard | None,
    rediscover: Callable[[], NodeInventory],
    stop: threading.Event,
    *,
    period: float,
    supervisor: Supervisor,
    changes: ChangeCheck | None = None,
) -> threading.Thread:
    """The loop `gpu-rescan`: first check one period after start (start-up just discovered);
    a rediscovery child only when `changes` says one is due (without it, every period)."""

    def step() -> None:
        reason = "no change check" if changes is None else changes.due()
        if reason is None:
            return
        log.debug("GPU rediscovery: %s", reason)
        try:
            fresh = rediscover()
        except Exception as exc:  # a GPU or NVML state, not a fault of the loop: keep rescanning
            log.warning("GPU rediscovery failed: %s", exc)
            if changes is not None:
                changes.done(ok=False)
            if board is not None:
                board.observe(None, str(exc))
            return
        if changes is not None:
            changes.done(ok=True)
        devices.rediscovered(fresh)  # anything raised here is the loop's failure

    loop = supervisor.register("gpu-rescan", rescan_deadline(period))

    def body() -> None:
        if stop.wait(period):
            loop.end(stopped=True)
            return
        supervisor.drive(loop, step, stop, period_s=period)

    return _thread("gpu-rescan", body, loop=loop, stop=stop)


def _thread(
    name: str,
    body: Callable[[], None],
    *,
    loop: Loop | None = None,
    stop: threading.Event | None = None,
) -> threading.Thread:
    """A daemon thread running `body`; with `loop`, its end before `stop` is a stall."""

    def run() -> None:
        try:
            body()
        finally:
            if loop is not None and stop is not None:
                loop.end(stopped=stop.is_set())

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
