"""The plugin process's /metrics after a known workload, on a simulated node.

`vgpu-dra kubelet-plugin --metrics-address 127.0.0.1:0` runs on simulated GPUs (fake NVML and
CUDA) against the real API server. A claim capped at 1 GiB on gpu-0 is prepared through the DRA
socket, as the kubelet would; a CUDA program then runs with the CDI spec the plugin wrote
(vgpu_testbed.container: the hook preloaded as in a real container) and holds 300 MiB.

What this proves: the scrape, parsed with Prometheus' own text parser, reports the claim's cap
(1 GiB) and its usage (300 MiB, read from the region the hook maintains), the GPU's physical
usage from NVML, one live process; after the program is SIGKILLed the claim's usage drops back to
0 without anyone reclaiming the slot; the log line that names the URL is key=value; and every
supervised loop of the process (governor, enforcement, GPU rescan and health watch, socket watch)
is exported by name, none failed or stalled.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dra_driver import cdi, kube
from tests.fixtures.claimdata import NODE, create_allocated_claim, result
from tests.fixtures.probe import holding_memory
from tests.fixtures.simulated import CONTAINERS, require_simulated_gpus
from tests.integration.kubelet_plugin.conftest import (
    KIND,
    ROOT,
    plugin_process,
    plugin_process_argv,
    prepare,
    wait_for,
)

HOOK_DIR = ROOT / "vgpu_hook"
HOOK_LIB = HOOK_DIR / "build" / "libvgpu.so"
MIB = 1 << 20
GIB = 1 << 30


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def one(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **want: str
) -> float:
    found = [v for (n, labels), v in samples.items() if n == name and set(want.items()) <= labels]
    assert len(found) == 1, (name, want, found)
    return found[0]


def test_scrape_reports_cap_and_usage_of_a_running_claim(
    cluster: Any, kube_client: kube.KubeClient, namespace: str
) -> None:
    require_simulated_gpus(root_for=CONTAINERS)
    from vgpu_testbed.fakegpu import simulator as fakegpu
    from vgpu_testbed.fakegpu.profiles import load_profile

    subprocess.run(["make", "-s", "-C", str(HOOK_DIR)], check=True)
    profile = load_profile("l4-2")
    uuid = profile.gpus[0].uuid
    root = Path(tempfile.mkdtemp(prefix="vgpu-met-"))
    gpu_env = fakegpu.prepare_node(profile, root / "gpus.state")
    argv = plugin_process_argv(
        root,
        cluster.kubeconfig,
        NODE,
        "--no-nvidia-cdi",
        f"--hook-path={HOOK_LIB}",
        "--metrics-address=127.0.0.1:0",
    )
    dra = root / "plugins" / "vgpu.dra.dev" / "dra.sock"
    log_path = root / "plugin.log"
    with plugin_process(argv, gpu_env, log_path):
        wait_for(lambda: "metrics_url=" in log_path.read_text(), what="the metrics endpoint")
        found = re.search(r"metrics_url=(\S+)", log_path.read_text())
        assert found is not None
        url = found.group(1)
        ref = create_allocated_claim(kube_client, namespace, [result("gpu-0", memory="1Gi")])
        assert prepare(dra, [ref]) == {ref.uid: ""}
        spec = json.loads((root / "cdi" / cdi.spec_file_name(KIND, ref.uid)).read_text())
        env = {**os.environ, **gpu_env, "VGPU_LOG_LEVEL": "warn"}
        with holding_memory(spec, [spec["devices"][0]["name"]], 300 * MIB, env):
            labels = {"claim": ref.name, "namespace": ref.namespace, "gpu": uuid.lower()}
            samples = scrape(url)
            assert one(samples, "vgpu_dra_claim_memory_limit_bytes", **labels) == GIB
            assert one(samples, "vgpu_dra_claim_memory_used_bytes", **labels) == 300 * MIB
            assert one(samples, "vgpu_dra_claim_processes", **labels) == 1
            gpu = {"gpu": uuid.lower(), "device": "gpu-0", "node": NODE}
            assert one(samples, "vgpu_dra_gpu_memory_used_bytes", **gpu) >= 300 * MIB
            assert one(samples, "vgpu_dra_gpu_allocated_memory_bytes", **gpu) == GIB
            assert one(samples, "vgpu_dra_gpu_claims", **gpu) == 1
            assert 0.0 <= one(samples, "vgpu_dra_gpu_utilization_ratio", **gpu) <= 1.0
            assert one(samples, "vgpu_dra_prepare_duration_seconds_count") == 1
            loops = {
                (name, dict(labels)["loop"]): value
                for (name, labels), value in samples.items()
                if name in ("vgpu_dra_loop_failures_total", "vgpu_dra_loop_stalled")
            }
            running = {"governor", "enforcement", "gpu-health", "gpu-rescan", "socket-watch"}
            assert running <= {loop for _, loop in loops}, sorted(loops)
            assert set(loops.values()) == {0.0}, loops

        def released() -> bool:
            now = scrape(url)
            return one(now, "vgpu_dra_claim_memory_used_bytes", **labels) == 0

        wait_for(released, what="the killed process's memory to leave the claim's usage")
        assert one(scrape(url), "vgpu_dra_claim_processes", **labels) == 0
