"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, started in one directory and torn down without leaving a process or a
listening port behind.

Who uses it: the e2e test fixture (`tests/e2e/conftest.py`), `vgpu-dra dev-cluster` and
`vgpu-dra demo`. Later parts start per-node processes (kubelet plugin, kubelet stand-in) with
`Cluster.spawn`, so they are stopped with the cluster.

The directory holds everything: `pki/` (CA, serving cert, service-account keys, token file),
`etcd/`, `logs/<component>.log`, `kubeconfig` (admin), `kubeconfigs/` (scheduler,
controller-manager, one per node), `nodes/<node>/` (files of per-node agents started later) and
`state.json` (see cluster_state). The pure pieces live in
cluster_flags (command lines, gates, ports), cluster_files (identities, kubeconfigs),
cluster_nodes (Node objects); this module only sequences them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from vgpu_testbed import certs, cluster_files, cluster_flags, cluster_nodes, cluster_state, procs
from vgpu_testbed.cluster_flags import FEATURE_GATES, Layout, Ports
from vgpu_testbed.cluster_health import http_get, wait_for
from vgpu_testbed.cluster_state import ClusterState, NodeRecord
from vgpu_testbed.procs import ProcessRecord

REPO_ROOT = Path(__file__).resolve().parents[1]
VERSIONS_ENV = REPO_ROOT / "hack" / "testbed" / "versions.env"
FALLBACK_K8S_VERSION = "v1.37.1"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
# Components in start order; stopped in reverse (extra per-node processes first).
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
# What we create inside a cluster directory, and so the only things teardown removes.
# `nodes/<node>/` is where per-node agents (simulated GPUs, kubelet plugin, kubelet stand-in)
# keep their files; it belongs to the cluster and goes with it.
_OWNED_ENTRIES = (
    "pki",
    "etcd",
    "logs",
    "kubeconfig",
    "kubeconfigs",
    "serving",
    "nodes",
    "state.json",
)


class BinariesMissingError(RuntimeError):
    """The control-plane binaries have not been built."""


class ClusterBusyError(RuntimeError):
    """The directory already has a running cluster, or holds files that are not ours."""


def pinned_versions() -> dict[str, str]:
    """KEY=VALUE pairs of hack/testbed/versions.env (empty when not in a source checkout)."""
    try:
        text = VERSIONS_ENV.read_text()
    except FileNotFoundError:
        return {}
    pairs = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip().strip("\"'")
    return pairs


def k8s_version() -> str:
    return pinned_versions().get("K8S_VERSION", FALLBACK_K8S_VERSION)


def default_bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$VGPU_DRA_K8S_BIN`, else `${VGPU_DRA_CACHE:-~/.cache/vgpu-dra}/k8s/<version>/bin`."""
    env = os.environ if env is None else env
    if env.get("VGPU_DRA_K8S_BIN"):
        return Path(env["VGPU_DRA_K8S_BIN"])
    cache = Path(env.get("VGPU_DRA_CACHE") or Path.home() / ".cache" / "vgpu-dra")
    return cache / "k8s" / k8s_version() / "bin"


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Paths of the four binaries; BinariesMissingError names what is missing and the fix."""
    bin_dir = bin_dir or default_bin_dir()
    found = {name: bin_dir / name for name in BINARIES}
    missing = [name for name, path in found.items() if not path.is_file()]
    if missing:
        raise BinariesMissingError(
            f"control-plane binaries not built: {', '.join(missing)} missing in {bin_dir}. "
            "Run `make controlplane` (bash hack/testbed/build.sh; ~8 min the first time)."
        )
    return found


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    port: int | None
    healthy: bool | None  # None: no health endpoint (extra processes)
    detail: str


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    profile: str
    exists: bool
    ready: bool


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    root: Path
    server: str
    components: list[ComponentStatus]
    nodes: list[NodeStatus]

    @property
    def healthy(self) -> bool:
        return all(c.alive and c.healthy is not False for c in self.components) and all(
            n.exists and n.ready for n in self.nodes
        )


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
        progress: Any = None,
    ) -> Cluster:
        """Start everything and wait until it is ready; on any failure stop what started.

        `die_with_parent`: the kernel kills the components when this process dies (test
        sessions). Off for `dev-cluster up`, whose components must outlive the command.
        `progress`: optional callable(str) for human-readable steps.
        """
        say = progress or (lambda _msg: None)
        binaries = find_binaries(bin_dir)
        specs = cluster_nodes.node_specs(list(profiles))
        layout = Layout(root.resolve())
        ports = cluster_flags.allocate_ports(apiserver_port)
        _prepare_dir(layout)
        state = ClusterState(k8s_version=k8s_version(), root=str(layout.root))
        state.ports = ports.all()
        state.started_at = time.time()
        cluster = cls(layout, state, die_with_parent=die_with_parent)
        try:
            cluster._boot(binaries, ports, specs, gates=gates, timeout=timeout, say=say)
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
        components = [self._component_status(p) for p in self.state.processes]
        nodes = [NodeStatus(n.name, n.profile, False, False) for n in self.state.nodes]
        api_up = any(c.name == "kube-apiserver" and c.healthy for c in components)
        if api_up:
            nodes = self._node_status()
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
        _remove_owned(self.layout, keep_logs=keep_logs)
        return []

    # ----- internals ----------------------------------------------------------------------

    def _save(self) -> None:
        if self.layout.root.is_dir():
            cluster_state.save(self.state, self.layout.state_file)

    def _spawn_component(self, name: str, argv: list[str], port: int) -> ProcessRecord:
        return self.spawn(name, argv, port=port)

    def _boot(
        self,
        binaries: dict[str, Path],
        ports: Ports,
        specs: list[cluster_nodes.NodeSpec],
        *,
        gates: Mapping[str, bool],
        timeout: float,
        say: Any,
    ) -> None:
        layout = self.layout
        t0 = time.monotonic()
        paths = certs.generate(layout.pki)
        server = f"https://{cluster_flags.LOOPBACK}:{ports.apiserver}"
        identities = self._write_credentials(server, paths.ca_cert, specs)
        self.state.server = server
        self.state.ca_cert = str(paths.ca_cert)
        self.state.kubeconfig = str(layout.kubeconfig)
        self._save()
        for sub in (layout.logs, layout.etcd_data):
            sub.mkdir(mode=0o700, parents=True, exist_ok=True)

        say(f"starting etcd on {cluster_flags.LOOPBACK}:{ports.etcd_client}")
        etcd = self._spawn_component(
            "etcd", cluster_flags.etcd_argv(binaries["etcd"], layout, ports), ports.etcd_client
        )
        etcd_url = f"http://{cluster_flags.LOOPBACK}:{ports.etcd_client}/health"
        wait_for("etcd", _probe(etcd_url), watch=[etcd], timeout=timeout)

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
        api = self._spawn_component("kube-apiserver", api_argv, ports.apiserver)
        admin = identities["admin"].token
        wait_for(
            "kube-apiserver",
            _probe(f"{server}/readyz", ca_file=paths.ca_cert, token=admin),
            watch=[etcd, api],
            timeout=timeout,
        )
        say(f"kube-apiserver ready after {time.monotonic() - t0:.1f}s")

        say("starting kube-scheduler and kube-controller-manager")
        sched = self._spawn_component(
            "kube-scheduler",
            cluster_flags.scheduler_argv(binaries["kube-scheduler"], layout, ports, gates=gates),
            ports.scheduler,
        )
        kcm = self._spawn_component(
            "kube-controller-manager",
            cluster_flags.controller_manager_argv(
                binaries["kube-controller-manager"],
                layout,
                ports,
                ca_cert=paths.ca_cert,
                gates=gates,
            ),
            ports.controller_manager,
        )
        everyone = [etcd, api, sched, kcm]
        for rec in (sched, kcm):
            wait_for(
                rec.name,
                _probe(f"https://{cluster_flags.LOOPBACK}:{rec.port}/healthz", verify=False),
                watch=everyone,
                timeout=timeout,
            )

        say(f"creating nodes: {', '.join(f'{s.name} ({s.profile})' for s in specs)}")
        api_client = self.api_client()
        try:
            _create_nodes(api_client, specs)
            # Pods are refused until the ServiceAccount controller made `default/default`.
            wait_for(
                "ServiceAccount default/default",
                lambda: _service_account_exists(api_client),
                watch=everyone,
                timeout=timeout,
            )
        finally:
            api_client.close()
        self.state.ready = True
        self._save()
        say(f"control plane ready in {time.monotonic() - t0:.1f}s")

    def _write_credentials(
        self, server: str, ca_cert: Path, specs: list[cluster_nodes.NodeSpec]
    ) -> dict[str, cluster_files.Identity]:
        layout = self.layout
        idents = [
            cluster_files.admin_identity(),
            cluster_files.scheduler_identity(),
            cluster_files.controller_manager_identity(),
        ] + [cluster_files.node_identity(s.name) for s in specs]
        cluster_files.write_private(layout.token_file, cluster_files.render_token_file(idents))
        ca_pem = ca_cert.read_bytes()
        by_key = {i.key: i for i in idents}
        for ident in idents:
            path = (
                layout.kubeconfig
                if ident.key == "admin"
                else layout.component_kubeconfig(ident.key)
            )
            text = cluster_files.render_kubeconfig(
                server=server, ca_pem=ca_pem, identity=ident, cluster="vgpu-dra-testbed"
            )
            cluster_files.write_private(path, text)
        self.state.nodes = [
            NodeRecord(
                name=s.name,
                profile=s.profile,
                kubeconfig=str(layout.component_kubeconfig(f"node-{s.name}")),
            )
            for s in specs
        ]
        self._tokens["admin"] = by_key["admin"].token
        return by_key

    def _component_status(self, rec: ProcessRecord) -> ComponentStatus:
        alive = procs.is_alive(rec)
        healthy: bool | None = None
        detail = "running" if alive else "not running"
        url: str | None = None
        kwargs: dict[str, Any] = {}
        if rec.name == "etcd":
            url = f"http://{cluster_flags.LOOPBACK}:{rec.port}/health"
        elif rec.name == "kube-apiserver":
            url = f"{self.server}/readyz"
            kwargs = {"ca_file": self.ca_cert, "token": self.admin_token()}
        elif rec.name in ("kube-scheduler", "kube-controller-manager"):
            url = f"https://{cluster_flags.LOOPBACK}:{rec.port}/healthz"
            kwargs = {"verify": False}
        if url is not None:
            healthy = False
            if alive:
                code, body = http_get(url, **kwargs)
                healthy = _healthy_answer(code, body)
                detail = f"{url} -> {code} {body.strip()[:60]}"
        return ComponentStatus(rec.name, rec.pid, alive, rec.port, healthy, detail)

    def _node_status(self) -> list[NodeStatus]:
        from kubernetes import client

        out = []
        api_client = self.api_client()
        try:
            core = client.CoreV1Api(api_client)
            existing = {n.metadata.name: n for n in core.list_node().items if n.metadata}
        finally:
            api_client.close()
        for rec in self.state.nodes:
            node = existing.get(rec.name)
            ready = False
            if node is not None and node.status and node.status.conditions:
                ready = any(
                    c.type == "Ready" and c.status == "True" for c in node.status.conditions
                )
            out.append(NodeStatus(rec.name, rec.profile, node is not None, ready))
        return out


def _healthy_answer(code: int, body: str) -> bool:
    return code == 200 and (body.strip() == "ok" or '"health":"true"' in body.replace(" ", ""))


def _probe(url: str, **kwargs: Any) -> Any:
    def probe() -> tuple[bool, str]:
        code, body = http_get(url, **kwargs)
        return _healthy_answer(code, body), f"{code} {body.strip()[:200]}"

    return probe


def _create_nodes(api_client: Any, specs: list[cluster_nodes.NodeSpec]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    for spec in specs:
        manifest = client.V1Node.model_validate(cluster_nodes.node_manifest(spec))
        created = core.create_node(body=manifest)
        if not (created.status and created.status.conditions):
            # Some releases drop status on create; the status subresource takes it.
            core.replace_node_status(
                spec.name, body=manifest.model_copy(update={"metadata": created.metadata})
            )
        # The TaintNodesByCondition admission plugin taints every new Node not-ready; on a real
        # cluster node-lifecycle lifts it once the kubelet reports Ready. We run no
        # node-lifecycle, so lift it here, as that controller would.
        node = core.read_node(spec.name)
        if node.spec and node.spec.taints:
            node.spec.taints = []
            core.replace_node(spec.name, body=node)


def _service_account_exists(api_client: Any) -> tuple[bool, str]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api_client).read_namespaced_service_account("default", "default")
    except ApiException as err:
        return False, f"{err.status} {err.reason}"
    return True, "exists"


def _prepare_dir(layout: Layout) -> None:
    """Make the directory ours: refuse a live cluster or foreign files; clear a dead one."""
    root = layout.root
    if layout.state_file.exists():
        try:
            old = cluster_state.load(layout.state_file)
        except cluster_state.StateError:
            old = None
        alive = [p for p in (old.processes if old else []) if procs.is_alive(p)]
        if alive:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
            raise ClusterBusyError(
                f"a cluster is already running in {root}: {names}. "
                f"Stop it with `vgpu-dra dev-cluster down --dir {root}` or use another --dir."
            )
        _remove_owned(layout, keep_logs=False)
    elif root.exists():
        foreign = sorted(p.name for p in root.iterdir() if p.name not in _OWNED_ENTRIES)
        if foreign:
            raise ClusterBusyError(
                f"{root} is not empty ({', '.join(foreign[:5])}...); the test bed only uses an "
                "empty or its own directory, so pick another --dir"
            )
        _remove_owned(layout, keep_logs=False)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # keys and tokens inside: private even if the directory pre-existed


def _remove_owned(layout: Layout, *, keep_logs: bool) -> None:
    root = layout.root
    if not root.is_dir():
        return
    for entry in _OWNED_ENTRIES:
        if keep_logs and entry == "logs":
            continue
        path = root / entry
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
    (root / ".state.json.tmp").unlink(missing_ok=True)
    if not keep_logs:
        with contextlib.suppress(OSError):
            root.rmdir()  # only if nothing else is left


@contextmanager
def running_cluster(root: Path, profiles: Sequence[str], **kwargs: Any) -> Iterator[Cluster]:
    """`with running_cluster(dir, ["dgx-h100"]) as c:` — started, then stopped for certain."""
    cluster = Cluster.start(root, profiles, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()
