"""Readiness probes over HTTP(S) on loopback, and a wait loop that notices a dead component.

Why not the Kubernetes client: probes run before any kubeconfig works (etcd) or against
components with a self-signed serving certificate (scheduler, controller-manager), and a probe
must never hang: every request has a short timeout. Called by `vgpu_testbed.cluster.control_plane`.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from vgpu_testbed.procs import ProcessRecord, is_alive, log_tail


class ComponentDiedError(RuntimeError):
    """A component exited while we waited for it; the message carries its log tail."""


class NotReadyError(TimeoutError):
    """A component did not become healthy in time."""


def http_get(
    url: str,
    *,
    ca_file: Path | None = None,
    token: str | None = None,
    verify: bool = True,
    timeout: float = 2.0,
) -> tuple[int, str]:
    """(status, body) of a GET; (0, reason) when nothing answered."""
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        if verify:
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        else:
            # Scheduler and controller-manager serve /healthz with a self-signed certificate
            # generated at start; on loopback the probe accepts it.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return int(resp.status), resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as err:
        return 0, str(getattr(err, "reason", err))


def explain_death(record: ProcessRecord) -> str:
    tail = log_tail(record.log_path)
    hint = ""
    if "address already in use" in tail:
        hint = (
            f"\nhint: port {record.port} was taken by another process; "
            "start again to pick new ports"
        )
    return (
        f"{record.name} (pid {record.pid}) exited during start-up.{hint}\n"
        f"last lines of {record.log_path}:\n{tail}"
    )


def wait_for(
    what: str,
    probe: Callable[[], tuple[bool, str]],
    *,
    watch: list[ProcessRecord],
    timeout: float,
    interval: float = 0.2,
) -> None:
    """Poll `probe` (-> (ok, detail)) until ok; fail fast if a watched process died."""
    deadline = time.monotonic() + timeout
    detail = ""
    while True:
        for record in watch:
            if not is_alive(record):
                raise ComponentDiedError(explain_death(record))
        ok, detail = probe()
        if ok:
            return
        if time.monotonic() >= deadline:
            logs = ", ".join(r.log_path for r in watch)
            raise NotReadyError(
                f"{what} not ready after {timeout:.0f}s (last answer: {detail!r}); logs: {logs}"
            )
        time.sleep(interval)
