"""DeviceTaintRules in the allocator's model: a device a rule selects carries the rule's taint,
as kube-scheduler sees it, so the policy path honours `vgpu-dra drain` like the default path.

Proves: a NoSchedule or NoExecute rule keeps untolerating requests off the device (only that
device: its peers and other nodes stay usable), a request that tolerates the key still gets it,
effect None blocks nothing; selectors by driver, pool and device (unset = any; no selector =
nothing); a rule that arrives before its pool's slices applies when they come; a changed or
deleted rule takes effect at once and is patched into the layout in place (no rebuild), and an
allocator that lived through rule changes decides like a fresh one.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.allocator.allocate import Allocator, Placement, Unschedulable
from dra_driver.allocator.model import ClusterModel, taint_rule
from dra_driver.allocator.request import Policy, parse_claim
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, claim_obj, node_events
from tests.unit.dra_driver.allocator.extension import needs_extension

JSON = dict[str, Any]
CLASSES = {DRIVER: DEVICE_CLASS}
POD: JSON = {"metadata": {"name": "p"}, "spec": {}}
NODE0, NODE1 = "node-00000", "node-00001"
KEY = f"{DRIVER}/drain"


def rule(
    name: str,
    *,
    effect: str = "NoExecute",
    driver: str | None = DRIVER,
    pool: str | None = NODE0,
    device: str | None = "gpu-0",
    selector: bool = True,
) -> JSON:
    fields = {"driver": driver, "pool": pool, "device": device}
    spec: JSON = {"taint": {"key": KEY, "value": "test", "effect": effect}}
    if selector:
        spec["deviceSelector"] = {k: v for k, v in fields.items() if v is not None}
    return {"metadata": {"name": name}, "spec": spec}


def model_with(nodes: int = 2, gpus: int = 2) -> ClusterModel:
    model = ClusterModel()
    for n in range(nodes):
        for kind, obj in node_events(n, gpus=gpus, shape="none"):
            model.apply(kind, obj)
    return model


def taints(model: ClusterModel, pool: str, device: str) -> list[tuple[str, str]]:
    return [(t["key"], t["effect"]) for t in model.devices[(DRIVER, pool, device)].taints]


def tainted(model: ClusterModel) -> set[str]:
    return {f"{k[1]}/{k[2]}" for k, d in model.devices.items() if d.taints}


def test_selectors_pick_devices_as_the_api_defines_them() -> None:
    model = model_with()
    model.apply("DeviceTaintRule", rule("one"))
    assert tainted(model) == {f"{NODE0}/gpu-0"}
    assert taints(model, NODE0, "gpu-0") == [(KEY, "NoExecute")]
    model.apply("DeviceTaintRule", rule("pool", device=None))  # every device of the pool
    assert tainted(model) == {f"{NODE0}/gpu-0", f"{NODE0}/gpu-1"}
    assert len(taints(model, NODE0, "gpu-0")) == 2  # both rules
    model.delete("DeviceTaintRule", {"metadata": {"name": "pool"}})
    model.apply("DeviceTaintRule", rule("device-anywhere", pool=None, device="gpu-1"))
    assert tainted(model) == {f"{NODE0}/gpu-0", f"{NODE0}/gpu-1", f"{NODE1}/gpu-1"}
    model.delete("DeviceTaintRule", {"metadata": {"name": "device-anywhere"}})
    model.apply("DeviceTaintRule", rule("other-driver", driver="gpu.other.example", device=None))
    model.apply("DeviceTaintRule", rule("no-selector", selector=False))
    assert tainted(model) == {f"{NODE0}/gpu-0"}
    assert taint_rule(rule("x", selector=False)) is None
    model.apply("DeviceTaintRule", rule("everything", driver=None, pool=None, device=None))
    assert len(tainted(model)) == 4  # the empty selector matches all devices
    for name in ("one", "other-driver", "no-selector", "everything"):
        model.delete("DeviceTaintRule", {"metadata": {"name": name}})
    assert tainted(model) == set()
    assert model.rules == {}


def test_a_rule_before_its_slices_applies_when_they_arrive() -> None:
    model = ClusterModel()
    model.apply("DeviceTaintRule", rule("early"))
    for kind, obj in node_events(0, gpus=2, shape="none"):
        model.apply(kind, obj)
    assert tainted(model) == {f"{NODE0}/gpu-0"}
    # The plugin republishes the slice (a new generation): the rule's taint stays.
    slc = copy.deepcopy(node_events(0, gpus=2, shape="none")[1][1])
    slc["spec"]["pool"]["generation"] = 5
    slc["spec"]["devices"][1]["taints"] = [{"key": f"{DRIVER}/xid", "effect": "NoSchedule"}]
    model.apply("ResourceSlice", slc)
    assert taints(model, NODE0, "gpu-0") == [(KEY, "NoExecute")]
    assert taints(model, NODE0, "gpu-1") == [(f"{DRIVER}/xid", "NoSchedule")]


def claim(name: str, tolerate: str | None = None, **kw: Any) -> JSON:
    obj = claim_obj(name, **kw)
    if tolerate is not None:
        obj["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
            {"key": tolerate, "operator": "Exists"}
        ]
    return obj


def place(alloc: Allocator, obj: JSON, *, commit: bool = True) -> list[str]:
    placement = alloc.place(POD, [parse_claim(obj, CLASSES)], Policy(node="binpack"))
    if commit:
        alloc.commit(placement)
    return [f"{r.pool}/{r.device}" for _, results in placement.results for r in results]


@needs_extension
@pytest.mark.parametrize("effect", ["NoExecute", "NoSchedule"])
def test_a_drained_gpu_gets_no_new_claim_unless_tolerated(effect: str) -> None:
    model = model_with(nodes=1)
    alloc = Allocator(model)
    model.apply("DeviceTaintRule", rule("drain", effect=effect))
    # Whole GPUs: the first goes to the one untainted GPU, the second finds none.
    assert place(alloc, claim("a")) == [f"{NODE0}/gpu-1"]
    with pytest.raises(Unschedulable):
        place(alloc, claim("b"), commit=False)
    assert place(alloc, claim("c", tolerate=KEY)) == [f"{NODE0}/gpu-0"]


@needs_extension
def test_effect_none_blocks_nothing_and_undrain_frees_the_gpu_at_once() -> None:
    model = model_with(nodes=1)
    alloc = Allocator(model)
    model.apply("DeviceTaintRule", rule("drain", effect="None"))
    model.apply("DeviceTaintRule", rule("drain-1", device="gpu-1"))
    assert place(alloc, claim("a")) == [f"{NODE0}/gpu-0"]
    with pytest.raises(Unschedulable):
        place(alloc, claim("b"), commit=False)
    epoch = model.layout().epoch
    model.delete("DeviceTaintRule", {"metadata": {"name": "drain-1"}})
    assert model.layout().epoch == epoch  # patched in place, not rebuilt
    assert place(alloc, claim("b")) == [f"{NODE0}/gpu-1"]


@needs_extension
def test_an_allocator_living_through_rule_changes_decides_like_a_fresh_one() -> None:
    model = model_with(nodes=3, gpus=4)
    kept = Allocator(model)
    for i in range(16):
        n, d = i % 3, (i * 7) % 4
        if i % 4 == 3:
            model.delete("DeviceTaintRule", {"metadata": {"name": f"r{i - 2}"}})
        else:
            model.apply(
                "DeviceTaintRule",
                rule(f"r{i}", pool=f"node-{n:05d}", device=f"gpu-{d}", effect="NoSchedule"),
            )
        obj = claim(f"x{i}", memory="30Gi")
        obj["metadata"]["uid"] = f"uid-{i}"
        outcomes: list[Placement | str] = []
        for alloc in (kept, Allocator(model)):
            try:
                outcomes.append(alloc.place(POD, [parse_claim(obj, CLASSES)], Policy()))
            except Unschedulable as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1], i
        if isinstance(outcomes[0], Placement):
            kept.commit(outcomes[0])
            for _, results in outcomes[0].results:
                for r in results:
                    assert f"{r.pool}/{r.device}" not in tainted(model), i
