"""Writes an OCI image archive (an OCI image layout in one tar) from a file tree.

Why: real test-bed nodes run pods from images, but the bed has neither a registry nor an image
engine, and must not fetch from outside. An image is just a layer tar, a config and a manifest
addressed by digest; `ctr images import` reads exactly this layout. No library on the machine
writes it (the OCI Go tooling is not importable from Python), and the format needs ~100 lines.

One uncompressed layer per image, deterministic bytes (sorted entries, mtime 0, owner root) so
the same tree gives the same digest. Layout: `oci-layout`, `index.json`, `blobs/sha256/<hex>`;
the index entry carries the image name in `io.containerd.image.name` and
`org.opencontainers.image.ref.name`, so the import needs no flags to name it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
PLATFORM = {"architecture": "amd64", "os": "linux"}


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """What goes into one image: files by path in the image, and the process defaults."""

    name: str  # fully qualified, e.g. "vgpu-dra.local/pause:bed"
    files: Mapping[str, Path]  # image path ("bin/busybox") -> host file, copied with its mode
    symlinks: Mapping[str, str] = field(default_factory=dict)  # image path -> link target
    directories: Sequence[str] = ()  # extra empty directories (mode 0755)
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",)


def _add_dir(tar: tarfile.TarFile, name: str, seen: set[str]) -> None:
    parts = name.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        path = "/".join(parts[:depth])
        if path and path not in seen:
            seen.add(path)
            info = tarfile.TarInfo(path)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)


def layer_tar(spec: ImageSpec) -> bytes:
    """The image's single layer, byte-for-byte reproducible."""
    buffer = io.BytesIO()
    seen: set[str] = set()
    entries: list[tuple[str, str, Any]] = [("f", p, src) for p, src in spec.files.items()]
    entries += [("l", p, target) for p, target in spec.symlinks.items()]
    entries += [("d", p, None) for p in spec.directories]
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, raw_path, source in sorted(entries, key=lambda e: e[1]):
            path = raw_path.strip("/")
            parent = os.path.dirname(path)
            if parent:
                _add_dir(tar, parent, seen)
            if kind == "d":
                _add_dir(tar, path, seen)
                continue
            info = tarfile.TarInfo(path)
            if kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = str(source)
                info.mode = 0o777
                tar.addfile(info)
                continue
            host = Path(source)
            data = host.read_bytes()
            info.size = len(data)
            # Keep the executable bits, drop any write bit for group/other.
            info.mode = stat.S_IMODE(host.stat().st_mode) & 0o755
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _descriptor(media: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media, "digest": _digest(data), "size": len(data), **extra}


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_archive(spec: ImageSpec, out: Path) -> str:
    """Write `spec` as an OCI archive to `out`; returns the manifest digest."""
    layer = layer_tar(spec)
    config: dict[str, Any] = {
        **PLATFORM,
        "config": {"Env": list(spec.env)},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }
    if spec.entrypoint:
        config["config"]["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        config["config"]["Cmd"] = list(spec.cmd)
    config_bytes = _json(config)
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": _descriptor(MEDIA_CONFIG, config_bytes),
            "layers": [_descriptor(MEDIA_LAYER, layer)],
        }
    )
    annotations = {
        "io.containerd.image.name": spec.name,
        "org.opencontainers.image.ref.name": spec.name,
    }
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                _descriptor(MEDIA_MANIFEST, manifest, annotations=annotations, platform=PLATFORM)
            ],
        }
    )
    blobs = [layer, config_bytes, manifest]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = [
            ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
            ("index.json", index),
            *((f"blobs/sha256/{_digest(b)[7:]}", b) for b in blobs),
        ]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return _digest(manifest)
