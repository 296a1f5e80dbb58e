"""The webhook's X.509 material (controller.webhook.certs), without a cluster.

Proves: the serving certificate names the Service's DNS names and the extra IPs, is a server
certificate signed by the CA and never outlives it; `due` turns true at 2/3 of the lifetime;
bundles split into their certificates; bad lifetimes are refused with both values named; an
unusable key pair is a CertError naming the certificate; cert-manager mode loads the mounted
files and reloads only when they change.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from controller.webhook import certs

DAY = dt.timedelta(days=1)


def test_serving_certificate_names_and_chain() -> None:
    ca_cert, ca_key = certs.new_ca(DAY * 10)
    names = certs.Names.for_service("vgpu-dra-controller", "vgpu-system", ["127.0.0.1"])
    cert_pem, _ = certs.new_serving(ca_cert, ca_key, names, DAY * 30)
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "vgpu-dra-controller",
        "vgpu-dra-controller.vgpu-system",
        "vgpu-dra-controller.vgpu-system.svc",
        "vgpu-dra-controller.vgpu-system.svc.cluster.local",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.issuer == ca.subject
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    cert.verify_directly_issued_by(ca)
    # Asked for 30 days under a 10-day CA: capped at the CA's end.
    assert cert.not_valid_after_utc == ca.not_valid_after_utc


def test_due_at_two_thirds() -> None:
    now = dt.datetime.now(dt.UTC)
    ca_cert, _ = certs.new_ca(DAY * 3, now)
    start, end = certs.validity(ca_cert)
    two_thirds = start + (end - start) * 2 / 3
    assert not certs.due(ca_cert, two_thirds - dt.timedelta(seconds=1))
    assert certs.due(ca_cert, two_thirds)


def test_bundle_split() -> None:
    a, _ = certs.new_ca(DAY)
    b, _ = certs.new_ca(DAY)
    assert certs.split_bundle(a + b) == [a, b]
    assert certs.split_bundle(b"") == []


def test_bad_lifetimes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"serving \(2 days, 0:00:00\) <= CA \(1 day"):
        certs.Lifetimes(ca=DAY, serving=DAY * 2)
    with pytest.raises(ValueError, match="0 < serving"):
        certs.Lifetimes(ca=DAY, serving=dt.timedelta(0))


def test_an_unusable_pair_names_the_certificate() -> None:
    ca_cert, ca_key = certs.new_ca(DAY)
    other_cert, _ = certs.new_ca(DAY)
    with pytest.raises(certs.CertError, match="serving certificate or key is unusable"):
        certs.server_context(other_cert, ca_key)  # key of another certificate
    assert certs.server_context(ca_cert, ca_key) is not None


def test_file_mode_reloads_only_on_change(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.new_ca(DAY)
    names = certs.Names(("hook",))
    holder = certs.ContextHolder()
    source = certs.FileCertificates(tmp_path, holder)
    with pytest.raises(certs.CertError, match=str(tmp_path)):
        source.sync()
    first = certs.new_serving(ca_cert, ca_key, names, DAY)
    (tmp_path / "tls.crt").write_bytes(first[0])
    (tmp_path / "tls.key").write_bytes(first[1])
    source.sync()
    context = holder.current()
    assert context is not None
    source.sync()
    assert holder.current() is context  # unchanged files: the same context
    second = certs.new_serving(ca_cert, ca_key, names, DAY)
    (tmp_path / "tls.crt").write_bytes(second[0])
    (tmp_path / "tls.key").write_bytes(second[1])
    source.sync()
    assert holder.current() is not context
