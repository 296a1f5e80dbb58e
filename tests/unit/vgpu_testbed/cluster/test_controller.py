"""The test bed's allocation controller, the parts that need no cluster.

What this proves:
1. --controller-args are checked by the controller's own parser (a bad policy is refused with the
   parser's reason) and may not override what the bed sets (credentials, probes, the Lease).
2. `dev-cluster status` probes a controller process's /readyz on its recorded port (also a second
   replica's), and nothing else among the extra processes.
3. The example pod `up` prints opts into the policy path (the gate, binpack annotations), asks
   for a share through a claim template of the `vgpu.dra.dev` class and runs on real nodes
   without a registry (imagePullPolicy Never).
4. A failed start keeps the controller's log directory with the logs; a clean teardown removes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.cluster.directory import remove_owned
from vgpu_testbed.cluster.flags import Layout
from vgpu_testbed.cluster.status import health_url
from vgpu_testbed.procs import ProcessRecord


def test_controller_args_use_the_controllers_parser() -> None:
    args = ["--node-policy", "spread", "--device-policy=binpack", "--topology", "link"]
    assert bed_controller.check_controller_args(args) == args
    with pytest.raises(ValueError, match="invalid choice: 'fullest'"):
        bed_controller.check_controller_args(["--node-policy", "fullest"])
    with pytest.raises(ValueError, match="unrecognized arguments: --frobnicate"):
        bed_controller.check_controller_args(["--frobnicate"])


@pytest.mark.parametrize("flag", ["--kubeconfig=/x", "--lease-name", "--leader-elect"])
def test_controller_args_cannot_override_the_bed(flag: str) -> None:
    with pytest.raises(ValueError, match="is set by the test bed"):
        bed_controller.check_controller_args([flag, "x"])


def _record(name: str, port: int | None) -> ProcessRecord:
    return ProcessRecord(
        name=name, pid=1, start_ticks=1, argv=["x"], log_path="/dev/null", port=port
    )


def test_status_probes_controller_readiness() -> None:
    server = "https://127.0.0.1:6443"
    assert health_url(_record("vgpu-dra-controller", 8081), server) == (
        "http://127.0.0.1:8081/readyz"
    )
    assert health_url(_record("vgpu-dra-controller-2", 8082), server) == (
        "http://127.0.0.1:8082/readyz"
    )
    assert health_url(_record("kubelet-plugin-node-1", 9000), server) is None


def test_example_pod_is_on_the_policy_path() -> None:
    template, pod = bed_controller.example_policy_pod("vgpu-dra.local/shell:bed")
    assert pod["spec"]["schedulingGates"] == [{"name": "vgpu.dra.dev/policy"}]
    annotations = pod["metadata"]["annotations"]
    assert annotations["vgpu.dra.dev/device-scheduler-policy"] == "binpack"
    (container,) = pod["spec"]["containers"]
    assert container["imagePullPolicy"] == "Never"
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "vgpu.dra.dev"
    assert request["exactly"]["capacity"]["requests"] == {"memory": "2Gi", "cores": "10"}


def test_controller_logs_are_kept_like_logs(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "c")
    for entry in ("logs", "controller", "kubeconfigs"):
        (layout.root / entry).mkdir(parents=True)
        (layout.root / entry / "f").write_text("x")
    remove_owned(layout, keep_logs=True)
    assert sorted(p.name for p in layout.root.iterdir()) == ["controller", "logs"]
    remove_owned(layout, keep_logs=False)
    assert not layout.root.exists()
