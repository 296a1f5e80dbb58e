"""The bed a fault run works on: a private control plane, real nodes, two controller replicas
behind one webhook address, and the ways to kill, restart and reboot each of them.

Why private: the faults kill the API server and etcd, which a shared session cluster must not
suffer. Everything is started the way `vgpu-dra dev-cluster up --agents` starts it (the
chart's RBAC, tokens, DeviceClass, webhook configurations), plus:
- a second controller replica on the same Lease (`vgpu-dra-controller-2`), so leader kills
  and Lease losses have a standby to hand over to;
- the webhook's "Service" (`vgpu_testbed.faults.service`): one port relayed to any live
  replica, as a real install's Service is;
- `ChaosNode`, a real node (`vgpu_testbed.realnode.node.RealNode`) with a boot ID of its own:
  a file bound over /proc/sys/kernel/random/boot_id inside the node's mount namespace, so a
  reboot (stop the node, wipe what a reboot wipes, start it on the same state dir) changes the
  boot ID the kubelet and the kubelet plugin read, as on a real machine.
A killed process is started again with its recorded command line (same ports, credentials and
log), as a kubelet restarts a static pod or a DaemonSet's container.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dra_driver import kube
from dra_driver.kube import KubeClient
from vgpu_testbed import procs
from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.cluster import webhook as bed_webhook
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.cluster.flags import free_ports
from vgpu_testbed.cluster.health import wait_for as wait_healthy
from vgpu_testbed.cluster.status import probe
from vgpu_testbed.faults.service import write_backends
from vgpu_testbed.polling import wait_for
from vgpu_testbed.procs import ProcessRecord
from vgpu_testbed.realnode.host import check_host
from vgpu_testbed.realnode.node import (
    START_TIMEOUT,
    RealNode,
    ensure_images,
    start_bed_network,
)
from vgpu_testbed.standin.node_agents import REPO_ROOT, NodeAgentError

JSON = dict[str, Any]
PROFILES = ("dgx-h100", "a10-pcie")
CONTROLLERS = (bed_controller.PROCESS, f"{bed_controller.PROCESS}-2")
SERVICE = "webhook-service"
TENANT = "chaos"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
CDI_CLAIM_PREFIX = "k8s.vgpu.dra.dev-claim_"
# With the controller installed, devices are published with binding conditions, so the
# controller confirms kube-scheduler's allocations before pods bind (docs/scheduling.md,
# "Double-booking between the two paths"); without, a double-booking of the two paths can reach
# the API and only the node's guard stops it (docs/reliability.md).
BINDING_CONDITIONS = ("--binding-conditions",)


class ChaosNode(RealNode):
    """A real bed node whose processes can be killed and restarted one by one, and which can
    reboot (new boot ID, same disk)."""

    def __init__(self, cluster: Cluster, node_name: str, index: int, **kwargs: object) -> None:
        super().__init__(cluster, node_name, index, **kwargs)
        self.boot_id = str(uuid.uuid4())
        self.boots = 1

    @property
    def boot_id_file(self) -> Path:
        return self.paths.root / "boot_id"

    def _start_holder(self, timeout: float) -> None:
        super()._start_holder(timeout)
        self.boot_id_file.write_text(self.boot_id + "\n")
        subprocess.run(
            self.enter(["mount", "--bind", str(self.boot_id_file), BOOT_ID]),
            check=True,
            capture_output=True,
        )

    def read_boot_id(self) -> str:
        """The boot ID as the node's processes read it."""
        out = subprocess.run(
            self.enter(["cat", BOOT_ID]), check=True, capture_output=True, text=True
        )
        return out.stdout.strip()

    def record(self, name: str) -> ProcessRecord | None:
        return self._record(name)

    def inner_pid(self, name: str) -> int | None:
        """Host PID of the process nsenter started for `name` (the plugin, the kubelet...)."""
        record = self._record(name)
        if record is None or not procs.is_alive(record):
            return None
        try:
            children = Path(f"/proc/{record.pid}/task/{record.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def kill(self, name: str) -> None:
        """SIGKILL a node process (its whole process group) and forget its record."""
        record = self._record(name)
        if record is None:
            raise NodeAgentError(f"{name} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
        self.cluster.stop_process(name)

    def forget_dead(self, name: str) -> None:
        """Reap and forget the record of a process that died on its own (or was killed by an
        injector); a no-op while it runs or when there is no record."""
        record = self._record(name)
        if record is not None and not procs.is_alive(record):
            self.cluster.stop_process(name)

    def restart_plugin(self, down_s: float = 0.0) -> None:
        if self._running(self.plugin_process):
            self.kill(self.plugin_process)
        time.sleep(down_s)
        self.start_plugin(timeout=START_TIMEOUT)

    def restart_kubelet(self, down_s: float = 0.0) -> None:
        self.kill(self.kubelet_process)
        time.sleep(down_s)
        self._start_kubelet()
        self.wait_kubelet_ready(START_TIMEOUT)

    def restart_containerd(self, down_s: float = 0.0) -> None:
        self.kill(self.containerd_process)
        # A SIGKILLed containerd leaves its socket file: the start would take it for ready.
        self.layout.containerd_socket.unlink(missing_ok=True)
        time.sleep(down_s)
        self._start_containerd(START_TIMEOUT)

    def reboot(self, down_s: float = 2.0) -> None:
        """Stop every process of the node (its containers die with its PID namespace), wipe
        what a reboot wipes (the node's /run, containerd's state, the CDI specs of /var/run/cdi)
        and start it again on the same disk with a new boot ID."""
        self.stop()
        time.sleep(down_s)
        run = self.paths.root / "host" / "run"
        if run.is_dir():
            for entry in run.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        shutil.rmtree(self.layout.containerd_dir / "state", ignore_errors=True)
        for spec in self.paths.cdi_root.glob(f"{CDI_CLAIM_PREFIX}*.json"):
            spec.unlink(missing_ok=True)
        self.boot_id = str(uuid.uuid4())
        self.boots += 1
        self.start()

    def netns(self) -> str:
        return f"/proc/{self.pid1}/ns/net"


@dataclass
class ChaosBed:
    """The cluster, its nodes and controllers, and an admin client."""

    cluster: Cluster
    nodes: dict[str, ChaosNode]
    client: KubeClient
    controllers: dict[str, bed_controller.ControllerHandle]
    service_port: int
    webhook_configs: list[JSON] = field(default_factory=list)
    namespace: str = TENANT

    # ----- start and stop --------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        root: Path,
        profiles: Sequence[str] = PROFILES,
        *,
        plugin_args: Sequence[str] = BINDING_CONDITIONS,
        controller_args: Sequence[str] = (),
        say: Any = print,
    ) -> ChaosBed:
        problems = check_host()
        if problems:
            raise NodeAgentError("real nodes are not possible on this host: " + "; ".join(problems))
        t0 = time.monotonic()
        cluster = Cluster.start(root, profiles, die_with_parent=True)
        try:
            say(f"control plane ready in {time.monotonic() - t0:.1f}s")
            start_bed_network(cluster)
            ensure_images(cluster.root)
            nodes: dict[str, ChaosNode] = {}
            for index, record in enumerate(cluster.nodes):
                node = ChaosNode(cluster, record.name, index, plugin_args=list(plugin_args))
                nodes[record.name] = node
                node.start()
            say(f"{len(nodes)} real nodes ready after {time.monotonic() - t0:.1f}s")
            client = KubeClient.from_kubeconfig(str(cluster.kubeconfig), timeout_s=10)
            bed_controller.apply_device_class(client)
            (service_port,) = free_ports(1)
            bed = cls(cluster, nodes, client, {}, service_port)
            first = bed_controller.start_controller(
                cluster, args=controller_args, name=CONTROLLERS[0]
            )
            bed.controllers[CONTROLLERS[0]] = first
            bed._write_backends()
            cluster.spawn(
                SERVICE,
                [
                    *_python(),
                    "-m",
                    "vgpu_testbed.faults.service",
                    "--port",
                    str(service_port),
                    "--backends",
                    str(bed.backends_file),
                ],
                cwd=REPO_ROOT,
                port=service_port,
            )
            secret = bed_webhook.certificate_secret(first.namespace, bed_controller.RELEASE)
            bed.webhook_configs = bed_webhook.register_webhooks(
                cluster,
                service_port,
                bed_webhook.published_ca_bundle(
                    cluster, first.namespace, secret["metadata"]["name"]
                ),
                namespace=first.namespace,
                release=bed_controller.RELEASE,
            )
            bed.controllers[CONTROLLERS[1]] = bed_controller.start_controller(
                cluster, args=controller_args, name=CONTROLLERS[1]
            )
            bed._write_backends()
            bed.wait_webhook_converged()
            bed._tenant_namespace()
            say(f"controllers and webhook ready after {time.monotonic() - t0:.1f}s")
            return bed
        except BaseException:
            cluster.stop(keep_logs=True)
            raise

    def stop(self) -> None:
        self.client.close()
        self.cluster.stop(keep_logs=True)

    @property
    def backends_file(self) -> Path:
        directory = self.cluster.root / "faults"
        directory.mkdir(mode=0o750, exist_ok=True)
        return directory / "webhook-backends"

    def _write_backends(self) -> None:
        write_backends(self.backends_file, [h.ports["webhook"] for h in self.controllers.values()])

    def _tenant_namespace(self) -> None:
        with contextlib.suppress(kube.AlreadyExists):
            self.client.create(
                kube.path("v1", "namespaces"),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
            )

        def account() -> bool:
            try:
                self.client.get(
                    kube.path("v1", "serviceaccounts", "default", namespace=self.namespace)
                )
            except kube.NotFound:
                return False
            return True

        wait_for(f"the default ServiceAccount of {self.namespace}", account, 60)

    # ----- processes -------------------------------------------------------------------------

    def record(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.cluster.processes if p.name == name), None)

    def alive(self, name: str) -> bool:
        record = self.record(name)
        return record is not None and procs.is_alive(record)

    def kill(self, name: str) -> ProcessRecord:
        """SIGKILL a cluster process and forget it; returns its record (to start it again)."""
        record = self.record(name)
        if record is None:
            raise KeyError(f"no process named {name!r}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
        self.cluster.stop_process(name)
        return record

    def start_again(self, record: ProcessRecord) -> None:
        """Start a killed control-plane or controller process with its recorded command line."""
        self.cluster.spawn(
            record.name,
            record.argv,
            log_path=Path(record.log_path),
            cwd=REPO_ROOT,
            port=record.port,
        )

    def wait_api(self, timeout: float = 120.0) -> None:
        """Until the API server answers /readyz (etcd reachable) with the admin token."""
        api = self.record("kube-apiserver")
        etcd = self.record("etcd")
        watch = [r for r in (api, etcd) if r is not None]
        wait_healthy(
            "kube-apiserver /readyz",
            probe(
                f"{self.cluster.server}/readyz",
                ca_file=self.cluster.ca_cert,
                token=self.cluster.admin_token(),
            ),
            watch=watch,
            timeout=timeout,
        )

    def wait_controller_ready(self, name: str, timeout: float = 60.0) -> None:
        handle = self.controllers[name]
        record = self.record(name)
        wait_healthy(
            f"{name} /readyz",
            probe(f"{handle.health_url}/readyz"),
            watch=[record] if record is not None else [],
            timeout=timeout,
        )

    def ca_bundle(self) -> bytes:
        """The CA bundle the API server trusts for the webhook (from its configuration)."""
        plural = bed_webhook.PLURALS["MutatingWebhookConfiguration"]
        name = self.webhook_configs[0]["metadata"]["name"]
        config = self.client.get(kube.path(bed_webhook.ADMISSION_API, plural, name))
        return base64.b64decode(config["webhooks"][0]["clientConfig"].get("caBundle") or "")

    def webhook_verifies(self, name: str) -> bool:
        """Replica `name` serves a certificate the API server's caBundle verifies."""
        try:
            bundle = self.ca_bundle()
            context = ssl.create_default_context(cadata=bundle.decode())
            port = self.controllers[name].ports["webhook"]
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return True
        except (OSError, ValueError, kube.KubeError):
            return False

    def wait_webhook_converged(self, timeout: float = 60.0) -> None:
        """Until every live replica serves a certificate the registered caBundle trusts.

        Needed after a replica starts: `start_controller` applies the chart's (empty)
        certificate Secret again, the new replica fills it with a new CA, and the other
        replica serves its old certificate until its next sync (a bed finding, see
        docs/reliability.md)."""
        for name in self.controllers:
            if self.alive(name):
                wait_for(
                    f"{name}'s webhook certificate trusted",
                    partial(self.webhook_verifies, name),
                    timeout,
                )

    def identities(self) -> dict[str, str]:
        """Lease identity -> controller process name (from each replica's log)."""
        found: dict[str, str] = {}
        for name, handle in self.controllers.items():
            with contextlib.suppress(OSError):
                for identity in re.findall(
                    r'leader election on lease \S+ as ([^\s"]+)', handle.log.read_text()
                ):
                    found[identity] = name
        return found

    def lease(self) -> JSON | None:
        with contextlib.suppress(kube.NotFound):
            return self.client.get(
                kube.path(
                    "coordination.k8s.io/v1",
                    "leases",
                    bed_controller.LEASE,
                    namespace=bed_controller.NAMESPACE,
                )
            )
        return None

    def leader(self) -> str | None:
        """The controller process holding the Lease (None: nobody, or not one of ours)."""
        lease = self.lease()
        holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
        return self.identities().get(holder)


def _python() -> list[str]:
    import sys

    return [sys.executable]
