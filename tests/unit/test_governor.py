"""The node governor's decisions, driven with real region files and a simulated GPU.

Proves: (1) vgpu.conf caps are read with the hook's rules (only effective caps); (2) the
Python controller converges like the C one (<= 1 point mean error at 10/30/50/70 %);
(3) balance borrows idle capacity and returns to the cap; (4) a tick writes a governor rate
and stamp into the claim's region, and over many ticks drives a simulated GPU to the cap;
(5) two claims on one GPU are attributed by their processes' pids and each held to its own
cap; (6) removed claims are dropped; (7) processes are attributed by open region file even
without matching pids (pid namespaces).
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from kubelet_plugin import region as rg
from kubelet_plugin.governor import (
    CappedDevice,
    Controller,
    Governor,
    GpuSample,
    balance_target,
    parse_compute_caps,
    pids_holding,
)

UUID = "GPU-00000000-1111-2222-3333-444444444444"


def test_parse_compute_caps() -> None:
    text = (
        "version 1\nclaim x\n"
        f"device uuid={UUID} memory=1 cores=30 policy=fixed oversubscribe=0\n"
        "device uuid=GPU-b memory=1 cores=0 policy=fixed\n"  # no cap
        "device uuid=GPU-c memory=1 cores=100 policy=balance\n"  # whole GPU: no cap
        "device uuid=GPU-d memory=1 cores=50 policy=none\n"  # policy none: no cap
        "device uuid=GPU-e memory=1 cores=abc\n"  # hook rejects: no cap
        "device uuid=GPU-f memory=1 cores=20 policy=balance # comment\n"
    )
    assert parse_compute_caps(text) == [
        CappedDevice(UUID, 30, rg.POLICY_FIXED),
        CappedDevice("GPU-f", 20, rg.POLICY_BALANCE),
    ]


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


def test_balance_target() -> None:
    assert balance_target(30, 20, 20) == 95
    assert balance_target(30, 100, 30) == 30
    assert balance_target(30, 60, 10) == 45


def _make_claim(root: Path, uid: str, cores: int, pid: int, policy: str = "fixed") -> Path:
    claim_dir = root / "claims" / uid
    claim_dir.mkdir(parents=True)
    (claim_dir / "vgpu.conf").write_text(
        f"version 1\nclaim {uid}\ndevice uuid={UUID} memory=1000 cores={cores} policy={policy}\n"
    )
    layout = rg.RegionLayout()
    layout.magic, layout.version, layout.size = rg.REGION_MAGIC, rg.REGION_VERSION, rg.REGION_SIZE
    layout.device_count, layout.ready, layout.slot_hwm = 1, 1, 1
    layout.devices[0].uuid = UUID.encode()
    layout.devices[0].cores = cores
    layout.slots[0].pid = pid
    (claim_dir / "region").write_bytes(bytes(layout))
    return claim_dir / "region"


class SimGpu:
    """A GPU shared by tenants: each launches cost units as fast as its budget allows."""

    def __init__(self, regions: dict[int, Path], gain: float = 0.001) -> None:
        self.regions = {pid: rg.Region(str(path)) for pid, path in regions.items()}
        self.gain = gain
        self.demand = 1e6  # cost units/s each tenant would launch unthrottled
        self.util: dict[int, float] = {}

    def advance(self, dt: float) -> None:
        wanted = {}
        for pid, region in self.regions.items():
            rate = region.layout.devices[0].rate
            wanted[pid] = rate if 0 < rate < self.demand else self.demand
        total = sum(self.gain * w for w in wanted.values())
        scale = min(1.0, 100.0 / total) if total else 1.0  # the GPU time-slices when full
        for pid, region in self.regions.items():
            admitted = wanted[pid] * scale
            dev = region.layout.devices[0]
            dev.launch_cost += int(admitted * dt)
            if wanted[pid] < self.demand:
                dev.throttled_ns += 1000
            self.util[pid] = self.gain * admitted

    def sample(self, uuid: str, since_us: int) -> GpuSample:
        assert uuid == UUID
        return GpuSample(min(100.0, sum(self.util.values())), dict(self.util))

    def close(self) -> None:
        for region in self.regions.values():
            region.close()


def _run(gov: Governor, gpu: SimGpu, clock: list[int], ticks: int) -> list[dict[int, float]]:
    history = []
    for _ in range(ticks):
        clock[0] += 100_000_000
        gpu.advance(0.1)
        gov.tick()
        history.append(dict(gpu.util))
    return history


def test_single_claim_is_driven_to_its_cap(tmp_path: Path) -> None:
    region_path = _make_claim(tmp_path, "a", 30, pid=101)
    gpu = SimGpu({101: region_path})
    clock = [1_000_000_000]
    gov = Governor(str(tmp_path), gpu, clock_ns=lambda: clock[0], wall_us=lambda: clock[0] // 1000)
    try:
        history = _run(gov, gpu, clock, 60)
        with rg.Region(str(region_path)) as region:
            dev = region.layout.devices[0]
            assert dev.rate_source == rg.RATE_GOVERNOR
            assert dev.governor_stamp_ns == clock[0]
        tail = [h[101] for h in history[-30:]]
        assert sum(abs(u - 30) for u in tail) / len(tail) <= 1.0
    finally:
        gov.close()
        gpu.close()


def test_two_claims_share_one_gpu_by_their_caps(tmp_path: Path) -> None:
    a = _make_claim(tmp_path, "a", 30, pid=201)
    b = _make_claim(tmp_path, "b", 70, pid=202)
    gpu = SimGpu({201: a, 202: b})
    clock = [1_000_000_000]
    gov = Governor(str(tmp_path), gpu, clock_ns=lambda: clock[0], wall_us=lambda: clock[0] // 1000)
    try:
        history = _run(gov, gpu, clock, 100)
        tail = history[-40:]
        assert abs(sum(h[201] for h in tail) / len(tail) - 30) <= 3
        assert abs(sum(h[202] for h in tail) / len(tail) - 70) <= 3
    finally:
        gov.close()
        gpu.close()


def test_balance_uses_idle_capacity(tmp_path: Path) -> None:
    a = _make_claim(tmp_path, "a", 30, pid=301, policy="balance")
    gpu = SimGpu({301: a})
    clock = [1_000_000_000]
    gov = Governor(str(tmp_path), gpu, clock_ns=lambda: clock[0], wall_us=lambda: clock[0] // 1000)
    try:
        history = _run(gov, gpu, clock, 60)
        tail = [h[301] for h in history[-20:]]
        assert sum(tail) / len(tail) >= 85  # alone on the GPU: well above its 30 % floor
    finally:
        gov.close()
        gpu.close()


def test_removed_claims_are_dropped(tmp_path: Path) -> None:
    region_path = _make_claim(tmp_path, "gone", 30, pid=401)
    gpu = SimGpu({})
    gov = Governor(str(tmp_path), gpu)
    gov.refresh()
    assert set(gov.claims) == {"gone"}
    region_path.unlink()
    (region_path.parent / "vgpu.conf").unlink()
    region_path.parent.rmdir()
    gov.refresh()
    assert gov.claims == {}


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
    region_path = _make_claim(tmp_path, "a", 30, pid=401)
    gpu = PeriodicGpu({401: region_path}, every=2)
    clock = [1_000_000_000]
    gov = Governor(str(tmp_path), gpu, clock_ns=lambda: clock[0], wall_us=lambda: clock[0] // 1000)
    try:
        rates = []
        history = []
        for _ in range(80):
            clock[0] += 100_000_000
            gpu.advance(0.1)
            gov.tick()
            history.append(gpu.util[401])
            rates.append(gpu.regions[401].layout.devices[0].rate)
        # A poll without a fresh sample never changes the budget.
        stale = [i for i in range(2, 80) if (i + 1) % 2]
        assert all(rates[i] == rates[i - 1] for i in stale)
        tail = history[-30:]
        assert sum(abs(u - 30) for u in tail) / len(tail) <= 1.0
        # A new claim on this GPU is offered the learnt gain as its seed.
        new_region = _make_claim(tmp_path, "b", 50, pid=402)
        gov.tick()
        with rg.Region(str(new_region)) as region:
            seed = struct.unpack("<d", struct.pack("<Q", region.layout.devices[0].seed_gain_bits))
            assert seed[0] == pytest.approx(gpu.gain, rel=0.05)
    finally:
        gov.close()
        gpu.close()
