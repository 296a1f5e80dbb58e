"""The webhook's pieces, wired together: serving admissions, and collecting unused templates.

Why apart from controller/main.py: main stays a short sequence that other parts also extend; it
calls `start` when `--webhook-port` is set (flags: `controller.webhook.flags`). Every replica
serves admissions and keeps its certificate current; only the leader collects unused templates.
With `--webhook-process child` (the default) the serving part runs in a child process
(`controller.webhook.process`, `vgpu-dra webhook`) so that admissions never wait for the GIL
behind the controller's informers and allocation; the collector stays in the controller, which
knows whether it leads. `--webhook-process inline` serves from the controller's own threads.
Imported lazily by main, only when the webhook is on.

Every long-lived loop started here is supervised (`dra_driver.supervision`) by the `supervisor`
given to `start` / `serve` (the controller's, so its probes and Lease see a stalled loop; a
private one when None): `webhook-template-gc` and `webhook-child` in the controller, and where
admissions are served `webhook-facts`, `webhook-certs` and the transport's loops.
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
from controller.webhook.aio import AsyncWebhookServer
from controller.webhook.facts import FactsCache
from controller.webhook.legacy import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.process import ChildMetrics, ChildWebhook
from controller.webhook.server import WebhookServer
from controller.webhook.templates import TemplateCollector, TemplateEnsurer
from controller.webhook.translate import TranslationSettings
from dra_driver import kube
from dra_driver.supervision import Supervisor

log = logging.getLogger("vgpu-dra.webhook")
SWITCH_INTERVAL_S = 0.0005
# The family of WebhookMetrics.templates_collected (the collector runs in the controller).
COLLECTED_FAMILY = "vgpu_dra_webhook_claim_templates_collected"


@dataclass
class Running:
    threads: list[threading.Thread]
    # Its own registry, for a controller-wide metrics endpoint to include (it is also served on
    # the webhook's port at /metrics, by whichever process serves admissions).
    metrics: WebhookMetrics
    server: WebhookServer | AsyncWebhookServer | None = None  # serving in this process
    child: ChildWebhook | None = None  # serving in a child process
    drain_s: float = 0.0  # see `stop`
    stopped: threading.Event = field(default_factory=threading.Event)

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop serving; with `drain_s`, first answer for that long while closing connections
        after each answer (`WebhookServer.drain`)."""
        if self.server is not None:
            if drain_s > 0:
                self.server.drain()
                time.sleep(drain_s)  # the drain window itself: requests keep being answered
            self.server.stop()
        if self.child is not None:
            self.child.stop()
        for thread in self.threads:
            thread.join(timeout=5)
        self.stopped.set()

    def serving(self) -> bool:
        """Readiness: admissions are being served (the child process, if any, is running)."""
        return self.child is None or self.child.running()

    def stop_with(self, stop: threading.Event) -> None:
        """Stop serving once `stop` is set (the controller's shutdown); `stopped` is set when
        done (the controller waits for it: its exit would end a draining child)."""

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


def start(
    args: argparse.Namespace,
    client: kube.KubeClient,
    stop: threading.Event,
    is_leader: Callable[[], bool],
    registry: CollectorRegistry | None = None,
    *,
    supervisor: Supervisor | None = None,
) -> Running:
    """The controller's webhook: serve (here or in a child process) and collect templates, its
    loops supervised by `supervisor` (the controller's; a private one when None).
    Raises CertError/KubeError/OSError when it cannot serve, ValueError for settings that
    contradict each other (main exits 1 with the reason)."""
    translation_settings(args)  # contradicting settings stop the controller, not only the child
    supervisor = supervisor or Supervisor()
    if args.webhook_process == "inline":
        metrics = WebhookMetrics(registry)
        running = serve(args, client, stop, metrics, supervisor=supervisor)
        running.threads.append(
            collector(args, client, stop, is_leader, metrics, supervisor=supervisor)
        )
    else:
        metrics = WebhookMetrics()  # exposed through ChildMetrics, merged with the child's
        child = ChildWebhook(args)
        child.start()
        if registry is not None:
            registry.register(ChildMetrics(child, metrics.registry, [COLLECTED_FAMILY]))
        threads = [
            collector(args, client, stop, is_leader, metrics, supervisor=supervisor),
            child.supervise(stop, supervisor=supervisor),
        ]
        running = Running(threads, metrics, child=child, drain_s=child.drain_s)
    running.stop_with(stop)
    return running


def collector(
    args: argparse.Namespace,
    client: kube.KubeClient,
    stop: threading.Event,
    is_leader: Callable[[], bool],
    metrics: WebhookMetrics,
    *,
    supervisor: Supervisor | None = None,
) -> threading.Thread:
    """The periodic collection of unused templates; it writes only while `is_leader()`."""
    return TemplateCollector(
        client,
        f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
        grace_s=args.webhook_template_grace.total_seconds(),
        may_write=is_leader,
        on_delete=metrics.templates_collected.inc,
    ).run(stop, args.webhook_gc_interval.total_seconds(), supervisor=supervisor)


def serve(
    args: argparse.Namespace,
    client: kube.KubeClient,
    stop: threading.Event,
    metrics: WebhookMetrics | None = None,
    *,
    supervisor: Supervisor | None = None,
) -> Running:
    """Load (or create) the certificate, then serve admissions from this process until `stop`
    (`vgpu-dra webhook`, or the controller inline), the loops supervised by `supervisor` (a
    private one when None). Raises CertError/KubeError/OSError when it cannot, ValueError for
    contradicting settings."""
    settings = translation_settings(args)
    supervisor = supervisor or Supervisor()
    client_ca = None
    if args.webhook_client_ca:
        try:
            client_ca = Path(args.webhook_client_ca).read_bytes()
        except OSError as exc:
            raise certs.CertError(f"cannot read --webhook-client-ca: {exc}") from exc
    holder = certs.ContextHolder(client_ca)
    source: certs.SecretCertificates | certs.FileCertificates
    if args.webhook_cert_dir:
        source = certs.FileCertificates(Path(args.webhook_cert_dir), holder)
    else:
        ips = [ip.strip() for ip in args.webhook_cert_ips.split(",") if ip.strip()]
        names = [n.strip() for n in args.webhook_config_names.split(",") if n.strip()]
        source = certs.SecretCertificates(
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
    source.sync()
    metrics = metrics if metrics is not None else WebhookMetrics()
    grace_s = args.webhook_template_grace.total_seconds()
    ensurer = TemplateEnsurer(client, grace_s=grace_s, on_create=metrics.templates_created.inc)
    facts = FactsCache(client, args.driver_name)
    admission = Admission(settings, ensurer, facts.current)
    transport = AsyncWebhookServer if args.webhook_transport == "asyncio" else WebhookServer
    server = transport(
        parse_address(f"{args.webhook_bind}:{args.webhook_port}"),
        holder,
        mutate=admission.mutate,
        validate=admission.validate,
        metrics=metrics,
        phase_timing=args.webhook_phase_timing,
        supervisor=supervisor,
    )
    threads = [
        certs.keep_synced(
            source, stop, args.webhook_cert_sync.total_seconds(), supervisor=supervisor
        ),
        facts.run(stop, args.webhook_facts_interval.total_seconds(), supervisor=supervisor),
    ]
    # Python hands the GIL over every 5 ms by default: with hundreds of connection threads, an
    # admission that is ready to answer can wait several such slices. The webhook's latency
    # target is 10 ms at p99 (bench/webhook_bench.py), so switch more often.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server.start()
    host, port = server.address
    log.info("webhook on https://%s:%d (/mutate-pods, /validate, /metrics)", host, port)
    return Running(threads, metrics, server=server, drain_s=args.webhook_drain.total_seconds())
