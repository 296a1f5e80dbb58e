"""The command-line flags every vgpu-dra process shares, and the credential loading behind one.

The kubelet plugin and the controller are separate processes with separate flag sets, but the
operator-facing surface they share (kubeconfig, logging, metrics and tracing endpoints) must read
the same way in both: same flag name, same environment twin, same help. Each `add_*` function
adds one such flag to a parser, taking its default from the environment mapping the caller
passes (tests pass a dict; the processes pass `os.environ`).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping

from dra_driver import kube, logsetup, tracing

# flag dest -> environment variable consulted for its default
ENV = {
    "kubeconfig": "KUBECONFIG",
    "log_level": "VGPU_DRA_LOG_LEVEL",
    "log_format": "VGPU_DRA_LOG_FORMAT",
    "metrics_address": "VGPU_DRA_METRICS_ADDRESS",
    "otlp_endpoint": tracing.OTLP_ENV,
}


def add_kubeconfig(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=env.get(ENV["kubeconfig"]),
        help=f"kubeconfig file (env {ENV['kubeconfig']}); else in-cluster credentials",
    )


def add_logging(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """--log-level and --log-format (`dra_driver.logsetup` reads them)."""
    parser.add_argument(
        "--log-level",
        default=env.get(ENV["log_level"], "info"),
        choices=logsetup.LOG_LEVELS,
        help=f"(env {ENV['log_level']})",
    )
    parser.add_argument(
        "--log-format",
        default=env.get(ENV["log_format"], "text"),
        choices=logsetup.LOG_FORMATS,
        help=f"text (key=value, default) or json (env {ENV['log_format']})",
    )


def add_metrics_address(
    parser: argparse.ArgumentParser, env: Mapping[str, str], example: str
) -> None:
    """--metrics-address, empty (off) by default; `example` is the host:port the help shows."""
    parser.add_argument(
        "--metrics-address",
        default=env.get(ENV["metrics_address"], ""),
        help=f"host:port to serve Prometheus /metrics on (e.g. {example}); empty = off "
        f"(env {ENV['metrics_address']})",
    )


def add_otlp_endpoint(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    parser.add_argument(
        "--otlp-endpoint",
        default=env.get(ENV["otlp_endpoint"], ""),
        help="OTLP/gRPC endpoint for traces (http://host:4317 = plain text); empty = no tracing "
        f"(env {ENV['otlp_endpoint']})",
    )


def add_switch(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    flag: str,
    *,
    env_name: str,
    default: bool,
    help: str,
) -> None:
    """A true/false flag: `--x` alone is true, `--x=false` false; its default comes from
    `env_name` when set (`boolean` reads both)."""
    parser.add_argument(
        flag,
        type=boolean,
        nargs="?",
        const=True,
        default=boolean(env.get(env_name, "true" if default else "false")),
        help=help,
    )


def boolean(text: str | bool) -> bool:
    """An argparse `type` for true/false flags whose default comes from the environment."""
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def connect(kubeconfig: str | None, log: logging.Logger) -> kube.KubeClient | None:
    """The Kubernetes client for --kubeconfig (None: in-cluster credentials), its secrets
    registered for redaction before anything can log them; None, after logging why, when the
    credentials are unusable (the caller exits 1).
    """
    try:
        client = kube.KubeClient.from_kubeconfig(kubeconfig)
    except Exception as exc:  # the client raises several unrelated types for bad configs
        log.error("cannot load Kubernetes credentials (--kubeconfig %s): %s", kubeconfig, exc)
        return None
    for secret in client.credential_strings():
        logsetup.redact(secret)
    return client
