"""A MIG mode change on a busy GPU is refused cleanly (`kubelet_plugin.mig_start.start_mig`,
`kubelet_plugin.mig_mode`; docs/mig.md, "Strategies and modes").

Proves, with a recording NVML and API client: a GPU that has processes (NVML leaves the change
pending, activation status IN_USE), a prepared claim (the checkpoint) or, to turn MIG off,
instances, keeps its mode: the pending mode NVML recorded is set back, the refusal is logged as a
warning with its reason, a Warning Event `MigModeChangeRefused` is posted on the Node (in
`default`, as the kubelet's own), no rediscovery happens and the GPU is published as it is. An
idle GPU's change is applied, with no Event (so the refusals above are the busy GPU's, not the
test's). The node label asks the same as the flag.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.gpu import NodeInventory
from dra_driver.mig import MigInstance, MigLayout
from dra_driver.mig_nvml import IN_USE
from dra_driver.nvml import DeviceHandle
from kubelet_plugin import mig_start
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.mig_mode import EVENT_REASON
from kubelet_plugin.plan import ClaimPlan, DevicePlan
from tests.fixtures.inventories import hopper_gpu, node_inventory

UUID = "GPU-00000000-1111-2222-3333-444444444444"
NODE = "node-1"
DRIVER = "vgpu.dra.dev"


class FakeNvml:
    """NVML's MIG mode calls: `processes` makes a change stay pending (IN_USE), as nvml.h says."""

    def __init__(self, processes: bool) -> None:
        self.processes = processes
        self.calls: list[tuple[str, bool]] = []

    def init(self) -> None:
        pass

    def device_by_uuid(self, uuid: str) -> DeviceHandle:
        return DeviceHandle(address=0, raw=uuid)

    def set_mig_mode(self, device: DeviceHandle, enabled: bool) -> int:
        self.calls.append((str(device.raw), enabled))
        return IN_USE if self.processes else 0


class Api:
    """The Node (with its labels) and the Events created."""

    def __init__(self, labels: dict[str, str] | None = None) -> None:
        self.labels = labels or {}
        self.created: list[tuple[str, dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any]:
        assert path == kube.path("v1", "nodes", NODE)
        return {"metadata": {"name": NODE, "labels": self.labels}}

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.created.append((path, obj))
        return obj


def inventory(*, enabled: bool, instances: int = 0) -> NodeInventory:
    layout = MigLayout(
        enabled=enabled,
        pending=enabled,
        instances=tuple(
            MigInstance(gi_id=i + 1, profile_id=19, start=i, size=1) for i in range(instances)
        ),
    )
    gpu = hopper_gpu(0, uuid=UUID, pci_bus_id="0000:18:00.0", mig_capable=True)
    return node_inventory([gpu.model_copy(update={"mig": layout})])


def prepared_claim(state_dir: Path) -> None:
    plan = ClaimPlan(
        uid="c1",
        namespace="ns",
        name="train",
        devices=(
            DevicePlan(
                request="gpu",
                pool=NODE,
                device="gpu-0",
                share_id="s",
                uuid=UUID,
                minor=0,
                memory=1 << 30,
                cores=20,
                policy="balance",
            ),
        ),
    )
    journal = CheckpointJournal(str(state_dir))
    journal.open({"c1": plan})
    journal.close()


def start(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    discovered: NodeInventory,
    *,
    flag: str = "dynamic",
    nvml: FakeNvml,
    api: Api,
) -> tuple[mig_start.MigStart, NodeInventory, list[int]]:
    monkeypatch.setattr(mig_start, "PyMigNvml", lambda: nvml)
    rediscovered: list[int] = []

    def discover() -> NodeInventory:
        rediscovered.append(1)
        return discovered

    started, inv = mig_start.start_mig(
        flag=flag,
        client=api,  # type: ignore[arg-type]
        driver=DRIVER,
        node_name=NODE,
        state_dir=str(tmp_path),
        discovered=discovered,
        discover=discover,
    )
    return started, inv, rediscovered


def the_event(api: Api) -> dict[str, Any]:
    ((path, event),) = api.created
    assert path == kube.path("v1", "events", namespace="default")
    assert event["type"] == "Warning"
    assert event["reason"] == EVENT_REASON
    involved = event["involvedObject"]
    assert (involved["kind"], involved["name"]) == ("Node", NODE), involved
    return event


def test_gpu_with_processes_keeps_its_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nvml, api = FakeNvml(processes=True), Api()
    discovered = inventory(enabled=False)
    with caplog.at_level(logging.WARNING, logger="kubelet_plugin.mig_mode"):
        started, inv, rediscovered = start(monkeypatch, tmp_path, discovered, nvml=nvml, api=api)
    # Asked, found pending (IN_USE), and the pending mode set back to the current one.
    assert nvml.calls == [(UUID, True), (UUID, False)]
    assert (
        "gpu-0: MIG mode change to enabled refused: processes are running on it; "
        "the GPU stays as it is"
    ) in caplog.messages
    event = the_event(api)
    assert event["message"] == (
        "MIG mode of gpu-0 not enabled: processes are running on it; it stays as it is"
    )
    assert inv is discovered and rediscovered == []
    assert started.named(inv).gpus[0].mig_strategy == "off"  # published as the plain GPU it is


def test_gpu_with_a_prepared_claim_is_not_touched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prepared_claim(tmp_path)
    nvml, api = FakeNvml(processes=False), Api()
    with caplog.at_level(logging.WARNING, logger="kubelet_plugin.mig_mode"):
        started, inv, rediscovered = start(
            monkeypatch, tmp_path, inventory(enabled=False), nvml=nvml, api=api
        )
    assert nvml.calls == []  # a prepared container may not have started: NVML is not asked
    assert any("refused: 1 prepared claim(s) use it" in m for m in caplog.messages)
    assert "1 prepared claim(s) use it" in the_event(api)["message"]
    assert rediscovered == []
    assert started.named(inv).gpus[0].mig_strategy == "off"


def test_mig_off_refused_while_instances_exist(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nvml, api = FakeNvml(processes=False), Api()
    started, inv, _ = start(
        monkeypatch, tmp_path, inventory(enabled=True, instances=2), flag="off", nvml=nvml, api=api
    )
    assert nvml.calls == []
    message = the_event(api)["message"]
    assert message.startswith("MIG mode of gpu-0 not disabled: it has 2 MIG instance(s)"), message
    assert started.named(inv).gpus[0].mig_strategy == "static"  # its instances stay published


def test_node_label_asks_the_same_and_is_refused_the_same(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nvml, api = FakeNvml(processes=True), Api({f"{DRIVER}/mig-mode": "dynamic"})
    start(monkeypatch, tmp_path, inventory(enabled=False), flag="", nvml=nvml, api=api)
    assert nvml.calls == [(UUID, True), (UUID, False)]
    assert "processes are running on it" in the_event(api)["message"]


def test_idle_gpu_changes_without_an_event(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nvml, api = FakeNvml(processes=False), Api()
    _, _, rediscovered = start(monkeypatch, tmp_path, inventory(enabled=False), nvml=nvml, api=api)
    assert nvml.calls == [(UUID, True)]
    assert api.created == []
    assert rediscovered == [1]
