"""One container that uses two claims of this driver, on two GPUs: both GPUs visible, each capped.

The two claims' CDI specs come from the plugin's real `dra_driver.cdi.build_claim_spec` (through the
`node.claim` fixture) and are applied to ONE container by `vgpu_testbed.container`, in order, as a
runtime applies two CDI devices. Before the contract change each spec set NVIDIA_VISIBLE_DEVICES to
its own GPU and the runtime kept the last value, so the container saw only the second claim's GPU.
Now every claim's device node is injected and every claim sets the same value ("void"), and the
simulated driver, like the real one with CDI, shows the GPUs whose device nodes the container has.

Proves:
1. NVML and CUDA inside the container both enumerate the two GPUs (UUIDs of both claims);
2. each GPU carries its own claim's memory cap: CUDA total and free per device, NVML memory per
   device, and an allocation past each cap is refused with CUDA_ERROR_OUT_OF_MEMORY while the
   same size fits under the other GPU's larger cap;
3. the order in which the runtime applies the two specs does not matter;
4. the merged edits hold both GPUs' device nodes and both claim directories (control nodes once).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.vgpu_hook.conftest import PROBE, UUIDS, Claim, Node, field
from vgpu_testbed.container import DeviceNodeEdit, edits_from_specs, run_with_claims

MIB = 1 << 20
CAP_A = 512 * MIB  # claim A: GPU 0
CAP_B = 1024 * MIB  # claim B: GPU 1
CUDA_ERROR_OUT_OF_MEMORY = 2

NVML_VIEW = """
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    uuid = n.nvmlDeviceGetUUID(h)
    uuid = uuid if isinstance(uuid, str) else uuid.decode()
    out.append([uuid, n.nvmlDeviceGetMemoryInfo(h).total])
print(json.dumps(out))
"""


def _line(gpu: int, cap: int) -> str:
    return f"device uuid={UUIDS[gpu]} memory={cap} cores=0 policy=none oversubscribe=0"


def _claims(node: Node) -> tuple[Claim, Claim]:
    a = node.claim("c-multi-a", [_line(0, CAP_A)], gpus=(0,))
    b = node.claim("c-multi-b", [_line(1, CAP_B)], gpus=(1,))
    return a, b


def _run(node: Node, claims: tuple[Claim, ...], argv: list[str]) -> str:
    done = run_with_claims(
        [(c.spec, c.device_names) for c in claims], argv, base_env=node.env, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _probe(node: Node, claims: tuple[Claim, ...], ordinal: int, *steps: str) -> list[str]:
    return _run(node, claims, [str(PROBE), "-d", str(ordinal), *steps]).splitlines()


def test_specs_agree_on_visibility_and_drop_the_claims_variable(node: Node) -> None:
    for claim in _claims(node):
        env = claim.spec["containerEdits"]["env"]
        assert "NVIDIA_VISIBLE_DEVICES=void" in env
        assert not [e for e in env if e.startswith("VGPU_DRA_CLAIMS=")]


def test_two_claims_edits_merge(node: Node) -> None:
    a, b = _claims(node)
    edits = edits_from_specs([(a.spec, a.device_names), (b.spec, b.device_names)])
    assert edits.device_nodes == (
        DeviceNodeEdit("/dev/nvidiactl", 195, 255),  # both specs carry it: injected once
        DeviceNodeEdit("/dev/nvidia0", 195, 0),
        DeviceNodeEdit("/dev/nvidia1", 195, 1),
    )
    targets = [m.container_path for m in edits.mounts]
    assert "/run/vgpu-dra/claims/c-multi-a" in targets
    assert "/run/vgpu-dra/claims/c-multi-b" in targets


@pytest.mark.parametrize("order", ["a-then-b", "b-then-a"])
def test_two_claims_two_gpus_both_visible_each_capped(node: Node, order: str) -> None:
    a, b = _claims(node)
    claims = (a, b) if order == "a-then-b" else (b, a)

    nvml = json.loads(_run(node, claims, [sys.executable, "-c", NVML_VIEW]))
    assert nvml == [[UUIDS[0], CAP_A], [UUIDS[1], CAP_B]]

    for ordinal, (uuid, cap) in enumerate([(UUIDS[0], CAP_A), (UUIDS[1], CAP_B)]):
        out = _probe(
            node,
            claims,
            ordinal,
            "init",
            "uuid",
            "total",
            "info",
            f"alloc:{cap - 64 * MIB}",
            "alloc:134217728",  # 128 MiB more: past this GPU's cap
            "info",
        )
        assert out[1].split()[-1].lower() == uuid.lower(), out
        assert field(out[2], "bytes") == cap, out
        assert (field(out[3], "free"), field(out[3], "total")) == (cap, cap), out
        assert field(out[4], "rc") == 0, out
        assert field(out[5], "rc") == CUDA_ERROR_OUT_OF_MEMORY, out
        assert field(out[6], "free") == 64 * MIB, out

    # 768 MiB: past claim A's cap on GPU 0, within claim B's on GPU 1 - the caps are per GPU.
    over_a = f"alloc:{768 * MIB}"
    assert field(_probe(node, claims, 0, "init", over_a)[1], "rc") == CUDA_ERROR_OUT_OF_MEMORY
    assert field(_probe(node, claims, 1, "init", over_a)[1], "rc") == 0
