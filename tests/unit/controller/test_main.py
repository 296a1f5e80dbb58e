"""The controller's flags and their environment twins: leader election as the chart passes it,
the Lease's namespace from the pod's, cluster default policies under the pod's annotations."""

from __future__ import annotations

import pytest

from controller.main import DEFAULT_LEASE_NAME, build_parser
from controller.reconciler import POLICY_ANNOTATIONS, Defaults
from dra_driver.allocator.request import RequestError


def test_leader_election_from_the_chart_environment() -> None:
    args = build_parser({"VGPU_DRA_LEADER_ELECT": "true", "POD_NAMESPACE": "vgpu"}).parse_args([])
    assert args.leader_elect is True
    assert (args.lease_namespace, args.lease_name) == ("vgpu", DEFAULT_LEASE_NAME)
    args = build_parser({}).parse_args([])
    assert args.leader_elect is False and args.lease_namespace == "default"
    args = build_parser({"VGPU_DRA_LEASE_NAMESPACE": "other", "POD_NAMESPACE": "vgpu"}).parse_args(
        ["--leader-elect", "--lease-name", "x"]
    )
    assert (args.leader_elect, args.lease_namespace, args.lease_name) == (True, "other", "x")
    args = build_parser({"VGPU_DRA_LEADER_ELECT": "true"}).parse_args(["--leader-elect=false"])
    assert args.leader_elect is False


def test_bad_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["--leader-elect=maybe"])
    assert "expected true or false" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["--node-policy", "fill"])
    assert "--node-policy" in capsys.readouterr().err


def test_cluster_defaults_yield_to_the_pods_annotations() -> None:
    args = build_parser({"VGPU_DRA_TOPOLOGY": "link"}).parse_args(["--node-policy", "spread"])
    defaults = Defaults(
        {
            POLICY_ANNOTATIONS["node_policy"]: args.node_policy,
            POLICY_ANNOTATIONS["device_policy"]: args.device_policy,
            POLICY_ANNOTATIONS["topology"]: args.topology,
        }
    )
    plain = defaults.policy_for({"metadata": {}})
    assert (plain.node, plain.device, plain.topology) == ("spread", "spread", "link")
    own = defaults.policy_for(
        {"metadata": {"annotations": {"vgpu.dra.dev/node-policy": "binpack"}}}
    )
    assert (own.node, own.topology) == ("binpack", "link")


def test_the_issues_long_annotation_names_are_canonical_and_the_short_ones_aliases() -> None:
    defaults = Defaults({POLICY_ANNOTATIONS["node_policy"]: "binpack"})
    long_names = {
        "vgpu.dra.dev/node-scheduler-policy": "spread",
        "vgpu.dra.dev/device-scheduler-policy": "binpack",
        "vgpu.dra.dev/device-topology-mode": "link-strict",
        "vgpu.dra.dev/include-gpu-type": "H100",
        "vgpu.dra.dev/exclude-gpu-type": "A10",
        "vgpu.dra.dev/include-gpu-uuid": "GPU-1",
        "vgpu.dra.dev/exclude-gpu-uuid": "GPU-2",
    }
    short_names = {
        "vgpu.dra.dev/node-policy": "spread",
        "vgpu.dra.dev/device-policy": "binpack",
        "vgpu.dra.dev/topology": "link-strict",
        "vgpu.dra.dev/gpu-type": "H100",
        "vgpu.dra.dev/exclude-gpu-type": "A10",
        "vgpu.dra.dev/gpu-uuid": "GPU-1",
        "vgpu.dra.dev/exclude-gpu-uuid": "GPU-2",
    }
    for given in (long_names, short_names):
        policy = defaults.policy_for({"metadata": {"annotations": given}})
        assert (policy.node, policy.device, policy.topology) == ("spread", "binpack", "link-strict")
        assert (policy.include_types, policy.exclude_types) == (("h100",), ("a10",))
        assert (policy.include_uuids, policy.exclude_uuids) == (("gpu-1",), ("gpu-2",))
    # The canonical name wins over its alias, whichever order they come in.
    both = {"vgpu.dra.dev/node-policy": "binpack", "vgpu.dra.dev/node-scheduler-policy": "spread"}
    assert defaults.policy_for({"metadata": {"annotations": both}}).node == "spread"
    # A bad value names the annotation as the pod wrote it.
    for name in ("vgpu.dra.dev/topology", "vgpu.dra.dev/device-topology-mode"):
        with pytest.raises(RequestError, match=f"{name}='ring'"):
            defaults.policy_for({"metadata": {"annotations": {name: "ring"}}})
