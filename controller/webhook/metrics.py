"""Prometheus metrics of the admission webhook: per-admission latency and decisions.

A module of its own so the webhook does not depend on the module that serves the controller's
other metrics: it registers on the registry it is given (the controller's, with
`--metrics-address`, so one endpoint serves the process) or on one of its own; either way the
webhook also serves it on its port (`GET /metrics`).
Labels are bounded: the operation and the decision, never a namespace or pod name (tenants
choose those).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

# An admission costs ~0.3 ms of CPU; the buckets resolve a few ms around that.
BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0)
OPERATIONS = ("mutate", "validate")
DECISIONS = ("allowed", "patched", "denied", "error")


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "vgpu_dra_webhook_admission_duration_seconds",
            "Time from reading an AdmissionReview to writing its answer, by operation and "
            "decision (allowed unchanged, patched, denied, error)",
            ["operation", "decision"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.templates_created = Counter(
            "vgpu_dra_webhook_claim_templates_created_total",
            "ResourceClaimTemplates the webhook created for translated pods",
            registry=self.registry,
        )
        self.templates_collected = Counter(
            "vgpu_dra_webhook_claim_templates_collected_total",
            "Unused ResourceClaimTemplates the garbage collector deleted",
            registry=self.registry,
        )

    def observe(self, operation: str, decision: str, seconds: float) -> None:
        self.duration.labels(operation, decision).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
