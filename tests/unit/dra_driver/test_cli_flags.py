"""The flags both processes share (dra_driver/cli_flags.py): the kubelet plugin and the controller
read them from the same environment variables with the same defaults, a bad boolean is an
argparse error that names the value, and unusable credentials are reported, not raised."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from controller.main import build_parser as controller_parser
from dra_driver import cli_flags
from kubelet_plugin.main import build_parser as plugin_parser

SHARED = ("kubeconfig", "log_level", "log_format")


def test_both_processes_read_the_shared_flags_from_the_same_environment() -> None:
    env = {
        "KUBECONFIG": "/etc/vgpu/kubeconfig",
        "VGPU_DRA_LOG_LEVEL": "debug",
        "VGPU_DRA_LOG_FORMAT": "json",
    }
    plugin, controller = plugin_parser(env).parse_args([]), controller_parser(env).parse_args([])
    for dest in SHARED:
        assert getattr(plugin, dest) == getattr(controller, dest), dest
    assert (plugin.kubeconfig, plugin.log_level, plugin.log_format) == (
        "/etc/vgpu/kubeconfig",
        "debug",
        "json",
    )


def test_defaults_without_environment() -> None:
    plugin, controller = plugin_parser({}).parse_args([]), controller_parser({}).parse_args([])
    for args in (plugin, controller):
        assert (args.kubeconfig, args.log_level, args.log_format) == (None, "info", "text")
    assert (plugin.metrics_address, plugin.otlp_endpoint) == ("", "")


def test_metrics_and_tracing_endpoints_come_from_their_environment_twins() -> None:
    env = {"VGPU_DRA_METRICS_ADDRESS": "127.0.0.1:9402", "OTEL_EXPORTER_OTLP_ENDPOINT": "x:4317"}
    args = plugin_parser(env).parse_args([])
    assert (args.metrics_address, args.otlp_endpoint) == ("127.0.0.1:9402", "x:4317")


@pytest.mark.parametrize(
    ("text", "value"), [("1", True), ("Yes", True), (" on ", True), ("off", False), ("", False)]
)
def test_boolean_accepts_the_usual_spellings(text: str, value: bool) -> None:
    assert cli_flags.boolean(text) is value


def test_boolean_names_a_bad_value() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="'maybe'"):
        cli_flags.boolean("maybe")


def test_unusable_credentials_are_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "no-such-kubeconfig")
    log = logging.getLogger("test-cli-flags")
    with caplog.at_level(logging.ERROR, logger="test-cli-flags"):
        assert cli_flags.connect(missing, log) is None
    assert "cannot load Kubernetes credentials" in caplog.text and missing in caplog.text


@pytest.mark.parametrize(
    ("env", "argv", "value"),
    [
        ({}, [], True),  # the default
        ({"X_ON": "false"}, [], False),  # the environment's default
        ({"X_ON": "false"}, ["--x"], True),  # the flag alone
        ({}, ["--x=false"], False),
        ({}, ["--x", "off"], False),
    ],
)
def test_a_switch_reads_its_default_from_the_environment_and_its_flag_alone_as_true(
    env: dict[str, str], argv: list[str], value: bool
) -> None:
    parser = argparse.ArgumentParser()
    cli_flags.add_switch(parser, env, "--x", env_name="X_ON", default=True, help="")
    assert parser.parse_args(argv).x is value
