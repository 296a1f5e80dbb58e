"""The chart's telemetry values reach the kubelet plugin as the flags it reads.

The chart passes `logFormat`, `metrics.*` and `tracing.*` to every component as environment
(`vgpu-dra.commonEnv`); the plugin takes its `--log-format`, `--metrics-address` and
`--otlp-endpoint` defaults from those variables. Rendered by the real helm binary, the plugin's
container environment is fed to the plugin's own argument parser: a renamed variable on either
side fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.metrics_http import parse_address
from kubelet_plugin.main import build_parser
from tests.fixtures.chart import JSON, by_kind, helm_binary, render

# Longer than the 60 s default: helm renders the chart; the first test may start the session
# cluster.
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_binary()
    return tmp_path_factory.mktemp("helm-telemetry")


def plugin_env(docs: list[JSON]) -> dict[str, str]:
    [daemonset] = by_kind(docs, "DaemonSet")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def parsed(env: dict[str, str]) -> Any:
    return build_parser(env).parse_args(["--node-name", "n"])


def test_defaults_leave_metrics_and_tracing_off(home: Path) -> None:
    args = parsed(plugin_env(render(home, {})))
    assert (args.log_format, args.metrics_address, args.otlp_endpoint) == ("text", "", "")


def test_enabled_values_become_the_plugins_settings(home: Path) -> None:
    values = {
        "logFormat": "json",
        "metrics": {"enabled": True, "address": "0.0.0.0:9464"},
        "tracing": {"otlpEndpoint": "otel-collector.observability:4317"},
    }
    args = parsed(plugin_env(render(home, values)))
    assert args.log_format == "json"
    assert parse_address(args.metrics_address) == ("0.0.0.0", 9464)
    assert args.otlp_endpoint == "otel-collector.observability:4317"
