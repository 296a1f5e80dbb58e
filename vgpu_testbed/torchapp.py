"""PyTorch as an application in the bed's containers: the torch environment of `make torch`.

On a GPU node a PyTorch application brings, in its image, a Python interpreter, torch and the
CUDA runtime (NVIDIA's `nvidia-cuda-runtime` wheel); the node (the NVIDIA Container Toolkit's CDI
spec) brings only the driver. A bed container gets the same split:

- the driver: the node's toolkit-like CDI spec mounts the simulated `libcuda.so.1` and
  `libnvidia-ml.so.1` (vgpu_testbed.realnode.toolkit_cdi), the claim's CDI spec the hook;
- the application: the torch environment (a venv, hack/torch/install.sh) and the Python
  installation it was made from, mounted read-only from the host at the same paths (hostPath
  volumes), so `<venv>/bin/python` runs unchanged; and, as its CUDA runtime, the simulator's
  `libcudart.so.13` (it replaces NVIDIA's runtime, which the environment leaves out) mounted at
  `/usr/local/cuda/lib64` with `LD_LIBRARY_PATH` naming it, where NVIDIA's CUDA images keep
  theirs. Nothing of torch is modified or copied;
- the system libraries the interpreter and torch load (libstdc++, libz, libffi, ...: the ldd
  closure, minus what the mounts bring) are files of the bed's workload image
  (`system_libraries()`, vgpu_testbed.realnode.images), as glibc already is.

`find_torch()` finds the environment without installing anything (None when `make torch` has not
run); a `TorchApp` gives the pod volumes, mounts and environment. Used by the e2e framework tests
(tests/e2e/frameworks) and the demo's torch step (vgpu_testbed.demo.torch_step).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTALL = REPO_ROOT / "hack" / "torch" / "install.sh"
CUDART_SONAME = "libcudart.so.13"  # torch 2.15's CUDA 13 build links it (DT_NEEDED)
CONTAINER_CUDART_DIR = "/usr/local/cuda/lib64"  # where NVIDIA's CUDA images keep the runtime
# A GUI toolkit's module: its X11 libraries are not worth carrying into the image.
SKIPPED_MODULES = re.compile(r"^_tkinter")

_QUERY = """
import json, os, sys, sysconfig
print(json.dumps({
    "base_prefix": sys.base_prefix,
    "stdlib": os.path.dirname(os.__file__),
    "dynload": sysconfig.get_config_var("DESTSHARED"),
    "purelib": sysconfig.get_paths()["purelib"],
}))
"""


def torch_python() -> Path | None:
    """The torch environment's python if `make torch` installed it, else None."""
    done = subprocess.run(
        ["bash", str(INSTALL), "--check"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return None
    return Path(done.stdout.strip().splitlines()[-1])


def _chain(path: Path) -> list[Path]:
    """`path` and every file its symlinks lead through, to the real file."""
    out = [path]
    while out[-1].is_symlink():
        target = Path(out[-1].readlink())
        out.append(target if target.is_absolute() else out[-1].parent / target)
    return out


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or root in path.parents for root in roots)


@dataclass(frozen=True)
class TorchApp:
    """The torch environment as a container's application: host paths mounted at the same
    paths (`directories` and `files`, read-only) and the simulator's runtime."""

    python: Path  # <venv>/bin/python, the command to run
    venv: Path
    directories: tuple[Path, ...]  # the venv and the Python installation (or its stdlib)
    files: tuple[Path, ...]  # the interpreter, when it lives in a system directory (/usr/bin)
    site_packages: Path
    dynload: Path
    cudart: Path  # the simulator's libcudart.so.13 on the host

    def volumes(self) -> list[dict[str, Any]]:
        """The pod's hostPath volumes (`torch-0`, ... ; `torch-cudart`)."""
        out: list[dict[str, Any]] = [
            {"name": f"torch-{i}", "hostPath": {"path": str(d), "type": "Directory"}}
            for i, d in enumerate(self.directories)
        ]
        out += [
            {"name": f"torch-file-{i}", "hostPath": {"path": str(f), "type": "File"}}
            for i, f in enumerate(self.files)
        ]
        out.append({"name": "torch-cudart", "hostPath": {"path": str(self.cudart), "type": "File"}})
        return out

    def volume_mounts(self) -> list[dict[str, Any]]:
        """The container's mounts of `volumes()`: read-only, at the host's paths."""
        out: list[dict[str, Any]] = [
            {"name": f"torch-{i}", "mountPath": str(d), "readOnly": True}
            for i, d in enumerate(self.directories)
        ]
        out += [
            {"name": f"torch-file-{i}", "mountPath": str(f), "readOnly": True}
            for i, f in enumerate(self.files)
        ]
        out.append(
            {
                "name": "torch-cudart",
                "mountPath": f"{CONTAINER_CUDART_DIR}/{CUDART_SONAME}",
                "readOnly": True,
            }
        )
        return out

    def env(self) -> list[dict[str, str]]:
        """The container's environment: the runtime's directory for the loader; no bytecode
        written into the read-only environment."""
        return [
            {"name": "LD_LIBRARY_PATH", "value": CONTAINER_CUDART_DIR},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ]

    def add_to(self, pod: dict[str, Any], container: dict[str, Any]) -> None:
        """Give `container` (of `pod`) the application: volumes, mounts, environment."""
        pod["spec"].setdefault("volumes", []).extend(self.volumes())
        container.setdefault("volumeMounts", []).extend(self.volume_mounts())
        container.setdefault("env", []).extend(self.env())

    def system_libraries(self) -> set[Path]:
        """The shared libraries the interpreter, its compiled standard modules and torch's
        libraries load that the mounts do not bring (as ldd resolves them on this host)."""
        from vgpu_testbed.realnode.images import shared_libraries

        binaries = [self.python.resolve()]
        binaries += [
            p for p in sorted(self.dynload.glob("*.so")) if not SKIPPED_MODULES.match(p.name)
        ]
        binaries += sorted((self.site_packages / "torch" / "lib").glob("*.so*"))
        mounted = (*self.directories, *self.files)
        return {lib for lib in shared_libraries(binaries) if not _under(lib.resolve(), mounted)}


def torch_app(python: Path) -> TorchApp:
    """The application parts of the torch environment whose python is `python`."""
    from vgpu_testbed.fakegpu.simulator import library_dir

    done = subprocess.run(
        [str(python), "-c", _QUERY], capture_output=True, text=True, timeout=60, check=True
    )
    info = json.loads(done.stdout)
    venv = python.parent.parent
    base = Path(info["base_prefix"])
    stdlib, dynload = Path(info["stdlib"]), Path(info["dynload"])
    if base not in (Path("/"), Path("/usr")):
        # A Python of its own (pyenv, a build under /opt, ...): the whole installation.
        directories: tuple[Path, ...] = (venv, base)
        files: tuple[Path, ...] = ()
    else:
        # The system's Python: /usr cannot be mounted over the image's; its library trees and
        # the interpreter's files (the venv's symlinks lead to /usr/bin/python3.X) instead.
        directories = (venv, stdlib) if _under(dynload, (stdlib,)) else (venv, stdlib, dynload)
        files = tuple(p for p in _chain(python) if not _under(p, (venv,)))
    return TorchApp(
        python=python,
        venv=venv,
        directories=directories,
        files=files,
        site_packages=Path(info["purelib"]),
        dynload=dynload,
        cudart=library_dir() / CUDART_SONAME,
    )


def find_torch() -> TorchApp | None:
    """The torch environment as an application, or None when `make torch` has not run."""
    python = torch_python()
    return None if python is None else torch_app(python)
