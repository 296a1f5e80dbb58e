"""The allocator benchmark runs end to end on a tiny cluster (its figures come from `make bench`,
not from here): every workload places, and the result document has the figures and verdict the
full run reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import allocator_bench
from tests.unit.dra_driver.allocator.extension import needs_extension

pytestmark = needs_extension


def test_allocator_bench_runs_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "allocator.json"
    monkeypatch.setattr(allocator_bench, "RESULTS", out)
    monkeypatch.setattr(allocator_bench, "SIZES", (12,))
    monkeypatch.setattr(allocator_bench, "PLACEMENTS", 5)
    allocator_bench.main()
    doc = json.loads(out.read_text())
    size = doc["sizes"]["12"]
    assert size["devices"] == 96 and size["feed_events_s"] >= 0
    for workload in ("share", "nvlink2", "nvlink4", "cel"):
        assert size[workload]["placements"] == 5
        assert size[workload]["first_decision_ms"] > 0 and size[workload]["cpu_p99_ms"] > 0
    assert size["mix"]["placements_per_s"] > 0
    assert size["memory"]["with_allocator_mib"] >= size["memory"]["model_mib"] > 0
    assert doc["verdict"] == {}  # no target is set at 12 nodes
