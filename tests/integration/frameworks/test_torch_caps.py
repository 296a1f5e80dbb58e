"""PyTorch from PyPI, unmodified, inside a claim with vgpu_hook: torch sees and keeps to the cap.

Each program runs through vgpu_testbed.container (the claim's CDI edits applied, the hook
preloaded by /etc/ld.so.preload as in a real container) on a simulated 40 GiB A100 node. torch's
runtime is the simulator's libcudart.so.13, whose driver calls go through the entry points it
resolved with cuGetProcAddress, which the hook serves. Proves, inside a 1 GiB claim:
1. total_memory and mem_get_info equal the cap; torch.empty of the whole cap works (with
   expandable segments, the 51 of torch's 20 MiB pages that fit it), one byte
   more raises torch.cuda.OutOfMemoryError whose figures are the cap's ("total capacity of
   1024.00 MiB"), empty_cache gives the memory back to the claim - with the default allocator
   and with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate/cuMemMap);
2. set_per_process_memory_fraction(0.5) admits half the cap and refuses more;
3. NVML (libnvidia-ml as nvidia-smi reads it) and torch agree on total and used;
4. a vLLM-style profiling sequence (budget 0.9 x total) adds up under the cap;
5. two processes on one claim share its cap.
The checks are tests/fixtures/torch_checks.py, which runs unchanged in a real container.
"""

from __future__ import annotations

import json
import select
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.frameworks.torchenv import CHECKS, run_checks
from tests.integration.vgpu_hook.conftest import UUIDS, Claim, Node
from vgpu_testbed.container import container_command

MIB = 1 << 20
CAP = 1024 * MIB
ALL = ["device", "elementwise", "alloc", "fraction", "vllm", "nvml"]
START_TIMEOUT_S = 120.0


def _claim(node: Node, uid: str) -> Claim:
    return node.claim(
        uid, [f"device uuid={UUIDS[0]} memory={CAP} cores=0 policy=fixed oversubscribe=0"]
    )


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True"])
def test_torch_keeps_to_the_claims_cap(node: Node, torch_py: Path, alloc_conf: str) -> None:
    claim = _claim(node, f"c-torch-{'exp' if alloc_conf else 'plain'}")

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return claim.run(argv, timeout=300, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)

    out = run_checks(run, torch_py, CAP, ALL)
    dev = out["device"]
    assert dev["is_available"] and dev["count"] == 1
    assert dev["total_memory"] == CAP and dev["mem_get_info"] == [CAP, CAP]
    alloc = out["alloc"]
    # Expandable segments map 20 MiB pages: 51 of them (1020 MiB) fit the 1 GiB cap, not 52.
    whole = CAP if not alloc_conf else 1020 * MIB
    assert alloc["whole_bytes"] == whole and alloc["whole"]["ok"], alloc
    assert alloc["free_full"] == CAP - whole
    assert alloc["past"]["oom"], alloc
    assert alloc["past"]["figures"]["total"] == "1024.00 MiB"
    assert alloc["reserved_cached"] > 0 and alloc["free_cached"] < CAP  # torch's cache holds it
    assert alloc["free_after_empty_cache"] == CAP  # ... and empty_cache gives it to the claim
    fraction = out["fraction"]
    assert fraction["within"]["ok"] and fraction["beyond"]["oom"], fraction
    assert fraction["beyond"]["figures"]["allowed"] == "512.00 MiB"
    assert out["nvml"]["nvml"]["total"] == CAP
    assert out["nvml"]["nvml"]["used"] == out["nvml"]["torch"]["used"] > 0
    vllm = out["vllm"]
    assert vllm["total"] == CAP and vllm["budget"] == int(0.9 * CAP)
    assert vllm["ok"], vllm
    assert out["elementwise"]["ok"] and out["ok"], out


def _holder(
    claim: Claim, python: Path, nbytes: int
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    argv = [str(python), "-W", "ignore", str(CHECKS), "--hold", str(nbytes)]
    proc = subprocess.Popen(
        container_command(claim.spec, claim.device_names, argv),
        env=claim.node.env,
        stdin=subprocess.PIPE,  # it holds the memory until its stdin closes
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("{"):
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"holder did not report: {line!r} {err}")
    return proc, json.loads(line)


def test_two_processes_share_one_claims_cap(node: Node, torch_py: Path) -> None:
    claim = _claim(node, "c-torch-shared")
    procs: list[subprocess.Popen[str]] = []
    try:
        first, a = _holder(claim, torch_py, 600 * MIB)
        procs.append(first)
        assert a["held"]["ok"] and a["total"] == CAP and a["free"] == CAP - 600 * MIB
        second, b = _holder(claim, torch_py, 424 * MIB)  # exactly the rest
        procs.append(second)
        assert b["held"]["ok"] and b["total"] == CAP and b["free"] == 0
        third, c = _holder(claim, torch_py, 2 * MIB)
        procs.append(third)
        assert not c["held"]["ok"] and c["held"]["oom"], c
        assert c["held"]["figures"]["total"] == "1024.00 MiB"
    finally:
        for proc in procs:
            proc.communicate(input="\n", timeout=60)
