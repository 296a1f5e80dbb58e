"""Fixtures for the hook's integration tests: a simulated GPU node and claims prepared per the
prepare -> container contract (claim dir + vgpu.conf + CDI spec built by dra_driver.cdi).

Programs run through vgpu_testbed.container, i.e. in a private mount namespace with the CDI
edits applied, so the hook arrives via /etc/ld.so.preload exactly as in a real container.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi import ClaimDevice, SpecSettings, build_claim_spec
from kubelet_plugin.claimfiles import ensure_region
from vgpu_testbed.container import container_command, run_with_claims

REPO = Path(__file__).resolve().parents[3]
HOOK_DIR = REPO / "vgpu_hook"
HOOK_LIB = HOOK_DIR / "build" / "libvgpu.so"
PROBE = HOOK_DIR / "build" / "cuda_probe"
FAKE_LIB_DIR = REPO / "hack" / "fakegpu" / "build" / "lib"
KIND = "k8s.vgpu.dra.dev/claim"
GIB = 1 << 30

UUIDS = [f"GPU-7e57{i:04d}-aaaa-bbbb-cccc-0000000000{i:02d}" for i in range(2)]


def _profile_text() -> str:
    lines = [
        "node.name=hooktest",
        "node.driver_version=580.95.05",
        "node.cuda_driver_version=13000",
        f"gpu.count={len(UUIDS)}",
    ]
    for i, uuid in enumerate(UUIDS):
        lines += [
            f"gpu.{i}.name=NVIDIA A100-SXM4-40GB",
            f"gpu.{i}.uuid={uuid}",
            f"gpu.{i}.serial=SN{i}",
            f"gpu.{i}.pci_bus_id=00000000:{i + 1:02x}:00.0",
            f"gpu.{i}.pcie_root=pci0000:00",
            f"gpu.{i}.brand=tesla",
            f"gpu.{i}.architecture=ampere",
            f"gpu.{i}.compute_capability=8.0",
            f"gpu.{i}.memory_bytes={40 * GIB}",
            f"gpu.{i}.sm_count=108",
            f"gpu.{i}.cores_per_sm=64",
            f"gpu.{i}.pci_device_id=0x20b010de",
            f"gpu.{i}.minor={i}",
            f"gpu.{i}.numa_node=0",
        ]
    return "\n".join(lines) + "\n"


def fake_has_nvml() -> bool:
    return (FAKE_LIB_DIR / "libnvidia-ml.so.1").is_file()


@pytest.fixture(scope="session")
def built() -> None:
    subprocess.run(["make", "-s", "-C", str(HOOK_DIR)], check=True)
    if (
        not (FAKE_LIB_DIR / "libcuda.so.1").is_file()
        or os.path.getsize(FAKE_LIB_DIR / "libcuda.so.1") == 0
    ):
        subprocess.run(["make", "-s", "-C", str(REPO / "hack" / "fakegpu")], check=True)
    if os.geteuid() != 0:
        pytest.skip("container emulation needs root (mount namespaces, bind mounts)")


@dataclass
class Node:
    """A simulated node: its env (fake libs + state file) and the plugin's state dir."""

    root: Path
    env: dict[str, str]

    @property
    def state_dir(self) -> Path:
        return self.root / "vgpu-dra"

    def claim(
        self,
        uid: str,
        lines: Sequence[str] | None,
        gpus: Sequence[int] = (0,),
        hook: Path = HOOK_LIB,
    ) -> Claim:
        """Prepare a claim like the kubelet plugin does; lines=None leaves vgpu.conf out.

        `hook` is the library the spec mounts as the container's libvgpu.so (e.g. the ASan build).
        """
        claim_dir = self.state_dir / "claims" / uid
        claim_dir.mkdir(parents=True, mode=0o750)
        ensure_region(str(claim_dir / "region"), os.getgid())  # as prepare does
        if lines is not None:
            text = "version 1\nclaim " + uid + "\n" + "".join(line + "\n" for line in lines)
            conf = claim_dir / "vgpu.conf"
            conf.write_text(text)
            conf.chmod(0o640)
        preload = self.state_dir / "hook" / "ld.so.preload"
        preload.parent.mkdir(parents=True, exist_ok=True)
        preload.write_text("/usr/local/vgpu-dra/lib/libvgpu.so\n")
        settings = SpecSettings(kind=KIND, state_dir=str(self.state_dir), hook_path=str(hook))
        devices = [ClaimDevice(name=f"{uid}-gpu-{g}", minor=g) for g in gpus]
        spec = build_claim_spec(
            settings=settings,
            claim_uid=uid,
            devices=devices,
        )
        return Claim(self, uid, claim_dir, spec, [d.name for d in devices])


@dataclass
class Claim:
    node: Node
    uid: str
    dir: Path
    spec: dict[str, Any]
    device_names: list[str]

    def run(
        self, argv: Sequence[str], timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        full_env = dict(self.node.env)
        full_env.update(env)
        return run_with_claims(
            [(self.spec, self.device_names)], list(argv), base_env=full_env, timeout=timeout
        )

    def start(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        """`argv` in this claim's container, running on; the caller stops and reaps it."""
        return subprocess.Popen(
            container_command(self.spec, self.device_names, list(argv)),
            env=self.node.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def probe(self, *steps: str, procaddr: bool = False, **env: str) -> list[str]:
        argv = [str(PROBE)] + (["-p"] if procaddr else []) + list(steps)
        done = self.run(argv, **env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.splitlines()


@pytest.fixture
def node(built: None, tmp_path: Path) -> Iterator[Node]:
    profile = tmp_path / "profile.txt"
    profile.write_text(_profile_text())
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "VGPU_SIM_STATE": str(tmp_path / "node.state"),
        "VGPU_SIM_PROFILE": str(profile),
        "LD_LIBRARY_PATH": str(FAKE_LIB_DIR),
        "VGPU_LOG_LEVEL": "warn",
        "PYTHONPATH": str(REPO),
    }
    yield Node(tmp_path, env)


def field(line: str, key: str) -> int:
    """The integer value of `key=` in one probe output line."""
    for token in line.split():
        if token.startswith(key + "="):
            return int(token.split("=", 1)[1])
    raise AssertionError(f"no {key}= in {line!r}")
