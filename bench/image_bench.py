"""The product image built for real: what it costs on a fresh machine, how big it is, and how fast
the kubelet plugin starts from it on a real node.

Steps, each timed:
1. `engine`: the engine `make image` picks (deploy/image/engine.sh) and mmdebstrap; when either
   is missing, `apt-get install buildah mmdebstrap` (timed: the fresh-machine cost; otherwise
   recorded as already installed).
2. `base`: a base from Debian packages (deploy/image/debian-base.sh, REBUILD=1: mmdebstrap
   downloads and unpacks every package again), under a name of the bench's own.
3. `build`: the Dockerfile on that base with `--no-cache` (deploy/image/build-image.sh): every
   step runs, the build stage's Debian packages and every wheel are downloaded, as on a fresh
   machine; then the archive a registry-less node loads.
4. Sizes: the image as the engine counts it (uncompressed), its archive, and the archive's layers
   gzip-compressed (level 6, what a registry stores and a node pulls).
5. On a real bed node (one simulated a10-pcie; tests/e2e/deploy/bed_chart.py installs the chart
   as the install e2e does): the archive's import into the node's containerd, then for the
   product image and, for comparison, the image tree packed with the bed's interpreter (what
   CI ran before it built the image): `RESTARTS` fresh plugin pods each (the pod deleted, the
   DaemonSet makes the next). Per pod: `process_to_sockets` (the plugin process's start, from
   /proc, to its registration socket: interpreter, imports, GPU discovery, the API server's
   probe, both gRPC servers) and `delete_to_sockets` (the old pod's deletion to the new pod's
   socket: the kubelet's sandbox, the init container, the process). Resident memory of the
   plugin and of the controller (every process of its container).

Needs root, network to the Debian mirror and the package index (the build), the control plane
and node binaries (`make controlplane`) and the image tree (`make image-tree`). Writes
bench/results/image.json.
"""

from __future__ import annotations

import gzip
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import machine_at_start, utc_stamp, write_results
from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.e2e.deploy import bed_chart
from tests.fixtures.image_tree import built_tree
from vgpu_testbed.cluster.chart import collection_path
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.realnode.images import import_images
from vgpu_testbed.realnode.node import RealNode, start_real_nodes
from vgpu_testbed.realnode.plugin_image import PLUGIN_IMAGE

RESULTS = Path(__file__).parent / "results" / "image.json"
ROOT = Path(__file__).resolve().parents[1]
IMAGE_DIR = ROOT / "deploy" / "image"
IMAGE = "vgpu-dra-bench:latest"
RESTARTS = 3


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run `argv` (cwd: the repository); returns (seconds, its stdout). Fails with its output."""
    t0 = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.monotonic() - t0, done.stdout


def tools() -> dict[str, Any]:
    missing = [p for p in ("buildah", "mmdebstrap") if shutil.which(p) is None]
    record: dict[str, Any] = {"installed_by_bench": bool(missing)}
    if missing:
        seconds, _ = run(["apt-get", "install", "-y", "-q", "buildah", "mmdebstrap"],
                         {"DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip
        record["apt_install_s"] = round(seconds, 1)
    _, engine = run(["sh", str(IMAGE_DIR / "engine.sh")])
    record["engine"] = engine.strip().splitlines()[-1]
    _, version = run([record["engine"], "--version"])
    record["engine_version"] = version.strip().splitlines()[0]
    return record


def engine_size(engine: str, image: str) -> str:
    if engine == "buildah":
        return run(["buildah", "images", "--format", "{{.Size}}", image])[1].strip()
    return run([engine, "image", "inspect", "--format", "{{.Size}}", image])[1].strip() + " B"


def gzip_layers(archive: Path) -> int:
    """Bytes of the archive's layers, each gzip-compressed at level 6."""
    total = 0
    with tarfile.open(archive) as outer:
        for name in bed_chart.archive_manifest(archive)["Layers"]:
            blob = outer.extractfile(name)
            assert blob is not None
            sink = _Counter()
            with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=6, mtime=0) as packed:
                shutil.copyfileobj(blob, packed, 1 << 20)
            total += sink.count
    return total


class _Counter:
    """A write-only file that only counts what is written to it."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def build(engine: str, work: Path) -> dict[str, Any]:
    suite = run(["sh", "-c", ". /etc/os-release && echo $VERSION_CODENAME"])[1].strip()
    base = f"vgpu-dra-base-bench:{suite}"
    base_s, _ = run(["sh", str(IMAGE_DIR / "debian-base.sh"), engine, base], {"REBUILD": "1"})
    archive = work / "vgpu-dra.tar"
    # No cache, and (buildah, podman) no intermediate images kept as the next build's cache.
    flags = "--no-cache" if engine == "docker" else "--no-cache --layers=false"
    build_s, log = run(
        ["sh", str(IMAGE_DIR / "build-image.sh"), IMAGE, str(archive), base],
        {"IMAGE_BUILD_FLAGS": flags},
    )
    print(log.strip().splitlines()[-1])
    t0 = time.monotonic()
    compressed = gzip_layers(archive)
    return {
        "archive": archive,
        "record": {
            "base": base,
            "base_s": round(base_s, 1),
            "build_and_archive_s": round(build_s, 1),
            "fresh_machine_total_s": round(base_s + build_s, 1),
            "base_size": engine_size(engine, base),
            "image_size": engine_size(engine, IMAGE),
            "archive_bytes": archive.stat().st_size,
            "layers_gzip_bytes": compressed,
            "gzip_s": round(time.monotonic() - t0, 1),
        },
    }


def rss_bytes(marker: bytes) -> int:
    """Resident memory of every process whose environment holds `marker` (NAME=value)."""
    total = 0
    for pid in bed_chart.pids_with(marker):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")), 0)
        total += int(kib) * 1024
    return total


def next_plugin(client: KubeClient, node: RealNode, old_uid: str) -> tuple[dict[str, Any], float]:
    """The plugin pod after `old_uid`, once Ready; and when its registration socket appeared."""
    pod = bed_chart.wait_for(
        "the next plugin pod to be Ready",
        lambda: next(
            (
                p
                for p in bed_chart.pods(client, bed_chart.PLUGIN_LABELS)
                if p["metadata"]["uid"] != old_uid and bed_chart.ready(p)
            ),
            None,
        ),
    )
    return pod, bed_chart.registration_socket(node, pod).stat().st_ctime


def starts(client: KubeClient, node: RealNode, first: dict[str, Any]) -> dict[str, Any]:
    """RESTARTS fresh plugin pods after `first`: their start figures."""
    samples: list[dict[str, float]] = []
    pod = first
    for _ in range(RESTARTS):
        deleted = time.time()
        client.delete(kube.path("v1", "pods", pod["metadata"]["name"], namespace="vgpu-dra"))
        pod, socket_at = next_plugin(client, node, pod["metadata"]["uid"])
        samples.append(
            {
                "process_to_sockets_s": round(bed_chart.plugin_start_seconds(node, pod), 2),
                "delete_to_sockets_s": round(socket_at - deleted, 2),
            }
        )
        bed_chart.wait_for("the old plugin pod to go", partial(_only, client, pod))
    uid = pod["metadata"]["uid"]
    summary = {
        key: round(statistics.median(s[key] for s in samples), 2)
        for key in ("process_to_sockets_s", "delete_to_sockets_s")
    }
    return {
        "samples": samples,
        "median": summary,
        "plugin_rss_bytes": rss_bytes(f"VGPU_DRA_INSTANCE_ID={uid}".encode()),
        "last_pod": pod,
    }


def _only(client: KubeClient, pod: dict[str, Any]) -> bool:
    found = bed_chart.pods(client, bed_chart.PLUGIN_LABELS)
    return [p["metadata"]["uid"] for p in found] == [pod["metadata"]["uid"]]


def on_a_node(archive: Path, work: Path) -> dict[str, Any]:
    tree = built_tree()
    (work / "cluster").mkdir()
    cluster = Cluster.start(work / "cluster", ["a10-pcie"], die_with_parent=True)
    nodes: dict[str, RealNode] = {}
    try:
        nodes = start_real_nodes(cluster)
        node = nodes[bed_chart.NODE_NAME]
        cluster.stop_process(node.plugin_process)
        product = bed_chart.node_image(tree, work / "images", archive)
        import_s = bed_chart.import_as_default(node, product)
        packed = bed_chart.node_image(tree, work / "images", None)  # under its own name
        import_images(node.ctr_bin / "ctr", node.layout.containerd_socket, [packed])
        client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        try:
            return {"import_s": round(import_s, 1), **_install_and_start(cluster, node, client)}
        finally:
            client.close()
    finally:
        for one in nodes.values():
            one.stop()
        cluster.stop()


def _install_and_start(cluster: Cluster, node: RealNode, client: KubeClient) -> dict[str, Any]:
    client.create(kube.path("v1", "namespaces"), {"metadata": {"name": bed_chart.NAMESPACE}})
    client.create(kube.path("node.k8s.io/v1", "runtimeclasses"), bed_chart.runtime_class())
    for found in client.list(kube.path(RESOURCE_API, "resourceslices")):
        client.delete(kube.path(RESOURCE_API, "resourceslices", found["metadata"]["name"]))
    port = bed_chart.start_webhook_relay(cluster, node)
    (cluster.root / "helm").mkdir()
    objects = bed_chart.chart_objects(cluster.root / "helm", node, port)
    t0 = time.monotonic()
    for obj in objects:
        client.create(collection_path(obj, bed_chart.NAMESPACE), obj)
    first = bed_chart.wait_for(
        "the plugin pod", lambda: bed_chart.one_ready(client, bed_chart.PLUGIN_LABELS)
    )
    plugin_ready_s = time.monotonic() - t0
    bed_chart.wait_for(
        "the controller", lambda: bed_chart.one_ready(client, bed_chart.CONTROLLER_LABELS)
    )
    bed_chart.wait_for("the webhook CA", lambda: bed_chart.ca_published(client, objects))
    everything_s = time.monotonic() - t0
    controller_rss = rss_bytes(b"VGPU_DRA_WEBHOOK_SERVICE=bed-vgpu-dra-controller")
    result: dict[str, Any] = {
        "install_to_plugin_ready_s": round(plugin_ready_s, 1),
        "install_to_every_part_running_s": round(everything_s, 1),
        "first_process_to_sockets_s": round(bed_chart.plugin_start_seconds(node, first), 2),
        "controller_rss_bytes": controller_rss,
    }
    product = starts(client, node, first)
    # The packed image tree: the DaemonSet's image switched (a rollout), then the same restarts.
    ds = kube.path(
        "apps/v1", "daemonsets", f"{bed_chart.RELEASE}-vgpu-dra-kubelet-plugin",
        namespace=bed_chart.NAMESPACE,
    )  # fmt: skip
    template = client.get(ds)["spec"]["template"]
    for key in ("initContainers", "containers"):
        for container in template["spec"][key]:
            container["image"] = PLUGIN_IMAGE
            container["imagePullPolicy"] = "Never"
    client.merge_patch(ds, {"spec": {"template": template}})
    old = product.pop("last_pod")
    rolled, _ = next_plugin(client, node, old["metadata"]["uid"])
    bed_chart.wait_for("the rollout", lambda: _only(client, rolled))
    tree = starts(client, node, rolled)
    tree.pop("last_pod")
    result["product_image"] = product
    result["packed_tree"] = tree
    return result


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench image: needs root (mmdebstrap, the engine, real nodes)")
    document: dict[str, Any] = {"bench": "image", "taken": utc_stamp(), **machine_at_start()}
    document["tools"] = tools()
    with tempfile.TemporaryDirectory(prefix="vgpu-dra-image-bench-") as tmp:
        work = Path(tmp)
        built = build(document["tools"]["engine"], work)
        document["build"] = built["record"]
        document["node"] = on_a_node(built["archive"], work)
    engine = document["tools"]["engine"]
    for image in (IMAGE, document["build"]["base"]):
        subprocess.run([engine, "rmi", image], capture_output=True, check=False)
    document["load_average_at_end"] = os.getloadavg()[0]
    write_results(RESULTS, document)


if __name__ == "__main__":
    main()
