"""The rescan's two stages (kubelet_plugin.rediscover.Rediscovery): the full discovery child
runs only when the cheap enumeration's answer changed."""

from __future__ import annotations

import pytest

from kubelet_plugin import rediscover
from tests.inventories import synthetic_inventory


def test_full_discovery_only_when_the_enumeration_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([{"count": 2}, {"count": 2}, {"count": 1}, {"count": 1}])
    full = iter([synthetic_inventory(2), synthetic_inventory(1)])
    calls: list[str] = []

    def fingerprint_in_child() -> object:
        calls.append("enumerate")
        return next(answers)

    def discover_in_child() -> object:
        calls.append("discover")
        return next(full)

    monkeypatch.setattr(rediscover, "fingerprint_in_child", fingerprint_in_child)
    monkeypatch.setattr(rediscover, "discover_in_child", discover_in_child)
    rescan = rediscover.Rediscovery()
    assert [len(rescan().gpus) for _ in range(4)] == [2, 2, 1, 1]
    assert calls == ["enumerate", "discover", "enumerate", "enumerate", "discover", "enumerate"]
