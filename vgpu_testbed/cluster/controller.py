"""The allocation controller (`vgpu-dra controller`) in a test-bed cluster, run as a real install
runs it: its own ServiceAccount with the RBAC the Helm chart renders, a ServiceAccount token
(TokenRequest) in a kubeconfig of its own, leader election on its Lease.

Why not the admin kubeconfig: the bed exists to catch what a real cluster would refuse. A
controller that needs a right the chart does not grant must fail here, not in a user's cluster.
The process is an extra process of the cluster (`Cluster.spawn`): recorded in state.json, probed
by `dev-cluster status` (its /readyz), stopped first by `down`. Files: `<root>/controller/`
(`rbac-<release>.yaml` as applied, `example-policy-pod.yaml`, `<process>.log`); its
credentials are in `<root>/kubeconfigs/<process>.kubeconfig` (0600). Called by
`vgpu-dra dev-cluster up --agents` (vgpu_testbed.cluster.cli), the demo's policy step and
tests/e2e/controller/test_selection.py.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

import yaml

from dra_driver import kube
from vgpu_testbed.cluster import chart, webhook
from vgpu_testbed.cluster.flags import LOOPBACK, Layout, free_ports
from vgpu_testbed.cluster.health import wait_for
from vgpu_testbed.cluster.status import CONTROLLER_PROCESS, probe
from vgpu_testbed.procs import ProcessRecord

PROCESS = CONTROLLER_PROCESS  # the process name; more replicas get a suffix
NAMESPACE = "vgpu-dra"
RELEASE = "vgpu-dra"
LEASE = "vgpu-dra-controller"
GATE = "vgpu.dra.dev/policy"
# A bed lives for a working session, not for the year a real install's rotated tokens span; a
# week is long enough not to expire under a user, short enough not to be a standing credential.
TOKEN_LIFETIME_S = 7 * 24 * 3600
# Set by the bed (credentials, probes, the Lease); --controller-args may not override them.
BED_FLAGS = ("--kubeconfig", "--health-address", "--leader-elect", "--lease-namespace",
             "--lease-name")  # fmt: skip
REPO_ROOT = Path(__file__).resolve().parents[2]
DEVICE_CLASS = REPO_ROOT / "deploy" / "deviceclass.yaml"


class ClusterLike(Protocol):
    """What the controller needs from `vgpu_testbed.cluster.control_plane.Cluster`."""

    layout: Layout

    @property
    def root(self) -> Path: ...

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def server(self) -> str: ...

    @property
    def ca_cert(self) -> Path: ...

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        cwd: Path | None = None,
        port: int | None = None,
    ) -> ProcessRecord: ...


@dataclass(frozen=True, slots=True)
class ControllerHandle:
    """A started controller process and where to reach it."""

    process: ProcessRecord
    namespace: str
    service_account: str
    lease: str
    kubeconfig: Path
    log: Path
    ports: dict[str, int]  # "health" (/healthz, /readyz) and "webhook" (admission webhook)

    @property
    def port(self) -> int:
        return self.ports["health"]

    @property
    def health_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['health']}"


def controller_dir(root: Path) -> Path:
    return root / "controller"


def check_controller_args(args: Sequence[str]) -> list[str]:
    """The controller's own parser checks `args` (e.g. `--node-policy spread`); flags the bed
    sets itself are refused. Raises ValueError with the reason."""
    from controller import main as controller_main  # late: the bed runs without it otherwise

    for arg in args:
        if arg.split("=", 1)[0] in BED_FLAGS:
            raise ValueError(f"--controller-args: {arg.split('=', 1)[0]} is set by the test bed")
    parser = controller_main.build_parser({})

    def refuse(message: str) -> NoReturn:
        raise ValueError(f"--controller-args: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    parser.parse_args(list(args))
    return list(args)


def install_rbac(
    client: kube.KubeClient, root: Path, *, namespace: str = NAMESPACE, release: str = RELEASE
) -> str:
    """Render the chart with the controller on, apply the controller's ServiceAccount and RBAC
    (and the namespace), keep a copy in `<root>/controller/rbac-<release>.yaml`; returns the
    ServiceAccount's name. Idempotent."""
    with tempfile.TemporaryDirectory(prefix="vgpu-dra-helm-") as home:
        docs = chart.render(
            Path(home), {"controller": {"enabled": True}}, namespace=namespace, release=release
        )
    rbac = chart.component_rbac(docs, "controller")
    # The webhook's certificate Secret: the chart creates it empty, the controller fills it.
    rbac += [
        d
        for d in chart.by_kind(docs, "Secret")
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "webhook"
    ]
    if not chart.by_kind(rbac, "ServiceAccount"):
        raise RuntimeError(f"the chart at {chart.CHART} renders no controller ServiceAccount")
    out = controller_dir(root)
    out.mkdir(mode=0o750, parents=True, exist_ok=True)
    (out / f"rbac-{release}.yaml").write_text(yaml.safe_dump_all(rbac, sort_keys=False))
    with contextlib.suppress(kube.AlreadyExists):
        client.create(
            kube.path("v1", "namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    for doc in rbac:
        if doc.get("kind") == "Secret":
            # Created once, never replaced: a second replica's install must not empty the
            # certificates the first one filled in (its webhook would then serve a certificate
            # the new bundle does not trust; docs/reliability.md, finding 7).
            with contextlib.suppress(kube.AlreadyExists):
                client.create(chart.collection_path(doc, namespace), doc)
        else:
            chart.apply(client, doc, namespace)
    return str(chart.by_kind(rbac, "ServiceAccount")[0]["metadata"]["name"])


def start_controller(
    cluster: ClusterLike,
    *,
    args: Sequence[str] = (),
    name: str = PROCESS,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    lease_duration: float | None = None,
    timeout: float = 60.0,
) -> ControllerHandle:
    """Install the controller's RBAC (if not yet), mint its token, start it, and wait until it
    is ready and the Lease has a holder.

    `args`: more controller flags, e.g. the cluster default policies
    (`--node-policy spread --device-policy binpack --topology link`). `name`: the process name;
    a second replica with another name shares the ServiceAccount and the Lease (only one
    allocates). `namespace`/`release`: where the ServiceAccount and Lease live and what the
    chart's cluster-wide objects are named after (tests sharing a cluster use their own).
    `lease_duration`: seconds (the controller's default 15 when None).
    """
    args = check_controller_args(args)
    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        account = install_rbac(client, cluster.root, namespace=namespace, release=release)
        token = chart.request_token(client, namespace, account, None, expiration_s=TOKEN_LIFETIME_S)
        cluster.layout.kubeconfigs.mkdir(mode=0o700, parents=True, exist_ok=True)
        kubeconfig = chart.token_kubeconfig(
            cluster.layout.component_kubeconfig(name), cluster.server, cluster.ca_cert, token
        )
        health_port, webhook_port = free_ports(2)
        argv = [
            sys.executable, "-m", "dra_driver.cli", "controller",
            "--kubeconfig", str(kubeconfig),
            "--health-address", f"{LOOPBACK}:{health_port}",
            "--leader-elect",
            "--lease-namespace", namespace,
            "--lease-name", LEASE,
        ]  # fmt: skip
        if lease_duration is not None:
            argv += ["--lease-duration", str(lease_duration)]
        # The admission webhook on loopback (it makes its own CA, kept in the chart's Secret);
        # `vgpu_testbed.cluster.webhook.register_webhooks` points the API server at it.
        argv += webhook.controller_flags(webhook_port, namespace=namespace, release=release)
        argv += args
        log = controller_dir(cluster.root) / f"{name}.log"
        record = cluster.spawn(name, argv, log_path=log, cwd=REPO_ROOT, port=health_port)
        wait_for(
            f"{name} /readyz",
            probe(f"http://{LOOPBACK}:{health_port}/readyz"),
            watch=[record],
            timeout=timeout,
        )
        wait_for(
            f"a holder of Lease {namespace}/{LEASE}",
            lambda: _lease_held(client, namespace),
            watch=[record],
            timeout=timeout,
        )
    finally:
        client.close()
    return ControllerHandle(
        process=record,
        namespace=namespace,
        service_account=account,
        lease=LEASE,
        kubeconfig=kubeconfig,
        log=log,
        ports={"health": health_port, "webhook": webhook_port},
    )


def uninstall_rbac(
    client: kube.KubeClient, root: Path, *, namespace: str = NAMESPACE, release: str = RELEASE
) -> None:
    """Delete what `install_rbac` applied (the cluster-wide objects and the namespace), for a
    cluster that outlives the controller (a shared test cluster)."""
    applied = controller_dir(root) / f"rbac-{release}.yaml"
    for doc in yaml.safe_load_all(applied.read_text()):
        if doc and not chart.KINDS[doc["kind"]][2]:
            client.delete(chart.object_path(doc))
    client.delete(kube.path("v1", "namespaces", namespace))
    applied.unlink()


def lease_holder(client: kube.KubeClient, namespace: str = NAMESPACE) -> str | None:
    try:
        lease = client.get(
            kube.path("coordination.k8s.io/v1", "leases", LEASE, namespace=namespace)
        )
    except kube.NotFound:
        return None
    return str((lease.get("spec") or {}).get("holderIdentity") or "") or None


def _lease_held(client: kube.KubeClient, namespace: str) -> tuple[bool, str]:
    holder = lease_holder(client, namespace)
    return holder is not None, f"holder {holder}"


def apply_device_class(client: kube.KubeClient) -> None:
    """deploy/deviceclass.yaml (what the chart also creates), unless it exists."""
    doc = yaml.safe_load(DEVICE_CLASS.read_text())
    with contextlib.suppress(kube.AlreadyExists):
        client.create(kube.path("resource.k8s.io/v1", "deviceclasses"), doc)


def example_policy_pod(image: str) -> list[dict[str, Any]]:
    """A pod on the policy path, to try by hand: the scheduling gate opts it in, the annotations
    choose the policies; its claim (from a template) asks for a share of one GPU."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "policy-example"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "vgpu.dra.dev",
                                "capacity": {"requests": {"memory": "2Gi", "cores": "10"}},
                            },
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "policy-example",
            "annotations": {
                "vgpu.dra.dev/node-scheduler-policy": "binpack",
                "vgpu.dra.dev/device-scheduler-policy": "binpack",
            },
        },
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "policy-example"}],
        },
    }
    return [template, pod]


def write_example(root: Path, image: str) -> Path:
    path = controller_dir(root) / "example-policy-pod.yaml"
    path.write_text(
        "# A pod on the policy path (docs/scheduling.md): the allocation controller places it\n"
        "# (binpack), writes its claim's allocation and lifts the gate; kube-scheduler binds it.\n"
        + yaml.safe_dump_all(example_policy_pod(image), sort_keys=False)
    )
    return path


def try_it_lines(example: Path, handle: ControllerHandle) -> list[str]:
    """What `dev-cluster up` prints so a user can try the policy path by hand."""
    return [
        f"allocation controller: pid {handle.process.pid}, ServiceAccount "
        f"{handle.namespace}/{handle.service_account}, Lease {handle.namespace}/{handle.lease}, "
        f"ready at {handle.health_url}/readyz, log {handle.log}",
        "try the policy path (after the export below):",
        f"  kubectl apply -f {example}",
        "  kubectl get pod policy-example -o wide   # gate lifted, bound to the chosen node",
        "  kubectl get resourceclaims -o yaml       # status.allocation written by the controller",
        "  kubectl get events --field-selector involvedObject.name=policy-example  # a refusal",
    ]
