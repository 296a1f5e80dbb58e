"""`vgpu-dra demo` argument handling and step runner (no cluster).

What this proves:
1. Defaults: temp directory, two default profiles, cluster not kept; bad --nodes is a usage error.
2. Steps run in order with numbered titles, and a missing control plane is a clear error
   (exit 1, `make controlplane`) that starts nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_testbed import demo


def test_defaults() -> None:
    args = demo.build_parser().parse_args([])
    assert args.dir is None and args.keep is False
    assert args.nodes == ["dgx-h100", "a10-pcie"]


def test_bad_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--nodes", "a b"]) == 2
    assert "not a valid label value" in capsys.readouterr().err


def test_steps_run_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    ctx = demo.DemoContext(demo.build_parser().parse_args([]))
    steps = [
        demo.Step("first", lambda c: seen.append("a")),
        demo.Step("second", lambda c: seen.append("b")),
    ]
    demo.run_steps(ctx, steps)
    out = capsys.readouterr().out
    assert seen == ["a", "b"]
    assert "[1/2] first" in out and "[2/2] second" in out


def test_missing_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VGPU_DRA_K8S_BIN", str(tmp_path / "none"))
    assert demo.main(["--dir", str(tmp_path / "c")]) == 1
    assert "make controlplane" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
