"""The `vgpu-dra` console script: one entry point, one subcommand per component.

Subcommands are imported lazily so that `vgpu-dra fakegpu env` does not pay for grpc and the
Kubernetes client, and so that each component owns its own argument parsing in its own module.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# name -> ("module:function", one-line help). The function takes argv (after the subcommand)
# and returns a process exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "kubelet-plugin": ("kubelet_plugin.main:main", "run the node daemon (DRA kubelet plugin)"),
    "dev-cluster": (
        "vgpu_testbed.cluster_cli:main",
        "local control plane with simulated GPU nodes",
    ),
    "fakegpu": (
        "vgpu_testbed.fakegpu_cli:main",
        "simulated GPUs: print env, inspect, inject faults",
    ),
    "demo": ("vgpu_testbed.demo:main", "the end-to-end demo on a local dev cluster"),
}


def _usage() -> str:
    lines = ["usage: vgpu-dra <command> [args...]", "", "commands:"]
    lines += [f"  {name:<16} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def _load(target: str) -> Callable[[Sequence[str]], int]:
    module_name, func_name = target.split(":")
    func: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module_name), func_name)
    return func


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("--version", "version"):
        from dra_driver import __version__

        print(__version__)
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"vgpu-dra: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return _load(entry[0])(args[1:])


if __name__ == "__main__":
    sys.exit(main())
