"""The kubelet plugin's flags: defaults, environment twins, validation with named flags."""

from __future__ import annotations

import argparse

import pytest

from kubelet_plugin.main import build_parser, settings_from, socket_paths


def parse(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    return build_parser(env or {}).parse_args(argv)


def test_defaults_are_the_standard_paths() -> None:
    args = parse(["--node-name", "n1"])
    settings = settings_from(args)
    assert settings.cdi_root == "/var/run/cdi"
    assert settings.state_dir == "/var/lib/vgpu-dra"
    assert settings.spec.kind == "k8s.vgpu.dra.dev/claim"
    assert settings.spec.hook_path == "/usr/local/vgpu-dra/lib/libvgpu.so"
    assert settings.toolkit_spec_dirs == ("/etc/cdi", "/var/run/cdi")
    sockets = socket_paths(args)
    assert sockets.dra == "/var/lib/kubelet/plugins/vgpu.dra.dev/dra.sock"
    assert sockets.registration == "/var/lib/kubelet/plugins_registry/vgpu.dra.dev-reg.sock"


def test_environment_supplies_defaults_and_flags_win() -> None:
    env = {"NODE_NAME": "from-env", "VGPU_DRA_CLAIM_GID": "4242", "VGPU_DRA_CDI_ROOT": "/x"}
    settings = settings_from(parse([], env))
    assert (settings.node_name, settings.spec.claim_gid, settings.cdi_root) == (
        "from-env",
        4242,
        "/x",
    )
    assert settings_from(parse(["--node-name", "flag"], env)).node_name == "flag"


def test_renamed_driver_renames_everything() -> None:
    args = parse(["--node-name", "n", "--driver-name", "gpu.example.com", "--plugin-dir", "/p"])
    settings = settings_from(args)
    assert settings.spec.kind == "k8s.gpu.example.com/claim"
    assert socket_paths(args).dra == "/p/dra.sock"
    assert socket_paths(args).registration.endswith("/gpu.example.com-reg.sock")


def test_toolkit_lookup_can_be_disabled() -> None:
    settings = settings_from(parse(["--node-name", "n", "--no-nvidia-cdi"]))
    assert settings.toolkit_spec_dirs == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node-name (or env NODE_NAME) is required"),
        (["--node-name", "n", "--oversubscription-ratio", "0.9"], "must be >= 1.0, got 0.9"),
        (["--node-name", "n", "--claim-gid", "-1"], "--claim-gid must be >= 0, got -1"),
    ],
)
def test_invalid_settings_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        settings_from(parse(argv))
    assert message in str(err.value)
