"""PyTorch from PyPI, unmodified, on simulated GPUs (no hook, no claim): the whole GPU.

torch 2.15's CUDA build loads `libcudart.so.13` as a shared library; on the simulated node the
loader finds the simulator's own runtime (hack/fakegpu) first, which serves torch's device
queries, its caching allocator (plain and expandable segments) and its elementwise kernels
through the simulated driver. Proves, on a simulated `l4-2` node:
1. is_available, 2 devices named as the profile, total_memory and mem_get_info = the GPU's;
2. fill_/x+1/x*2, host<->device and device<->device copies keep the data (kernels compute
   nothing: only copies are checked), streams, events, synchronize;
3. torch.empty of the whole GPU works, one byte more raises OutOfMemoryError with the GPU's
   figures, empty_cache gives the memory back - with the default allocator and with
   expandable segments (cuMemCreate/cuMemMap through cudaGetDriverEntryPoint);
4. set_per_process_memory_fraction(0.5) admits half and refuses more;
5. a vLLM-style profiling sequence adds up; NVML and torch agree on total and used.
(Under vgpu_hook inside a claim: test_torch_caps.py.)
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.integration.frameworks.torchenv import REPO, Runner, run_checks
from vgpu_testbed.fakegpu.simulator import load_profile, prepare_node


@pytest.fixture(scope="module")
def l4_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    subprocess.run(["make", "-s", "-C", str(REPO / "hack" / "fakegpu"), "all"], check=True)
    env = prepare_node(load_profile("l4-2"), tmp_path_factory.mktemp("l4") / "node.state")
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}


def _runner(env: dict[str, str]) -> Runner:
    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), check=False, env=env, capture_output=True, text=True, timeout=300
        )

    return run


ALL = ["device", "elementwise", "alloc", "fraction", "vllm", "nvml"]


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True"])
def test_torch_uses_the_whole_simulated_gpu(
    torch_py: Path, l4_env: dict[str, str], alloc_conf: str
) -> None:
    gpu = load_profile("l4-2").gpus[0]
    env = dict(l4_env, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
    out = run_checks(_runner(env), torch_py, gpu.memory_bytes, ALL)
    assert out["cuda"].startswith("13."), out
    dev = out["device"]
    assert dev["is_available"] and dev["count"] == 2 and dev["name"] == gpu.product
    assert dev["total_memory"] == gpu.memory_bytes == dev["mem_get_info"][1]
    assert dev["sm_count"] == gpu.sm_count
    assert out["elementwise"]["round_trip"] and out["elementwise"]["device_to_device"]
    alloc = out["alloc"]
    assert alloc["whole"]["ok"] and alloc["free_full"] == gpu.memory_bytes - alloc["whole_bytes"]
    assert alloc["past"]["oom"], alloc
    assert alloc["past"]["figures"]["total"] == alloc["expected_total_text"]
    assert alloc["free_after_empty_cache"] == gpu.memory_bytes
    assert out["fraction"]["ok"], out["fraction"]
    assert out["vllm"]["ok"], out["vllm"]
    assert out["nvml"]["ok"], out["nvml"]
    assert out["ok"], out
