"""The webhook's TLS material: a self-managed CA and serving certificate kept in a Secret, their
rotation, the caBundle of the webhook configurations, and the cert-manager alternative.

Why here and why this way: the API server calls the webhook over TLS and trusts only the
`caBundle` of its webhook configuration, so whoever serves must also publish the CA. Without
cert-manager the controller does it itself, with `cryptography` (the well-kept library the test
bed already used for its own PKI; hand-written X.509 would be folly).

Self-managed mode (`SecretCertificates`), shared by every replica through one Secret:
- the first replica to find no Secret creates it (CA + serving cert); the others get
  AlreadyExists and read it. Every later change is an update with the resourceVersion read, so
  two replicas rotating at once cannot both win: the loser re-reads and adopts the winner's.
- rotation starts at `ROTATE_AT` (2/3) of the serving certificate's lifetime. If the CA outlives
  the next serving certificate, only the serving certificate is reissued (the caBundle does not
  change). Otherwise a new CA is *staged*: added to the bundle next to the current one and
  published into the webhook configurations; only when every configuration carries it and
  `propagation_s` has passed is it promoted and a serving certificate signed by it. The API
  server therefore trusts both the old and the new serving certificate during the whole change:
  no admission fails for want of trust.
- every replica re-reads the Secret every `sync_s`, patches the bundle into the configurations
  when they differ and reloads its SSLContext when the serving certificate changed (new
  connections get the new certificate; open ones finish with the old).

cert-manager mode (`FileCertificates`): the chart mounts the Certificate's Secret; the controller
reads `tls.crt`/`tls.key` from the directory and reloads when they change; cert-manager's
cainjector maintains the caBundle.

The serving key is handed to `ssl` through a memfd (`/proc/self/fd/N`): the controller's root
filesystem is read-only and no key should touch a disk anyway.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dra_driver import kube
from dra_driver.supervision import Supervisor

log = logging.getLogger("vgpu-dra.webhook.certs")
SYNC_LOOP = "webhook-certs"
# How long one sync may take beyond its period before the loop counts as stalled: a few API
# requests (Secret, configurations), each bounded by the client's own timeout (30 s).
SYNC_STEP_DEADLINE_S = 300.0

JSON = dict[str, Any]
ROTATE_AT = 2 / 3  # of a certificate's lifetime
ADMISSION_API = "admissionregistration.k8s.io/v1"
CONFIG_PLURALS = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}
# Secret keys. ca-bundle.crt is what the configurations must trust (current CA, plus a staged next
# CA or the previous one while a rotation is under way).
CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, BUNDLE = (
    "ca.crt",
    "ca.key",
    "tls.crt",
    "tls.key",
    "ca-bundle.crt",
)
NEXT_CA_CERT, NEXT_CA_KEY = "next-ca.crt", "next-ca.key"
STAGED_AT = "vgpu.dra.dev/ca-staged-at"


class CertError(Exception):
    """TLS material is missing or unusable; the message says which and where."""


@dataclass(frozen=True)
class Lifetimes:
    """How long new certificates are valid, and how long a staged CA waits before promotion."""

    ca: dt.timedelta
    serving: dt.timedelta
    propagation_s: float = 30.0

    def __post_init__(self) -> None:
        if self.serving <= dt.timedelta(0) or self.ca < self.serving:
            raise ValueError(
                f"certificate lifetimes: need 0 < serving ({self.serving}) <= CA ({self.ca})"
            )


@dataclass(frozen=True)
class Names:
    """What the serving certificate is valid for."""

    dns: tuple[str, ...]
    ips: tuple[str, ...] = ()

    @classmethod
    def for_service(cls, service: str, namespace: str, ips: Sequence[str] = ()) -> Names:
        """The DNS names a Service is reached by from the API server, and extra IPs (the test
        bed calls 127.0.0.1)."""
        dns = (
            service,
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local",
        )
        return cls(dns, tuple(ips))


# ---- X.509 ---------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _backdate(lifetime: dt.timedelta) -> dt.timedelta:
    """How far before `now` a certificate starts: clock skew between us and the API server, but
    a small part of the lifetime so that `due` (2/3 of it) stays about 2/3 after issuing."""
    return min(dt.timedelta(minutes=5), lifetime / 20)


def self_signed_ca(
    key: ec.EllipticCurvePrivateKey,
    common_name: str,
    not_before: dt.datetime,
    not_after: dt.datetime,
    serial: int | None = None,
) -> x509.Certificate:
    """A CA certificate for `key`, signed by itself, that may sign end-entity certificates only
    (path length 0); a random serial unless given. Also the test bed's cluster CA
    (vgpu_testbed.cluster.certs)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number() if serial is None else serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def new_ca(lifetime: dt.timedelta, now: dt.datetime | None = None) -> tuple[bytes, bytes]:
    """A fresh self-signed CA: (cert PEM, key PEM). P-256: small, fast to sign and verify."""
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    # A distinct subject per CA: during a rotation the API server holds two CAs, and a verifier
    # that picks the issuer by name must not try the other one's key.
    serial = x509.random_serial_number()
    cert = self_signed_ca(
        key,
        f"vgpu-dra-webhook-ca-{serial:x}"[:64],
        not_before=now - _backdate(lifetime),  # tolerate clock skew
        not_after=now + lifetime,
        serial=serial,
    )
    return _cert_pem(cert), _key_pem(key)


def new_serving(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    names: Names,
    lifetime: dt.timedelta,
    now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A serving certificate for `names` signed by the CA: (cert PEM, key PEM). Never valid past
    the CA."""
    now = now or _now()
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertError("the webhook CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names.dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in names.ips]
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (names.dns or ("webhook",))[0])])
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _backdate(lifetime))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def validity(cert_pem: bytes) -> tuple[dt.datetime, dt.datetime]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def due(cert_pem: bytes, now: dt.datetime | None = None) -> bool:
    """True once `ROTATE_AT` of the certificate's lifetime has passed."""
    start, end = validity(cert_pem)
    return (now or _now()) >= start + (end - start) * ROTATE_AT


def split_bundle(bundle: bytes) -> list[bytes]:
    """The PEM certificates of a bundle, each normalised (for comparisons)."""
    return [_cert_pem(c) for c in x509.load_pem_x509_certificates(bundle)] if bundle else []


def server_context(
    cert_pem: bytes, key_pem: bytes, client_ca: bytes | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ server context for the pair, loaded without writing the key to a file. With
    `client_ca` (PEM), the handshake fails for a client without a certificate that CA signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca:
        try:
            context.load_verify_locations(cadata=client_ca.decode())
        except (ssl.SSLError, ValueError) as exc:
            raise CertError(f"the webhook's client CA is unusable: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    fd = os.memfd_create("webhook-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert_pem + b"\n" + key_pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    except (ssl.SSLError, OSError) as exc:
        raise CertError(f"the webhook's serving certificate or key is unusable: {exc}") from exc
    finally:
        os.close(fd)
    return context


# ---- sources of the serving certificate ------------------------------------------------------


class ContextHolder:
    """The SSLContext new connections use; swapped atomically on reload. `client_ca` (PEM):
    require a client certificate signed by it (`--webhook-client-ca`)."""

    def __init__(self, client_ca: bytes | None = None) -> None:
        self._client_ca = client_ca
        self._context: ssl.SSLContext | None = None
        self._serving: bytes = b""
        self._lock = threading.Lock()

    def current(self) -> ssl.SSLContext | None:
        with self._lock:
            return self._context

    def load(self, cert_pem: bytes, key_pem: bytes) -> bool:
        """Install the pair unless it is already installed; True when it changed."""
        with self._lock:
            if cert_pem == self._serving:
                return False
        context = server_context(cert_pem, key_pem, self._client_ca)
        with self._lock:
            self._context, self._serving = context, cert_pem
        return True


class FileCertificates:
    """cert-manager mode: `tls.crt`/`tls.key` in a mounted directory, reloaded when they change
    (the kubelet swaps the files of a Secret volume atomically through a symlink)."""

    def __init__(self, directory: Path, holder: ContextHolder) -> None:
        self._dir = directory
        self.holder = holder

    def sync(self) -> None:
        try:
            cert = (self._dir / TLS_CERT).read_bytes()
            key = (self._dir / TLS_KEY).read_bytes()
        except OSError as exc:
            raise CertError(f"cannot read the webhook certificate in {self._dir}: {exc}") from exc
        if self.holder.load(cert, key):
            log.info("webhook serving certificate loaded from %s", self._dir)


class SecretCertificates:
    """Self-managed mode: the Secret `namespace/name` shared by the replicas (module docstring)."""

    def __init__(
        self,
        client: kube.KubeClient,
        namespace: str,
        name: str,
        *,
        names: Names,
        lifetimes: Lifetimes,
        configurations: Sequence[str],
        holder: ContextHolder,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self._client = client
        self._path = kube.path("v1", "secrets", name, namespace=namespace)
        self._collection = kube.path("v1", "secrets", namespace=namespace)
        self._namespace, self._name = namespace, name
        self._names = names
        self._lifetimes = lifetimes
        self._configurations = list(configurations)  # names, looked up in both kinds
        self.holder = holder
        self._clock = clock

    # One pass: read (or create) the Secret, advance a rotation, publish the bundle, reload.
    def sync(self) -> None:
        secret = self._read_or_create()
        secret = self._advance(secret)
        data = _decoded(secret)
        if all(self._publish(name, data[BUNDLE]) for name in self._configurations):
            secret = self._promote_if_ready(secret)
            data = _decoded(secret)
        if self.holder.load(data[TLS_CERT], data[TLS_KEY]):
            _, end = validity(data[TLS_CERT])
            log.info("webhook serving certificate loaded (valid until %s)", end.isoformat())

    def _read_or_create(self) -> JSON:
        try:
            secret = self._client.get(self._path)
        except kube.NotFound:
            secret = None
        if secret is not None and _complete(secret):
            return secret
        now = self._clock()
        ca_cert, ca_key = new_ca(self._lifetimes.ca, now)
        tls_cert, tls_key = new_serving(ca_cert, ca_key, self._names, self._lifetimes.serving, now)
        data = {CA_CERT: ca_cert, CA_KEY: ca_key, TLS_CERT: tls_cert, TLS_KEY: tls_key}
        data[BUNDLE] = ca_cert
        if secret is None:
            body: JSON = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": self._name,
                    "namespace": self._namespace,
                    "labels": {"app.kubernetes.io/component": "webhook"},
                },
                "type": "Opaque",  # like the chart's (a type cannot change later)
                "data": _encoded(data),
            }
            try:
                created = self._client.create(self._collection, body)
                log.info(
                    "webhook certificates created in secret %s/%s", self._namespace, self._name
                )
                return created
            except kube.AlreadyExists:  # another replica was first: use its certificates
                return self._client.get(self._path)
        # A Secret without every key (e.g. created empty by hand): fill it, resourceVersion-checked.
        return self._write(secret, data, None, "initialised")

    def _advance(self, secret: JSON) -> JSON:
        """Start a rotation when the serving certificate is due."""
        data = _decoded(secret)
        now = self._clock()
        if NEXT_CA_CERT in data or not due(data[TLS_CERT], now):
            return secret
        _, ca_end = validity(data[CA_CERT])
        if ca_end - now > self._lifetimes.serving and not due(data[CA_CERT], now):
            # The CA outlives a new serving certificate: reissue that alone; the bundle stays.
            cert, key = new_serving(
                data[CA_CERT], data[CA_KEY], self._names, self._lifetimes.serving, now
            )
            return self._write(secret, {**data, TLS_CERT: cert, TLS_KEY: key}, None, "renewed")
        next_cert, next_key = new_ca(self._lifetimes.ca, now)
        staged = {
            **data,
            NEXT_CA_CERT: next_cert,
            NEXT_CA_KEY: next_key,
            BUNDLE: data[CA_CERT] + next_cert,
        }
        return self._write(secret, staged, now.isoformat(), "new CA staged")

    def _promote_if_ready(self, secret: JSON) -> JSON:
        """Once a staged CA is trusted everywhere and has had time to propagate, sign with it."""
        data = _decoded(secret)
        if NEXT_CA_CERT not in data:
            return secret
        staged = (secret.get("metadata", {}).get("annotations") or {}).get(STAGED_AT, "")
        now = self._clock()
        try:
            staged_at = dt.datetime.fromisoformat(staged)
        except ValueError:  # mark lost or garbled (a hand edit): restart the wait, once
            return self._write(secret, data, now.isoformat(), "staging mark restored")
        if (now - staged_at).total_seconds() < self._lifetimes.propagation_s:
            return secret
        cert, key = new_serving(
            data[NEXT_CA_CERT], data[NEXT_CA_KEY], self._names, self._lifetimes.serving, now
        )
        promoted = {
            CA_CERT: data[NEXT_CA_CERT],
            CA_KEY: data[NEXT_CA_KEY],
            TLS_CERT: cert,
            TLS_KEY: key,
            # The old CA stays trusted: replicas still serving the old certificate keep working
            # until they reload; the next staging drops it.
            BUNDLE: data[BUNDLE],
        }
        return self._write(secret, promoted, "", "CA promoted, serving certificate reissued")

    def _write(
        self, secret: JSON, data: dict[str, bytes], staged_at: str | None, what: str
    ) -> JSON:
        body = dict(secret)
        metadata = dict(body.get("metadata") or {})
        annotations = dict(metadata.get("annotations") or {})
        if staged_at == "":
            annotations.pop(STAGED_AT, None)
        elif staged_at is not None:
            annotations[STAGED_AT] = staged_at
        metadata["annotations"] = annotations
        body["metadata"] = metadata  # carries the resourceVersion read: a lost race is a Conflict
        body["data"] = _encoded(data)
        try:
            written = self._client.replace(self._path, body)
        except kube.Conflict:
            log.info("webhook secret changed under us (another replica); re-reading it")
            return self._client.get(self._path)
        log.info("webhook certificates %s (secret %s/%s)", what, self._namespace, self._name)
        return written

    def _publish(self, name: str, bundle: bytes) -> bool:
        """Make the Mutating and/or Validating configuration `name` trust `bundle`; True when
        every one that exists does and at least one exists."""
        results = [self._publish_in(kind, name, bundle) for kind in CONFIG_PLURALS]
        if all(r is None for r in results):
            log.warning("no webhook configuration named %s exists (yet); its caBundle waits", name)
            return False
        return all(r is not False for r in results)

    def _publish_in(self, kind: str, name: str, bundle: bytes) -> bool | None:
        resource = kube.path(ADMISSION_API, CONFIG_PLURALS[kind], name)
        wanted = base64.b64encode(bundle).decode()
        try:
            config = self._client.get(resource)
        except kube.NotFound:
            return None
        hooks = config.get("webhooks") or []
        if all((h.get("clientConfig") or {}).get("caBundle") == wanted for h in hooks):
            return True
        for hook in hooks:
            hook.setdefault("clientConfig", {})["caBundle"] = wanted
        try:
            self._client.replace(resource, config)
        except kube.Conflict:
            return False  # changed meanwhile (e.g. helm upgrade): next pass
        log.info("caBundle published into %s %s", kind, name)
        return True


def _complete(secret: JSON) -> bool:
    data = secret.get("data") or {}
    return all(data.get(k) for k in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, BUNDLE))


def _decoded(secret: JSON) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _encoded(data: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


def keep_synced(
    source: SecretCertificates | FileCertificates,
    stop: threading.Event,
    interval_s: float,
    *,
    supervisor: Supervisor | None = None,
) -> threading.Thread:
    """Re-run `source.sync()` every `interval_s` until `stop` (the first after one interval:
    the caller synced before serving), as the supervised loop `webhook-certs` of `supervisor`
    (a private one when None). A failed pass is logged (an API, certificate or value error in
    one line; anything else with its traceback, counted) and retried after a backoff; the
    certificate already loaded keeps serving."""

    started = False

    def sync() -> None:
        nonlocal started
        if started:
            source.sync()
        started = True

    return (supervisor or Supervisor()).run(
        SYNC_LOOP,
        sync,
        stop,
        period_s=interval_s,
        deadline_s=interval_s + SYNC_STEP_DEADLINE_S,
        expected=(kube.KubeError, CertError, ValueError),
    )
