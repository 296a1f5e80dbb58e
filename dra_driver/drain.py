"""`vgpu-dra drain NODE/DEVICE`, `undrain` and `drains`: take one GPU out of service, and back.

Why a DeviceTaintRule (`resource.k8s.io/v1`, GA in Kubernetes 1.37, `DRADeviceTaintRules`) and
not a taint in the slice: the slice is the kubelet plugin's (it republishes it from what it
observes), a drain is an admin's decision that must outlive plugin restarts and be visible and
revocable with the API alone. A rule's taint acts exactly like a slice's: kube-scheduler (and the
policy path's allocator, `dra_driver.allocator.model`) places no claim on the device unless the
request tolerates it; with `NoExecute`, kube-controller-manager's device-taint eviction
controller deletes the pods whose claims use the device, and reports progress in the rule's
`EvictionInProgress` condition.

One rule per drained device, named from driver, node and device (`rule_name`), selecting the
driver, the node's pool and the device; the taint key is `<driver>/drain`, its value a slug of
`--reason` (the full text rides in an annotation). Draining is idempotent (the same drain again
changes nothing; another effect or reason updates the rule), undraining a device that is not
drained is not an error. Who may drain: whoever may create DeviceTaintRules, cluster admins; the
chart grants that to no account.

Layers: `plan_rule` / `render_table` (pure) -> `drain` / `undrain` / `list_drains` (I/O through
`dra_driver.kube`) -> `main` / `undrain_main` / `list_main` (flags, messages, exit codes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from dra_driver import kube, names

JSON = dict[str, Any]
EFFECTS = ("NoExecute", "NoSchedule")
DEFAULT_EFFECT = "NoExecute"
PLURAL = "devicetaintrules"
EVICTION_CONDITION = "EvictionInProgress"
MAX_NAME = 253  # a cluster-scoped object's name: a DNS subdomain
MAX_LABEL_VALUE = 63  # a taint value: a label value
NEEDS = (
    "DeviceTaintRules (resource.k8s.io/v1) need Kubernetes 1.37 or later with the "
    "DRADeviceTaintRules feature gate on (its default)"
)


class DrainError(Exception):
    """What the operator must be told; the command exits 1 with it."""


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    device: str

    def __str__(self) -> str:
        return f"{self.node}/{self.device}"


@dataclass
class DrainRow:
    """One DeviceTaintRule that can taint the driver's devices, as `drains` shows it."""

    rule: str
    node: str  # the selected pool ("*": any)
    device: str  # "*": any
    effect: str
    taint: str  # key=value (or key)
    since: str  # timeAdded
    eviction: str  # the EvictionInProgress condition: "True: <message>", "-" when absent
    reason: str  # the drain's free text
    ours: bool  # written by `vgpu-dra drain`


# ---- pure ----------------------------------------------------------------------------------


def parse_target(text: str) -> Target:
    node, sep, device = text.partition("/")
    if not sep or not node or not device or "/" in device:
        raise DrainError(f"expected NODE/DEVICE (e.g. node-1/gpu-3), got {text!r}")
    return Target(node, device)


def rule_name(driver: str, target: Target) -> str:
    """The rule's name: the same for the same driver, node and device (so draining twice finds
    the first rule); hashed when the plain name would pass the API's 253 characters."""
    name = f"drain.{target.node}.{target.device}.{driver}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{driver}\0{target.node}\0{target.device}".encode()).hexdigest()[:20]
    return f"drain.{digest}.{driver}"[:MAX_NAME]


def taint_value(reason: str) -> str:
    """A label value (what a taint value must be) from free text: lower case, runs of other
    characters as '-', at most 63 characters, starting and ending alphanumeric; "" for none."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", reason.lower())[:MAX_LABEL_VALUE]
    return slug.strip("-._")


def plan_rule(driver: str, pool: str, target: Target, effect: str, reason: str) -> JSON:
    """The DeviceTaintRule that drains `target` (a device of `pool`)."""
    if effect not in EFFECTS:
        raise DrainError(f"--effect must be one of {', '.join(EFFECTS)}, got {effect!r}")
    taint: JSON = {"key": names.DriverNames(driver).drain_taint_key, "effect": effect}
    value = taint_value(reason)
    if value:
        taint["value"] = value
    metadata: JSON = {
        "name": rule_name(driver, target),
        "labels": {names.MANAGED_BY_LABEL: names.MANAGED_BY},
    }
    if reason:
        metadata["annotations"] = {names.DRAIN_REASON_ANNOTATION: reason}
    return {
        "apiVersion": kube.RESOURCE_API,
        "kind": "DeviceTaintRule",
        "metadata": metadata,
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": target.device},
            "taint": taint,
        },
    }


def _same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "value", "effect"))


def device_names(slices: Iterable[Mapping[str, Any]]) -> tuple[str, list[str]]:
    """(pool, device names) of one node's slices of one driver, newest pool generation only."""
    items = list(slices)
    if not items:
        return "", []
    newest = max(int(s["spec"]["pool"].get("generation") or 0) for s in items)
    current = [s for s in items if int(s["spec"]["pool"].get("generation") or 0) == newest]
    found = sorted(
        {str(d.get("name")) for s in current for d in s["spec"].get("devices") or []},
        key=_natural,
    )
    return str(current[0]["spec"]["pool"]["name"]), found


def _natural(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def drain_rows(rules: Iterable[Mapping[str, Any]], driver: str) -> list[DrainRow]:
    """The rules that can taint `driver`'s devices (those naming it or no driver), sorted."""
    rows = []
    for rule in rules:
        meta = rule.get("metadata") or {}
        spec = rule.get("spec") or {}
        selector = spec.get("deviceSelector")
        if not isinstance(selector, Mapping) or selector.get("driver") not in (None, driver):
            continue
        taint = spec.get("taint") or {}
        key = str(taint.get("key", ""))
        value = str(taint.get("value") or "")
        eviction = "-"
        for cond in (rule.get("status") or {}).get("conditions") or []:
            if cond.get("type") == EVICTION_CONDITION:
                message = str(cond.get("message") or cond.get("reason") or "")
                eviction = f"{cond.get('status')}: {message}" if message else str(cond["status"])
        rows.append(
            DrainRow(
                rule=str(meta.get("name", "")),
                node=str(selector.get("pool") or "*"),
                device=str(selector.get("device") or "*"),
                effect=str(taint.get("effect", "")),
                taint=f"{key}={value}" if value else key,
                since=str(taint.get("timeAdded") or "-"),
                eviction=eviction,
                reason=str((meta.get("annotations") or {}).get(names.DRAIN_REASON_ANNOTATION, "")),
                ours=(meta.get("labels") or {}).get(names.MANAGED_BY_LABEL) == names.MANAGED_BY,
            )
        )
    return sorted(rows, key=lambda r: (r.node, _natural(r.device), r.rule))


def render_table(rows: Sequence[DrainRow]) -> str:
    if not rows:
        return "No DeviceTaintRules for this driver's devices.\n"
    header = ["NODE", "GPU", "EFFECT", "TAINT", "SINCE", "EVICTION", "RULE"]
    table = [
        [r.node, r.device, r.effect, r.taint, r.since, r.eviction, r.rule + ("" if r.ours else "*")]
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in [header, *table]
    ]
    if any(not r.ours for r in rows):
        lines.append("* not written by vgpu-dra drain")
    return "\n".join(lines) + "\n"


def render_json(rows: Sequence[DrainRow]) -> str:
    return json.dumps({"drains": [asdict(r) for r in rows]}, indent=2) + "\n"


# ---- I/O -----------------------------------------------------------------------------------


def require_api(client: kube.KubeClient) -> None:
    """DrainError naming what is needed when the server does not serve v1 DeviceTaintRules."""
    try:
        group = client.get("/apis/" + kube.RESOURCE_API)
    except kube.NotFound:
        raise DrainError(
            f"the API server does not serve {kube.RESOURCE_API} at all; {NEEDS}"
        ) from None
    served = {str(r.get("name")) for r in group.get("resources") or []}
    if PLURAL not in served:
        raise DrainError(f"the API server does not serve {kube.RESOURCE_API} {PLURAL}; {NEEDS}")


def _rule_path(name: str | None = None) -> str:
    return kube.path(kube.RESOURCE_API, PLURAL, name)


def find_pool(client: kube.KubeClient, driver: str, target: Target) -> str:
    """The pool of `target.node` that publishes `target.device`; DrainError naming the devices
    (or the nodes) that exist when it does not."""
    slices = client.list(
        kube.path(kube.RESOURCE_API, "resourceslices"),
        field_selector=f"spec.driver={driver},spec.nodeName={target.node}",
    )
    pool, devices = device_names(slices)
    if not devices:
        try:
            client.get(kube.path("v1", "nodes", target.node))
        except kube.NotFound:
            raise DrainError(f"node {target.node!r} does not exist") from None
        others = sorted(
            {
                str(s["spec"].get("nodeName"))
                for s in client.list(
                    kube.path(kube.RESOURCE_API, "resourceslices"),
                    field_selector=f"spec.driver={driver}",
                )
                if s["spec"].get("nodeName")
            }
        )
        where = f"nodes that publish it: {', '.join(others)}" if others else "no node publishes it"
        raise DrainError(f"node {target.node} publishes no devices of driver {driver} ({where})")
    if target.device not in devices:
        raise DrainError(
            f"node {target.node} has no device {target.device!r} of driver {driver}; "
            f"its devices: {', '.join(devices)}"
        )
    return pool


def drain(
    client: kube.KubeClient,
    driver: str,
    target: Target,
    *,
    effect: str = DEFAULT_EFFECT,
    reason: str = "",
) -> str:
    """Write (or update) the rule that drains `target`; what was done, for the operator."""
    require_api(client)
    pool = find_pool(client, driver, target)
    want = plan_rule(driver, pool, target, effect, reason)
    name = want["metadata"]["name"]
    try:
        have = client.get(_rule_path(name))
    except kube.NotFound:
        try:
            client.create(_rule_path(), want)
        except kube.AlreadyExists:  # another drain of the same device won the race: compare
            have = client.get(_rule_path(name))
        else:
            return f"drained {target} ({effect}): devicetaintrule/{name}"
    selector = (have.get("spec") or {}).get("deviceSelector") or {}
    if selector != want["spec"]["deviceSelector"]:
        raise DrainError(
            f"devicetaintrule/{name} exists but selects {json.dumps(selector, sort_keys=True)}, "
            "not this device; it was not written by vgpu-dra drain: rename or delete it first"
        )
    have_meta = have.get("metadata") or {}
    same_reason = (have_meta.get("annotations") or {}).get(names.DRAIN_REASON_ANNOTATION, "") == (
        reason
    )
    if _same_taint(have["spec"].get("taint") or {}, want["spec"]["taint"]) and same_reason:
        return f"{target} is already drained ({effect}): devicetaintrule/{name}"
    spec = want["spec"]
    old_taint = (have.get("spec") or {}).get("taint") or {}
    if old_taint.get("effect") == effect and old_taint.get("timeAdded"):
        # Keep the time of an unchanged effect: NoExecute tolerations count from it.
        spec = {**spec, "taint": {**spec["taint"], "timeAdded": old_taint["timeAdded"]}}
    updated = {
        **have,
        "metadata": {
            **have_meta,
            "labels": {**(have_meta.get("labels") or {}), **want["metadata"]["labels"]},
            "annotations": {
                k: v
                for k, v in (have_meta.get("annotations") or {}).items()
                if k != names.DRAIN_REASON_ANNOTATION
            }
            | (want["metadata"].get("annotations") or {}),
        },
        "spec": spec,
    }
    client.replace(_rule_path(name), updated)
    return f"drained {target} ({effect}, updated): devicetaintrule/{name}"


def undrain(client: kube.KubeClient, driver: str, target: Target) -> str:
    """Delete the rule that drains `target`; what was done, for the operator."""
    require_api(client)
    name = rule_name(driver, target)
    try:
        client.delete(_rule_path(name), missing_ok=False)
    except kube.NotFound:
        return f"{target} was not drained (no devicetaintrule/{name})"
    return f"undrained {target}: devicetaintrule/{name} deleted"


def list_drains(client: kube.KubeClient, driver: str) -> list[DrainRow]:
    require_api(client)
    return drain_rows(client.list(_rule_path()), driver)


# ---- commands ------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (env KUBECONFIG); default: in-cluster credentials",
    )
    parser.add_argument("--driver-name", default=names.DEFAULT_DRIVER_NAME)


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu-dra drain",
        description="Drain one GPU: a DeviceTaintRule taints NODE/DEVICE, so no new claim is "
        "placed on it and (NoExecute) pods using it are evicted. Needs the right to create "
        "DeviceTaintRules (cluster admins).",
    )
    parser.add_argument("target", nargs="?", metavar="NODE/DEVICE")
    parser.add_argument(
        "--effect",
        choices=EFFECTS,
        default=DEFAULT_EFFECT,
        help="NoExecute (default): evict pods using the GPU; NoSchedule: keep them, place none",
    )
    parser.add_argument(
        "--reason", default="", help="free text kept on the rule (its slug is the taint value)"
    )
    parser.add_argument("--list", action="store_true", help="show the current drains instead")
    _output(parser)
    _common(parser)
    return parser


def build_undrain_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu-dra undrain", description="Lift `vgpu-dra drain NODE/DEVICE`."
    )
    parser.add_argument("target", metavar="NODE/DEVICE")
    _common(parser)
    return parser


def build_list_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu-dra drains",
        description="DeviceTaintRules that taint this driver's devices, with their eviction "
        "progress (the EvictionInProgress condition kube-controller-manager keeps).",
    )
    _output(parser)
    _common(parser)
    return parser


def _run(kubeconfig: str | None, prog: str, action: Any, out: TextIO) -> int:
    try:
        client = kube.KubeClient.from_kubeconfig(kubeconfig)
    except Exception as exc:  # the client raises several unrelated types for bad configs
        print(f"{prog}: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
        return 1
    try:
        out.write(action(client))
    except DrainError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except kube.KubeError as exc:
        hint = " (creating DeviceTaintRules is for cluster admins)" if exc.status == 403 else ""
        print(f"{prog}: {exc}{hint}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def _listing(args: argparse.Namespace) -> Any:
    def action(client: kube.KubeClient) -> str:
        rows = list_drains(client, args.driver_name)
        return render_json(rows) if args.output == "json" else render_table(rows)

    return action


def main(argv: Sequence[str], stdout: TextIO | None = None) -> int:
    """`vgpu-dra drain NODE/DEVICE [--effect E] [--reason TEXT]` or `vgpu-dra drain --list`."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    out = stdout or sys.stdout
    if args.list:
        if args.target:
            parser.error("--list takes no NODE/DEVICE")
        return _run(args.kubeconfig, "vgpu-dra drain", _listing(args), out)
    if not args.target:
        parser.error("NODE/DEVICE is required (or --list)")
    try:
        target = parse_target(args.target)
    except DrainError as exc:
        parser.error(str(exc))

    def action(client: kube.KubeClient) -> str:
        done = drain(client, args.driver_name, target, effect=args.effect, reason=args.reason)
        return done + "\n"

    return _run(args.kubeconfig, "vgpu-dra drain", action, out)


def undrain_main(argv: Sequence[str], stdout: TextIO | None = None) -> int:
    """`vgpu-dra undrain NODE/DEVICE`."""
    parser = build_undrain_parser()
    args = parser.parse_args(list(argv))
    try:
        target = parse_target(args.target)
    except DrainError as exc:
        parser.error(str(exc))
    return _run(
        args.kubeconfig,
        "vgpu-dra undrain",
        lambda client: undrain(client, args.driver_name, target) + "\n",
        stdout or sys.stdout,
    )


def list_main(argv: Sequence[str], stdout: TextIO | None = None) -> int:
    """`vgpu-dra drains` (the same as `vgpu-dra drain --list`)."""
    args = build_list_parser().parse_args(list(argv))
    return _run(args.kubeconfig, "vgpu-dra drains", _listing(args), stdout or sys.stdout)
