"""DRA device selectors in CEL: a maintained runtime plus the Kubernetes extensions they use.

Why this exists: claims and DeviceClasses select devices with CEL expressions over `device`
(`driver`, `attributes[domain].name`, `capacity[domain].name`, `allowMultipleAllocations`).
We do not write a CEL parser: expressions are compiled (once each) and evaluated by
`cel-expr-python`, Google's binding of cel-cpp (the fastest of the PyPI runtimes, ~10 us per
evaluation here). What that runtime lacks is what Kubernetes adds, and that is all this module
supplies:

- the quantity library: `quantity(s)`, `isQuantity(s)`, and on quantities `compareTo`,
  `isGreaterThan`, `isLessThan`, `add`, `sub`, `sign`, `isInteger`, `asInteger`,
  `asApproximateFloat`;
- the semver library: `semver(s)`, `isSemver(s)`, and on versions `compareTo`, `isGreaterThan`,
  `isLessThan`, `major`, `minor`, `patch`;
- DRA's rule that an attribute or capacity domain the device does not have is an empty map, so
  `device.attributes["other.domain"].x` is a "no such key" error and `has(...)` / `in` are false,
  rather than a "no such domain" error.

cel-expr-python cannot carry Python objects as opaque CEL values, so a quantity is a one-key map
`{"k8s.quantity": "<value in nano-units>"}` and a version `{"k8s.semver": "<normalised text>"}`.
Equality of two quantities (or versions) is then map equality of exact values, as in Kubernetes;
the library functions accept only these maps and fail on anything else. Unknown domains are
handled lexically: the string literal indexed after `attributes[` / `capacity[` in an expression
gets an empty map when the device lacks that domain (a computed domain name is not covered; see
docs/scheduling.md).

A runtime error (missing attribute, wrong type) is reported, like kube-scheduler does, as an error
of the claim, not as "does not match".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel

from dra_driver.allocator import parse_quantity
from dra_driver.allocator.quantity import QuantityError

QUANTITY_KEY = "k8s.quantity"
SEMVER_KEY = "k8s.semver"
NANO = 9  # quantities are kept exact in units of 10**-9
ONE = 1_000_000_000  # 10**NANO

_DOMAIN_LITERAL = re.compile(r"""(?:attributes|capacity)\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]""")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


class CelError(ValueError):
    """An expression that does not compile, or that fails or is not boolean at evaluation."""


# ---------------------------------------------------------------- value encodings


def nano_units(text: str) -> int:
    """A quantity in exact units of 10**-9 (beyond int64 nano-units the value is whole)."""
    try:
        return parse_quantity(text, NANO)
    except QuantityError:
        return parse_quantity(text, 0) * ONE


@functools.lru_cache(maxsize=4096)
def _quantity_text(text: str) -> str:
    return str(nano_units(text))


def quantity_value(text: str) -> dict[str, str]:
    """A quantity string as the CEL value our library functions understand."""
    return {QUANTITY_KEY: _quantity_text(text)}


def _nano(value: Any) -> int:
    if isinstance(value, Mapping) and QUANTITY_KEY in value:
        return int(str(value[QUANTITY_KEY]))
    raise CelError(f"not a quantity: {value!r}")


def _quantity(text: str) -> dict[str, str]:
    try:
        return quantity_value(text)
    except QuantityError as exc:
        raise CelError(str(exc)) from None


def _is_quantity(text: str) -> bool:
    try:
        nano_units(text)
    except QuantityError:
        return False
    return True


def semver_value(text: str) -> dict[str, str]:
    """A semver 2.0 string as our CEL version value."""
    if not _SEMVER.match(text):
        raise CelError(f"not a semantic version: {text!r}")
    return {SEMVER_KEY: text}


def _semver_key(value: Any) -> tuple[int, int, int, tuple[tuple[int, int, str], ...] | None]:
    if not (isinstance(value, Mapping) and SEMVER_KEY in value):
        raise CelError(f"not a version: {value!r}")
    match = _SEMVER.match(str(value[SEMVER_KEY]))
    if match is None:
        raise CelError(f"not a version: {value!r}")
    pre = match.group(4)
    pre_key = (
        tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
        if pre
        else None
    )
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), pre_key


def _compare_semver(a: Any, b: Any) -> int:
    ka, kb = _semver_key(a), _semver_key(b)
    if ka[:3] != kb[:3]:
        return -1 if ka[:3] < kb[:3] else 1
    pa, pb = ka[3], kb[3]
    if pa == pb:
        return 0
    if pa is None:  # a release ranks above its pre-releases
        return 1
    if pb is None:
        return -1
    return -1 if pa < pb else 1


def _compare(a: Any, b: Any) -> int:
    """compareTo for two quantities or two versions (the only pairs Kubernetes defines)."""
    if isinstance(a, Mapping) and QUANTITY_KEY in a:
        x, y = _nano(a), _nano(b)
        return (x > y) - (x < y)
    return _compare_semver(a, b)


def _to_quantity(nano: int) -> dict[str, str]:
    return {QUANTITY_KEY: str(nano)}


def _add(a: Any, b: Any) -> dict[str, str]:
    other = b * ONE if isinstance(b, int) else _nano(b)
    return _to_quantity(_nano(a) + other)


def _sub(a: Any, b: Any) -> dict[str, str]:
    other = b * ONE if isinstance(b, int) else _nano(b)
    return _to_quantity(_nano(a) - other)


def _as_integer(a: Any) -> int:
    nano = _nano(a)
    if nano % ONE:
        raise CelError("quantity is not an integer")
    value = nano // ONE
    if not -(1 << 63) <= value < (1 << 63):
        raise CelError("quantity does not fit in int64")
    return value


def _sign(a: Any) -> int:
    nano = _nano(a)
    return (nano > 0) - (nano < 0)


def _build_env() -> Any:
    dyn, string, boolean, integer = cel.Type.DYN, cel.Type.STRING, cel.Type.BOOL, cel.Type.INT
    mapping = cel.Type.MAP
    valmap = cel.Type.Map(string, string)

    def fn(name: str, *overloads: Any) -> Any:
        return cel.FunctionDecl(name, list(overloads))

    def member(oid: str, ret: Any, params: list[Any], impl: Any) -> Any:
        return cel.Overload(oid, ret, params, is_member=True, impl=impl)

    def glob(oid: str, ret: Any, params: list[Any], impl: Any) -> Any:
        return cel.Overload(oid, ret, params, impl=impl)

    functions = [
        fn("quantity", glob("k8s_quantity", valmap, [string], _quantity)),
        fn("isQuantity", glob("k8s_is_quantity", boolean, [string], _is_quantity)),
        fn("semver", glob("k8s_semver", valmap, [string], semver_value)),
        fn("isSemver", glob("k8s_is_semver", boolean, [string], lambda s: bool(_SEMVER.match(s)))),
        fn("compareTo", member("k8s_compare_to", integer, [mapping, mapping], _compare)),
        fn(
            "isGreaterThan",
            member("k8s_greater", boolean, [mapping, mapping], lambda a, b: _compare(a, b) > 0),
        ),
        fn(
            "isLessThan",
            member("k8s_less", boolean, [mapping, mapping], lambda a, b: _compare(a, b) < 0),
        ),
        fn(
            "add",
            member("k8s_add_q", valmap, [mapping, mapping], _add),
            member("k8s_add_int", valmap, [mapping, integer], _add),
        ),
        fn(
            "sub",
            member("k8s_sub_q", valmap, [mapping, mapping], _sub),
            member("k8s_sub_int", valmap, [mapping, integer], _sub),
        ),
        fn("sign", member("k8s_sign", integer, [mapping], _sign)),
        fn(
            "isInteger",
            member("k8s_is_integer", boolean, [mapping], lambda a: _nano(a) % ONE == 0),
        ),
        fn("asInteger", member("k8s_as_integer", integer, [mapping], _as_integer)),
        fn(
            "asApproximateFloat",
            member("k8s_as_float", cel.Type.DOUBLE, [mapping], lambda a: _nano(a) / ONE),
        ),
        fn("major", member("k8s_major", integer, [mapping], lambda a: _semver_key(a)[0])),
        fn("minor", member("k8s_minor", integer, [mapping], lambda a: _semver_key(a)[1])),
        fn("patch", member("k8s_patch", integer, [mapping], lambda a: _semver_key(a)[2])),
    ]
    return cel.NewEnv(variables={"device": dyn}, functions=functions)


_ENV: Any = None


def _env() -> Any:
    global _ENV  # noqa: PLW0603 - one environment per process, built on first use
    if _ENV is None:
        _ENV = _build_env()
    return _ENV


# ---------------------------------------------------------------- devices and expressions


def device_view(
    driver: str,
    attributes: Mapping[str, Mapping[str, Any]],
    capacity: Mapping[str, Mapping[str, Any]],
    allow_multiple: bool,
) -> dict[str, Any]:
    """The `device` variable for one device, from its slice entry's attributes and capacity.

    Names without a domain belong to the driver's domain (the API's rule). Values keep their
    DRA types: int, bool, string, version (-> our version value); capacities are quantities.
    """
    attrs: dict[str, dict[str, Any]] = {}
    for name, typed in attributes.items():
        domain, _, ident = name.rpartition("/")
        value: Any
        if "int" in typed:
            value = int(typed["int"])
        elif "bool" in typed:
            value = bool(typed["bool"])
        elif "string" in typed:
            value = str(typed["string"])
        elif "version" in typed:
            value = {SEMVER_KEY: str(typed["version"])}
        else:
            continue  # a type this version does not know: invisible, as in the API
        attrs.setdefault(domain or driver, {})[ident] = value
    caps: dict[str, dict[str, Any]] = {}
    for name, entry in capacity.items():
        domain, _, ident = name.rpartition("/")
        caps.setdefault(domain or driver, {})[ident] = quantity_value(str(entry.get("value", "0")))
    return {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": allow_multiple,
    }


_DEVICE_USE = re.compile(r"\bdevice\b(\s*\.\s*(\w+))?")
DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")


def device_fields(source: str) -> frozenset[str]:
    """The fields of `device` an expression can read: every `device` in its text followed by
    `.driver`, `.attributes`, `.capacity` or `.allowMultipleAllocations`; any other use
    (`device[...]`, a macro over `device`, the word inside a string) counts as all of them."""
    used: set[str] = set()
    for match in _DEVICE_USE.finditer(source):
        field = match.group(2)
        if field not in DEVICE_FIELDS:
            return frozenset(DEVICE_FIELDS)
        used.add(field)
    return frozenset(used)


@dataclass(frozen=True, slots=True)
class Selector:
    """One compiled expression, the domains it names literally (for the empty-map rule) and the
    device fields it can read (a view without the others gives the same result, cheaper)."""

    source: str
    program: Any
    domains: tuple[str, ...]
    fields: frozenset[str] = frozenset(DEVICE_FIELDS)

    def matches(self, view: Mapping[str, Any]) -> bool:
        """Evaluate on one device view; CelError for runtime errors or non-boolean results."""
        data = view
        missing = [
            d for d in self.domains if d not in view["attributes"] or d not in view["capacity"]
        ]
        if missing:
            data = dict(view)
            data["attributes"] = {**{d: {} for d in missing}, **view["attributes"]}
            data["capacity"] = {**{d: {} for d in missing}, **view["capacity"]}
        result = self.program.eval(data={"device": data})
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            raise CelError(f"CEL runtime error in {self.source!r}: {result.value()}")
        raise CelError(f"CEL expression {self.source!r} must be boolean, got {kind.name()}")


_COMPILED: dict[str, Selector] = {}


def compile_selector(source: str) -> Selector:
    """Compile once per process (cached by text); CelError names the expression and the fault."""
    selector = _COMPILED.get(source)
    if selector is not None:
        return selector
    try:
        program = _env().compile(source)
    except RuntimeError as exc:
        raise CelError(f"CEL expression {source!r} does not compile: {exc}") from None
    domains = tuple(dict.fromkeys(a or b for a, b in _DOMAIN_LITERAL.findall(source) if (a or b)))
    selector = Selector(source, program, domains, device_fields(source))
    _COMPILED[source] = selector
    return selector
