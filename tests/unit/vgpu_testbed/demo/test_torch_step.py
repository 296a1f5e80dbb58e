"""Step 5 (d) of the demo, without a node (tests/e2e/vgpu_testbed/test_demo.py runs it for real).

What this proves:
1. Without the torch environment the part is skipped with a message naming `make torch`, and
   nothing runs in the container.
2. torch's report is printed for the reader (the device, the cap as total_memory and
   mem_get_info, the whole cap allocated, the OutOfMemoryError one byte past it), and the part
   passes only when torch saw the cap: a report of the whole GPU, an allocation past the cap that
   succeeded, or a program that failed, fail the step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from vgpu_testbed.demo.steps import DemoContext
from vgpu_testbed.demo.torch_step import show_torch
from vgpu_testbed.demo.workloads import WorkloadError
from vgpu_testbed.torchapp import TorchApp

GIB = 1 << 30
OOM = "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 1024.00 MiB"


class FakeContainer:
    def __init__(self, stdout: str, returncode: int = 0) -> None:
        self.stdout, self.returncode = stdout, returncode
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        self.ran.append(list(argv))
        return subprocess.CompletedProcess(argv, self.returncode, self.stdout, "a warning\n")


def _app() -> TorchApp:
    env = Path("/cache/torch/env")
    return TorchApp(
        python=env / "bin" / "python",
        venv=env,
        directories=(env,),
        files=(),
        site_packages=env / "lib",
        dynload=env / "lib",
        cudart=Path("/x/libcudart.so.13"),
    )


def _report(**changes: Any) -> str:
    out: dict[str, Any] = {
        "version": "2.15.0+cu132",
        "available": True,
        "count": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "total_memory": GIB,
        "mem_get_info": [GIB, GIB],
        "whole_free": 0,
        "oom": OOM,
        "free_after": GIB,
    }
    out.update(changes)
    return "torch warns about numpy\n" + json.dumps(out) + "\n"


def _ctx() -> DemoContext:
    return DemoContext(argparse.Namespace())


def test_skipped_without_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    ctx, container = _ctx(), FakeContainer("")
    show_torch(ctx, container, None, GIB)  # type: ignore[arg-type]
    assert (
        "SKIPPED, the torch environment is not installed: run `make torch`"
        in capsys.readouterr().out
    )
    assert ctx.results["torch"] == "skipped" and container.ran == []


def test_torch_under_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    ctx, container = _ctx(), FakeContainer(_report())
    show_torch(ctx, container, _app(), GIB)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert container.ran[0][:2] == ["/cache/torch/env/bin/python", "-W"]
    assert "total_memory = 1,073,741,824 bytes (1 GiB)" in out
    assert "mem_get_info() = (1 GiB free, 1 GiB total)" in out
    assert "torch.empty(1,073,741,824 bytes) on cuda:0: ok (0 MiB free)" in out
    assert "torch.empty(1,073,741,825 bytes): torch.cuda.OutOfMemoryError:" in out
    assert OOM in out and ctx.results["torch"]["total_memory"] == GIB


@pytest.mark.parametrize(
    ("stdout", "returncode"),
    [
        (_report(total_memory=80 * GIB, mem_get_info=[80 * GIB, 80 * GIB]), 0),  # the whole GPU
        (_report(oom=None), 0),  # one byte past the cap was allowed
        ("Traceback ...\n", 1),  # torch did not run
    ],
)
def test_fails_when_torch_does_not_keep_to_the_cap(stdout: str, returncode: int) -> None:
    with pytest.raises(WorkloadError):
        show_torch(_ctx(), FakeContainer(stdout, returncode), _app(), GIB)  # type: ignore[arg-type]
