"""The `vgpu-dra` console script: one entry point, one subcommand per component.

Subcommands are imported lazily so that `vgpu-dra fakegpu env` does not pay for grpc and the
Kubernetes client, and so that each component owns its own argument parsing in its own module.

Two kinds of subcommands:
- product commands (`kubelet-plugin`, `controller`, `status`, `drain`/`undrain`/`drains`), which
  a plain `pip install vgpu-dra` runs;
- test-bed commands (`dev-cluster`, `fakegpu`, `demo`), which live in `vgpu_testbed`: in every
  wheel, left out of the container image. `_load_testbed` is the product's only way into the
  test bed (the layer contract in pyproject.toml allows exactly its `import vgpu_testbed`); where
  the test bed is missing it ends the command with a message that says where to get it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

Command = Callable[[Sequence[str]], int]

TESTBED_INSTALL = "a source checkout's `pip install .` (the container image leaves it out)"

# name -> ("module:function", one-line help). The function takes argv (after the subcommand)
# and returns a process exit code.
PRODUCT_COMMANDS: dict[str, tuple[str, str]] = {
    "kubelet-plugin": ("kubelet_plugin.main:main", "run the node daemon (DRA kubelet plugin)"),
    "controller": (
        "controller.main:main",
        "run the cluster-side controller (policy placement, webhook, rescheduler)",
    ),
    "status": ("dra_driver.status:main", "GPUs, claims, allocated and free memory/cores per GPU"),
    "drain": (
        "dra_driver.drain:main",
        "take one GPU out of service (NODE/DEVICE; a DeviceTaintRule)",
    ),
    "undrain": ("dra_driver.drain:undrain_main", "put a drained GPU back in service"),
    "drains": ("dra_driver.drain:list_main", "drained GPUs and their eviction progress"),
}
# name -> ("module of vgpu_testbed:function", one-line help).
TESTBED_COMMANDS: dict[str, tuple[str, str]] = {
    "dev-cluster": ("cluster.cli:main", "local control plane with simulated GPU nodes"),
    "fakegpu": ("fakegpu.cli:main", "simulated GPUs: print env, inspect, inject faults"),
    "demo": ("demo.cli:main", "the end-to-end demo on a local dev cluster"),
}


class TestbedMissingError(Exception):
    """A test-bed command was asked for but the test bed cannot be imported."""


def _usage() -> str:
    lines = ["usage: vgpu-dra <command> [args...]", "", "commands:"]
    lines += [f"  {name:<16} {text}" for name, (_, text) in PRODUCT_COMMANDS.items()]
    lines += ["", "test-bed commands (developer tooling, not in the container image):"]
    lines += [f"  {name:<16} {text}" for name, (_, text) in TESTBED_COMMANDS.items()]
    return "\n".join(lines)


def _load(target: str) -> Command:
    module_name, func_name = target.split(":")
    func: Command = getattr(importlib.import_module(module_name), func_name)
    return func


def _load_testbed(name: str) -> Command:
    """The test-bed command `name`; TestbedMissingError (naming the extra) when not installed."""
    target = TESTBED_COMMANDS[name][0]
    try:
        import vgpu_testbed  # the one import of the test bed the layer contract allows

        return _load(f"{vgpu_testbed.__name__}.{target}")
    except ModuleNotFoundError as exc:
        # A plain install has every product dependency, so whatever is missing here is the test
        # bed itself or one of its own dependencies.
        raise TestbedMissingError(
            f"vgpu-dra {name}: the test bed is not installed (missing module {exc.name!r}); "
            f"it comes with {TESTBED_INSTALL}"
        ) from exc


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("--version", "version"):
        from dra_driver import __version__

        print(__version__)
        return 0
    name = args[0]
    if name in PRODUCT_COMMANDS:
        return _load(PRODUCT_COMMANDS[name][0])(args[1:])
    if name in TESTBED_COMMANDS:
        try:
            command = _load_testbed(name)
        except TestbedMissingError as exc:
            print(exc, file=sys.stderr)
            return 1
        return command(args[1:])
    print(f"vgpu-dra: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
