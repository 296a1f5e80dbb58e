"""The node governor's closed-loop dynamics against a simulated GPU, under both NVML samplings.

Deterministic (fake clock, seeded jitter), so settling is asserted in controller time, not wall
time: the real `Governor` (real region files, real controller) drives a plant that behaves like
the simulated GPU and the hook together:
- a tenant starts launching at `start_s`; its first launch seeds the region's rate from the cap
  (`cores / seed gain`, as vgpu_hook/src/launch.c does), then it launches as fast as the
  region's rate allows (utilisation = true gain x admitted cost rate; the GPU time-slices when
  the tenants together want more than 100 %);
- NVML answers per-process utilisation either exactly over the caller's interval, or
  realistically: integer percentages per driver sample period (1/6 s, boundaries jittered by up
  to 20 ms), averaged over the completed periods since `lastSeen`, nothing new between period
  ends (hack/fakegpu/src/nvml_usage.c models the same).

The settling figure is the one bench/hook_bench.py reports from the real simulated GPU: time
from the tenant's first launch until every tenant's 0.3 s mean utilisation stays within 3
points of its cap (for `balance` tenants: of the cap when the GPU is full).
"""

from __future__ import annotations

import ctypes
import functools
import math
import random
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin import region as rg
from kubelet_plugin.governor import LEARNING_PERIOD_S, Governor, GpuSample
from tests.fixtures.governor_sim import UUID, SimNode

SEED_GAIN_DEFAULT = 1e-6  # vgpu_hook/include/vgpu.h VGPU_SEED_GAIN_DEFAULT
REPO = Path(__file__).resolve().parents[3]
DT_NS = 2_000_000  # plant resolution
PERIOD_NS = 166_667_000
JITTER_NS = 20_000_000
BAND = 3.0
WINDOW_NS = 300_000_000
# What one governor pass takes (a few NVML calls and region reads): launches go on meanwhile, so
# the next period is chosen seeing the launch cost moved since the pass read it.
TICK_NS = DT_NS
GOVERNOR_STALE_NS = 2_000_000_000  # vgpu_hook/src/launch.c: the hook's fallback steps after this


@dataclass
class Tenant:
    pid: int
    cap: int
    region: rg.Region
    start_ns: int
    true_gain: float
    demand: float = 5e9
    busy: list[tuple[int, float]] = field(default_factory=list)  # (t_ns, util) per plant step
    # (from_ns, to_ns): the tenant launches nothing (an idle moment of a bursty workload, or
    # its process descheduled); its hook polls only from launches, so not then either.
    pauses: list[tuple[int, int]] = field(default_factory=list)
    final: Any = None  # `run`: a copy of the region's device record when the run ended

    def started(self, now: int) -> bool:
        return now >= self.start_ns

    def launching(self, now: int) -> bool:
        return self.started(now) and not any(a <= now < b for a, b in self.pauses)


class Plant:
    """GPU + hooks + NVML for the governor (`UtilSource`)."""

    def __init__(
        self,
        tenants: list[Tenant],
        *,
        realistic: bool,
        seed: int,
        fallback_policy: int | None = None,
    ) -> None:
        self.tenants = tenants
        self.realistic = realistic
        # The hooks' in-process fallback (vgpu_ctl_poll), run from each tenant's launches while
        # no governor has written its region for 2 s (launch.c maybe_step_controller), as on a
        # node between a claim's first launch and the governor's first tick that sees it.
        self.fallback_policy = fallback_policy
        self._samplers = [_fallback_sampler(self, t) for t in tenants]
        self.now = 0
        rnd = random.Random(seed)
        self.phase = rnd.randrange(PERIOD_NS)
        self.jitters = [rnd.randrange(JITTER_NS + 1) for _ in range(2000)]
        # per pid: list of (period_end_ns, integer percent)
        self.periods: dict[int, list[tuple[int, int]]] = {t.pid: [] for t in tenants}
        self.period_busy: dict[int, float] = {t.pid: 0.0 for t in tenants}
        self.period_start = 0
        self.period_index = 0
        self.period_ends: list[int] = []

    def _period_end(self, k: int) -> int:
        return self.phase + k * PERIOD_NS + self.jitters[k % len(self.jitters)]

    def advance(self, until_ns: int) -> None:
        while self.now + DT_NS <= until_ns:
            self.now += DT_NS
            wanted: dict[int, float] = {}
            for t in self.tenants:
                if not t.launching(self.now):
                    continue
                dev = t.region.layout.devices[0]
                if dev.rate == 0:  # the hook's seed at the first launch
                    seed = _bits_to_double(dev.seed_gain_bits)
                    gain = seed if seed > SEED_GAIN_DEFAULT else SEED_GAIN_DEFAULT
                    dev.rate = int(t.cap / gain)
                    dev.rate_source = rg.RATE_SEED
                    dev.rate_stamp_ns = self.now
                wanted[t.pid] = min(float(dev.rate), t.demand)
            total = sum(t.true_gain * wanted[t.pid] for t in self.tenants if t.pid in wanted)
            scale = min(1.0, 100.0 / total) if total else 1.0
            for t in self.tenants:
                util = 0.0
                if t.pid in wanted:
                    admitted = wanted[t.pid] * scale
                    util = t.true_gain * admitted
                    dev = t.region.layout.devices[0]
                    dev.launch_cost += int(admitted * DT_NS / 1e9)
                    if dev.rate < t.demand:
                        dev.throttled_ns += DT_NS // 2
                t.busy.append((self.now, util))
                self.period_busy[t.pid] += util * DT_NS
            if self.fallback_policy is not None:
                self._step_fallbacks()
            if self.now >= self._period_end(self.period_index):
                span = self.now - self.period_start
                for t in self.tenants:
                    pct = round(self.period_busy[t.pid] / span) if span else 0
                    if t.started(self.now) or pct:
                        self.periods[t.pid].append((self.now, pct))
                    self.period_busy[t.pid] = 0.0
                self.period_ends.append(self.now)
                self.period_start = self.now
                self.period_index += 1

    def _step_fallbacks(self) -> None:
        lib = _fallback_lib()
        for tenant, sampler in zip(self.tenants, self._samplers, strict=True):
            dev = tenant.region.layout.devices[0]
            stale = (
                dev.governor_stamp_ns == 0 or self.now - dev.governor_stamp_ns >= GOVERNOR_STALE_NS
            )
            if tenant.launching(self.now) and stale:
                device = ctypes.addressof(dev)
                lib.vgpu_ctl_poll(device, tenant.cap, self.fallback_policy, self.now, sampler, None)

    def sample(self, uuid: str, since_us: int) -> GpuSample:
        assert uuid == UUID
        since = since_us * 1000
        if self.realistic:
            per_pid: dict[int, float] = {}
            # The simulator averages a process's percentages over every period completed
            # since lastSeen, those it did not run in included (hack/fakegpu nvml_usage.c).
            ended = sum(1 for end in self.period_ends if end > since)
            for pid, periods in self.periods.items():
                fresh = [pct for end, pct in periods if end > since]
                if fresh:
                    per_pid[pid] = float(round(sum(fresh) / max(ended, len(fresh))))
            if not per_pid:
                return GpuSample(0.0, {}, fresh=False)
            last = sum(periods[-1][1] for periods in self.periods.values() if periods)
            return GpuSample(float(min(100, last)), per_pid)
        per_pid = {}
        for t in self.tenants:
            window = [u for when, u in t.busy if when > since]
            if window and any(u > 0 for u in window):
                per_pid[t.pid] = float(round(sum(window) / len(window)))
        if not per_pid:  # the simulator: no process ran since lastSeen = NVML_ERROR_NOT_FOUND
            return GpuSample(0.0, {}, fresh=False)
        return GpuSample(float(min(100.0, sum(per_pid.values()))), per_pid)


def _fallback_sampler(plant: Plant, tenant: Tenant) -> Any:
    """The plant's NVML as the hook's sampler sees it (launch.c sample_util)."""

    def sample(_ctx: object, age_ns: int, device: Any, claim: Any) -> int:
        answer = plant.sample(UUID, (plant.now - age_ns) // 1000)
        if not answer.fresh:
            return SAMPLE_NOTHING_NEW
        # launch.c sample_util: the whole GPU as the sum over the same window as ours
        device[0] = min(100.0, sum(answer.process_util.values()))
        claim[0] = answer.process_util.get(tenant.pid, 0.0)
        return SAMPLE_OK

    return SAMPLER(sample)


def _bits_to_double(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def settle_s(tenants: list[Tenant], caps: list[float], first_ns: int) -> float:
    """Seconds from `first_ns` until every tenant's 0.3 s mean stays within BAND of its cap."""
    steps = WINDOW_NS // DT_NS
    series = [[u for _, u in t.busy] for t in tenants]
    times = [when for when, _ in tenants[0].busy]
    settled: int | None = None
    for i in range(len(times) - steps):
        if times[i] < first_ns - DT_NS:
            continue
        inside = all(
            abs(sum(s[i : i + steps]) / steps - cap) <= BAND
            for s, cap in zip(series, caps, strict=True)
        )
        if inside and settled is None:
            settled = times[i] - DT_NS
        elif not inside:
            settled = None
    return math.inf if settled is None else (settled - first_ns) / 1e9


def peak_over_cap(tenants: list[Tenant], caps: list[int], first_ns: int) -> float:
    """Highest 0.3 s mean above its cap of any tenant within the first second."""
    steps = WINDOW_NS // DT_NS
    worst = -math.inf
    for tenant, cap in zip(tenants, caps, strict=True):
        series = [u for when, u in tenant.busy if first_ns <= when < first_ns + 1_000_000_000]
        for i in range(len(series) - steps + 1):
            worst = max(worst, sum(series[i : i + steps]) / steps - cap)
    return worst


def mae(tenant: Tenant, cap: float, from_ns: int) -> float:
    """Mean absolute error of 0.5 s means from the cap, from `from_ns` on."""
    per = 500_000_000 // DT_NS
    series = [u for when, u in tenant.busy if when >= from_ns]
    windows = [sum(series[i : i + per]) / per for i in range(0, len(series) - per + 1, per)]
    return sum(abs(w - cap) for w in windows) / len(windows)


def _drive(
    plant: Plant, node: SimNode, gov: Governor, first_tick: int, end: int, *, governor_from: int = 0
) -> None:
    """Run the plant to `end` (ns), the governor ticking from `first_tick` at the periods it
    asks for; before `governor_from` it is not running yet and the hooks' fallback is alone."""
    now = first_tick
    while now < end:
        plant.advance(now)
        if now < governor_from:
            now += int(LEARNING_PERIOD_S * 1e9)
            continue
        node.clock[0] = now
        gov.tick()
        plant.advance(now + TICK_NS)  # tenants keep launching while the tick runs
        now += int(gov.next_period() * 1e9)
    plant.advance(end)


def run(
    tmp_path: Path,
    caps: list[int],
    *,
    realistic: bool,
    seed: int,
    policy: str = "fixed",
    seconds: float = 4.0,
    true_gain: float = 7.2e-8,
    delays_ms: list[int] | None = None,
    pause_ms: tuple[int, int] | None = None,
    governor_from_ms: int | None = None,
) -> tuple[list[Tenant], int]:
    """`pause_ms`: the first tenant launches nothing over that stretch (ms after its start).
    `governor_from_ms`: the governor's first tick comes that long after the first tenant's
    first launch (restarted, or started late); until then the hooks' fallback runs alone."""
    node = SimNode(tmp_path)
    node.clock[0] = 0
    tenants = []
    rnd = random.Random(seed * 31 + 7)
    start = 600_000_000 + rnd.randrange(PERIOD_NS) // DT_NS * DT_NS
    delays = delays_ms or [0] * len(caps)
    for i, cap in enumerate(caps):
        path = node.claim(f"c{i}", cap, pid=500 + i, policy=policy)
        begins = start + delays[i] * 1_000_000
        tenants.append(Tenant(500 + i, cap, rg.Region(str(path)), begins, true_gain))
    if pause_ms is not None:
        tenants[0].pauses.append((start + pause_ms[0] * 1_000_000, start + pause_ms[1] * 1_000_000))
    code = rg.POLICY_BALANCE if policy == "balance" else rg.POLICY_FIXED
    plant = Plant(tenants, realistic=realistic, seed=seed, fallback_policy=code)
    gov = node.governor(None)
    gov.source = plant  # the plant is the NVML the governor samples
    tick_phase = rnd.randrange(100_000_000) // DT_NS * DT_NS
    end = int(seconds * 1e9) + start
    arrival = start + governor_from_ms * 1_000_000 if governor_from_ms is not None else 0
    try:
        _drive(plant, node, gov, tick_phase, end, governor_from=arrival)
    finally:
        gov.close()
        for t in tenants:
            dev = t.region.layout.devices[0]
            t.final = type(dev).from_buffer_copy(dev)
            t.region.close()
    return tenants, start


@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("seed", range(4))
def test_a_fixed_claim_settles_within_300_ms(tmp_path: Path, realistic: bool, seed: int) -> None:
    """Seeded from the cap at its first launch, the claim is in the band once the governor has
    learnt its gain from one clean sample period (realistic: the second period end after the
    first launch, at most 2 x 1/6 s + jitter + one 20 ms learning poll), and stays there."""
    tenants, start = run(tmp_path, [30], realistic=realistic, seed=seed, seconds=3.0)
    assert settle_s(tenants, [30], start) <= 0.3
    assert peak_over_cap(tenants, [30], start) <= BAND
    assert mae(tenants[0], 30, start + 1_000_000_000) <= 1.0


@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("late_ms", [250, 400])
def test_a_governor_arriving_after_the_first_launch_takes_the_claim_over(
    tmp_path: Path, realistic: bool, late_ms: int
) -> None:
    """A governor that comes up while a claim settles under the hook's own controller (the
    plugin restarted) takes the rate over (it measures from its first tick and skips the next
    sample, whose period may mix the hook's rates) without taking the claim over its cap.
    Settling may take a period longer than with the governor up first (worst seen 0.48 s)."""
    for seed in range(4):
        run_dir = tmp_path / str(seed)
        run_dir.mkdir()
        tenants, start = run(
            run_dir, [30], realistic=realistic, seed=seed, seconds=2.0, governor_from_ms=late_ms
        )
        final = tenants[0].final
        assert final.ctl_steps > 0  # the hook's controller had stepped before
        assert final.rate_source == rg.RATE_GOVERNOR
        assert settle_s(tenants, [30], start) <= 0.6
        assert peak_over_cap(tenants, [30], start) <= BAND
        assert mae(tenants[0], 30, start + 1_000_000_000) <= 1.0


@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("cap", [10, 30, 50, 70])
def test_accuracy_at_each_cap(tmp_path: Path, realistic: bool, cap: int) -> None:
    tenants, start = run(tmp_path, [cap], realistic=realistic, seed=cap, seconds=4.0)
    assert mae(tenants[0], cap, start + 2_000_000_000) <= 1.0


@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("seed", range(3))
def test_two_balance_tenants_starting_together_settle_within_1_s(
    tmp_path: Path, realistic: bool, seed: int
) -> None:
    tenants, start = run(
        tmp_path, [30, 70], realistic=realistic, seed=seed, policy="balance", seconds=3.0
    )
    assert settle_s(tenants, [30, 70], start) <= 1.0
    for tenant, cap in zip(tenants, (30, 70), strict=True):
        assert mae(tenant, cap, start + 1_500_000_000) <= 3.0 / 2


def test_a_light_kernel_is_never_over_its_cap_while_learning(tmp_path: Path) -> None:
    """Kernels 50x lighter per thread than the seed assumes: the seed window reads 0-1 %, below
    what one NVML sample can resolve, so the first learnt gain is off; the re-learn from the
    next precise window still settles within a second, and the start never overshoots."""
    tenants, start = run(
        tmp_path, [30], realistic=True, seed=1, seconds=3.0, true_gain=SEED_GAIN_DEFAULT / 50
    )
    assert settle_s(tenants, [30], start) <= 1.0
    assert peak_over_cap(tenants, [30], start) <= BAND


@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("delay_ms", [300, 1500])
def test_a_later_balance_tenant_gets_its_cap_within_1_s(
    tmp_path: Path, realistic: bool, delay_ms: int
) -> None:
    """The 70 % tenant starts while the 30 % one already borrows (or is about to): the borrower
    yields and the newcomer holds its cap within a second of its first launch."""
    tenants, start = run(
        tmp_path,
        [30, 70],
        realistic=realistic,
        seed=delay_ms,
        policy="balance",
        seconds=3.5,
        delays_ms=[0, delay_ms],
    )
    assert settle_s(tenants, [30, 70], start + delay_ms * 1_000_000) <= 1.0


def test_the_governor_polls_fast_only_while_a_launching_claim_learns(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    path = node.claim("idle", 30, pid=600)
    region = rg.Region(str(path))
    plant = Plant([], realistic=True, seed=0)
    gov = node.governor(None)
    gov.source = plant
    try:
        for _ in range(3):
            node.clock[0] += 100_000_000
            gov.tick()
        assert gov.next_period() == 0.1  # prepared, nothing launched: no fast polls
        region.layout.devices[0].rate = 3_000_000
        region.layout.devices[0].launch_cost += 300_000  # first launches, gain not learnt yet
        assert gov.next_period() == LEARNING_PERIOD_S
    finally:
        gov.close()
        region.close()


# ---- the settling sweep (docs/vgpu-hook.md "Settling sweep") ---------------------------------
#
# Where the first launch falls in NVML's sample period decides how much of the first fresh
# sample's period the claim ran in, and so how long the controller waits: the seeded tenant
# starts at SWEEP_PHASES evenly spaced points of a period, for two jitter sequences, with the
# governor's ticks at a fixed offset. Each run is 1.6 s of controller time; the whole sweep is
# about a second.
SWEEP_PHASES = 8
SWEEP_JITTER_SEEDS = (0, 2)
SWEEP_TICK_OFFSET_NS = 34_000_000
SWEEP_GRID_NS = 10_000_000  # where the period grid starts on the fake clock
FIXED_TARGET_S = 0.3  # issue 17: a `fixed` claim settles within 300 ms


def _tenant_at_phase(
    node: SimNode, cap: int, phase: float, pause_ms: tuple[int, int] | None
) -> Tenant:
    """The sweep's `fixed` claim: its first launch at `phase` of a sample period, after four
    periods of the grid, and idle over `pause_ms` (ms after that launch) when given."""
    path = node.claim("c0", cap, pid=500)
    offset = int(phase * PERIOD_NS) // DT_NS * DT_NS
    start = SWEEP_GRID_NS + 4 * PERIOD_NS + offset
    tenant = Tenant(500, cap, rg.Region(str(path)), start, 7.2e-8)
    if pause_ms is not None:
        tenant.pauses.append((start + pause_ms[0] * 1_000_000, start + pause_ms[1] * 1_000_000))
    return tenant


def _sweep_end(tenant: Tenant, pause_ms: tuple[int, int] | None) -> int:
    """When a sweep run ends: 1.6 s after the first launch, or after the pause's end."""
    return tenant.start_ns + (pause_ms[1] * 1_000_000 if pause_ms else 0) + 1_600_000_000


def _run_at_phase(
    root: Path,
    cap: int,
    *,
    realistic: bool,
    phase: float,
    jitter_seed: int,
    pause_ms: tuple[int, int] | None = None,
) -> Tenant:
    node = SimNode(root)
    node.clock[0] = 0
    tenant = _tenant_at_phase(node, cap, phase, pause_ms)
    plant = Plant([tenant], realistic=realistic, seed=jitter_seed, fallback_policy=rg.POLICY_FIXED)
    plant.phase = SWEEP_GRID_NS
    gov = node.governor(None)
    gov.source = plant
    try:
        _drive(plant, node, gov, SWEEP_TICK_OFFSET_NS, _sweep_end(tenant, pause_ms))
    finally:
        gov.close()
        tenant.region.close()
    return tenant


SAMPLER = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_double),
    ctypes.POINTER(ctypes.c_double),
)
SAMPLE_FAILED, SAMPLE_OK, SAMPLE_NOTHING_NEW = 0, 1, 2  # vgpu.h enum vgpu_sample_result


@functools.cache
def _fallback_lib() -> ctypes.CDLL:
    """The hook's controller and fallback poll, built alone (vgpu_hook/build/libvgpuctl.so)."""
    subprocess.run(["make", "-s", "-C", str(REPO / "vgpu_hook"), "build/libvgpuctl.so"], check=True)
    lib = ctypes.CDLL(str(REPO / "vgpu_hook" / "build" / "libvgpuctl.so"))
    lib.vgpu_ctl_poll.restype = ctypes.c_bool
    lib.vgpu_ctl_poll.argtypes = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.c_uint64,
        SAMPLER,
        ctypes.c_void_p,
    )
    return lib


def _run_in_process_at_phase(
    root: Path,
    cap: int,
    *,
    realistic: bool,
    phase: float,
    jitter_seed: int,
    pause_ms: tuple[int, int] | None = None,
) -> Tenant:
    """The same start as `_run_at_phase` with no governor: the hook's in-process fallback
    (vgpu_hook/src/bucket.c vgpu_ctl_poll, the code launch.c runs) polls the plant's NVML from
    its launches, i.e. on every plant step it is due (the tenant launches continuously)."""
    node = SimNode(root)
    tenant = _tenant_at_phase(node, cap, phase, pause_ms)
    plant = Plant([tenant], realistic=realistic, seed=jitter_seed)
    plant.phase = SWEEP_GRID_NS
    lib = _fallback_lib()

    def sample(_ctx: object, age_ns: int, device: Any, claim: Any) -> int:
        answer = plant.sample(UUID, (plant.now - age_ns) // 1000)
        if not answer.fresh:
            return SAMPLE_NOTHING_NEW
        device[0] = answer.device_util
        claim[0] = answer.process_util.get(tenant.pid, 0.0)
        return SAMPLE_OK

    sampler = SAMPLER(sample)
    device = ctypes.addressof(tenant.region.layout.devices[0])
    end = _sweep_end(tenant, pause_ms)
    try:
        for now in range(DT_NS, end + 1, DT_NS):
            plant.advance(now)
            if tenant.launching(now):
                lib.vgpu_ctl_poll(device, cap, rg.POLICY_FIXED, now, sampler, None)
    finally:
        tenant.region.close()
    return tenant


def _sweep(
    root: Path, cap: int, *, realistic: bool, in_process: bool = False
) -> tuple[float, float]:
    """Worst settling (s) and worst overshoot (points) of a `fixed` claim over the sweep."""
    run = _run_in_process_at_phase if in_process else _run_at_phase
    worst_settle, worst_peak = 0.0, -math.inf
    for index in range(SWEEP_PHASES):
        for jitter_seed in SWEEP_JITTER_SEEDS:
            run_dir = root / f"{index}-{jitter_seed}"
            run_dir.mkdir()
            tenant = run(
                run_dir,
                cap,
                realistic=realistic,
                phase=index / SWEEP_PHASES,
                jitter_seed=jitter_seed,
            )
            worst_settle = max(worst_settle, settle_s([tenant], [cap], tenant.start_ns))
            worst_peak = max(worst_peak, peak_over_cap([tenant], [cap], tenant.start_ns))
    return worst_settle, worst_peak


@pytest.mark.parametrize("in_process", [False, True], ids=["governor", "in-process"])
@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("cap", [10, 30, 50, 70])
def test_a_fixed_claim_settles_within_300_ms_wherever_it_starts_in_the_sample_period(
    tmp_path: Path, cap: int, realistic: bool, in_process: bool
) -> None:
    """Issue 17's target over the whole sweep, and never over the cap meanwhile."""
    settle, peak = _sweep(tmp_path, cap, realistic=realistic, in_process=in_process)
    assert settle <= FIXED_TARGET_S
    assert peak <= BAND


# ---- balance tenants whose starts are spread (containers never start at the same instant) ----


def _run_in_process_pair(
    root: Path, *, realistic: bool, delay_ms: int, seconds: float = 2.0
) -> tuple[list[Tenant], int]:
    """Two `balance` tenants (30/70) with no governor, the second starting `delay_ms` later:
    each hook's fallback (vgpu_ctl_poll) polls the plant's NVML from its own launches."""
    node = SimNode(root)
    start = 600_000_000
    tenants = []
    for i, cap in enumerate((30, 70)):
        path = node.claim(f"c{i}", cap, pid=500 + i, policy="balance")
        begins = start + i * delay_ms * 1_000_000
        tenants.append(Tenant(500 + i, cap, rg.Region(str(path)), begins, 7.2e-8))
    plant = Plant(tenants, realistic=realistic, seed=delay_ms)
    lib = _fallback_lib()
    samplers = [_fallback_sampler(plant, t) for t in tenants]
    devices = [ctypes.addressof(t.region.layout.devices[0]) for t in tenants]
    try:
        for now in range(DT_NS, start + int(seconds * 1e9) + 1, DT_NS):
            plant.advance(now)
            for tenant, sampler, device in zip(tenants, samplers, devices, strict=True):
                if tenant.launching(now):
                    lib.vgpu_ctl_poll(device, tenant.cap, rg.POLICY_BALANCE, now, sampler, None)
    finally:
        for t in tenants:
            t.region.close()
    return tenants, start


@pytest.mark.parametrize("in_process", [False, True], ids=["governor", "in-process"])
@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("delay_ms", [50, 100])
def test_balance_tenants_starting_a_moment_apart_never_overshoot(
    tmp_path: Path, delay_ms: int, realistic: bool, in_process: bool
) -> None:
    """The first tenant may borrow while the second is still learning, but by at most
    BORROW_STEP per NVML window: under a sampler that is fresh at every poll (the simulator's
    exact mode) windows are 100 ms long after two fresh polls, so it cannot climb tens of points
    in a few 10 ms polls and overfill the GPU before the second one shows (issue 17: 7-9 points
    over the cap)."""
    if in_process:
        tenants, start = _run_in_process_pair(tmp_path, realistic=realistic, delay_ms=delay_ms)
    else:
        tenants, start = run(
            tmp_path,
            [30, 70],
            realistic=realistic,
            seed=delay_ms,
            policy="balance",
            seconds=2.0,
            delays_ms=[0, delay_ms],
        )
    assert peak_over_cap(tenants, [30, 70], start) <= BAND
    assert settle_s(tenants, [30, 70], start + delay_ms * 1_000_000) <= 1.0


# ---- a claim that pauses (bursty work, or its process descheduled) -------------------------


PAUSE_PEAK = 1.5  # points over the cap a resumed claim may reach: as much as in steady state


@pytest.mark.parametrize("in_process", [False, True], ids=["governor", "in-process"])
@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
@pytest.mark.parametrize("pause_ms", [80, 150, 300, 500])
def test_a_claim_back_from_a_pause_is_at_its_cap_at_once(
    tmp_path: Path, pause_ms: int, realistic: bool, in_process: bool
) -> None:
    """A settled `fixed` claim idle for a moment (bursty inference, a descheduled process) at 6
    phases of the sample period, the pause starting at two points of the claim's run: back in
    the band within 0.3 s of resuming, never more over its cap than in steady state. Before the
    spent-share rule (vgpu_ctl_step) NVML's period did not cover the launches a window did and
    the gain was learnt up to 2x low: realistic sampling 5-11 (governor) and 3-15 points
    (in-process) over the cap, back in 0.3-1.2 s; the governor under exact sampling, whose
    window spanned the whole pause, ran the claim under its cap for up to 0.6 s."""
    run = _run_in_process_at_phase if in_process else _run_at_phase
    worst_settle, worst_peak = 0.0, -math.inf
    for index in range(6):
        for begins in (1000, 1400):
            run_dir = tmp_path / f"{index}-{begins}"
            run_dir.mkdir()
            pause = (begins, begins + pause_ms)
            tenant = run(
                run_dir,
                30,
                realistic=realistic,
                phase=index / 6,
                jitter_seed=index % 3,
                pause_ms=pause,
            )
            resumed = tenant.start_ns + pause[1] * 1_000_000
            worst_settle = max(worst_settle, settle_s([tenant], [30], resumed))
            worst_peak = max(worst_peak, peak_over_cap([tenant], [30], resumed))
    assert worst_settle <= FIXED_TARGET_S
    assert worst_peak <= PAUSE_PEAK


@pytest.mark.parametrize("realistic", [False, True], ids=["exact", "realistic"])
def test_the_governor_stops_fast_ticks_after_two_fresh_fast_ones(
    tmp_path: Path, realistic: bool
) -> None:
    """A sampler fresh at two 10 ms ticks in a row answers for the caller's interval (exact
    sampling): ticks go back to 100 ms, so windows are not 10 ms of a time-sliced GPU. A real
    driver's 1/6 s period never gives that, and there a new claim keeps its fast ticks."""
    node = SimNode(tmp_path)
    node.clock[0] = 0
    path = node.claim("c0", 30, pid=500)
    tenant = Tenant(500, 30, rg.Region(str(path)), 300_000_000, 7.2e-8)
    plant = Plant([tenant], realistic=realistic, seed=0, fallback_policy=rg.POLICY_FIXED)
    gov = node.governor(None)
    gov.source = plant
    fast, now = 0, 0
    try:
        while now < 1_000_000_000:
            plant.advance(now)
            node.clock[0] = now
            gov.tick()
            plant.advance(now + TICK_NS)
            period = gov.next_period()
            fast += period == LEARNING_PERIOD_S
            now += int(period * 1e9)
    finally:
        gov.close()
        tenant.region.close()
    assert fast >= 10 if realistic else 1 <= fast <= 3


def test_the_next_tick_asks_for_samples_newer_than_the_end_of_this_ones_call(
    tmp_path: Path,
) -> None:
    """A sample period that ends while a tick's NVML call runs is answered by that call; asked
    since the call's start, the next tick got it again, and its 10 ms window set the rate the
    first one had just changed against the old period's utilisation (a gain 1.8x low, 23-37
    points over the cap in about 1 of 25 realistic runs on the simulator)."""
    node = SimNode(tmp_path)
    node.clock[0] = 1_000_000_000
    node.claim("c0", 30, pid=500)
    asked: list[int] = []
    call_ns = 3_000_000

    class SlowNvml:
        def sample(self, uuid: str, since_us: int) -> GpuSample:
            asked.append(since_us)
            node.clock[0] += call_ns  # the wall clock moves while NVML answers
            return GpuSample(30.0, {500: 30.0})

    gov = node.governor(None)
    gov.source = SlowNvml()
    try:
        gov.tick()
        after_first_call_us = node.clock[0] // 1000
        node.clock[0] += 10_000_000
        gov.tick()
    finally:
        gov.close()
    assert asked[1] == after_first_call_us
