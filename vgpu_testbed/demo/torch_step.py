"""Step 5 (d) of `vgpu-dra demo`: PyTorch, unmodified, in the shared pod's container.

torch 2.15 from PyPI (the environment `make torch` installs; `make demo` depends on it) runs in
the same container as parts (a)-(c), under the same claim: it sees one GPU whose memory is the
claim's 1 GiB cap, allocates the whole cap, and one byte more raises
`torch.cuda.OutOfMemoryError` with the cap's figures. On real nodes the container has the torch
environment and its Python mounted read-only from the host, with the simulator's libcudart.so.13
as the application's CUDA runtime (vgpu_testbed.torchapp; step 3 gave the shared pod those
mounts); on the stand-in the program runs with the claim's CDI edits like the other parts, the
runtime on `LD_LIBRARY_PATH`. The part fails when the cap does not hold for torch; it is skipped
with a message when the torch environment is not installed. Called by vgpu_testbed.demo.caps.
"""

from __future__ import annotations

import json

from vgpu_testbed.demo import report
from vgpu_testbed.demo.steps import DemoContext
from vgpu_testbed.demo.workloads import Container, WorkloadError
from vgpu_testbed.torchapp import TorchApp

# Run with `python -c` in the container: one JSON line (torch's warnings go to stderr).
PROGRAM = """
import json, torch
out = {"version": torch.__version__, "available": torch.cuda.is_available()}
out["count"] = torch.cuda.device_count()
out["name"] = torch.cuda.get_device_name(0)
out["total_memory"] = torch.cuda.get_device_properties(0).total_memory
free, total = torch.cuda.mem_get_info(0)
out["mem_get_info"] = [free, total]
whole = torch.empty(total, dtype=torch.uint8, device="cuda")
out["whole_free"] = torch.cuda.mem_get_info(0)[0]
del whole
torch.cuda.empty_cache()
try:
    torch.empty(total + 1, dtype=torch.uint8, device="cuda")
    out["oom"] = None
except torch.cuda.OutOfMemoryError as err:
    out["oom"] = str(err).split("Including non-PyTorch memory")[0].strip()
out["free_after"] = torch.cuda.mem_get_info(0)[0]
print(json.dumps(out))
"""


def show_torch(ctx: DemoContext, container: Container, app: TorchApp | None, cap: int) -> None:
    if app is None:
        ctx.say("(d) PyTorch: SKIPPED, the torch environment is not installed: run `make torch`")
        ctx.say("    (`make demo` does) to see torch under the cap.")
        ctx.results["torch"] = "skipped"
        return
    done = container.run([str(app.python), "-W", "ignore", "-c", PROGRAM], timeout=180)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise WorkloadError(
            f"torch failed in the container ({done.returncode}): {done.stdout}{done.stderr}"
        )
    out = json.loads(lines[-1])
    free, total = out["mem_get_info"]
    ctx.say(
        f"(d) PyTorch {out['version']} (from PyPI, unmodified) in the same container: "
        f"torch.cuda.is_available() = {out['available']}, {out['count']} device: {out['name']}"
    )
    ctx.say(
        f"    get_device_properties(0).total_memory = {out['total_memory']:,} bytes "
        f"({report.human_bytes(out['total_memory'])}); mem_get_info() = "
        f"({report.human_bytes(free)} free, {report.human_bytes(total)} total)"
    )
    ctx.say(
        f"    torch.empty({total:,} bytes) on cuda:0: ok "
        f"({report.human_bytes(out['whole_free'])} free)"
    )
    ctx.say(f"    torch.empty({total + 1:,} bytes): torch.cuda.OutOfMemoryError:")
    ctx.say(f"      {out['oom']}")
    ctx.results["torch"] = out
    if not (
        out["available"]
        and out["total_memory"] == total == free == cap
        and out["whole_free"] == 0
        and out["oom"]
        and out["free_after"] == cap
    ):
        raise WorkloadError(f"torch did not keep to the {cap}-byte cap: {out}")
