"""The controller's chart values `controller.writeConcurrency` and `controller.metricsDetail`,
rendered by the real helm, reach the controller as the flags they name (parsed by its own
parser), defaults and set; the chart's schema refuses what the flags would refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.main import DEFAULT_WRITE_CONCURRENCY, build_parser
from tests.fixtures.chart import CHART, by_kind, helm, helm_binary, render

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_binary()
    return tmp_path_factory.mktemp("helm-controller")


def parsed(docs: list[JSON]) -> Any:
    (deploy,) = by_kind(docs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return build_parser(env).parse_args([])


def test_defaults_match_the_controllers(home: Path) -> None:
    args = parsed(render(home, {"controller": {"enabled": True}}))
    assert args.write_concurrency == DEFAULT_WRITE_CONCURRENCY == 8
    assert args.metrics_detail == build_parser({}).parse_args([]).metrics_detail == "node"


def test_set_values_reach_the_flags(home: Path) -> None:
    values = {"controller": {"enabled": True, "writeConcurrency": 1, "metricsDetail": "gpu"}}
    args = parsed(render(home, values))
    assert (args.write_concurrency, args.metrics_detail) == (1, "gpu")


@pytest.mark.parametrize("bad", ["controller.writeConcurrency=0", "controller.metricsDetail=pod"])
def test_the_schema_refuses_what_the_flags_refuse(home: Path, bad: str) -> None:
    run = helm(
        home,
        "template",
        "x",
        str(CHART),
        "--set",
        "controller.enabled=true",
        "--set",
        bad,
        check=False,
    )
    assert run.returncode != 0
    assert bad.split("=", maxsplit=1)[0].split(".")[1] in run.stderr, run.stderr
