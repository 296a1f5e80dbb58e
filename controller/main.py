"""`vgpu-dra controller`: the cluster-side process (a Deployment), dispatched from `dra_driver.cli`.

It loads the Kubernetes credentials (exit 1 with the reason when they are unusable), serves
`/healthz` and `/readyz` (`controller.probes`, loopback by default) and runs the allocation
controller of the policy path (`controller.worker`: informers feeding `controller.reconciler`)
and the rescheduler of pods whose claims failed to prepare (`controller.rescheduler`).
With `--leader-elect` only the replica holding the Lease allocates (`controller.leader`); the
others keep their model current and take over when the Lease is released or expires.
Readiness: every informer has listed once, and the replica is the leader or a standby that can
reach the Lease. SIGTERM/SIGINT stop it cleanly (readiness drops first, the Lease is released,
then the probe server closes, exit 0).
Every flag has an environment twin, as in the kubelet plugin.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence

from controller.leader import LeaderElector
from controller.probes import ProbeServer, parse_address
from controller.reconciler import POLICY_ANNOTATIONS, Defaults, Reconciler
from controller.rescheduler import DEFAULT_GRACE_S, DEFAULT_PER_MINUTE, Rescheduler
from controller.worker import Worker
from dra_driver import kube, logsetup, names
from dra_driver.lifecycle import stop_on_signals

log = logging.getLogger("vgpu-dra.controller")

ENV = {
    "kubeconfig": "KUBECONFIG",
    "health_address": "VGPU_DRA_HEALTH_ADDRESS",
    "log_level": "VGPU_DRA_LOG_LEVEL",
    "log_format": "VGPU_DRA_LOG_FORMAT",
    "leader_elect": "VGPU_DRA_LEADER_ELECT",
    "lease_namespace": "VGPU_DRA_LEASE_NAMESPACE",
    "lease_name": "VGPU_DRA_LEASE_NAME",
    "lease_duration": "VGPU_DRA_LEASE_DURATION",
    "node_policy": "VGPU_DRA_NODE_POLICY",
    "device_policy": "VGPU_DRA_DEVICE_POLICY",
    "topology": "VGPU_DRA_TOPOLOGY",
    "driver_name": "VGPU_DRA_DRIVER_NAME",
    "reschedule": "VGPU_DRA_RESCHEDULE",
    "reschedule_grace": "VGPU_DRA_RESCHEDULE_GRACE",
    "reschedule_per_minute": "VGPU_DRA_RESCHEDULE_PER_MINUTE",
}
DEFAULT_LEASE_NAME = "vgpu-dra-controller"
DEFAULT_HEALTH_ADDRESS = "127.0.0.1:8081"


def build_parser(env: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = dict(os.environ if env is None else env)
    parser = argparse.ArgumentParser(
        prog="vgpu-dra controller",
        description="Cluster-side controller of vgpu-dra: allocates the claims of pods on the "
        "policy path (scheduling gate vgpu.dra.dev/policy).",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env.get(ENV["kubeconfig"]),
        help="kubeconfig file (env KUBECONFIG); else in-cluster credentials",
    )
    parser.add_argument(
        "--health-address",
        default=env.get(ENV["health_address"], DEFAULT_HEALTH_ADDRESS),
        help="host:port of /healthz and /readyz (env VGPU_DRA_HEALTH_ADDRESS; port 0 = any)",
    )
    parser.add_argument(
        "--log-level", default=env.get(ENV["log_level"], "info"), choices=logsetup.LOG_LEVELS
    )
    parser.add_argument(
        "--log-format",
        default=env.get(ENV["log_format"], "text"),
        choices=logsetup.LOG_FORMATS,
        help="text (key=value, default) or json (env VGPU_DRA_LOG_FORMAT)",
    )
    parser.add_argument(
        "--leader-elect",
        type=_boolean,
        nargs="?",
        const=True,
        default=_boolean(env.get(ENV["leader_elect"], "false")),
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
    parser.add_argument(
        "--driver-name",
        default=env.get(ENV["driver_name"], names.DEFAULT_DRIVER_NAME),
        help="the DRA driver whose claims the rescheduler recovers (env VGPU_DRA_DRIVER_NAME)",
    )
    parser.add_argument(
        "--reschedule",
        type=_boolean,
        nargs="?",
        const=True,
        default=_boolean(env.get(ENV["reschedule"], "true")),
        help="recover pods whose claims failed to prepare: delete them when a controller owns "
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
    return parser


def _boolean(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    logsetup.configure_logging(args.log_level, args.log_format)
    try:
        address = parse_address(args.health_address)
    except ValueError as exc:
        parser.error(f"--health-address: {exc}")
    try:
        client = kube.KubeClient.from_kubeconfig(args.kubeconfig)
    except Exception as exc:  # the client raises several unrelated types for bad configs
        log.error("cannot load Kubernetes credentials (--kubeconfig %s): %s", args.kubeconfig, exc)
        return 1
    for secret in client.credential_strings():
        logsetup.redact(secret)
    stop = threading.Event()
    stop_on_signals(stop, log)
    try:
        probes = ProbeServer(address)
    except OSError as exc:
        log.error("cannot serve probes on %s: %s", args.health_address, exc)
        client.close()
        return 1
    defaults = Defaults(
        {
            POLICY_ANNOTATIONS["node_policy"]: args.node_policy,
            POLICY_ANNOTATIONS["device_policy"]: args.device_policy,
            POLICY_ANNOTATIONS["topology"]: args.topology,
        }
    )
    elector: LeaderElector | None = None
    reconciler = Reconciler(client, defaults)
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
    worker = Worker(client, reconciler, rescheduler)
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
    probes.start()
    host, port = probes.address
    log.info("probes on http://%s:%d (/healthz, /readyz)", host, port)
    worker.start(stop)
    if elector is not None:
        elector.start(stop)
    log.info("allocation controller running (gate vgpu.dra.dev/policy); until SIGTERM")
    stop.wait()
    log.info("shutting down")
    probes.stop()
    if elector is not None:
        elector.join(timeout=10)  # it releases the Lease on its way out
    worker.join(timeout=5)
    client.close()
    log.info("stopped")
    return 0
