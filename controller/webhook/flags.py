"""The webhook's command-line flags (each with an environment twin, as every controller flag).

A module apart from `controller.webhook.run` so that `vgpu-dra controller --help` lists them
without importing the TLS and translation machinery.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Callable, Mapping
from typing import Any

ENV = {
    "webhook_port": "VGPU_DRA_WEBHOOK_PORT",
    "webhook_bind": "VGPU_DRA_WEBHOOK_BIND",
    "webhook_namespace": "VGPU_DRA_WEBHOOK_NAMESPACE",
    "webhook_service": "VGPU_DRA_WEBHOOK_SERVICE",
    "webhook_secret": "VGPU_DRA_WEBHOOK_SECRET",
    "webhook_config_names": "VGPU_DRA_WEBHOOK_CONFIG_NAMES",
    "webhook_cert_dir": "VGPU_DRA_WEBHOOK_CERT_DIR",
    "webhook_cert_ips": "VGPU_DRA_WEBHOOK_CERT_IPS",
    "webhook_ca_lifetime": "VGPU_DRA_WEBHOOK_CA_LIFETIME",
    "webhook_cert_lifetime": "VGPU_DRA_WEBHOOK_CERT_LIFETIME",
    "webhook_ca_propagation": "VGPU_DRA_WEBHOOK_CA_PROPAGATION",
    "webhook_cert_sync": "VGPU_DRA_WEBHOOK_CERT_SYNC",
    "webhook_template_grace": "VGPU_DRA_WEBHOOK_TEMPLATE_GRACE",
    "webhook_gc_interval": "VGPU_DRA_WEBHOOK_GC_INTERVAL",
    "webhook_facts_interval": "VGPU_DRA_WEBHOOK_FACTS_INTERVAL",
    "shared_resources": "VGPU_DRA_SHARED_RESOURCES",
    "shared_memory": "VGPU_DRA_SHARED_MEMORY",
    "driver_name": "VGPU_DRA_DRIVER_NAME",
    "webhook_process": "VGPU_DRA_WEBHOOK_PROCESS",
    "webhook_client_ca": "VGPU_DRA_WEBHOOK_CLIENT_CA",
    "webhook_drain": "VGPU_DRA_WEBHOOK_DRAIN",
    "webhook_phase_timing": "VGPU_DRA_WEBHOOK_PHASE_TIMING",
    "webhook_transport": "VGPU_DRA_WEBHOOK_TRANSPORT",
}
# Where the controller serves admissions: a child process of its own (`vgpu-dra webhook`, the
# default: admissions do not share the GIL with informers and allocation) or its own threads.
PROCESS_CHOICES = ("child", "inline")
# How connections are served: a thread each (controller.webhook.server) or one event loop
# (controller.webhook.aio); docs/webhook.md, Performance, has the figures of each.
TRANSPORT_CHOICES = ("asyncio", "threads")  # the first is the default (docs/webhook.md)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> dt.timedelta:
    """`90s`, `15m`, `24h`, `365d` or plain seconds -> timedelta (argparse type)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive duration like 24h or 30d, got {text!r}"
        )
    return dt.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def boolean(text: str) -> bool:
    """`true`/`false` (also 1/0, yes/no; any case) -> bool (argparse type)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _pairs(text: str, example: str) -> list[tuple[str, int]]:
    """`NAME=N[,NAME=N...]` (N >= 1) -> [(NAME, N), ...]; ArgumentTypeError names the bad item."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        match = re.fullmatch(r"([^=\s]+)\s*=\s*([0-9]+)", item)
        if match is None or int(match.group(2)) < 1:
            raise argparse.ArgumentTypeError(f"expected {example}, got {item!r}")
        found.append((match.group(1), int(match.group(2))))
    return found


def shared_resources(text: str) -> list[tuple[str, int]]:
    """Device plugin shared resources and their replicas per GPU (argparse type)."""
    return _pairs(text, "NAME=REPLICAS with REPLICAS >= 1 (e.g. nvidia.com/sharedgpu=4)")


def shared_memory(text: str) -> list[tuple[str, int]]:
    """MiB of GPU memory per replica of a shared resource (argparse type)."""
    return _pairs(text, "NAME=MIB with MIB >= 1 (e.g. nvidia.com/sharedgpu=6144)")


class _ExtendOverEnv(argparse.Action):
    """Like `extend`, but the first use on the command line replaces the environment's value
    (as every other flag overrides its environment twin) instead of adding to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen = getattr(namespace, "_seen_" + self.dest, False)
        current = list(getattr(namespace, self.dest) or []) if seen else []
        setattr(namespace, self.dest, current + list(values))
        setattr(namespace, "_seen_" + self.dest, True)


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    group = parser.add_argument_group("admission webhook (docs/webhook.md)")

    def add(
        flag: str,
        key: str,
        default: str,
        help_text: str,
        parse: Callable[[str], Any] = str,
    ) -> None:
        # A string default goes through `parse` like a command-line value.
        group.add_argument(
            flag,
            default=env.get(ENV[key], default),
            help=f"{help_text} (env {ENV[key]})",
            type=parse,
        )

    add(
        "--webhook-port",
        "webhook_port",
        "0",
        "HTTPS port of the webhook; 0 = no webhook",
        parse=int,
    )
    add("--webhook-bind", "webhook_bind", "127.0.0.1", "address the webhook listens on")
    add(
        "--webhook-namespace",
        "webhook_namespace",
        env.get("POD_NAMESPACE", "default"),
        "namespace of the webhook's Service and Secret (default POD_NAMESPACE)",
    )
    add(
        "--webhook-service",
        "webhook_service",
        "vgpu-dra-controller",
        "Service name (certificate DNS names)",
    )
    add(
        "--webhook-secret",
        "webhook_secret",
        "vgpu-dra-webhook-tls",
        "Secret holding the CA and serving certificate",
    )
    add(
        "--webhook-config-names",
        "webhook_config_names",
        "vgpu-dra-webhook",
        "comma list of Mutating/ValidatingWebhookConfiguration names to keep the caBundle of",
    )
    add(
        "--webhook-cert-dir",
        "webhook_cert_dir",
        "",
        "cert-manager mode: read tls.crt/tls.key from this directory instead of managing a Secret",
    )
    add(
        "--webhook-cert-ips",
        "webhook_cert_ips",
        "",
        "comma list of IP addresses the certificate also names",
    )
    add(
        "--webhook-ca-lifetime",
        "webhook_ca_lifetime",
        "1825d",
        "validity of a new CA",
        parse=duration,
    )
    add(
        "--webhook-cert-lifetime",
        "webhook_cert_lifetime",
        "365d",
        "validity of a serving certificate (rotated at 2/3 of it)",
        parse=duration,
    )
    add(
        "--webhook-ca-propagation",
        "webhook_ca_propagation",
        "30s",
        "how long a new CA is trusted before certificates are signed with it",
        parse=duration,
    )
    add(
        "--webhook-cert-sync",
        "webhook_cert_sync",
        "10s",
        "how often the certificate is re-checked",
        parse=duration,
    )
    add(
        "--webhook-template-grace",
        "webhook_template_grace",
        "10m",
        "unused ResourceClaimTemplates younger (or used more recently) than this are kept",
        parse=duration,
    )
    add(
        "--webhook-gc-interval",
        "webhook_gc_interval",
        "1m",
        "how often unused templates are collected",
        parse=duration,
    )
    add(
        "--webhook-facts-interval",
        "webhook_facts_interval",
        "30s",
        "how often the GPU inventory the validation compares against is re-read",
        parse=duration,
    )
    for flag, key, parse, help_text in (
        ("--shared-resource", "shared_resources", shared_resources,
         "a device plugin's shared resource NAME=REPLICAS: one unit is 1/REPLICAS of a GPU"),
        ("--shared-memory", "shared_memory", shared_memory,
         "NAME=MIB: GPU memory per replica of a shared resource (without it a share reserves the "
         "GPU's whole memory, so one such pod runs per GPU)"),
    ):  # fmt: skip
        try:
            default = parse(env.get(ENV[key], ""))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{ENV[key]}: {exc}")
        group.add_argument(
            flag,
            action=_ExtendOverEnv,
            type=parse,
            default=default,
            help=f"{help_text} (repeatable or comma-separated; env {ENV[key]})",
        )
    add("--driver-name", "driver_name", "vgpu.dra.dev", "the DRA driver (DeviceClass) name")
    add(
        "--webhook-client-ca",
        "webhook_client_ca",
        "",
        "PEM file of the CA that signs the API server's client certificate: when set, a "
        "connection without a certificate it signed is refused during the TLS handshake",
    )
    add(
        "--webhook-drain",
        "webhook_drain",
        "2s",
        "on SIGTERM, keep answering this long, closing each connection after its answer, so "
        "that the API server moves to another replica without a failed admission",
        parse=duration,
    )
    add(
        "--webhook-phase-timing",
        "webhook_phase_timing",
        "false",
        "diagnosis: add to each admission's log line the time of each phase and the split of its "
        "wall time into CPU, CPU-queue and asleep (GIL) time; costs ~0.05 ms per admission",
        parse=boolean,
    )
    group.add_argument(
        "--webhook-process",
        default=env.get(ENV["webhook_process"], PROCESS_CHOICES[0]),
        choices=PROCESS_CHOICES,
        help="controller only: serve admissions from a child process `vgpu-dra webhook` (child) "
        f"or from the controller's own threads (inline) (env {ENV['webhook_process']})",
    )
    group.add_argument(
        "--webhook-transport",
        default=env.get(ENV["webhook_transport"], TRANSPORT_CHOICES[0]),
        choices=TRANSPORT_CHOICES,
        help="serve webhook connections from asyncio event loops (asyncio: one for accepts and TLS "
        "handshakes, one for established connections) or from a thread each (threads) "
        f"(env {ENV['webhook_transport']})",
    )
