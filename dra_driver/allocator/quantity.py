"""Kubernetes resource quantities and consumable-capacity request rounding.

Why this exists: the allocation controller and the prepare-time overbooking guard compare
requests against device capacity, and the API hands both over as quantity strings ("10Gi",
"1500m", "1e3"). We need exact integer arithmetic with the same rounding the API server uses:
`Quantity.Value()` rounds a fractional result up (away from zero), so "1500m" bytes is 2.
One implementation in Python integers: no call site parses often enough for speed to matter
(the allocator's model caches what it parses per distinct text).
"""

from __future__ import annotations

from dataclasses import dataclass

INT64_MAX = (1 << 63) - 1
# The largest quantity the allocator's model takes (bytes, millicores, counts): 2**48, 256 TiB of
# memory or 281 million cores. Objects carrying more are refused with a reason (a gated pod, a
# slice) or counted as full (a bound pod, an allocation). The bound keeps the model and its
# compiled kernel inside int64 without a check per operation: a request percentage times a
# device's memory (100 x 2**48), a device's used amount held at the bound plus one, a node's sums
# over its devices (up to 2**14 of them) and its bound pods (sums kept at SATURATED) all stay far
# below 2**63, and every value is exact as a float (the kernel's ranking keys divide them).
MAX_MODEL_QUANTITY = 1 << 48
# Where sums of model quantities stop (a node's bound pods): still comparable, never overflowing.
SATURATED = 1 << 62

# Suffix -> (base, exponent). Binary suffixes multiply by 1024**exp, decimal ones by 10**exp.
BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
# Exponents beyond this cannot produce an int64 from a non-zero mantissa (or are all zero); the
# bound keeps a hostile "1e999999999" from allocating a huge integer.
MAX_EXPONENT = 64


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity, or one that does not fit in int64."""


def _split_number(text: str) -> tuple[int, str, str, str]:
    """Split into (sign, integer digits, fraction digits, suffix); raise on a malformed number."""
    pos = 0
    sign = 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        pos = 1
    start = pos
    while pos < len(text) and text[pos].isdigit() and text[pos].isascii():
        pos += 1
    whole = text[start:pos]
    frac = ""
    if pos < len(text) and text[pos] == ".":
        pos += 1
        fstart = pos
        while pos < len(text) and text[pos].isdigit() and text[pos].isascii():
            pos += 1
        frac = text[fstart:pos]
    if not whole and not frac:
        raise QuantityError(f"quantity {text!r} has no digits")
    return sign, whole, frac, text[pos:]


def _parse_exponent(suffix: str, text: str) -> int:
    digits = suffix[1:]
    esign = 1
    if digits[:1] in ("+", "-"):
        esign = -1 if digits[0] == "-" else 1
        digits = digits[1:]
    if not digits or not (digits.isdigit() and digits.isascii()):
        raise QuantityError(f"quantity {text!r} has a malformed exponent")
    if len(digits) > 4 or int(digits) > MAX_EXPONENT * 4:
        raise QuantityError(f"quantity {text!r} is out of range")
    return esign * int(digits)


def parse_quantity(text: str, scale: int = 0) -> int:
    """Return the quantity as an integer count of 10**-scale units, rounded up (away from zero).

    `scale=0` matches `Quantity.Value()`, `scale=3` matches `Quantity.MilliValue()`.
    """
    if not isinstance(text, str) or not text:
        raise QuantityError("quantity must be a non-empty string")
    if scale < 0 or scale > 9:
        raise QuantityError(f"scale {scale} not in 0..9")
    sign, whole, frac, suffix = _split_number(text)
    mantissa = int(whole + frac) if (whole + frac) else 0
    numerator = mantissa * 10**scale
    denominator = 10 ** len(frac)
    if suffix in BINARY_SUFFIXES:
        numerator *= 1024 ** BINARY_SUFFIXES[suffix]
    else:
        if suffix in DECIMAL_SUFFIXES:
            exponent = DECIMAL_SUFFIXES[suffix]
        elif suffix[:1] in ("e", "E"):
            exponent = _parse_exponent(suffix, text)
        else:
            raise QuantityError(f"quantity {text!r} has an unknown suffix {suffix!r}")
        if mantissa and exponent > MAX_EXPONENT:
            raise QuantityError(f"quantity {text!r} does not fit in int64")
        if exponent >= 0:
            numerator *= 10**exponent
        else:
            denominator *= 10**-exponent
    value: int = -(-numerator // denominator)  # ceil: any remainder rounds up
    if value > INT64_MAX:
        raise QuantityError(f"quantity {text!r} does not fit in int64")
    return sign * value


def format_quantity(value: int, *, binary: bool = True) -> str:
    """Shortest exact quantity string for an integer: 85899345920 -> "80Gi", 3000 -> "3k"."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if binary:
        for suffix, exp in sorted(BINARY_SUFFIXES.items(), key=lambda kv: -kv[1]):
            unit = 1024**exp
            if magnitude % unit == 0:
                return f"{sign}{magnitude // unit}{suffix}"
    for suffix, exp in sorted(DECIMAL_SUFFIXES.items(), key=lambda kv: -kv[1]):
        if exp > 0 and magnitude % 10**exp == 0:
            return f"{sign}{magnitude // 10**exp}{suffix}"
    return f"{sign}{magnitude}"


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """A consumable capacity's request policy (ResourceSlice `capacity.requestPolicy`), as ints.

    Exactly one of `valid_values` or (`min_value`, `max_value`, `step`) applies; all None means
    any request is accepted as is.
    """

    default: int | None = None
    valid_values: tuple[int, ...] = ()
    min_value: int | None = None
    max_value: int | None = None
    step: int | None = None


def round_request(requested: int | None, policy: RequestPolicy, capacity: int) -> int | None:
    """What a request consumes under a policy, or None when the policy forbids it.

    Mirrors the API's consumable-capacity rules: no request -> the default (or the whole
    capacity when there is no default); validValues -> the smallest listed value >= request;
    validRange -> raised to min, then up to the next step above min, refused above max.
    """
    if requested is None:
        requested = policy.default if policy.default is not None else capacity
    if requested < 0:
        return None
    if policy.valid_values:
        for candidate in sorted(policy.valid_values):
            if candidate >= requested:
                return candidate
        return None
    value = requested
    if policy.min_value is not None:
        value = max(value, policy.min_value)
        if policy.step:
            over = value - policy.min_value
            value = policy.min_value + -(-over // policy.step) * policy.step
    if policy.max_value is not None and value > policy.max_value:
        return None
    return value
