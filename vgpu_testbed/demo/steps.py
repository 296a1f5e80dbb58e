"""The Kubernetes-side steps of `vgpu-dra demo` and the `DemoContext` every step shares.

1. bring up the control plane and every node: simulated GPUs and our kubelet plugin, with the
   real kubelet, containerd and runc (`--runtime real`, vgpu_testbed.realnode) or the kubelet
   stand-in; 2. show the ResourceSlices our plugin published; 3. apply
   deploy/deviceclass.yaml and deploy/examples/*.yaml as files and wait until kube-scheduler
   allocated and the plugin prepared every pod; 4. show what prepare wrote for the shared pod;
6. delete that pod and watch the plugin release its claim. Step 5 (the caps inside the
container) is vgpu_testbed.demo.caps. Tables and parsing live in vgpu_testbed.demo.report
(pure); the step list, runner, options and teardown in vgpu_testbed.demo.cli.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.names import DEFAULT_DRIVER_NAME, DriverNames
from kubelet_plugin.checkpoint import CheckpointJournal
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.demo import report
from vgpu_testbed.polling import wait_for
from vgpu_testbed.standin.node_agents import NodeAgents, start_node_agents

REPO_ROOT = Path(__file__).resolve().parents[2]
DEVICE_CLASS = REPO_ROOT / "deploy" / "deviceclass.yaml"
EXAMPLES_DIR = REPO_ROOT / "deploy" / "examples"
NAMESPACE = "default"
SHARED_POD = "shared-gpu"  # the example whose claim step 4 and 5 look into
UNCAPPED_POD = "whole-gpu"  # the comparison run: a whole GPU, no SM cap
CDI_KIND = DriverNames(DEFAULT_DRIVER_NAME).cdi_kind

KIND_PATHS = {
    "DeviceClass": (RESOURCE_API, "deviceclasses", False),
    "ResourceClaimTemplate": (RESOURCE_API, "resourceclaimtemplates", True),
    "ResourceClaim": (RESOURCE_API, "resourceclaims", True),
    "Pod": ("v1", "pods", True),
}


@dataclass
class Prepared:
    """One example pod after prepare: the API objects and the node that prepared it."""

    pod: dict[str, Any]
    claim: dict[str, Any]
    record: dict[str, Any]
    agents: NodeAgents
    placement: report.Placement


@dataclass
class DemoContext:
    """What steps share: options, the running cluster, its node agents, what was prepared."""

    args: argparse.Namespace
    runtime: str = "standin"  # "real" or "standin", chosen by the CLI before bring-up
    t0: float = field(default_factory=time.monotonic)
    root: Path | None = None  # the cluster directory, known before the cluster is up
    cluster: Cluster | None = None
    client: KubeClient | None = None
    agents: dict[str, NodeAgents] = field(default_factory=dict)
    devices: dict[tuple[str, str], report.DeviceRow] = field(default_factory=dict)
    prepared: dict[str, Prepared] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)  # figures for the summary

    def say(self, message: str = "") -> None:
        print(f"      {message}".rstrip(), flush=True)

    def need_cluster(self) -> Cluster:
        if self.cluster is None:
            raise RuntimeError("no cluster: the bring-up step did not run")
        return self.cluster

    def need_client(self) -> KubeClient:
        if self.client is None:
            raise RuntimeError("no API client: the bring-up step did not run")
        return self.client

    def need_prepared(self, pod: str) -> Prepared:
        if pod not in self.prepared:
            raise RuntimeError(f"pod {pod} was not prepared (deploy/examples/{pod}.yaml missing?)")
        return self.prepared[pod]


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable[[DemoContext], None]


# ---------------------------------------------------------------- 1. bring-up


def step_bring_up(ctx: DemoContext) -> None:
    root = ctx.args.dir or Path(tempfile.mkdtemp(prefix="vgpu-dra-demo-"))
    ctx.root = Path(root).resolve()
    ctx.cluster = Cluster.start(
        root, ctx.args.nodes, die_with_parent=not ctx.args.keep, progress=ctx.say
    )
    ctx.client = KubeClient.from_kubeconfig(str(ctx.cluster.kubeconfig))
    pids = {}
    if ctx.runtime == "real":
        from vgpu_testbed.realnode.node import start_real_nodes

        ctx.say("starting real nodes: simulated GPUs, containerd + runc, kubelet plugin, kubelet")
        real = start_real_nodes(ctx.cluster)
        ctx.agents = dict(real)
        pids = {p.name: p.pid for p in ctx.cluster.processes}
        for name, node in real.items():
            ctx.say(
                f"{name}: simulated {node.profile}, real node ready in {node.start_seconds:.1f}s "
                f"(ip {node.ip}): kubelet pid {pids.get(node.kubelet_process)}, containerd pid "
                f"{pids.get(node.containerd_process)}, kubelet-plugin pid "
                f"{pids.get(node.plugin_process)}"
            )
        ctx.results["node_start_s"] = {n: round(r.start_seconds, 2) for n, r in real.items()}
        return
    ctx.say("starting node agents: simulated GPUs, kubelet plugin, kubelet stand-in")
    ctx.agents = start_node_agents(ctx.cluster)
    pids = {p.name: p.pid for p in ctx.cluster.processes}
    for name, agents in ctx.agents.items():
        ctx.say(
            f"{name}: simulated {agents.profile}, kubelet-plugin pid "
            f"{pids.get(agents.plugin_process)}, kubelet stand-in pid "
            f"{pids.get(agents.standin_process)}"
        )


# ---------------------------------------------------------------- 2. published devices


def step_show_slices(ctx: DemoContext) -> None:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    client = ctx.need_client()
    slices_path = kube.path(RESOURCE_API, "resourceslices")
    expected = {
        name: len(fakegpu.load_profile(agents.profile).gpus) for name, agents in ctx.agents.items()
    }

    def published() -> list[dict[str, Any]] | None:
        objs = client.list(slices_path, field_selector=f"spec.driver={DEFAULT_DRIVER_NAME}")
        counts = {n: 0 for n in expected}
        for obj in objs:
            node = obj["spec"].get("nodeName")
            if node in counts:
                counts[node] += len(obj["spec"].get("devices") or [])
        return objs if counts == expected else None

    slices = wait_for("every node's ResourceSlices", published)
    rows = report.device_rows(slices)
    ctx.devices = {(r.node, r.device): r for r in rows}
    for line in report.device_table(rows):
        ctx.say(line)
    ctx.say(
        "every device: allowMultipleAllocations=true; consumable capacity `memory` (bytes) "
        "and `cores` (% of SMs)"
    )


# ---------------------------------------------------------------- 3. examples


def apply_manifest(
    client: KubeClient,
    manifest: Path,
    namespace: str,
    pod_edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> list[str]:
    """Create every object of a YAML file (pods through `pod_edit` when given); returns
    `Kind/name` for each."""
    created = []
    for loaded in yaml.safe_load_all(manifest.read_text()):
        if not loaded:
            continue
        kind = loaded.get("kind")
        doc = pod_edit(loaded) if kind == "Pod" and pod_edit is not None else loaded
        if kind not in KIND_PATHS:
            raise ValueError(f"{manifest}: kind {kind!r} is not one the demo knows how to apply")
        api, plural, namespaced = KIND_PATHS[kind]
        client.create(kube.path(api, plural, namespace=namespace if namespaced else None), doc)
        created.append(f"{kind}/{doc['metadata']['name']}")
    return created


def example_pods(manifest: Path) -> list[str]:
    return [
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all(manifest.read_text())
        if doc and doc.get("kind") == "Pod"
    ]


def step_apply_examples(ctx: DemoContext) -> None:
    client = ctx.need_client()
    created = apply_manifest(client, DEVICE_CLASS, NAMESPACE)
    ctx.say(f"kubectl apply -f {DEVICE_CLASS.relative_to(REPO_ROOT)}: {', '.join(created)}")
    manifests = sorted(EXAMPLES_DIR.glob("*.yaml"))
    pods: list[str] = []
    pod_edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    if ctx.runtime == "real":
        from vgpu_testbed.demo.runtime import WORKLOAD, real_pod
        from vgpu_testbed.torchapp import find_torch

        torch = find_torch()

        def pod_edit(doc: dict[str, Any]) -> dict[str, Any]:
            # The shared pod also gets the torch environment, for step 5 (d).
            return real_pod(doc, torch if doc["metadata"]["name"] == SHARED_POD else None)

        ctx.say(f"(real nodes: each pod's image is {WORKLOAD}, never pulled, running `sleep`)")
        if torch is not None:
            ctx.say(f"(pod {SHARED_POD} also mounts the torch environment read-only: {torch.venv})")
    for manifest in manifests:
        created = apply_manifest(client, manifest, NAMESPACE, pod_edit)
        pods += example_pods(manifest)
        ctx.say(f"kubectl apply -f {manifest.relative_to(REPO_ROOT)}: {', '.join(created)}")
    if ctx.runtime == "real":
        ctx.say("waiting for kube-scheduler to allocate, the kubelet to have the plugin prepare,")
        ctx.say("and containerd to start every pod ...")
    else:
        ctx.say("waiting for kube-scheduler to allocate and the kubelet plugin to prepare ...")
    for name in pods:
        ctx.prepared[name] = wait_prepared(ctx, name)
    ctx.say()
    placements = [ctx.prepared[p].placement for p in pods]
    for line in report.placement_table(placements):
        ctx.say(line)
    for line in report.shared_devices(placements):
        ctx.say(line)
    shared = ctx.prepared.get(SHARED_POD)
    if shared is not None:
        for device in shared.placement.devices:
            row = ctx.devices.get((shared.placement.node, device))
            if row is not None:
                ctx.say(report.remaining_line(row, placements))
    ctx.results["prepared_pods"] = sorted(ctx.prepared)


def wait_prepared(ctx: DemoContext, pod_name: str) -> Prepared:
    """Wait until the pod is bound, its claim allocated, and its node prepared it: on a real node
    the pod is Ready (its container runs) and the kubelet recorded the claim's CDI devices; on
    the stand-in, the stand-in recorded a successful NodePrepareResources (and marks the pod
    Running)."""
    client = ctx.need_client()
    timeout = float(ctx.args.wait_timeout)
    pod_path = kube.path("v1", "pods", pod_name, namespace=NAMESPACE)

    def check() -> Prepared | None:
        pod = client.get(pod_path)
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or node not in ctx.agents:
            return None
        agents = ctx.agents[node]
        if ctx.runtime == "real":
            return _real_prepared(client, pod, agents)
        try:
            record = json.loads(agents.paths.pod_record(NAMESPACE, pod_name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        errors = [c.get("error") for c in record.get("claims") or [] if c.get("error")]
        if errors:
            raise RuntimeError(f"kubelet plugin on {node} failed to prepare {pod_name}: {errors}")
        if not record.get("ready") or record.get("uid") != pod["metadata"]["uid"]:
            return None
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if len(statuses) != 1:
            raise RuntimeError(
                f"the demo expects one claim per example pod; {pod_name} has {statuses}"
            )
        claim = client.get(
            kube.path(
                RESOURCE_API,
                "resourceclaims",
                statuses[0]["resourceClaimName"],
                namespace=NAMESPACE,
            )
        )
        return Prepared(pod, claim, record, agents, report.placement(pod, claim, record))

    try:
        return wait_for(f"pod {pod_name} to be scheduled and prepared", check, timeout)
    except TimeoutError as err:
        raise TimeoutError(f"{err}; {report.pod_state(client.get(pod_path))}") from None


def _real_prepared(client: KubeClient, pod: dict[str, Any], agents: NodeAgents) -> Prepared | None:
    from vgpu_testbed.demo.runtime import kubelet_record, pod_ready
    from vgpu_testbed.realnode.node import RealNode

    name = pod["metadata"]["name"]
    if not pod_ready(pod) or not isinstance(agents, RealNode):
        return None
    claim = _only_claim(client, pod)
    record = kubelet_record(agents, pod, claim["metadata"]["uid"])
    if record is None:
        raise RuntimeError(f"pod {name} is Ready but the kubelet recorded no prepared claim")
    return Prepared(pod, claim, record, agents, report.placement(pod, claim, record))


def _only_claim(client: KubeClient, pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    if len(statuses) != 1:
        raise RuntimeError(
            f"the demo expects one claim per example pod; {pod['metadata']['name']} has {statuses}"
        )
    return client.get(
        kube.path(
            RESOURCE_API, "resourceclaims", statuses[0]["resourceClaimName"], namespace=NAMESPACE
        )
    )


# ---------------------------------------------------------------- 4. what prepare wrote


def step_show_prepared_claim(ctx: DemoContext) -> None:
    shared = ctx.need_prepared(SHARED_POD)
    uid = shared.claim["metadata"]["uid"]
    paths = shared.agents.paths
    conf = paths.claim_dir(uid) / "vgpu.conf"
    ctx.say(f"claim {shared.claim['metadata']['name']} (uid {uid}) on {shared.agents.node_name}")
    ctx.say(f"{conf}:")
    for line in conf.read_text().splitlines():
        if line.startswith("device "):
            ctx.say(f"  {line}")
    ctx.say("CDI device IDs returned to the kubelet:")
    for cdi_id in shared.placement.cdi_ids:
        ctx.say(f"  {cdi_id}")
    spec_path = paths.cdi_spec(uid)
    ctx.say(f"{spec_path}:")
    for line in report.cdi_summary(json.loads(spec_path.read_text())):
        ctx.say(f"  {line}")


# ---------------------------------------------------------------- 6. release


def step_release(ctx: DemoContext) -> None:
    """Delete the shared pod: the kubelet (or the stand-in) sees it terminating, stops its
    container (real nodes), calls NodeUnprepareResources,
    the plugin removes the claim's files and checkpoint entry, and the pod and its generated
    claim go away."""
    client = ctx.need_client()
    shared = ctx.need_prepared(SHARED_POD)
    uid = shared.claim["metadata"]["uid"]
    paths = shared.agents.paths
    started = time.monotonic()
    client.delete(kube.path("v1", "pods", SHARED_POD, namespace=NAMESPACE))
    ctx.say(f"kubectl delete pod {SHARED_POD}")

    def released() -> bool:
        checkpoint = CheckpointJournal(str(paths.checkpoint.parent)).load()
        return not (
            paths.cdi_spec(uid).exists() or paths.claim_dir(uid).exists() or uid in checkpoint
        )

    wait_for(f"the plugin to unprepare claim {uid}", released, float(ctx.args.wait_timeout))
    unprepared = time.monotonic() - started
    ctx.say(
        f"claim unprepared after {unprepared:.1f}s: CDI spec, claim dir and checkpoint entry "
        "removed"
    )
    claim_path = kube.path(
        RESOURCE_API, "resourceclaims", shared.claim["metadata"]["name"], namespace=NAMESPACE
    )
    pod_path = kube.path("v1", "pods", SHARED_POD, namespace=NAMESPACE)
    wait_for(
        f"pod {SHARED_POD} and its claim to be deleted",
        lambda: _gone(client, pod_path) and _gone(client, claim_path),
        float(ctx.args.wait_timeout),
    )
    memory = shared.placement.memory[0]
    ctx.say(
        f"pod and ResourceClaim {shared.claim['metadata']['name']} deleted after "
        f"{time.monotonic() - started:.1f}s; its "
        f"{'-' if memory is None else report.human_bytes(memory)} share of "
        f"{shared.agents.node_name}/{shared.placement.devices[0]} is free again"
    )
    ctx.results["release_s"] = round(unprepared, 2)


def _gone(client: KubeClient, resource_path: str) -> bool:
    try:
        client.get(resource_path)
    except kube.NotFound:
        return True
    return False
