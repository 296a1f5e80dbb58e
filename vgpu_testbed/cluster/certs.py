"""Key material for a loopback control plane: a CA, the apiserver's serving certificate, and the
service-account signing key pair.

Why not let kube-apiserver self-sign: clients (kubeconfig, the Python client, later the kubelet
stand-in) then need to skip verification. With our own CA every client verifies the server, and
the same CA can sign client certificates later. EC P-256 keys: fast to generate (a few ms), and
accepted by Kubernetes for both TLS and service-account tokens (ES256). Called by
`vgpu_testbed.cluster.control_plane` once per cluster directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controller.webhook.certs import self_signed_ca

# Names and addresses clients may use for the apiserver: loopback, and the in-cluster service
# (first address of the service range 10.0.0.0/24) so an in-cluster client would verify too.
SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "::1", "10.0.0.1")
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True, slots=True)
class CertPaths:
    """Where the PEM files of one cluster live (all under `<dir>/pki`)."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path  # private: the apiserver signs service-account tokens with it
    sa_pub: Path  # public: verifies them

    @classmethod
    def under(cls, pki_dir: Path) -> CertPaths:
        return cls(
            ca_cert=pki_dir / "ca.crt",
            ca_key=pki_dir / "ca.key",
            serving_cert=pki_dir / "apiserver.crt",
            serving_key=pki_dir / "apiserver.key",
            sa_key=pki_dir / "sa.key",
            sa_pub=pki_dir / "sa.pub",
        )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Create the file with its final mode from the start (a key is never briefly readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    cert = self_signed_ca(
        key,
        "vgpu-dra-testbed-ca",
        not_before=now - dt.timedelta(minutes=5),
        not_after=now + _VALIDITY,
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    *,
    sans: Sequence[x509.GeneralName],
    lifetime: dt.timedelta,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh key and its certificate, signed by the CA for one extended key usage.

    Valid from five minutes ago (the bed's processes read one clock, but a certificate made in
    the same second as its first use must not be "not yet valid") until `lifetime` from now or
    the CA's own end, whichever comes first."""
    key = _new_key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + lifetime, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def issue(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    *,
    sans: Sequence[x509.GeneralName] = (),
    lifetime: dt.timedelta = _VALIDITY,
) -> tuple[bytes, bytes]:
    """A leaf certificate signed by the CA given as PEM: (certificate PEM, key PEM).

    The one place the bed issues certificates below a CA (kubelet serving and client
    certificates, the API server's webhook client certificate)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"the CA key of {ca_cert.subject.rfc4514_string()} is not an EC key")
    key, cert = _leaf(ca_key, ca_cert, subject, usage, sans=sans, lifetime=lifetime)
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def generate(pki_dir: Path) -> CertPaths:
    """Write a fresh CA, serving certificate and service-account key pair into `pki_dir` (0700;
    private keys 0600)."""
    pki_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(pki_dir, 0o700)
    paths = CertPaths.under(pki_dir)
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_cert = _ca(now)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVING_DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
    srv_key, srv_cert = _leaf(
        ca_key,
        ca_cert,
        _name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
        lifetime=_VALIDITY,
    )
    sa_key = _new_key()
    pem = serialization.Encoding.PEM
    _write(paths.ca_key, _key_pem(ca_key), 0o600)
    _write(paths.ca_cert, ca_cert.public_bytes(pem), 0o644)
    _write(paths.serving_key, _key_pem(srv_key), 0o600)
    _write(paths.serving_cert, srv_cert.public_bytes(pem), 0o644)
    _write(paths.sa_key, _key_pem(sa_key), 0o600)
    _write(
        paths.sa_pub,
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo),
        0o644,
    )
    return paths
