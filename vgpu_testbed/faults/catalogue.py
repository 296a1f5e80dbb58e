"""The faults a run injects, each as `inject` (what breaks, and for a kill the restart that a
kubelet or a Deployment would do), how long it lasts (`hold_s`) and `heal` (what ends it), and
`after` (what a real cluster would also do later, once recovery is measured: the killed
controller replica comes back as a standby).

Recovery is measured by `vgpu_testbed.faults.run` from the end of the fault (the kill, or the
heal of a fault that lasts); `node` names the node a fault hits, where the run's canary pod is
pinned. Every fault is made only on the bed's own processes and inside the bed's own network
namespaces.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import kube
from kubelet_plugin.checkpoint import CheckpointJournal
from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.cluster import webhook as bed_webhook
from vgpu_testbed.faults import churn, netfaults, plugin_steps
from vgpu_testbed.faults.bed import CONTROLLERS, ChaosBed
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]
Notes = dict[str, Any]
DOWN_S = 1.0  # a killed process is started again after this long


def _nothing(_bed: ChaosBed, _notes: Notes) -> None:
    return None


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[ChaosBed, Notes], None]
    heal: Callable[[ChaosBed, Notes], None] = _nothing
    after: Callable[[ChaosBed, Notes], None] = _nothing
    hold_s: float = 0.0
    node: str = ""
    canaries: tuple[str, ...] = ("share", "policy", "legacy")
    # Canaries also created while the fault lasts (a share pinned to `node` when it has one).
    during: tuple[str, ...] = ()
    tags: tuple[str, ...] = field(default_factory=tuple)


# ----- the control plane ------------------------------------------------------------------------


def kill_restart(process: str) -> Fault:
    """SIGKILL a control-plane process; started again after DOWN_S (its static pod's restart)."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        record = bed.kill(process)
        time.sleep(DOWN_S)
        bed.start_again(record)
        notes["restarted"] = process

    return Fault(f"{process}-kill", inject)


# ----- the controller ---------------------------------------------------------------------------


def _restart_dead_controllers(bed: ChaosBed, notes: Notes) -> None:
    for name in notes.get("killed_controllers", []):
        record = notes["records"][name]
        bed.start_again(record)
        bed.wait_controller_ready(name)


def controller_kill(role: str) -> Fault:
    """SIGKILL the Lease holder (`leader`) or the other replica (`standby`); it comes back only
    after recovery is measured, so a leader's recovery is the standby's takeover."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        # In a pair after an API server kill, the Lease is read once the API answers again.
        leader = wait_for("the Lease holder readable", lambda: _leader(bed), 120)
        victim = leader if role == "leader" else next(n for n in CONTROLLERS if n != leader)
        notes["victim"] = victim
        notes["killed_controllers"] = [victim]
        notes["records"] = {victim: bed.kill(victim)}

    return Fault(
        f"controller-{role}-kill",
        inject,
        after=_restart_dead_controllers,
        canaries=("policy", "legacy", "share"),
    )


def _leader(bed: ChaosBed) -> str | None:
    try:
        return bed.leader()
    except kube.KubeError:
        return None


def webhook_down(hold_s: float) -> Fault:
    """Both replicas (which serve the webhook) down for `hold_s`: legacy pods must be refused
    with a reason (the webhook fails closed), every other pod created as usual."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        notes["killed_controllers"] = list(CONTROLLERS)
        notes["records"] = {name: bed.kill(name) for name in CONTROLLERS}

    def heal(bed: ChaosBed, notes: Notes) -> None:
        _restart_dead_controllers(bed, notes)
        notes["killed_controllers"] = []

    return Fault(
        "webhook-down",
        inject,
        heal,
        hold_s=hold_s,
        canaries=("legacy", "policy", "share"),
        during=("share", "named"),
    )


def lease_stolen() -> Fault:
    """The Lease is taken by an identity that never renews, while the leader writes (the churn
    keeps it writing): it must stop allocating, and a replica takes the Lease once it expires."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        path = kube.path(
            "coordination.k8s.io/v1",
            "leases",
            bed_controller.LEASE,
            namespace=bed_controller.NAMESPACE,
        )
        notes["leader_before"] = bed.leader()
        for _ in range(10):
            lease = bed.client.get(path)
            spec = lease.setdefault("spec", {})
            spec["holderIdentity"] = f"intruder-{uuid.uuid4().hex[:6]}"
            spec["renewTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
            spec["acquireTime"] = spec["renewTime"]
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            try:
                bed.client.replace(path, lease)
                notes["intruder"] = spec["holderIdentity"]
                return
            except kube.Conflict:
                continue
        raise RuntimeError("could not overwrite the Lease (10 conflicts)")

    def after(bed: ChaosBed, notes: Notes) -> None:
        notes["leader_after"] = bed.leader()

    # Held past one retry period (2 s): the canary then measures the wait for the intruder's
    # Lease to expire, not the moment before the leader noticed.
    return Fault("lease-stolen", inject, after=after, hold_s=3, canaries=("policy", "share"))


def cert_rotation() -> Fault:
    """The webhook's certificate Secret emptied mid-churn: the replicas make a new CA and serving
    certificate and publish the new caBundle; admissions must come back on their own."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        handle = bed.controllers[CONTROLLERS[0]]
        secret = bed_webhook.certificate_secret(handle.namespace, bed_controller.RELEASE)
        path = kube.path("v1", "secrets", secret["metadata"]["name"], namespace=handle.namespace)
        current = bed.client.get(path)
        notes["ca_before"] = hash((current.get("data") or {}).get("ca.crt"))
        current["data"] = {}
        bed.client.replace(path, current)

    return Fault("cert-rotation", inject, canaries=("legacy",))


# ----- a node -----------------------------------------------------------------------------------


def plugin_kill(node: str) -> Fault:
    """SIGKILL the kubelet plugin at whatever it is doing (the churn keeps it busy)."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        target = bed.nodes[node]
        target.kill(target.plugin_process)
        time.sleep(DOWN_S)
        target.start_plugin()

    return Fault("plugin-kill", inject, node=node)


def plugin_kill_at(node: str, arm_name: str, *, wait_s: float = 60.0) -> Fault:
    """SIGKILL the plugin at one step of prepare or unprepare (plugin_steps.ARMS) of a claim of
    the fault's own (its UID, and so its paths, known in advance); the plugin is started again
    and the target pod must then run (prepare) or be gone with its files (unprepare)."""
    arm = plugin_steps.ARMS_BY_NAME[arm_name]

    def inject(bed: ChaosBed, notes: Notes) -> None:
        target = bed.nodes[node]
        name = f"step-{arm.name}-{uuid.uuid4().hex[:5]}"
        claims = kube.path("resource.k8s.io/v1", "resourceclaims", namespace=bed.namespace)
        pods = kube.path("v1", "pods", namespace=bed.namespace)
        pod, claim = churn.pod_manifest(name, "named", random.Random(name), node=node)
        assert claim is not None
        uid = str(bed.client.create(claims, claim)["metadata"]["uid"])
        notes.update(target=name, target_uid=uid)
        out = bed.cluster.root / "faults" / f"strace-{name}.txt"
        out.parent.mkdir(exist_ok=True)
        if arm.unprepare:
            bed.client.create(pods, pod)
            wait_for(f"{name} running", lambda: _running(bed, name), 120)
            armed = plugin_steps.Armed(target, arm, uid, out)
            bed.client.request("DELETE", f"{pods}/{name}", query={"gracePeriodSeconds": 1})
        else:
            armed = plugin_steps.Armed(target, arm, uid, out)
            bed.client.create(pods, pod)
        hit = armed.wait(wait_s)
        if hit is None:
            notes["step"] = "not reached (no such call within the wait)"
            notes["not_reached"] = True
            return
        notes["t_fault"] = time.monotonic()  # recovery counts from the kill
        notes.update(step=hit.step, call=hit.call)
        target.forget_dead(target.plugin_process)
        time.sleep(DOWN_S)
        target.start_plugin()

    def after(bed: ChaosBed, notes: Notes) -> None:
        """The target pod ran after all (prepare) or is gone (unprepare); then it and its claim
        are removed."""
        name = str(notes.get("target", ""))
        if not name:
            return
        pods = kube.path("v1", "pods", namespace=bed.namespace)
        if arm.unprepare:
            notes["target_pod_gone"] = _wait_quietly(lambda: _gone(bed, name), 120)
        else:
            notes["target_pod_ran"] = _wait_quietly(lambda: _running(bed, name), 120)
            with contextlib.suppress(kube.KubeError):
                bed.client.request("DELETE", f"{pods}/{name}", query={"gracePeriodSeconds": 1})
            _wait_quietly(lambda: _gone(bed, name), 120)
        with contextlib.suppress(kube.KubeError):
            bed.client.delete(
                kube.path("resource.k8s.io/v1", "resourceclaims", name, namespace=bed.namespace)
            )

    return Fault(
        f"plugin-kill-at-{arm.name}", inject, after=after, node=node, tags=("plugin-step",)
    )


def _running(bed: ChaosBed, name: str) -> bool:
    try:
        return churn.is_running(
            bed.client.get(kube.path("v1", "pods", name, namespace=bed.namespace))
        )
    except kube.KubeError:
        return False


def _gone(bed: ChaosBed, name: str) -> bool:
    try:
        bed.client.get(kube.path("v1", "pods", name, namespace=bed.namespace))
    except kube.NotFound:
        return True
    except kube.KubeError:
        return False
    return False


def _wait_quietly(check: Callable[[], bool], timeout: float) -> bool:
    try:
        return bool(wait_for("a condition", check, timeout))
    except TimeoutError:
        return False


def kubelet_restart(node: str) -> Fault:
    def inject(bed: ChaosBed, notes: Notes) -> None:
        bed.nodes[node].restart_kubelet(DOWN_S)

    return Fault("kubelet-restart", inject, node=node)


def containerd_restart(node: str) -> Fault:
    def inject(bed: ChaosBed, notes: Notes) -> None:
        bed.nodes[node].restart_containerd(DOWN_S)

    return Fault("containerd-restart", inject, node=node)


def partition(node: str, hold_s: float) -> Fault:
    """The node cut off the API server (both ways) for `hold_s`, inside its network namespace."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        port = bed.cluster.state.ports["kube-apiserver"]
        netfaults.partition(bed.nodes[node].netns(), port)

    def heal(bed: ChaosBed, notes: Notes) -> None:
        netfaults.heal(bed.nodes[node].netns())

    label = f"{int(hold_s)}s" if hold_s < 120 else f"{int(hold_s // 60)}m"
    return Fault(f"partition-{label}", inject, heal, hold_s=hold_s, node=node, tags=("partition",))


def slow_api(node: str, hold_s: float, rate_kbit: int = 200) -> Fault:
    """Every packet between the node and the API server squeezed through `rate_kbit` for
    `hold_s` (netfaults.throttle: this kernel has no netem); the run also measures a canary on
    that node while it lasts."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        port = bed.cluster.state.ports["kube-apiserver"]
        netfaults.throttle(bed.nodes[node].netns(), port, rate_kbit)
        notes["rate_kbit"] = rate_kbit

    def heal(bed: ChaosBed, notes: Notes) -> None:
        netfaults.heal(bed.nodes[node].netns())

    return Fault("slow-api", inject, heal, hold_s=hold_s, node=node, during=("share",))


def node_reboot(node: str) -> Fault:
    """Stop the node, wipe what a reboot wipes, start it with a new boot ID on the same disk.
    Claims prepared before must be prepared again (read from the API, files rewritten), not
    taken from the checkpoint as they were."""

    def inject(bed: ChaosBed, notes: Notes) -> None:
        target = bed.nodes[node]
        notes["witnesses"] = _witnesses(bed, node, 2)
        before = CheckpointJournal(str(target.paths.state_dir)).load()
        notes["boot_id_before"] = target.read_boot_id()
        notes["prepared_before"] = {uid: f"{p.namespace}/{p.name}" for uid, p in before.items()}
        notes["rebooted_at"] = time.time()
        target.reboot()
        notes["boot_id_after"] = target.read_boot_id()

    def after(bed: ChaosBed, notes: Notes) -> None:
        target = bed.nodes[node]
        before: dict[str, str] = notes.get("prepared_before", {})
        # The plugin compacts its checkpoint at start-up (the journal emptied), so a `put` in
        # the journal now is a claim prepared since the reboot: read from the API, files
        # written. A claim answered from the checkpoint as it was has none.
        reprepared = [u for u in before if u in _journal_puts(target.paths.state_dir)]
        # Claims of pods whose containers started again after the reboot: the kubelet asked the
        # plugin to prepare them, and got an answer.
        ran_again = _claims_started_since(bed, node, float(notes["rebooted_at"]))
        trusted = [u for u in before if before[u] in ran_again and u not in reprepared]
        notes["prepared_before"] = len(before)
        notes["ran_again_after_reboot"] = sorted(v for v in before.values() if v in ran_again)
        notes["prepared_again"] = len(reprepared)
        notes["trusted_from_checkpoint"] = sorted(before[u] for u in trusted)
        for name in notes.pop("witnesses", []):
            with contextlib.suppress(kube.KubeError):
                bed.client.request(
                    "DELETE",
                    kube.path("v1", "pods", name, namespace=bed.namespace),
                    query={"gracePeriodSeconds": 2},
                )

    return Fault("node-reboot", inject, after=after, node=node, tags=("reboot",))


def _witnesses(bed: ChaosBed, node: str, count: int) -> list[str]:
    """Pods pinned to `node` that live through its reboot (the churn's may end meanwhile), once
    they run."""
    names = []
    for i in range(count):
        name = f"reboot-witness-{uuid.uuid4().hex[:6]}-{i}"
        pod, _ = churn.pod_manifest(name, "share", random.Random(i), node=node)
        bed.client.create(kube.path("v1", "pods", namespace=bed.namespace), pod)
        names.append(name)

    def running() -> bool:
        return all(
            churn.is_running(bed.client.get(kube.path("v1", "pods", n, namespace=bed.namespace)))
            for n in names
        )

    wait_for("the reboot's witness pods running", running, 90)
    return names


def _claims_started_since(bed: ChaosBed, node: str, since: float) -> set[str]:
    """`namespace/claim` of the pods on `node` whose containers (re)started after `since`."""
    found: set[str] = set()
    pods = bed.client.list(kube.path("v1", "pods"), field_selector=f"spec.nodeName={node}")
    for pod in pods:
        status = pod.get("status") or {}
        started = [
            ((c.get("state") or {}).get("running") or {}).get("startedAt")
            for c in status.get("containerStatuses") or []
        ]
        if not any(s and _epoch(s) >= since for s in started):
            continue
        ns = pod["metadata"]["namespace"]
        for claim in status.get("resourceClaimStatuses") or []:
            found.add(f"{ns}/{claim.get('resourceClaimName')}")
        for ref in pod["spec"].get("resourceClaims") or []:
            if ref.get("resourceClaimName"):
                found.add(f"{ns}/{ref['resourceClaimName']}")
    return found


def _epoch(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def _journal_puts(state_dir: Path) -> set[str]:
    """UIDs of the claims the plugin's checkpoint journal records as prepared."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for line in (state_dir / "checkpoint.log").read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("op") == "put":
                    found.add(str(record["plan"]["uid"]))
    return found


# ----- the matrix -------------------------------------------------------------------------------


def singles(*, long_partition: bool, nodes: tuple[str, str]) -> list[list[Fault]]:
    """One fault at a time: every fault this bed can make, the plugin steps on the busy node."""
    busy, other = nodes
    faults = [
        kill_restart("kube-apiserver"),
        kill_restart("etcd"),
        controller_kill("leader"),
        controller_kill("standby"),
        plugin_kill(busy),
        *(plugin_kill_at(busy, arm.name) for arm in plugin_steps.ARMS),
        kubelet_restart(busy),
        containerd_restart(busy),
        partition(other, 30),
        *([partition(other, 300)] if long_partition else []),
        slow_api(busy, 45),
        webhook_down(20),
        lease_stolen(),
        cert_rotation(),
        node_reboot(busy),
    ]
    return [[f] for f in faults]


def pairs(nodes: tuple[str, str]) -> list[list[Fault]]:
    busy, other = nodes
    return [
        [kill_restart("kube-apiserver"), controller_kill("leader")],
        [plugin_kill(busy), kubelet_restart(busy)],
        [partition(other, 30), controller_kill("leader")],
        [kill_restart("etcd"), containerd_restart(busy)],
        [slow_api(busy, 30), plugin_kill_at(busy, "before-record")],
        [lease_stolen(), plugin_kill(other)],
    ]


def short(nodes: tuple[str, str]) -> list[list[Fault]]:
    """The most valuable faults, for `make test`: the leader, the plugin mid-prepare, the API
    server."""
    busy, _ = nodes
    return [
        [controller_kill("leader")],
        [plugin_kill_at(busy, "before-vgpu-conf")],
        [kill_restart("kube-apiserver")],
    ]
