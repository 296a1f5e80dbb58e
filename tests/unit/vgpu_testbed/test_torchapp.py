"""vgpu_testbed.torchapp: the torch environment as a container's application.

1. A pod gets one read-only hostPath mount per host tree at the same path, the simulator's
   libcudart.so.13 at /usr/local/cuda/lib64 and LD_LIBRARY_PATH naming that directory, and
   nothing else (the driver and the hook come from CDI, not from here).
2. A venv made from the system's Python (/usr) mounts its standard library and the interpreter's
   files, never /usr itself; one made from a Python of its own mounts that installation.
3. The image's share of the libraries: what ldd lists, minus what the mounts bring.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from vgpu_testbed import torchapp
from vgpu_testbed.torchapp import TorchApp


def _app(directories: tuple[Path, ...], files: tuple[Path, ...] = ()) -> TorchApp:
    venv = Path("/cache/torch/env")
    return TorchApp(
        python=venv / "bin" / "python",
        venv=venv,
        directories=directories,
        files=files,
        site_packages=venv / "lib" / "python3.11" / "site-packages",
        dynload=Path("/opt/py/lib/python3.11/lib-dynload"),
        cudart=Path("/repo/hack/fakegpu/build/lib/libcudart.so.13"),
    )


def test_pod_parts() -> None:
    app = _app((Path("/cache/torch/env"), Path("/opt/py")))
    pod: dict[str, Any] = {"spec": {"volumes": [{"name": "other"}]}}
    container: dict[str, Any] = {"name": "c"}
    app.add_to(pod, container)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(volumes) == {"other", "torch-0", "torch-1", "torch-cudart"}
    assert set(mounts) == {"torch-0", "torch-1", "torch-cudart"}
    for name in ("torch-0", "torch-1"):
        assert volumes[name]["hostPath"]["type"] == "Directory"
        assert mounts[name]["mountPath"] == volumes[name]["hostPath"]["path"]
    assert {volumes["torch-0"]["hostPath"]["path"], volumes["torch-1"]["hostPath"]["path"]} == {
        "/cache/torch/env",
        "/opt/py",
    }
    assert volumes["torch-cudart"]["hostPath"] == {"path": str(app.cudart), "type": "File"}
    assert mounts["torch-cudart"]["mountPath"] == "/usr/local/cuda/lib64/libcudart.so.13"
    assert all(m["readOnly"] for m in mounts.values())
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "PYTHONDONTWRITEBYTECODE": "1"}


def _fake_python(tmp_path: Path, base_prefix: str) -> Path:
    """A venv's bin/ as `python -m venv` makes it: python -> python3 -> the base interpreter."""
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to(f"{base_prefix.rstrip('/')}/bin/python3.11")
    (venv / "bin" / "python").symlink_to("python3")
    return venv / "bin" / "python"


@pytest.mark.parametrize(
    ("base", "expect_dirs", "expect_files"),
    [
        ("/opt/py", ["/opt/py"], []),
        ("/usr", ["/usr/lib/python3.11"], ["/usr/bin/python3.11"]),
    ],
)
def test_what_is_mounted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    base: str,
    expect_dirs: list[str],
    expect_files: list[str],
) -> None:
    stdlib = f"{base}/lib/python3.11"
    python = _fake_python(tmp_path, base)
    info = (
        f'{{"base_prefix": "{base}", "stdlib": "{stdlib}", "dynload": "{stdlib}/lib-dynload",'
        f' "purelib": "{tmp_path}/env/lib/python3.11/site-packages"}}'
    )

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert argv[0] == str(python)
        return subprocess.CompletedProcess(argv, 0, info, "")

    monkeypatch.setattr(torchapp.subprocess, "run", run)
    app = torchapp.torch_app(python)
    assert app.venv == tmp_path / "env"
    assert [str(d) for d in app.directories] == [str(tmp_path / "env"), *expect_dirs]
    assert [str(f) for f in app.files] == expect_files
    assert Path("/usr") not in app.directories


def test_system_libraries_leave_out_the_mounted_trees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app((Path("/cache/torch/env"), Path("/opt/py")))
    seen: list[Path] = []

    def shared_libraries(binaries: list[Path]) -> set[Path]:
        seen.extend(binaries)
        return {Path("/lib/x86_64-linux-gnu/libstdc++.so.6"), Path("/opt/py/lib/libpython3.11.so")}

    from vgpu_testbed.realnode import images

    monkeypatch.setattr(images, "shared_libraries", shared_libraries)
    assert app.system_libraries() == {Path("/lib/x86_64-linux-gnu/libstdc++.so.6")}
    assert seen and seen[0] == app.python.resolve()
