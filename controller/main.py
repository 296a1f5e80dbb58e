"""`vgpu-dra controller`: the cluster-side process (a Deployment), dispatched from `dra_driver.cli`.

It loads the Kubernetes credentials (exit 1 with the reason when they are unusable), serves
`/healthz` and `/readyz` (`controller.probes`, loopback by default) and runs the allocation
controller of the policy path (`controller.worker`: informers feeding `controller.reconciler`)
and the rescheduler of pods whose claims failed to prepare (`controller.rescheduler`).
With `--leader-elect` only the replica holding the Lease allocates (`controller.leader`); the
others keep their model current and take over when the Lease is released or expires.
Readiness: every informer has listed once, and the replica is the leader or a standby that can
reach the Lease. SIGTERM/SIGINT stop it cleanly (readiness drops first, the Lease is released,
then the probe server closes, exit 0). With `--metrics-address` it serves Prometheus metrics
(`controller.metrics`; the chart sets the address through VGPU_DRA_METRICS_ADDRESS).
With `--webhook-port` it also serves the admission webhook on every replica, from its own
threads (`controller.webhook.run`; docs/webhook.md).
Every flag has an environment twin, as in the kubelet plugin.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from controller.leader import LeaderElector
from controller.metrics import DETAILS, ControllerMetrics, StateCollector
from controller.probes import ProbeServer, parse_address
from controller.reconciler import POLICY_ANNOTATIONS, Defaults, Reconciler
from controller.rescheduler import DEFAULT_GRACE_S, DEFAULT_PER_MINUTE, Rescheduler
from controller.webhook import flags as webhook_flags
from controller.worker import Worker
from dra_driver import cli_flags, kube, logsetup, tracing
from dra_driver.lifecycle import stop_on_signals, wait_for_stop
from dra_driver.metrics_http import MetricsServer, serve_metrics
from dra_driver.metrics_http import parse_address as parse_metrics_address
from dra_driver.supervision import LoopCollector, Supervisor

if TYPE_CHECKING:
    from controller.webhook.run import Running  # imported when the webhook is on only

log = logging.getLogger("vgpu-dra.controller")

# flag -> environment variable consulted for its default (the shared flags: `cli_flags.ENV`)
ENV = {
    "health_address": "VGPU_DRA_HEALTH_ADDRESS",
    "leader_elect": "VGPU_DRA_LEADER_ELECT",
    "lease_namespace": "VGPU_DRA_LEASE_NAMESPACE",
    "lease_name": "VGPU_DRA_LEASE_NAME",
    "lease_duration": "VGPU_DRA_LEASE_DURATION",
    "node_policy": "VGPU_DRA_NODE_POLICY",
    "device_policy": "VGPU_DRA_DEVICE_POLICY",
    "topology": "VGPU_DRA_TOPOLOGY",
    "metrics_address": "VGPU_DRA_METRICS_ADDRESS",
    "metrics_detail": "VGPU_DRA_METRICS_DETAIL",
    "reschedule": "VGPU_DRA_RESCHEDULE",
    "reschedule_grace": "VGPU_DRA_RESCHEDULE_GRACE",
    "reschedule_per_minute": "VGPU_DRA_RESCHEDULE_PER_MINUTE",
    "write_concurrency": "VGPU_DRA_WRITE_CONCURRENCY",
}
DEFAULT_WRITE_CONCURRENCY = 8
DEFAULT_LEASE_NAME = "vgpu-dra-controller"
DEFAULT_HEALTH_ADDRESS = "127.0.0.1:8081"


def build_parser(env: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = dict(os.environ if env is None else env)
    parser = argparse.ArgumentParser(
        prog="vgpu-dra controller",
        description="Cluster-side controller of vgpu-dra: allocates the claims of pods on the "
        "policy path (scheduling gate vgpu.dra.dev/policy).",
    )
    cli_flags.add_kubeconfig(parser, env)
    parser.add_argument(
        "--health-address",
        default=env.get(ENV["health_address"], DEFAULT_HEALTH_ADDRESS),
        help="host:port of /healthz and /readyz (env VGPU_DRA_HEALTH_ADDRESS; port 0 = any)",
    )
    cli_flags.add_logging(parser, env)
    cli_flags.add_otlp_endpoint(parser, env)
    cli_flags.add_switch(
        parser,
        env,
        "--leader-elect",
        env_name=ENV["leader_elect"],
        default=False,
        help="allocate only while holding the Lease (env VGPU_DRA_LEADER_ELECT; default false)",
    )
    parser.add_argument(
        "--lease-namespace",
        default=env.get(ENV["lease_namespace"], env.get("POD_NAMESPACE", "default")),
        help="namespace of the Lease (env VGPU_DRA_LEASE_NAMESPACE, else POD_NAMESPACE)",
    )
    parser.add_argument(
        "--lease-name",
        default=env.get(ENV["lease_name"], DEFAULT_LEASE_NAME),
        help=f"name of the Lease (env VGPU_DRA_LEASE_NAME; default {DEFAULT_LEASE_NAME})",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=float(env.get(ENV["lease_duration"], "15")),
        help="seconds a standby waits after the last renewal (env VGPU_DRA_LEASE_DURATION); "
        "the leader steps down after 2/3 of it without renewing",
    )
    parser.add_argument(
        "--metrics-address",
        default=env.get(ENV["metrics_address"], ""),
        type=_metrics_address,
        help="host:port to serve Prometheus /metrics on (env VGPU_DRA_METRICS_ADDRESS; "
        "port 0 = any); empty = off, the default",
    )
    parser.add_argument(
        "--metrics-detail",
        default=env.get(ENV["metrics_detail"], "node"),
        choices=DETAILS,
        help="allocated-vs-capacity series: cluster totals, per node (default) or also per GPU "
        "(env VGPU_DRA_METRICS_DETAIL; docs/observability.md on cardinality)",
    )
    for flag, key, choices, default in (
        ("--node-policy", "node_policy", ("binpack", "spread"), "binpack"),
        ("--device-policy", "device_policy", ("binpack", "spread"), "spread"),
        (
            "--topology",
            "topology",
            ("none", "numa", "link", "numa-strict", "link-strict"),
            "none",
        ),
    ):
        parser.add_argument(
            flag,
            default=env.get(ENV[key], default),
            choices=choices,
            help=f"cluster default for pods without {POLICY_ANNOTATIONS[key]} (env {ENV[key]})",
        )
    cli_flags.add_switch(
        parser,
        env,
        "--reschedule",
        env_name=ENV["reschedule"],
        default=True,
        help="recover pods whose claims failed to prepare: evict them when a controller owns "
        "them, else report what to do (env VGPU_DRA_RESCHEDULE; default true)",
    )
    parser.add_argument(
        "--reschedule-grace",
        type=float,
        default=float(env.get(ENV["reschedule_grace"], str(DEFAULT_GRACE_S))),
        help="seconds a failed prepare may last before the pod is recovered "
        "(env VGPU_DRA_RESCHEDULE_GRACE)",
    )
    parser.add_argument(
        "--reschedule-per-minute",
        type=float,
        default=float(env.get(ENV["reschedule_per_minute"], str(DEFAULT_PER_MINUTE))),
        help="at most this many recoveries a minute (env VGPU_DRA_RESCHEDULE_PER_MINUTE)",
    )
    parser.add_argument(
        "--write-concurrency",
        type=_at_least_one,
        default=env.get(ENV["write_concurrency"], str(DEFAULT_WRITE_CONCURRENCY)),
        help="pods of the policy path whose API writes (claims, gate) may be in "
        "flight together; decisions stay one at a time; 1 = one pod after the other (env "
        f"VGPU_DRA_WRITE_CONCURRENCY, default {DEFAULT_WRITE_CONCURRENCY})",
    )
    webhook_flags.add_arguments(parser, env)
    return parser


def _at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {value!r}")
    return number


def _start_webhook(
    args: argparse.Namespace,
    client: kube.KubeClient,
    stop: threading.Event,
    is_leader: Callable[[], bool],
    metrics: ControllerMetrics | None,
    *,
    supervisor: Supervisor,
) -> Running | None:
    """Serve the webhook until `stop` is set: what runs it, or None (after
    logging why and closing the client) when it cannot start."""
    from controller.webhook import run as webhook_run  # the TLS machinery only when it is on

    try:
        registry = metrics.registry if metrics is not None else None  # one /metrics for all
        running = webhook_run.start(args, client, stop, is_leader, registry, supervisor=supervisor)
    except Exception as exc:  # certificate, API or bind failures: say which, exit 1
        log.error("cannot start the webhook on port %d: %s", args.webhook_port, exc)
        client.close()
        return None
    return running


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    logsetup.configure_logging(args.log_level, args.log_format)
    try:
        address = parse_address(args.health_address)
    except ValueError as exc:
        parser.error(f"--health-address: {exc}")
    client = cli_flags.connect(args.kubeconfig, log)
    if client is None:
        return 1
    # Before the reconciler and the webhook are built: they look the tracer up once.
    provider = tracing.configure_tracing("vgpu-dra-controller", args.otlp_endpoint)
    try:
        return _run(args, client, address)
    finally:
        tracing.shutdown_tracing(provider)


def _run(args: argparse.Namespace, client: kube.KubeClient, address: tuple[str, int]) -> int:
    stop = threading.Event()
    stop_on_signals(stop, log)
    supervisor = Supervisor()  # every long-lived loop: liveness, readiness and the Lease read it
    elector: LeaderElector | None = None
    metrics = ControllerMetrics() if args.metrics_address else None
    # Every replica serves the webhook (until `stop`); only the leader collects templates.
    webhook = None
    if args.webhook_port:
        webhook = _start_webhook(
            args,
            client,
            stop,
            lambda: elector is None or elector.is_leader(),
            metrics,
            supervisor=supervisor,
        )
        if webhook is None:
            return 1
    try:
        probes = ProbeServer(address)
    except OSError as exc:
        log.error("cannot serve probes on %s: %s", args.health_address, exc)
        client.close()  # exiting: the webhook's daemon threads end with the process
        return 1
    defaults = Defaults(
        {
            POLICY_ANNOTATIONS["node_policy"]: args.node_policy,
            POLICY_ANNOTATIONS["device_policy"]: args.device_policy,
            POLICY_ANNOTATIONS["topology"]: args.topology,
        }
    )
    reconciler = Reconciler(
        client, defaults, observer=metrics, write_concurrency=args.write_concurrency
    )
    rescheduler = (
        Rescheduler(
            client,
            [args.driver_name],
            grace_s=args.reschedule_grace,
            per_minute=args.reschedule_per_minute,
        )
        if args.reschedule
        else None
    )
    worker = Worker(client, reconciler, rescheduler, supervisor=supervisor)
    if args.leader_elect:
        identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        elector = LeaderElector(
            client,
            namespace=args.lease_namespace,
            name=args.lease_name,
            identity=identity,
            lease_duration_s=args.lease_duration,
            renew_deadline_s=args.lease_duration * 2 / 3,
            retry_period_s=max(0.2, args.lease_duration / 7),
            on_change=worker.became_leader,
            fit=supervisor.healthy,
            supervisor=supervisor,
        )
        reconciler.may_write = elector.is_leader
        if rescheduler is not None:
            rescheduler.may_write = elector.is_leader
        probes.add_check("leader-election", elector.healthy)
        log.info(
            "leader election on lease %s/%s as %s", args.lease_namespace, args.lease_name, identity
        )
    else:
        worker.became_leader(True)
    probes.add_check("informers-synced", worker.synced)
    probes.set_liveness(supervisor.stalled)
    if webhook is not None:
        probes.add_check("webhook", webhook.serving)
    metrics_server = _serve_metrics(args, metrics, worker, elector)
    if metrics is not None and metrics_server is None:  # could not bind: said why
        probes.stop()
        client.close()
        return 1
    probes.start()
    host, port = probes.address
    log.info("probes on http://%s:%d (/healthz, /readyz)", host, port)
    worker.start(stop)
    if elector is not None:
        elector.start(stop)
    log.info("allocation controller running (gate vgpu.dra.dev/policy); until SIGTERM")
    wait_for_stop(stop)
    log.info("shutting down")
    _shut_down(probes, metrics_server, elector, worker)
    if webhook is not None:  # it answers during its drain; exiting would end that
        webhook.stopped.wait(timeout=webhook.drain_s + 15)
    client.close()
    log.info("stopped")
    return 0


def _shut_down(
    probes: ProbeServer,
    metrics_server: MetricsServer | None,
    elector: LeaderElector | None,
    worker: Worker,
) -> None:
    probes.stop()  # readiness drops first
    if metrics_server is not None:
        metrics_server.stop()
    if elector is not None:
        elector.join(timeout=10)  # it releases the Lease on its way out
    worker.join(timeout=5)


def _metrics_address(text: str) -> str:
    """`host:port` or empty (off); argparse reports a bad one as a usage error."""
    if text:
        try:
            parse_metrics_address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _serve_metrics(
    args: argparse.Namespace,
    metrics: ControllerMetrics | None,
    worker: Worker,
    elector: LeaderElector | None,
) -> MetricsServer | None:
    """Register the scrape-time collector and serve /metrics; None when off or when the address
    cannot be bound (logged)."""
    if metrics is None:
        return None
    metrics.registry.register(LoopCollector(worker.supervisor))
    metrics.registry.register(
        StateCollector(
            worker.reconciler,
            worker.informers,
            leader=elector.is_leader if elector is not None else lambda: True,
            detail=args.metrics_detail,
        )
    )
    try:
        served = serve_metrics(args.metrics_address, metrics.registry)
    except OSError as exc:
        log.error("cannot serve metrics on %s: %s", args.metrics_address, exc)
        return None
    log.info("metrics on %s", served.url, extra={"metrics_url": served.url})
    return served
