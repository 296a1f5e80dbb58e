"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, started in one directory and torn down without leaving a process or a
listening port behind.

Who uses it: the e2e test fixture (`tests/fixtures/cluster.py`), `vgpu-dra dev-cluster` and
`vgpu-dra demo`. Later parts start per-node processes (kubelet plugin, kubelet stand-in) with
`Cluster.spawn`, so they are stopped with the cluster.

The directory holds everything: `pki/` (CA, serving cert, service-account keys, token file),
`etcd/`, `logs/<component>.log`, `kubeconfig` (admin), `kubeconfigs/` (scheduler,
controller-manager, one per node), `nodes/<node>/` (files of per-node agents started later) and
`state.json` (see `state`). The pieces, all in this package: `flags` (command lines, gates,
ports), `identities` (tokens, kubeconfigs), `nodes` (Node objects), `boot` (credentials on disk,
Node creation), `directory` (claiming and clearing the directory), `status` and `health`
(probes), `binaries` (where the binaries are), `certs` (the PKI); this module sequences them.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from vgpu_testbed import procs
from vgpu_testbed.cluster import boot as cluster_boot
from vgpu_testbed.cluster import certs, webhook_client
from vgpu_testbed.cluster import flags as cluster_flags
from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.cluster import state as cluster_state
from vgpu_testbed.cluster.binaries import (
    BinariesMissingError,
    default_bin_dir,
    find_binaries,
    k8s_version,
)
from vgpu_testbed.cluster.directory import ClusterBusyError, prepare_dir, remove_owned
from vgpu_testbed.cluster.flags import FEATURE_GATES, Layout, Ports
from vgpu_testbed.cluster.health import wait_for
from vgpu_testbed.cluster.state import ClusterState, NodeRecord
from vgpu_testbed.cluster.status import (
    ClusterStatus,
    ComponentStatus,
    NodeStatus,
    component_status,
    node_status,
    probe,
)
from vgpu_testbed.procs import ProcessRecord
from vgpu_testbed.realnode import pki as realnode_pki

# Components in start order; stopped in reverse (extra per-node processes first).
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")

__all__ = [
    "BinariesMissingError",
    "Cluster",
    "ClusterBusyError",
    "ClusterStatus",
    "ComponentStatus",
    "NodeStatus",
    "default_bin_dir",
    "find_binaries",
    "k8s_version",
    "running_cluster",
]


class Cluster:
    """A running (or stopped) control plane in one directory. Use `start` or `attach`."""

    def __init__(
        self,
        layout: Layout,
        state: ClusterState,
        *,
        die_with_parent: bool = False,
        popens: dict[int, subprocess.Popen[bytes]] | None = None,
    ) -> None:
        self.layout = layout
        self.state = state
        self._die_with_parent = die_with_parent
        self._popens: dict[int, subprocess.Popen[bytes]] = popens or {}
        self._tokens: dict[str, str] = {}

    # ----- construction -------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        root: Path,
        profiles: Sequence[str] = cluster_nodes.DEFAULT_PROFILES,
        *,
        bin_dir: Path | None = None,
        apiserver_port: int | None = None,
        die_with_parent: bool = False,
        timeout: float = 120.0,
        gates: Mapping[str, bool] = FEATURE_GATES,
        progress: Callable[[str], None] | None = None,
        client_qps: int | None = None,
        client_burst: int | None = None,
    ) -> Cluster:
        """Start everything and wait until it is ready; on any failure stop what started.

        `client_qps`/`client_burst`: kube-scheduler's and kube-controller-manager's
        `--kube-api-qps`/`--kube-api-burst` (both components get the same values); None keeps
        their stock limits (50/100 and 20/30). `client_qps` alone sets the burst to the same.

        `die_with_parent`: the kernel kills the components when this process dies (test
        sessions). Off for `dev-cluster up`, whose components must outlive the command.
        `progress`: optional callable(str) for human-readable steps.
        """
        say = progress or (lambda _msg: None)
        binaries = find_binaries(bin_dir)
        specs = cluster_nodes.node_specs(list(profiles))
        layout = Layout(root.resolve())
        ports = cluster_flags.allocate_ports(apiserver_port)
        prepare_dir(layout)
        state = ClusterState(k8s_version=k8s_version(), root=str(layout.root))
        state.ports = ports.all()
        state.started_at = time.time()
        limits = cluster_flags.ClientLimits.of(client_qps, client_burst)
        state.client_qps, state.client_burst = limits.qps, limits.burst
        cluster = cls(layout, state, die_with_parent=die_with_parent)
        try:
            cluster._boot(
                binaries, ports, specs, gates=gates, limits=limits, timeout=timeout, say=say
            )
        except BaseException:
            cluster.stop(keep_logs=True)
            raise
        return cluster

    @classmethod
    def attach(cls, root: Path) -> Cluster:
        """The cluster recorded in `root/state.json` (StateError if there is none)."""
        layout = Layout(root.resolve())
        return cls(layout, cluster_state.load(layout.state_file))

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----- accessors ----------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def kubeconfig(self) -> Path:
        return Path(self.state.kubeconfig)

    @property
    def server(self) -> str:
        return self.state.server

    @property
    def ca_cert(self) -> Path:
        return Path(self.state.ca_cert)

    @property
    def nodes(self) -> list[NodeRecord]:
        return list(self.state.nodes)

    @property
    def processes(self) -> list[ProcessRecord]:
        return list(self.state.processes)

    def node_kubeconfig(self, node: str) -> Path:
        for rec in self.state.nodes:
            if rec.name == node:
                return Path(rec.kubeconfig)
        raise KeyError(f"no node {node!r} in this cluster")

    def admin_token(self) -> str:
        """The admin bearer token, read back from the admin kubeconfig."""
        if "admin" not in self._tokens:
            import yaml

            doc = yaml.safe_load(self.kubeconfig.read_text())
            self._tokens["admin"] = str(doc["users"][0]["user"]["token"])
        return self._tokens["admin"]

    def api_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` for the admin identity."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    # ----- extra processes ----------------------------------------------------------------

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
        port: int | None = None,
    ) -> ProcessRecord:
        """Start a process that belongs to the cluster: it is recorded in state.json and
        stopped (its whole process group) before the control plane on teardown.

        `name` must be unique in this cluster (e.g. `kubelet-plugin-node-1`); the log goes to
        `logs/<name>.log` unless `log_path` says otherwise.
        """
        if not name or "/" in name:
            raise ValueError(f"process name {name!r} must be non-empty and contain no '/'")
        if any(p.name == name for p in self.state.processes):
            raise ValueError(f"a process named {name!r} already exists in this cluster")
        record, popen = procs.spawn(
            name,
            argv,
            log_path=log_path or self.layout.log(name),
            env=env,
            cwd=cwd,
            port=port,
            die_with_parent=self._die_with_parent,
        )
        self._popens[record.pid] = popen
        self.state.processes.append(record)
        self._save()
        return record

    def stop_process(self, name: str) -> bool:
        """Stop one extra process by name (True if it was running)."""
        record = next((p for p in self.state.processes if p.name == name), None)
        if record is None:
            raise KeyError(f"no process named {name!r}")
        was_alive = procs.is_alive(record)
        procs.stop_all([record], popens=self._popens)
        self.state.processes.remove(record)
        self._save()
        return was_alive

    # ----- status and teardown ------------------------------------------------------------

    def status(self) -> ClusterStatus:
        """Probe every recorded process; read the Nodes back while the apiserver answers."""
        components = [
            component_status(
                p, server=self.server, ca_cert=self.ca_cert, admin_token=self.admin_token()
            )
            for p in self.state.processes
        ]
        nodes = [NodeStatus(n.name, n.profile, False, False) for n in self.state.nodes]
        if any(c.name == "kube-apiserver" and c.healthy for c in components):
            api_client = self.api_client()
            try:
                nodes = node_status(api_client, self.state.nodes)
            finally:
                api_client.close()
        return ClusterStatus(self.root, self.server, components, nodes)

    def stop(self, *, keep_logs: bool = False) -> list[ProcessRecord]:
        """Stop every process (extras first, then the control plane in reverse start order)
        and remove the directory's contents (all but logs/ when `keep_logs`).

        Returns processes that could not be stopped (empty in practice); the state file is
        kept in that case so `down` can be retried.
        """
        stages = [
            [r for r in self.state.processes if r.name not in CONTROL_PLANE],
            [r for r in self.state.processes if r.name in CONTROL_PLANE[2:]],
            [r for r in self.state.processes if r.name == "kube-apiserver"],
            [r for r in self.state.processes if r.name == "etcd"],
        ]
        # Clients before servers: an apiserver whose etcd is gone waits for it before exiting,
        # so stopping everything at once is slower than stopping in stages.
        survivors: list[ProcessRecord] = []
        for stage in stages:
            survivors += procs.stop_all(stage, popens=self._popens)
        if survivors:
            self.state.processes = survivors
            self._save()
            return survivors
        self.state.processes = []
        remove_owned(self.layout, keep_logs=keep_logs)
        return []

    # ----- internals ----------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], port: int) -> ProcessRecord:
        return self.spawn(name, argv, port=port)

    def _save(self) -> None:
        if self.layout.root.is_dir():
            cluster_state.save(self.state, self.layout.state_file)

    def _boot(
        self,
        binaries: dict[str, Path],
        ports: Ports,
        specs: list[cluster_nodes.NodeSpec],
        *,
        gates: Mapping[str, bool],
        limits: cluster_flags.ClientLimits,
        timeout: float,
        say: Callable[[str], None],
    ) -> None:
        layout = self.layout
        t0 = time.monotonic()
        paths = certs.generate(layout.pki)
        server = f"https://{cluster_flags.LOOPBACK}:{ports.apiserver}"
        identities, self.state.nodes = cluster_boot.write_credentials(
            layout, server, paths.ca_cert, specs
        )
        self._tokens["admin"] = identities["admin"].token
        self.state.server = server
        self.state.ca_cert = str(paths.ca_cert)
        self.state.kubeconfig = str(layout.kubeconfig)
        self._save()
        for sub in (layout.logs, layout.etcd_data):
            sub.mkdir(mode=0o700, parents=True, exist_ok=True)

        say(f"starting etcd on {cluster_flags.LOOPBACK}:{ports.etcd_client}")
        etcd = self._spawn(
            "etcd", cluster_flags.etcd_argv(binaries["etcd"], layout, ports), ports.etcd_client
        )
        etcd_url = f"http://{cluster_flags.LOOPBACK}:{ports.etcd_client}/health"
        wait_for("etcd", probe(etcd_url), watch=[etcd], timeout=timeout)

        say(f"starting kube-apiserver on {server}")
        api_argv = cluster_flags.apiserver_argv(
            binaries["kube-apiserver"],
            layout,
            ports,
            ca_cert=paths.ca_cert,
            serving_cert=paths.serving_cert,
            serving_key=paths.serving_key,
            sa_key=paths.sa_key,
            sa_pub=paths.sa_pub,
            gates=gates,
        )
        # The way to real nodes' kubelets (logs, exec): unused while nodes are kubelet-less.
        api_argv += realnode_pki.apiserver_flags(
            layout.pki, realnode_pki.egress_socket(layout.root)
        )
        api_argv += webhook_client.apiserver_flags(layout.pki)  # for --webhook-client-ca
        api = self._spawn("kube-apiserver", api_argv, ports.apiserver)
        admin = identities["admin"].token
        wait_for(
            "kube-apiserver",
            probe(f"{server}/readyz", ca_file=paths.ca_cert, token=admin),
            watch=[etcd, api],
            timeout=timeout,
        )
        say(f"kube-apiserver ready after {time.monotonic() - t0:.1f}s")

        say(
            "starting kube-scheduler and kube-controller-manager"
            + ("" if limits.stock else f" (client qps {limits.qps}, burst {limits.burst})")
        )
        sched = self._spawn(
            "kube-scheduler",
            cluster_flags.scheduler_argv(
                binaries["kube-scheduler"], layout, ports, gates=gates, limits=limits
            ),
            ports.scheduler,
        )
        kcm = self._spawn(
            "kube-controller-manager",
            cluster_flags.controller_manager_argv(
                binaries["kube-controller-manager"],
                layout,
                ports,
                ca_cert=paths.ca_cert,
                gates=gates,
                limits=limits,
            ),
            ports.controller_manager,
        )
        everyone = [etcd, api, sched, kcm]
        for rec in (sched, kcm):
            wait_for(
                rec.name,
                probe(f"https://{cluster_flags.LOOPBACK}:{rec.port}/healthz", verify=False),
                watch=everyone,
                timeout=timeout,
            )

        say(f"creating nodes: {', '.join(f'{s.name} ({s.profile})' for s in specs)}")
        api_client = self.api_client()
        try:
            cluster_boot.create_nodes(api_client, specs)
            # Pods are refused until the ServiceAccount controller made `default/default`.
            wait_for(
                "ServiceAccount default/default",
                lambda: cluster_boot.default_service_account_exists(api_client),
                watch=everyone,
                timeout=timeout,
            )
        finally:
            api_client.close()
        self.state.ready = True
        self._save()
        say(f"control plane ready in {time.monotonic() - t0:.1f}s")


@contextmanager
def running_cluster(root: Path, profiles: Sequence[str], **kwargs: Any) -> Iterator[Cluster]:
    """`with running_cluster(dir, ["dgx-h100"]) as c:` — started, then stopped for certain."""
    cluster = Cluster.start(root, profiles, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()
