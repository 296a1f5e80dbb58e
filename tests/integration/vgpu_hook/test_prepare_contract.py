"""The prepare -> container contract end to end, with the kubelet plugin's own renderers.

Proves that what the plugin writes (vgpu.conf from kubelet_plugin.plan.render_hook_config,
CDI spec from dra_driver.cdi.build_claim_spec with the plan's CDI device names) is what the
hook enforces: per-GPU memory caps and compute caps of a two-GPU claim, including two shares
of one GPU in one claim adding up.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.cdi import SpecSettings
from kubelet_plugin.claimfiles import ClaimFiles
from kubelet_plugin.plan import ClaimPlan, DevicePlan
from kubelet_plugin.region import Region
from tests.integration.vgpu_hook.conftest import GIB, HOOK_LIB, KIND, PROBE, UUIDS, Node, field
from vgpu_testbed.container import run_with_claims


def _plan() -> ClaimPlan:
    def dev(request: str, index: int, memory: int, cores: int, share: str) -> DevicePlan:
        return DevicePlan(
            request=request,
            pool="hooktest",
            device=f"gpu-{index}",
            share_id=share,
            uuid=UUIDS[index],
            minor=index,
            memory=memory,
            cores=cores,
            policy="fixed",
        )

    return ClaimPlan(
        uid="0b5e7c1a-0000-4000-8000-00000000c1a1",
        namespace="default",
        name="two-gpus",
        devices=(
            dev("a", 0, GIB, 20, "s1"),
            dev("b", 0, GIB // 2, 10, "s2"),  # a second share of GPU 0 in the same claim
            dev("c", 1, 2 * GIB, 50, "s3"),
        ),
    )


def _prepare(node: Node, plan: ClaimPlan) -> tuple[dict[str, object], list[str], Path]:
    """Write the claim's files with the plugin's own writer (claim dir, vgpu.conf, region)."""
    settings = SpecSettings(kind=KIND, state_dir=str(node.state_dir), hook_path=str(HOOK_LIB))
    (node.root / "cdi").mkdir(exist_ok=True)
    files = ClaimFiles(cdi_root=str(node.root / "cdi"), spec=settings)
    files.write(plan)
    names = [plan.cdi_device_name(d) for d in plan.devices]
    return files.spec(plan), names, node.state_dir / "claims" / plan.uid


def test_plugin_written_claim_is_enforced(node: Node) -> None:
    plan = _plan()
    spec, names, claim_dir = _prepare(node, plan)

    def probe(*steps: str) -> list[str]:
        done = run_with_claims([(spec, names)], [str(PROBE), *steps], base_env=node.env)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    gpu0 = probe("init", "total", "alloc:1610612736", "alloc:1")  # 1.5 GiB = both shares
    assert field(gpu0[1], "bytes") == GIB + GIB // 2
    assert [field(x, "rc") for x in gpu0[2:]] == [0, 2]
    gpu1 = probe("-d", "1", "init", "total")
    assert field(gpu1[1], "bytes") == 2 * GIB
    with Region(str(claim_dir / "region")) as region:
        caps = {
            region.layout.devices[i].uuid.decode(): region.layout.devices[i].cores
            for i in range(region.layout.device_count)
        }
    assert caps == {UUIDS[0]: 30, UUIDS[1]: 50}
