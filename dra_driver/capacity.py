"""What one GPU offers as DRA consumable capacity: the single definition of that arithmetic.

Three places must agree on it exactly: the ResourceSlice builder (what is published), the
prepare-time overbooking guard (what a node refuses) and the allocator (what it places). If the
guard used unrounded `bytes x ratio` while the slice publishes the value rounded down to whole MiB,
a hand-written allocation could pass the guard yet exceed the published capacity; one module
removes that class of drift.

- `memory`: physical bytes x oversubscription ratio, rounded down to whole MiB (the request step),
  never below 1 MiB. A request naming no memory gets all of it (exclusive use).
- `cores`: 100 (percent of the GPU's SMs); default 0 = no reservation, no cap.
"""

from __future__ import annotations

from typing import Any

from dra_driver import names

MIB = 1 << 20
CORES_TOTAL = 100


class CapacityError(ValueError):
    """A parameter that cannot produce a valid capacity (the message names it)."""


def scaled_memory(memory_bytes: int, ratio: float) -> int:
    """Memory capacity a GPU offers: bytes x ratio, rounded down to whole MiB (>= 1 MiB)."""
    if not ratio >= 1.0:  # also rejects NaN
        raise CapacityError(f"oversubscription ratio must be >= 1.0, got {ratio!r}")
    scaled = int(memory_bytes * ratio) if ratio != 1.0 else memory_bytes
    return max(MIB, scaled // MIB * MIB)


def device_capacity(memory_bytes: int, ratio: float) -> dict[str, Any]:
    """The `capacity` map of one published device: `memory` and `cores` with request policies.

    Keys are the bare capacity names (the driver's domain); values as the API expects them.
    """
    memory = str(scaled_memory(memory_bytes, ratio))
    return {
        names.CAPACITY_MEMORY: {
            "value": memory,
            "requestPolicy": {
                "default": memory,
                "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
            },
        },
        names.CAPACITY_CORES: {
            "value": str(CORES_TOTAL),
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": str(CORES_TOTAL), "step": "1"},
            },
        },
    }
