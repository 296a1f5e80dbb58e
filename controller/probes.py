"""HTTP liveness and readiness endpoints (`/healthz`, `/readyz`) for the controller process.

Why a module of its own: the Deployment's kubelet probes need them from the first release, before
any reconciler exists, and every reconciler added later reports into the same readiness check.
The standard library's threading HTTP server is enough for two plain-text GET endpoints; a web
framework would be a dependency for nothing.

`/healthz` answers 200 while the process makes progress: 503 naming the stalled loops once the
liveness check (`set_liveness`, the Supervisor's `stalled`) names any, so the kubelet restarts a
replica whose worker hangs or died. `/readyz` answers 200 while every registered check passes and
503 (naming the failing checks) otherwise, including after shutdown began, so a terminating pod
drops out of its Service before it stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dra_driver.metrics_http import parse_address

__all__ = ["Check", "ProbeServer", "parse_address"]  # parse_address: every listener's one parser

log = logging.getLogger(__name__)

Check = Callable[[], bool]


class ProbeServer:
    """Serves /healthz and /readyz on one address from a daemon thread."""

    def __init__(self, address: tuple[str, int]) -> None:
        self._checks: dict[str, Check] = {}
        self._stalled: Callable[[], list[str]] = list
        self._lock = threading.Lock()
        self._stopping = False
        self._httpd = ThreadingHTTPServer(address, self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="probes", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        """The bound address (the real port when 0 was asked for)."""
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def add_check(self, name: str, check: Check) -> None:
        """Make readiness depend on `check()` (a check that raises counts as failing)."""
        with self._lock:
            self._checks[name] = check

    def set_liveness(self, stalled: Callable[[], list[str]]) -> None:
        """Make liveness (and readiness) fail while `stalled()` names any loop."""
        with self._lock:
            self._stalled = stalled
        self.add_check("loops-progressing", lambda: not stalled())

    def stalled(self) -> list[str]:
        """The loops that stopped making progress (a liveness check that raises names itself)."""
        with self._lock:
            stalled = self._stalled
        try:
            return stalled()
        except Exception as exc:
            log.warning("liveness check raised: %s", exc)
            return ["liveness-check"]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Report not ready, then stop serving and close the socket."""
        with self._lock:
            self._stopping = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def failing(self) -> list[str]:
        """Names of the readiness checks that do not pass right now."""
        with self._lock:
            if self._stopping:
                return ["shutting-down"]
            checks = dict(self._checks)
        failed = []
        for name, check in checks.items():
            try:
                ok = check()
            except Exception as exc:
                log.warning("readiness check %s raised: %s", name, exc)
                ok = False
            if not ok:
                failed.append(name)
        return failed

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                probes = {
                    "/healthz": ("stalled", server.stalled),
                    "/readyz": ("not ready", server.failing),
                }
                if self.path not in probes:
                    self._reply(HTTPStatus.NOT_FOUND, "not found")
                    return
                what, failing = probes[self.path]
                names = failing()
                if names:
                    self._reply(HTTPStatus.SERVICE_UNAVAILABLE, f"{what}: " + ", ".join(names))
                else:
                    self._reply(HTTPStatus.OK, "ok")

            def _reply(self, status: HTTPStatus, text: str) -> None:
                body = (text + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("probe %s", format % args)

        return Handler
