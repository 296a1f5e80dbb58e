"""The GPU-only twins of the torch checks (marked `gpu`: run with VGPU_DRA_REAL_GPU=1 on a machine
with an NVIDIA GPU; skipped elsewhere). The same tests/fixtures/torch_checks.py as on simulated
GPUs, on GPU 0 with the real driver and NVIDIA's own CUDA runtime, which the torch environment
then needs: `<torch env>/bin/python -m pip install nvidia-cuda-runtime==13.2.86` (make torch
leaves it out, see docs/frameworks.md). The hook is preloaded with LD_PRELOAD and finds its claim
through VGPU_DRA_CLAIMS_DIR, as tests/integration/vgpu_hook/realgpu.py does.

Proves on a real GPU: inside a 1 GiB claim torch sees 1 GiB (total_memory, mem_get_info), fills
it, is refused one byte more with the cap's figures, gets the memory back with empty_cache, keeps
to set_per_process_memory_fraction, agrees with NVML, and passes the vLLM-style sequence - with
the default allocator and with expandable segments. Unlike on simulated GPUs a real CUDA context
takes some memory of the claim, so "the whole cap" is what mem_get_info shows free.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.integration.frameworks.torchenv import run_checks
from tests.integration.vgpu_hook.realgpu import HOOK_LIB, gpu0_uuid

pytestmark = pytest.mark.gpu
CAP = 1 << 30


@pytest.fixture
def claims_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="vgpu-torch-") as root:
        claim = Path(root) / "c1"
        claim.mkdir()
        (claim / "vgpu.conf").write_text(
            f"version 1\nclaim c1\ndevice uuid={gpu0_uuid()} memory={CAP} cores=0\n"
        )
        yield Path(root)


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True"])
def test_torch_keeps_to_the_cap_on_a_real_gpu(
    torch_py: Path, claims_dir: Path, alloc_conf: str
) -> None:
    env = dict(
        os.environ,
        LD_PRELOAD=str(HOOK_LIB),
        VGPU_DRA_CLAIMS_DIR=str(claims_dir),
        PYTORCH_CUDA_ALLOC_CONF=alloc_conf,
    )

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), check=False, env=env, capture_output=True, text=True, timeout=600
        )

    out = run_checks(run, torch_py, CAP, ["device", "alloc", "fraction", "vllm", "nvml"])
    assert out["device"]["total_memory"] == CAP == out["device"]["mem_get_info"][1], out
    assert out["alloc"]["past"]["oom"], out["alloc"]
    assert out["alloc"]["past"]["figures"]["total"] == "1024.00 MiB"
    assert out["alloc"]["free_after_empty_cache"] == out["alloc"]["free_before"]
    assert out["fraction"]["beyond"]["oom"], out["fraction"]
    assert out["nvml"]["nvml"]["total"] == CAP
    assert out["vllm"]["ok"], out["vllm"]
