"""Every way a program can reach the driver's real entry points, tried inside a capped container.

docs/security.md lists these paths and what covers each. A program in a claim capped at 1 GiB
asks for 2 GiB through one path; CUDA_ERROR_OUT_OF_MEMORY (2) means the hook's cap held. Paths
that only node-side enforcement can catch are marked xfail(strict=True): they document the
known gap, and the day one of them becomes capped the test turns red so the docs get updated.
"""

from __future__ import annotations

import pytest

from tests.integration.vgpu_hook.conftest import GIB, HOOK_DIR, UUIDS, Node

BYPASS_PROBE = HOOK_DIR / "build" / "bypass_probe"
HELPER = HOOK_DIR / "build" / "libbypass_helper.so"

CAPPED = [
    "dlsym-handle",
    "dlsym-default",
    "dlsym-next",  # failed before: our dlsym passed RTLD_NEXT lookups through unmapped
    "dlvsym-dlsym",  # failed before: dlvsym handed out libc's real dlsym
    "dlsym-next-dlsym",  # failed before: dlsym(RTLD_NEXT, "dlsym") was libc's real dlsym
    "libc-dlsym",  # failed before: dlsym(libc handle, "dlsym") likewise
    "abspath",
    "procaddr",
    "dlmopen",
    # failed before: a fresh namespace had no hook; our dlmopen now loads the hook there first
    "dlmopen-helper",
]

NODE_SIDE_ONLY = {
    # Code that reads the loader's object list and the driver's ELF symbol table itself.
    "elf-walk": "reads libcuda's symbol table without any dl* call",
    # A library opened with RTLD_DEEPBIND binds its own dependencies (libcuda) first.
    "deepbind-helper": "RTLD_DEEPBIND puts libcuda before the preloaded hook",
}


def _run(node: Node, path: str) -> str:
    claim = node.claim(f"c-bypass-{path}", [f"device uuid={UUIDS[0]} memory={GIB} cores=0"])
    arg = {
        "abspath": str(node.env["LD_LIBRARY_PATH"]) + "/libcuda.so.1",
        "dlmopen-helper": str(HELPER),
        "deepbind-helper": str(HELPER),
    }.get(path)
    argv = [str(BYPASS_PROBE), path, str(2 * GIB)] + ([arg] if arg else [])
    done = claim.run(argv)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("path", CAPPED)
def test_path_is_capped(node: Node, path: str) -> None:
    assert _run(node, path) == f"{path} rc=2"


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=f"node-side only: {why}"))
        for p, why in NODE_SIDE_ONLY.items()
    ],
)
def test_path_caught_only_node_side(node: Node, path: str) -> None:
    assert _run(node, path) == f"{path} rc=2"
