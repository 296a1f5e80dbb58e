"""The bed's API server authenticates itself to admission webhooks with a client certificate.

Why: a webhook may require the API server's client certificate (`--webhook-client-ca`,
docs/webhook.md#security); a real cluster enables that with an AdmissionConfiguration whose
kubeconfig names the certificate, and so does the bed, so that the requirement is tested against
the real API server. The certificate is signed by a CA of its own (`webhook-client-ca.crt`), not
the cluster CA, which signs every client of the bed. The API server presents it only to a
webhook that asks for a client certificate; every other webhook is unaffected.

`apiserver_flags(pki_dir)` writes the CA, the certificate, the kubeconfig and the
AdmissionConfiguration into `pki_dir` and returns the flag that uses them; `client_ca(pki_dir)`
is the CA file a webhook passes as `--webhook-client-ca`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controller.webhook import certs
from dra_driver.atomicfile import write_atomic
from vgpu_testbed.cluster import certs as bed_certs

CA_NAME = "webhook-client-ca.crt"
LIFETIME = dt.timedelta(days=7)


def client_ca(pki_dir: Path) -> Path:
    return pki_dir / CA_NAME


def issue_client(
    ca_cert_pem: bytes, ca_key_pem: bytes, common_name: str, lifetime: dt.timedelta = LIFETIME
) -> tuple[bytes, bytes]:
    """A client certificate (clientAuth) signed by the CA: (cert PEM, key PEM)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return bed_certs.issue(
        ca_cert_pem, ca_key_pem, subject, ExtendedKeyUsageOID.CLIENT_AUTH, lifetime=lifetime
    )


def apiserver_flags(pki_dir: Path) -> list[str]:
    """Write the CA, the API server's webhook client certificate, its kubeconfig and the
    AdmissionConfiguration; returns the API server flag that reads them."""
    ca_cert, ca_key = certs.new_ca(LIFETIME)
    cert, key = issue_client(ca_cert, ca_key, "kube-apiserver-webhook-client")
    cert_path, key_path = pki_dir / "webhook-client.crt", pki_dir / "webhook-client.key"
    write_atomic(str(client_ca(pki_dir)), ca_cert, sync=False)
    write_atomic(str(cert_path), cert, sync=False)
    write_atomic(str(key_path), key, mode=0o600, sync=False)
    # "*": every webhook host; the certificate is only sent to a webhook that asks for one.
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [
            {
                "name": "*",
                "user": {"client-certificate": str(cert_path), "client-key": str(key_path)},
            }
        ],
    }
    kubeconfig_path = pki_dir / "webhook-client.kubeconfig"
    write_atomic(str(kubeconfig_path), yaml.safe_dump(kubeconfig).encode(), sync=False)
    webhook_config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig_path),
    }
    admission = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": plugin, "configuration": webhook_config}
            for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ],
    }
    admission_path = pki_dir / "admission-configuration.yaml"
    write_atomic(str(admission_path), yaml.safe_dump(admission).encode(), sync=False)
    return [f"--admission-control-config-file={admission_path}"]
