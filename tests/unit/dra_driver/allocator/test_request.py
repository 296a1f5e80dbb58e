"""Claims and policies as hostile input (dra_driver.allocator.request), without a cluster.

Proves:
1. an ExactCount request with count 0 (or below, or not an integer) is refused with
   RequestError naming the claim and the count; it is never parsed as "all devices" nor as one
   whole GPU. A missing count is 1, as the API defaults it;
2. more than 32 devices per request or per claim (the API's AllocationResultsMaxSize, which
   kube-scheduler enforces too) is refused;
3. capacity quantities that are negative, beyond int64, too long to convert, or above the
   model's bound (MAX_MODEL_QUANTITY) are refused with RequestError, never QuantityError,
   OverflowError or ValueError; the bound itself is accepted;
4. a claim of any other shape (a list where an object belongs, a number for a name, ...) is
   refused with RequestError naming the claim: the caller's loop never sees another exception;
5. a policy annotation's list of GPU types or UUIDs is bounded (bytes and items).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.allocator.quantity import MAX_MODEL_QUANTITY
from dra_driver.allocator.request import (
    INCLUDE_TYPE,
    MAX_COUNT,
    MAX_POLICY_ITEMS,
    MAX_POLICY_LIST_BYTES,
    Policy,
    RequestError,
    parse_claim,
)
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, claim_obj

CLASSES = {DRIVER: DEVICE_CLASS}
JSON = dict[str, Any]


def exactly(obj: JSON) -> JSON:
    request: JSON = obj["spec"]["devices"]["requests"][0]["exactly"]
    return request


# ---------------------------------------------------------------- 1, 2: count


def test_a_missing_count_is_one_device_as_the_api_defaults_it() -> None:
    obj = claim_obj("c")
    del exactly(obj)["count"]
    (request,) = parse_claim(obj, CLASSES).requests
    assert request.alternatives[0].count == 1
    assert not request.alternatives[0].all_devices


@pytest.mark.parametrize("count", [0, -1, -(1 << 63)])
def test_a_count_of_zero_or_less_is_refused_never_all_or_a_whole_gpu(count: int) -> None:
    with pytest.raises(RequestError) as refused:
        parse_claim(claim_obj("zero", count=count), CLASSES)
    message = str(refused.value)
    assert "ResourceClaim default/zero" in message
    assert f"count {count}" in message
    assert "at least 1 device" in message


@pytest.mark.parametrize("count", ["1", 1.0, True, None, [1], {"n": 1}])
def test_a_count_that_is_not_an_integer_is_refused(count: Any) -> None:
    obj = claim_obj("odd")
    exactly(obj)["count"] = count
    with pytest.raises(RequestError, match=f"count .*an integer from 1 to {MAX_COUNT}"):
        parse_claim(obj, CLASSES)


def test_more_devices_than_the_apis_limit_per_claim_are_refused() -> None:
    assert MAX_COUNT == 32  # resource.k8s.io/v1 AllocationResultsMaxSize
    assert parse_claim(claim_obj("max", count=32), CLASSES).requests[0].alternatives[0].count == 32
    with pytest.raises(RequestError, match="count 33: at most 32 devices per claim"):
        parse_claim(claim_obj("over", count=33), CLASSES)
    with pytest.raises(RequestError, match=f"count {1 << 62}: at most 32"):
        parse_claim(claim_obj("huge", count=1 << 62), CLASSES)
    # Two requests of 20: each fits, the claim does not.
    obj = claim_obj("two", count=20)
    second = copy.deepcopy(obj["spec"]["devices"]["requests"][0])
    second["name"] = "gpu2"
    obj["spec"]["devices"]["requests"].append(second)
    with pytest.raises(RequestError, match="at least 40 devices; at most 32 per claim"):
        parse_claim(obj, CLASSES)


# ---------------------------------------------------------------- 3: quantities


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("-1Gi", "must not be negative"),
        ("9223372036854775808", "does not fit in int64"),
        ("8Ei", "does not fit in int64"),
        ("1e400", "out of range"),
        ("9" * 5000, "capacity.requests['memory']"),
        (str(MAX_MODEL_QUANTITY + 1), "out of range"),
        ("1Pi", "out of range"),  # 2**50 > 2**48
        ("lots", "capacity.requests['memory']"),
    ],
)
def test_a_quantity_out_of_range_is_a_request_error(value: str, words: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_claim(claim_obj("q", memory=value), CLASSES)
    assert words in str(refused.value)
    assert "ResourceClaim default/q" in str(refused.value)


def test_the_models_bound_itself_is_accepted() -> None:
    claim = parse_claim(claim_obj("edge", memory=str(MAX_MODEL_QUANTITY)), CLASSES)
    assert claim.requests[0].alternatives[0].requested("memory") == MAX_MODEL_QUANTITY


# ---------------------------------------------------------------- 4: any other shape


def _bent(path: tuple[Any, ...], value: Any) -> JSON:
    obj = claim_obj("bent", count=2)
    target: Any = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return obj


REQUEST = ("spec", "devices", "requests", 0)
SHAPES = {
    "spec a list": (("spec",), []),
    "devices a string": (("spec", "devices"), "gpu"),
    "requests an object": (("spec", "devices", "requests"), {"a": 1}),
    "request a number": (REQUEST, 7),
    "name a number": ((*REQUEST, "name"), 3),
    "exactly a list": ((*REQUEST, "exactly"), [1]),
    "class a list": ((*REQUEST, "exactly", "deviceClassName"), ["x"]),
    "capacity a string": ((*REQUEST, "exactly", "capacity"), "1Gi"),
    "capacity requests a list": ((*REQUEST, "exactly", "capacity"), {"requests": ["1Gi"]}),
    "selectors an object": ((*REQUEST, "exactly", "selectors"), {"cel": "x"}),
    "selector a string": ((*REQUEST, "exactly", "selectors"), ["x"]),
    "cel a string": ((*REQUEST, "exactly", "selectors"), [{"cel": "true"}]),
    "tolerations a string": ((*REQUEST, "exactly", "tolerations"), "all"),
    "toleration a number": ((*REQUEST, "exactly", "tolerations"), [1]),
    "firstAvailable an object": ((*REQUEST, "firstAvailable"), {"a": 1}),
    "constraints an object": (("spec", "devices", "constraints"), {"a": 1}),
    "constraint a string": (("spec", "devices", "constraints"), ["x"]),
    "config a string": (("spec", "devices", "config"), "x"),
    "annotations a list": (("metadata", "annotations"), ["x"]),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_any_other_shape_is_a_request_error_naming_the_claim(case: str) -> None:
    path, value = SHAPES[case]
    obj = _bent(path, value)
    if case == "firstAvailable an object":
        del obj["spec"]["devices"]["requests"][0]["exactly"]
    with pytest.raises(RequestError, match="ResourceClaim default/bent"):
        parse_claim(obj, CLASSES)


def test_a_claim_that_is_not_an_object_is_a_request_error() -> None:
    with pytest.raises(RequestError):
        parse_claim([], CLASSES)  # type: ignore[arg-type]


# ---------------------------------------------------------------- 5: policy lists


def test_policy_lists_are_bounded_in_bytes_and_items() -> None:
    fine = ",".join(f"T{i}" for i in range(MAX_POLICY_ITEMS))
    assert len(Policy.from_annotations({INCLUDE_TYPE: fine}).include_types) == MAX_POLICY_ITEMS
    with pytest.raises(RequestError, match=f"{MAX_POLICY_ITEMS + 1} items"):
        Policy.from_annotations({INCLUDE_TYPE: fine + ",X"})
    with pytest.raises(RequestError, match=f"{MAX_POLICY_LIST_BYTES + 1} bytes"):
        Policy.from_annotations({INCLUDE_TYPE: "A" * (MAX_POLICY_LIST_BYTES + 1)})
    # The alias is the name the message gives when the pod used it.
    with pytest.raises(RequestError, match=r"annotation vgpu\.dra\.dev/gpu-type: 102400 bytes"):
        Policy.from_annotations({"vgpu.dra.dev/gpu-type": "A" * 102400})


def test_a_bad_policy_value_is_echoed_shortened() -> None:
    with pytest.raises(RequestError) as refused:
        Policy.from_annotations({"vgpu.dra.dev/node-scheduler-policy": "x" * 100_000})
    assert len(str(refused.value)) < 200
