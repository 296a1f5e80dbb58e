"""Key material of the test bed.

What this proves:
1. The serving certificate chains to the CA and names 127.0.0.1, localhost and the in-cluster
   service names; it is for server auth only.
2. Private keys are 0600 in a 0700 directory; the service-account key pair matches.
"""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from vgpu_testbed.cluster import certs


def test_generate(tmp_path: Path) -> None:
    paths = certs.generate(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    srv = x509.load_pem_x509_certificate(paths.serving_cert.read_bytes())
    srv.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert {"localhost", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    eku = srv.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]

    assert stat.S_IMODE((tmp_path / "pki").stat().st_mode) == 0o700
    for key in (paths.ca_key, paths.serving_key, paths.sa_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600

    private = serialization.load_pem_private_key(paths.sa_key.read_bytes(), None)
    public = serialization.load_pem_public_key(paths.sa_pub.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert private.public_key().public_numbers() == public.public_numbers()
