"""The kubelet plugin's flags: defaults, environment twins, validation with named flags."""

from __future__ import annotations

import argparse

import pytest

from kubelet_plugin.main import build_parser, main, settings_from, socket_paths


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
        (["--node-name", "n", "--oversubscription-ratio", "0.9"], "from 1.0 to 64, got 0.9"),
        (["--node-name", "n", "--claim-gid", "-1"], "--claim-gid must be a group id from 0 to"),
    ],
)
def test_invalid_settings_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        settings_from(parse(argv))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--oversubscription-ratio", "nan"], "--oversubscription-ratio must be a number from"),
        (["--oversubscription-ratio", "inf"], "--oversubscription-ratio must be a number from"),
        (["--oversubscription-ratio", "1e308"], "--oversubscription-ratio must be a number from"),
        (["--workers", "0"], "--workers must be from 1 to 256, got 0"),
        (["--state-lock-timeout", "nan"], "--state-lock-timeout must be a number of seconds"),
        (["--state-lock-timeout", "-1"], "--state-lock-timeout must be a number of seconds"),
        (["--claim-gid", "4294967295"], "--claim-gid must be a group id from 0 to 4294967294"),
        (["--claim-gid", str(2**40)], "--claim-gid must be a group id"),
        (["--driver-name", "Bad_Driver"], "--driver-name 'Bad_Driver' is not a valid DRA driver"),
        (["--driver-name", "a" * 64 + ".dev"], "is not a valid DRA driver name"),
        (["--driver-name", "../etc"], "is not a valid DRA driver name"),
    ],
)
def test_bad_flags_exit_2_at_start_with_a_message(
    flags: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Checked before GPU discovery or any API call: main returns 2 and logs why."""
    assert main(["--node-name", "n", *flags]) == 2
    assert message in caplog.text


def test_bad_environment_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["--node-name", "n"], env={"VGPU_DRA_CLAIM_GID": "staff"})
    assert exit_.value.code == 2
    assert "--claim-gid: invalid int value: 'staff'" in capsys.readouterr().err


def test_binding_conditions_are_off_unless_the_flag_or_the_charts_feature_asks() -> None:
    assert build_parser({}).parse_args([]).binding_conditions is False
    env = {"VGPU_DRA_FEATURE_BINDING_CONDITIONS": "true"}
    assert build_parser(env).parse_args([]).binding_conditions is True
    assert build_parser(env).parse_args(["--no-binding-conditions"]).binding_conditions is False
    assert build_parser({}).parse_args(["--binding-conditions"]).binding_conditions is True
