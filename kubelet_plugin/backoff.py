"""Capped, jittered exponential backoff for reconcile loops that talk to the API server.

Used by the slice publisher (`kubelet_plugin.slice_publisher`) between failed syncs: when the API
server is down or keeps answering with conflicts, every node retrying at a fixed pace would hit it
in lock-step the moment it comes back; doubling delays with random jitter spread the retries, and
the cap bounds how stale a node can stay once the server is healthy again. Pure and deterministic
when given a seeded `random.Random`, so tests need no sleeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """`next_delay()` returns initial, initial*factor, ... up to `maximum`, each spread by
    +-`jitter` (a fraction); `reset()` after a success starts over."""

    initial_s: float = 0.5
    maximum_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    _failures: int = 0

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.maximum_s < self.initial_s:
            raise ValueError(
                f"backoff needs 0 < initial_s <= maximum_s, got {self.initial_s}, {self.maximum_s}"
            )
        if self.factor < 1.0 or not 0.0 <= self.jitter < 1.0:
            raise ValueError(
                f"backoff needs factor >= 1 and 0 <= jitter < 1, got {self.factor}, {self.jitter}"
            )

    @property
    def failures(self) -> int:
        return self._failures

    def next_delay(self) -> float:
        """Delay before the next attempt; counts one more failure."""
        base = min(self.maximum_s, self.initial_s * self.factor ** min(self._failures, 64))
        self._failures += 1
        spread = base * self.jitter
        return max(0.0, min(self.maximum_s, base + self.rng.uniform(-spread, spread)))

    def reset(self) -> None:
        self._failures = 0
