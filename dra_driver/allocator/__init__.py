"""Placement arithmetic shared by the allocation controller and the prepare-time guard.

Quantity parsing has two implementations side by side: `quantity` (pure Python, the reference)
and `_fastquantity` (Cython, used when built). Tests assert that they agree on every input, so
the reference documents the semantics and the extension only makes it fast. Request rounding
has one (`quantity.round_request`, Python integers: exact at every int64 edge).
"""

from dra_driver.allocator.quantity import (
    QuantityError,
    RequestPolicy,
    format_quantity,
    round_request,
)
from dra_driver.allocator.quantity import parse_quantity as _py_parse_quantity

try:
    from dra_driver.allocator._fastquantity import parse_quantity

    FAST = True
except ImportError:  # extension not built: keep working, only slower
    parse_quantity = _py_parse_quantity
    FAST = False

__all__ = [
    "FAST",
    "QuantityError",
    "RequestPolicy",
    "format_quantity",
    "parse_quantity",
    "round_request",
]
