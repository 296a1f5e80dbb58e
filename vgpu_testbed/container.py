"""Run a program "as a container would": apply a CDI spec's edits in a private mount namespace.

Why: the hook must be tested the way it is deployed. A container runtime applies our CDI spec
(env, bind mounts of the claim directory, the hook library and `/etc/ld.so.preload`) and the
dynamic loader then preloads the hook into every process; nothing sets LD_PRELOAD by hand.
There is no container runtime here, so this module does the same edits itself: it re-executes
itself under `unshare --mount --propagation private`, bind-mounts each CDI mount (mount targets
that do not exist on the host are created in a tmpfs-backed overlay of their nearest existing
parent directory, so the host tree is never modified), then execs the program with the CDI env.

Who calls it: the hook's integration tests and benchmarks (tests/integration/hook/, bench/).
Needs root (tests run as root here). Device nodes from the spec are bound only when the host
has them (the simulator has no /dev/nvidia*).
"""

from __future__ import annotations

import json
import os
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
class ContainerEdits:
    """The merged edits of a spec's top level and the selected devices, in CDI order."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[BindMount, ...] = ()
    device_paths: tuple[str, ...] = ()
    additional_gids: tuple[int, ...] = ()


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
        acc["devices"].append(str(node.get("hostPath") or node["path"]))
    acc["gids"].extend(int(g) for g in edits.get("additionalGids", []))


def edits_from_spec(spec: Mapping[str, Any], device_names: Sequence[str]) -> ContainerEdits:
    """Pure: the edits a runtime applies for these CDI device names of one spec."""
    acc: dict[str, Any] = {"env": {}, "mounts": [], "devices": [], "gids": []}
    _merge(acc, spec.get("containerEdits") or {})
    by_name = {d["name"]: d for d in spec.get("devices", [])}
    for name in device_names:
        if name not in by_name:
            raise ValueError(f"CDI spec of kind {spec.get('kind')!r} has no device {name!r}")
        _merge(acc, by_name[name].get("containerEdits") or {})
    return ContainerEdits(
        env=acc["env"],
        mounts=tuple(acc["mounts"]),
        device_paths=tuple(acc["devices"]),
        additional_gids=tuple(acc["gids"]),
    )


def run_in_container(
    spec: Mapping[str, Any],
    device_names: Sequence[str],
    argv: Sequence[str],
    *,
    base_env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    stdin: int | None = subprocess.DEVNULL,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run argv with the spec's edits applied; returns the finished process."""
    return subprocess.run(
        container_command(spec, device_names, argv),
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
    edits = edits_from_spec(spec, device_names)
    plan = {
        "env": edits.env,
        "mounts": [[m.host_path, m.container_path, m.read_only] for m in edits.mounts],
        "devices": list(edits.device_paths),
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
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass


def _inside(plan: dict[str, Any]) -> int:
    """Runs in the new mount namespace: mount, then exec the program."""
    # One fixed, empty host directory serves every namespace: each mounts its own private
    # tmpfs over it, so nothing is left behind on the host per run.
    scratch = os.path.join(tempfile.gettempdir(), f"vgpu-ctr-scratch-{os.getuid()}")
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", scratch)
    overlaid: set[str] = set()
    binds: list[tuple[str, str, bool]] = [(h, c, bool(ro)) for h, c, ro in plan["mounts"]]
    binds += [(d, d, False) for d in plan["devices"] if os.path.exists(d)]
    # Parents first, so a deeper bind is not hidden by a later overlay of its parent.
    binds.sort(key=lambda b: b[1].count("/"))
    for host, target, _ in binds:
        if not os.path.exists(host):
            raise FileNotFoundError(f"CDI mount source {host} does not exist")
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
