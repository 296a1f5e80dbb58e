"""A simulated GPU and governor harness for the governor's unit tests: claims prepared with caps
(`make_claim`, region files as the hook creates them), a GPU whose tenants launch as fast as
their region's budget allows (`SimGpu`), and a governor ticking on a fake clock."""

from __future__ import annotations

from pathlib import Path

from kubelet_plugin import region as rg
from kubelet_plugin.governor import CappedDevice, Governor, GpuSample
from tests.fixtures.regions import write_region

UUID = "GPU-00000000-1111-2222-3333-444444444444"


CAPS: dict[str, list[CappedDevice]] = {}


def make_governor(
    root: Path, gpu: SimGpu | None = None, clock: list[int] | None = None
) -> Governor:
    """A governor over `root` whose prepared claims are the ones make_claim registered."""
    source = gpu if gpu is not None else SimGpu({})
    if clock is None:
        return Governor(str(root), source, lambda: CAPS)
    return Governor(
        str(root),
        source,
        lambda: CAPS,
        clock_ns=lambda: clock[0],
        wall_us=lambda: clock[0] // 1000,
    )


def make_claim(root: Path, uid: str, cores: int, pid: int, policy: str = "fixed") -> Path:
    """Prepare claim `uid` (caps as the plugin's Preparer would report them) with a region whose
    first slot is `pid`, as the hook would have created it."""
    kind = rg.POLICY_BALANCE if policy == "balance" else rg.POLICY_FIXED
    CAPS[uid] = [CappedDevice(UUID, cores, kind)]
    claim_dir = root / "claims" / uid
    claim_dir.mkdir(parents=True)
    return write_region(claim_dir / "region", UUID, cores, pid=pid)


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


def run_ticks(gov: Governor, gpu: SimGpu, clock: list[int], ticks: int) -> list[dict[int, float]]:
    history = []
    for _ in range(ticks):
        clock[0] += 100_000_000
        gpu.advance(0.1)
        gov.tick()
        history.append(dict(gpu.util))
    return history
