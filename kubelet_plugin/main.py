"""`vgpu-dra kubelet-plugin`: flags, wiring and lifecycle of the node daemon.

Start-up: discover GPUs (NVML) -> take the node lock (`kubelet_plugin.statelock`) -> reconcile CDI
specs and claim dirs with the checkpoint -> serve the DRA socket, then the registration socket ->
publish ResourceSlices, rescan GPUs and watch device health in background threads
(`kubelet_plugin.monitoring`) -> the compute governor (unless --no-governor). SIGTERM/SIGINT stop
the servers and remove the sockets.

With --instance-id (the pod UID; rolling updates with a surge) the sockets are named after the
instance and are served *before* the lock: while a previous instance still holds it, the kubelet's
calls are forwarded to that instance (`kubelet_plugin.handover`); once it exits this one takes the
lock, removes dead instances' sockets, loads the checkpoint and serves them itself.

Every flag has an environment twin (e.g. `--node-name` / `NODE_NAME`), handy in a DaemonSet.
Dispatched from `dra_driver.cli`.

Supervision: one `dra_driver.supervision.Supervisor` per process holds every long-lived loop
(governor, enforcement and its Events, GPU rescan and health watch, slice publisher, socket
watcher, the Event and pod-lookup queues). A loop survives an unexpected exception per step
(traceback logged, `vgpu_dra_loop_failures_total{loop}`, backoff). A loop that stops making
progress (no step within its deadline, or its thread ended) cannot be repaired from inside, so
the `Watchdog` here ends the process: it logs which loops stalled, stops the servers the normal
way (sockets removed, checkpoint closed, node lock released) and exits with status
`EXIT_STALLED`, at the latest `STALL_EXIT_GRACE_S` after the stall even if that shutdown hangs
too; the kubelet restarts the container and the checkpoint (or the rolling hand-over) brings
the node's state back.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from dra_driver import cdi, cli_flags, kube, logsetup, names, tracing
from dra_driver.gpu import NodeInventory
from dra_driver.lifecycle import stop_on_signals, wait_for_stop
from dra_driver.metrics_http import MetricsServer, parse_address, serve_metrics
from dra_driver.supervision import Supervisor
from kubelet_plugin import mig_mode, monitoring
from kubelet_plugin.boot import current_boot_id
from kubelet_plugin.checkpoint import CheckpointError
from kubelet_plugin.device_names import DeviceNaming, DeviceNamingError
from kubelet_plugin.events import PrepareEvents
from kubelet_plugin.gpu_changes import ChangeCheck
from kubelet_plugin.health import HealthBoard
from kubelet_plugin.hookcheck import HookLibraryCheck, HookLibraryError
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.mig_ledger import LedgerError
from kubelet_plugin.mig_start import start_mig
from kubelet_plugin.prepare import NodeSettings, Preparer, kube_claim_source
from kubelet_plugin.server import DRA_WORKERS, PluginServer, SocketPaths, remove_stale_sockets
from kubelet_plugin.statelock import StateDirLock, StateLockError
from kubelet_plugin.telemetry import ClaimPods, ClaimTelemetry, PodReader

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("vgpu-dra.kubelet-plugin")

# flag -> environment variable consulted for its default (the shared flags: `cli_flags.ENV`)
ENV = {
    "node_name": "NODE_NAME",
    "driver_name": "VGPU_DRA_DRIVER_NAME",
    "plugin_dir": "VGPU_DRA_PLUGIN_DIR",
    "registrar_dir": "VGPU_DRA_REGISTRAR_DIR",
    "cdi_root": "VGPU_DRA_CDI_ROOT",
    "state_dir": "VGPU_DRA_STATE_DIR",
    "hook_path": "VGPU_DRA_HOOK_PATH",
    "claim_gid": "VGPU_DRA_CLAIM_GID",
    "oversubscription_ratio": "VGPU_DRA_OVERSUBSCRIPTION_RATIO",
    "nvidia_cdi_spec_dir": "VGPU_DRA_NVIDIA_CDI_SPEC_DIR",
    "instance_id": "VGPU_DRA_INSTANCE_ID",
    "binding_conditions": "VGPU_DRA_FEATURE_BINDING_CONDITIONS",
    "mig_mode": "VGPU_DRA_MIG_MODE",
}
DEFAULT_HOOK_PATH = "/usr/local/vgpu-dra/lib/libvgpu.so"
# Exit status of a process whose supervised loop stalled (1: cannot start, 2: bad flags).
EXIT_STALLED = 3
# How long a stalled process may take to stop its servers before it exits regardless.
STALL_EXIT_GRACE_S = 20.0
WATCHDOG_PERIOD_S = 1.0


def build_parser(env: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = dict(os.environ if env is None else env)

    def default(dest: str, fallback: str | None) -> str | None:
        return env.get(ENV[dest], fallback)

    parser = argparse.ArgumentParser(
        prog="vgpu-dra kubelet-plugin",
        description="DRA kubelet plugin: publishes this node's GPUs and prepares claims via CDI.",
    )
    add = parser.add_argument
    add("--node-name", default=default("node_name", None), help="this node (env NODE_NAME)")
    cli_flags.add_kubeconfig(parser, env)
    add("--driver-name", default=default("driver_name", names.DEFAULT_DRIVER_NAME))
    add(
        "--plugin-dir",
        default=default("plugin_dir", None),
        help="directory of the DRA socket (default /var/lib/kubelet/plugins/<driver>)",
    )
    add("--registrar-dir", default=default("registrar_dir", names.DEFAULT_REGISTRAR_DIR))
    add("--cdi-root", default=default("cdi_root", names.DEFAULT_CDI_ROOT))
    add("--state-dir", default=default("state_dir", names.DEFAULT_STATE_DIR))
    add(
        "--hook-path",
        default=default("hook_path", DEFAULT_HOOK_PATH),
        help="host path of libvgpu.so, bind-mounted into every container",
    )
    # String defaults go through `type` too, so a bad environment value is an argparse error
    # (exit 2, naming the flag) rather than a traceback.
    add(
        "--claim-gid",
        type=int,
        default=default("claim_gid", "0") or "0",
        help="group owning claim dirs; added to containers so non-root processes can use them",
    )
    add(
        "--oversubscription-ratio",
        type=float,
        default=default("oversubscription_ratio", "1.0") or "1.0",
        help=f"published memory = physical memory x ratio (1.0 .. {MAX_OVERSUBSCRIPTION_RATIO:g})",
    )
    add(
        "--nvidia-cdi-spec-dir",
        default=default("nvidia_cdi_spec_dir", "/etc/cdi,/var/run/cdi"),
        help="comma-separated dirs searched for the NVIDIA Container Toolkit's nvidia.com/gpu spec",
    )
    add(
        "--no-nvidia-cdi",
        action="store_true",
        help="do not return NVIDIA Container Toolkit CDI IDs alongside ours",
    )
    add("--publish-slices", action=argparse.BooleanOptionalAction, default=True)
    add("--health", action=argparse.BooleanOptionalAction, default=True)
    add(
        "--governor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the per-GPU compute governor (kubelet_plugin.governor)",
    )
    add(
        "--enforcement",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="node-side memory enforcement: report over-cap claims (kill them with enforce: kill)",
    )
    add("--resync-seconds", type=float, default=60.0, help="slice and health re-check period")
    add(
        "--rescan-seconds",
        type=float,
        default=2.0,
        help="hot-plug check period (in-process; a rediscovery child only when GPUs changed)",
    )
    add(
        "--full-rescan-seconds",
        type=float,
        default=30.0,
        help="where the kernel's GPU list cannot be read, GPUs added after start are found by a "
        "rediscovery child this often",
    )
    add(
        "--xid-quiet-seconds",
        type=float,
        default=300.0,
        help="a recoverable-XID taint is lifted after this long without another XID",
    )
    add("--workers", type=int, default=16, help="claims prepared in parallel per call")
    add(
        "--state-lock-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for another plugin holding --state-dir to exit (0: fail at once)",
    )
    add(
        "--instance-id",
        default=default("instance_id", ""),
        help="unique id of this instance (the pod UID) for rolling updates: names the sockets "
        "after it and lets this instance take over from a running one without a gap "
        "(env VGPU_DRA_INSTANCE_ID; empty = fixed socket names)",
    )
    cli_flags.add_logging(parser, env)
    cli_flags.add_metrics_address(parser, env, example="127.0.0.1:9402")
    cli_flags.add_otlp_endpoint(parser, env)
    add(
        "--events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write Kubernetes Events on claims (and their pods) that fail to prepare",
    )
    add(
        "--binding-conditions",
        action=argparse.BooleanOptionalAction,
        default=cli_flags.boolean(default("binding_conditions", "false") or "false"),
        help="publish devices with binding conditions, confirmed by the allocation controller "
        "(needs the controller; env VGPU_DRA_FEATURE_BINDING_CONDITIONS, default false)",
    )
    add(
        "--mig-mode",
        default=default("mig_mode", ""),
        help="MIG strategy per GPU: off|static|dynamic for all GPUs, or a comma list of "
        "<all|index|uuid|device>=<strategy>; the node label <driver>/mig-mode wins; empty = "
        "leave every GPU's MIG mode as it is (docs/mig.md)",
    )
    return parser


# Far above any sane overcommit; what matters is that capacity arithmetic stays finite.
MAX_OVERSUBSCRIPTION_RATIO = 64.0
MAX_GID = 2**32 - 2  # (gid_t)-1 means "unchanged" to chown, so the largest real gid is one less
MAX_WORKERS = 256
# A DRA driver name is a DNS subdomain of at most 63 characters (it names slices, sockets and
# CDI kinds, so it must be valid in all of them).
_DRIVER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# Threads besides prepare that may wait on the API server at the same time: the slice publisher,
# the prepare-failure Events, the pod lookups of the metrics and the enforcement Events.
BACKGROUND_API_CALLERS = 4


def api_connections(workers: int) -> int:
    """Connections the API client keeps for reuse: one per claim GET that can be in flight (a
    single-claim call reads its claim in the DRA server's thread, a larger one on the
    Preparer's `--workers` pool), plus the background callers."""
    return workers + DRA_WORKERS + BACKGROUND_API_CALLERS


def settings_from(args: argparse.Namespace) -> NodeSettings:
    """Validated node settings from parsed flags (ValueError names the flag)."""
    if not args.node_name:
        raise ValueError("--node-name (or env NODE_NAME) is required")
    ratio = args.oversubscription_ratio
    if not (math.isfinite(ratio) and 1.0 <= ratio <= MAX_OVERSUBSCRIPTION_RATIO):
        raise ValueError(
            f"--oversubscription-ratio must be a number from 1.0 to "
            f"{MAX_OVERSUBSCRIPTION_RATIO:g}, got {ratio}"
        )
    if not 0 <= args.claim_gid <= MAX_GID:
        raise ValueError(
            f"--claim-gid must be a group id from 0 to {MAX_GID}, got {args.claim_gid}"
        )
    if not (math.isfinite(args.state_lock_timeout) and args.state_lock_timeout >= 0):
        raise ValueError(
            f"--state-lock-timeout must be a number of seconds >= 0, got {args.state_lock_timeout}"
        )
    mig_mode.parse_mig_mode(args.mig_mode)  # ValueError names the flag
    if not 1 <= args.workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be from 1 to {MAX_WORKERS}, got {args.workers}")
    if len(args.driver_name) > 63 or not _DRIVER_NAME.match(args.driver_name):
        raise ValueError(
            f"--driver-name {args.driver_name!r} is not a valid DRA driver name (a DNS subdomain "
            f"of at most 63 characters: lower-case letters, digits, '-' and '.', e.g. "
            f"{names.DEFAULT_DRIVER_NAME!r})"
        )
    for flag, value in (
        ("--rescan-seconds", args.rescan_seconds),
        ("--full-rescan-seconds", args.full_rescan_seconds),
        ("--xid-quiet-seconds", args.xid_quiet_seconds),
    ):
        if not value > 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    driver_names = names.DriverNames(args.driver_name)
    spec_dirs = () if args.no_nvidia_cdi else _split(args.nvidia_cdi_spec_dir)
    return NodeSettings(
        driver=args.driver_name,
        node_name=args.node_name,
        cdi_root=args.cdi_root,
        spec=cdi.SpecSettings(
            kind=driver_names.cdi_kind,
            state_dir=args.state_dir,
            hook_path=args.hook_path,
            claim_gid=args.claim_gid,
            control_nodes=cdi.control_device_nodes(_read_text("/proc/devices")),
        ),
        oversubscription_ratio=args.oversubscription_ratio,
        toolkit_spec_dirs=spec_dirs,
    )


def socket_paths(args: argparse.Namespace) -> SocketPaths:
    """The sockets' paths (ValueError for an unusable --instance-id)."""
    driver_names = names.DriverNames(args.driver_name)
    plugin_dir = args.plugin_dir or driver_names.plugin_dir()
    if args.instance_id:
        return SocketPaths.for_instance(
            args.driver_name,
            plugin_dir=plugin_dir,
            registrar_dir=args.registrar_dir,
            instance=args.instance_id,
        )
    return SocketPaths(
        registration=driver_names.registration_socket(args.registrar_dir),
        dra=os.path.join(plugin_dir, "dra.sock"),
    )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    logsetup.configure_logging(args.log_level, args.log_format)
    try:
        settings = settings_from(args)
        sockets = socket_paths(args)
        if args.metrics_address:
            parse_address(args.metrics_address)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    try:
        naming = DeviceNaming(settings.state_dir)
    except DeviceNamingError as exc:
        log.error("%s", exc)
        return 1
    # The hot-plug check's first look comes before the discovery: a change after it is seen
    # by the first check, one before it is in the discovery (kubelet_plugin.gpu_changes).
    changes = _change_check(args.full_rescan_seconds)
    try:
        return _run(args, settings, sockets, naming, changes)
    finally:
        changes.close()


def _run(
    args: argparse.Namespace,
    settings: NodeSettings,
    sockets: SocketPaths,
    naming: DeviceNaming,
    changes: ChangeCheck,
) -> int:
    discover = _discover_function()
    try:
        discovered = discover()
        inventory = naming.assign(discovered)
    except Exception as exc:
        log.error("GPU discovery failed, cannot start: %s", exc)
        return 1
    log.info(
        "node %s: %d GPUs (driver %s, CUDA %s)",
        settings.node_name,
        len(inventory.gpus),
        inventory.driver_version,
        inventory.cuda_driver_version,
    )
    client = cli_flags.connect(args.kubeconfig, log)
    if client is None:
        return 1
    try:
        mig, discovered = start_mig(
            flag=args.mig_mode,
            client=client,
            driver=settings.driver,
            node_name=settings.node_name,
            state_dir=settings.state_dir,
            discovered=discovered,
            discover=discover,
        )
        inventory = mig.named(naming.assign(discovered))
    except Exception as exc:
        log.error("MIG start-up failed, cannot start: %s", exc)
        client.close()
        return 1
    client.size_pool(api_connections(args.workers))
    state_lock = StateDirLock(settings.state_dir)
    rolling = bool(args.instance_id)
    # Before the checkpoint is read: a second instance must never act on a copy of it. With
    # --instance-id the lock is taken later, after this instance serves (see _serve).
    if not rolling and not _take_lock(state_lock, args.state_lock_timeout):
        client.close()
        return 1
    provider = tracing.configure_tracing("vgpu-dra-kubelet-plugin", args.otlp_endpoint)
    metrics = PluginMetrics(settings.node_name) if args.metrics_address else None
    supervisor = Supervisor()
    watchdog = Watchdog(supervisor)
    # With metrics on, the pod of each prepared claim is read once (off the prepare path) for
    # the `container` label.
    pods = ClaimPods(_pod_reader(client) if metrics is not None else None, supervisor=supervisor)
    events = (
        PrepareEvents(client, node=settings.node_name, supervisor=supervisor)
        if args.events
        else None
    )

    def load_preparer() -> Preparer | None:
        try:
            return Preparer(
                settings,
                inventory,
                pods.wrap_source(kube_claim_source(client)),
                max_workers=args.workers,
                hook_check=HookLibraryCheck(settings.spec.hook_path),
                observer=ClaimTelemetry(metrics=metrics, events=events, pods=pods),
                mig=mig.instances(settings.state_dir, inventory),
            )
        except (CheckpointError, LedgerError, OSError) as exc:
            log.error("cannot load the checkpoint: %s", exc)
            return None

    loaded: list[Preparer] = []
    try:
        if not rolling:
            preparer = load_preparer()
            if preparer is None:
                return 1
            loaded.append(preparer)
        return _serve(
            args=args,
            settings=settings,
            sockets=sockets,
            inventory=inventory,
            rediscover=_named(naming, _rediscover_function(discovered), mig.named),
            changes=changes,
            client=client,
            owner=_Owner(state_lock, loaded, load_preparer),
            telemetry=_Telemetry(metrics, pods, traced=provider is not None),
            watchdog=watchdog,
        )
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    finally:
        for preparer in loaded:
            preparer.close()
        _stop_telemetry(events, provider)
        client.close()
        state_lock.release()
        watchdog.finished()  # a stalled process ends here, with EXIT_STALLED


def _take_lock(state_lock: StateDirLock, wait_s: float) -> bool:
    try:
        state_lock.acquire(wait_s=wait_s)
    except (StateLockError, OSError) as exc:
        log.error("%s", exc)
        return False
    return True


class Watchdog:
    """Ends the process when a loop of `supervisor` stalls (see the module docstring).

    `start(stop)` watches from a daemon thread; on a stall it logs which loops and why, sets
    `stop` (main then shuts down as on SIGTERM) and exits with EXIT_STALLED when main calls
    `finished()`, or by itself after `grace_s` if main never gets there.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        grace_s: float = STALL_EXIT_GRACE_S,
        period_s: float = WATCHDOG_PERIOD_S,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.supervisor = supervisor
        self._grace_s = grace_s
        self._period_s = period_s
        self._exit = exit_process
        self._done = threading.Event()
        self.stalled: list[str] = []

    def start(self, stop: threading.Event) -> threading.Thread:
        return self.supervisor.watchdog(
            stop, lambda names: self._on_stall(names, stop), period_s=self._period_s
        )

    def finished(self) -> None:
        """Main's shutdown is over: a process whose loop stalled exits now."""
        self._done.set()
        if self.stalled:
            self._end()

    def _on_stall(self, names: list[str], stop: threading.Event) -> None:
        self.stalled = names
        log.error(
            "supervised loop(s) stopped making progress: %s; stopping the servers and exiting "
            "with status %d so that the kubelet restarts the plugin",
            self.describe(names),
            EXIT_STALLED,
            extra={"stalled_loops": ",".join(names)},
        )
        stop.set()
        if not self._done.wait(self._grace_s):
            log.error("the shutdown did not finish within %g s; exiting now", self._grace_s)
            self._end()

    def describe(self, names: Sequence[str]) -> str:
        """`name (why)` for each stalled loop: its thread ended, or how long since its beat."""
        loops = {loop.name: loop for loop in self.supervisor.loops()}
        parts = []
        for name in names:
            loop = loops.get(name)
            if loop is None:
                parts.append(name)
            elif loop.ended:
                parts.append(f"{name} (its thread ended)")
            else:
                idle = loop.clock() - loop.last_beat
                parts.append(
                    f"{name} (no step finished for {idle:.0f} s, deadline "
                    f"{loop.deadline_s + loop.grace_s:g} s)"
                )
        return ", ".join(parts)

    def _end(self) -> None:
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # nothing may keep the process from ending
                handler.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        self._exit(EXIT_STALLED)


@dataclass(frozen=True, slots=True)
class _Owner:
    """The node lock and the Preparer: loaded before serving, or (rolling) after the lock."""

    lock: StateDirLock
    loaded: list[Preparer]  # the Preparer once loaded (main closes it)
    load: Callable[[], Preparer | None]


@dataclass(frozen=True, slots=True)
class _Telemetry:
    metrics: PluginMetrics | None
    pods: ClaimPods
    traced: bool


def _pod_reader(client: kube.KubeClient) -> PodReader:
    def read(namespace: str, name: str) -> kube.JSON:
        return client.get(kube.path("v1", "pods", name, namespace=namespace), timeout_s=10)

    return read


def _stop_telemetry(events: PrepareEvents | None, provider: TracerProvider | None) -> None:
    if events is not None:
        events.close()
    tracing.shutdown_tracing(provider)


def _serve(
    *,
    args: argparse.Namespace,
    settings: NodeSettings,
    sockets: SocketPaths,
    inventory: NodeInventory,
    rediscover: Callable[[], NodeInventory],
    changes: ChangeCheck,
    client: kube.KubeClient,
    owner: _Owner,
    telemetry: _Telemetry,
    watchdog: Watchdog,
) -> int:
    """Reconcile, serve until SIGTERM/SIGINT (or a stalled loop), then stop the servers and
    background threads."""
    supervisor = watchdog.supervisor
    try:
        HookLibraryCheck(settings.spec.hook_path).verify()
    except HookLibraryError as exc:
        log.error("%s; every prepare is refused until it is fixed", exc)
    board = HealthBoard(settings.node_name, inventory) if args.health else None
    metrics = telemetry.metrics
    stop = threading.Event()
    stop_on_signals(stop, log)
    server = PluginServer(
        driver=settings.driver,
        sockets=sockets,
        preparer=owner.loaded[0] if owner.loaded else None,
        holder_endpoint=owner.lock.holder_endpoint,
        health=board,
        interceptors=_grpc_tracing() if telemetry.traced else (),
        supervisor=supervisor,
    )
    if owner.loaded:
        _reconcile(owner.loaded[0])
        remove_stale_sockets(sockets, settings.driver)  # we hold the lock: no live holder else
        server.start()
        watchdog.start(stop)
    else:
        server.start()  # forwarding to the lock holder until _take_over switches it
        watchdog.start(stop)
        if not _take_over(args, settings, sockets=sockets, server=server, owner=owner, stop=stop):
            server.stop()
            return 0 if stop.is_set() else 1
    preparer = owner.loaded[0]
    metrics_server = (
        _serve_metrics(
            args.metrics_address,
            metrics,
            settings=settings,
            preparer=preparer,
            pods=telemetry.pods,
            supervisor=supervisor,
        )
        if metrics is not None
        else None
    )
    _, threads = monitoring.start(
        monitoring.MonitorSettings(
            driver=settings.driver,
            node_name=settings.node_name,
            state_dir=settings.state_dir,
            oversubscription_ratio=settings.oversubscription_ratio,
            publish_slices=args.publish_slices,
            health=args.health,
            resync_s=args.resync_seconds,
            rescan_s=args.rescan_seconds,
            quiet_s=args.xid_quiet_seconds,
            enforcement=args.enforcement,
            binding_conditions=args.binding_conditions,
        ),
        inventory=inventory,
        client=client,
        board=board,
        update_inventory=preparer.update_inventory,
        rediscover=rediscover,
        stop=stop,
        prepared=preparer.prepared,
        on_slice_sync=metrics.observe_slice_sync if metrics is not None else None,
        on_enforcement=metrics.observe_enforcement if metrics is not None else None,
        supervisor=supervisor,
        changes=changes,
    )
    governor = (
        _start_governor(settings, preparer, stop, metrics, supervisor) if args.governor else None
    )
    if governor is not None:
        threads.append(governor)
    log.info("kubelet plugin for %s on %s is running", settings.driver, settings.node_name)
    # What start-up made (modules, schemas, the API client's models) lives as long as the
    # process: out of the collector's way, so its full passes scan only what serving makes.
    gc.freeze()
    wait_for_stop(stop)
    log.info("shutting down")
    server.stop()
    if metrics_server is not None:
        metrics_server.stop()
    telemetry.pods.close()  # its pod lookups (the container label)
    if watchdog.stalled:  # one of them is stuck: joining it would only wait
        return EXIT_STALLED
    for thread in threads:
        thread.join(timeout=10)
    log.info("stopped")
    return 0


def _reconcile(preparer: Preparer) -> None:
    report = preparer.reconcile(boot_id=current_boot_id())
    log.info(
        "checkpoint: %d prepared claims (%d orphan specs and %d orphan claim dirs removed, %d "
        "rewritten)",
        len(preparer.prepared()),
        len(report.removed_specs),
        len(report.removed_claim_dirs),
        len(report.rewritten),
    )


def _take_over(
    args: argparse.Namespace,
    settings: NodeSettings,
    *,
    sockets: SocketPaths,
    server: PluginServer,
    owner: _Owner,
    stop: threading.Event,
) -> bool:
    """Rolling update: wait for the node lock (calls are forwarded meanwhile), then own the node."""
    log.info(
        "instance %s serves %s; taking the node lock %s (up to %g s; calls go to its holder "
        "meanwhile)",
        args.instance_id,
        sockets.dra,
        owner.lock.path,
        args.state_lock_timeout,
    )
    try:
        owner.lock.acquire(wait_s=args.state_lock_timeout, cancel=stop)
    except (StateLockError, OSError) as exc:
        log.error("%s", exc)
        return False
    owner.lock.advertise(sockets.dra)
    remove_stale_sockets(sockets, settings.driver)
    preparer = owner.load()
    if preparer is None:
        return False
    owner.loaded.append(preparer)
    _reconcile(preparer)
    server.serve_locally(preparer)
    log.info("instance %s took over the node", args.instance_id)
    return True


def _serve_metrics(
    address: str,
    metrics: PluginMetrics,
    *,
    settings: NodeSettings,
    preparer: Preparer,
    pods: ClaimPods,
    supervisor: Supervisor,
) -> MetricsServer:
    """Register the scrape-time collectors and serve /metrics (OSError if it cannot bind)."""
    from dra_driver.nvml import PyNvml
    from kubelet_plugin.metrics import NodeCollector, NvmlGpuReader

    metrics.add_node_collector(
        NodeCollector(
            node=settings.node_name,
            state_dir=settings.state_dir,
            prepared=preparer.prepared,
            inventory=preparer.inventory,
            pods=pods.pod_label,
            containers=pods.container_label,
            gpus=NvmlGpuReader(PyNvml),
        )
    )
    metrics.add_loop_collector(supervisor)
    served = serve_metrics(address, metrics.registry)
    log.info("metrics on %s", served.url, extra={"metrics_url": served.url})
    return served


def _grpc_tracing() -> list[grpc.ServerInterceptor]:
    """A server span per kubelet call (the per-claim spans of prepare become its children)."""
    from opentelemetry.instrumentation.grpc import server_interceptor

    return [server_interceptor()]


def _start_governor(
    settings: NodeSettings,
    preparer: Preparer,
    stop: threading.Event,
    metrics: PluginMetrics | None,
    supervisor: Supervisor,
) -> threading.Thread | None:
    """The compute-policy governor: samples NVML once per GPU and writes each prepared claim's
    launch budget (caps from the Preparer's plans) into `<state-dir>/claims/<uid>/region`.
    Without it the hook paces itself from NVML in every process, so a failure to start is a
    warning, not fatal.
    """
    from kubelet_plugin.governor import caps_of_prepared, start_governor

    try:
        thread = start_governor(
            settings.state_dir,
            stop,
            caps_of_prepared(preparer.prepared),
            on_tick=metrics.observe_governor_tick if metrics is not None else None,
            supervisor=supervisor,
        )
    except Exception as exc:
        log.warning("governor not started (hooks will pace themselves): %s", exc)
        return None
    log.info("governor running over %s/claims", settings.state_dir)
    return thread


def _discover_function() -> Callable[[], NodeInventory]:
    from dra_driver.inventory import discover

    return discover


def _change_check(full_rescan_s: float) -> ChangeCheck:
    """The hot-plug check of the rescan loop on its own reference to NVML, its first look
    taken now."""
    from dra_driver.nvml import PyNvml

    check = ChangeCheck(PyNvml(), full_rescan_s=full_rescan_s)
    check.baseline()
    return check


def _rediscover_function(discovered: NodeInventory) -> Callable[[], NodeInventory]:
    """Rediscovery in child processes, knowing what start-up discovered (so a periodic rescan
    that finds the same GPUs runs only the small child)."""
    from kubelet_plugin.rediscover import Rediscovery

    return Rediscovery(seed=discovered)


def _named(
    naming: DeviceNaming,
    rediscover: Callable[[], NodeInventory],
    strategies: Callable[[NodeInventory], NodeInventory] = lambda inventory: inventory,
) -> Callable[[], NodeInventory]:
    return lambda: strategies(naming.assign(rediscover()))


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""
