"""The node governor's decisions, driven with real region files and a simulated GPU.

Proves: (1) caps come from the prepared plans with the hook's rules (only effective caps, the
same merged device lines as vgpu.conf), recomputed only for new plans; (2) the
Python controller converges like the C one (<= 1 point mean error at 10/30/50/70 %);
(3) balance borrows idle capacity and returns to the cap; (4) a tick writes a governor rate
and stamp into the claim's region, and over many ticks drives a simulated GPU to the cap;
(5) two claims on one GPU are attributed by their processes' pids and each held to its own
cap; (6) claims no longer prepared are dropped; (7) processes are attributed by open region
file even without matching pids (pid namespaces).
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from dra_driver import cdi
from dra_driver.config import ComputePolicy
from kubelet_plugin import governor as governor_module
from kubelet_plugin import region as rg
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.governor import (
    CappedDevice,
    Controller,
    GpuSample,
    balance_target,
    caps_of_prepared,
    compute_caps,
    pids_holding,
)
from kubelet_plugin.plan import ClaimPlan, DevicePlan
from kubelet_plugin.prepare import NodeSettings, Preparer
from tests.fixtures import claimdata
from tests.fixtures.governor_sim import UUID, SimGpu, SimNode


def _plan(uid: str, *devices: tuple[str, int, ComputePolicy]) -> ClaimPlan:
    """A prepared claim with one share per (uuid, cores, policy)."""
    return ClaimPlan(
        uid=uid,
        namespace="ns",
        name=uid,
        devices=tuple(
            DevicePlan(
                request=f"r{i}",
                pool="node",
                device=f"gpu-{uuid[-1]}",
                uuid=uuid,
                minor=0,
                memory=1 << 30,
                cores=cores,
                policy=policy,
            )
            for i, (uuid, cores, policy) in enumerate(devices)
        ),
    )


def test_compute_caps_keep_only_what_the_hook_enforces() -> None:
    plan = _plan(
        "x",
        (UUID, 30, "fixed"),
        ("GPU-b", 0, "fixed"),  # no cap
        ("GPU-c", 100, "balance"),  # whole GPU: no cap
        ("GPU-d", 50, "none"),  # policy none: no cap
        ("GPU-f", 20, "balance"),
        ("GPU-g", 60, "fixed"),  # two shares of one GPU add up, as in vgpu.conf...
        ("GPU-g", 50, "fixed"),  # ...and reach 100: no cap
    )
    assert compute_caps(plan) == [
        CappedDevice(UUID, 30, rg.POLICY_FIXED),
        CappedDevice("GPU-f", 20, rg.POLICY_BALANCE),
    ]


def test_caps_of_prepared_follow_the_plans_and_reuse_unchanged_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = {"a": _plan("a", (UUID, 30, "fixed"))}
    calls: list[str] = []

    def counting(plan: ClaimPlan) -> list[CappedDevice]:
        calls.append(plan.uid)
        return compute_caps(plan)

    monkeypatch.setattr(governor_module, "compute_caps", counting)
    caps = caps_of_prepared(lambda: plans)
    assert caps() == {"a": [CappedDevice(UUID, 30, rg.POLICY_FIXED)]}
    assert caps() == {"a": [CappedDevice(UUID, 30, rg.POLICY_FIXED)]}
    assert calls == ["a"]  # the same plan object is not recomputed
    plans["a"] = _plan("a", (UUID, 40, "balance"))  # re-prepared with other limits
    plans["b"] = _plan("b", (UUID, 0, "fixed"))
    assert caps() == {"a": [CappedDevice(UUID, 40, rg.POLICY_BALANCE)], "b": []}
    del plans["a"]
    assert caps() == {"b": []}


def test_the_preparers_plans_feed_the_governor_without_reading_vgpu_conf(tmp_path: Path) -> None:
    """The wiring kubelet_plugin.main uses: caps_of_prepared(preparer.prepared)."""
    obj = claimdata.claim(
        [claimdata.result("gpu-1", memory="1Gi", cores=30)],
        configs=[claimdata.config_entry(claimdata.vgpu_config(computePolicy="balance"))],
    )
    settings = NodeSettings(
        driver=claimdata.DRIVER,
        node_name=claimdata.NODE,
        cdi_root=str(tmp_path / "cdi"),
        spec=cdi.SpecSettings(
            kind="k8s.vgpu.dra.dev/claim",
            state_dir=str(tmp_path),
            hook_path=str(claimdata.HOOK_LIB),
        ),
    )
    preparer = Preparer(settings, claimdata.inventory(), lambda ref, timeout_s: obj)
    preparer.reconcile()  # creates the dirs, as the plugin does before serving
    try:
        ref = ClaimRef("default", "claim-a", obj["metadata"]["uid"])
        assert preparer.prepare([ref])[ref.uid].error == ""
        # Nothing reads the file: a damaged vgpu.conf does not change what the governor enforces.
        (tmp_path / "claims" / ref.uid / "vgpu.conf").write_text("garbage\n")
        caps = caps_of_prepared(preparer.prepared)
        uuid = claimdata.gpu(1).uuid
        assert caps() == {ref.uid: [CappedDevice(uuid, 30, rg.POLICY_BALANCE)]}
        assert preparer.unprepare([ref]) == {ref.uid: ""}
        assert caps() == {}
    finally:
        preparer.close()


@pytest.mark.parametrize("target", [10, 30, 50, 70])
def test_controller_converges(target: float) -> None:
    rng = random.Random(target)
    gain, demand, rate, errors = 0.001, 1e6, 0.0, []
    ctl = Controller()
    for i in range(80):
        admitted = rate if 0 < rate < demand else demand
        util = min(100.0, gain * admitted)
        if i >= 30:
            errors.append(abs(util - target))
        measured = max(0.0, util + rng.uniform(-1, 1))
        rate = ctl.step(
            target=target, util=measured, cost_rate=admitted, throttled=0 < rate < demand, rate=rate
        )
    assert sum(errors) / len(errors) <= 1.0


def test_controller_recovers_from_a_gain_learnt_too_high() -> None:
    gain, demand, rate, errors = 0.001, 1e6, 100.0, []  # starts starved: 0.1 % util
    ctl = Controller(gain=0.1)
    for i in range(120):
        admitted = rate if 0 < rate < demand else demand
        util = min(100.0, gain * admitted)
        if i >= 80:
            errors.append(abs(util - 10))
        rate = ctl.step(target=10, util=util, cost_rate=admitted, throttled=True, rate=rate)
    assert sum(errors) / len(errors) <= 1.0


@pytest.mark.parametrize("reading", [0.0, 1.0])
def test_a_reading_below_resolution_never_raises_a_learnt_gain(reading: float) -> None:
    """A window in which the claim hardly launched (0.015 % predicted) reads 0 or 1 %, which fit
    a gain from 0 to 100x the learnt one: the gain stays, the budget too (issue 17: a quarter
    point over the tiny cost rate moved the gain 17x up, the claim ran at 1/10 of its cap)."""
    ctl = Controller(gain=1.5e-7, weight=900.0)
    rate = ctl.step(target=30, util=reading, cost_rate=1e5, throttled=False, rate=2e8)
    assert ctl.gain == 1.5e-7
    assert rate >= 2e8 * 0.99


def test_a_reading_below_resolution_still_lowers_a_gain_learnt_too_high() -> None:
    ctl = Controller(gain=1.5e-7, weight=900.0)
    ctl.step(target=30, util=0.0, cost_rate=2e8, throttled=True, rate=2e8)  # 30 % predicted
    assert ctl.gain < 1.5e-7 * 0.61


def test_a_reading_below_resolution_lowers_the_gain_only_if_the_budget_was_spent() -> None:
    """Back from an idle moment (a quarter of its budget launched in the window), a claim's
    launches are measured against a sample period that ended before them: 0 % says nothing."""
    ctl = Controller(gain=1.5e-7, weight=900.0)
    ctl.step(target=30, util=0.0, cost_rate=5e7, throttled=True, rate=2e8)
    assert ctl.gain == 1.5e-7


def test_a_gain_learnt_far_too_high_unwinds_without_overshoot() -> None:
    """Starved by a gain learnt 100x too high (reads 0-1 %), the claim is back at its cap within
    twenty steps, and the integral did not wind up meanwhile (it used to reach +20 points and
    take the claim to 47 % for a cap of 30 once the gain was right)."""
    gain = 1.5e-7
    ctl = Controller(gain=100 * gain, weight=900.0)
    rate, seen = 30 / ctl.gain, []
    for _ in range(40):
        util = round(gain * rate)
        rate = ctl.step(target=30, util=util, cost_rate=rate, throttled=True, rate=rate)
        seen.append(gain * rate)
    assert abs(seen[19] - 30) <= 3
    assert max(seen) < 33


def test_a_learnt_gain_is_not_re_learnt_from_a_window_shorter_than_a_sample_period() -> None:
    """A 10 ms window after a big move carrying the old period's 5 % (a sample answered twice)
    leaves the gain alone; a 0.1 s window moves it."""
    ctl = Controller(gain=1.66e-7, weight=30.0)
    ctl.step(target=30, util=5.0, cost_rate=1.3e8, throttled=True, rate=1.8e8, dt=0.01)
    assert ctl.gain == 1.66e-7
    ctl.step(target=30, util=5.0, cost_rate=1.3e8, throttled=True, rate=1.8e8, dt=0.1)
    assert ctl.gain < 1.66e-7


def test_balance_target() -> None:
    assert balance_target(30, 90, 90) == 95  # alone: borrow the idle GPU...
    assert balance_target(30, 32, 30) == 40  # ...growing 10 points per step
    assert balance_target(30, 100, 30) == 30  # others use 70: own cap
    assert balance_target(30, 80, 40) == 50  # others use 40: up to 55
    assert balance_target(30, 99, 80) == 70  # full GPU while borrowing: step back 10


def test_single_claim_is_driven_to_its_cap(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    region_path = node.claim("a", 30, pid=101)
    with node.running(SimGpu({101: region_path})) as run:
        history = run.ticks(60)
        with rg.Region(str(region_path)) as region:
            dev = region.layout.devices[0]
            assert dev.rate_source == rg.RATE_GOVERNOR
            assert dev.governor_stamp_ns == node.clock[0]
    tail = [h[101] for h in history[-30:]]
    assert sum(abs(u - 30) for u in tail) / len(tail) <= 1.0


def test_the_governor_drives_a_device_before_its_first_launch(tmp_path: Path) -> None:
    """A claim that has launched nothing has no budget to publish, but its region says from the
    governor's first sight on, every GOVERNOR_REFRESH_NS, that the governor drives it (the hook's
    own controller runs only while that stamp is over 2 s old: launch.c). Also while others'
    samples keep coming (a busy GPU), and without pacing the claim (its rate stays unset for
    the hook to seed from the cap at the first launch)."""
    node = SimNode(tmp_path)
    idle = node.claim("idle", 30, pid=501)
    gpu = SimGpu({})
    gpu.util[502] = 40.0  # an uncapped tenant's process: every sample is fresh
    refresh = governor_module.GOVERNOR_REFRESH_NS
    with node.running(gpu) as run, rg.Region(str(idle)) as region:
        dev = region.layout.devices[0]
        run.governor.tick()
        assert dev.governor_stamp_ns == node.clock[0]
        first = dev.governor_stamp_ns
        stamps = set()
        for _ in range(50):  # 5 s of 100 ms ticks
            node.clock[0] += 100_000_000
            run.governor.tick()
            assert 0 <= node.clock[0] - dev.governor_stamp_ns < refresh
            stamps.add(dev.governor_stamp_ns)
        assert len(stamps) <= 5_000_000_000 // refresh + 1  # refreshed, not written every tick
        assert dev.governor_stamp_ns > first
        assert dev.rate == 0 and dev.rate_source == rg.RATE_UNSET


def test_two_claims_share_one_gpu_by_their_caps(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    a = node.claim("a", 30, pid=201)
    b = node.claim("b", 70, pid=202)
    with node.running(SimGpu({201: a, 202: b})) as run:
        tail = run.ticks(100)[-40:]
    assert abs(sum(h[201] for h in tail) / len(tail) - 30) <= 3
    assert abs(sum(h[202] for h in tail) / len(tail) - 70) <= 3


def test_balance_uses_idle_capacity(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    a = node.claim("a", 30, pid=301, policy="balance")
    with node.running(SimGpu({301: a})) as run:
        tail = [h[301] for h in run.ticks(60)[-20:]]
    assert sum(tail) / len(tail) >= 85  # alone on the GPU: well above its 30 % floor


def test_removed_claims_are_dropped(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    region_path = node.claim("gone", 30, pid=401)
    gov = node.governor()
    gov.refresh()
    assert set(gov.claims) == {"gone"}
    del node.caps["gone"]  # unprepared: the Preparer no longer reports it
    gov.refresh()
    assert gov.claims == {}
    region_path.unlink()


def test_pids_holding_finds_open_files(tmp_path: Path) -> None:
    path = tmp_path / "region"
    path.write_bytes(b"x")
    with open(path, "rb"):
        assert pids_holding(str(path), [os.getpid(), 999_999_999]) == {os.getpid()}
    assert pids_holding(str(path), [os.getpid()]) == set()


class PeriodicGpu(SimGpu):
    """Like real NVML: a per-process sample only every `every`-th poll (a driver sample period
    longer than the governor's), averaging the polls since the last one."""

    def __init__(self, regions: dict[int, Path], every: int) -> None:
        super().__init__(regions)
        self.every, self.polls = every, 0
        self.acc: dict[int, list[float]] = {}

    def advance(self, dt: float) -> None:
        super().advance(dt)
        for pid, util in self.util.items():
            self.acc.setdefault(pid, []).append(util)

    def sample(self, uuid: str, since_us: int) -> GpuSample:
        self.polls += 1
        if self.polls % self.every:
            return GpuSample(min(100.0, sum(self.util.values())), {}, fresh=False)
        per_pid = {pid: sum(v) / len(v) for pid, v in self.acc.items()}
        self.acc.clear()
        return GpuSample(min(100.0, sum(per_pid.values())), per_pid)


def test_stale_polls_do_not_step_and_periodic_samples_converge(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    region_path = node.claim("a", 30, pid=401)
    gpu = PeriodicGpu({401: region_path}, every=2)
    with node.running(gpu) as run:
        rates = []
        history = []
        for _ in range(80):
            run.step()
            history.append(gpu.util[401])
            rates.append(gpu.regions[401].layout.devices[0].rate)
        # A poll without a fresh sample never changes the budget.
        stale = [i for i in range(2, 80) if (i + 1) % 2]
        assert all(rates[i] == rates[i - 1] for i in stale)
        tail = history[-30:]
        assert sum(abs(u - 30) for u in tail) / len(tail) <= 1.0
        # A new claim on this GPU is offered the learnt gain as its seed.
        new_region = node.claim("b", 50, pid=402)
        run.governor.tick()
        with rg.Region(str(new_region)) as region:
            seed = struct.unpack("<d", struct.pack("<Q", region.layout.devices[0].seed_gain_bits))
            assert seed[0] == pytest.approx(gpu.gain, rel=0.05)
