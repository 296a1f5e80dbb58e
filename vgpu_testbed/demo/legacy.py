"""The webhook step of `vgpu-dra demo`: a pod written for vgpu-manager runs unchanged.

The controller the policy step started also serves the admission webhook (on 127.0.0.1, its CA
in the chart's Secret); this step registers the chart's webhook configurations with the bed's
API server (`vgpu_testbed.cluster.webhook`), applies vgpu-manager's README example (one GPU,
`vgpu-cores: 10`, `vgpu-memory: 1024`) as written, shows what the API server stored (the legacy
limits gone, a claim from a ResourceClaimTemplate the webhook made), waits until the node's
kubelet plugin prepared it, and shows the caps its vgpu.conf carries: 1 GiB and 10 %.
"""

from __future__ import annotations

import re
from typing import Any

from dra_driver import kube
from dra_driver.kube import RESOURCE_API
from vgpu_testbed.cluster import controller, webhook
from vgpu_testbed.demo.steps import NAMESPACE, DemoContext, wait_prepared

POD = "legacy-vgpu-manager"
LIMITS = {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10",
          "nvidia.com/vgpu-memory": "1024"}  # fmt: skip


def legacy_pod() -> dict[str, Any]:
    """vgpu-manager's README example, as its users write it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": dict(LIMITS)},
                }
            ]
        },
    }


def webhook_port(ctx: DemoContext) -> int:
    """The port the policy step's controller serves the webhook on (from its log)."""
    log = controller.controller_dir(ctx.need_cluster().root) / f"{controller.PROCESS}.log"
    match = re.search(r"webhook on https://127\.0\.0\.1:(\d+)", log.read_text())
    if match is None:
        raise RuntimeError(f"the controller serves no webhook (see {log})")
    return int(match.group(1))


def step_legacy_pod(ctx: DemoContext) -> None:
    cluster, client = ctx.need_cluster(), ctx.need_client()
    port = webhook_port(ctx)
    namespace, release = controller.NAMESPACE, controller.RELEASE
    secret = webhook.certificate_secret(namespace, release)["metadata"]["name"]
    configs = webhook.register_webhooks(
        cluster,
        port,
        webhook.published_ca_bundle(cluster, namespace, secret),
        namespace=namespace,
        release=release,
    )
    names = ", ".join(f"{c['kind']} {c['metadata']['name']}" for c in configs)
    ctx.say(f"registered {names} as the chart renders them, called at 127.0.0.1:{port}")
    ctx.say(
        f"kubectl apply: pod {POD} with limits " + ", ".join(f"{k}: {v}" for k, v in LIMITS.items())
    )
    created = client.create(kube.path("v1", "pods", namespace=NAMESPACE), legacy_pod())
    resources = created["spec"]["containers"][0].get("resources") or {}
    (claim,) = created["spec"]["resourceClaims"]
    ctx.say(f"stored: container resources {resources}")
    source = created["metadata"]["annotations"]["vgpu.dra.dev/translated-from"]
    template_name = claim["resourceClaimTemplateName"]
    ctx.say(
        f"stored: resourceClaims [{claim['name']} from template {template_name}], "
        f"translated-from {source}"
    )
    template = client.get(
        kube.path(
            RESOURCE_API,
            "resourceclaimtemplates",
            template_name,
            namespace=NAMESPACE,
        )
    )
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    ctx.say(
        f"template: {exactly['count']} x {exactly['deviceClassName']}, capacity "
        + ", ".join(f"{k} {v}" for k, v in exactly["capacity"]["requests"].items())
    )
    prepared = ctx.prepared[POD] = wait_prepared(ctx, POD)
    uid = prepared.claim["metadata"]["uid"]
    conf = prepared.agents.paths.claim_dir(uid) / "vgpu.conf"
    devices = [line for line in conf.read_text().splitlines() if line.startswith("device ")]
    ctx.say(f"prepared on {prepared.agents.node_name}; {conf.name}:")
    for line in devices:
        ctx.say(f"  {line}")
    fields = dict(token.split("=", 1) for token in devices[0].split()[1:])
    ctx.results["legacy_pod"] = {
        "memory_bytes": int(fields["memory"]),
        "cores": int(fields["cores"]),
        "node": prepared.agents.node_name,
    }
    ctx.say(
        f"one GPU capped at {int(fields['memory']) >> 20} MiB and {fields['cores']} % (vgpu.conf)"
    )
