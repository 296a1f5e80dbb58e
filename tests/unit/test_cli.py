"""The `vgpu-dra` dispatcher: every advertised command resolves, bad input is a clear error."""

from __future__ import annotations

import pytest

from dra_driver import __version__, cli


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_listed_command_resolves_to_a_function(name: str) -> None:
    target, help_text = cli.SUBCOMMANDS[name]
    assert callable(cli._load(target))
    assert help_text


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert name in out


def test_unknown_command_exits_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err
    assert "usage: vgpu-dra" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == __version__
