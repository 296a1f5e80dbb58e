"""Fixtures the controller e2e modules share: the chart's controller ServiceAccount and RBAC in a
namespace of the module (`account`, tests/fixtures/controller.py), on the session cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dra_driver.kube import KubeClient
from tests.fixtures.controller import Account, controller_account
from vgpu_testbed.cluster.control_plane import Cluster


@pytest.fixture(scope="module")
def account(
    cluster: Cluster,
    client: KubeClient,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Account]:
    prefix = f"c{uuid.uuid4().hex[:5]}"
    home = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    with controller_account(client, cluster, home, prefix) as acc:
        yield acc
