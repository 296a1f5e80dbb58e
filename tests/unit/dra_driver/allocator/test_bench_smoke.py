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
    assert size["mix_cython"]["placements_per_s"] > 0
    assert doc["verdict"]["cython_speedup_min_at_12_nodes"]["kernels"] > 1
