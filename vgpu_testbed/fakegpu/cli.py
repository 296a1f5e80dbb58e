"""`vgpu-dra fakegpu ...`: use and inspect simulated GPU nodes from a shell.

    vgpu-dra fakegpu list                         shipped machine profiles
    vgpu-dra fakegpu show PROFILE [--sim]         a profile's GPUs (or the text the C side reads)
    vgpu-dra fakegpu env PROFILE [--state PATH]   `export` lines that put a shell on that node
    vgpu-dra fakegpu status --state PATH [--json] memory per process, utilisation, faults
    vgpu-dra fakegpu inject xid GPU XID --state PATH
    vgpu-dra fakegpu inject lost GPU [--clear] --state PATH
    vgpu-dra fakegpu inject removed|added GPU --state PATH

GPU is a physical index or a UUID. Called through dra_driver.cli; also `python -m
vgpu_testbed.fakegpu.cli`, which `vgpu_testbed.fakegpu.simulator` uses to run control operations in
a process of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgpu_testbed.fakegpu import simulator as fakegpu


def _default_state(profile: str) -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / "vgpu-sim" / f"{Path(profile).stem}.state"


def _cmd_list(_: argparse.Namespace) -> int:
    for name in fakegpu.profile_names():
        p = fakegpu.load_profile(name)
        products: dict[str, int] = {}
        for g in p.gpus:
            products[g.product] = products.get(g.product, 0) + 1
        summary = ", ".join(f"{n}x {product}" for product, n in products.items())
        print(f"{name:<12} {summary}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    p = fakegpu.load_profile(args.profile)
    if args.sim:
        print(fakegpu.render_sim_profile(p), end="")
        return 0
    print(f"{p.name}: {p.description}")
    print(f"driver {p.driver_version}, CUDA {p.cuda_version}")
    for i, g in enumerate(p.gpus):
        links = ", ".join(f"{x.peer}x{x.links}" for x in g.nvlink) or "none"
        print(
            f"  {i}: {g.product} {g.memory_bytes >> 20} MiB, {g.sm_count} SMs, "
            f"cc {g.compute_capability}, {g.uuid}, {g.pci_bus_id}, NUMA {g.numa_node}, "
            f"NVLink {links}"
        )
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    p = fakegpu.load_profile(args.profile)
    state = Path(args.state) if args.state else _default_state(args.profile)
    env = fakegpu.prepare_node(p, state)
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _format_status(status: dict[str, Any]) -> str:
    lines = [f"node {status['node']} (driver {status['driver_version']})"]
    for g in status["gpus"]:
        flags = [f for f in ("lost", "removed") if g[f]]
        used, total = g["memory_used"] >> 20, g["memory_total"] >> 20
        lines.append(
            f"  gpu {g['index']} {g['name']} {g['uuid']}: {used}/{total} MiB, "
            f"util {g['utilization']}%, xids {g['xid_seq']}"
            + (f" [{', '.join(flags)}]" if flags else "")
        )
        for proc in g["processes"]:
            mib = proc["memory_used"] >> 20
            lines.append(f"    pid {proc['pid']}: {mib} MiB, util {proc['utilization']}%")
    return "\n".join(lines)


def _cmd_status(args: argparse.Namespace) -> int:
    lib = fakegpu.control_library(Path(args.state))
    status = fakegpu.status_in_process(lib)
    print(json.dumps(status, indent=2) if args.json else _format_status(status))
    return 0


def _cmd_inject(args: argparse.Namespace) -> int:
    lib = fakegpu.control_library(Path(args.state))
    gpu = fakegpu.resolve_gpu(fakegpu.status_in_process(lib), args.gpu)
    if args.kind == "xid":
        if args.xid is None or args.xid <= 0:
            raise fakegpu.FakeGpuError("inject xid needs a positive XID number, e.g. 48 or 79")
        rc = lib.vgpusim_inject_xid(gpu, args.xid)
    elif args.kind == "lost":
        rc = lib.vgpusim_set_lost(gpu, 0 if args.clear else 1)
    else:
        rc = lib.vgpusim_set_removed(gpu, 1 if args.kind == "removed" else 0)
    if rc != 0:
        raise fakegpu.FakeGpuError(f"inject {args.kind} on GPU {gpu} failed")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vgpu-dra fakegpu", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="shipped machine profiles").set_defaults(func=_cmd_list)
    show = sub.add_parser("show", help="a profile's GPUs")
    show.add_argument("profile", help="profile name or YAML path")
    show.add_argument("--sim", action="store_true", help="print the text the C libraries read")
    show.set_defaults(func=_cmd_show)
    env = sub.add_parser("env", help="print export lines for a shell on a simulated node")
    env.add_argument("profile", help="profile name or YAML path")
    env.add_argument("--state", help="state file (default: $XDG_RUNTIME_DIR or /tmp)")
    env.set_defaults(func=_cmd_env)
    status = sub.add_parser("status", help="memory, processes, utilisation and faults")
    status.add_argument("--state", required=True, help="the node's state file")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_cmd_status)
    inject = sub.add_parser("inject", help="inject a fault")
    inject.add_argument("kind", choices=["xid", "lost", "removed", "added"])
    inject.add_argument("gpu", help="physical GPU index or UUID")
    inject.add_argument("xid", nargs="?", type=int, help="XID number (inject xid only)")
    inject.add_argument("--clear", action="store_true", help="inject lost: recover the GPU")
    inject.add_argument("--state", required=True, help="the node's state file")
    inject.set_defaults(func=_cmd_inject)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except (fakegpu.FakeGpuError, fakegpu.ProfileError) as exc:
        print(f"vgpu-dra fakegpu: {exc}", file=sys.stderr)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
