"""Fixtures every e2e module on the session cluster shares.

`client` is the admin `KubeClient` of the session cluster (tests/fixtures/cluster.py), one for the
whole session. A module on a private cluster of its own defines its own `client`, which pytest
prefers over this one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dra_driver.kube import KubeClient
from tests.fixtures.cluster import admin_client
from vgpu_testbed.cluster.control_plane import Cluster


@pytest.fixture(scope="session")
def client(cluster: Cluster) -> Iterator[KubeClient]:
    with admin_client(cluster) as kc:
        yield kc
