"""Placement arithmetic shared by the allocation controller and the prepare-time guard: quantity
parsing and formatting, request policies and their rounding (`quantity`, Python integers: exact
at every int64 edge). The allocator itself is `allocate.Allocator` over a `model.ClusterModel`.
"""

from dra_driver.allocator.quantity import (
    QuantityError,
    RequestPolicy,
    format_quantity,
    parse_quantity,
    round_request,
)

__all__ = [
    "QuantityError",
    "RequestPolicy",
    "format_quantity",
    "parse_quantity",
    "round_request",
]
