"""Placement arithmetic shared by the allocation controller and the prepare-time guard.

Two implementations of every hot function live side by side: `quantity` (pure Python, the
reference) and `_fastquantity` (Cython, used when built). Tests assert that they agree on every
input, so the reference documents the semantics and the extension only makes them fast.
"""

from dra_driver.allocator.quantity import (
    QuantityError,
    RequestPolicy,
    format_quantity,
)
from dra_driver.allocator.quantity import parse_quantity as _py_parse_quantity
from dra_driver.allocator.quantity import round_request as _py_round_request

try:
    from dra_driver.allocator._fastquantity import parse_quantity, round_request

    FAST = True
except ImportError:  # extension not built: keep working, only slower
    parse_quantity = _py_parse_quantity
    round_request = _py_round_request
    FAST = False

__all__ = [
    "FAST",
    "QuantityError",
    "RequestPolicy",
    "format_quantity",
    "parse_quantity",
    "round_request",
]
