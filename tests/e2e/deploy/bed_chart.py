"""The chart installed on a test-bed real node as a user installs it, and the image it runs.

Shared by the install e2e (tests/e2e/deploy/test_realnode_install.py) and the image bench
(bench/image_bench.py), so both run the same install.

The image: the product image `make image` writes as an archive (build/image/vgpu-dra.tar,
Docker's format; built from the Dockerfile by a real engine), imported into the node's
containerd as an operator without a registry does (`ctr -n k8s.io images import`). Where there
is none (a developer machine without a container engine), or it was built from other sources
than the image tree (its wheel's RECORD differs), the image tree packed with the bed's
interpreter (`vgpu_testbed.realnode.plugin_image`) stands in; `product_image` says which and why.
Either is tagged with the name the chart's default values give the kubelet
(`vgpu-dra:<appVersion>`, docker.io/library/... once normalised), so the chart's image values
stay the defaults and nothing is pulled.

The values: the chart's defaults, except what the bed needs (`bed_values`): the node's own
directories as the host paths, one controller replica, and the webhook on the node's loopback.
The rendered objects get what the bed cannot give a pod otherwise (`bed_objects`):
- `hostNetwork: true` and KUBERNETES_SERVICE_HOST/PORT = the node's 127.0.0.1 relay of the API
  server, for the plugin and the controller: the bed has no kube-proxy (a Service IP leads
  nowhere) and the API server's certificate names 127.0.0.1 only. Two controller replicas on
  one node's network would share its ports: hence one replica.
- the webhook configurations call https://127.0.0.1:<port> (a relay into the node, where the
  controller listens) instead of the controller's Service, which the API server cannot reach
  here; the controller's certificate names 127.0.0.1 too (VGPU_DRA_WEBHOOK_CERT_IPS). Rules,
  matchConditions, namespaceSelector (all namespaces) and failure policies stay the chart's.
- the simulated driver, where NVIDIA's container runtime puts the real one: libnvidia-ml.so.1
  mounted into /usr/lib/x86_64-linux-gnu, the simulator's state and profile with their
  VGPU_SIM_* environment. The chart's default `nvml.mode: runtimeClass` stays: the bed's
  RuntimeClass `nvidia` (`runtime_class`) maps to the node's runc.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dra_driver import kube
from dra_driver.kube import KubeClient
from vgpu_testbed import polling
from vgpu_testbed.cluster import chart
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.cluster.webhook import bed_configurations
from vgpu_testbed.fakegpu import simulator as fakegpu
from vgpu_testbed.realnode.images import BuiltImage, import_images
from vgpu_testbed.realnode.node import RealNode
from vgpu_testbed.realnode.plugin_image import build_plugin_image

JSON = dict[str, Any]
T = TypeVar("T")
REPO = Path(__file__).resolve().parents[3]
DRIVER = "vgpu.dra.dev"
NODE_NAME = "node-1"
NAMESPACE = "vgpu-dra"
RELEASE = "bed"
PLUGIN_LABELS = "app.kubernetes.io/component=kubelet-plugin"
CONTROLLER_LABELS = "app.kubernetes.io/component=controller"
ARCHIVE = Path(os.environ.get("VGPU_DRA_IMAGE_ARCHIVE", REPO / "build" / "image" / "vgpu-dra.tar"))
APP_VERSION = str(yaml.safe_load((chart.CHART / "Chart.yaml").read_text())["appVersion"])
# What the kubelet asks containerd for when the chart's image values are the defaults.
DEFAULT_IMAGE = f"docker.io/library/vgpu-dra:{APP_VERSION}"
# A pod written for vgpu-manager, as in docs/install.md and docs/migration.md.
LEGACY_POD = REPO / "deploy" / "examples" / "legacy" / "vgpu-manager.yaml"
NVML_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
SITE = "opt/vgpu-dra/site-packages/"


# ---------------------------------------------------------------- the image


def archive_manifest(archive: Path) -> JSON:
    """The image's entry of a `docker save` archive's manifest.json (Config, RepoTags, Layers)."""
    with tarfile.open(archive) as outer:
        member = outer.extractfile("manifest.json")
        assert member is not None
        (entry,) = json.load(member)
    return dict(entry)


def archive_config(archive: Path) -> JSON:
    """The image's config (its user, entry point, environment) from the archive."""
    with tarfile.open(archive) as outer:
        member = outer.extractfile(archive_manifest(archive)["Config"])
        assert member is not None
        return dict(json.load(member))


def archive_paths(archive: Path) -> Iterator[tuple[str, tarfile.TarFile, tarfile.TarInfo]]:
    """Every entry of every layer of the archive: (path in the image, layer, entry)."""
    with tarfile.open(archive) as outer:
        for name in archive_manifest(archive)["Layers"]:
            blob = outer.extractfile(name)
            assert blob is not None
            with tarfile.open(fileobj=blob) as layer:
                for entry in layer:
                    yield entry.name.removeprefix("./"), layer, entry


def _python_hashes(record: str) -> dict[str, str]:
    """path -> sha256 of the product's Python sources a wheel installed (its RECORD; the test
    bed is in the wheel but not in the image)."""
    rows = (line.split(",") for line in record.splitlines() if line.strip())
    return {
        row[0]: row[1]
        for row in rows
        if row[0].endswith(".py") and len(row) > 1 and not row[0].startswith("vgpu_testbed/")
    }


def _archive_record(archive: Path) -> str | None:
    pattern = re.compile(re.escape(SITE) + r"vgpu_dra-[^/]+\.dist-info/RECORD$")
    for path, layer, entry in archive_paths(archive):
        if pattern.match(path) and entry.isfile():
            data = layer.extractfile(entry)
            assert data is not None
            return data.read().decode()
    return None


def product_image(tree: Path) -> tuple[Path | None, str]:
    """(the archive of `make image`, "") when there is one built from the sources of the image
    tree `tree`; else (None, why not)."""
    if not ARCHIVE.is_file():
        return None, f"no product image archive at {ARCHIVE} (`make image` writes it)"
    records = sorted((tree / SITE).glob("vgpu_dra-*.dist-info/RECORD"))
    if len(records) != 1:
        return None, f"no vgpu_dra RECORD in the image tree {tree}"
    record = _archive_record(ARCHIVE)
    if record is None:
        return None, f"{ARCHIVE} holds no vgpu_dra wheel: not a vgpu-dra image"
    ours, theirs = _python_hashes(records[0].read_text()), _python_hashes(record)
    if ours != theirs:
        changed = sorted(p for p in set(ours) | set(theirs) if ours.get(p) != theirs.get(p))
        return None, (
            f"{ARCHIVE} was built from other sources than {tree} ({len(changed)} files differ, "
            f"e.g. {changed[:3]}): run `make image` again"
        )
    return ARCHIVE, ""


def node_image(tree: Path, out_dir: Path, archive: Path | None) -> BuiltImage:
    """The image for the node: the product image's archive, or the tree packed as one."""
    if archive is not None:
        name = str(archive_manifest(archive)["RepoTags"][0])
        return BuiltImage(name, archive, "")
    return build_plugin_image(tree, out_dir)


def import_as_default(node: RealNode, image: BuiltImage) -> float:
    """Import `image` into the node's containerd under the chart's default image name; returns
    the seconds the import took."""
    ctr = node.ctr_bin / "ctr"
    t0 = time.monotonic()
    import_images(ctr, node.layout.containerd_socket, [image])
    seconds = time.monotonic() - t0
    if image.name != DEFAULT_IMAGE:
        subprocess.run(
            [str(ctr), "--address", str(node.layout.containerd_socket), "-n", "k8s.io",
             "images", "tag", "--force", image.name, DEFAULT_IMAGE],
            check=True, capture_output=True,
        )  # fmt: skip
    return seconds


# ---------------------------------------------------------------- the install


def runtime_class() -> JSON:
    """The `nvidia` RuntimeClass the NVIDIA toolkit's installation creates; on the bed it maps
    to the node's runc (the simulated driver is mounted by `bed_objects`)."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "runc",
    }


def start_webhook_relay(cluster: Cluster, node: RealNode, timeout: float = 30) -> int:
    """A relay from a free port P of the host's loopback (where the API server calls webhooks)
    to 127.0.0.1:P in the node, where the controller then listens; returns P."""
    ready = node.layout.run_dir / "webhook-relay.ready"
    ready.unlink(missing_ok=True)
    name = f"webhook-relay-{node.node_name}"
    cluster.spawn(
        name,
        [sys.executable, "-m", "vgpu_testbed.realnode.forwarder", "--netns",
         f"/proc/{node.pid1}/ns/net", "--into", "--ready-file", str(ready)],
        cwd=REPO,
    )  # fmt: skip
    port = polling.wait_for(
        "the webhook relay", lambda: ready.is_file() and ready.read_text().strip(), timeout, 0.1
    )
    return int(str(port))


def bed_values(node: RealNode, webhook_port: int) -> JSON:
    """The chart's values on the bed: the defaults but for the node's directories, one
    controller replica and the webhook on the node's loopback (module docstring)."""
    return {
        "kubeletPlugin": {
            "kubeletDir": str(node.paths.root),  # the kubelet's --root-dir
            "cdiRoot": str(node.layout.cdi_dir),  # containerd's CDI dir
            "stateDir": str(node.paths.state_dir),
            "hookDir": str(node.paths.root / "hook"),
            "nvidiaCdiSpecDirs": [str(node.layout.cdi_dir)],
            # Shorter than the defaults (60 s, 300 s) so the tests wait less.
            "resyncSeconds": 5,
            "takeoverTimeoutSeconds": 120,
        },
        "controller": {"replicas": 1, "webhookPort": webhook_port},
        "webhook": {"bindAddress": "127.0.0.1"},
    }


def bed_objects(docs: list[JSON], node: RealNode, webhook_port: int) -> list[JSON]:
    """The rendered objects with what only the bed needs (module docstring)."""
    docs = copy.deepcopy(docs)
    port = node.bed.state.ports["kube-apiserver"]
    for workload in [d for d in docs if d["kind"] in ("DaemonSet", "Deployment")]:
        spec = workload["spec"]["template"]["spec"]
        spec["hostNetwork"] = True
        for one in spec["containers"]:
            one["env"] += [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
            ]
            if workload["kind"] == "Deployment":
                one["env"].append({"name": "VGPU_DRA_WEBHOOK_CERT_IPS", "value": "127.0.0.1"})
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sim = {k: v for k, v in node.gpu_env.items() if k != "LD_LIBRARY_PATH"}
    container["env"] += [{"name": k, "value": v} for k, v in sorted(sim.items())]
    # The simulator's state is written by every NVML user; the library only read.
    mounts = {str(Path(v).parent): (str(Path(v).parent), False) for v in sim.values()}
    mounts[str(fakegpu.library_dir() / "libnvidia-ml.so.1")] = (NVML_IN_CONTAINER, True)
    for index, (host, (inside, read_only)) in enumerate(sorted(mounts.items())):
        name = f"simulated-driver-{index}"
        pod["volumes"].append({"name": name, "hostPath": {"path": host}})
        container["volumeMounts"].append({"name": name, "mountPath": inside, "readOnly": read_only})
    webhooks = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    others = [d for d in docs if not d["kind"].endswith("WebhookConfiguration")]
    return others + bed_configurations(webhooks, webhook_port, None)


def chart_objects(home: Path, node: RealNode, webhook_port: int) -> list[JSON]:
    """The chart rendered by the real helm with `bed_values`, made ready for the bed."""
    docs = chart.render(home, bed_values(node, webhook_port), namespace=NAMESPACE, release=RELEASE)
    return bed_objects(docs, node, webhook_port)


# ---------------------------------------------------------------- what runs


def ready(pod: JSON) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pods(client: KubeClient, labels: str) -> list[JSON]:
    """The release's pods of one component that are not being deleted."""
    found = client.list(kube.path("v1", "pods", namespace=NAMESPACE), label_selector=labels)
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def one_ready(client: KubeClient, labels: str) -> JSON | None:
    """The component's only pod once it is Ready (None while there is none or several)."""
    found = [p for p in pods(client, labels) if ready(p)]
    return found[0] if len(found) == 1 else None


def ca_published(client: KubeClient, docs: list[JSON]) -> bool:
    """Both webhook configurations carry the controller's CA (it published its certificate)."""
    for doc in docs:
        if not doc["kind"].endswith("WebhookConfiguration"):
            continue
        live = client.get(chart.object_path(doc))
        if not all(h["clientConfig"].get("caBundle") for h in live["webhooks"]):
            return False
    return True


def pod_log(node: RealNode, pod: JSON, container: str) -> str:
    meta = pod["metadata"]
    directory = node.layout.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    return "\n".join(p.read_text() for p in sorted((directory / container).glob("*.log")))


def explain(client: KubeClient, node: RealNode) -> str:
    """What the release's pods say: each container's state and the tail of its log (for a
    failure message)."""
    lines = []
    for pod in client.list(kube.path("v1", "pods", namespace=NAMESPACE)):
        statuses = pod.get("status", {})
        for status in statuses.get("initContainerStatuses", []) + statuses.get(
            "containerStatuses", []
        ):
            state = status.get("lastState") or status.get("state")
            lines.append(f"{pod['metadata']['name']}/{status['name']}: {state}")
            lines += pod_log(node, pod, status["name"]).splitlines()[-20:]
    return "\n".join(lines)


def registration_socket(node: RealNode, pod: JSON) -> Path:
    """Where the plugin of `pod` serves its registration socket (named after the pod UID)."""
    from kubelet_plugin.server import SocketPaths

    paths = SocketPaths.for_instance(
        DRIVER,
        plugin_dir=str(node.paths.root / "plugins" / DRIVER),
        registrar_dir=str(node.paths.root / "plugins_registry"),
        instance=pod["metadata"]["uid"],
    )
    return Path(paths.registration)


def _process_start(pid: int) -> float:
    """When process `pid` started, in seconds since the epoch (10 ms resolution)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    boot = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def pids_with(marker: bytes) -> list[int]:
    """Host pids of the processes whose environment holds `marker` (b"NAME=value"): a
    container's, by a variable only its pod spec sets (children inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def plugin_pid(pod: JSON) -> int | None:
    """The host pid of the kubelet plugin process of `pod` (its VGPU_DRA_INSTANCE_ID is the pod
    UID; the launcher execs python, so it is the container's first process)."""
    for pid in pids_with(f"VGPU_DRA_INSTANCE_ID={pod['metadata']['uid']}".encode()):
        try:
            if b"kubelet-plugin" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def plugin_start_seconds(node: RealNode, pod: JSON) -> float:
    """Seconds from the plugin process's start (the container's entry point) until its
    registration socket existed: the interpreter, imports, GPU discovery, the API server's
    probe and both gRPC servers. Call once the pod is Ready."""
    pid = plugin_pid(pod)
    assert pid is not None, f"no kubelet-plugin process of pod {pod['metadata']['name']}"
    return registration_socket(node, pod).stat().st_ctime - _process_start(pid)


def legacy_pod_manifest() -> JSON:
    """deploy/examples/legacy/vgpu-manager.yaml as written."""
    (doc,) = list(yaml.safe_load_all(LEGACY_POD.read_text()))
    return dict(doc)


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 180.0) -> T:
    return polling.wait_for(what, fn, timeout, interval=0.5)
