"""CEL selectors with the Kubernetes extensions, evaluated by cel-expr-python."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocator.cel import CelError, compile_selector, device_view

DRIVER = "vgpu.dra.dev"
VIEW = device_view(
    DRIVER,
    {
        "productName": {"string": "NVIDIA A10"},
        "index": {"int": 3},
        "migCapable": {"bool": False},
        "driverVersion": {"version": "580.95.5"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:17"},
    },
    {"memory": {"value": "24Gi"}, "cores": {"value": "100"}},
    True,
)


def matches(expression: str) -> bool:
    return compile_selector(expression).matches(VIEW)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'device.driver == "{DRIVER}"', True),
        ('device.driver == "other"', False),
        (f'device.attributes["{DRIVER}"].productName == "NVIDIA A10"', True),
        (
            f'device.attributes["{DRIVER}"].index > 2 && !device.attributes["{DRIVER}"].migCapable',
            True,
        ),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:17"', True),
        (f'device.capacity["{DRIVER}"].memory.compareTo(quantity("20Gi")) > 0', True),
        (f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("24Gi"))', False),
        (f'device.capacity["{DRIVER}"].memory.isLessThan(quantity("25Gi"))', True),
        (f'device.capacity["{DRIVER}"].memory == quantity("24576Mi")', True),  # by value
        (f'device.capacity["{DRIVER}"].cores.asInteger() == 100', True),
        ('quantity("1500m").isInteger()', False),
        ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
        ('quantity("1k").sub(1) == quantity("999")', True),
        ('isQuantity("10Gi") && !isQuantity("ten")', True),
        (f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("580.0.0"))', True),
        (f'device.attributes["{DRIVER}"].driverVersion.compareTo(semver("580.95.5")) == 0', True),
        (f'device.attributes["{DRIVER}"].driverVersion.major() == 580', True),
        ('semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', True),
        ('semver("1.0.0-alpha.2").isGreaterThan(semver("1.0.0-alpha.10"))', False),
        ('isSemver("1.2.3") && !isSemver("1.2")', True),
        ("device.allowMultipleAllocations", True),
        # An unknown domain is an empty map: has() and `in` are false, not errors.
        ('!has(device.attributes["other.example.com"].model)', True),
        ('"model" in device.capacity["other.example.com"]', False),
    ],
)
def test_kubernetes_extensions(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_missing_attribute_in_a_known_domain_is_a_runtime_error() -> None:
    with pytest.raises(CelError, match=r"CEL runtime error.*nosuch"):
        matches(f'device.attributes["{DRIVER}"].nosuch == 1')


def test_non_boolean_and_uncompilable_expressions_are_refused() -> None:
    with pytest.raises(CelError, match="must be boolean, got STRING"):
        matches("device.driver")
    with pytest.raises(CelError, match="does not compile"):
        compile_selector("device.driver ==")
    with pytest.raises(CelError, match="not a semantic version"):
        matches('semver("1.2") == semver("1.2.0")')


def test_each_expression_is_compiled_once() -> None:
    assert compile_selector("device.driver != ''") is compile_selector("device.driver != ''")


@pytest.mark.parametrize(
    ("expression", "fields"),
    [
        (f'device.driver == "{DRIVER}"', {"driver"}),
        (f'device.attributes["{DRIVER}"].index > 2', {"attributes"}),
        (
            f'device . capacity["{DRIVER}"].memory.isGreaterThan(quantity("1Gi")) && '
            "device.allowMultipleAllocations",
            {"capacity", "allowMultipleAllocations"},
        ),
        # Any other use of `device` may read anything: the whole view.
        (
            'device["attributes"].size() > 0',
            {"driver", "attributes", "capacity", "allowMultipleAllocations"},
        ),
        (
            'device.exists(k, k == "capacity")',
            {"driver", "attributes", "capacity", "allowMultipleAllocations"},
        ),
        ('"device" == "device"', {"driver", "attributes", "capacity", "allowMultipleAllocations"}),
    ],
)
def test_fields_an_expression_can_read(expression: str, fields: set[str]) -> None:
    assert compile_selector(expression).fields == fields


def test_a_view_with_only_the_fields_read_gives_the_same_results() -> None:
    """The allocator evaluates each selector on a view holding only the device fields it can
    read; on real devices that gives what the full view gives, errors included."""
    from dra_driver.allocator.model import ClusterModel
    from tests.fixtures.allocator_cluster import node_events

    model = ClusterModel()
    for kind, obj in node_events(0, gpus=4) + node_events(1, product="NVIDIA A10", gpus=2):
        model.apply(kind, obj)
    expressions = [
        f'device.driver == "{DRIVER}"',
        f'device.attributes["{DRIVER}"].productName.contains("A10")',
        f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("30Gi"))',
        'device.attributes["other.example.com"].x == 1',  # empty map: false, not an error
        f'device.attributes["{DRIVER}"].noSuch == 1',  # runtime error
        'device["capacity"].size() > 0',
    ]

    def outcome(expression: str, view: Any) -> bool | str:
        try:
            return compile_selector(expression).matches(view)
        except CelError as exc:
            return str(exc)

    for device in model.devices.values():
        for expression in expressions:
            selector = compile_selector(expression)
            assert outcome(expression, device.cel_view(selector.fields)) == outcome(
                expression, device.view
            ), (expression, device.key)
