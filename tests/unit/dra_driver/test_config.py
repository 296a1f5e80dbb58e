"""VgpuConfig: strict validation with actionable messages, and field-wise merging."""

from __future__ import annotations

import pytest

from dra_driver.config import ConfigError, EffectiveConfig, merge_configs, parse_config
from tests.fixtures.claimdata import vgpu_config


def test_defaults_when_only_identity_given() -> None:
    merged = merge_configs([parse_config(vgpu_config())])
    assert merged == EffectiveConfig(
        compute_policy="fixed", memory_oversubscription=False, log_level=None
    )


def test_all_fields_parse() -> None:
    config = parse_config(
        vgpu_config(computePolicy="balance", memoryOversubscription=True, logLevel="debug")
    )
    assert (config.compute_policy, config.memory_oversubscription, config.log_level) == (
        "balance",
        True,
        "debug",
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"computePolicy": "fast"},
            "'computePolicy' has invalid value 'fast'; allowed: fixed|balance|none",
        ),
        (
            {"memoryOversubscription": "yes"},
            "'memoryOversubscription' has invalid value 'yes'; allowed: true|false",
        ),
        (
            {"logLevel": "trace"},
            "'logLevel' has invalid value 'trace'; allowed: error|warn|info|debug",
        ),
        ({"computPolicy": "fixed"}, "unknown field 'computPolicy'"),
    ],
)
def test_bad_values_name_field_and_allowed_values(fields: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(vgpu_config(**fields))
    assert expected in str(err.value)


def test_wrong_identity_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"'apiVersion' has invalid value 'vgpu.dra.dev/v1'"):
        parse_config({"apiVersion": "vgpu.dra.dev/v1", "kind": "VgpuConfig"})
    with pytest.raises(ConfigError, match="missing field 'kind'"):
        parse_config({"apiVersion": "vgpu.dra.dev/v1alpha1"})


def test_non_object_parameters() -> None:
    with pytest.raises(ConfigError, match="must be an object"):
        parse_config(["computePolicy", "none"])


def test_later_entries_override_only_the_fields_they_set() -> None:
    merged = merge_configs(
        [
            parse_config(vgpu_config(computePolicy="none", logLevel="info")),
            parse_config(vgpu_config(memoryOversubscription=True)),
            parse_config(vgpu_config(computePolicy="balance")),
        ]
    )
    assert merged == EffectiveConfig(
        compute_policy="balance", memory_oversubscription=True, log_level="info"
    )


def test_explicit_default_still_overrides() -> None:
    merged = merge_configs(
        [
            parse_config(vgpu_config(computePolicy="none")),
            parse_config(vgpu_config(computePolicy="fixed")),
        ]
    )
    assert merged.compute_policy == "fixed"


def nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize("where", ["unknown field", "known field"])
def test_config_nested_thousands_deep_is_a_clear_error(where: str) -> None:
    parameters = vgpu_config()
    key = "x" if where == "unknown field" else "computePolicy"
    parameters[key] = nested(5000)  # deeper than Python's recursion limit
    with pytest.raises(ConfigError, match="nested more than 8 levels deep"):
        parse_config(parameters)


def test_echoed_values_are_shortened() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(vgpu_config(computePolicy="f" * 10_000))
    assert "field 'computePolicy' has invalid value 'fff" in str(err.value)
    assert len(str(err.value)) < 400
