"""The demo's workloads: programs run inside a claim's container and NVML read from the host.

On real nodes the container is the pod's own, started by containerd (`Container` is what both
kinds offer; the real one is vgpu_testbed.demo.runtime.PodContainer). On the stand-in, a
`ClaimContainer` is one prepared claim as a container runtime would see it: the CDI spec the
kubelet plugin wrote, the device names prepare returned, and the node's simulated GPU
environment (in a real container the NVIDIA toolkit mounts the driver; here the fake
libraries come through `LD_LIBRARY_PATH`). Programs run through `vgpu_testbed.container`, so
`vgpu_hook` arrives through `/etc/ld.so.preload` exactly as the CDI spec arranges.

Also a small command line used as the programs themselves (`python -m
vgpu_testbed.demo.workloads nvml` inside the container, `... sample UUID SECONDS` on the host),
because pynvml must be loaded by a process that starts with the node's environment.
Called by vgpu_testbed.demo.steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from vgpu_testbed.container import container_command

REPO_ROOT = Path(__file__).resolve().parents[2]
CUDA_PROGRAMS = REPO_ROOT / "hack" / "fakegpu" / "build" / "cuda_programs"
SAMPLE_INTERVAL_S = 0.1


class WorkloadError(RuntimeError):
    """A demo workload did not run as expected; the message carries its output."""


class Container(Protocol):
    """Where step 5 runs its programs: `ClaimContainer` (the stand-in's container, made here) or
    `vgpu_testbed.demo.runtime.PodContainer` (a pod's container on a real node)."""

    @property
    def node_env(self) -> Mapping[str, str]: ...

    def program(self, name: str) -> str: ...

    def run(
        self, argv: Sequence[str], *, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]: ...

    def popen(self, argv: Sequence[str]) -> subprocess.Popen[str]: ...

    def nvml(self) -> dict[str, Any]: ...


class ContainerProcesses:
    """Running a program in a container, for both kinds of container: each gives the command line
    that enters it and the environment of that command; this runs it to its end or starts it."""

    # What the program reads on its stdin when run to its end; None: nothing (end-of-file).
    run_input: ClassVar[str | None] = None

    def command(self, argv: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def run(self, argv: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv),
            env=self.env(),
            stdin=subprocess.DEVNULL if self.run_input is None else None,
            input=self.run_input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        """Started with stdin a pipe: write a line to it to end a program waiting for one."""
        return subprocess.Popen(
            self.command(argv),
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@dataclass(frozen=True)
class ClaimContainer(ContainerProcesses):
    """What a runtime needs to start a container holding one claim."""

    spec: Mapping[str, Any]
    device_names: Sequence[str]
    node_env: Mapping[str, str]
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "VGPU_LOG_LEVEL": "warn",
            **self.node_env,
            **self.extra_env,
        }

    def program(self, name: str) -> str:
        return program(name)

    def nvml(self) -> dict[str, Any]:
        return nvml_view(self, self.node_env)

    def command(self, argv: Sequence[str]) -> list[str]:
        return container_command(self.spec, self.device_names, list(argv))


@contextmanager
def holding(container: Container, argv: Sequence[str]) -> Iterator[subprocess.Popen[str]]:
    """A program (cuda_hold) started in `container` that holds until told: released with a line
    on its stdin when the block ends normally, killed when it ends by an exception."""
    holder = container.popen(argv)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        yield holder
        holder.stdin.write("release\n")  # a line, not EOF: ctr exec never passes EOF on
        holder.stdin.close()
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def program(name: str) -> str:
    path = CUDA_PROGRAMS / name
    if not path.is_file():
        raise WorkloadError(f"{path} is missing: run `make native`")
    return str(path)


def nvml_view(container: ClaimContainer | None, node_env: Mapping[str, str]) -> dict[str, Any]:
    """What NVML reports inside the container (or on the host when `container` is None)."""
    argv = [sys.executable, "-m", "vgpu_testbed.demo.workloads", "nvml"]
    if container is not None:
        done = container.run(argv)
    else:
        env = {k: v for k, v in os.environ.items() if k != "NVIDIA_VISIBLE_DEVICES"}
        done = subprocess.run(
            argv, env={**env, **node_env}, capture_output=True, text=True, timeout=60, check=False
        )
    if done.returncode != 0:
        raise WorkloadError(f"NVML query failed ({done.returncode}): {done.stderr.strip()}")
    view: dict[str, Any] = json.loads(done.stdout)
    return view


def run_with_samples(
    container: Container,
    argv: Sequence[str],
    *,
    uuid: str,
    seconds: float,
) -> tuple[list[tuple[float, float]], str]:
    """Start argv in the container, sample the GPU's NVML utilisation from the host while it
    runs; returns ([(seconds since start, util %)], the program's stdout)."""
    proc = container.popen(argv)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first.startswith("started"):
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise WorkloadError(f"{argv[0]} did not start: {first.strip()} {err.strip()}")
        sampler = subprocess.run(
            [sys.executable, "-m", "vgpu_testbed.demo.workloads", "sample", uuid, str(seconds)],
            env={**os.environ, **container.node_env},
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
        out, err = proc.communicate(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sampler.returncode != 0:
        raise WorkloadError(f"NVML sampler failed: {sampler.stderr.strip()}")
    if proc.returncode != 0:
        raise WorkloadError(f"{argv[0]} failed ({proc.returncode}): {out.strip()} {err.strip()}")
    samples = [(float(t), float(u)) for t, u in json.loads(sampler.stdout)]
    return samples, out.strip()


# ---------------------------------------------------------------- the in-process programs


def _nvml_main() -> int:
    import pynvml

    pynvml.nvmlInit()
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        gpus.append(
            {
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "memory_total": int(memory.total),
                "memory_used": int(memory.used),
            }
        )
    pynvml.nvmlShutdown()
    print(json.dumps({"count": len(gpus), "gpus": gpus}))
    return 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _sample_main(uuid: str, seconds: float) -> int:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    samples = []
    start = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        samples.append((round(now - start, 3), float(util)))
        time.sleep(SAMPLE_INTERVAL_S)
    pynvml.nvmlShutdown()
    print(json.dumps(samples))
    return 0


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["nvml"] and len(argv) == 1:
        return _nvml_main()
    if argv[:1] == ["sample"] and len(argv) == 3:
        return _sample_main(argv[1], float(argv[2]))
    print(
        "usage: python -m vgpu_testbed.demo.workloads nvml | sample UUID SECONDS", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
