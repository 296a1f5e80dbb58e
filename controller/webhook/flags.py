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

# flag dest -> the environment variable its default comes from
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
    "shared_resource": "VGPU_DRA_SHARED_RESOURCES",
    "shared_memory": "VGPU_DRA_SHARED_MEMORY",
    "driver_name": "VGPU_DRA_DRIVER_NAME",
    "webhook_client_ca": "VGPU_DRA_WEBHOOK_CLIENT_CA",
    "webhook_drain": "VGPU_DRA_WEBHOOK_DRAIN",
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> dt.timedelta:
    """`90s`, `15m`, `24h`, `365d` or plain seconds -> timedelta (argparse type)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive duration like 24h or 30d, got {text!r}"
        )
    return dt.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


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


# (flag, default, argparse type, help); the dest is the flag's name, its twin ENV[dest].
_FLAGS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--webhook-port", "0", int, "HTTPS port of the webhook; 0 = no webhook"),
    ("--webhook-bind", "127.0.0.1", str, "address the webhook listens on"),
    ("--webhook-namespace", "", str,
     "namespace of the webhook's Service and Secret (default POD_NAMESPACE)"),
    ("--webhook-service", "vgpu-dra-controller", str, "Service name (certificate DNS names)"),
    ("--webhook-secret", "vgpu-dra-webhook-tls", str,
     "Secret holding the CA and serving certificate"),
    ("--webhook-config-names", "vgpu-dra-webhook", str,
     "comma list of Mutating/ValidatingWebhookConfiguration names to keep the caBundle of"),
    ("--webhook-cert-dir", "", str,
     "cert-manager mode: read tls.crt/tls.key from this directory instead of managing a Secret"),
    ("--webhook-cert-ips", "", str, "comma list of IP addresses the certificate also names"),
    ("--webhook-ca-lifetime", "1825d", duration, "validity of a new CA"),
    ("--webhook-cert-lifetime", "365d", duration,
     "validity of a serving certificate (rotated at 2/3 of it)"),
    ("--webhook-ca-propagation", "30s", duration,
     "how long a new CA is trusted before certificates are signed with it"),
    ("--webhook-cert-sync", "10s", duration, "how often the certificate is re-checked"),
    ("--webhook-template-grace", "10m", duration,
     "unused ResourceClaimTemplates younger (or used more recently) than this are kept"),
    ("--webhook-gc-interval", "1m", duration, "how often unused templates are collected"),
    ("--webhook-facts-interval", "30s", duration,
     "how often the GPU inventory the validation compares against is re-read"),
    ("--driver-name", "vgpu.dra.dev", str, "the DRA driver (DeviceClass) name"),
    ("--webhook-client-ca", "", str,
     "PEM file of the CA that signs the API server's client certificate: when set, a "
     "connection without a certificate it signed is refused during the TLS handshake"),
    ("--webhook-drain", "2s", duration,
     "on SIGTERM, keep answering this long, closing each connection after its answer, so "
     "that the API server moves to another replica without a failed admission"),
)  # fmt: skip
_REPEATABLE = (
    ("--shared-resource", shared_resources,
     "a device plugin's shared resource NAME=REPLICAS: one unit is 1/REPLICAS of a GPU"),
    ("--shared-memory", shared_memory,
     "NAME=MIB: GPU memory per replica of a shared resource (without it a share reserves the "
     "GPU's whole memory, so one such pod runs per GPU)"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    group = parser.add_argument_group("admission webhook (docs/webhook.md)")
    defaults = {"webhook_namespace": env.get("POD_NAMESPACE", "default")}
    for flag, default, parse, help_text in _FLAGS:
        dest = flag.removeprefix("--").replace("-", "_")
        # A string default goes through `parse` like a command-line value.
        group.add_argument(
            flag,
            default=env.get(ENV[dest], defaults.get(dest, default)),
            help=f"{help_text} (env {ENV[dest]})",
            type=parse,
        )
    for flag, parse_list, help_text in _REPEATABLE:
        twin = ENV[flag.removeprefix("--").replace("-", "_")]
        try:
            default_list = parse_list(env.get(twin, ""))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{twin}: {exc}")
        group.add_argument(
            flag,
            action=_ExtendOverEnv,
            type=parse_list,
            default=default_list,
            help=f"{help_text} (repeatable or comma-separated; env {twin})",
        )
