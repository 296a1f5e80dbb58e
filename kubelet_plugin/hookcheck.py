"""Is the hook library at --hook-path one that will load and speak our formats? (fail closed)

glibc skips an `/etc/ld.so.preload` entry it cannot load ("cannot be preloaded: ignored") and runs
the program anyway, uncapped. So prepare refuses a claim unless the library is present, non-empty,
an ELF shared object for this node's machine (class, byte order and e_machine of the running
interpreter), and carries the contract note of `vgpu_hook/src/contract_note.c` with the versions
this plugin writes. The ELF is read by hand with `struct` (headers and PT_NOTE segments only, the
way the loader finds notes, so `strip` does not hide it): no ELF library is a dependency today and
the part needed is ~60 lines. The verdict is cached per (path, inode, device, size, mtime), so a
prepare costs one `stat` unless the file changed. Used by `kubelet_plugin.prepare`.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from dataclasses import dataclass
from typing import BinaryIO

from kubelet_plugin.region import REGION_VERSION

NOTE_NAME = b"vgpu-dra"
NOTE_TYPE_CONTRACT = 1
# What this plugin writes; the hook's note must carry exactly these.
CONTRACT_VERSION = 1
CONF_FORMAT_VERSION = 1  # the "version" line of vgpu.conf (kubelet_plugin.plan)
EXPECTED = (CONTRACT_VERSION, CONF_FORMAT_VERSION, REGION_VERSION)

_ELF_MAGIC = b"\x7fELF"
_ET_DYN = 3
_PT_NOTE = 4
_MAX_NOTES_BYTES = 1 << 16  # notes of a shared object are a few hundred bytes
_FIX = (
    "install the libvgpu.so built from this release's vgpu_hook (make -C vgpu_hook) there, or "
    "point --hook-path at it"
)


class HookLibraryError(Exception):
    """The hook library would not load or would misread our files; the text names path and fix."""


@dataclass(frozen=True, slots=True)
class ElfIdentity:
    """What makes an ELF object loadable on this machine."""

    elf_class: int  # 1 = 32-bit, 2 = 64-bit
    data: int  # 1 = little endian, 2 = big endian
    machine: int  # e_machine

    @property
    def endian(self) -> str:
        return "<" if self.data == 1 else ">"


def node_identity() -> ElfIdentity:
    """The running interpreter's ELF identity: the machine the hook must have been built for.

    /proc/self/exe is the binary actually running (sys.executable may be a wrapper script).
    """
    for executable in ("/proc/self/exe", os.path.realpath(sys.executable)):
        try:
            with open(executable, "rb") as handle:
                identity = _identity(handle.read(20))
        except OSError:
            continue
        if identity is not None:
            return identity
    raise HookLibraryError("cannot tell this node's ELF machine (/proc/self/exe is not readable)")


def _identity(head: bytes) -> ElfIdentity | None:
    if len(head) < 20 or head[:4] != _ELF_MAGIC or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    (machine,) = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)
    return ElfIdentity(elf_class=head[4], data=head[5], machine=machine)


def check_hook_library(path: str, node: ElfIdentity) -> None:
    """Raise HookLibraryError (naming the path and the fix) unless `path` is a usable hook."""
    try:
        with open(path, "rb") as handle:
            _check_elf(handle, path, node)
    except FileNotFoundError:
        raise HookLibraryError(
            f"hook library {path} (--hook-path) does not exist; {_FIX}"
        ) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise HookLibraryError(
            f"hook library {path} (--hook-path) cannot be read ({exc.strerror}); {_FIX}"
        ) from None


def _check_elf(handle: BinaryIO, path: str, node: ElfIdentity) -> None:
    head = handle.read(64)
    if not head:
        raise HookLibraryError(f"hook library {path} (--hook-path) is empty; {_FIX}")
    identity = _identity(head)
    if identity is None:
        raise HookLibraryError(f"hook library {path} (--hook-path) is not an ELF file; {_FIX}")
    if identity != node:
        raise HookLibraryError(
            f"hook library {path} (--hook-path) is built for another machine (ELF class "
            f"{identity.elf_class}, byte order {identity.data}, machine {identity.machine}; this "
            f"node needs {node.elf_class}, {node.data}, {node.machine}); {_FIX}"
        )
    wide = identity.elf_class == 2
    e = identity.endian
    if wide:
        e_type, _, _, _, e_phoff, _, _, _, e_phentsize, e_phnum = struct.unpack_from(
            e + "HHIQQQIHHH", head, 16
        )
    else:
        e_type, _, _, _, e_phoff, _, _, _, e_phentsize, e_phnum = struct.unpack_from(
            e + "HHIIIIIHHH", head, 16
        )
    if e_type != _ET_DYN:
        raise HookLibraryError(
            f"hook library {path} (--hook-path) is an ELF file but not a shared object; {_FIX}"
        )
    found: tuple[int, ...] | None = None
    for offset, size in _note_segments(handle, e, wide, (e_phoff, e_phentsize, e_phnum)):
        handle.seek(offset)
        found = _contract_note(handle.read(min(size, _MAX_NOTES_BYTES)), e)
        if found is not None:
            break
    if found is None:
        raise HookLibraryError(
            f"hook library {path} (--hook-path) carries no vgpu-dra contract note (an old or "
            f"foreign build); {_FIX}"
        )
    if found != EXPECTED:
        raise HookLibraryError(
            f"hook library {path} (--hook-path) speaks contract {_versions(found)}, this plugin "
            f"writes {_versions(EXPECTED)}; {_FIX}"
        )


def _note_segments(
    handle: BinaryIO, e: str, wide: bool, table_at: tuple[int, int, int]
) -> list[tuple[int, int]]:
    """(offset, size) of every PT_NOTE segment; `table_at` is (e_phoff, e_phentsize, e_phnum)."""
    phoff, phentsize, phnum = table_at
    entry = "IIQQQQQQ" if wide else "IIIIIIII"
    if phnum == 0 or phnum > 256 or phentsize < struct.calcsize(e + entry):
        return []
    handle.seek(phoff)
    table = handle.read(phentsize * phnum)
    segments: list[tuple[int, int]] = []
    for index in range(len(table) // phentsize):
        fields = struct.unpack_from(e + entry, table, index * phentsize)
        if fields[0] != _PT_NOTE:
            continue
        # 64-bit: type, flags, offset, vaddr, paddr, filesz; 32-bit: type, offset, ..., filesz
        offset, size = (fields[2], fields[5]) if wide else (fields[1], fields[4])
        segments.append((offset, size))
    return segments


def _contract_note(data: bytes, e: str) -> tuple[int, ...] | None:
    """Walk the notes of one segment; the descriptor words of ours, or None."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, note_type = struct.unpack_from(e + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + _align4(namesz)
        end = desc_at + _align4(descsz)
        if end > len(data):
            return None
        name = data[name_at : name_at + namesz].rstrip(b"\0")
        if name == NOTE_NAME and note_type == NOTE_TYPE_CONTRACT and descsz % 4 == 0:
            return struct.unpack_from(f"{e}{descsz // 4}I", data, desc_at)
        pos = end
    return None


def _align4(size: int) -> int:
    return (size + 3) & ~3


def _versions(words: tuple[int, ...]) -> str:
    labels = ("contract", "vgpu.conf", "region")
    return ", ".join(f"{label} v{value}" for label, value in zip(labels, words, strict=False))


class HookLibraryCheck:
    """`check_hook_library` with the verdict cached until the file changes (one stat per call)."""

    def __init__(self, path: str, node: ElfIdentity | None = None) -> None:
        self.path = path
        self._node = node or node_identity()
        self._lock = threading.Lock()
        self._key: tuple[int, int, int, int] | None = None
        self._error: str = ""

    def verify(self) -> None:
        """Raise HookLibraryError when the library at `path` is unusable."""
        try:
            status = os.stat(self.path)
            key: tuple[int, int, int, int] | None = (
                status.st_ino,
                status.st_dev,
                status.st_size,
                status.st_mtime_ns,
            )
        except OSError:
            key = None  # missing: never cached, so installing the library fixes the next call
        with self._lock:
            if key is not None and key == self._key:
                if self._error:
                    raise HookLibraryError(self._error)
                return
        try:
            check_hook_library(self.path, self._node)
            error = ""
        except HookLibraryError as exc:
            error = str(exc)
        with self._lock:
            self._key, self._error = key, error
        if error:
            raise HookLibraryError(error)
