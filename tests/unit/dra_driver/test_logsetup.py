"""The one log format: key=value by default, JSON on request, secrets scrubbed everywhere."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from dra_driver import logsetup

TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.c2lnbmF0dXJlLXRoYXQtaXMtbG9uZw"


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def emit(fmt: logsetup.LogFormat, *args: object, **extra: object) -> str:
    stream = io.StringIO()
    logsetup.configure_logging("debug", fmt, stream)
    logging.getLogger("vgpu-dra.test").info(*args, extra=extra)  # type: ignore[arg-type]
    return stream.getvalue()


def test_key_value_lines(restore_root: None) -> None:
    line = emit("text", "prepared claim %s", "ns/a b", claim_uid="1234", devices="gpu-0")
    assert line.endswith("\n") and line.count("\n") == 1
    assert " level=info logger=vgpu-dra.test " in line
    assert 'msg="prepared claim ns/a b"' in line
    assert "claim_uid=1234 devices=gpu-0" in line
    assert line.startswith("ts=")


def test_json_lines(restore_root: None) -> None:
    record = json.loads(emit("json", "hello %d", 5, node="node-1"))
    assert record["msg"] == "hello 5"
    assert record["level"] == "info"
    assert record["node"] == "node-1"
    assert record["logger"] == "vgpu-dra.test"


def test_exceptions_stay_on_one_line(restore_root: None) -> None:
    stream = io.StringIO()
    logsetup.configure_logging("info", "text", stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed")
    out = stream.getvalue()
    assert out.count("\n") == 1
    assert "RuntimeError: boom" in out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_secret_shapes_are_scrubbed(restore_root: None, fmt: logsetup.LogFormat) -> None:
    for text in (
        f"header Authorization: Bearer {TOKEN}",
        f"{{'authorization': 'Bearer {TOKEN}'}}",
        f"token: {TOKEN}",
        f"client-key-data: {TOKEN}",
    ):
        out = emit(fmt, "%s", text)
        assert TOKEN not in out, out
        assert logsetup.REDACTED in out


def test_registered_literals_are_scrubbed_in_any_position(restore_root: None) -> None:
    secret = "hunter2-but-longer"
    logsetup.redact(secret)
    out = emit("text", "connecting with %s", "x" + secret + "y", note=secret)
    assert secret not in out
    assert out.count(logsetup.REDACTED) == 2


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="log level 'loud'"):
        logsetup.configure_logging("loud", "text")
    with pytest.raises(ValueError, match="log format 'xml'"):
        logsetup.configure_logging("info", "xml")  # type: ignore[arg-type]
