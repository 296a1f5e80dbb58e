"""Identities of the test bed and the files that carry them: the apiserver's static token file and
one kubeconfig per identity.

Why static tokens: they need no signing and no controller, and each identity maps to the user name
and groups Kubernetes' bootstrap RBAC already knows (`system:kube-scheduler`,
`system:node:<name>` in `system:nodes`), so the scheduler and a later kubelet stand-in run with
realistic permissions while the admin is in `system:masters`. Rendering is pure; writing is one
helper. Called by `vgpu_testbed.cluster.control_plane`.
"""

from __future__ import annotations

import base64
import csv
import io
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

_FORBIDDEN_IN_TOKEN_FIELD = re.compile(r'[",\n\r]')


@dataclass(frozen=True, slots=True)
class Identity:
    """One authenticated user of the control plane."""

    key: str  # short stable name: file name of its kubeconfig, key in the state file
    user: str
    groups: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_hex(24), repr=False)


def admin_identity() -> Identity:
    return Identity(key="admin", user="testbed-admin", groups=("system:masters",))


def scheduler_identity() -> Identity:
    return Identity(key="kube-scheduler", user="system:kube-scheduler")


def controller_manager_identity() -> Identity:
    # Runs every controller under its own name; system:masters spares us the per-controller
    # service accounts (and the token machinery they need) that a production cluster uses.
    return Identity(
        key="kube-controller-manager",
        user="system:kube-controller-manager",
        groups=("system:masters",),
    )


def node_identity(node_name: str) -> Identity:
    """A kubelet's identity: the Node authorizer lets it read what pods bound to it reference."""
    return Identity(
        key=f"node-{node_name}", user=f"system:node:{node_name}", groups=("system:nodes",)
    )


def render_token_file(identities: Sequence[Identity]) -> str:
    """The `--token-auth-file` CSV: token,user,uid,"group1,group2" per line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    seen: set[str] = set()
    for ident in identities:
        for value in (ident.token, ident.user, *ident.groups):
            if not value or _FORBIDDEN_IN_TOKEN_FIELD.search(value):
                raise ValueError(
                    f"identity {ident.key!r}: {value!r} is empty or contains a quote, comma or "
                    "newline, which the token file cannot carry"
                )
        if ident.token in seen:
            raise ValueError(f"identity {ident.key!r} reuses another identity's token")
        seen.add(ident.token)
        writer.writerow([ident.token, ident.user, ident.user, ",".join(ident.groups)])
    return out.getvalue()


def render_kubeconfig(*, server: str, ca_pem: bytes, identity: Identity, cluster: str) -> str:
    """A self-contained kubeconfig (CA embedded) for one identity."""
    if not server.startswith("https://"):
        raise ValueError(f"server must be an https:// URL, got {server!r}")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": identity.user, "user": {"token": identity.token}}],
        "contexts": [
            {"name": cluster, "context": {"cluster": cluster, "user": identity.user}},
        ],
        "current-context": cluster,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_private(path: Path, text: str) -> None:
    """Write a credential file readable by its owner only (0600 from creation on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
