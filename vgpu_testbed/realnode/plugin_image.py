"""The vgpu-dra image for real bed nodes: the image file tree plus an interpreter, as OCI archive.

Why: the chart's DaemonSet must run on a bed node from the same files the Dockerfile puts into
the product image, and the bed has neither a registry nor an image engine. The file tree
(`make image-tree`, deploy/image/build-tree.sh: the wheel, its dependencies, libvgpu.so and its
contract note, the launcher, installer and probe) is what the Dockerfile copies over its
`python:3.11-slim` base. That base is replaced here by what the tree actually needs: the tree
runs on `python3 -S -s`, so the interpreter the tree was built for (its compiled extensions
match it), its standard library (without tests, IDLE, Tk and bundled installers), every shared
library the interpreter, the standard library's and the tree's extension modules load (as ldd
resolves them on this host), and busybox for the shell scripts (launcher, hook installer).

`build_plugin_image(tree, out_dir)` writes `<out_dir>/<name>.tar`; `images.import_images` loads it
into a node's containerd. Pods run it with `imagePullPolicy: Never`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from vgpu_testbed.realnode.images import (
    BuiltImage,
    _busybox_tree,
    _library_tree,
    archive_name,
    shared_libraries,
)
from vgpu_testbed.realnode.oci import ImageSpec, write_archive

PLUGIN_IMAGE = "vgpu-dra.local/vgpu-dra:bed"
# Not needed to run anything in the tree; together most of the standard library's size.
_SKIPPED_STDLIB = frozenset(
    {
        "site-packages",
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "__pycache__",
        "pydoc_data",
    }
)


class PluginImageError(RuntimeError):
    """The image cannot be built here; the message says what is missing."""


def _walk(root: Path, skip: frozenset[str] = frozenset()) -> Iterator[tuple[Path, bool]]:
    """(path, is_symlink) of every file and symlink under `root`, skipping directory names."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in skip and not d.startswith("config-")]
        base = Path(directory)
        for name in files:
            path = base / name
            yield path, path.is_symlink()
        for name in subdirs:
            path = base / name
            if path.is_symlink():
                yield path, True


def plugin_image_spec(tree: Path, prefix: Path | None = None) -> ImageSpec:
    """The image: `tree` at /, the interpreter of `prefix` (default: ours) under /usr/local."""
    if not (tree / ".built").is_file():
        raise PluginImageError(f"no image tree at {tree}: run `make image-tree` first")
    prefix = prefix or Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = (prefix / "bin" / version).resolve()
    stdlib = prefix / "lib" / version
    if not interpreter.is_file() or not (stdlib / "os.py").is_file():
        raise PluginImageError(f"no {version} interpreter and standard library under {prefix}")

    files: dict[str, Path] = {}
    symlinks: dict[str, str] = {}
    for path, is_link in _walk(tree):
        rel = str(path.relative_to(tree))
        if rel == ".built":
            continue
        if is_link:
            symlinks[rel] = os.readlink(path)
        else:
            files[rel] = path
    # Found relative to the executable: /usr/local/bin/pythonX.Y -> /usr/local/lib/pythonX.Y.
    files[f"usr/local/bin/{version}"] = interpreter
    symlinks["usr/local/bin/python3"] = version
    for path, is_link in _walk(stdlib, _SKIPPED_STDLIB):
        rel = f"usr/local/lib/{version}/{path.relative_to(stdlib)}"
        if is_link:
            symlinks[rel] = os.readlink(path)
        elif not path.name.endswith(".pyc") and not path.name.startswith("_tkinter"):
            files[rel] = path

    busybox_files, busybox_links = _busybox_tree()
    extensions = [interpreter] + [src for src in files.values() if ".so" in src.name]
    libraries = {
        lib
        for lib in shared_libraries(extensions)
        # The tree's own bundled libraries (numpy.libs...) are in the image already.
        if not lib.resolve().is_relative_to(tree.resolve())
    }
    lib_files, lib_links = _library_tree(libraries)
    # The interpreter's libpython lives under the prefix: put it where the loader always looks.
    for rel, src in list(lib_files.items()):
        if src.is_relative_to(prefix.resolve()):
            del lib_files[rel]
            lib_files[f"usr/lib/{src.name}"] = src
    for rel in [r for r, target in lib_links.items() if str(prefix) in target or str(prefix) in r]:
        del lib_links[rel]
    for lib in libraries:
        if lib.resolve().is_relative_to(prefix.resolve()) and lib.name != lib.resolve().name:
            lib_links[f"usr/lib/{lib.name}"] = lib.resolve().name
    return ImageSpec(
        PLUGIN_IMAGE,
        files={**busybox_files, **lib_files, **files},
        symlinks={**busybox_links, **lib_links, **symlinks},
        directories=("tmp", "etc", "proc", "sys", "dev", "run", "var/run"),
        cmd=("vgpu-dra", "--help"),
        env=(
            "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "PYTHONDONTWRITEBYTECODE=1",
        ),
    )


def build_plugin_image(tree: Path, out_dir: Path) -> BuiltImage:
    spec = plugin_image_spec(tree)
    archive = out_dir / archive_name(spec.name)
    return BuiltImage(spec.name, archive, write_archive(spec, archive))
