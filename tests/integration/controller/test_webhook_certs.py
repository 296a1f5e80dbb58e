"""Self-managed webhook certificates (controller.webhook.certs.SecretCertificates) against the
real API server, with a controllable clock for the rotation.

Proves: replicas racing to fill the chart's empty Secret, or to create a missing one, end up
serving the same certificate (the loser of the resourceVersion race adopts the winner's); the
Secret's bundle is published into the caBundle of every webhook of the named configuration (a
name that exists as only one kind is fine, and the other kind absent does not block); at 2/3 of
the serving certificate's life a new CA is staged into the bundle (old + new) and published,
and only after the propagation delay promoted with a serving certificate signed by it, once,
however many replicas sync at that moment; a CA that outlives the next serving certificate is
kept and only the serving certificate is reissued.
"""

from __future__ import annotations

import base64
import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from controller.webhook import certs
from dra_driver import kube
from dra_driver.kube import KubeClient

pytestmark = pytest.mark.timeout(120)
DAY = dt.timedelta(days=1)
ADMISSION = "admissionregistration.k8s.io/v1"


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def client(cluster: Any) -> Iterator[KubeClient]:
    kc = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    yield kc
    kc.close()


@pytest.fixture
def config(client: KubeClient) -> Iterator[str]:
    """A MutatingWebhookConfiguration with two webhooks that can never match anything."""
    name = f"certs-{uuid.uuid4().hex[:8]}"
    hook = {
        "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
        "clientConfig": {"url": "https://127.0.0.1:1/never"},
        "namespaceSelector": {"matchLabels": {"never": name}},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["configmaps"]}],
    }  # fmt: skip
    client.create(
        kube.path(ADMISSION, "mutatingwebhookconfigurations"),
        {"apiVersion": ADMISSION, "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": name},
         "webhooks": [{"name": f"a.{name}.test", **hook}, {"name": f"b.{name}.test", **hook}]},
    )  # fmt: skip
    yield name
    client.delete(kube.path(ADMISSION, "mutatingwebhookconfigurations", name))


def replica(
    client: KubeClient, namespace: str, config: str, clock: Clock, lifetimes: certs.Lifetimes
) -> certs.SecretCertificates:
    return certs.SecretCertificates(
        client, namespace, "webhook-tls",
        names=certs.Names.for_service("hook", namespace, ["127.0.0.1"]),
        lifetimes=lifetimes, configurations=[config], holder=certs.ContextHolder(), clock=clock,
    )  # fmt: skip


def secret_data(client: KubeClient, namespace: str) -> dict[str, bytes]:
    secret = client.get(kube.path("v1", "secrets", "webhook-tls", namespace=namespace))
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def published(client: KubeClient, config: str) -> list[bytes]:
    obj = client.get(kube.path(ADMISSION, "mutatingwebhookconfigurations", config))
    return [base64.b64decode(h["clientConfig"].get("caBundle", "")) for h in obj["webhooks"]]


def serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def race(*replicas: certs.SecretCertificates) -> None:
    barrier = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def run(r: certs.SecretCertificates) -> None:
        barrier.wait()
        try:
            r.sync()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []


@pytest.mark.parametrize("empty_secret", [True, False])
def test_replicas_racing_to_initialise_serve_one_certificate(
    client: KubeClient, namespace: str, config: str, empty_secret: bool
) -> None:
    if empty_secret:  # what the chart renders
        client.create(
            kube.path("v1", "secrets", namespace=namespace),
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "webhook-tls"},
             "type": "Opaque"},
        )  # fmt: skip
    clock = Clock()
    lifetimes = certs.Lifetimes(ca=10 * DAY, serving=3 * DAY)
    replicas = [replica(client, namespace, config, clock, lifetimes) for _ in range(3)]
    race(*replicas)
    data = secret_data(client, namespace)
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
    for r in replicas:  # each re-reads the Secret the race left and serves that certificate
        r.sync()
        assert r.holder.current() is not None
    assert published(client, config) == [data["ca-bundle.crt"]] * 2
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(data["ca.crt"]))


def test_rotation_stages_publishes_then_promotes_once(
    client: KubeClient, namespace: str, config: str
) -> None:
    clock = Clock()
    lifetimes = certs.Lifetimes(ca=4 * DAY, serving=3 * DAY, propagation_s=60)
    a, b = (replica(client, namespace, config, clock, lifetimes) for _ in range(2))
    a.sync()
    first = secret_data(client, namespace)
    clock.now += 2 * DAY + dt.timedelta(hours=1)  # past 2/3 of 3 days; the CA has < 3 days left
    race(a, b)
    staged = secret_data(client, namespace)
    assert staged["tls.crt"] == first["tls.crt"]  # still serving the old certificate
    assert certs.split_bundle(staged["ca-bundle.crt"]) == [first["ca.crt"], staged["next-ca.crt"]]
    assert published(client, config) == [staged["ca-bundle.crt"]] * 2  # trusted before use
    clock.now += dt.timedelta(seconds=30)  # within the propagation delay: nothing changes
    a.sync()
    assert secret_data(client, namespace) == staged
    clock.now += dt.timedelta(seconds=31)
    race(a, b)
    promoted = secret_data(client, namespace)
    assert "next-ca.crt" not in promoted
    assert promoted["ca.crt"] == staged["next-ca.crt"]  # promoted once: no second new CA
    new_cert = x509.load_pem_x509_certificate(promoted["tls.crt"])
    new_cert.verify_directly_issued_by(x509.load_pem_x509_certificate(promoted["ca.crt"]))
    assert promoted["ca-bundle.crt"] == staged["ca-bundle.crt"]  # old CA still trusted
    for r in (a, b):
        r.sync()
    # A fresh replica (e.g. a restart) serves the promoted certificate too.
    c = replica(client, namespace, config, clock, lifetimes)
    c.sync()
    assert secret_data(client, namespace) == promoted


def test_a_long_lived_ca_is_kept_and_only_the_serving_certificate_renewed(
    client: KubeClient, namespace: str, config: str
) -> None:
    clock = Clock()
    lifetimes = certs.Lifetimes(ca=30 * DAY, serving=3 * DAY)
    r = replica(client, namespace, config, clock, lifetimes)
    r.sync()
    first = secret_data(client, namespace)
    clock.now += 2 * DAY + dt.timedelta(hours=1)
    r.sync()
    renewed = secret_data(client, namespace)
    assert (
        renewed["ca.crt"] == first["ca.crt"] and renewed["ca-bundle.crt"] == first["ca-bundle.crt"]
    )
    assert serial(renewed["tls.crt"]) != serial(first["tls.crt"])
    assert "next-ca.crt" not in renewed
