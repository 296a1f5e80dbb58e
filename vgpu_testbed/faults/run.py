"""A fault run: churn on the bed, faults injected one set at a time, recovery measured with canary
pods, the invariants checked throughout, and at the end everything deleted and the nodes checked
clean.

Per fault set: inject every fault of the set (a pair: both), wait the longest hold, heal in
reverse order; then, from that moment (the kill itself for a fault that does not last),
canaries of the fault's kinds are created, the first one retried until the API takes it, each
on the fault's node where it has one; **recovery** is the time until the slowest canary runs.
A fault that lasts and is tagged `probe-during` also gets a canary while it lasts. Then the
fault's `after` (a killed replica comes back), a settle pause, and the stuck-pod check. The
invariant checker (`invariants.Checker`) runs all along; each set's result lists what it found
while that set ran.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver import kube
from kubelet_plugin.checkpoint import CheckpointJournal
from vgpu_testbed.faults.bed import CDI_CLAIM_PREFIX, ChaosBed
from vgpu_testbed.faults.catalogue import Fault
from vgpu_testbed.faults.churn import Churn, quiet_namespace
from vgpu_testbed.faults.invariants import Checker

JSON = dict[str, Any]
Say = Callable[[str], None]


@dataclass
class SetResult:
    name: str
    faults: list[str]
    recovery_s: float | None
    canaries_s: dict[str, float | None]
    during_s: dict[str, float | None] | None = None
    notes: list[JSON] = field(default_factory=list)
    violations: list[JSON] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    error: str = ""
    cut_off: list[tuple[str, float, float]] = field(default_factory=list)  # partitions
    not_reached: bool = False  # the fault never struck (a plugin step that did not come)

    def document(self) -> JSON:
        return {
            "name": self.name,
            "faults": self.faults,
            "recovery_s": self.recovery_s,
            "canaries_s": self.canaries_s,
            # Canaries created while the fault lasted: seconds to Running, None = not served.
            **({"during_fault_s": self.during_s} if self.during_s is not None else {}),
            "notes": self.notes,
            "violations": self.violations,
            "stuck_without_reason": self.stuck,
            **({"not_reached": True} if self.not_reached else {}),
            **({"error": self.error} if self.error else {}),
        }


def canaries(
    churn: Churn, kinds: Sequence[str], node: str, timeout: float
) -> dict[str, float | None]:
    """Seconds to Running of one canary per kind, created together (in threads)."""
    found: dict[str, float | None] = {}

    def one(kind: str) -> None:
        # Only default-path shares are pinned: the policy path picks its node, and a pin to a
        # partitioned or rebooting node would measure that node, not the path.
        found[kind] = churn.canary(kind, node=node if kind == "share" else "", timeout=timeout)

    threads = [threading.Thread(target=one, args=(k,), name=f"canary-{k}") for k in kinds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


def run_set(
    bed: ChaosBed,
    churn: Churn,
    checker: Checker,
    faults: Sequence[Fault],
    *,
    canary_timeout: float = 240.0,
    settle_s: float = 10.0,
    say: Say = print,
) -> SetResult:
    name = " + ".join(f.name + (f"@{f.node}" if f.node else "") for f in faults)
    result = SetResult(name, [f.name for f in faults], None, {})
    seen = len(checker.violations)
    notes: list[JSON] = [{} for _ in faults]
    node = next((f.node for f in faults if f.node), "")
    kinds = list(dict.fromkeys(k for f in faults for k in f.canaries))
    say(f"fault {name}: inject")
    t_inject = time.monotonic()
    injected: list[int] = []
    try:
        for i, fault in enumerate(faults):
            fault.inject(bed, notes[i])
            injected.append(i)
        hold = max(f.hold_s for f in faults)
        during = list(dict.fromkeys(k for f in faults for k in f.during))
        if hold and during:
            probe = canaries(churn, during, node, max(1.0, t_inject + hold - time.monotonic()))
            result.during_s = {k: None if v is None else round(v, 2) for k, v in probe.items()}
        time.sleep(max(0.0, t_inject + hold - time.monotonic()))
    except Exception as exc:
        result.error = f"inject: {exc!r}"
        say(f"fault {name}: {result.error}")
    finally:
        for i in reversed(injected):
            try:
                faults[i].heal(bed, notes[i])
            except Exception as exc:
                result.error += f" heal {faults[i].name}: {exc!r}"
    t0 = t_inject if not max(f.hold_s for f in faults) else time.monotonic()
    result.cut_off = [(f.node, t_inject, t0) for f in faults if "partition" in f.tags]
    # A fault that waits for its moment (a plugin step) says when it struck.
    t0 = max([t0, *(float(n["t_fault"]) for n in notes if "t_fault" in n)])
    result.not_reached = any(n.get("not_reached") for n in notes)
    start = time.monotonic()
    found = canaries(churn, kinds, node, canary_timeout)
    result.canaries_s = {
        k: None if v is None else round(start - t0 + v, 2) for k, v in found.items()
    }
    if all(v is not None for v in result.canaries_s.values()):
        result.recovery_s = max(v for v in result.canaries_s.values() if v is not None)
    _after(bed, checker, faults, notes, result)
    time.sleep(settle_s)
    result.stuck = checker.check_pods(churn)
    result.notes = [_plain(n) for n in notes]
    result.violations = [v.__dict__ for v in checker.since(seen)]
    say(
        f"fault {name}: recovered in {result.recovery_s}s, canaries {result.canaries_s}, "
        f"violations {len(result.violations)}{' ' + result.error if result.error else ''}"
    )
    return result


def _after(
    bed: ChaosBed, checker: Checker, faults: Sequence[Fault], notes: list[JSON], result: SetResult
) -> None:
    """Each fault's `after`, and what it found that an invariant judges."""
    for i, fault in enumerate(faults):
        try:
            fault.after(bed, notes[i])
        except Exception as exc:
            result.error += f" after {fault.name}: {exc!r}"
        for key in ("target_pod_ran", "target_pod_gone"):
            if notes[i].get(key) is False:
                result.error += f" {fault.name}: {key} is false"
        if "reboot" in fault.tags:
            checker.count("prepared-again-after-reboot")
        if notes[i].get("trusted_from_checkpoint"):
            checker.violate(
                "prepared-again-after-reboot",
                f"{fault.name}: claims whose pods ran again after the reboot were answered from "
                f"the checkpoint, never prepared again: {notes[i]['trusted_from_checkpoint']}",
            )


def _plain(notes: JSON) -> JSON:
    """Notes without the records of killed processes (not JSON, and of no use in a report)."""
    return {k: v for k, v in notes.items() if k not in ("records", "log_offset")}


def drain_and_check(bed: ChaosBed, churn: Churn, timeout: float = 240.0) -> JSON:
    """Delete every pod of the churn and wait until every node's checkpoint is empty and no claim
    file is left; what remains after `timeout` is a leak."""
    churn.pause()
    t0 = time.monotonic()
    quiet = quiet_namespace(bed.client, bed.namespace, timeout)
    left: dict[str, JSON] = {}
    while time.monotonic() - t0 < timeout:
        left = {}
        for name, node in bed.nodes.items():
            prepared = CheckpointJournal(str(node.paths.state_dir)).load()
            specs = [p.name for p in node.paths.cdi_root.glob(f"{CDI_CLAIM_PREFIX}*.json")]
            claims_root = node.paths.state_dir / "claims"
            dirs = [p.name for p in claims_root.iterdir()] if claims_root.is_dir() else []
            if prepared or specs or dirs:
                left[name] = {"prepared": sorted(prepared), "specs": specs, "claim_dirs": dirs}
        if not left:
            break
        time.sleep(2)
    return {
        "pods_deleted": quiet,
        "seconds": round(time.monotonic() - t0, 1),
        "left_on_nodes": left,
        "clean": quiet and not left,
    }


def recovery_table(results: Sequence[SetResult]) -> dict[str, JSON]:
    """Per fault set name: recovery p50 and max over its repetitions."""
    table: dict[str, JSON] = {}
    for result in results:
        entry = table.setdefault(
            result.name, {"runs": 0, "recovered": [], "failed": 0, "not_reached": 0}
        )
        entry["runs"] += 1
        if result.not_reached:
            entry["not_reached"] += 1
        elif result.recovery_s is None:
            entry["failed"] += 1
        else:
            entry["recovered"].append(result.recovery_s)
    for entry in table.values():
        times = sorted(entry.pop("recovered"))
        entry["p50_s"] = round(statistics.median(times), 2) if times else None
        entry["max_s"] = round(times[-1], 2) if times else None
    return table


def run(
    bed: ChaosBed,
    fault_sets: Sequence[Sequence[Fault]],
    *,
    repeats: int = 1,
    warmup_s: float = 20.0,
    interval_s: float = 2.0,
    settle_s: float = 10.0,
    grace_s: float = 150.0,
    say: Say = print,
) -> JSON:
    """The whole run; returns the result document (results per set, recovery table, invariants,
    the churn's ledger, the final drain)."""
    churn = Churn(bed.client, bed.namespace, interval_s=interval_s)
    checker = Checker(bed, grace_s=grace_s, stuck_s=grace_s)
    started = time.monotonic()
    churn.start()
    checker.start()
    results: list[SetResult] = []
    # Pods bound to a node while it was partitioned: nothing can say why they wait (the node
    # cannot report, and the bed runs no node-lifecycle controller to mark it NotReady).
    excused: list[str] = []
    try:
        time.sleep(warmup_s)
        baseline = canaries(churn, ["share", "policy", "legacy"], "", 120)
        say(f"baseline canaries (no fault): {baseline}")
        for _ in range(repeats):
            for faults in fault_sets:
                results.append(run_set(bed, churn, checker, faults, settle_s=settle_s, say=say))
        drained = drain_and_check(bed, churn)
        windows = [w for r in results for w in r.cut_off]
        for record in churn.records.values():
            if record.given_up_reason != "(nothing said)":
                continue
            cut = any(
                node == record.node
                and start <= record.created + churn.give_up_s
                and end >= record.created
                for node, start, end in windows
            )
            if cut:
                excused.append(record.name)
            else:
                checker.violate(
                    "no-pod-stuck-without-reason",
                    f"{record.name} ({record.kind}, node {record.node or 'none'}) never ran in "
                    f"{churn.give_up_s:.0f}s and nothing said why",
                )
    finally:
        churn.stop()
        checker.stop()
    with_reason = _refusals(churn)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "baseline_canaries_s": {k: None if v is None else round(v, 2) for k, v in baseline.items()},
        "recovery": recovery_table(results),
        "sets": [r.document() for r in results],
        "invariants": checker.report(),
        "churn": churn.summary(),
        "refusals": {**with_reason, "stuck_on_a_partitioned_node": excused},
        "final_drain": drained,
    }


def _refusals(churn: Churn) -> JSON:
    """How pods that never ran ended: refused at create with the API's message, or given up
    after waiting with the reason the API gave (empty = none)."""
    refused = [r for r in churn.records.values() if not r.canary and r.refused]
    gave_up = [r for r in churn.records.values() if not r.canary and r.given_up_reason]
    unreachable = [
        r for r in churn.records.values() if not r.canary and r.create_error and not r.refused
    ]
    return {
        "refused_at_create": len(refused),
        "refused_examples": sorted({r.create_error[:160] for r in refused})[:5],
        "not_created_api_unreachable": len(unreachable),
        "gave_up_waiting": len(gave_up),
        "gave_up_without_reason": [
            r.name for r in gave_up if r.given_up_reason == "(nothing said)"
        ],
        "gave_up_examples": sorted({r.given_up_reason[:160] for r in gave_up})[:5],
    }


def api_ok(bed: ChaosBed) -> bool:
    try:
        bed.client.get(kube.path("v1", "namespaces", bed.namespace))
    except kube.KubeError:
        return False
    return True
