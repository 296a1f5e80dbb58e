"""`vgpu-dra controller`: the cluster-side process (a Deployment), dispatched from `dra_driver.cli`.

Today it runs no reconciler: the allocation controller, admission webhook and rescheduler have
their own issue and will be started from here. What it does already is what every later release
needs and what the Deployment's probes check: load the Kubernetes credentials (exit 1 with the
reason when they are unusable), serve `/healthz` and `/readyz` (`controller.probes`, loopback by
default), say in the log that no reconcilers are enabled, and stop cleanly on SIGTERM/SIGINT
(readiness drops first, then the probe server closes, exit 0).
Every flag has an environment twin, as in the kubelet plugin.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Sequence

from controller.probes import ProbeServer, parse_address
from dra_driver import kube, logsetup
from dra_driver.lifecycle import stop_on_signals

log = logging.getLogger("vgpu-dra.controller")

ENV = {
    "kubeconfig": "KUBECONFIG",
    "health_address": "VGPU_DRA_HEALTH_ADDRESS",
    "log_level": "VGPU_DRA_LOG_LEVEL",
    "log_format": "VGPU_DRA_LOG_FORMAT",
}
DEFAULT_HEALTH_ADDRESS = "127.0.0.1:8081"


def build_parser(env: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = dict(os.environ if env is None else env)
    parser = argparse.ArgumentParser(
        prog="vgpu-dra controller",
        description="Cluster-side controller of vgpu-dra (no reconcilers are enabled yet).",
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
    return parser


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
    probes.start()
    host, port = probes.address
    log.info("probes on http://%s:%d (/healthz, /readyz)", host, port)
    log.info("no reconcilers are enabled yet; serving probes until SIGTERM")
    stop.wait()
    log.info("shutting down")
    probes.stop()
    client.close()
    log.info("stopped")
    return 0
