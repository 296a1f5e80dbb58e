"""`vgpu-dra demo` (`make demo`): what vgpu-dra does, end to end, with the real components.

A real Kubernetes control plane, simulated GPU nodes each running our kubelet plugin and a
kubelet stand-in, the real kube-scheduler allocating shares of GPUs from the plugin's
ResourceSlices, the deploy/examples manifests prepared by the plugin, and `vgpu_hook` enforcing
the shared claim's memory and compute caps inside a "container". The steps are in
vgpu_testbed.demo.steps and vgpu_testbed.demo.caps; this module lists them (`STEPS`), parses
options, runs the steps with titles and durations, reports a failure (which step, the error,
where the logs are) and always tears down unless `--keep`. Called by dra_driver.cli; see
docs/demo.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.cluster.binaries import BinariesMissingError, find_binaries
from vgpu_testbed.demo.caps import step_workloads
from vgpu_testbed.demo.legacy import step_legacy_pod
from vgpu_testbed.demo.observe import step_observe
from vgpu_testbed.demo.policies import step_policy_path
from vgpu_testbed.demo.steps import (
    SHARED_POD,
    DemoContext,
    Step,
    step_apply_examples,
    step_bring_up,
    step_release,
    step_show_prepared_claim,
    step_show_slices,
)

__all__ = ["STEPS", "DemoContext", "Step", "build_parser", "main", "run_steps"]


STEPS: list[Step] = [
    Step("Control plane + simulated GPU nodes with our kubelet plugin", step_bring_up),
    Step("What the kubelet plugins published (ResourceSlices)", step_show_slices),
    Step("Apply the DeviceClass and deploy/examples; schedule and prepare", step_apply_examples),
    Step(f"What prepare wrote for pod {SHARED_POD}", step_show_prepared_claim),
    Step(f"Inside pod {SHARED_POD}'s container: the hook enforces the caps", step_workloads),
    Step(f"What an operator sees: vgpu-dra status, pod {SHARED_POD}'s metrics", step_observe),
    Step(f"Delete pod {SHARED_POD}: the plugin releases its share", step_release),
    Step("The policy path: the allocation controller places by policy", step_policy_path),
    Step("A vgpu-manager pod, unchanged, through the admission webhook", step_legacy_pod),
]
# A third node with two NVLink islands, for the policy step's NVLink-aware placement.
DEMO_PROFILES = (*cluster_nodes.DEFAULT_PROFILES, "a100-2x4")


class StepFailedError(RuntimeError):
    """A step raised; carries its number and title for the report."""

    def __init__(self, number: int, title: str, error: BaseException) -> None:
        super().__init__(f"step {number} ({title}) failed: {type(error).__name__}: {error}")
        self.number = number
        self.title = title
        self.error = error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu-dra demo",
        description="End-to-end demo on a local cluster of simulated GPU nodes (docs/demo.md).",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="cluster directory (default: a new temp dir)"
    )
    parser.add_argument(
        "--nodes",
        type=cluster_nodes.profiles_arg,
        default=list(DEMO_PROFILES),
        metavar="PROFILE,PROFILE,...",
        help=f"simulated GPU profile per node (default: {','.join(DEMO_PROFILES)})",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster and its node agents running (stop them with dev-cluster down)",
    )
    parser.add_argument(
        "--wait-timeout",
        type=_positive_seconds,
        default=90.0,
        metavar="SECONDS",
        help="how long to wait for each example pod to be scheduled and prepared (default 90)",
    )
    return parser


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def run_steps(ctx: DemoContext, steps: Sequence[Step]) -> None:
    """Run the steps in order, each with a numbered title and its duration."""
    total = len(steps) + 1  # the teardown is printed as the last step
    for number, step in enumerate(steps, start=1):
        started = time.monotonic()
        print(f"[{number}/{total}] {step.title}", flush=True)
        try:
            step.run(ctx)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            raise StepFailedError(number, step.title, err) from err
        print(f"      done in {time.monotonic() - started:.1f}s", flush=True)


def check_prerequisites(args: argparse.Namespace) -> None:
    """Fail before anything starts when the demo cannot run: binaries, simulated GPU
    libraries, profiles, socket path lengths (the same checks as `dev-cluster up --agents`)."""
    from vgpu_testbed.cluster.chart import helm_path
    from vgpu_testbed.standin import node_agents

    find_binaries(None)
    helm_path()  # the policy step renders the chart's RBAC for the controller
    # Without --dir the directory is made later by mkdtemp; check a name of the same length.
    default_root = Path(tempfile.gettempdir()) / "vgpu-dra-demo-XXXXXXXX"
    root = args.dir if args.dir is not None else default_root
    node_agents.check_prerequisites(root, args.nodes)


def main(argv: Sequence[str]) -> int:
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        check_prerequisites(args)
    except (BinariesMissingError, ValueError, RuntimeError) as err:
        print(f"vgpu-dra demo: error: {err}", file=sys.stderr)
        return 1
    ctx = DemoContext(args)
    code = 0
    try:
        run_steps(ctx, STEPS)
    except StepFailedError as err:
        code = 1
        report_failure(ctx, err)
    except KeyboardInterrupt:
        print("vgpu-dra demo: interrupted", file=sys.stderr)
        code = 130
    finally:
        tear_down(ctx, keep=args.keep and code == 0, failed=code != 0)
    if code == 0:
        print(f"demo finished in {time.monotonic() - ctx.t0:.1f}s", flush=True)
    return code


def report_failure(ctx: DemoContext, err: StepFailedError) -> None:
    print(f"vgpu-dra demo: error: {err}", file=sys.stderr)
    if ctx.cluster is None:
        # Cluster.start stops what it started and keeps the logs when it fails.
        if ctx.root is not None and (ctx.root / "logs").is_dir():
            print(f"vgpu-dra demo: logs (kept): {ctx.root / 'logs'}/", file=sys.stderr)
        return
    logs = ctx.cluster.layout.logs
    trace = logs / "demo-traceback.txt"
    with contextlib.suppress(OSError):
        trace.write_text("".join(traceback.format_exception(err.error)))
    names = sorted(p.name for p in ctx.cluster.processes)
    print(f"vgpu-dra demo: logs (kept): {logs}/", file=sys.stderr)
    for name in names:
        print(f"    {logs / (name + '.log')}", file=sys.stderr)
    print(f"    {trace} (the demo's traceback)", file=sys.stderr)


def tear_down(ctx: DemoContext, *, keep: bool, failed: bool) -> None:
    """Stop everything (keeping the logs after a failure), or print how to reach a kept one."""
    if ctx.client is not None:
        ctx.client.close()
    if ctx.cluster is None:
        return
    started = time.monotonic()
    number = len(STEPS) + 1
    root = ctx.cluster.root
    if keep:
        print(f"[{number}/{number}] Keep the cluster running (--keep)", flush=True)
        print(f"      export KUBECONFIG={ctx.cluster.kubeconfig}", flush=True)
        print(f"      stop it with: vgpu-dra dev-cluster down --dir {root}", flush=True)
        return
    print(f"[{number}/{number}] Tear down", flush=True)
    survivors = ctx.cluster.stop(keep_logs=failed)
    if survivors:
        left = ", ".join(f"{p.name} (pid {p.pid})" for p in survivors)
        print(f"      could not stop {left}; retry: vgpu-dra dev-cluster down --dir {root}")
    elif failed:
        print(f"      everything stopped; logs kept in {ctx.cluster.layout.logs}", flush=True)
    else:
        print(f"      cluster stopped and removed ({root})", flush=True)
    print(f"      done in {time.monotonic() - started:.1f}s", flush=True)
