"""What the governor hands to metrics: the claim utilisation it measured (written into the
claim's region, read back by the scrape as `vgpu_dra_claim_utilization_ratio`) and the duration
of every tick (`vgpu_dra_governor_tick_duration_seconds`).

Driven like tests/unit/kubelet_plugin/test_governor.py: a real region file and a simulated GPU whose
tenant launches as fast as its budget allows.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kubelet_plugin.claim_usage import read_usage
from tests.fixtures.governor_sim import UUID, SimGpu, SimNode


def test_measured_utilisation_reaches_the_scrape(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    region_path = node.claim("a", 30, pid=101)
    with node.running(SimGpu({101: region_path})) as run:
        history = run.ticks(60)
        stats = read_usage(str(region_path))
    assert stats is not None
    measured = stats[UUID.lower()].utilisation
    # The governor's last measurement, as a ratio: the claim runs at its 30 % cap.
    assert measured == pytest.approx(history[-1][101] / 100, abs=0.001)
    assert 0.25 <= measured <= 0.35


def test_every_tick_reports_its_duration(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    gpu = SimGpu({101: node.claim("a", 30, pid=101)})
    durations: list[float] = []
    stop = threading.Event()

    def on_tick(seconds: float) -> None:
        durations.append(seconds)
        if len(durations) == 3:
            stop.set()

    gov = node.governor(gpu, fake_clock=False, on_tick=on_tick)
    try:
        gov.run(stop, period=0.001)
    finally:
        gpu.close()
    assert len(durations) == 3
    assert all(0 <= d < 5 for d in durations)
