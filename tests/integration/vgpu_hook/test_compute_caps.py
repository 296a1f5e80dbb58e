"""Compute caps: the hook's launch limiter in real processes on the simulated GPU.

Proves: (1) a budget written into the claim's region (as the node governor does) limits the
launch rate of a running program to that budget, also for a program that synchronises after
every launch; (2) with no budget and no sampler, launches are not held back; (3) with the
simulated NVML present: in-process and governor control hold one tenant at 10/30/50/70 % and
two tenants at 30/70 within the accuracy targets.
"""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from kubelet_plugin.region import Region
from tests.fixtures.regions import budget_kept_fresh
from tests.integration.vgpu_hook.computecap import new_claim_settling, run_tenants
from tests.integration.vgpu_hook.conftest import PROBE, UUIDS, Node, fake_has_nvml, field
from vgpu_testbed.container import container_command

# Each case runs tenants for 5-15 s and the session's first test builds the hook and the
# simulated GPUs; on a loaded machine a case has taken 40 s.
pytestmark = pytest.mark.timeout(180)

BLOCKS, THREADS = 216, 128  # cuda_probe's launch shape: cost 27648 per launch


@pytest.mark.parametrize("sync", [0, 1], ids=["async-launches", "sync-after-every-launch"])
def test_region_budget_limits_launch_rate(node: Node, sync: int) -> None:
    claim = node.claim(f"c-rate-{sync}", [f"device uuid={UUIDS[0]} memory={1 << 30} cores=40"])
    launches_per_s = 200
    with budget_kept_fresh(claim.dir / "region", UUIDS[0], launches_per_s * BLOCKS * THREADS):
        env = dict(node.env, PROBE_KERNEL="tiny__ns1000")
        done = subprocess.run(
            container_command(
                claim.spec,
                claim.device_names,
                [str(PROBE), "init", "sleep:300", f"run:3:{BLOCKS}:{sync}"],
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[-1]
    launches = field(line, "launches")
    # 3 s at 200/s (the budget is in place before the run starts), plus at most one burst.
    assert 0.85 * 600 <= launches <= 1.1 * 600 + 20, line
    with Region(str(claim.dir / "region")) as region:
        dev = region.layout.devices[0]
        assert dev.throttled_ns > 1_000_000_000  # most of the 3 s was spent waiting
        assert dev.launches == launches + 0  # every launch went through the limiter


def test_second_gpu_of_a_claim_is_capped_too(node: Node) -> None:
    """Per-device buckets: launches on the claim's second GPU are limited by its own budget,
    also when CUDA_VISIBLE_DEVICES makes it ordinal 0."""
    lines = [f"device uuid={u} memory={1 << 30} cores=40" for u in UUIDS]
    claim = node.claim("c-rate-gpu1", lines, gpus=(0, 1))
    with budget_kept_fresh(claim.dir / "region", UUIDS[1], 100 * BLOCKS * THREADS):
        env = dict(node.env, PROBE_KERNEL="tiny__ns1000", CUDA_VISIBLE_DEVICES="1,0")
        argv = [str(PROBE), "init", "sleep:300", f"run:2:{BLOCKS}:0"]
        done = subprocess.run(
            container_command(claim.spec, claim.device_names, argv),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    launches = field(done.stdout.splitlines()[-1], "launches")
    assert 0.85 * 200 <= launches <= 1.1 * 200 + 20, done.stdout
    with Region(str(claim.dir / "region")) as region:
        assert region.layout.devices[1].launches == launches
        assert region.layout.devices[0].launches == 0


def test_no_budget_means_no_throttling(node: Node) -> None:
    capped = node.claim("c-free", [f"device uuid={UUIDS[0]} memory={1 << 30} cores=0"])
    env = dict(node.env, PROBE_KERNEL="tiny__ns1000")
    done = subprocess.run(
        container_command(
            capped.spec, capped.device_names, [str(PROBE), "init", f"run:1:{BLOCKS}:0"]
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert field(done.stdout.splitlines()[-1], "launches") > 2000


needs_nvml = pytest.mark.skipif(not fake_has_nvml(), reason="the simulated NVML is not built yet")
# Utilisation is measured over a few seconds on a 2-core machine shared with whatever else runs:
# a measurement disturbed by that load is taken again (at most twice) before the assertion,
# which stays as strict, counts as failed.
measured = pytest.mark.flaky(reruns=2, reruns_delay=1)


@needs_nvml
@measured
@pytest.mark.parametrize("governor", [False, True], ids=["in-process", "governor"])
@pytest.mark.parametrize("cap", [10, 30, 50, 70])
def test_single_tenant_accuracy(node: Node, cap: int, governor: bool) -> None:
    (result,) = run_tenants(node, [cap], seconds=5, governor=governor)
    assert result["mae"] <= 2.0, result


@needs_nvml
@measured
@pytest.mark.parametrize("governor", [False, True], ids=["in-process", "governor"])
def test_two_tenants_share_by_caps(node: Node, governor: bool) -> None:
    low, high = run_tenants(node, [30, 70], seconds=6, governor=governor)
    assert abs(low["mean_util"] - 30) <= 3, (low, high)
    assert abs(high["mean_util"] - 70) <= 3, (low, high)


@needs_nvml
@measured
def test_sync_after_every_launch_is_throttled(node: Node) -> None:
    (result,) = run_tenants(node, [30], seconds=5, governor=False, sync_every_launch=True)
    assert result["mae"] <= 2.0, result


@needs_nvml
@measured
@pytest.mark.parametrize("governor", [False, True], ids=["in-process", "governor"])
def test_balance_borrows_idle_capacity_and_yields_under_contention(
    node: Node, governor: bool
) -> None:
    (alone,) = run_tenants(node, [30], seconds=5, governor=governor, policy="balance")
    assert alone["mean_util"] >= 85, alone  # idle GPU: far above its 30 % floor
    # Starting together, neither borrows before its controller has learnt its gain, so both
    # reach their caps within a second (bench/results/hook.json "settling"); then together they
    # fill the GPU and neither stays below its cap - 3.
    low, high = run_tenants(
        node, [30, 70], seconds=5, governor=governor, policy="balance", settle_s=1.5
    )
    assert low["mean_util"] >= 27 and high["mean_util"] >= 67, (low, high)


@needs_nvml
@measured
@pytest.mark.parametrize("governor", [False, True], ids=["in-process", "governor"])
def test_late_tenant_is_not_starved(node: Node, governor: bool) -> None:
    """The 30 % tenant starts launching 2 s after the 70 % one is throttled at its cap."""
    high, low = run_tenants(
        node, [70, 30], seconds=8, governor=governor, settle_s=4.0, delays_ms=[0, 2000]
    )
    assert abs(low["mean_util"] - 30) <= 3, (low, high)
    assert abs(high["mean_util"] - 70) <= 3, (low, high)


@pytest.mark.parametrize("procaddr", [False, True], ids=["dlsym", "cuGetProcAddress"])
def test_launches_follow_context_switches(node: Node, procaddr: bool) -> None:
    """The hook caches the device of the current context per thread (no driver call per
    launch); cuCtxSetCurrent / cuCtxPushCurrent / cuCtxPopCurrent drop that cache, so every
    launch is charged to the GPU it runs on."""
    lines = [f"device uuid={u} memory={1 << 30} cores=40" for u in UUIDS]
    claim = node.claim(f"c-ctx-{int(procaddr)}", lines, gpus=(0, 1))
    with contextlib.ExitStack() as feeders:
        for uuid in UUIDS:
            feeders.enter_context(budget_kept_fresh(claim.dir / "region", uuid, 10**15))
        out = claim.probe(
            "init",
            "sleep:200",
            f"launch:50:{BLOCKS}",
            "ctx:1",
            f"launch:30:{BLOCKS}",
            "push:0",
            f"launch:20:{BLOCKS}",
            "pop",
            f"launch:10:{BLOCKS}",
            procaddr=procaddr,
            PROBE_KERNEL="tiny__ns1000",
        )
    assert out, "the probe printed nothing"
    assert all("rc=0" in line or "failures=0" in line for line in out), out
    with Region(str(claim.dir / "region")) as region:
        assert region.layout.devices[0].launches == 50 + 20
        assert region.layout.devices[1].launches == 30 + 10


@needs_nvml
@measured
@pytest.mark.parametrize("governor", [False, True], ids=["in-process", "governor"])
def test_accuracy_under_realistic_sampling(node: Node, governor: bool) -> None:
    """NVML as real drivers report it (one per-process sample per jittered 1/6 s period,
    NOT_FOUND in between): one tenant holds its cap and a 30/70 pair splits by caps."""
    (single,) = run_tenants(node, [30], seconds=5, governor=governor, sampling="realistic")
    assert single["mae"] <= 2.0, single
    low, high = run_tenants(node, [30, 70], seconds=6, governor=governor, sampling="realistic")
    assert abs(low["mean_util"] - 30) <= 3, (low, high)
    assert abs(high["mean_util"] - 70) <= 3, (low, high)


@needs_nvml
@measured
@pytest.mark.parametrize("sampling", ["exact", "realistic"])
def test_new_claim_is_capped_from_its_first_launch(node: Node, sampling: str) -> None:
    """No uncapped start: in the first second a new claim never runs more than 5 points over
    its cap (0.3 s means), and after 1 s it holds the cap (mean within 3 points). Settling times
    are a benchmark figure (bench/results/hook.json), not asserted here."""
    result, settling = new_claim_settling(node, governor=False, sampling=sampling)
    assert settling["peak_over_cap"] <= 5, settling
    assert abs(result["mean_util"] - 30) <= 3, (result, settling)
