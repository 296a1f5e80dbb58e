"""Identities, the token file and kubeconfigs of the test bed.

What this proves:
1. The token file has one `token,user,uid,"groups"` row per identity that Kubernetes' CSV
   reader parses back to the same values; fields it cannot carry and reused tokens are refused.
2. A kubeconfig is valid YAML, embeds the CA, names the server and the identity's token, and
   refuses a non-https server; credential files are created 0600.
3. Built-in identities map to the users and groups bootstrap RBAC and the Node authorizer know.
"""

from __future__ import annotations

import base64
import csv
import io
import stat
from pathlib import Path

import pytest
import yaml

from vgpu_testbed.cluster import identities as cfiles


def test_token_file_round_trips_through_a_csv_reader() -> None:
    idents = [
        cfiles.admin_identity(),
        cfiles.scheduler_identity(),
        cfiles.node_identity("node-2"),
    ]
    rows = list(csv.reader(io.StringIO(cfiles.render_token_file(idents))))
    assert rows == [
        [idents[0].token, "testbed-admin", "testbed-admin", "system:masters"],
        [idents[1].token, "system:kube-scheduler", "system:kube-scheduler", ""],
        [idents[2].token, "system:node:node-2", "system:node:node-2", "system:nodes"],
    ]


def test_multiple_groups_are_quoted_into_one_field() -> None:
    ident = cfiles.Identity(key="k", user="u", groups=("g1", "g2"), token="t0k")
    assert cfiles.render_token_file([ident]) == 't0k,u,u,"g1,g2"\n'


@pytest.mark.parametrize(
    "ident",
    [
        cfiles.Identity(key="a", user='bad"user', token="t1"),
        cfiles.Identity(key="b", user="u", groups=("x,y",), token="t2"),
        cfiles.Identity(key="c", user="", token="t3"),
        cfiles.Identity(key="d", user="u", token="t\n4"),
    ],
)
def test_unrepresentable_fields_are_refused(ident: cfiles.Identity) -> None:
    with pytest.raises(ValueError, match=f"identity {ident.key!r}"):
        cfiles.render_token_file([ident])


def test_reused_token_is_refused() -> None:
    a = cfiles.Identity(key="a", user="u1", token="same")
    b = cfiles.Identity(key="b", user="u2", token="same")
    with pytest.raises(ValueError, match="reuses"):
        cfiles.render_token_file([a, b])


def test_tokens_are_random_and_long() -> None:
    tokens = {cfiles.admin_identity().token for _ in range(50)}
    assert len(tokens) == 50 and all(len(t) >= 32 for t in tokens)
    ident = cfiles.admin_identity()
    assert ident.token not in repr(ident)  # a logged identity does not leak its secret


def test_kubeconfig_is_self_contained() -> None:
    ident = cfiles.Identity(key="admin", user="testbed-admin", token="abc123")
    text = cfiles.render_kubeconfig(
        server="https://127.0.0.1:6443", ca_pem=b"-----CA-----\n", identity=ident, cluster="bed"
    )
    doc = yaml.safe_load(text)
    assert doc["current-context"] == "bed"
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"-----CA-----\n"
    assert doc["users"] == [{"name": "testbed-admin", "user": {"token": "abc123"}}]
    assert doc["contexts"][0]["context"] == {"cluster": "bed", "user": "testbed-admin"}


def test_kubeconfig_refuses_plain_http() -> None:
    with pytest.raises(ValueError, match="https://"):
        cfiles.render_kubeconfig(
            server="http://127.0.0.1:8080",
            ca_pem=b"x",
            identity=cfiles.admin_identity(),
            cluster="c",
        )


def test_credentials_are_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "kubeconfig"
    cfiles.write_private(path, "secret")
    assert path.read_text() == "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_identities_match_bootstrap_rbac_names() -> None:
    assert cfiles.admin_identity().groups == ("system:masters",)
    assert cfiles.scheduler_identity().user == "system:kube-scheduler"
    node = cfiles.node_identity("node-7")
    assert (node.key, node.user, node.groups) == (
        "node-node-7",
        "system:node:node-7",
        ("system:nodes",),
    )
