"""The allocator benchmark runs end to end on a tiny cluster (its figures come from `make bench`,
not from here): every workload places on both paths and the result document has the figures and
the verdict the full run reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import allocator_bench
from dra_driver.allocator import allocate

pytestmark = pytest.mark.skipif(allocate.FAST_KERNEL is None, reason="Cython kernel not built")


def test_allocator_bench_runs_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "allocator.json"
    monkeypatch.setattr(allocator_bench, "RESULTS", out)
    monkeypatch.setattr(allocator_bench, "SIZES", (12,))
    monkeypatch.setattr(allocator_bench, "PLACEMENTS", 5)
    monkeypatch.setattr(allocator_bench, "CALLGRIND_SIZES", ())  # minutes under valgrind
    allocator_bench.main()
    doc = json.loads(out.read_text())
    size = doc["sizes"]["12"]
    assert size["devices"] == 96 and size["model_memory_mib"] > 0
    for workload in ("share", "nvlink2", "nvlink4", "cel"):
        assert size[workload]["cython"]["placements"] > 0
        assert size[workload]["reference"]["placements"] == size[workload]["cython"]["placements"]
        # The batch timing makes the same decisions on both paths, whole batches only.
        placed = size[workload]["cython"]["placements"]
        for path in ("cython_batch", "reference_batch"):
            assert 0 < size[workload][path]["decisions"] <= placed
            assert size[workload][path]["cpu_mean_us"] > 0
            runs = size[workload][path]["cpu_mean_us_runs"]
            assert len(runs) == allocator_bench.BATCH_RUNS
            assert size[workload][path]["cpu_mean_us"] == min(runs)
        assert size[workload]["speedup_cpu_batch"] > 0
    assert all(cost > 0 for cost in doc["timer_overhead_us"].values())
    assert size["mix_cython"]["placements_per_s"] > 0
    at_12 = doc["verdict"]["cython_speedup_min_at_12_nodes"]
    assert at_12["kernels"] > 1 and at_12["decision_cpu_batch"] > 1
