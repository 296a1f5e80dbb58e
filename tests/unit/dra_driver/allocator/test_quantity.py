"""Quantity parsing and request rounding.

What this proves:
1. parse_quantity follows the Kubernetes grammar and Quantity.Value()/MilliValue() rounding.
2. Malformed and out-of-range input raises QuantityError (never a wrong number).
3. round_request follows the consumable-capacity request policy rules, exactly at the int64
   edges (one implementation, Python integers: nothing to overflow, nothing to disagree).
4. Random text (valid and invalid) gives a number or QuantityError, never another exception.
"""

from __future__ import annotations

import random

import pytest

from dra_driver import allocator
from dra_driver.allocator import quantity as ref

CASES = [
    ("0", 0, 0),
    ("1", 0, 1),
    ("+7", 0, 7),
    ("-7", 0, -7),
    ("1Ki", 0, 1024),
    ("80Gi", 0, 80 * 1024**3),
    ("1.5Gi", 0, 1536 * 1024**2),
    ("1500m", 0, 2),  # Value() rounds up
    ("1500m", 3, 1500),
    ("1", 3, 1000),
    ("100m", 3, 100),
    ("1e3", 0, 1000),
    ("1E3", 0, 1000),
    ("1e-3", 3, 1),
    ("5e-1", 0, 1),
    ("2k", 0, 2000),
    ("3M", 0, 3_000_000),
    ("1n", 0, 1),
    ("1u", 9, 1000),
    (".5", 0, 1),
    ("1.", 0, 1),
    ("0.0001", 0, 1),
    ("-1.5", 0, -2),  # away from zero, like the API server
    ("8Ei", 0, None),  # 2**63 does not fit
    ("7Ei", 0, 7 * 1024**6),
    ("9223372036854775807", 0, 9223372036854775807),
    ("9223372036854775808", 0, None),
    ("123456789012345678901234567890m", 0, None),
    ("12345678901234567890123n", 0, 12345678901235),  # 23 digits: the big-integer path
]
BAD = [
    "",
    "Gi",
    "1.2.3",
    "1Gb",
    "1 Gi",
    "--1",
    "1e",
    "1e+",
    "1e99999",
    "1ee3",
    "\u0661",
    "0x10",
    "1i",
]


@pytest.mark.parametrize(("text", "scale", "expected"), CASES)
def test_reference_parse(text: str, scale: int, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ref.QuantityError):
            ref.parse_quantity(text, scale)
    else:
        assert ref.parse_quantity(text, scale) == expected


@pytest.mark.parametrize("text", BAD)
def test_malformed_is_rejected(text: str) -> None:
    with pytest.raises(ref.QuantityError):
        ref.parse_quantity(text)


def _random_quantity(rng: random.Random) -> str:
    sign = rng.choice(["", "", "+", "-"])
    whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 22)))
    frac = ""
    if rng.random() < 0.4:
        frac = "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 12)))
    suffixes = [*ref.BINARY_SUFFIXES, *ref.DECIMAL_SUFFIXES, "x", "Gb", "i"]
    if rng.random() < 0.2:
        suffix = rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 80))
    else:
        suffix = rng.choice(suffixes)
    return sign + whole + frac + suffix


def test_random_input_parses_or_is_refused() -> None:
    rng = random.Random(20261122)
    parsed = 0
    for _ in range(20000):
        text = _random_quantity(rng)
        try:
            value = ref.parse_quantity(text, rng.choice([0, 0, 3, 6]))
        except ref.QuantityError:
            continue
        assert isinstance(value, int) and -(1 << 63) < value < 1 << 63, text
        parsed += 1
    assert parsed > 1000  # the generator makes valid quantities too


def test_format_round_trips() -> None:
    for value in [0, 1, 1024, 80 * 1024**3, 3000, 1536 * 1024**2, 7, -2048, 10**12]:
        text = ref.format_quantity(value)
        assert ref.parse_quantity(text) == value
    assert ref.format_quantity(80 * 1024**3) == "80Gi"
    assert ref.format_quantity(3000, binary=False) == "3k"


GIB = 1024**3
MIB = 1024**2
POLICIES = [
    # (requested, policy, capacity, expected)
    (None, ref.RequestPolicy(default=80 * GIB, min_value=MIB, step=MIB), 80 * GIB, 80 * GIB),
    (None, ref.RequestPolicy(), 24 * GIB, 24 * GIB),  # no default: whole capacity
    (None, ref.RequestPolicy(default=0, min_value=0, max_value=100, step=1), 100, 0),
    (10 * GIB, ref.RequestPolicy(min_value=MIB, step=MIB), 80 * GIB, 10 * GIB),
    (10 * GIB + 1, ref.RequestPolicy(min_value=MIB, step=MIB), 80 * GIB, 10 * GIB + MIB),
    (1, ref.RequestPolicy(min_value=MIB, step=MIB), 80 * GIB, MIB),
    (30, ref.RequestPolicy(min_value=0, max_value=100, step=1), 100, 30),
    (101, ref.RequestPolicy(min_value=0, max_value=100, step=1), 100, None),
    (7, ref.RequestPolicy(min_value=5, max_value=100, step=4), 100, 9),
    (3, ref.RequestPolicy(valid_values=(8, 2, 4)), 8, 4),
    (9, ref.RequestPolicy(valid_values=(8, 2, 4)), 8, None),
    (-1, ref.RequestPolicy(), 8, None),
]


@pytest.mark.parametrize(("requested", "policy", "capacity", "expected"), POLICIES)
def test_round_request(
    requested: int | None, policy: ref.RequestPolicy, capacity: int, expected: int | None
) -> None:
    assert ref.round_request(requested, policy, capacity) == expected
    assert allocator.round_request is ref.round_request  # one arithmetic, no compiled twin


INT64_MAX = (1 << 63) - 1


@pytest.mark.parametrize(
    ("requested", "policy", "expected"),
    [
        # A step that rounds past int64 (the compiled twin wrapped around here): exact.
        (INT64_MAX, ref.RequestPolicy(min_value=1, step=1 << 62), 1 + (2 << 62)),
        (INT64_MAX - 1, ref.RequestPolicy(min_value=0, step=INT64_MAX), INT64_MAX),
        # ... and refused where a maximum says so.
        (INT64_MAX, ref.RequestPolicy(min_value=1, max_value=INT64_MAX, step=1 << 62), None),
        (INT64_MAX, ref.RequestPolicy(valid_values=(INT64_MAX,)), INT64_MAX),
        (None, ref.RequestPolicy(default=INT64_MAX), INT64_MAX),
    ],
)
def test_round_request_is_exact_at_the_int64_edges(
    requested: int | None, policy: ref.RequestPolicy, expected: int | None
) -> None:
    assert allocator.round_request(requested, policy, INT64_MAX) == expected
