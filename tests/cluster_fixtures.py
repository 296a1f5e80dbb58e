"""Fixtures for tests against the real control plane (vgpu_testbed.cluster.control_plane), shared by
every level.

Registered once as a plugin by tests/conftest.py, so e2e and integration tests share ONE session
cluster (importing fixtures into two conftests would start two).

`cluster` starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager once per test
session and stops them at the end — also when the session fails or is interrupted: the fixture's
`finally`, an `atexit` hook, and the kernel (the components die with the pytest process, via
PR_SET_PDEATHSIG) each make sure no process survives. Logs stay in the session's tmp dir
(`.../cluster0/logs/`) for debugging.

Without the binaries the e2e tests are skipped with the reason, except in CI (CI=true), where
that is a failure: CI must build them (`make controlplane`).
"""

from __future__ import annotations

import atexit
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from vgpu_testbed.cluster.control_plane import BinariesMissingError, Cluster, find_binaries

# The session cluster's nodes: one per simulated GPU profile (labels only until the kubelet
# plugin runs against simulated GPUs).
SESSION_PROFILES = ("dgx-h100", "a10-pcie")


def require_binaries() -> None:
    """Skip (or, in CI, fail) when the control plane is not built."""
    try:
        find_binaries()
    except BinariesMissingError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the control plane first: {err}", pytrace=False)
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_binaries()
    root = tmp_path_factory.mktemp("cluster")
    started = Cluster.start(root, SESSION_PROFILES, die_with_parent=True)

    def stop() -> None:
        started.stop(keep_logs=True)

    atexit.register(stop)
    try:
        yield started
    finally:
        atexit.unregister(stop)
        leftovers = started.stop(keep_logs=True)
        assert not leftovers, f"processes survived teardown: {leftovers}"


@pytest.fixture(scope="session")
def k8s(cluster: Cluster) -> Iterator[Any]:
    """A `kubernetes.client.ApiClient` with admin rights on the session cluster."""
    api_client = cluster.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def namespace(k8s: Any) -> Iterator[str]:
    """A fresh namespace whose `default` ServiceAccount exists (pods can be created), deleted
    afterwards together with everything in it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(k8s)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        yield name
    finally:
        # Kubelet-less pods never confirm a graceful deletion: delete them at once.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core.delete_namespace(name)
        # Wait until it is gone, so claims of this test no longer hold device capacity when
        # the next test starts.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                core.read_namespace(name)
            except ApiException as err:
                if err.status == 404:
                    break
                raise
            time.sleep(0.2)
        else:
            raise AssertionError(f"namespace {name} still exists 60s after its deletion")
