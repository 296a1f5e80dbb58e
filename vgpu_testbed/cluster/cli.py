"""`vgpu-dra dev-cluster up|down|status|env`: a local control plane that outlives the command.

`up` starts the components in their own sessions (they survive this process and the
terminal) — with `--agents` also each node's simulated GPUs, kubelet plugin and kubelet stand-in
(vgpu_testbed.standin.node_agents) or real kubelet and containerd (vgpu_testbed.realnode), the
`vgpu.dra.dev` DeviceClass and the allocation controller with the chart's RBAC
(vgpu_testbed.cluster.controller) — records them in `<dir>/state.json`, and prints
`export KUBECONFIG=<path>` as its last line so `eval "$(vgpu-dra dev-cluster up | tail -1)"`
works. `down` stops everything recorded and removes the directory's contents; `status` probes
each component and node. Called by dra_driver.cli.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dra_driver.kube import KubeError
from vgpu_testbed.cluster import metrics_urls
from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.cluster.control_plane import (
    BinariesMissingError,
    Cluster,
    ClusterBusyError,
    ClusterStatus,
)
from vgpu_testbed.cluster.flags import PortInUseError
from vgpu_testbed.cluster.health import ComponentDiedError, NotReadyError
from vgpu_testbed.cluster.state import StateError
from vgpu_testbed.standin import node_agents

DEFAULT_DIR = Path(".dev-cluster")
PROG = "vgpu-dra dev-cluster"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _controller_args(text: str) -> list[str]:
    from vgpu_testbed.cluster.controller import check_controller_args

    try:
        return check_controller_args(shlex.split(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="A real Kubernetes control plane on 127.0.0.1 for development."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--dir",
            type=Path,
            default=DEFAULT_DIR,
            help=f"cluster directory: state, certs, logs (default: ./{DEFAULT_DIR})",
        )
        return p

    up = with_dir(sub.add_parser("up", help="start the control plane and create the nodes"))
    up.add_argument(
        "--nodes",
        type=cluster_nodes.profiles_arg,
        default=list(cluster_nodes.DEFAULT_PROFILES),
        metavar="PROFILE,PROFILE,...",
        help="one node per simulated GPU profile, named node-1, node-2, ... "
        f"(default: {','.join(cluster_nodes.DEFAULT_PROFILES)})",
    )
    up.add_argument(
        "--apiserver-port",
        type=_port,
        default=None,
        help="fixed apiserver port (default: a free one)",
    )
    up.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for each component"
    )
    up.add_argument(
        "--client-qps",
        type=_positive,
        default=None,
        metavar="N",
        help="kube-scheduler's and kube-controller-manager's --kube-api-qps (default: stock, "
        "50 and 20 requests/s); also sets the burst to N unless --client-burst is given",
    )
    up.add_argument(
        "--client-burst",
        type=_positive,
        default=None,
        metavar="N",
        help="their --kube-api-burst (default: stock 100 and 30, or --client-qps)",
    )
    up.add_argument(
        "--agents",
        action="store_true",
        help="also bring each node to life: simulated GPUs of its profile, the kubelet plugin "
        "and a kubelet stand-in (needs `make native`; see docs/node-agents.md)",
    )
    up.add_argument(
        "--runtime",
        choices=("auto", "real", "standin"),
        default="auto",
        help="with --agents: real nodes (kubelet, containerd, runc in the node's own "
        "namespaces; needs root and `make controlplane`) or the kubelet stand-in; auto = real "
        "where this host allows it (see docs/testbed.md)",
    )
    up.add_argument(
        "--controller-args",
        type=_controller_args,
        default=[],
        metavar="'FLAGS'",
        help="with --agents: more flags of the allocation controller, e.g. the cluster default "
        "policies: '--node-policy spread --device-policy binpack --topology link' "
        "(see `vgpu-dra controller --help`)",
    )
    with_dir(sub.add_parser("down", help="stop everything and remove the cluster's files"))
    status = with_dir(sub.add_parser("status", help="components (pid, port, health) and nodes"))
    status.add_argument("--json", action="store_true", help="machine-readable output")
    with_dir(sub.add_parser("env", help="print `export KUBECONFIG=...` for a running cluster"))
    gpus = with_dir(
        sub.add_parser(
            "gpus",
            help="`vgpu-dra status` for this cluster, with its plugins' live metrics",
            description="Runs `vgpu-dra status` with the cluster's kubeconfig and the metrics "
            "URL each running plugin logged; any further flags go to `vgpu-dra status` "
            "(e.g. -o json, --no-discover).",
        )
    )
    del gpus  # its own flags are --dir only; the rest go to `vgpu-dra status` (parse_args)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args, rest = parser.parse_known_args(list(argv))
    if rest and args.command != "gpus":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.status_args = rest  # `gpus`: the flags of `vgpu-dra status`
    return args


def _progress(t0: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f}s] {message}", flush=True)

    return say


def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    say = _progress(t0)
    runtime = "standin"
    if args.agents:
        node_agents.check_prerequisites(args.dir, args.nodes)
        runtime = choose_runtime(args.runtime, say)
    cluster = Cluster.start(
        args.dir,
        args.nodes,
        apiserver_port=args.apiserver_port,
        timeout=args.timeout,
        progress=say,
        client_qps=args.client_qps,
        client_burst=args.client_burst,
    )
    if args.agents:
        from vgpu_testbed.realnode.node import start_real_nodes
        from vgpu_testbed.standin.node_agents import start_node_agents

        if runtime == "real":
            say("starting real nodes: simulated GPUs, containerd, kubelet plugin, kubelet")
        else:
            say("starting node agents: simulated GPUs, kubelet plugin, kubelet stand-in")
        try:
            if runtime == "real":
                for name, real in start_real_nodes(cluster).items():
                    say(f"{name}: real node ready in {real.start_seconds:.1f}s (ip {real.ip})")
            else:
                start_node_agents(cluster)
            say(f"node agents running after {time.monotonic() - t0:.1f}s")
            try_lines = start_policy_path(cluster, args.controller_args, say)
        except BaseException:
            cluster.stop(keep_logs=True)
            raise
        say(f"allocation controller ready after {time.monotonic() - t0:.1f}s")
    for node in cluster.nodes:
        print(f"node {node.name}: profile {node.profile}")
    if args.agents:
        for line in try_lines:
            print(line)
    print(f"logs: {cluster.layout.logs}/   stop with: {PROG} down --dir {args.dir}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def start_policy_path(
    cluster: Cluster, controller_args: Sequence[str], say: Callable[[str], None]
) -> list[str]:
    """The DeviceClass and the allocation controller as a real install has them; returns the
    lines telling how to try the policy path by hand."""
    from dra_driver.kube import KubeClient
    from vgpu_testbed.cluster import controller, webhook
    from vgpu_testbed.realnode.images import SHELL

    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        controller.apply_device_class(client)
    finally:
        client.close()
    say("starting the allocation controller (chart RBAC, own token, leader election)")
    handle = controller.start_controller(cluster, args=controller_args)
    say("registering the admission webhook as the chart does (called at 127.0.0.1)")
    secret = webhook.certificate_secret(handle.namespace, controller.RELEASE)["metadata"]["name"]
    webhook.register_webhooks(
        cluster,
        handle.ports["webhook"],
        webhook.published_ca_bundle(cluster, handle.namespace, secret),
        namespace=handle.namespace,
        release=controller.RELEASE,
    )
    example = controller.write_example(cluster.root, SHELL)
    return [
        *controller.try_it_lines(example, handle),
        f"admission webhook on https://127.0.0.1:{handle.ports['webhook']}: pods written for "
        "vgpu-manager, HAMi, gpu-manager or the device plugin are translated (docs/webhook.md)",
    ]


def choose_runtime(wanted: str, say: Callable[[str], None]) -> str:
    """`real` or `standin`: `auto` takes real nodes where the host allows them, else says why."""
    from vgpu_testbed.realnode.host import check_host

    if wanted == "standin":
        return wanted
    problems = check_host()
    if not problems:
        return "real"
    reason = "; ".join(problems)
    if wanted == "real":
        raise RuntimeError(f"--runtime real is not possible on this host: {reason}")
    say(f"real nodes not possible here ({reason}): using the kubelet stand-in")
    return "standin"


def cmd_down(args: argparse.Namespace) -> int:
    cluster = Cluster.attach(args.dir)
    names = [p.name for p in cluster.processes]
    survivors = cluster.stop()
    if survivors:
        left = ", ".join(f"{p.name} (pid {p.pid})" for p in survivors)
        print(f"{PROG}: error: could not stop {left}; state kept in {args.dir}", file=sys.stderr)
        return 1
    print(f"stopped {', '.join(names) or 'nothing'}; removed {cluster.root}")
    return 0


def render_status(status: ClusterStatus) -> str:
    lines = [f"cluster {status.root}  apiserver {status.server or '-'}"]
    for c in status.components:
        health = {True: "healthy", False: "UNHEALTHY", None: "-"}[c.healthy]
        alive = "running" if c.alive else "DEAD"
        port = str(c.port) if c.port else "-"
        lines.append(f"  {c.name:<26} pid {c.pid:<8} {alive:<8} port {port:<6} {health}")
    for n in status.nodes:
        state = ("Ready" if n.ready else "NotReady") if n.exists else "MISSING"
        lines.append(f"  node {n.name:<21} profile {n.profile:<16} {state}")
    lines.append("overall: " + ("healthy" if status.healthy else "NOT healthy"))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    status = Cluster.attach(args.dir).status()
    if args.json:
        doc = {
            "root": str(status.root),
            "server": status.server,
            "healthy": status.healthy,
            "components": [dataclasses.asdict(c) for c in status.components],
            "nodes": [dataclasses.asdict(n) for n in status.nodes],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(render_status(status))
    return 0 if status.healthy else 1


def cmd_env(args: argparse.Namespace) -> int:
    print(f"export KUBECONFIG={Cluster.attach(args.dir).kubeconfig}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from dra_driver import status as product_status

    # --no-discover: live figures from --metrics-endpoint URLs only, not from the bed either.
    discover = "--no-discover" not in args.status_args
    found = metrics_urls.from_cluster_dir(args.dir) if discover else {}
    kubeconfig = Cluster.attach(args.dir).kubeconfig
    return product_status.main([f"--kubeconfig={kubeconfig}", *args.status_args], endpoints=found)


COMMANDS = {
    "up": cmd_up,
    "down": cmd_down,
    "status": cmd_status,
    "env": cmd_env,
    "gpus": cmd_gpus,
}


def main(argv: Sequence[str]) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exit_:  # argparse already printed usage or help
        return int(exit_.code or 0)
    try:
        return COMMANDS[args.command](args)
    except (
        BinariesMissingError,
        ClusterBusyError,
        PortInUseError,
        ComponentDiedError,
        NotReadyError,
        StateError,
        ValueError,  # also ProfileError
        RuntimeError,  # node agents: NodeAgentError, FakeGpuError; HelmError
        KubeError,  # the controller's RBAC or token refused by the API server
    ) as err:
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"{PROG} {args.command}: interrupted; started components were stopped", file=sys.stderr
        )
        return 130
