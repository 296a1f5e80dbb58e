"""One log format for every vgpu-dra process: kubelet plugin, governor, controller.

Why: operators grep and ship these logs; one shape everywhere (and one place that decides it)
means one parser. Two formats:
- `text` (default): `key=value` pairs, `ts=... level=... logger=... msg="..."`, values quoted
  when they contain spaces, quotes or `=`; `exc="..."` carries a traceback on one line;
- `json`: one JSON object per line with the same keys.

Secrets never reach a handler: a filter on the root handler rewrites every record's final text,
replacing bearer tokens, `Authorization:` headers, kubeconfig `token:`/`client-key-data:` fields
and any literal registered with `redact()` (the plugin registers the token of its kubeconfig).
This also covers third-party loggers (the Kubernetes client and urllib3 log at debug level).

Written by hand: the standard library's logging needs only two formatters and a filter; a
structured-logging library would add a dependency for forty lines.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
REDACTED = "[REDACTED]"

# Patterns whose secret part is group 2 (group 1 is kept so the log still says what was there).
_SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)([A-Za-z0-9._~+/=-]{8,})"),
    re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)([^'\",}\s][^'\",}]*)"),
    re.compile(
        r"(?i)((?:token|client-key-data|client-certificate-data|password)['\"]?\s*[:=]\s*['\"]?)"
        r"([A-Za-z0-9._~+/=-]{8,})"
    ),
)
_literals: set[str] = set()
_literals_lock = threading.Lock()


def redact(secret: str | None) -> None:
    """Never log this exact string (e.g. a bearer token read from a kubeconfig)."""
    if secret and len(secret) >= 4:
        with _literals_lock:
            _literals.add(secret)


def scrub(text: str) -> str:
    """`text` with every known secret shape and registered literal replaced by [REDACTED]."""
    with _literals_lock:
        literals = sorted(_literals, key=len, reverse=True)
    for literal in literals:
        if literal in text:
            text = text.replace(literal, REDACTED)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record as ordered key/value pairs: fixed keys, then `extra=` fields."""
    out: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def _kv_value(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if text and not any(c in text for c in ' "=\n\t\\'):
        return text
    return json.dumps(text)


class KeyValueFormatter(logging.Formatter):
    """`key=value` lines (logfmt style), secrets scrubbed."""

    def format(self, record: logging.LogRecord) -> str:
        line = " ".join(f"{k}={_kv_value(v)}" for k, v in _fields(record).items())
        return scrub(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, secrets scrubbed."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(json.dumps(_fields(record), default=str))


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler configure_logging installs (so a second call replaces it)."""


def configure_logging(
    level: str = "info", fmt: LogFormat = "text", stream: TextIO | None = None
) -> logging.Handler:
    """Install our handler on the root logger (replacing one an earlier call installed; other
    handlers, e.g. a test harness's, stay); returns it."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LOG_LEVELS)}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
    handler = _OurHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, _OurHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
