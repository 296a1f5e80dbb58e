"""The hook on a real NVIDIA GPU (run with VGPU_DRA_REAL_GPU=1 on a GPU machine; skipped
elsewhere by the `gpu` marker): the same overhead and accuracy targets as on the simulated GPU.

Proves: (1) a capped launch (limiter active, budget not binding) costs at most 45 ns more than
without the hook, an uncapped one at most 30 ns; (2) the in-process controller holds one tenant
at 30 % and 70 % within 1 point of mean absolute error on real NVML sampling.
"""

from __future__ import annotations

import pytest

from tests.integration.vgpu_hook import realgpu

pytestmark = pytest.mark.gpu


def test_launch_overhead_on_the_real_driver() -> None:
    result = realgpu.overhead()
    added = result["added_ns"]
    assert added["cuLaunchKernel_limiter_idle"] <= 30, result
    assert added["cuLaunchKernel_limiter_active"] <= 45, result


@pytest.mark.parametrize("cap", [30, 70])
def test_cap_accuracy_on_real_nvml(cap: int) -> None:
    result = realgpu.accuracy(cap)
    assert result["mae"] <= 1.0, result
