"""`.ci/run` takes the Go module proxy from GOPROXY and names no proxy host itself.

Proves: (1) the proxy is the first real entry of the GOPROXY list (',' or '|' separated;
'direct' and 'off' skipped; trailing slash dropped); (2) with no Go on PATH and no proxy in
GOPROXY the script stops before building anything, with a message saying what to install or set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CI_RUN = REPO / ".ci" / "run"


def goproxy_url(goproxy: str | None) -> str:
    """Run the script's own goproxy_url function (cut out of .ci/run) with this GOPROXY."""
    text = CI_RUN.read_text()
    match = re.search(r"^goproxy_url\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert match, "goproxy_url() not found in .ci/run"
    env = {k: v for k, v in os.environ.items() if k != "GOPROXY"}
    if goproxy is not None:
        env["GOPROXY"] = goproxy
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", match.group(0) + "goproxy_url"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("goproxy", "expected"),
    [
        ("https://mirror.invalid/go/,direct", "https://mirror.invalid/go"),
        ("direct|https://second.invalid", "https://second.invalid"),
        ("off", ""),
        ("direct", ""),
        ("", ""),
        (None, ""),
        (" https://spaced.invalid , direct", "https://spaced.invalid"),
    ],
)
def test_the_proxy_is_the_first_real_goproxy_entry(goproxy: str | None, expected: str) -> None:
    assert goproxy_url(goproxy) == expected


def test_without_go_or_a_proxy_the_script_stops_with_a_clear_message(tmp_path: Path) -> None:
    tools = ["gcc", "make", "valgrind", "unshare", "flock", "mount", "nm", "curl", "unzip"]
    path = "/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("go", path=path):
        pytest.skip("a go binary is on the system PATH")
    if not all(shutil.which(tool, path=path) for tool in tools):
        pytest.skip("the script would install missing tools with apt first")
    env = {"PATH": path, "HOME": str(tmp_path), "GOPROXY": "direct"}
    done = subprocess.run(
        ["bash", str(CI_RUN)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "no 'go' on PATH and no module proxy in GOPROXY (direct)" in done.stderr
    assert "set GOPROXY to a Go module proxy URL" in done.stderr
