"""Brings one simulated node of a test-bed Cluster to life: GPUs, kubelet plugin, kubelet stand-in.

For a node created by `vgpu_testbed.cluster.control_plane` (a Node object labelled with a simulated
GPU profile) this module
1. creates the node's simulated GPU state from its profile
   (`vgpu_testbed.fakegpu.simulator.prepare_node`),
2. starts `vgpu-dra kubelet-plugin` with that environment (so NVML sees the node's fake GPUs) and
   per-node directories, and
3. starts the kubelet stand-in (`vgpu_testbed.standin.kubelet`) with the node's own credentials,
all through `cluster.spawn`, so the processes are torn down with the cluster.

Per node everything lives under `<cluster root>/nodes/<node>/` (see `NodePaths`), so tests can read
CDI specs, claim directories and the checkpoint. The plugin can be stopped, SIGKILLed and started
again (crash-recovery tests). Used by tests/e2e/kubelet_plugin/test_node_path.py and, for
`vgpu-dra dev-cluster up` and the demo, through `start_node_agents(cluster)`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dra_driver.names import DEFAULT_DRIVER_NAME, DriverNames
from vgpu_testbed import procs
from vgpu_testbed.cluster.nodes import node_specs
from vgpu_testbed.procs import ProcessRecord

if TYPE_CHECKING:  # the cluster modules start node agents too (vgpu_testbed.cluster.cli)
    from vgpu_testbed.cluster.control_plane import Cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HOOK_PATH = REPO_ROOT / "vgpu_hook" / "build" / "libvgpu.so"
UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the NUL


class NodeAgentError(RuntimeError):
    """A node's agents could not be started; the message says which and why."""


@dataclass(frozen=True, slots=True)
class NodePaths:
    """Every per-node path; the kubelet's standard layout, relocated under the cluster dir."""

    root: Path
    driver: str = DEFAULT_DRIVER_NAME

    @property
    def plugins_dir(self) -> Path:
        """Like /var/lib/kubelet/plugins (the plugin's socket is in `<driver>/dra.sock`)."""
        return self.root / "plugins"

    @property
    def registrar_dir(self) -> Path:
        """Like /var/lib/kubelet/plugins_registry."""
        return self.root / "plugins_registry"

    @property
    def cdi_root(self) -> Path:
        """Like /var/run/cdi."""
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        """The plugin's state (checkpoint.json, claims/<uid>/)."""
        return self.root / "state"

    @property
    def kubelet_dir(self) -> Path:
        """The stand-in's records (pods/<ns>_<pod>.json, prepared.json)."""
        return self.root / "kubelet"

    @property
    def gpu_state(self) -> Path:
        """The simulated GPUs' shared state file."""
        return self.root / "gpus.state"

    @property
    def checkpoint(self) -> Path:
        return self.state_dir / "checkpoint.json"

    @property
    def dra_socket(self) -> Path:
        return Path(DriverNames(self.driver).dra_socket(str(self.plugins_dir)))

    @property
    def registration_socket(self) -> Path:
        return Path(DriverNames(self.driver).registration_socket(str(self.registrar_dir)))

    def claim_dir(self, claim_uid: str) -> Path:
        return self.state_dir / "claims" / claim_uid

    def cdi_spec(self, claim_uid: str) -> Path:
        vendor_class = DriverNames(self.driver).cdi_kind.replace("/", "-")
        return self.cdi_root / f"{vendor_class}_{claim_uid}.json"

    def pod_record(self, namespace: str, name: str) -> Path:
        return self.kubelet_dir / "pods" / f"{namespace}_{name}.json"

    def make(self) -> None:
        for directory in (self.root, self.cdi_root, self.state_dir, self.kubelet_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        for directory in (self.plugins_dir, self.registrar_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for sock in (self.dra_socket, self.registration_socket):
            if len(str(sock)) > UNIX_PATH_MAX:
                raise NodeAgentError(
                    f"socket path {sock} is {len(str(sock))} characters; unix sockets allow "
                    f"{UNIX_PATH_MAX}: use a shorter cluster directory"
                )


class NodeAgents:
    """The simulated GPUs, kubelet plugin and kubelet stand-in of one cluster node."""

    def __init__(
        self,
        cluster: Cluster,
        node_name: str,
        *,
        driver: str = DEFAULT_DRIVER_NAME,
        hook_path: Path = DEFAULT_HOOK_PATH,
        plugin_args: Sequence[str] = (),
        plugin_kubeconfig: Path | None = None,
        standin_args: Sequence[str] = (),
        mig_mode: str | None = None,
    ) -> None:
        record = next((n for n in cluster.nodes if n.name == node_name), None)
        if record is None:
            known = ", ".join(n.name for n in cluster.nodes) or "none"
            raise NodeAgentError(f"cluster has no node {node_name!r} (nodes: {known})")
        self.cluster = cluster
        self.node_name = node_name
        self.profile = record.profile
        self.node_kubeconfig = Path(record.kubeconfig)
        # The plugin reads claims of pods on its node: the node identity is allowed to (Node
        # authorizer), and so is what a real deployment's service account gets through RBAC.
        self.plugin_kubeconfig = plugin_kubeconfig or self.node_kubeconfig
        self.driver = driver
        self.hook_path = hook_path
        self.plugin_args = list(plugin_args)
        self.standin_args = list(standin_args)
        # A node in MIG mode (docs/testbed.md, "A node in MIG mode"): the plugin's --mig-mode,
        # and at stop the simulated GPUs' state goes, so the node starts next time with MIG off
        # as its profile says (the simulator keeps a GPU's MIG mode in the state file).
        self.mig_mode = mig_mode
        self.paths = NodePaths(cluster.root / "nodes" / node_name, driver)
        self.gpu_env: dict[str, str] = {}

    @property
    def plugin_process(self) -> str:
        return f"kubelet-plugin-{self.node_name}"

    @property
    def standin_process(self) -> str:
        return f"kubelet-standin-{self.node_name}"

    def prepare_gpus(self) -> dict[str, str]:
        """Create the node's simulated GPU state; returns the env a process needs to see it."""
        # late: only this step needs the simulated GPUs
        from vgpu_testbed.fakegpu import simulator as fakegpu

        self.paths.make()
        profile = fakegpu.load_profile(self.profile)
        self.gpu_env = dict(fakegpu.prepare_node(profile, self.paths.gpu_state))
        return self.gpu_env

    def plugin_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dra_driver.cli",
            "kubelet-plugin",
            "--node-name",
            self.node_name,
            "--kubeconfig",
            str(self.plugin_kubeconfig),
            "--driver-name",
            self.driver,
            "--plugin-dir",
            str(self.paths.plugins_dir / self.driver),
            "--registrar-dir",
            str(self.paths.registrar_dir),
            "--cdi-root",
            str(self.paths.cdi_root),
            "--state-dir",
            str(self.paths.state_dir),
            "--hook-path",
            str(self.hook_path),
            # Metrics on a loopback port (the URL is in the log: metrics_url()); a
            # --metrics-address in plugin_args comes later and wins.
            "--metrics-address",
            self.metrics_address(),
            *(["--mig-mode", self.mig_mode] if self.mig_mode is not None else []),
            *self.plugin_args,
        ]

    def metrics_address(self) -> str:
        """Where the plugin serves /metrics: a free port of the host's loopback."""
        return "127.0.0.1:0"

    def enter(self, argv: Sequence[str]) -> list[str]:
        """argv as run on this node: the stand-in's node is the host itself (a real node
        overrides this to enter its namespaces), so tests run a node-side process alike."""
        return list(argv)

    def metrics_url(self) -> str | None:
        """The /metrics URL the running plugin logged (None before it serves, or when off)."""
        log_path = self.cluster.root / "logs" / f"{self.plugin_process}.log"
        try:
            found = re.findall(r"metrics_url=(\S+)", log_path.read_text())
        except OSError:
            return None
        return found[-1] if found else None

    def standin_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vgpu_testbed.standin.kubelet",
            "--node-name",
            self.node_name,
            "--kubeconfig",
            str(self.node_kubeconfig),
            "--registrar-dir",
            str(self.paths.registrar_dir),
            "--state-dir",
            str(self.paths.kubelet_dir),
            *self.standin_args,
        ]

    def start(self, *, timeout: float = 60.0) -> None:
        """GPUs, then the plugin (waiting for its registration socket), then the stand-in."""
        if not self.gpu_env:
            self.prepare_gpus()
        self.start_plugin(timeout=timeout)
        if not self._running(self.standin_process):
            self.cluster.spawn(self.standin_process, self.standin_argv(), cwd=REPO_ROOT)

    def start_plugin(self, *, timeout: float = 60.0) -> None:
        """Start the plugin and wait until its registration socket exists."""
        if not self.gpu_env:
            self.prepare_gpus()
        if self._running(self.plugin_process):
            self.cluster.stop_process(self.plugin_process)
        env = {**self.gpu_env, "PYTHONUNBUFFERED": "1"}
        self.cluster.spawn(self.plugin_process, self.plugin_argv(), env=env, cwd=REPO_ROOT)
        self.wait_for_socket(self.paths.registration_socket, timeout=timeout)

    def wait_for_socket(self, sock: Path, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not sock.exists():
            record = self._record(self.plugin_process)
            if record is None or not procs.is_alive(record):
                raise NodeAgentError(
                    f"{self.plugin_process} exited before creating {sock}; see "
                    f"{self.cluster.root / 'logs' / (self.plugin_process + '.log')}"
                )
            if time.monotonic() > deadline:
                raise NodeAgentError(f"{self.plugin_process}: no {sock} after {timeout:.0f}s")
            time.sleep(0.05)

    def kill_plugin(self) -> None:
        """SIGKILL the plugin (no clean shutdown: sockets and half-written state stay)."""
        record = self._record(self.plugin_process)
        if record is None:
            raise NodeAgentError(f"{self.plugin_process} is not running")
        os.kill(record.pid, signal.SIGKILL)
        self.cluster.stop_process(self.plugin_process)  # reaps it and forgets the record

    def drain(self, timeout: float = 60.0) -> None:
        """Take the node's pods off it before it stops (a real node must: `RealNode.drain`).
        Nothing to do here: the stand-in unprepares every recorded claim that no active pod
        uses at each poll, its first one after a restart included."""
        del timeout

    def stop(self) -> None:
        """Stop the stand-in and the plugin (SIGTERM first); leaves the files for inspection."""
        for name in (self.standin_process, self.plugin_process):
            if self._running(name):
                self.cluster.stop_process(name)
        self.forget_mig_state()

    def forget_mig_state(self) -> None:
        """After a stop in MIG mode: remove the simulated GPUs' state (MIG modes, instances),
        so the next start of this node, by any module, finds the GPUs as its profile makes them.
        Nothing for a node started without `mig_mode`."""
        if self.mig_mode is not None:
            self.paths.gpu_state.unlink(missing_ok=True)

    def remove_files(self) -> None:
        shutil.rmtree(self.paths.root, ignore_errors=True)

    def _record(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.cluster.processes if p.name == name), None)

    def _running(self, name: str) -> bool:
        return self._record(name) is not None


def check_prerequisites(root: Path, profiles: Sequence[str]) -> None:
    """Fail before starting anything when node agents could not run: every profile must be a
    simulated machine, the simulated GPU libraries must be built, and the nodes' unix socket
    paths must fit the kernel's limit."""
    from vgpu_testbed.fakegpu import profiles as machine_profiles
    from vgpu_testbed.fakegpu import simulator as fakegpu

    for name in profiles:
        machine_profiles.load_profile(name)  # ProfileError names the profile and the known ones
    fakegpu.library_dir()  # FakeGpuError says to run `make native`
    for spec in node_specs(list(profiles)):
        paths = NodePaths(root.resolve() / "nodes" / spec.name)
        for sock in (paths.dra_socket, paths.registration_socket):
            if len(str(sock)) > UNIX_PATH_MAX:
                raise ValueError(
                    f"--dir {root} is too deep for node agents: {sock} has {len(str(sock))} "
                    f"characters, unix sockets allow {UNIX_PATH_MAX}; "
                    "use a shorter --dir"
                )


def start_node_agents(
    cluster: Cluster, nodes: Iterable[str] | None = None, **kwargs: object
) -> dict[str, NodeAgents]:
    """Start the agents of every node (or of `nodes`); returns them by node name.

    On failure the agents already started are stopped again before the error propagates.
    """
    names = list(nodes) if nodes is not None else [n.name for n in cluster.nodes]
    started: dict[str, NodeAgents] = {}
    try:
        for name in names:
            agents = NodeAgents(cluster, name, **kwargs)  # type: ignore[arg-type]
            agents.start()
            started[name] = agents
    except BaseException:
        for agents in started.values():
            agents.stop()
        raise
    return started
