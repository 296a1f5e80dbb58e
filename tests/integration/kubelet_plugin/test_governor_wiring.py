"""The governor inside the plugin process takes its caps from the claims the plugin prepared.

`vgpu-dra kubelet-plugin` (governor on, as by default) runs on a simulated node (fake NVML loaded
by the real loader) against the real API server. Two claims on GPU 0 are prepared through the
DRA gRPC socket, as the kubelet would: one with `cores: 30`, one without a compute cap. Each gets
a region in its claim dir, as the hook creates when a process of the claim starts.

What this proves: the governor (kubelet_plugin.main's wiring, `caps_of_prepared(preparer.prepared)`)
picks up the capped claim it was never told about except through prepare, and takes over its
device (rate source GOVERNOR, fresh stamp); it leaves the uncapped claim's region alone; and it
does so without reading vgpu.conf (the capped claim's file is emptied before its region exists).
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path
from typing import Any

from dra_driver import kube
from kubelet_plugin import region as rg
from tests.fixtures.claimdata import NODE, create_allocated_claim, result
from tests.fixtures.regions import write_region
from tests.fixtures.simulated import require_simulated_gpus, simulated_node_env
from tests.integration.kubelet_plugin.conftest import (
    plugin_process,
    plugin_process_argv,
    prepare,
    wait_for,
)


def device_record(path: Path) -> tuple[int, int, int]:
    """(rate source, governor stamp, rate) of the region's first device."""
    with rg.Region(str(path)) as region:
        device = region.layout.devices[0]
        return int(device.rate_source), int(device.governor_stamp_ns), int(device.rate)


def test_the_plugins_governor_caps_exactly_the_prepared_capped_claims(
    cluster: Any, kube_client: kube.KubeClient, namespace: str
) -> None:
    from vgpu_testbed.fakegpu.profiles import load_profile

    require_simulated_gpus()
    profile = load_profile("l4-2")
    root = Path(tempfile.mkdtemp(prefix="vgpu-gov-"))
    gpu_env = simulated_node_env(root)
    argv = plugin_process_argv(root, cluster.kubeconfig, NODE, "--no-nvidia-cdi")
    dra = root / "plugins" / "vgpu.dra.dev" / "dra.sock"
    log_path = root / "plugin.log"
    with plugin_process(argv, gpu_env, log_path) as proc:
        wait_for(lambda: "governor running" in log_path.read_text(), what="the governor to start")
        capped = create_allocated_claim(
            kube_client, namespace, [result("gpu-0", memory="1Gi", cores=30)]
        )
        uncapped = create_allocated_claim(kube_client, namespace, [result("gpu-0", memory="1Gi")])
        assert prepare(dra, [capped, uncapped]) == {capped.uid: "", uncapped.uid: ""}
        claims = root / "state" / "claims"
        (claims / capped.uid / "vgpu.conf").write_text("")  # the governor must not need it
        uuid = profile.gpus[0].uuid
        # As the hook would: each region starts paced by its own (in-process) rate.
        capped_region = write_region(claims / capped.uid / "region", uuid, 30, rate=5000)
        uncapped_region = write_region(claims / uncapped.uid / "region", uuid, 0, rate=5000)

        def governed() -> bool:
            source, stamp, _ = device_record(capped_region)
            return source == rg.RATE_GOVERNOR and stamp > 0

        wait_for(governed, what="the governor to take over the capped claim's device")
        assert device_record(uncapped_region) == (0, 0, 5000)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
