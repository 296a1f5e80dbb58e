"""The short fault run (issue 29): the whole system under churn, the three most valuable faults.

A private bed (`vgpu_testbed.faults.bed`: its own control plane, since one fault kills the API
server; two real nodes; two controller replicas on one Lease behind one webhook address) runs a
steady churn of mixed pods (shares, whole GPUs, two-GPU NVLink claims, policy-path pods,
webhook-translated vgpu-manager pods, template and named claims) while, one after the other:
1. the controller holding the Lease is SIGKILLed: the standby takes over, policy-path pods are
   placed again (and the webhook keeps admitting: the other replica serves it);
2. the kubelet plugin of the busy node is SIGKILLed in the middle of a prepare of a claim of the
   test's own, with its claim dir and region made and before its vgpu.conf (strace stops it at
   that exact call): the restarted plugin cleans up, the kubelet's retry prepares the claim and
   the pod runs;
3. kube-apiserver is SIGKILLed and started again: everything reconnects.
After each, canary pods of every kind must run (the recovery time is printed), and the
invariants (`vgpu_testbed.faults.invariants`) are checked every 5 s from the API and the nodes'
files: no device over-committed in the API or in the prepared claims' vgpu.conf, no claim file
or prepared claim without its owner once its grace ran out, no pod stuck without a reason. At
the end every pod is deleted and both nodes must be left with an empty checkpoint and no claim
file. The full matrix is `python -m bench chaos` (docs/reliability.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.cluster import require_real_nodes
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.faults import catalogue
from vgpu_testbed.faults.bed import ChaosBed
from vgpu_testbed.faults.churn import Churn
from vgpu_testbed.faults.invariants import ALWAYS, GRACED, Checker
from vgpu_testbed.faults.run import SetResult, canaries, drain_and_check, run_set

# Each test includes its share of the bed's start (the first) or the drain (the last).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NODES = ("node-1", "node-2")
RECOVERY_LIMIT_S = 90.0  # far above what the bed measures (docs/reliability.md): a hang fails


@dataclass
class Run:
    bed: ChaosBed
    churn: Churn
    checker: Checker
    results: list[SetResult]

    @property
    def cluster(self) -> Cluster:
        """For the leak guard: processes the bed starts again are the cluster's to stop."""
        return self.bed.cluster


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_real_nodes()
    root = Path(tmp_path_factory.mktemp("chaos")) / "c"
    bed = ChaosBed.start(root, say=lambda m: print(m, flush=True))
    churn = Churn(bed.client, bed.namespace, interval_s=2.0)
    checker = Checker(bed, grace_s=60.0, stuck_s=60.0)
    try:
        churn.start()
        checker.start()
        baseline = canaries(churn, ["share", "policy", "legacy"], "", 90)
        print(f"baseline canaries: {baseline}")
        assert all(v is not None for v in baseline.values()), baseline
        yield Run(bed, churn, checker, [])
    finally:
        churn.stop()
        checker.stop()
        bed.stop()


def inject(chaos: Run, faults: list[catalogue.Fault]) -> SetResult:
    result = run_set(chaos.bed, chaos.churn, chaos.checker, faults, settle_s=5.0)
    chaos.results.append(result)
    print(json.dumps(result.document(), indent=1, default=str))
    assert not result.error, result.error
    assert result.recovery_s is not None, f"not recovered: {result.canaries_s}"
    assert result.recovery_s < RECOVERY_LIMIT_S, result.canaries_s
    assert result.violations == [], result.violations
    assert result.stuck == [], result.stuck
    return result


def test_the_standby_takes_over_when_the_leader_is_killed(chaos: Run) -> None:
    (fault,) = catalogue.short(NODES)[0]
    result = inject(chaos, [fault])
    victim = result.notes[0]["victim"]
    assert chaos.bed.leader() not in (None, victim)


def test_the_plugin_killed_in_the_middle_of_a_prepare_recovers_the_claim(chaos: Run) -> None:
    (fault,) = catalogue.short(NODES)[1]
    result = inject(chaos, [fault])
    note = result.notes[0]
    assert note["step"] == "prepare: claim dir and region made, no vgpu.conf", note
    assert note["target_uid"] in note["call"], note
    assert note["target_pod_ran"], note


def test_everything_reconnects_after_the_api_server_is_killed(chaos: Run) -> None:
    (fault,) = catalogue.short(NODES)[2]
    inject(chaos, [fault])


def test_the_invariants_held_and_the_nodes_end_clean(chaos: Run) -> None:
    drained = drain_and_check(chaos.bed, chaos.churn, timeout=120)
    report = chaos.checker.report()
    summary = chaos.churn.summary()
    print(json.dumps({"drain": drained, "invariants": report, "churn": summary}, indent=1))
    assert drained["clean"], drained
    assert report["violations"] == [], report["violations"]
    for name in (*ALWAYS, *GRACED):
        assert report["checks"].get(name, 0) > 0, f"{name} never checked"
    assert summary["pods"] >= 20, summary  # the churn kept going through the faults
    ran = sum(kind["ran"] for kind in summary["by_kind"].values())
    assert ran >= summary["pods"] // 2, summary
