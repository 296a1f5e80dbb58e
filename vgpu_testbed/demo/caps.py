"""Step 5 of `vgpu-dra demo`: the shared pod's caps, enforced by vgpu_hook inside its container.

With the claim's real CDI spec (written by our kubelet plugin at prepare) and the node's
simulated GPUs, it shows (a) NVML inside the container reporting the claim's memory cap as the
GPU's total, (b) allocations within the cap succeeding and beyond it failing with
CUDA_ERROR_OUT_OF_MEMORY, also across two processes of the claim, (c) a kernel loop held at
the claim's `cores` share of NVML utilisation, next to the same loop in the uncapped whole-GPU
pod, and (d) PyTorch, unmodified, seeing the cap as the GPU's memory and running out of memory
at it (vgpu_testbed.demo.torch_step). The step fails when the memory cap is not enforced;
utilisation is reported for the reader (and asserted by tests/e2e/vgpu_testbed/test_demo.py).
Needs root; skipped with a message otherwise.
Steps 1-4 and 6 are in vgpu_testbed.demo.steps; the list is assembled in vgpu_testbed.demo.cli.
"""

from __future__ import annotations

import json
import os

from vgpu_testbed.demo import report
from vgpu_testbed.demo.steps import (
    CDI_KIND,
    SHARED_POD,
    UNCAPPED_POD,
    DemoContext,
    Prepared,
)
from vgpu_testbed.demo.torch_step import show_torch
from vgpu_testbed.demo.workloads import (
    ClaimContainer,
    Container,
    WorkloadError,
    holding,
    nvml_view,
)
from vgpu_testbed.demo.workloads import run_with_samples as sampled_run
from vgpu_testbed.torchapp import find_torch

CAPPED_SECONDS = 6.0  # sampled; the first SETTLE_S are the controller learning the GPU
UNCAPPED_SECONDS = 3.0
SETTLE_S = 2.0


def claim_container(prepared: Prepared) -> Container:
    """The pod's own container on a real node; on the stand-in, one made from the claim's CDI
    spec."""
    from vgpu_testbed.realnode.node import RealNode

    if isinstance(prepared.agents, RealNode):
        from vgpu_testbed.demo.runtime import PodContainer, container_id

        return PodContainer(prepared.agents, container_id(prepared.pod), prepared.agents.gpu_env)
    uid = prepared.claim["metadata"]["uid"]
    spec = json.loads(prepared.agents.paths.cdi_spec(uid).read_text())
    names = report.cdi_device_names(CDI_KIND, prepared.placement.cdi_ids)
    if not names:
        raise RuntimeError(f"prepare returned no {CDI_KIND} device for claim {uid}")
    return ClaimContainer(spec, names, prepared.agents.gpu_env)


def claim_limits(prepared: Prepared) -> dict[str, str]:
    uid = prepared.claim["metadata"]["uid"]
    conf = (prepared.agents.paths.claim_dir(uid) / "vgpu.conf").read_text()
    devices = report.conf_devices(conf)
    if len(devices) != 1:
        raise RuntimeError(f"expected one device in claim {uid}'s vgpu.conf, found {devices}")
    return devices[0]


def step_workloads(ctx: DemoContext) -> None:
    if os.geteuid() != 0:  # real nodes need root too: without it the demo runs on the stand-in
        ctx.say("SKIPPED: running a program as a container would needs root (a private mount")
        ctx.say("namespace to bind the claim dir, the hook and /etc/ld.so.preload); run the demo")
        ctx.say("as root (e.g. `sudo make demo`) to see the caps enforced.")
        ctx.results["workloads"] = "skipped"
        return
    shared = ctx.need_prepared(SHARED_POD)
    container = claim_container(shared)
    limits = claim_limits(shared)
    if ctx.runtime == "real":
        ctx.say(
            f"pod {SHARED_POD}'s container {getattr(container, 'container_id', '?')[:12]} on "
            f"{shared.agents.node_name}: started by containerd and runc; programs run in it "
            "with `ctr tasks exec`"
        )
    show_nvml(ctx, shared, container, limits)
    show_memory_cap(ctx, container, int(limits["memory"]))
    show_compute_cap(ctx, shared, container, int(limits["cores"]), limits["uuid"])
    show_torch(ctx, container, find_torch(), int(limits["memory"]))


def show_nvml(
    ctx: DemoContext, shared: Prepared, container: Container, limits: dict[str, str]
) -> None:
    host = nvml_view(None, shared.agents.gpu_env)
    inside = container.nvml()
    host_gpu = next(g for g in host["gpus"] if g["uuid"] == limits["uuid"])
    ctx.say(
        f"(a) NVML on the host ({shared.agents.node_name}): {host['count']} GPUs; "
        f"{limits['uuid'][:12]}… total {report.human_bytes(host_gpu['memory_total'])}"
    )
    for gpu in inside["gpus"]:
        ctx.say(
            f"    NVML in the container: {inside['count']} GPU: #{gpu['index']} {gpu['name']} "
            f"{gpu['uuid'][:12]}… total {report.human_bytes(gpu['memory_total'])} "
            f"(claim cap {report.human_bytes(int(limits['memory']))})"
        )
    ctx.results["nvml_container"] = inside
    ctx.results["nvml_host_total"] = host_gpu["memory_total"]


def try_hold(container: Container, size: int) -> report.HoldResult:
    """Whether a cuda_hold run in `container` can allocate `size` bytes (it exits at once)."""
    done = container.run([container.program("cuda_hold"), "0", str(size)])
    return report.parse_hold(done.stdout, done.returncode)


def show_memory_cap(ctx: DemoContext, container: Container, cap: int) -> None:
    hold = container.program("cuda_hold")
    within, beyond, second = cap * 3 // 4, cap * 2, cap // 2
    first = try_hold(container, within)
    over_result = try_hold(container, beyond)
    ctx.say(f"(b) cuMemAlloc {report.human_bytes(within)} (within the cap): {first.outcome}")
    ctx.say(f"    cuMemAlloc {report.human_bytes(beyond)} (beyond the cap): {over_result.outcome}")
    # The cap is the claim's, over all its processes: hold 3/4 in one, ask 1/2 in another.
    with holding(container, [hold, "0", str(within)]) as holder:
        assert holder.stdout is not None
        ready = holder.stdout.readline()
        if not ready.startswith("ready"):
            raise WorkloadError(f"cuda_hold did not allocate {within} bytes: {ready.strip()}")
        shared_result = try_hold(container, second)
    after_result = try_hold(container, second)
    ctx.say(
        f"    another process asks {report.human_bytes(second)} while "
        f"{report.human_bytes(within)} is held: "
        f"{shared_result.outcome}; after release: "
        f"{after_result.outcome}"
    )
    ctx.results["memory"] = {
        "cap": cap,
        "within_ok": first.ok,
        "beyond_error": over_result.error,
        "shared_error": shared_result.error,
        "after_release_ok": after_result.ok,
    }
    if not first.ok or over_result.ok or shared_result.ok or not after_result.ok:
        raise WorkloadError(f"the memory cap was not enforced as expected: {ctx.results['memory']}")


def show_compute_cap(
    ctx: DemoContext, shared: Prepared, container: Container, cores: int, uuid: str
) -> None:
    spin = container.program("cuda_spin")
    samples, out = sampled_run(
        container,
        [spin, "0", str(CAPPED_SECONDS + 1.5)],
        uuid=uuid,
        seconds=CAPPED_SECONDS,
    )
    capped = report.util_stats(samples, settle_s=SETTLE_S)
    ctx.say(
        f"(c) cuda_spin (kernels back to back) capped at cores={cores}: NVML utilisation "
        f"mean {capped.mean:.1f}% (min {capped.low:.0f}, max {capped.high:.0f}; "
        f"{capped.samples} samples after {SETTLE_S:.0f}s settling)"
    )
    capped_rate = report.spin_rate(out)
    ctx.results["capped"] = {"cores": cores, "mean": round(capped.mean, 2), "rate": capped_rate}
    whole = ctx.prepared.get(UNCAPPED_POD)
    if whole is None:
        return
    whole_limits = claim_limits(whole)
    whole_container = claim_container(whole)
    samples, out = sampled_run(
        whole_container,
        [whole_container.program("cuda_spin"), "0", str(UNCAPPED_SECONDS + 1.5)],
        uuid=whole_limits["uuid"],
        seconds=UNCAPPED_SECONDS,
    )
    free = report.util_stats(samples, settle_s=0.5)
    free_rate = report.spin_rate(out)
    ctx.say(
        f"    the same program in pod {UNCAPPED_POD} (whole GPU, no cores requested): "
        f"mean {free.mean:.1f}%"
    )
    if capped_rate and free_rate:
        ctx.say(
            f"    kernel launches per second: {capped_rate:.0f} capped vs {free_rate:.0f} "
            f"uncapped = {100 * capped_rate / free_rate:.1f}% (whole run, settling included)"
        )
    ctx.results["uncapped"] = {"mean": round(free.mean, 2), "rate": free_rate}
