"""The simulated CUDA runtime (libcudart.so.12 and .13) under vgpu_hook, inside a claim.

Proves, for both major versions: inside a 512 MiB claim with vgpu_hook preloaded (as a container
runs it), the device shows 536,870,912 bytes (cudaMemGetInfo and cudaGetDeviceProperties), a
1 TiB cudaMalloc and an allocation past the claim fail with cudaErrorMemoryAllocation: the
runtime's driver calls go through the entry points it resolved with cuGetProcAddress, which the
hook serves. (The runtime alone: tests/integration/fakegpu/test_cudart_ctypes.py.)
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.fixtures.cudart_probe import PROBE
from tests.integration.vgpu_hook.conftest import UUIDS, Node

MIB = 1 << 20
CUDA_ERROR_MEMORY_ALLOCATION = 2


@pytest.mark.parametrize("major", [12, 13])
def test_claim_caps_the_runtime_under_the_hook(node: Node, major: int) -> None:
    claim = node.claim(
        f"c-cudart-{major}",
        [f"device uuid={UUIDS[0]} memory={512 * MIB} cores=0 policy=fixed oversubscribe=0"],
    )
    done = claim.run([sys.executable, "-c", PROBE, str(major), "device", "memory"])
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["count"] == 1
    assert out["total"] == 536_870_912
    assert out["prop_total"] == 536_870_912
    assert out["alloc_rc"] == 0 and out["free0"] - out["free1"] == 256 * MIB
    assert out["past_claim_rc"] == CUDA_ERROR_MEMORY_ALLOCATION  # 256 + 300 MiB > 512 MiB
    assert out["tib_rc"] == CUDA_ERROR_MEMORY_ALLOCATION
    assert out["free_rc"] == 0
