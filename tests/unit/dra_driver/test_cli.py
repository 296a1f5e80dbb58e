"""The `vgpu-dra` dispatcher: every advertised command resolves, bad input is a clear error,
and the test-bed commands are reached only through the guarded import that names the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dra_driver import __version__, cli

ALL_COMMANDS = sorted({**cli.PRODUCT_COMMANDS, **cli.TESTBED_COMMANDS})


@pytest.mark.parametrize("name", sorted(cli.PRODUCT_COMMANDS))
def test_every_product_command_resolves_to_a_function(name: str) -> None:
    target, help_text = cli.PRODUCT_COMMANDS[name]
    assert not target.startswith("vgpu_testbed")  # the product never needs the test bed
    assert callable(cli._load(target))
    assert help_text


@pytest.mark.parametrize("name", sorted(cli.TESTBED_COMMANDS))
def test_every_testbed_command_resolves_through_the_guarded_import(name: str) -> None:
    assert callable(cli._load_testbed(name))
    assert cli.TESTBED_COMMANDS[name][1]


def test_command_names_are_unique_across_both_tables() -> None:
    assert not set(cli.PRODUCT_COMMANDS) & set(cli.TESTBED_COMMANDS)


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ALL_COMMANDS:
        assert name in out
    assert "not in the container image" in out


def test_unknown_command_exits_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err
    assert "usage: vgpu-dra" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


# A fresh interpreter in which the named top-level modules cannot be imported, as on a machine
# where they were never installed.
_BLOCKED_RUN = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    from dra_driver import cli
    sys.exit(cli.main(sys.argv[2:]))
    """
)


def run_without(blocked: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, blocked, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("blocked", "command", "missing"),
    [
        ("vgpu_testbed", "fakegpu", "vgpu_testbed"),  # the test bed package itself
        ("cryptography", "dev-cluster", "cryptography"),  # a dependency the test bed imports
        ("cryptography", "demo", "cryptography"),
    ],
)
def test_a_missing_test_bed_says_where_it_comes_from(
    blocked: str, command: str, missing: str
) -> None:
    done = run_without(blocked, command, "--help")
    assert done.returncode == 1
    assert f"vgpu-dra {command}: the test bed is not installed" in done.stderr
    assert f"missing module {missing!r}" in done.stderr
    assert "it comes with a source checkout's `pip install .`" in done.stderr
    assert "Traceback" not in done.stderr


def test_product_commands_and_help_work_without_the_test_bed() -> None:
    done = run_without("vgpu_testbed,cryptography", "--help")
    assert done.returncode == 0, done.stderr
    done = run_without("vgpu_testbed,cryptography", "controller", "--help")
    assert done.returncode == 0, done.stderr
    assert "--health-address" in done.stdout
