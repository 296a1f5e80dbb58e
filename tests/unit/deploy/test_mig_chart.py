"""The chart value `kubeletPlugin.migMode` (templates/kubelet-plugin.yaml) rendered by the real
helm.

Proves: by default the DaemonSet's container has no VGPU_DRA_MIG_MODE (the plugin leaves every
GPU's MIG mode as it is); a set value becomes VGPU_DRA_MIG_MODE, which the kubelet plugin's own
parser reads into `--mig-mode` and `mig_mode.parse_mig_mode` turns into the strategies meant
(a bare strategy, a per-GPU list); the schema refuses a value the plugin would refuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin.main import build_parser
from kubelet_plugin.mig_mode import parse_mig_mode
from tests.fixtures.chart import by_kind, helm_binary, render
from vgpu_testbed.cluster.chart import HelmError

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_binary()
    return tmp_path_factory.mktemp("helm-mig")


def plugin_env(docs: list[JSON]) -> dict[str, str]:
    (daemonset,) = by_kind(docs, "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_default_leaves_mig_modes_alone(home: Path) -> None:
    env = plugin_env(render(home, {}))
    assert "VGPU_DRA_MIG_MODE" not in env
    assert build_parser(env).parse_args([]).mig_mode == ""


@pytest.mark.parametrize(
    ("value", "strategies"),
    [
        ("dynamic", {"all": "dynamic"}),
        ("static", {"all": "static"}),
        ("off", {"all": "off"}),
        (
            "0=dynamic,GPU-1234=off,gpu-2=static",
            {"0": "dynamic", "GPU-1234": "off", "gpu-2": "static"},
        ),
    ],
)
def test_mig_mode_reaches_the_plugin_flag(home: Path, value: str, strategies: JSON) -> None:
    env = plugin_env(render(home, {"kubeletPlugin": {"migMode": value}}))
    assert env["VGPU_DRA_MIG_MODE"] == value
    args = build_parser(env).parse_args([])
    assert args.mig_mode == value
    assert parse_mig_mode(args.mig_mode) == strategies


# The plugin refuses these at start (ValueError naming --mig-mode); the schema refuses them at
# install, before any node runs the DaemonSet.
REFUSED = ["on", "0=", "0=dynamic,1=maybe"]
# The plugin tolerates an empty part and spaces, and takes "0=dynamic;1" for a selector (that no
# GPU matches); the chart keeps its value in one canonical form that names GPUs.
NOT_CANONICAL = ["dynamic,", "all = dynamic", "0=dynamic;1=off"]


@pytest.mark.parametrize("value", REFUSED + NOT_CANONICAL)
def test_schema_refuses_bad_values(home: Path, value: str) -> None:
    if value in REFUSED:
        with pytest.raises(ValueError, match="--mig-mode"):
            parse_mig_mode(value)
    with pytest.raises(HelmError, match="migMode"):
        render(home, {"kubeletPlugin": {"migMode": value}})
