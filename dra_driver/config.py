"""`VgpuConfig`: the opaque device configuration users attach to DeviceClasses and claims.

The scheduler copies every opaque config of a claim (and of its DeviceClasses) into the claim's
allocation; the kubelet plugin (`kubelet_plugin.plan`) merges the entries that apply to each
request into one effective config per device. Validation is strict: an unknown field or a bad
value is an error that names the field and the allowed values, so a typo never silently falls
back to a default.

Example (in a ResourceClaim or DeviceClass `config[].opaque.parameters`):

    apiVersion: vgpu.dra.dev/v1alpha1
    kind: VgpuConfig
    computePolicy: balance
    memoryOversubscription: true
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver import names

ComputePolicy = Literal["fixed", "balance", "none"]
LogLevel = Literal["error", "warn", "info", "debug"]
Enforce = Literal["kill", "report"]


class ConfigError(ValueError):
    """An opaque config that is not a valid VgpuConfig; the message is meant for the user."""


class VgpuConfig(BaseModel):
    """One opaque config entry. Absent fields stay unset so merging can tell 'not said' apart."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    api_version: Literal["vgpu.dra.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["VgpuConfig"]
    compute_policy: ComputePolicy = Field(
        default="fixed",
        alias="computePolicy",
        description="fixed: hard SM cap; balance: cap lifted while the GPU is idle; none: no cap",
    )
    memory_oversubscription: bool = Field(
        default=False,
        alias="memoryOversubscription",
        description="allocations beyond free physical memory fall back to managed memory",
    )
    log_level: LogLevel | None = Field(
        default=None, alias="logLevel", description="hook log level inside the container"
    )
    enforce: Enforce = Field(
        default="kill",
        description="node-side memory enforcement: kill processes over the cap, or only report",
    )


class EffectiveConfig(BaseModel):
    """The merged configuration of one allocated device (every field decided)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_policy: ComputePolicy = "fixed"
    memory_oversubscription: bool = False
    log_level: LogLevel | None = None
    enforce: Enforce = "kill"


_ALLOWED: dict[str, str] = {
    "apiVersion": names.CONFIG_API_VERSION,
    "kind": names.CONFIG_KIND,
    "computePolicy": "|".join(get_args(ComputePolicy)),
    "memoryOversubscription": "true|false",
    "logLevel": "|".join(get_args(LogLevel)),
    "enforce": "|".join(get_args(Enforce)),
}


# A VgpuConfig is a flat object of scalars; anything deeper is refused before it is validated
# or echoed (a value nested thousands deep would otherwise blow Python's recursion limit).
MAX_DEPTH = 8
# Values are echoed into errors shortened: errors reach the kubelet's events and logs.
_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxdict = _SHORT.maxlist = 4
_SHORT.maxlevel = 2


def parse_config(parameters: Any) -> VgpuConfig:
    """Validate one opaque `parameters` object; raise ConfigError naming the offending field."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(
            f"opaque config parameters must be an object with apiVersion "
            f"{names.CONFIG_API_VERSION!r} and kind {names.CONFIG_KIND!r}, got "
            f"{type(parameters).__name__}"
        )
    if _deeper_than(parameters, MAX_DEPTH):
        raise ConfigError(
            f"invalid {names.CONFIG_KIND}: nested more than {MAX_DEPTH} levels deep (a "
            f"{names.CONFIG_KIND} is a flat object: {', '.join(_ALLOWED)})"
        )
    try:
        return VgpuConfig.model_validate(dict(parameters))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, parameters)) from None


def _describe(exc: ValidationError, parameters: Mapping[str, Any]) -> str:
    problems: list[str] = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(object)"
        if error["type"] == "extra_forbidden":
            known = ", ".join(_ALLOWED)
            problems.append(f"unknown field {_SHORT.repr(field)} (known fields: {known})")
        elif error["type"] == "missing":
            problems.append(f"missing field {field!r} (must be {_ALLOWED.get(field, '?')!r})")
        else:
            value = parameters.get(field, error.get("input"))
            allowed = _ALLOWED.get(field)
            hint = f"; allowed: {allowed}" if allowed else ""
            problems.append(f"field {field!r} has invalid value {_SHORT.repr(value)}{hint}")
    return f"invalid {names.CONFIG_KIND}: " + "; ".join(problems)


def _deeper_than(value: Any, limit: int) -> bool:
    """True when containers nest more than `limit` levels (iterative: no recursion to blow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def merge_configs(configs: Iterable[VgpuConfig]) -> EffectiveConfig:
    """Fold entries in order: a field set by a later entry overrides earlier ones."""
    merged: dict[str, Any] = {}
    for config in configs:
        for field in config.model_fields_set - {"api_version", "kind"}:
            merged[field] = getattr(config, field)
    return EffectiveConfig(**merged)
