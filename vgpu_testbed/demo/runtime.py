"""Where the demo's pods run: on real bed nodes (kubelet, containerd, runc) or the stand-in.

`vgpu-dra demo --runtime real` (the default where `choose_runtime` allows it) starts every node
with `vgpu_testbed.realnode`: the real kubelet calls our plugin, containerd applies the CDI
specs and runc starts the containers. Then the demo's workloads must run *in those containers*,
not in a mount namespace the bed sets up itself. This module holds what differs on a real node:

- `real_pod`: the deploy/examples pods as they are but for the image (the bed's workload image,
  never pulled) and a command that keeps the container up so the demo can exec into it (and,
  for the shared pod, the torch environment's read-only mounts, vgpu_testbed.torchapp);
- `PodContainer`: a program run in a pod's running container with `ctr task exec` inside the node
  (the same runc exec the kubelet's exec uses), with the interface of
  `vgpu_testbed.demo.workloads.ClaimContainer`, the stand-in's container;
- `kubelet_cdi_ids`: the CDI device IDs the real kubelet recorded for a claim (its DRA manager
  checkpoint), which the stand-in's prepare record gives on the other path;
- `metrics_endpoint`: the plugin's /metrics, served on the node's own loopback, read from inside
  the node's network namespace.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dra_driver.metrics_endpoints import Endpoint
from vgpu_testbed.demo.workloads import ContainerProcesses
from vgpu_testbed.realnode.images import PAUSE, WORKLOAD
from vgpu_testbed.realnode.node import RealNode
from vgpu_testbed.torchapp import TorchApp

__all__ = [
    "PAUSE",
    "WORKLOAD",
    "PodContainer",
    "container_id",
    "kubelet_cdi_ids",
    "kubelet_record",
    "metrics_endpoint",
    "parse_nvml_query",
    "pause_image",
    "pod_ready",
    "real_pod",
]

REAL = "real"
STANDIN = "standin"
PROGRAM_DIR = "/usr/local/bin"  # where the workload image has the demo's programs
KUBELET_DRA_STATE = "dra_manager_state"  # the kubelet's DRA checkpoint under its root dir
CONTAINER_ID = re.compile(r"^containerd://([0-9a-f]{64})$")
_exec_ids = itertools.count(1)


def real_pod(doc: dict[str, Any], torch: TorchApp | None = None) -> dict[str, Any]:
    """An example pod for a real node: the bed's workload image (never pulled) running `sleep`,
    so the demo can exec its workloads into the container; a short grace period on delete.
    With `torch`, its containers also get the torch environment (read-only host mounts)."""
    pod: dict[str, Any] = json.loads(json.dumps(doc))
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    for container in pod["spec"]["containers"]:
        container["image"] = WORKLOAD
        container["imagePullPolicy"] = "Never"
        container["command"] = ["sleep", "3600"]
        container.pop("args", None)
        if torch is not None:
            torch.add_to(pod, container)
    return pod


def pause_image(runtime: str) -> tuple[str, str | None]:
    """(image, imagePullPolicy) of a pod that only needs to exist: the bed's own pause image on
    real nodes (they have no registry), the upstream name on the stand-in (never run)."""
    return (PAUSE, "Never") if runtime == REAL else ("registry.k8s.io/pause:3.10", None)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def container_id(pod: Mapping[str, Any]) -> str:
    """The containerd ID of the pod's (first) container; RuntimeError if it does not run."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    found = [s for s in statuses if s.get("ready")]
    match = CONTAINER_ID.match(str(found[0].get("containerID") or "")) if found else None
    if match is None:
        name = (pod.get("metadata") or {}).get("name")
        raise RuntimeError(f"pod {name} has no running containerd container: {statuses}")
    return match.group(1)


def _walk(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def kubelet_cdi_ids(state_text: str, claim_uid: str) -> list[str] | None:
    """The CDI device IDs the kubelet's DRA checkpoint holds for a claim (None: not recorded).

    The checkpoint is `{"Data": "<JSON>", "Checksum": N}`; the data lists claims by
    `ClaimUID`, each with its drivers' devices and their `CDIDeviceIDs`."""
    document = json.loads(state_text)
    data = document.get("Data") if isinstance(document, dict) else None
    if isinstance(data, str):
        document = json.loads(data)
    for entry in _walk(document):
        if entry.get("ClaimUID") == claim_uid:
            ids = [i for d in _walk(entry) for i in d.get("CDIDeviceIDs") or []]
            return [str(i) for i in ids]
    return None


def kubelet_record(node: RealNode, pod: Mapping[str, Any], claim_uid: str) -> dict[str, Any] | None:
    """The prepare record of one claim, as the real kubelet recorded it (the shape the stand-in's
    pod record has: claims -> devices -> cdiDeviceIDs); None until it did."""
    try:
        text = (node.paths.root / KUBELET_DRA_STATE).read_text()
        ids = kubelet_cdi_ids(text, claim_uid)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if ids is None:
        return None
    return {
        "uid": pod["metadata"]["uid"],
        "ready": True,
        "claims": [{"uid": claim_uid, "devices": [{"cdiDeviceIDs": ids}]}],
    }


@dataclass(frozen=True)
class PodContainer(ContainerProcesses):
    """A pod's running container on a real node: programs are exec'd into it by containerd."""

    # `ctr tasks exec` never passes end-of-file on to the process: a program waiting for its
    # stdin (cuda_hold) gets a line instead.
    run_input: ClassVar[str | None] = "\n"

    node: RealNode
    container_id: str
    node_env: Mapping[str, str] = field(default_factory=dict)  # for NVML read from the host

    def program(self, name: str) -> str:
        return f"{PROGRAM_DIR}/{name.replace('_', '-')}"

    def command(self, argv: Sequence[str]) -> list[str]:
        fifo_dir = self.node.layout.run_dir / "demo-fifo"
        fifo_dir.mkdir(mode=0o700, exist_ok=True)
        exec_id = f"demo-{os.getpid()}-{next(_exec_ids)}"
        ctr = [
            str(self.node.ctr_bin / "ctr"),
            "--address",
            str(self.node.layout.containerd_socket),
            "--namespace",
            "k8s.io",
            "tasks",
            "exec",
            "--exec-id",
            exec_id,
            "--fifo-dir",
            str(fifo_dir),
            self.container_id,
            *argv,
        ]
        return self.node.enter(ctr)

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def nvml(self) -> dict[str, Any]:
        """NVML as the container sees it (the image's `nvml-query`), in the shape of
        `vgpu_testbed.demo.workloads.nvml_view`."""
        done = self.run(["nvml-query"])
        if done.returncode != 0:
            raise RuntimeError(f"nvml-query failed ({done.returncode}): {done.stderr.strip()}")
        return parse_nvml_query(done.stdout)


_GPU_LINE = re.compile(
    r"^gpu (\d+) uuid=(\S+) name=(.*?) total=(\d+) used=(\d+) free=(\d+)$", re.MULTILINE
)


def parse_nvml_query(out: str) -> dict[str, Any]:
    count = re.search(r"^count=(\d+)$", out, re.MULTILINE)
    if count is None:
        raise RuntimeError(f"nvml-query printed no count: {out.strip()[:300]!r}")
    gpus = [
        {
            "index": int(m.group(1)),
            "uuid": m.group(2),
            "name": m.group(3),
            "memory_total": int(m.group(4)),
            "memory_used": int(m.group(5)),
        }
        for m in _GPU_LINE.finditer(out)
    ]
    return {"count": int(count.group(1)), "gpus": gpus}


_SCRAPE = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"  # noqa: E501


def metrics_endpoint(node: RealNode, url: str) -> Endpoint:
    """The plugin's /metrics on a real node: it listens on the node's own loopback, so read it
    from inside the node's network namespace."""

    def fetch() -> str:
        done = subprocess.run(
            ["nsenter", f"--net=/proc/{node.pid1}/ns/net", sys.executable, "-c", _SCRAPE, url],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
        if done.returncode != 0:
            raise OSError(f"reading {url} in {node.node_name}'s network: {done.stderr.strip()}")
        return done.stdout

    return Endpoint(f"{url} (in {node.node_name}'s network namespace)", fetch)
