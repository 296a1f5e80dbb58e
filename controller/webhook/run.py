"""The webhook's pieces, wired together in the controller: serving admissions, keeping the
certificate and the GPU facts current, and collecting unused templates.

Why apart from controller/main.py: main stays a short sequence that other parts also extend; it
calls `start` when `--webhook-port` is set (flags: `controller.webhook.flags`). Every replica
serves admissions from its own threads (`controller.webhook.server`) and keeps its certificate
current; only the leader collects unused templates. Imported lazily by main, only when the
webhook is on.

Every long-lived loop started here belongs to the `supervisor` given to `start` (the
controller's, so its probes and Lease see a stalled loop; `dra_driver.supervision`):
`webhook` (the server's accepting thread), `webhook-facts`, `webhook-certs` and
`webhook-template-gc`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.probes import parse_address
from controller.webhook import certs
from controller.webhook.admission import Admission
from controller.webhook.facts import FactsCache
from controller.webhook.legacy import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.server import WebhookServer
from controller.webhook.templates import TemplateCollector, TemplateEnsurer
from controller.webhook.translate import TranslationSettings
from dra_driver import kube
from dra_driver.supervision import Supervisor

log = logging.getLogger("vgpu-dra.webhook")
# Python hands the GIL over every 5 ms by default: an admission that is ready to answer can wait
# several such slices behind the informers' decoding of a burst's pod events (the burst that
# brings the admissions) and the connection threads. Switch more often.
SWITCH_INTERVAL_S = 0.0005


@dataclass
class Running:
    threads: list[threading.Thread]
    # Its own registry, also served on the webhook's port at /metrics; registered on the
    # controller's too with --metrics-address.
    metrics: WebhookMetrics
    server: WebhookServer
    drain_s: float = 0.0  # see `stop`
    stopped: threading.Event = field(default_factory=threading.Event)

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop serving; with `drain_s`, first answer for that long while closing connections
        after each answer (`WebhookServer.drain`)."""
        if drain_s > 0:
            self.server.drain()
            time.sleep(drain_s)  # the drain window itself: requests keep being answered
        self.server.stop()
        for thread in self.threads:
            thread.join(timeout=5)
        self.stopped.set()

    def serving(self) -> bool:
        """Readiness: admissions are being served."""
        return self.server.serving()

    def stop_with(self, stop: threading.Event) -> None:
        """Drain and stop once `stop` is set (the controller's shutdown); `stopped` is set when
        done (the controller waits for it before exiting)."""

        def wait() -> None:
            stop.wait()
            self.stop(self.drain_s)

        threading.Thread(target=wait, name="webhook-stop", daemon=True).start()


def translation_settings(args: argparse.Namespace) -> TranslationSettings:
    """The translation's settings from the flags; ValueError when they contradict each other."""
    shared = dict(args.shared_resource)
    memory = dict(args.shared_memory)
    if set(memory) - set(shared):
        raise ValueError(
            f"--shared-memory names {sorted(set(memory) - set(shared))}, which no "
            "--shared-resource declares"
        )
    return TranslationSettings(
        driver=args.driver_name,
        device_class=args.driver_name,
        shared_resources=shared,
        shared_memory_mib=memory,
    )


def _certificates(
    args: argparse.Namespace, client: kube.KubeClient
) -> certs.SecretCertificates | certs.FileCertificates:
    client_ca = None
    if args.webhook_client_ca:
        try:
            client_ca = Path(args.webhook_client_ca).read_bytes()
        except OSError as exc:
            raise certs.CertError(f"cannot read --webhook-client-ca: {exc}") from exc
    holder = certs.ContextHolder(client_ca)
    if args.webhook_cert_dir:
        return certs.FileCertificates(Path(args.webhook_cert_dir), holder)
    ips = [ip.strip() for ip in args.webhook_cert_ips.split(",") if ip.strip()]
    names = [n.strip() for n in args.webhook_config_names.split(",") if n.strip()]
    return certs.SecretCertificates(
        client,
        args.webhook_namespace,
        args.webhook_secret,
        names=certs.Names.for_service(args.webhook_service, args.webhook_namespace, ips),
        lifetimes=certs.Lifetimes(
            ca=args.webhook_ca_lifetime,
            serving=args.webhook_cert_lifetime,
            propagation_s=args.webhook_ca_propagation.total_seconds(),
        ),
        configurations=names,
        holder=holder,
    )


def start(
    args: argparse.Namespace,
    client: kube.KubeClient,
    stop: threading.Event,
    is_leader: Callable[[], bool],
    registry: CollectorRegistry | None = None,
    *,
    supervisor: Supervisor | None = None,
) -> Running:
    """Load (or create) the certificate, then serve admissions and collect templates (while
    `is_leader()`) until `stop`, draining first; the loops supervised by `supervisor` (the
    controller's; a private one when None). Raises CertError/KubeError/OSError when it cannot
    serve, ValueError for settings that contradict each other (main exits 1 with the reason)."""
    settings = translation_settings(args)
    supervisor = supervisor or Supervisor()
    source = _certificates(args, client)
    source.sync()
    metrics = WebhookMetrics(registry)
    grace_s = args.webhook_template_grace.total_seconds()
    ensurer = TemplateEnsurer(client, grace_s=grace_s, on_create=metrics.templates_created.inc)
    facts = FactsCache(client, args.driver_name)
    admission = Admission(settings, ensurer, facts.current)
    server = WebhookServer(
        parse_address(f"{args.webhook_bind}:{args.webhook_port}"),
        source.holder,
        mutate=admission.mutate,
        validate=admission.validate,
        metrics=metrics,
        supervisor=supervisor,
    )
    collector = TemplateCollector(
        client,
        f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
        grace_s=grace_s,
        may_write=is_leader,
        on_delete=metrics.templates_collected.inc,
    )
    threads = [
        certs.keep_synced(
            source, stop, args.webhook_cert_sync.total_seconds(), supervisor=supervisor
        ),
        facts.run(stop, args.webhook_facts_interval.total_seconds(), supervisor=supervisor),
        collector.run(stop, args.webhook_gc_interval.total_seconds(), supervisor=supervisor),
    ]
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server.start()
    host, port = server.address
    log.info("webhook on https://%s:%d (/mutate-pods, /validate, /metrics)", host, port)
    running = Running(threads, metrics, server, drain_s=args.webhook_drain.total_seconds())
    running.stop_with(stop)
    return running
