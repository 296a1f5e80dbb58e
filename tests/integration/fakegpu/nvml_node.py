"""Helpers for the fake-NVML integration tests: a simulated node made by
`vgpu_testbed.fakegpu.simulator.prepare_node` and Python snippets run against it in child processes
(the fake libraries attach to one node per process, exactly as real clients load them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vgpu_testbed.fakegpu import simulator as fakegpu

REPO = Path(__file__).resolve().parents[3]
FAKEGPU = REPO / "hack" / "fakegpu"
PROGRAMS = FAKEGPU / "build" / "cuda_programs"


def build_fakegpu() -> None:
    subprocess.run(["make", "-s", "-C", str(FAKEGPU), "all"], check=True)


@dataclass
class SimNode:
    profile: fakegpu.Profile
    state: Path
    env: dict[str, str]

    @classmethod
    def create(cls, profile_name: str, tmp_path: Path) -> SimNode:
        profile = fakegpu.load_profile(profile_name)
        state = tmp_path / f"{profile_name}.state"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO),
            "HOME": str(tmp_path),
            **fakegpu.prepare_node(profile, state),
        }
        return cls(profile, state, env)

    @contextmanager
    def holding(self, gpu: int, nbytes: int) -> Iterator[subprocess.Popen[str]]:
        """A process of this node (the fake CUDA driver's `cuda_hold`) that holds `nbytes` on
        GPU `gpu` until the block ends; it is killed and reaped afterwards."""
        hold = PROGRAMS / "cuda_hold"
        if not hold.is_file():
            pytest.skip("the fake CUDA driver's test programs are not built")
        proc = subprocess.Popen(
            [str(hold), str(gpu), str(nbytes)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
            yield proc
        finally:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def python(self, code: str, timeout: float = 60, **extra: str) -> Any:
        """Run `code` (which prints one JSON document) in a child process; returns it parsed."""
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)
