"""Certificates between the API server and real kubelets, signed by the bed's CA.

- The API server authenticates to kubelets (logs, exec) with a client certificate
  `kube-apiserver-kubelet-client` in group `system:masters`; the kubelet's webhook authorizer
  then allows it, as the kubelet-api-admin binding does on a kubeadm cluster.
- Each kubelet serves with a certificate for its node name and node IP, and the API server
  verifies it (`--kubelet-certificate-authority`), instead of trusting a self-signed one.
`apiserver_flags` is called once per cluster before the API server starts (it also writes the
egress selector configuration, see `realnode.egress`); `kubelet_serving` per real node.
Keys are 0600, EC P-256 like the rest of the bed's PKI (`vgpu_testbed.cluster.certs`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dra_driver.atomicfile import write_atomic
from vgpu_testbed.cluster import certs
from vgpu_testbed.realnode import egress


def _issue(
    pki_dir: Path,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    *,
    out: tuple[Path, Path],
) -> None:
    cert_path, key_path = out
    cert, key = certs.issue(
        (pki_dir / "ca.crt").read_bytes(),
        (pki_dir / "ca.key").read_bytes(),
        subject,
        usage,
        sans=sans,
    )
    # Keys are created 0600 from the start; no fsync: the bed rebuilds its PKI after a crash.
    write_atomic(str(key_path), key, mode=0o600, sync=False)
    write_atomic(str(cert_path), cert, sync=False)


def egress_socket(cluster_root: Path) -> Path:
    """Where the bed network serves the API server's egress (`<cluster>/nodes/egress.sock`)."""
    return cluster_root / "nodes" / egress.SOCKET_NAME


def apiserver_flags(pki_dir: Path, egress_socket: Path) -> list[str]:
    """Issue the API server's kubelet client certificate, write the egress selector config;
    returns the API server flags that use them."""
    cert, key = pki_dir / "apiserver-kubelet-client.crt", pki_dir / "apiserver-kubelet-client.key"
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client"),
        ]
    )
    _issue(pki_dir, subject, ExtendedKeyUsageOID.CLIENT_AUTH, [], out=(cert, key))
    config = pki_dir / egress.CONFIG_NAME
    write_atomic(str(config), egress.render_config(egress_socket).encode(), sync=False)
    return [
        f"--kubelet-client-certificate={cert}",
        f"--kubelet-client-key={key}",
        f"--kubelet-certificate-authority={pki_dir / 'ca.crt'}",
        f"--egress-selector-config-file={config}",
        # Node names resolve nowhere; the node IP is what the egress relay reaches.
        "--kubelet-preferred-address-types=InternalIP",
    ]


def kubelet_serving(pki_dir: Path, node: str, ip: str, out_dir: Path) -> tuple[Path, Path]:
    """A serving certificate for the kubelet of `node` (SANs: its name and node IP)."""
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert, key = out_dir / "kubelet-serving.crt", out_dir / "kubelet-serving.key"
    sans: list[x509.GeneralName] = [
        x509.DNSName(node),
        x509.IPAddress(ipaddress.ip_address(ip)),
    ]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")])
    _issue(pki_dir, subject, ExtendedKeyUsageOID.SERVER_AUTH, sans, out=(cert, key))
    return cert, key
