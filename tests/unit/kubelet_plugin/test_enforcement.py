"""Node-side memory enforcement, pure parts and one tick on hand-made /proc and NVML answers.

What this proves:
1. Caps per GPU come from the prepared plans like vgpu.conf (shares of one GPU add up; admin
   access is uncapped; `enforce` carries through).
2. The tolerance: NVML context memory per process and a small margin never count as over.
3. Whom to kill: processes without the hook first, then the largest, only until the rest fits;
   `enforce: report` kills nobody.
4. Attribution by mounts: `/proc/<pid>/mountinfo` naming `/run/vgpu-dra/claims/<uid>`.
5. A tick reports an unhooked process once, reports and kills an over-cap claim, re-checks the
   pid's claim before killing, and leaves processes of other claims alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.config import ConfigError, merge_configs, parse_config
from kubelet_plugin.enforcement import (
    CONTEXT_ALLOWANCE_BYTES,
    REASON_NO_HOOK,
    REASON_OVER_CAP,
    TOLERANCE_BYTES,
    ClaimCap,
    Enforcer,
    GpuProcess,
    MetricsReporter,
    Report,
    allowed_bytes,
    claims_of_mountinfo,
    judge,
    memory_caps,
)
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.plan import ClaimPlan, DevicePlan

GIB = 1 << 30
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def device(uuid: str, memory: int, **fields: object) -> DevicePlan:
    base: dict[str, object] = {
        "request": "gpu",
        "pool": "node-1",
        "device": "gpu-0",
        "uuid": uuid,
        "minor": 0,
        "memory": memory,
        "cores": 0,
    }
    return DevicePlan.model_validate({**base, **fields})


def plan(uid: str, *devices: DevicePlan) -> ClaimPlan:
    return ClaimPlan(uid=uid, namespace="ns", name=f"claim-{uid}", devices=devices)


def cap(memory: int = GIB, *, kill: bool = True) -> ClaimCap:
    return ClaimCap("uid-1", "ns", "claim-uid-1", UUID_A, memory, kill)


def test_caps_follow_the_plans() -> None:
    plans = {
        "u1": plan("u1", device(UUID_A, GIB), device(UUID_A, GIB, share_id="s2")),
        "u2": plan("u2", device(UUID_B, 2 * GIB, enforce="report")),
        "u3": plan("u3", device(UUID_A, 80 * GIB, admin_access=True)),
    }
    assert sorted(memory_caps(plans), key=lambda c: c.uid) == [
        ClaimCap("u1", "ns", "claim-u1", UUID_A, 2 * GIB, True),
        ClaimCap("u2", "ns", "claim-u2", UUID_B, 2 * GIB, False),
    ]


def test_tolerance_and_context_allowance() -> None:
    assert allowed_bytes(GIB, 1) == GIB + TOLERANCE_BYTES + CONTEXT_ALLOWANCE_BYTES
    assert allowed_bytes(100 * GIB, 0) == 102 * GIB  # 2 % of a large cap
    within = [GpuProcess(1, GIB + CONTEXT_ALLOWANCE_BYTES, hooked=True)]
    assert not judge(cap(), within).over


def test_unhooked_processes_die_first_then_the_largest_until_the_rest_fits() -> None:
    procs = [
        GpuProcess(10, GIB, hooked=True),
        GpuProcess(11, 3 * GIB, hooked=True),
        GpuProcess(12, 256 << 20, hooked=False),
    ]
    verdict = judge(cap(2 * GIB), procs)
    assert verdict.over and verdict.kill == (12, 11)
    assert judge(cap(2 * GIB, kill=False), procs).kill == ()


def test_claims_are_found_by_their_mounts() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt1 rw - ext3 /dev/root rw\n"
        "40 36 8:1 /var/lib/vgpu-dra/claims/u1 /run/vgpu-dra/claims/u1 rw,nosuid - ext4 /dev/sda\n"
        "41 36 8:1 /x /run/vgpu-dra/claims/u2/sub rw - ext4 /dev/sda rw\n"
    )
    assert claims_of_mountinfo(text) == {"u1"}


def write_proc(root: Path, pid: int, claims: list[str]) -> None:
    (root / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    lines = [f"1 1 8:1 /c/{u} /run/vgpu-dra/claims/{u} rw - ext4 /dev/sda rw" for u in claims]
    (root / str(pid) / "mountinfo").write_text("\n".join(lines) + "\n")


class Listing:
    def __init__(self, by_gpu: dict[str, list[tuple[int, int]]]) -> None:
        self.by_gpu = by_gpu

    def processes(self, uuid: str) -> list[tuple[int, int]] | None:
        return self.by_gpu.get(uuid)


class Collect:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, report: Report) -> None:
        self.reports.append(report)


def test_a_tick_reports_and_kills_only_the_offending_claim(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, 100, ["u1"])  # no hook, over u1's cap
    write_proc(proc, 101, ["u2"])  # another claim, within its cap
    write_proc(proc, 102, [])  # not in any claim (a host tool)
    plans = {"u1": plan("u1", device(UUID_A, GIB)), "u2": plan("u2", device(UUID_A, GIB))}
    listing = Listing({UUID_A: [(100, 3 * GIB), (101, GIB), (102, 5 * GIB)]})
    killed: list[int] = []
    sink = Collect()

    def kill(pid: int) -> None:
        killed.append(pid)
        listing.by_gpu[UUID_A] = [p for p in listing.by_gpu[UUID_A] if p[0] != pid]

    enforcer = Enforcer(
        str(tmp_path / "state"), lambda: plans, listing, [sink], proc=str(proc), kill=kill
    )
    verdicts = enforcer.tick()
    assert killed == [100]
    assert [(v.cap.uid, v.over) for v in verdicts] == [("u1", True), ("u2", False)]
    assert [(r.reason, r.cap.uid, r.pids) for r in sink.reports] == [
        (REASON_NO_HOOK, "u1", (100,)),
        (REASON_OVER_CAP, "u1", (100,)),
        (REASON_NO_HOOK, "u2", (101,)),
    ]
    assert "killed 100" in sink.reports[1].message
    enforcer.tick()
    assert killed == [100] and len(sink.reports) == 3  # nothing new: no repeated reports


def test_findings_and_kills_are_counted_in_the_plugin_metrics(tmp_path: Path) -> None:
    """The metrics reporter counts each finding by reason and only the pids really killed."""
    proc = tmp_path / "proc"
    write_proc(proc, 100, ["u1"])  # no hook, over u1's cap: reported twice, killed once
    write_proc(proc, 101, ["u2"])  # no hook, within u2's cap (enforce: report): reported once
    plans = {
        "u1": plan("u1", device(UUID_A, GIB)),
        "u2": plan("u2", device(UUID_A, GIB, enforce="report")),
    }
    listing = Listing({UUID_A: [(100, 3 * GIB), (101, GIB)]})

    def kill(pid: int) -> None:
        listing.by_gpu[UUID_A] = [p for p in listing.by_gpu[UUID_A] if p[0] != pid]

    metrics = PluginMetrics("node-1")
    reporter = MetricsReporter(metrics.observe_enforcement)
    enforcer = Enforcer(
        str(tmp_path / "state"), lambda: plans, listing, [reporter], proc=str(proc), kill=kill
    )
    enforcer.tick()
    enforcer.tick()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"node": "node-1", **labels})

    assert sample("vgpu_dra_enforcement_reports_total", reason=REASON_NO_HOOK) == 2
    assert sample("vgpu_dra_enforcement_reports_total", reason=REASON_OVER_CAP) == 1
    assert sample("vgpu_dra_enforcement_kills_total") == 1


def test_report_mode_reports_once_and_kills_nobody(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, 200, ["u1"])
    plans = {"u1": plan("u1", device(UUID_A, GIB, enforce="report"))}
    killed: list[int] = []
    sink = Collect()
    enforcer = Enforcer(
        str(tmp_path),
        lambda: plans,
        Listing({UUID_A: [(200, 4 * GIB)]}),
        [sink],
        proc=str(proc),
        kill=killed.append,
    )
    enforcer.tick()
    enforcer.tick()
    assert killed == []
    over = [r for r in sink.reports if r.reason == REASON_OVER_CAP]
    assert len(over) == 1 and "reported only" in over[0].message


def test_a_pid_that_changed_claims_is_not_killed(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, 300, ["u1"])
    plans = {"u1": plan("u1", device(UUID_A, GIB))}
    killed: list[int] = []

    class ExitsMeanwhile:
        """The pid exits and is reused between attribution and the kill."""

        def report(self, report: Report) -> None:
            write_proc(proc, 300, [])

    enforcer = Enforcer(
        str(tmp_path),
        lambda: plans,
        Listing({UUID_A: [(300, 4 * GIB)]}),
        [ExitsMeanwhile()],
        proc=str(proc),
        kill=killed.append,
    )
    [verdict] = enforcer.tick()
    assert verdict.kill == (300,) and killed == []


def test_enforce_is_a_vgpuconfig_field_that_defaults_to_kill() -> None:
    base = {"apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig"}
    assert merge_configs([parse_config(base)]).enforce == "kill"
    assert merge_configs([parse_config({**base, "enforce": "report"})]).enforce == "report"
    with pytest.raises(
        ConfigError, match=r"'enforce' has invalid value 'maybe'; allowed: kill\|report"
    ):
        parse_config({**base, "enforce": "maybe"})
