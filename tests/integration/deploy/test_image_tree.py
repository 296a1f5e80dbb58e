"""The image's file tree built without a container engine (deploy/image/build-tree.sh, the script
the Dockerfile's build stage runs too): it runs the product, holds the hook library with its
contract note, and its helper programs (hook installer, socket probe) do what the DaemonSet needs.

The tree is built once for this module into a temporary directory (about a minute: the wheel's
dependencies are installed with pip). Programs run on the base interpreter with `-S -s` (the
launcher's own flags), so anything missing from the tree fails here instead of being found in
the developer's virtualenv.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from kubelet_plugin.region import REGION_VERSION
from kubelet_plugin.server import MAX_SOCKET_PATH, SocketPaths, short_instance
from tests.fixtures.image_tree import BASE_PYTHON, REPO, built_tree, tree_env

PRODUCT_PACKAGES = ("dra_driver", "kubelet_plugin", "controller")


@pytest.fixture(scope="module")
def tree() -> Path:
    return built_tree()


def run_tree(
    root: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        env={**tree_env(root), "HOME": str(root), **(env or {})},
        cwd=root,
        timeout=120,
        check=False,
    )


def note_fields(note: Path) -> dict[str, str]:
    fields = {}
    for line in note.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            fields[key] = value
    return fields


@pytest.mark.parametrize("command", ["kubelet-plugin", "controller"])
def test_the_tree_runs_each_component(tree: Path, command: str) -> None:
    run = run_tree(tree, "vgpu-dra", command, "--help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"usage: vgpu-dra {command}")


def test_every_product_module_imports_from_the_tree_alone(tree: Path) -> None:
    site = tree / "opt" / "vgpu-dra" / "site-packages"
    script = (
        "import importlib, pkgutil, sys\n"
        f"for top in {PRODUCT_PACKAGES!r}:\n"
        "    package = importlib.import_module(top)\n"
        "    assert package.__file__.startswith(sys.argv[1]), package.__file__\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "from dra_driver.allocator import _scan\n"
        "print(_scan.__file__)\n"
    )
    run = subprocess.run(
        [BASE_PYTHON, "-S", "-s", "-c", script, str(site)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site)},
        cwd=tree,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    # The Cython extension is compiled into the wheel, not the pure-Python twin.
    assert run.stdout.strip().endswith(".so")
    assert not (site / "vgpu_testbed").exists()
    assert not (site / "kubernetes" / "aio").exists()


def test_the_hook_library_and_its_contract_note(tree: Path) -> None:
    lib = tree / "opt" / "vgpu-dra" / "lib" / "libvgpu.so"
    note = note_fields(lib.with_name("libvgpu.so.contract"))
    data = lib.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert note["size"] == str(len(data))
    assert note["sha256"] == hashlib.sha256(data).hexdigest()
    assert note["region-version"] == str(REGION_VERSION)
    assert note["vgpu-conf-version"] == "1"
    assert note["container-path"] == "/usr/local/vgpu-dra/lib/libvgpu.so"


def installed(dest: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in dest.iterdir()}


def test_install_hook_installs_verifies_and_is_idempotent(tree: Path, tmp_path: Path) -> None:
    dest = tmp_path / "host" / "lib"
    first = run_tree(tree, "vgpu-dra-install-hook", str(dest))
    assert first.returncode == 0, first.stderr
    assert "installed" in first.stdout
    src = tree / "opt" / "vgpu-dra" / "lib"
    files = installed(dest)
    # Exactly the library and its note, no temporary file left, readable but not writable by
    # others (it is mounted into tenants' containers).
    assert files == {
        "libvgpu.so": ((src / "libvgpu.so").read_bytes(), 0o644),
        "libvgpu.so.contract": ((src / "libvgpu.so.contract").read_bytes(), 0o644),
    }
    inode = (dest / "libvgpu.so").stat().st_ino
    again = run_tree(tree, "vgpu-dra-install-hook", str(dest))
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert (dest / "libvgpu.so").stat().st_ino == inode


def test_install_hook_replaces_an_old_library_by_rename(tree: Path, tmp_path: Path) -> None:
    dest = tmp_path / "lib"
    dest.mkdir()
    old = dest / "libvgpu.so"
    old.write_bytes(b"\x7fELF old library")
    # A running container keeps its open file: after the install it still reads the old bytes.
    with old.open("rb") as held:
        run = run_tree(tree, "vgpu-dra-install-hook", str(dest))
        assert run.returncode == 0, run.stderr
        assert held.read() == b"\x7fELF old library"
    src = tree / "opt" / "vgpu-dra" / "lib" / "libvgpu.so"
    assert old.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == ["libvgpu.so", "libvgpu.so.contract"]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[:-1], "bytes, its contract note says"),
        (lambda b: b"MZ" + b[2:], "is not an ELF file"),
        (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "has sha256"),
    ],
)
def test_install_hook_refuses_a_damaged_library(
    tree: Path, tmp_path: Path, damage: object, reason: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    lib_dir = tree / "opt" / "vgpu-dra" / "lib"
    (src / "libvgpu.so").write_bytes(damage((lib_dir / "libvgpu.so").read_bytes()))  # type: ignore[operator]
    (src / "libvgpu.so.contract").write_bytes((lib_dir / "libvgpu.so.contract").read_bytes())
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "libvgpu.so").write_bytes(b"\x7fELF the installed one")
    before = installed(dest)
    run = run_tree(tree, "vgpu-dra-install-hook", str(dest), env={"VGPU_DRA_HOOK_SOURCE": str(src)})
    assert run.returncode == 1
    assert "refusing to install" in run.stderr and reason in run.stderr
    assert installed(dest) == before


def test_probe_socket_needs_a_listener(tree: Path, tmp_path: Path) -> None:
    path = tmp_path / "dra.sock"
    missing = run_tree(tree, "vgpu-dra-probe-socket", str(path))
    assert missing.returncode == 1
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        # A socket file nobody listens on (what a SIGKILLed plugin leaves) is not alive.
        assert run_tree(tree, "vgpu-dra-probe-socket", str(path)).returncode == 1
        server.listen(1)
        alive = run_tree(tree, "vgpu-dra-probe-socket", str(path))
        assert alive.returncode == 0, alive.stderr


def test_probe_socket_expands_the_instance_id(tree: Path, tmp_path: Path) -> None:
    """The chart's probes name `dra-${VGPU_DRA_INSTANCE_ID}.sock`; Kubernetes does not expand
    probe commands, so the probe does, from the container's environment."""
    path = tmp_path / "dra-0f8e2c51.sock"
    template = str(tmp_path / "dra-${VGPU_DRA_INSTANCE_ID}.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        env = {"VGPU_DRA_INSTANCE_ID": "0f8e2c51"}
        alive = run_tree(tree, "vgpu-dra-probe-socket", template, env=env)
        assert alive.returncode == 0, alive.stderr
        wrong = run_tree(tree, "vgpu-dra-probe-socket", template, env={"VGPU_DRA_INSTANCE_ID": "x"})
        assert wrong.returncode == 1
        unset = run_tree(tree, "vgpu-dra-probe-socket", template)
        assert unset.returncode == 2
        assert "VGPU_DRA_INSTANCE_ID is not set" in unset.stderr


def test_probe_socket_shortens_the_instance_id_as_the_plugin_does(
    tree: Path, tmp_path: Path
) -> None:
    """Where the whole pod UID would make the path too long, plugin and probe agree on the
    short form."""
    uid = "0f8e2c51-3d2b-4c8e-9a51-2f8d1b7e6a90"
    directory = Path(tempfile.mkdtemp(prefix="p" * (MAX_SOCKET_PATH - 50), dir="/tmp"))
    try:
        paths = SocketPaths.for_instance(
            "vgpu.dra.dev", plugin_dir=str(directory), registrar_dir=str(directory), instance=uid
        )
        assert short_instance(uid) in paths.dra
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(paths.dra)
            server.listen(1)
            template = str(directory / "dra-${VGPU_DRA_INSTANCE_ID}.sock")
            env = {"VGPU_DRA_INSTANCE_ID": uid}
            alive = run_tree(tree, "vgpu-dra-probe-socket", template, env=env)
            assert alive.returncode == 0, alive.stderr
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_dockerfile_copies_what_build_tree_reads() -> None:
    """The Dockerfile's build stage runs build-tree.sh on the files it copied: every source the
    script packs into the wheel, the hook's sources and the script's own directory must be
    there (and not excluded by .dockerignore), or `make image` and `make image-tree` differ."""
    dockerfile = (REPO / "Dockerfile").read_text()
    build_stage = dockerfile.split("\nFROM ", 2)[1]
    copied = {
        part.rstrip("/")
        for line in build_stage.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for part in line.split()[1:-1]
    }
    script = (REPO / "deploy" / "image" / "build-tree.sh").read_text()
    packed = re.search(r"--exclude=\./hack/fakegpu/build (.*?)\)", script, re.S)
    assert packed is not None
    wheel_sources = set(packed.group(1).replace("\\", " ").split())
    needed = wheel_sources | {"vgpu_hook", "deploy/image"}
    assert needed <= copied, f"the Dockerfile does not copy {sorted(needed - copied)}"
    ignored = {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not needed & ignored, f".dockerignore drops {sorted(needed & ignored)}"
    assert "build-tree.sh /out" in build_stage
    assert "COPY --from=build /out/ /" in dockerfile
