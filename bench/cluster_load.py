"""What the benches that load the real control plane share: the DeviceClass, the controller process.

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

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient


def create_device_class(client: KubeClient, driver: str) -> None:
    """The DeviceClass that selects every device of `driver`."""
    client.create(
        kube.path(RESOURCE_API, "deviceclasses"),
        {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )


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
