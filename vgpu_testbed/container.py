"""Run a program "as a container would": apply a CDI spec's edits in a private mount namespace.

Why: the hook must be tested the way it is deployed. A container runtime applies our CDI spec
(env, bind mounts of the claim directory, the hook library and `/etc/ld.so.preload`) and the
dynamic loader then preloads the hook into every process; nothing sets LD_PRELOAD by hand.
There is no container runtime here, so this module does the same edits itself: it re-executes
itself under `unshare --mount --propagation private`, bind-mounts each CDI mount (mount targets
that do not exist on the host are created in a tmpfs-backed overlay of their nearest existing
parent directory, so the host tree is never modified), then execs the program with the CDI env.

Who calls it: the hook's integration tests and benchmarks (tests/integration/vgpu_hook/, bench/).
Needs root (tests run as root here). A device node from the spec is bound from the host when the
host has it; otherwise, when the spec gives its numbers, it is created inside the namespace (in a
tmpfs-backed overlay of /dev), as a runtime creates CDI device nodes. The simulator has no
/dev/nvidia*, and its driver, like the real one with CDI, shows the container the GPUs whose
device nodes it has (docs/simulated-gpus.md). Several claims' specs may be applied to one
container, in order, as a runtime applies several CDI devices.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class BindMount:
    host_path: str
    container_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class DeviceNodeEdit:
    """A CDI device node: the host path, and its numbers when the spec gives them."""

    path: str
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """The merged edits of specs' top levels and the selected devices, in CDI order."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[BindMount, ...] = ()
    device_nodes: tuple[DeviceNodeEdit, ...] = ()
    additional_gids: tuple[int, ...] = ()

    @property
    def device_paths(self) -> tuple[str, ...]:
        return tuple(node.path for node in self.device_nodes)


# One spec and the CDI device names of it that a container uses (one claim).
SpecDevices = tuple[Mapping[str, Any], Sequence[str]]


def _merge(acc: dict[str, Any], edits: Mapping[str, Any]) -> None:
    for entry in edits.get("env", []):
        key, sep, value = str(entry).partition("=")
        if not sep:
            raise ValueError(f"CDI env entry {entry!r} is not KEY=VALUE")
        acc["env"][key] = value
    for mount in edits.get("mounts", []):
        options = list(mount.get("options", []))
        acc["mounts"].append(
            BindMount(str(mount["hostPath"]), str(mount["containerPath"]), "ro" in options)
        )
    for node in edits.get("deviceNodes", []):
        path = str(node.get("hostPath") or node["path"])
        major, minor = node.get("major"), node.get("minor")
        edit = DeviceNodeEdit(
            path,
            int(major) if major is not None else None,
            int(minor) if minor is not None else None,
        )
        # Two claims both carry the control nodes (/dev/nvidiactl): one node per path.
        if all(known.path != path for known in acc["devices"]):
            acc["devices"].append(edit)
    for gid in map(int, edits.get("additionalGids", [])):
        if gid not in acc["gids"]:
            acc["gids"].append(gid)


def edits_from_specs(claims: Sequence[SpecDevices]) -> ContainerEdits:
    """Pure: the edits a runtime applies for several specs' devices, in order (a later env value
    of the same name wins, as in a runtime)."""
    acc: dict[str, Any] = {"env": {}, "mounts": [], "devices": [], "gids": []}
    for spec, device_names in claims:
        _merge(acc, spec.get("containerEdits") or {})
        by_name = {d["name"]: d for d in spec.get("devices", [])}
        for name in device_names:
            if name not in by_name:
                raise ValueError(f"CDI spec of kind {spec.get('kind')!r} has no device {name!r}")
            _merge(acc, by_name[name].get("containerEdits") or {})
    return ContainerEdits(
        env=acc["env"],
        mounts=tuple(acc["mounts"]),
        device_nodes=tuple(acc["devices"]),
        additional_gids=tuple(acc["gids"]),
    )


def edits_from_spec(spec: Mapping[str, Any], device_names: Sequence[str]) -> ContainerEdits:
    """Pure: the edits a runtime applies for these CDI device names of one spec."""
    return edits_from_specs([(spec, device_names)])


def run_with_claims(
    claims: Sequence[SpecDevices],
    argv: Sequence[str],
    *,
    base_env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    stdin: int | None = subprocess.DEVNULL,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run argv in one container that uses several claims (each: its spec and device names)."""
    return subprocess.run(
        claims_command(claims, argv),
        env=dict(base_env if base_env is not None else os.environ),
        timeout=timeout,
        stdin=stdin,
        capture_output=capture,
        text=True,
        check=False,
    )


def container_command(
    spec: Mapping[str, Any], device_names: Sequence[str], argv: Sequence[str]
) -> list[str]:
    """The command line that runs argv inside the container view (for Popen users)."""
    return claims_command([(spec, device_names)], argv)


def claims_command(claims: Sequence[SpecDevices], argv: Sequence[str]) -> list[str]:
    """The command line that runs argv in one container using several claims' specs."""
    edits = edits_from_specs(claims)
    plan = {
        "env": edits.env,
        "mounts": [[m.host_path, m.container_path, m.read_only] for m in edits.mounts],
        "devices": [[d.path, d.major, d.minor] for d in edits.device_nodes],
        "gids": list(edits.additional_gids),
        "argv": list(argv),
    }
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        sys.executable,
        "-m",
        "vgpu_testbed.container",
        json.dumps(plan),
    ]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _nearest_existing(path: str) -> str:
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent


def _prepare_target(target: str, is_dir: bool, scratch: str, overlaid: set[str]) -> None:
    """Make `target` exist without touching the host: overlay its nearest existing parent."""
    if os.path.lexists(target):
        return
    _overlay_parent(target, scratch, overlaid)
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass


def _overlay_parent(target: str, scratch: str, overlaid: set[str]) -> None:
    """Make the nearest existing parent of `target` writable in this namespace only."""
    parent = _nearest_existing(target)
    if parent == "/":
        raise RuntimeError(f"cannot create mount target {target}: no parent below / exists")
    if parent not in overlaid:
        index = len(overlaid)
        upper, work = f"{scratch}/u{index}", f"{scratch}/w{index}"
        os.makedirs(upper)
        os.makedirs(work)
        _mount(
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={parent},upperdir={upper},workdir={work}",
            parent,
        )
        overlaid.add(parent)


def _provided_by_a_bind(target: str, binds: list[tuple[str, str, bool]]) -> bool:
    """True when `target` lies inside another bind's directory whose host side already has it
    (a claim's region file inside its claim dir): it exists once that bind is mounted."""
    for host, container, _ in binds:
        prefix = container.rstrip("/") + "/"
        inside = target.startswith(prefix) and os.path.isdir(host)
        if inside and os.path.lexists(os.path.join(host, target[len(prefix) :])):
            return True
    return False


def _make_device_node(path: str, major: int, minor: int, scratch: str, overlaid: set[str]) -> None:
    """Create a character device the host lacks, inside this namespace only (as a runtime
    creates a CDI device node in the container's /dev)."""
    _overlay_parent(path, scratch, overlaid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o660, os.makedev(major, minor))


def _inside(plan: dict[str, Any]) -> int:
    """Runs in the new mount namespace: mount, then exec the program."""
    # One fixed, empty host directory serves every namespace: each mounts its own private
    # tmpfs over it, so nothing is left behind on the host per run.
    scratch = os.path.join(tempfile.gettempdir(), f"vgpu-ctr-scratch-{os.getuid()}")
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", scratch)
    overlaid: set[str] = set()
    binds: list[tuple[str, str, bool]] = [(h, c, bool(ro)) for h, c, ro in plan["mounts"]]
    for path, major, minor in plan["devices"]:
        if os.path.exists(path):
            binds.append((path, path, False))
        elif major is not None and minor is not None:
            _make_device_node(path, major, minor, scratch, overlaid)
    # Parents first, so a deeper bind is not hidden by a later overlay of its parent.
    binds.sort(key=lambda b: b[1].count("/"))
    for host, target, _ in binds:
        if not os.path.exists(host):
            raise FileNotFoundError(f"CDI mount source {host} does not exist")
        if not _provided_by_a_bind(target, binds):
            _prepare_target(target, os.path.isdir(host), scratch, overlaid)
    for host, target, read_only in binds:
        _mount("--bind", host, target)
        if read_only:
            _mount("-o", "remount,bind,ro", target)
    env = dict(os.environ)
    env.update(plan["env"])
    if plan["gids"]:
        os.setgroups(sorted(set(os.getgroups()) | set(plan["gids"])))
    argv: list[str] = plan["argv"]
    os.execvpe(argv[0], argv, env)
    return 127  # pragma: no cover - execvpe does not return


def main(args: Sequence[str]) -> int:
    if len(args) != 1:
        print("usage: python -m vgpu_testbed.container '<plan json>'", file=sys.stderr)
        return 2
    return _inside(json.loads(args[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
