"""The writes of a cluster start that are not processes: credentials on disk, Node objects and
the wait for the `default` ServiceAccount.

Split from `vgpu_testbed.cluster.control_plane` (which sequences the start) so each step is readable
alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vgpu_testbed.cluster import identities as cluster_files
from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.cluster.flags import Layout
from vgpu_testbed.cluster.state import NodeRecord

CLUSTER_NAME = "vgpu-dra-testbed"


def write_credentials(
    layout: Layout, server: str, ca_cert: Path, specs: list[cluster_nodes.NodeSpec]
) -> tuple[dict[str, cluster_files.Identity], list[NodeRecord]]:
    """Token file + one kubeconfig per identity (admin, scheduler, controller-manager, each
    node). Returns the identities by key and the node records for the state file."""
    idents = [
        cluster_files.admin_identity(),
        cluster_files.scheduler_identity(),
        cluster_files.controller_manager_identity(),
    ] + [cluster_files.node_identity(s.name) for s in specs]
    cluster_files.write_private(layout.token_file, cluster_files.render_token_file(idents))
    ca_pem = ca_cert.read_bytes()
    for ident in idents:
        path = layout.kubeconfig if ident.key == "admin" else layout.component_kubeconfig(ident.key)
        text = cluster_files.render_kubeconfig(
            server=server, ca_pem=ca_pem, identity=ident, cluster=CLUSTER_NAME
        )
        cluster_files.write_private(path, text)
    nodes = [
        NodeRecord(
            name=s.name,
            profile=s.profile,
            kubeconfig=str(layout.component_kubeconfig(f"node-{s.name}")),
        )
        for s in specs
    ]
    return {i.key: i for i in idents}, nodes


def create_nodes(api_client: Any, specs: list[cluster_nodes.NodeSpec]) -> None:
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


def default_service_account_exists(api_client: Any) -> tuple[bool, str]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api_client).read_namespaced_service_account("default", "default")
    except ApiException as err:
        return False, f"{err.status} {err.reason}"
    return True, "exists"
