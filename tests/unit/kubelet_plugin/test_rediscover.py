"""The rescan's two stages (kubelet_plugin.rediscover.Rediscovery): the full discovery child
runs only when the cheap enumeration's answer changed."""

from __future__ import annotations

import pytest

from kubelet_plugin import rediscover
from tests.fixtures.inventories import synthetic_inventory


def test_full_discovery_only_when_the_enumeration_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(
        [{"count": 2}, {"count": 2}, {"count": 2}, {"count": 1}, {"count": 1}, {"count": 1}]
    )
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
    assert calls == [
        *("enumerate", "discover", "enumerate"),  # changed: discover, then check it held
        "enumerate",
        *("enumerate", "discover", "enumerate"),
        "enumerate",
    ]


def test_a_change_during_the_discovery_is_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU removed between the enumeration and the full discovery must not pin the old answer
    to the new inventory (then adding it back would never be seen: found by bench/health)."""
    gpus = [2]
    during = iter([lambda: gpus.__setitem__(0, 1), lambda: None])  # hot-removed meanwhile

    def discover_in_child() -> object:
        next(during)()
        return synthetic_inventory(gpus[0])

    monkeypatch.setattr(rediscover, "fingerprint_in_child", lambda: {"count": gpus[0]})
    monkeypatch.setattr(rediscover, "discover_in_child", discover_in_child)
    rescan = rediscover.Rediscovery()
    assert len(rescan().gpus) == 1
    gpus[0] = 2  # added back: the enumeration says what it said before the removal
    assert len(rescan().gpus) == 2
