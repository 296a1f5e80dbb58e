"""What the benches that load the real control plane share: the DeviceClass, the claims and
pods they create, the controller process.

controller_bench and e2e_bench both run `vgpu-dra controller` as a subprocess against the test
bed's apiserver and wait for its /readyz; one home for starting, probing and stopping it keeps
the two measuring the same process the same way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.allocator_cluster import device_class
from tests.fixtures.workloads import resource_claim


def create_device_class(client: KubeClient, driver: str) -> None:
    """The DeviceClass that selects every device of `driver`."""
    client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class(driver))


@contextmanager
def controller_process(kubeconfig: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`vgpu-dra controller` with debug logging into `log`; stopped (then killed) on exit."""
    with log.open("w") as out:
        # The kubeconfig is passed explicitly; an inherited KUBECONFIG must not pick another one.
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "dra_driver.cli", "controller",
                "--kubeconfig", kubeconfig,
                "--health-address", "127.0.0.1:0",
                "--log-level", "debug",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def probe_url(log: Path) -> str | None:
    """The controller's probe address, once its log announced it."""
    match = re.search(r"probes on (http://[\d.]+:\d+)", log.read_text())
    return match.group(1) if match else None


def is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def bench_claim(name: str, namespace: str, driver: str, gpus: int = 1) -> dict[str, Any]:
    """A ResourceClaim for `gpus` GPUs of `driver`, 10 GiB and 20 cores of each."""
    exactly = {
        "deviceClassName": driver,
        "count": gpus,
        "capacity": {"requests": {"memory": "10Gi", "cores": "20"}},
    }
    claim = resource_claim(name, exactly)
    claim["metadata"]["namespace"] = namespace
    return claim


def bench_pod(name: str, namespace: str, claim: str, gate: str | None) -> dict[str, Any]:
    """A pod using `claim` that tolerates every taint (the benches' nodes have no kubelet), held
    back by the scheduling gate `gate` unless None."""
    spec: dict[str, Any] = {
        "tolerations": [{"operator": "Exists"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        "containers": [
            {
                "name": "c",
                "image": "example.invalid/none",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
    }
    if gate is not None:
        spec["schedulingGates"] = [{"name": gate}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
