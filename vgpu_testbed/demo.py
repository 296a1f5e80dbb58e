"""`vgpu-dra demo`: the end-to-end story on a local dev cluster, one numbered step at a time.

Today's steps: bring up a real control plane with two kubelet-less nodes, show the nodes and
the API, publish a GPU ResourceSlice like our kubelet plugin does, let the real kube-scheduler
place two pods that share one GPU by consumable capacity, show a claim that cannot fit, and
tear everything down (unless --keep). Later issues add steps (simulated GPUs, the kubelet plugin,
the hook enforcing caps) by appending to `STEPS`. Called by dra_driver.cli.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpu_testbed import cluster_example as example
from vgpu_testbed import cluster_nodes
from vgpu_testbed.cluster import BinariesMissingError, Cluster, ClusterBusyError
from vgpu_testbed.cluster_cli import profiles_arg
from vgpu_testbed.cluster_health import ComponentDiedError, NotReadyError

NAMESPACE = "default"
SLICE_NODE = "node-1"


@dataclass
class DemoContext:
    """What steps share: the running cluster, an API client, options and a printer."""

    args: argparse.Namespace
    t0: float = field(default_factory=time.monotonic)
    cluster: Cluster | None = None
    api: Any = None

    def say(self, message: str) -> None:
        print(f"      {message}", flush=True)

    def need_cluster(self) -> Cluster:
        if self.cluster is None:
            raise RuntimeError("no cluster: the bring-up step did not run")
        return self.cluster


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable[[DemoContext], None]


def _wait(what: str, fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def step_bring_up(ctx: DemoContext) -> None:
    root = ctx.args.dir or Path(tempfile.mkdtemp(prefix="vgpu-dra-demo-"))
    ctx.cluster = Cluster.start(
        root,
        ctx.args.nodes,
        die_with_parent=not ctx.args.keep,
        progress=ctx.say,
    )
    ctx.api = ctx.cluster.api_client()


def step_show_cluster(ctx: DemoContext) -> None:
    from kubernetes import client

    version = client.VersionApi(ctx.api).get_code()
    groups = client.ApisApi(ctx.api).get_api_versions().groups
    resource = next((g for g in groups if g.name == "resource.k8s.io"), None)
    served = [v.group_version for v in resource.versions] if resource else ["(not served!)"]
    ctx.say(f"Kubernetes {version.git_version}; DRA API: {', '.join(served)}")
    for node in client.CoreV1Api(ctx.api).list_node().items:
        labels = (node.metadata.labels if node.metadata else None) or {}
        alloc = (node.status.allocatable if node.status else None) or {}
        name = node.metadata.name if node.metadata else "?"
        ctx.say(
            f"{name:<8} profile={labels.get(cluster_nodes.PROFILE_LABEL, '-'):<10} "
            f"cpu={alloc.get('cpu')} memory={alloc.get('memory')} pods={alloc.get('pods')}"
        )


def step_publish_devices(ctx: DemoContext) -> None:
    from kubernetes import client

    res = client.ResourceV1Api(ctx.api)
    res.create_resource_slice(body=example.resource_slice(f"{SLICE_NODE}-demo", SLICE_NODE))
    res.create_device_class(body=example.device_class())
    ctx.say(f"ResourceSlice for {SLICE_NODE}: gpu-0, gpu-1 (80Gi memory, 100 cores, shareable)")
    ctx.say("DeviceClass vgpu.dra.dev selects device.driver == 'vgpu.dra.dev'")


def step_share_a_gpu(ctx: DemoContext) -> None:
    from kubernetes import client

    res = client.ResourceV1Api(ctx.api)
    core = client.CoreV1Api(ctx.api)
    res.create_namespaced_resource_claim_template(
        NAMESPACE, body=example.claim_template("slice-of-gpu", "10Gi", 30)
    )
    ctx.say("ResourceClaimTemplate slice-of-gpu: memory 10Gi, cores 30")
    for name in ("trainer", "notebook"):
        core.create_namespaced_pod(NAMESPACE, body=example.pod(name, "slice-of-gpu"))
    for name in ("trainer", "notebook"):
        result = _wait(f"{name}'s claim", _allocation_probe(ctx, name))
        spec = core.read_namespaced_pod(name, NAMESPACE).spec
        node = spec.node_name if spec else None
        consumed = ", ".join(
            f"{k}={v}" for k, v in sorted((result.consumed_capacity or {}).items())
        )
        ctx.say(
            f"pod {name:<9} -> {node}/{result.device}  consumed {consumed}  "
            f"shareID {result.share_id[:8]}..."
        )


def _allocation_probe(ctx: DemoContext, pod: str) -> Callable[[], Any]:
    return lambda: example.allocation_of(ctx.api, NAMESPACE, pod)


def step_cannot_fit(ctx: DemoContext) -> None:
    from kubernetes import client

    res = client.ResourceV1Api(ctx.api)
    core = client.CoreV1Api(ctx.api)
    res.create_namespaced_resource_claim_template(
        NAMESPACE, body=example.claim_template("too-big", "100Gi", 0)
    )
    core.create_namespaced_pod(NAMESPACE, body=example.pod("greedy", "too-big"))

    def unschedulable() -> str | None:
        pod = core.read_namespaced_pod("greedy", NAMESPACE)
        for cond in (pod.status.conditions if pod.status else None) or []:
            if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                return cond.message or "unschedulable"
        return None

    message = _wait("greedy to be reported unschedulable", unschedulable)
    ctx.say("pod greedy (memory 100Gi > 80Gi per GPU) stays Pending:")
    ctx.say(f"  {message[:150]}")


STEPS: list[Step] = [
    Step(
        "Bring up the control plane (etcd, apiserver, scheduler, controller-manager)", step_bring_up
    ),
    Step("Cluster: version, DRA API, nodes", step_show_cluster),
    Step("Publish shareable GPUs (as the kubelet plugin will)", step_publish_devices),
    Step("Two pods share one GPU through consumable capacity", step_share_a_gpu),
    Step("A claim that cannot fit stays pending", step_cannot_fit),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu-dra demo", description="End-to-end demo on a local dev cluster."
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="cluster directory (default: a new temp dir)"
    )
    parser.add_argument(
        "--nodes",
        type=profiles_arg,
        default=list(cluster_nodes.DEFAULT_PROFILES),
        metavar="PROFILE,PROFILE,...",
        help="simulated GPU profile per node",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster running (stop it with dev-cluster down)",
    )
    return parser


def run_steps(ctx: DemoContext, steps: Sequence[Step]) -> None:
    for number, step in enumerate(steps, start=1):
        started = time.monotonic()
        print(f"[{number}/{len(steps)}] {step.title}", flush=True)
        step.run(ctx)
        print(f"      done in {time.monotonic() - started:.1f}s", flush=True)


def main(argv: Sequence[str]) -> int:
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    ctx = DemoContext(args)
    code = 0
    try:
        run_steps(ctx, STEPS)
        print(f"demo finished in {time.monotonic() - ctx.t0:.1f}s")
    except (BinariesMissingError, ClusterBusyError, ComponentDiedError, NotReadyError) as err:
        print(f"vgpu-dra demo: error: {err}", file=sys.stderr)
        code = 1
    except TimeoutError as err:
        print(f"vgpu-dra demo: error: {err}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("vgpu-dra demo: interrupted", file=sys.stderr)
        code = 130
    finally:
        if ctx.api is not None:
            ctx.api.close()
        if ctx.cluster is not None:
            if args.keep and code == 0:
                root = ctx.cluster.root
                print(
                    f"cluster kept in {root}; stop it with: vgpu-dra dev-cluster down --dir {root}"
                )
                print(f"export KUBECONFIG={ctx.cluster.kubeconfig}")
            else:
                ctx.cluster.stop()
                print("cluster stopped and removed")
    return code
