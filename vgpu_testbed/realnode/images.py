"""The images real test-bed nodes run, built from files on this machine (no registry, no engine).

- `PAUSE` (`vgpu-dra.local/pause:bed`): the pod sandbox, a static binary compiled from
  hack/testbed/images/pause.c; containerd is configured to use it as its sandbox image.
- `SHELL` (`vgpu-dra.local/shell:bed`): the host's static busybox with its applet links.
- `WORKLOAD` (`vgpu-dra.local/workload:bed`): the shell plus glibc (the dynamic loader and the
  libraries the programs below and the simulated driver libraries need), `nvml-query`
  (hack/testbed/images/nvml_query.c: NVML as a monitoring tool sees it) and `cuda-probe`
  (vgpu_hook's CUDA test client), and `cuda-hold` and `cuda-spin` (the simulated driver's CUDA
  test programs, which `vgpu-dra demo` runs in its pods). The driver libraries themselves are
  NOT in the image: the node's NVIDIA-toolkit-like CDI spec injects them, as on a real GPU node.
  When the torch environment is installed (`make torch`), also the system libraries its
  interpreter and torch load (libstdc++, libz, libffi, ...; vgpu_testbed.torchapp): torch and
  Python themselves are mounted from the host by the pods that run them.

`build_images(out_dir)` writes the archives (`<name>.tar`) and returns them; `import_images`
loads them into one node's containerd (`ctr -n k8s.io images import`) and gives them the
`ALIASES` names too. Pods must use `imagePullPolicy: Never`, or name an image by a tag the node
already has (`IfNotPresent`, the default for a tag): nothing is ever pulled.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vgpu_testbed.realnode.oci import ImageSpec, write_archive

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = REPO_ROOT / "hack" / "testbed" / "images"
CUDA_PROBE = REPO_ROOT / "vgpu_hook" / "build" / "cuda_probe"
# The simulated driver's CUDA test programs the demo runs in its pods (`make native` builds them).
CUDA_PROGRAMS = REPO_ROOT / "hack" / "fakegpu" / "build" / "cuda_programs"
DEMO_PROGRAMS = ("cuda_hold", "cuda_spin")
BUSYBOX_CANDIDATES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
CC_FLAGS = ("-Wall", "-Wextra", "-Werror", "-O2", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong")

PAUSE = "vgpu-dra.local/pause:bed"
SHELL = "vgpu-dra.local/shell:bed"
WORKLOAD = "vgpu-dra.local/workload:bed"

# Other names the bed's images carry on every node, as on an air-gapped node whose images were
# loaded in advance: the e2e tests and deploy/examples name the upstream pause image (pods that
# only need to exist), and a tagged image is not pulled when the node has it.
ALIASES = {"registry.k8s.io/pause:3.10": PAUSE}


class ImageBuildError(RuntimeError):
    """An image could not be built; the message says what is missing and how to get it."""


@dataclass(frozen=True, slots=True)
class BuiltImage:
    name: str
    archive: Path
    digest: str


def _busybox() -> Path:
    for candidate in BUSYBOX_CANDIDATES:
        if candidate.is_file():
            return candidate
    raise ImageBuildError("no static busybox: install the busybox-static package")


def _compile(source: Path, out: Path, *extra: str) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ImageBuildError("gcc is needed to build the bed's images: install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [gcc, *CC_FLAGS, "-o", str(out), str(source), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageBuildError(f"compiling {source} failed:\n{result.stderr[-2000:]}")
    return out


def _busybox_tree() -> tuple[dict[str, Path], dict[str, str]]:
    busybox = _busybox()
    applets = subprocess.run(
        [str(busybox), "--list-full"], capture_output=True, text=True, check=True
    ).stdout.split()
    files = {"usr/bin/busybox": busybox}
    links = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
    for applet in applets:
        # --list-full names /bin/ls, /usr/bin/env, /sbin/ip...: all into /usr (merged layout).
        path = applet.strip("/")
        path = path if path.startswith("usr/") else f"usr/{path}"
        if path != "usr/bin/busybox":
            links[path] = "/usr/bin/busybox"
    return files, links


_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def shared_libraries(binaries: Iterable[Path]) -> set[Path]:
    """Every shared library (and the loader) the binaries load, as ldd resolves them here."""
    found: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
        for line in out.stdout.splitlines():
            match = _LDD_PATH.search(line)
            if match:
                found.add(Path(match.group(1)))
    return found


def _merged_usr(path: Path) -> str:
    text = str(path).lstrip("/")
    for top in ("lib/", "lib64/", "bin/", "sbin/"):
        if text.startswith(top):
            return "usr/" + text
    return text


def _library_tree(libraries: Iterable[Path]) -> tuple[dict[str, Path], dict[str, str]]:
    files: dict[str, Path] = {}
    links: dict[str, str] = {}
    for library in libraries:
        real = library.resolve()
        files[_merged_usr(real)] = real
        wanted = _merged_usr(library)
        if wanted != _merged_usr(real):
            links[wanted] = "/" + _merged_usr(real)
    return files, links


def image_specs(
    build_dir: Path, driver_libraries: Sequence[Path], app_libraries: Iterable[Path] = ()
) -> list[ImageSpec]:
    """The three images; compiles the C programs into `build_dir`. `app_libraries`: more
    system libraries for the workload image (those of an application mounted from the host,
    `vgpu_testbed.torchapp.TorchApp.system_libraries`)."""
    pause = _compile(SOURCES / "pause.c", build_dir / "pause", "-static")
    nvml_query = _compile(SOURCES / "nvml_query.c", build_dir / "nvml-query", "-ldl")
    bb_files, bb_links = _busybox_tree()
    programs = {"usr/local/bin/nvml-query": nvml_query}
    if CUDA_PROBE.is_file():
        programs["usr/local/bin/cuda-probe"] = CUDA_PROBE
    for name in DEMO_PROGRAMS:
        if (CUDA_PROGRAMS / name).is_file():
            programs[f"usr/local/bin/{name.replace('_', '-')}"] = CUDA_PROGRAMS / name
    libraries = shared_libraries([*programs.values(), *driver_libraries]) | set(app_libraries)
    lib_files, lib_links = _library_tree(libraries)
    return [
        ImageSpec(PAUSE, files={"pause": pause}, entrypoint=("/pause",)),
        ImageSpec(
            SHELL,
            files=bb_files,
            symlinks=bb_links,
            directories=("tmp", "etc", "proc", "sys", "dev", "run"),
            cmd=("sh",),
        ),
        ImageSpec(
            WORKLOAD,
            files={**bb_files, **lib_files, **programs},
            symlinks={**bb_links, **lib_links},
            directories=("tmp", "etc", "proc", "sys", "dev", "run"),
            cmd=("sh",),
        ),
    ]


def archive_name(image: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", image) + ".tar"


def build_images(
    out_dir: Path, driver_libraries: Sequence[Path], app_libraries: Iterable[Path] = ()
) -> list[BuiltImage]:
    """Write every image's archive under `out_dir`."""
    built = []
    for spec in image_specs(out_dir / "build", driver_libraries, app_libraries):
        archive = out_dir / archive_name(spec.name)
        built.append(BuiltImage(spec.name, archive, write_archive(spec, archive)))
    return built


def import_images(ctr: Path, address: Path, images: Iterable[BuiltImage]) -> None:
    """Load the archives into the containerd at `address` (namespace k8s.io, as the CRI uses)."""
    images = list(images)

    def ctr_run(args: list[str], what: str) -> None:
        result = subprocess.run(
            [str(ctr), "--address", str(address), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ImageBuildError(f"{what} in {address} failed: {result.stderr.strip()[-1000:]}")

    for image in images:
        ctr_run(["images", "import", str(image.archive)], f"importing {image.name}")
    names = {image.name for image in images}
    for alias, source in ALIASES.items():
        if source in names:
            ctr_run(["images", "tag", "--force", source, alias], f"tagging {source} as {alias}")
