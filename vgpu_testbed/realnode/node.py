"""A real bed node: containerd, the real kubelet and the kubelet plugin in the node's namespaces.

`start_real_nodes(cluster)` brings every node of a test-bed Cluster to life (the stand-in path is
`vgpu_testbed.standin.node_agents`; this is its real counterpart, with the same `NodeAgents`
interface
for the plugin so tests can kill and restart it). Per node, in order:
1. the holder (`realnode.holder`): PID 1 of the node's PID, mount and network namespaces;
2. its `eth0` on the bed bridge (`realnode.network`), and a forwarder (`realnode.forwarder`)
   that makes the API server reachable on the node's own 127.0.0.1;
3. containerd (private root, state, sockets; CDI dir = the plugin's), the bed's images imported,
   the simulated driver's toolkit-like CDI spec (`realnode.toolkit_cdi`);
4. the kubelet plugin (as in node_agents, but inside the node, with `--nvidia-cdi-spec-dir`);
5. the kubelet (own root dir = the node dir, cert dir, cgroup root, pod log dir), which
   registers the plugin through its plugins registry and runs pods.
Everything is started through `cluster.spawn`, so teardown is the bed's; the holder kills what is
left in the node and removes the node's cgroups. Only files under `<cluster>/nodes/<node>/`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from vgpu_testbed import procs
from vgpu_testbed.cluster import binaries as cluster_binaries
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.fakegpu import simulator as fakegpu
from vgpu_testbed.realnode import images as bed_images
from vgpu_testbed.realnode import pki
from vgpu_testbed.realnode.config import (
    NodeLayout,
    cni_config,
    containerd_config,
    kubelet_config,
    node_ip,
)
from vgpu_testbed.realnode.host import check_host, containerd_bin_dir
from vgpu_testbed.realnode.network import connect_node
from vgpu_testbed.realnode.toolkit_cdi import SPEC_FILE, toolkit_spec
from vgpu_testbed.standin.node_agents import (
    DEFAULT_HOOK_PATH,
    REPO_ROOT,
    NodeAgentError,
    NodeAgents,
)
from vgpu_testbed.torchapp import find_torch

BED_NETWORK = "bed-network"
START_TIMEOUT = 60.0


def cgroup_root_of(cluster_root: Path, node: str) -> str:
    """`/vgpu-dra-bed-<8 hex of the cluster dir>/<node>`: unique per cluster, easy to find."""
    digest = hashlib.sha256(str(cluster_root.resolve()).encode()).hexdigest()[:8]
    return f"/vgpu-dra-bed-{digest}/{node}"


def _wait_file(path: Path, what: str, alive: Callable[[], bool], timeout: float) -> None:
    """Wait until `path` exists (a ready file or a socket) while `what` is alive."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if not alive():
            raise NodeAgentError(f"{what} exited before it was ready (see its log)")
        if time.monotonic() > deadline:
            raise NodeAgentError(f"{what}: not ready after {timeout:.0f}s (see its log)")
        time.sleep(0.05)


class RealNode(NodeAgents):
    """The namespaces, containerd, kubelet and kubelet plugin of one bed node."""

    def __init__(self, cluster: Cluster, node_name: str, index: int, **kwargs: object) -> None:
        super().__init__(cluster, node_name, **kwargs)  # type: ignore[arg-type]
        self.bed = cluster
        self.index = index
        self.layout = NodeLayout(self.paths.root)
        self.ip = node_ip(index)
        self.cgroup_root = cgroup_root_of(cluster.root, node_name)
        self.pid1 = 0
        self.metrics_port = 0  # the host-side mirror of the plugin's /metrics port
        self.start_seconds = 0.0  # how long start() took (namespaces to a Ready kubelet + plugin)
        self.ctr_bin = containerd_bin_dir()

    # ----- process names and how to enter the node ---------------------------------------

    def _name(self, what: str) -> str:
        return f"{what}-{self.node_name}"

    @property
    def holder_process(self) -> str:
        return self._name("node")

    @property
    def containerd_process(self) -> str:
        return self._name("containerd")

    @property
    def kubelet_process(self) -> str:
        return self._name("kubelet")

    @property
    def forwarder_process(self) -> str:
        return self._name("apiserver-forwarder")

    @property
    def metrics_forwarder_process(self) -> str:
        return self._name("metrics-forwarder")

    def enter(self, argv: Sequence[str]) -> list[str]:
        """argv run inside the node (its PID, mount and network namespaces)."""
        return [
            "nsenter",
            f"--target={self.pid1}",
            "--mount",
            "--net",
            "--pid",
            "--",
            *argv,
        ]

    def metrics_address(self) -> str:
        """The same port on the node's loopback as the host-side mirror listens on, so the URL
        the plugin logs works from the host (`vgpu-dra status`, tests) as on a stand-in node."""
        if not self.metrics_port:
            raise NodeAgentError(f"{self.node_name}: the metrics forwarder is not running")
        return f"127.0.0.1:{self.metrics_port}"

    def plugin_argv(self) -> list[str]:
        argv = super().plugin_argv()
        argv += ["--nvidia-cdi-spec-dir", str(self.layout.cdi_dir)]
        return self.enter(argv)

    # ----- start ---------------------------------------------------------------------------

    def start(self, *, timeout: float = START_TIMEOUT) -> None:
        self.paths.make()
        # A node started again in the same directory (the shared test cluster starts node-1
        # for several modules) runs no pod yet: addresses leased to pods of its last run, which
        # died with its namespaces without a CNI DEL, are free. Else the /24 runs out.
        shutil.rmtree(self.layout.cni_ipam_dir, ignore_errors=True)
        self.layout.make()
        self._start_holder(timeout)
        self._start_forwarder(timeout)
        self._start_metrics_forwarder(timeout)
        self._start_containerd(timeout)
        self.prepare_gpus()
        self._write_toolkit_spec()
        # The kubelet first, as on a real node: at start-up it deletes every ResourceSlice of its
        # node (no driver has registered yet), so a plugin started earlier would see its slices
        # vanish until its next resync.
        self._start_kubelet()
        self.wait_kubelet_ready(timeout)
        self.start_plugin(timeout=timeout)

    def _alive(self, name: str) -> Callable[[], bool]:
        def check() -> bool:
            record = self._record(name)
            return record is not None and procs.is_alive(record)

        return check

    def _start_holder(self, timeout: float) -> None:
        from vgpu_testbed.realnode.cgroups import ensure_cgroup

        ensure_cgroup(self.cgroup_root)
        run = self.layout.run_dir
        for stale in ("holder.ready", "holder.pid", "forwarder.ready", "metrics-forwarder.ready"):
            (run / stale).unlink(missing_ok=True)
        self.cluster.spawn(
            self.holder_process,
            [
                _python(),
                "-m",
                "vgpu_testbed.realnode.holder",
                "--node-dir",
                str(self.paths.root),
                "--cgroup-root",
                self.cgroup_root,
                "--ready-file",
                str(run / "holder.ready"),
                "--pid-file",
                str(run / "holder.pid"),
            ],
            cwd=REPO_ROOT,
        )
        alive = self._alive(self.holder_process)
        _wait_file(run / "holder.ready", self.holder_process, alive, timeout)
        self.pid1 = int((run / "holder.pid").read_text())
        bed = self._record(BED_NETWORK)
        if bed is None:
            raise NodeAgentError("the bed network is not running (start_real_nodes starts it)")
        connect_node(bed.pid, self.pid1, self.index, self.ip)

    def _start_forwarder(self, timeout: float) -> None:
        port = self.bed.state.ports["kube-apiserver"]
        ready = self.layout.run_dir / "forwarder.ready"
        self.cluster.spawn(
            self.forwarder_process,
            [
                _python(),
                "-m",
                "vgpu_testbed.realnode.forwarder",
                "--netns",
                f"/proc/{self.pid1}/ns/net",
                "--port",
                str(port),
                "--ready-file",
                str(ready),
            ],
            cwd=REPO_ROOT,
        )
        _wait_file(ready, self.forwarder_process, self._alive(self.forwarder_process), timeout)

    def _start_metrics_forwarder(self, timeout: float) -> None:
        ready = self.layout.run_dir / "metrics-forwarder.ready"
        self.cluster.spawn(
            self.metrics_forwarder_process,
            [
                _python(),
                "-m",
                "vgpu_testbed.realnode.forwarder",
                "--netns",
                f"/proc/{self.pid1}/ns/net",
                "--into",
                "--ready-file",
                str(ready),
            ],
            cwd=REPO_ROOT,
        )
        alive = self._alive(self.metrics_forwarder_process)
        _wait_file(ready, self.metrics_forwarder_process, alive, timeout)
        self.metrics_port = int(ready.read_text())

    def _start_containerd(self, timeout: float) -> None:
        runc = shutil.which("runc")
        if runc is None:
            raise NodeAgentError("runc is not installed (apt-get install runc)")
        self.layout.containerd_config.write_text(containerd_config(self.layout, Path(runc)))
        (self.layout.cni_conf_dir / "10-bed.conflist").write_text(
            cni_config(self.layout, self.index)
        )
        env = {
            "PATH": f"{self.ctr_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "TMPDIR": str(self.layout.containerd_dir),
        }
        self.cluster.spawn(
            self.containerd_process,
            self.enter(
                [str(self.ctr_bin / "containerd"), "--config", str(self.layout.containerd_config)]
            ),
            env=env,
        )
        _wait_file(
            self.layout.containerd_socket,
            self.containerd_process,
            self._alive(self.containerd_process),
            timeout,
        )
        built = ensure_images(self.cluster.root)
        bed_images.import_images(self.ctr_bin / "ctr", self.layout.containerd_socket, built)

    def _write_toolkit_spec(self) -> None:
        profile = fakegpu.load_profile(self.profile)
        spec = toolkit_spec(
            profile.gpus,
            library_dir=fakegpu.library_dir(),
            state_file=self.paths.gpu_state,
            profile_file=fakegpu.profile_file_for(self.paths.gpu_state),
        )
        (self.layout.cdi_dir / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")

    def _start_kubelet(self) -> None:
        bins = cluster_binaries.default_bin_dir()
        kubelet = bins / "kubelet"
        (self.paths.root / "tmp").mkdir(mode=0o700, exist_ok=True)
        serving = pki.kubelet_serving(
            self.bed.layout.pki, self.node_name, self.ip, self.layout.cert_dir
        )
        self.layout.kubelet_config.write_text(
            kubelet_config(
                self.layout,
                cgroup_root=self.cgroup_root,
                ip=self.ip,
                client_ca=self.cluster_ca(),
                serving=serving,
            )
        )
        self.cluster.spawn(
            self.kubelet_process,
            self.enter(
                [
                    str(kubelet),
                    "--config",
                    str(self.layout.kubelet_config),
                    "--kubeconfig",
                    str(self.node_kubeconfig),
                    "--root-dir",
                    str(self.paths.root),
                    "--cert-dir",
                    str(self.layout.cert_dir),
                    "--node-ip",
                    self.ip,
                    "--hostname-override",
                    self.node_name,
                    "--v=2",
                ]
            ),
            env={
                "PATH": f"{self.ctr_bin}:/usr/sbin:/usr/bin:/sbin:/bin",
                "TMPDIR": str(self.paths.root / "tmp"),
            },
        )

    def kubelet_ready(self) -> bool:
        """The Node's Ready condition comes from this kubelet (reason KubeletReady)."""
        from dra_driver import kube

        client = kube.KubeClient.from_kubeconfig(str(self.bed.kubeconfig))
        try:
            node = client.get(kube.path("v1", "nodes", self.node_name))
        finally:
            client.close()
        return any(
            c.get("type") == "Ready"
            and c.get("status") == "True"
            and c.get("reason") == "KubeletReady"
            for c in node.get("status", {}).get("conditions", [])
        )

    def wait_kubelet_ready(self, timeout: float) -> None:
        alive = self._alive(self.kubelet_process)
        deadline = time.monotonic() + timeout
        while not self.kubelet_ready():
            if not alive():
                raise NodeAgentError(f"{self.kubelet_process} exited (see its log)")
            if time.monotonic() > deadline:
                raise NodeAgentError(f"{self.node_name}: kubelet not Ready after {timeout:.0f}s")
            time.sleep(0.2)

    def cluster_ca(self) -> Path:
        return self.bed.ca_cert

    # ----- stop ----------------------------------------------------------------------------

    def kill_plugin(self) -> None:
        """SIGKILL the plugin: its whole process group (nsenter and the plugin inside)."""
        record = self._record(self.plugin_process)
        if record is None:
            raise NodeAgentError(f"{self.plugin_process} is not running")
        os.killpg(record.pid, signal.SIGKILL)
        self.cluster.stop_process(self.plugin_process)

    def drain(self, timeout: float = 60.0) -> None:
        """Take the node's pods off it before it stops, as an operator drains a node: cordon
        it, delete every pod bound to it (grace 0) and wait until the kubelet unprepared their
        claims (the plugin's checkpoint holds none). A node stopped with prepared claims keeps
        them in its checkpoint; the next node started in that directory (the shared test
        cluster starts node-1 for several modules) would count them until the kubelet's
        reconcile unprepares them, up to a minute later. `restore_node_status` uncordons."""
        from dra_driver import kube
        from kubelet_plugin.checkpoint import CheckpointJournal

        if not self._running(self.kubelet_process):
            return
        client = kube.KubeClient.from_kubeconfig(str(self.bed.kubeconfig))
        journal = CheckpointJournal(str(self.paths.checkpoint.parent))
        try:
            client.merge_patch(
                kube.path("v1", "nodes", self.node_name), {"spec": {"unschedulable": True}}
            )
            deadline = time.monotonic() + timeout
            while True:
                pods = client.list(
                    kube.path("v1", "pods"), field_selector=f"spec.nodeName={self.node_name}"
                )
                for pod in pods:
                    meta = pod["metadata"]
                    with contextlib.suppress(kube.NotFound):  # gone meanwhile: fine
                        client.request(
                            "DELETE",
                            kube.path("v1", "pods", meta["name"], namespace=meta["namespace"]),
                            query={"gracePeriodSeconds": 0},
                        )
                # A killed plugin unprepares nothing: then only the pods can be waited for.
                plugin_up = self._running(self.plugin_process)
                if not pods and not (plugin_up and journal.load()):
                    return
                if time.monotonic() > deadline:
                    raise NodeAgentError(
                        f"{self.node_name}: {len(journal.load())} claims still prepared "
                        f"{timeout:.0f}s after its pods were deleted (see the kubelet's log)"
                    )
                time.sleep(0.2)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the node: kubelet, plugin, containerd, then the holder (which kills the rest);
        then give the Node object back its bed status."""
        kubelet_ran = self._running(self.kubelet_process)
        for name in (
            self.kubelet_process,
            self.plugin_process,
            self.containerd_process,
            self.metrics_forwarder_process,
            self.forwarder_process,
            self.holder_process,
        ):
            if self._running(name):
                self.cluster.stop_process(name)
        self.forget_mig_state()
        if kubelet_ran:
            self.restore_node_status()

    def restore_node_status(self) -> None:
        """The Node's status as the bed created it (32 CPUs, 256Gi, Ready from the bed): the
        kubelet replaced it with this machine's figures and its own conditions, and a cluster
        that outlives the node (the shared test cluster) must look as the bed made it to the
        next user, stand-in or real."""
        from dra_driver import kube
        from vgpu_testbed.cluster.nodes import NodeSpec, node_manifest

        client = kube.KubeClient.from_kubeconfig(str(self.bed.kubeconfig))
        try:
            status_path = kube.path("v1", "nodes", self.node_name, subresource="status")
            node = client.get(status_path)
            node["status"] = node_manifest(NodeSpec(self.node_name, self.profile))["status"]
            client.replace(status_path, node)
            node_path = kube.path("v1", "nodes", self.node_name)
            client.merge_patch(node_path, {"spec": {"unschedulable": None}})
        finally:
            client.close()


def _python() -> str:
    import sys

    return sys.executable


_IMAGES_INDEX = "images.json"


def _app_libraries() -> set[Path]:
    """What an application mounted from the host needs in the image too: the system libraries
    of the torch environment, when installed. A broken environment must not stop the nodes (its
    own tests then fail, on the loader's error): no libraries, and a warning."""
    import subprocess
    import warnings

    try:
        torch = find_torch()
        return torch.system_libraries() if torch is not None else set()
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        message = f"the torch environment is unusable, its libraries left out: {err}"
        warnings.warn(message, stacklevel=2)
        return set()


def ensure_images(cluster_root: Path) -> list[bed_images.BuiltImage]:
    """The bed's image archives under `<cluster>/images/`, built once per cluster."""
    images_dir = cluster_root / "images"
    index = images_dir / _IMAGES_INDEX
    if index.is_file():
        data = json.loads(index.read_text())
        return [bed_images.BuiltImage(d["name"], Path(d["archive"]), d["digest"]) for d in data]
    lib = fakegpu.library_dir()
    # What gets injected at run time must find its libc in the image.
    injected = [lib / fakegpu.NVML_SONAME, lib / fakegpu.CUDA_SONAME, DEFAULT_HOOK_PATH]
    built = bed_images.build_images(images_dir, injected, _app_libraries())
    entries = [{"name": b.name, "archive": str(b.archive), "digest": b.digest} for b in built]
    index.write_text(json.dumps(entries, indent=1) + "\n")
    return built


def start_bed_network(cluster: Cluster, timeout: float = START_TIMEOUT) -> None:
    """The bed bridge's namespace holder (once per cluster)."""
    if any(p.name == BED_NETWORK for p in cluster.processes):
        return
    ready = cluster.root / "nodes" / "bed-network.ready"
    ready.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    ready.unlink(missing_ok=True)
    argv = [_python(), "-m", "vgpu_testbed.realnode.network", str(ready)]
    argv.append(str(pki.egress_socket(cluster.root)))
    record = cluster.spawn(BED_NETWORK, argv, cwd=REPO_ROOT)
    _wait_file(ready, BED_NETWORK, lambda: procs.is_alive(record), timeout)


def start_nodes(
    cluster: Cluster, nodes: Iterable[str] | None = None, *, runtime: str, **kwargs: object
) -> dict[str, NodeAgents]:
    """Start every node (or those named) of the chosen kind: `real` (`start_real_nodes`) or
    `standin` (`vgpu_testbed.standin.node_agents.start_node_agents`). Both kinds have the same
    surface (paths, gpu_env, metrics_url, start_plugin/kill_plugin, enter, drain, stop), so a
    test that does not drive the DRA gRPC by hand runs unchanged on either."""
    if runtime == "real":
        return dict(start_real_nodes(cluster, nodes, **kwargs))
    if runtime == "standin":
        from vgpu_testbed.standin.node_agents import start_node_agents

        return start_node_agents(cluster, nodes, **kwargs)
    raise ValueError(f"unknown node runtime {runtime!r} (real or standin)")


def start_real_nodes(
    cluster: Cluster, nodes: Iterable[str] | None = None, **kwargs: object
) -> dict[str, RealNode]:
    """Start every node (or those named) for real; on failure stop what was started."""
    problems = check_host()
    if problems:
        raise NodeAgentError("real nodes are not possible on this host: " + "; ".join(problems))
    names = list(nodes) if nodes is not None else [n.name for n in cluster.nodes]
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    start_bed_network(cluster)
    ensure_images(cluster.root)
    started: dict[str, RealNode] = {}
    try:
        for name in names:
            node = RealNode(cluster, name, order[name], **kwargs)
            started[name] = node
            t0 = time.monotonic()
            node.start()
            node.start_seconds = time.monotonic() - t0
    except BaseException:
        for node in started.values():
            node.stop()
        raise
    return started
