"""The command lines of the control-plane components, as pure functions of a directory layout and
a set of ports — plus the feature gates and the controller list they share.

Why pure: the flags are where a test bed silently diverges from a real cluster (a gate set on one
component but not another, a controller that taints our kubelet-less nodes). Keeping them as data
makes them unit-testable and readable in one place. Called by `vgpu_testbed.cluster.control_plane`.

Feature gates (checked against pkg/features/kube_features.go of v1.37.1):
- DRAConsumableCapacity, DRAPartitionableDevices: beta and on by default since 1.36; set
  explicitly so the bed does not depend on defaults that may change.
- DRADeviceTaints, DRADeviceTaintRules: GA in 1.37 but not yet locked, so setting them is allowed.
- DRAExtendedResource (GA 1.37), DRAPrioritizedList, DRAAdminAccess,
  DRAResourceClaimDeviceStatus, DynamicResourceAllocation: GA and *locked* on. They are on without
  any flag; naming them only earns a deprecation warning, so they are listed in LOCKED_ON instead.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

FEATURE_GATES: dict[str, bool] = {
    "DRAConsumableCapacity": True,
    "DRADeviceTaintRules": True,
    "DRADeviceTaints": True,
    "DRAPartitionableDevices": True,
}
LOCKED_ON: tuple[str, ...] = (
    "DRAAdminAccess",
    "DRAExtendedResource",
    "DRAPrioritizedList",
    "DRAResourceClaimDeviceStatus",
    "DynamicResourceAllocation",
)

# The controller-manager runs only what pods with claims need, and never node-lifecycle: our
# Nodes have no kubelet heartbeat, and that controller would taint them unreachable.
CONTROLLERS: tuple[str, ...] = (
    "resourceclaim-controller",  # creates ResourceClaims from pods' ResourceClaimTemplates
    "garbage-collector-controller",  # deletes generated claims with their pods
    "serviceaccount-controller",  # the `default` ServiceAccount every namespace needs for pods
    "root-ca-certificate-publisher-controller",  # kube-root-ca.crt, mounted by pod tokens
    "namespace-controller",  # so deleting a test namespace completes
    "device-taint-eviction-controller",  # evicts pods from NoExecute-tainted devices
    "deployment-controller",  # Helm-installed workloads get pods
    "replicaset-controller",
    "daemonset-controller",
)

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
LOOPBACK = "127.0.0.1"
_GATE_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def feature_gate_flag(gates: Mapping[str, bool] = FEATURE_GATES) -> str:
    """`--feature-gates` value, sorted so every component gets the byte-identical string."""
    for name in gates:
        if not _GATE_NAME.match(name):
            raise ValueError(f"feature gate name {name!r} is not a Go identifier like DRAFoo")
        if name in LOCKED_ON:
            raise ValueError(
                f"feature gate {name} is GA and locked on in this Kubernetes release; drop it"
            )
    return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(gates.items()))


@dataclass(frozen=True, slots=True)
class Ports:
    """Loopback ports of one cluster. All distinct."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int

    def all(self) -> dict[str, int]:
        return {
            "etcd-client": self.etcd_client,
            "etcd-peer": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-scheduler": self.scheduler,
            "kube-controller-manager": self.controller_manager,
        }


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Client-side rate limits of kube-scheduler and kube-controller-manager towards the apiserver
    (`--kube-api-qps`, `--kube-api-burst`). `None` keeps a component's stock value.

    Why: with stock limits the default allocation path is capped by those clients (the
    controller-manager needs two requests per pod at 20/s, the scheduler several at 50/s), not by
    any allocator; throughput benchmarks raise both to see what the components themselves do.
    """

    qps: int | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("qps", self.qps), ("burst", self.burst)):
            if value is not None and value < 1:
                raise ValueError(f"client {name} must be a positive integer, got {value}")

    @classmethod
    def of(cls, qps: int | None = None, burst: int | None = None) -> ClientLimits:
        """`qps` alone also raises the burst to `qps`: a burst below the rate would throttle
        every batch back to the stock burst."""
        if qps is not None and burst is None:
            burst = qps
        return cls(qps=qps, burst=burst)

    @property
    def stock(self) -> bool:
        return self.qps is None and self.burst is None

    def flags(self) -> list[str]:
        out = []
        if self.qps is not None:
            out.append(f"--kube-api-qps={self.qps}")
        if self.burst is not None:
            out.append(f"--kube-api-burst={self.burst}")
        return out


STOCK = ClientLimits()


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True if nothing listens on host:port and we may bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports the kernel considers free right now.

    All sockets stay bound until every port is chosen, so the kernel cannot hand out the same
    port twice. (Another process may still grab one before our component binds it; the
    component then dies with "address already in use", which the starter reports.)
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
    return ports


def allocate_ports(apiserver_port: int | None = None) -> Ports:
    """Pick the cluster's ports; `apiserver_port` pins the apiserver (it must be free)."""
    if apiserver_port is not None:
        if not 1 <= apiserver_port <= 65535:
            raise ValueError(f"apiserver port must be 1..65535, got {apiserver_port}")
        if not port_is_free(apiserver_port):
            raise PortInUseError(
                f"port {apiserver_port} on {LOOPBACK} is already in use; choose another "
                "--apiserver-port or stop what listens there (see `ss -ltnp`)"
            )
    # Five distinct ports: at most one equals a pinned apiserver port, so four always remain.
    candidates = [p for p in free_ports(5) if p != apiserver_port]
    api = apiserver_port if apiserver_port is not None else candidates.pop()
    etcd_client, etcd_peer, scheduler, controller_manager = candidates[:4]
    return Ports(
        etcd_client=etcd_client,
        etcd_peer=etcd_peer,
        apiserver=api,
        scheduler=scheduler,
        controller_manager=controller_manager,
    )


class PortInUseError(RuntimeError):
    """A port the user asked for is taken."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Every path inside one cluster directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def token_file(self) -> Path:
        return self.root / "pki" / "tokens.csv"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters)."""
        return self.root / "kubeconfig"

    @property
    def kubeconfigs(self) -> Path:
        """Per-identity kubeconfigs: scheduler, controller-manager, one per node."""
        return self.root / "kubeconfigs"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def component_kubeconfig(self, identity: str) -> Path:
        return self.kubeconfigs / f"{identity}.kubeconfig"

    def component_certs(self, component: str) -> Path:
        """Where scheduler/controller-manager keep their self-signed serving certificate."""
        return self.root / "serving" / component

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"


def etcd_argv(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=testbed",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=testbed={peer}",
        "--unsafe-no-fsync",  # a throwaway store: durability only costs time
        "--log-level=warn",
    ]


def apiserver_argv(
    binary: Path,
    layout: Layout,
    ports: Ports,
    *,
    ca_cert: Path,
    serving_cert: Path,
    serving_key: Path,
    sa_key: Path,
    sa_pub: Path,
    gates: Mapping[str, bool] = FEATURE_GATES,
) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        # The `kubernetes` Service endpoint may not be a loopback address; nothing in the bed
        # reaches the apiserver through that Service, so it is not maintained at all.
        "--endpoint-reconciler-type=none",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={serving_cert}",
        f"--tls-private-key-file={serving_key}",
        f"--client-ca-file={ca_cert}",
        f"--token-auth-file={layout.token_file}",
        "--authorization-mode=Node,RBAC",
        # As on a real cluster: a node's credentials may write only its own Node object and
        # ResourceSlices (the Node authorizer alone lets any node create any node's slice).
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-issuer=https://{LOOPBACK}:{ports.apiserver}",
        f"--service-account-key-file={sa_pub}",
        f"--service-account-signing-key-file={sa_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        f"--feature-gates={feature_gate_flag(gates)}",
        "--profiling=false",
        "--v=1",
    ]


def _secure_component_flags(name: str, layout: Layout, port: int) -> list[str]:
    """What kube-scheduler and kube-controller-manager share: their own kubeconfig for the API,
    delegated authn/authz, no leader election (one replica), HTTPS on loopback."""
    kubeconfig = layout.component_kubeconfig(name)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--cert-dir={layout.component_certs(name)}",
    ]


def scheduler_argv(
    binary: Path,
    layout: Layout,
    ports: Ports,
    *,
    gates: Mapping[str, bool] = FEATURE_GATES,
    limits: ClientLimits = STOCK,
) -> list[str]:
    # The flags are deprecated in favour of a --config file but still honoured without one.
    return [
        str(binary),
        *_secure_component_flags("kube-scheduler", layout, ports.scheduler),
        *limits.flags(),
        f"--feature-gates={feature_gate_flag(gates)}",
        "--v=1",
    ]


def controller_manager_argv(
    binary: Path,
    layout: Layout,
    ports: Ports,
    *,
    ca_cert: Path,
    gates: Mapping[str, bool] = FEATURE_GATES,
    limits: ClientLimits = STOCK,
) -> list[str]:
    return [
        str(binary),
        *_secure_component_flags("kube-controller-manager", layout, ports.controller_manager),
        *limits.flags(),
        f"--controllers={','.join(CONTROLLERS)}",
        f"--root-ca-file={ca_cert}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        f"--feature-gates={feature_gate_flag(gates)}",
        "--v=1",
    ]
