"""Device taints from GPU conditions (kubelet_plugin.taints), their persistence
(kubelet_plugin.taint_store) and the node's published devices (kubelet_plugin.devices).

What this proves:
1. The XID table: application XIDs never taint; recoverable ones give a NoSchedule `xid` taint
   lifted after the quiet period (which another XID restarts); fatal ones a NoExecute
   `gpu-fault` taint that time does not lift; XID 79 and a lost GPU a NoExecute `unreachable`
   taint lifted when the GPU answers again; unlisted XIDs are recoverable.
2. Memory repair: pending -> NoSchedule lifted when no longer pending; failed -> NoExecute kept.
3. A fatal taint is lifted only when the GPU leaves the enumeration and comes back.
4. The persisted form round-trips, keeps fatal taints across a "restart", and a corrupt file is
   moved aside instead of stopping the plugin.
5. Taints are valid DRA DeviceTaints (label-value values, timeAdded = condition start).
6. NodeDevices: GPUs NVML still counts but cannot read stay published (tainted); removed ones
   go; taints are keyed by device name for the slices; every change is persisted and announced.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dra_driver import slices
from kubelet_plugin import taint_store
from kubelet_plugin.devices import NodeDevices, published_inventory
from kubelet_plugin.health import HEALTHY, UNHEALTHY, HealthBoard
from kubelet_plugin.taints import (
    NO_EXECUTE,
    NO_SCHEDULE,
    XID_TABLE,
    TaintState,
    XidClass,
    classify_xid,
    device_taint,
)
from tests.fixtures.inventories import synthetic_inventory

DRIVER = "vgpu.dra.dev"
GPU = "GPU-00000000-1111-4000-8000-000000000000"
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def taints(state: TaintState) -> list[tuple[str, str, str]]:
    return [(t["key"], t["value"], t["effect"]) for t in state.taints(DRIVER).get(GPU, [])]


def test_xid_classes_follow_the_table() -> None:
    assert {x for x, info in XID_TABLE.items() if info.xid_class is XidClass.APPLICATION} == {
        13, 31, 43, 45, 68, 109,
    }  # fmt: skip
    assert classify_xid(48).xid_class is XidClass.FATAL
    assert classify_xid(79).xid_class is XidClass.LOST
    assert classify_xid(94).xid_class is XidClass.RECOVERABLE
    assert classify_xid(4242).xid_class is XidClass.RECOVERABLE  # unlisted: cautious default


def test_application_xids_never_taint() -> None:
    state = TaintState()
    for xid in (13, 31, 43, 45, 68, 109):
        assert state.on_xid(GPU, xid, now=100.0) == []
    assert state.taints(DRIVER) == {}


def test_recoverable_xid_is_lifted_after_a_quiet_period_that_new_xids_restart() -> None:
    state = TaintState(quiet_s=60)
    [change] = state.on_xid(GPU, 94, now=1000.0)
    assert change.added
    assert taints(state) == [(f"{DRIVER}/xid", "xid-94", NO_SCHEDULE)]
    assert state.expire(now=1059.0) == []
    assert state.on_xid(GPU, 94, now=1050.0) == []  # same taint, quiet period restarts
    assert state.expire(now=1100.0) == []
    [lifted] = state.expire(now=1110.0)
    assert not lifted.added and taints(state) == []


def test_fatal_xid_is_not_lifted_by_time_only_by_a_re_enumeration() -> None:
    state = TaintState(quiet_s=1)
    state.on_xid(GPU, 48, now=10.0)
    assert taints(state) == [(f"{DRIVER}/gpu-fault", "xid-48", NO_EXECUTE)]
    assert state.expire(now=1e9) == []
    assert state.on_probe(GPU, lost=False, error="", now=20.0) == []  # answering is not enough
    assert state.on_enumeration(present=[GPU], removed=[]) == []  # never left: still faulty
    state.on_enumeration(present=[], removed=[GPU])
    assert taints(state)  # gone from the node: still remembered
    [lifted] = state.on_enumeration(present=[GPU], removed=[])  # reset / re-seated
    assert lifted.condition.key == "gpu-fault" and taints(state) == []


def test_a_lost_gpu_is_unreachable_until_it_answers_again() -> None:
    state = TaintState()
    state.on_xid(GPU, 79, now=5.0)
    assert taints(state) == [(f"{DRIVER}/unreachable", "fallen-off-bus", NO_EXECUTE)]
    assert state.on_probe(GPU, lost=True, error="GPU is lost", now=6.0) == []  # same condition
    [lifted] = state.on_probe(GPU, lost=False, error="", now=7.0)
    assert not lifted.added and taints(state) == []
    state.on_probe(GPU, lost=False, error="Unknown Error", now=8.0)
    assert taints(state) == [(f"{DRIVER}/unreachable", "nvml-unreadable", NO_EXECUTE)]
    # A GPU removed from the node is not a sick one: its unreachable condition goes with it.
    state.on_enumeration(present=[], removed=[GPU])
    assert taints(state) == []


def test_memory_repair_pending_and_failed() -> None:
    state = TaintState()
    state.on_memory(GPU, pending=True, failed=False, now=1.0)
    assert taints(state) == [(f"{DRIVER}/memory-errors", "reset-pending", NO_SCHEDULE)]
    state.on_memory(GPU, pending=False, failed=False, now=2.0)
    assert taints(state) == []
    state.on_memory(GPU, pending=True, failed=True, now=3.0)
    assert taints(state) == [(f"{DRIVER}/memory-errors", "row-remapping-failed", NO_EXECUTE)]
    assert state.on_memory(GPU, pending=False, failed=False, now=4.0) == []  # needs a reset


def test_taints_are_valid_device_taints() -> None:
    state = TaintState()
    for xid in (48, 79, 94):
        state.on_xid(GPU, xid, now=1700000000.5)
    state.on_memory(GPU, pending=True, failed=False, now=1700000001.0)
    by_gpu = state.taints(DRIVER)[GPU]
    assert len(by_gpu) == 4 <= slices.MAX_TAINTS_PER_DEVICE
    for taint in by_gpu:
        assert set(taint) == {"key", "value", "effect", "timeAdded"}
        assert taint["key"].startswith(f"{DRIVER}/")
        assert LABEL_VALUE.match(taint["value"])
    assert by_gpu[0]["timeAdded"] == "2023-11-14T22:13:20Z"


def test_the_effect_start_time_is_kept_while_the_value_changes() -> None:
    state = TaintState()
    state.on_xid(GPU, 48, now=100.0)
    state.on_xid(GPU, 95, now=200.0)
    [cond] = state.conditions(GPU)
    assert (cond.value, cond.since) == ("xid-95", 100.0)  # eviction deadlines do not move


def test_state_survives_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "device-health.json")
    state = TaintState(quiet_s=30)
    state.on_xid(GPU, 48, now=10.0)
    state.on_xid(GPU, 32, now=11.0)
    state.on_enumeration(present=[], removed=["GPU-gone"])
    taint_store.save(path, state)
    assert (tmp_path / "device-health.json").stat().st_mode & 0o777 == 0o600
    again = taint_store.load(path, quiet_s=30)
    assert again.to_json() == state.to_json()
    assert again.expire(now=40.0) == []
    assert again.expire(now=41.0)[0].condition.value == "xid-32"  # the quiet period went on
    assert taints(again) == [(f"{DRIVER}/gpu-fault", "xid-48", NO_EXECUTE)]
    assert again.on_enumeration(present=["GPU-gone"], removed=[]) == []  # nothing to lift


def test_a_missing_or_corrupt_store_starts_clean(tmp_path: Path) -> None:
    path = tmp_path / "device-health.json"
    assert taint_store.load(str(path)).to_json()["conditions"] == []
    path.write_text('{"version": 1, "conditions": [{"uuid": "x"}]}')
    assert taint_store.load(str(path)).to_json()["conditions"] == []
    assert not path.exists()
    assert json.loads((tmp_path / "device-health.json.corrupt").read_text())["version"] == 1
    with pytest.raises(ValueError, match="version"):
        TaintState.from_json({"version": 7})


def test_bad_quiet_period_is_refused() -> None:
    with pytest.raises(ValueError, match="quiet period"):
        TaintState(quiet_s=0)


def test_device_taint_values_are_always_label_values() -> None:
    state = TaintState()
    state.on_xid(GPU, 48, now=1.0)
    [cond] = state.conditions()
    assert device_taint(DRIVER, cond)["value"] == "xid-48"


# ---------------------------------------------------------------- published devices


def test_unreadable_gpus_stay_published_removed_ones_go() -> None:
    before = synthetic_inventory(3)
    lost = before.model_copy(update={"gpus": before.gpus[:2], "unreadable_gpus": 1})
    published, removed = published_inventory(lost, before)
    assert [g.index for g in published.gpus] == [0, 1, 2] and removed == []
    gone = before.model_copy(update={"gpus": before.gpus[:2]})
    published, removed = published_inventory(gone, before)
    assert [g.index for g in published.gpus] == [0, 1]
    assert [g.uuid for g in removed] == [before.gpus[2].uuid]


def test_node_devices_taint_persist_announce_and_lift(tmp_path: Path) -> None:
    inv = synthetic_inventory(2)
    board = HealthBoard("node-1", inv)
    store = str(tmp_path / "device-health.json")
    changes: list[int] = []
    now = [1000.0]
    devices = NodeDevices(
        inv,
        driver=DRIVER,
        state=TaintState(quiet_s=5),
        store_path=store,
        board=board,
        on_change=lambda: changes.append(1),
        clock=lambda: now[0],
    )
    uuid1 = inv.gpus[1].uuid
    devices.xid(uuid1, 13)
    assert changes == [] and devices.taints() == {}
    devices.xid(uuid1, 94)
    name1 = inv.gpus[1].device_name
    assert [t["key"] for t in devices.taints()[name1]] == [f"{DRIVER}/xid"]
    assert changes == [1]
    assert json.loads(Path(store).read_text())["conditions"][0]["uuid"] == uuid1
    health = {s.device: (s.status, s.message) for s in board.snapshot()[1]}
    assert health[name1][0] == UNHEALTHY and "XID 94" in health[name1][1]
    now[0] += 5
    devices.expire()
    assert devices.taints() == {} and changes == [1, 1]
    assert {s.device: s.status for s in board.snapshot()[1]}[name1] == HEALTHY
    # A lost GPU that NVML still counts stays published and tainted NoExecute.
    devices.probe(uuid1, lost=True, error="GPU is lost")
    unreadable = inv.model_copy(update={"gpus": inv.gpus[:1], "unreadable_gpus": 1})
    assert not devices.rediscovered(unreadable)  # what is published did not change
    assert devices.uuids() == [g.uuid for g in inv.gpus]
    assert devices.taints()[name1][0]["effect"] == NO_EXECUTE
    # Hot-removed: it leaves the published devices and takes its taint along.
    assert devices.rediscovered(inv.model_copy(update={"gpus": inv.gpus[:1]}))
    assert devices.uuids() == [inv.gpus[0].uuid] and devices.taints() == {}
    # Hot-added again: published, no taint.
    assert devices.rediscovered(inv)
    assert devices.uuids() == [g.uuid for g in inv.gpus]
    assert not devices.rediscovered(inv)  # nothing changed: no announcement
