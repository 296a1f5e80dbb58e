"""The bed's MIG switch of a node (`NodeAgents(mig_mode=...)`; docs/testbed.md, "A node in MIG
mode"): the plugin gets `--mig-mode`, and the stop of such a node removes the simulated GPUs'
state so MIG does not outlive it; a node started without it keeps its state, as before."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vgpu_testbed.cluster.state import NodeRecord
from vgpu_testbed.procs import ProcessRecord
from vgpu_testbed.standin.node_agents import NodeAgents


@dataclass
class Bed:
    """What NodeAgents reads of a Cluster: its root, nodes and (no) processes."""

    root: Path
    nodes: list[NodeRecord] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)


def agents(tmp_path: Path, mig_mode: str | None) -> NodeAgents:
    bed = Bed(tmp_path, [NodeRecord(name="node-1", profile="dgx-h100", kubeconfig="k")])
    node = NodeAgents(bed, "node-1", mig_mode=mig_mode)  # type: ignore[arg-type]
    node.paths.root.mkdir(parents=True)
    node.paths.gpu_state.write_bytes(b"state")
    return node


@pytest.mark.parametrize("mode", ["dynamic", "0=dynamic,1=off"])
def test_mig_node_gets_the_flag_and_forgets_its_state(tmp_path: Path, mode: str) -> None:
    node = agents(tmp_path, mode)
    argv = node.plugin_argv()
    assert argv[argv.index("--mig-mode") + 1] == mode
    node.stop()
    assert not node.paths.gpu_state.exists()


def test_plain_node_keeps_its_state(tmp_path: Path) -> None:
    node = agents(tmp_path, None)
    assert "--mig-mode" not in node.plugin_argv()
    node.stop()
    assert node.paths.gpu_state.read_bytes() == b"state"
