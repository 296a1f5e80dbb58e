"""Claims are hostile input: whatever one holds, it fails alone, with a message that says what.

What this proves (issue 27: "no object the API accepts stops a loop of the plugin"; prepare is
the plugin's path for API objects, and one bad claim must cost only itself):
1. quantities at the int64 edges and beyond (memory, cores; strings, JSON integers, floats,
   exponents) fail the claim naming the capacity; a claim asking one device for more than it
   has, alone or in two shares whose sum passes int64, is refused as wrong (not overbooked);
2. an opaque config that the API client cut for being nested deeper than 64 levels
   (`kube.PRUNED`, produced here by the client's own decoder) fails with a message that says so;
3. fields of the wrong type at every level fail naming the field; fields this driver does not
   know are ignored in the allocation and refused in our opaque config;
4. huge strings and long lists fail the claim, and no error echoes them whole;
5. every one of them fails in the same call as a good claim, which is prepared.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.allocator.quantity import INT64_MAX
from kubelet_plugin.claims import ClaimError, ClaimRef, parse_allocation
from kubelet_plugin.plan import plan_claim
from kubelet_plugin.prepare import Preparer
from tests.fixtures.claimdata import (
    DRIVER,
    NODE,
    GiB,
    claim,
    config_entry,
    inventory,
    result,
    vgpu_config,
)
from tests.fixtures.prepare import Claims, node_settings

MiB = 1 << 20
HUGE = "x" * (1 << 20)
# Errors reach the kubelet, Events and logs: whatever the claim holds, they stay this short.
MAX_ERROR_CHARS = 2000

Edit = Callable[[dict[str, Any]], None]


def _results(obj: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = obj["status"]["allocation"]["devices"]["results"]
    return results


def consumed(**capacity: Any) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        _results(obj)[0]["consumedCapacity"] = capacity

    return edit


def at(path: str, value: Any) -> Edit:
    """Set the field at dotted `path` (list indexes as numbers) to `value`."""

    def edit(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return edit


def opaque(parameters: Any) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        obj["status"]["allocation"]["devices"]["config"] = [config_entry(parameters)]

    return edit


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


HOSTILE: dict[str, tuple[Edit, str]] = {
    # 1. quantities
    "memory int64 max": (
        consumed(memory=str(INT64_MAX)),
        f"asks device gpu-0 for memory {INT64_MAX} bytes and cores 0, more than it has",
    ),
    "memory int64 max + 1": (
        consumed(memory=str(INT64_MAX + 1)),
        "consumedCapacity memory='9223372036854775808' of device 'gpu-0': quantity "
        "'9223372036854775808' does not fit in int64",
    ),
    "memory 8Ei": (consumed(memory="8Ei"), "quantity '8Ei' does not fit in int64"),
    "memory int64 min": (
        consumed(memory=str(-INT64_MAX - 1)),
        "quantity '-9223372036854775808' does not fit in int64",
    ),
    "memory negative": (consumed(memory="-1"), "consumes memory=-1; must be > 0"),
    "memory 1e19": (consumed(memory="1e19"), "quantity '1e19' does not fit in int64"),
    "memory huge exponent": (consumed(memory="1e999999"), "quantity '1e999999' is out of range"),
    "memory a JSON integer past int64": (
        consumed(memory=1 << 64),
        "quantity '18446744073709551616' does not fit in int64",
    ),
    "memory a JSON float": (consumed(memory=1e300), "must be a quantity, got float"),
    "memory a boolean": (consumed(memory=True), "must be a quantity, got a boolean"),
    "memory an object": (consumed(memory={"value": "1Gi"}), "must be a quantity, got an object"),
    "memory 1 MiB of digits": (
        consumed(memory="9" * MiB),
        f"is {MiB} characters long, not a quantity",
    ),
    "cores int64 max": (
        consumed(memory="1Gi", cores=str(INT64_MAX)),
        f"consumes cores={INT64_MAX}; allowed 0..100",
    ),
    "qualified cores negative": (
        consumed(**{"memory": "1Gi", "vgpu.dra.dev/cores": "-5"}),
        "consumes cores=-5; allowed 0..100",
    ),
    # 2. cut by the client's decoder
    "opaque config cut by the decoder": (
        opaque(kube.PRUNED),
        "status.allocation.devices.config[0].opaque.parameters is nested deeper than 64 levels",
    ),
    "opaque config holding a cut subtree": (
        opaque({**vgpu_config(), "x": [{"y": kube.PRUNED}]}),
        "is nested deeper than 64 levels and could not be read",
    ),
    "opaque config 100 levels deep": (
        opaque({**vgpu_config(), "x": deep(100)}),
        "invalid VgpuConfig: nested more than 8 levels deep",
    ),
    # 3. types and unknown fields
    "status a list": (at("status", ["allocation"]), "status must be an object, got a list"),
    "allocation a string": (
        at("status.allocation", "yes"),
        "status.allocation must be an object, got the string 'yes'",
    ),
    "results an object": (
        at("status.allocation.devices.results", {"0": {}}),
        "status.allocation.devices.results must be a list, got an object",
    ),
    "result a number": (
        at("status.allocation.devices.results.0", 7),
        "status.allocation.devices.results[0] must be an object, got int",
    ),
    "device a list": (
        at("status.allocation.devices.results.0.device", ["gpu-0"]),
        "results[0].device must be a string, got a list",
    ),
    "consumedCapacity a list": (
        at("status.allocation.devices.results.0.consumedCapacity", ["1Gi"]),
        "results[0].consumedCapacity must be an object, got a list",
    ),
    "adminAccess a string": (
        at("status.allocation.devices.results.0.adminAccess", "true"),
        "results[0].adminAccess must be true or false, got the string 'true'",
    ),
    "shareID a path": (
        at("status.allocation.devices.results.0.shareID", "../../etc"),
        "results[0].shareID '../../etc' is not a UID",
    ),
    "config requests a string": (
        at(
            "status.allocation.devices.config",
            [{**config_entry(vgpu_config()), "requests": "gpu"}],
        ),
        "config[0].requests must be a list, got the string 'gpu'",
    ),
    "config opaque a number": (
        at("status.allocation.devices.config", [{"source": "FromClaim", "opaque": 3}]),
        "config[0].opaque must be an object, got int",
    ),
    "unknown field in our opaque config": (
        opaque(vgpu_config(computePolicy="fixed", turbo=True)),
        "invalid VgpuConfig: unknown field 'turbo'",
    ),
    # 4. huge strings, long lists
    "a huge device name": (
        at("status.allocation.devices.results.0.device", HUGE),
        f"results[0].device is {len(HUGE)} characters long, more than the 253",
    ),
    "a huge request name": (
        at("status.allocation.devices.results.0.request", HUGE),
        "results[0].request is 1048576 characters long",
    ),
    "a huge pool name": (
        at("status.allocation.devices.results.0.pool", HUGE),
        "results[0].pool is 1048576 characters long",
    ),
    "a huge capacity name": (
        consumed(**{HUGE + "/memory": "1e99"}),
        "xxxx...(1048583 chars)='1e99' of device 'gpu-0': quantity '1e99' does not fit",
    ),
    "a huge opaque value": (opaque(vgpu_config(computePolicy=HUGE)), "invalid value 'xxxxx"),
    "10000 results": (
        lambda obj: _results(obj).extend([copy.deepcopy(_results(obj)[0])] * 9999),
        "results has 10000 entries, more than the 256 this driver reads",
    ),
    "10000 config entries": (
        at("status.allocation.devices.config", [config_entry(vgpu_config())] * 10000),
        "config has 10000 entries, more than the 256",
    ),
    "10000 requests in a config entry": (
        at(
            "status.allocation.devices.config",
            [config_entry(vgpu_config(), requests=["gpu"] * 10000)],
        ),
        "config[0].requests has 10000 entries",
    ),
}


def hostile_claim(name: str) -> dict[str, Any]:
    edit, _ = HOSTILE[name]
    obj = claim([result("gpu-0", memory="1Gi")], name="hostile")
    edit(obj)
    return obj


@pytest.fixture
def preparer(tmp_path: Path) -> Iterator[tuple[Preparer, Claims]]:
    claims = Claims()
    p = Preparer(node_settings(tmp_path), inventory(memory=16 * GiB), claims)
    p.reconcile()
    yield p, claims
    p.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_claim_fails_alone_with_a_clear_error(
    name: str, preparer: tuple[Preparer, Claims]
) -> None:
    prep, claims = preparer
    good = claims.add(claim([result("gpu-1", memory="1Gi")], name="good"))
    bad = claims.add(hostile_claim(name))
    outcomes = prep.prepare([good, bad])
    assert outcomes[good.uid].error == ""
    error = outcomes[bad.uid].error
    assert HOSTILE[name][1] in error
    assert outcomes[bad.uid].reason == "invalid_claim", error
    assert len(error) < MAX_ERROR_CHARS
    assert set(prep.prepared()) == {good.uid}


def test_unknown_fields_of_the_allocation_are_ignored(preparer: tuple[Preparer, Claims]) -> None:
    """New API fields must not break an older driver."""
    prep, claims = preparer
    obj = claim([result("gpu-0", memory="1Gi")])
    _results(obj)[0]["bindingConditions"] = ["x"]
    _results(obj)[0]["someFutureField"] = {"nested": [1, 2, {"deeper": None}]}
    obj["status"]["allocation"]["someFutureField"] = "y"
    obj["status"]["allocation"]["devices"]["someFutureField"] = 3
    ref = claims.add(obj)
    assert prep.prepare([ref])[ref.uid].error == ""


def test_a_config_cut_by_the_clients_own_decoder_is_named() -> None:
    """The claim as `kube.decode_json(prune=True)` (lists and watches) leaves it: deeper than
    the standard decoder can go, so cut at 64 levels."""
    obj = claim([result("gpu-0", memory="1Gi")])
    obj["status"]["allocation"]["devices"]["config"] = [
        config_entry({**vgpu_config(), "extra": "DEEP"})
    ]
    text = json.dumps(obj).replace('"DEEP"', '{"a":' * 5000 + "1" + "}" * 5000)
    with pytest.raises(kube.TooDeep):
        kube.decode_json(text)
    pruned = kube.decode_json(text, prune=True)
    ref = ClaimRef("default", "claim-a", obj["metadata"]["uid"])
    with pytest.raises(ClaimError) as err:
        parse_allocation(pruned, ref, driver=DRIVER, node_name=NODE)
    assert "opaque.parameters is nested deeper than 64 levels and could not be read" in str(
        err.value
    )


def test_two_shares_past_int64_together_are_refused() -> None:
    """Each share fits in int64 and passes parsing; their sum does not (Python does not wrap,
    and the guard refuses before anything reaches vgpu.conf)."""
    half = INT64_MAX // 2 + 1
    obj = claim(
        [
            result("gpu-0", memory=str(half), share_id="s1"),
            result("gpu-0", memory=str(half), share_id="s2"),
        ]
    )
    ref = ClaimRef("default", "claim-a", obj["metadata"]["uid"])
    inv = inventory(memory=16 * GiB)
    plan = plan_claim(parse_allocation(obj, ref, driver=DRIVER, node_name=NODE), inv)
    from kubelet_plugin.plan import check_capacity

    with pytest.raises(ClaimError, match=f"for memory {2 * half} bytes and cores 0, more than"):
        check_capacity(plan, [], inv)


def test_a_claim_that_is_not_an_object_is_refused() -> None:
    ref = ClaimRef("default", "c", "u")
    with pytest.raises(ClaimError, match="is not an object but a list"):
        parse_allocation([], ref, driver=DRIVER, node_name=NODE)  # type: ignore[arg-type]
