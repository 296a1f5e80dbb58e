"""The demo's observability step: `vgpu-dra status` and the shared pod's metrics.

Every node's kubelet plugin in the test bed serves metrics on a free loopback port and logs the
URL (`NodeAgents.metrics_url()`; on a real node that port is on the node's own loopback, so
the demo reads it from inside the node's network namespace). This step shows what an operator
would look at after the workloads of step 5: the status table of the cluster (ResourceSlices +
allocated claims, with live figures from those URLs; `dra_driver.status`, the code behind
`vgpu-dra status`) and the Prometheus series of the shared pod's claim (its caps, memory
held, last measured utilisation and the time the hook throttled it). Called from
vgpu_testbed.demo.cli.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from dra_driver import status as status_cmd
from dra_driver.metrics_endpoints import Endpoint
from dra_driver.names import DEFAULT_DRIVER_NAME
from vgpu_testbed.demo.steps import SHARED_POD, DemoContext, Prepared
from vgpu_testbed.demo.workloads import holding
from vgpu_testbed.standin.node_agents import NodeAgents

HELD = 300 << 20  # what a program of the shared pod holds while its metrics are shown

CLAIM_SERIES = (
    "vgpu_dra_claim_memory_limit_bytes",
    "vgpu_dra_claim_memory_used_bytes",
    "vgpu_dra_claim_cores_limit_ratio",
    "vgpu_dra_claim_utilization_ratio",
    "vgpu_dra_claim_throttled_seconds_total",
    "vgpu_dra_claim_processes",
)


def step_observe(ctx: DemoContext) -> None:
    client = ctx.need_client()
    urls = {
        node: url for node, agents in sorted(ctx.agents.items()) if (url := agents.metrics_url())
    }
    # A real node's plugin serves on the node's own loopback: read it from inside the node.
    endpoints = {node: _endpoint(ctx.agents[node], url) for node, url in urls.items()}
    shared = ctx.need_prepared(SHARED_POD)
    claim_name = shared.claim["metadata"]["name"]
    node_name = shared.pod["spec"]["nodeName"]
    url = urls.get(node_name)
    flags = " ".join(f"--metrics-endpoint {node}={where}" for node, where in urls.items())
    with _holding(ctx, shared):
        ctx.say(f"$ vgpu-dra status {flags}")
        current = status_cmd.collect(client, driver=DEFAULT_DRIVER_NAME, endpoints=endpoints)
        for line in status_cmd.render_table(current).splitlines():
            ctx.say("  " + line)
        if url is None:
            ctx.say(f"no metrics endpoint for pod {SHARED_POD}'s node: nothing more to show")
            return
        ctx.say(f"$ curl -s {url} | grep 'claim=\"{claim_name}\"'")
        endpoint = endpoints[node_name]
        samples = (
            status_cmd.fetch_metrics(endpoint)
            if isinstance(endpoint, str)
            else status_cmd.parse_metrics(endpoint.fetch())
        )
    for name, labels, value in samples:
        if name in CLAIM_SERIES and labels.get("claim") == claim_name:
            shown = ",".join(
                f'{k}="{labels[k]}"' for k in ("namespace", "pod", "claim", "device") if k in labels
            )
            text = f"{value:.0f}" if value.is_integer() else f"{value:.4g}"
            ctx.say(f"  {name}{{{shown}}} {text}")


def _endpoint(agents: NodeAgents, url: str) -> str | Endpoint:
    from vgpu_testbed.realnode.node import RealNode

    if isinstance(agents, RealNode):
        from vgpu_testbed.demo.runtime import metrics_endpoint

        return metrics_endpoint(agents, url)
    return url


@contextlib.contextmanager
def _holding(ctx: DemoContext, shared: Prepared) -> Iterator[None]:
    """A program in the shared pod's container holds HELD bytes (root only, as step 5)."""
    if os.geteuid() != 0:
        yield
        return
    from vgpu_testbed.demo.caps import claim_container

    container = claim_container(shared)
    with holding(container, [container.program("cuda_hold"), "0", str(HELD)]) as holder:
        assert holder.stdout is not None
        ready = holder.stdout.readline().strip()
        ctx.say(f"a program of pod {SHARED_POD} holds {HELD >> 20} MiB ({ready})")
        yield
