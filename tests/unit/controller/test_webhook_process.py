"""The webhook's own process (controller.webhook.process): the controller's parsed flags become
the child's command line unchanged; the child is started, started again after it exits, and
stopped; over the link between them the controller's registry gets the child's families (and
its own templates-collected counter, not the child's), and the child stops at the link's EOF."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controller.main import build_parser as controller_parser
from controller.webhook import process
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.run import COLLECTED_FAMILY
from vgpu_testbed.polling import wait_for


def test_the_child_gets_the_flags_the_controller_parsed() -> None:
    env = {"VGPU_DRA_WEBHOOK_TEMPLATE_GRACE": "7m", "VGPU_DRA_SHARED_RESOURCES": "a.io/x=2"}
    args = controller_parser(env).parse_args(
        ["--kubeconfig", "/k", "--log-format", "json", "--webhook-port", "9443",
         "--webhook-cert-dir=", "--shared-resource", "b.io/y=4", "--shared-memory", "b.io/y=512",
         "--webhook-client-ca", "/ca.pem", "--webhook-cert-lifetime", "30d",
         "--node-policy", "spread"]
    )  # fmt: skip
    argv = process.child_argv(args)
    assert not any(a.startswith("--parent-fd") for a in argv)
    assert not any(a.startswith(("--webhook-process", "--node-policy")) for a in argv)
    child = process.build_parser({}).parse_args(argv)
    for name, value in vars(child).items():
        if name != "parent_fd" and not name.startswith("_seen_"):
            assert value == getattr(args, name), name
    assert child.webhook_template_grace.total_seconds() == 420
    assert child.shared_resource == [("b.io/y", 4)]


def test_the_child_environment_loses_the_forwarded_twins() -> None:
    env = process.child_env(
        {"PATH": "/bin", "VGPU_DRA_WEBHOOK_PORT": "1", "KUBECONFIG": "/k", "POD_NAMESPACE": "ns"}
    )
    assert env == {"PATH": "/bin", "POD_NAMESPACE": "ns"}


def _child(tmp_path: Path, script: str) -> process.ChildWebhook:
    args = controller_parser({}).parse_args(["--webhook-port", "1"])
    marker = tmp_path / "starts"
    code = f"import sys, pathlib\np = pathlib.Path({str(marker)!r})\n" + (
        "p.write_text(p.read_text() + 'x' if p.exists() else 'x')\n" + script
    )
    return process.ChildWebhook(args, command=[sys.executable, "-c", code])


def _starts(tmp_path: Path) -> int:
    marker = tmp_path / "starts"
    return len(marker.read_text()) if marker.exists() else 0


def test_an_exited_child_is_started_again_and_stop_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "BACKOFF_S", (0.05, 0.1))
    child = _child(tmp_path, "import time\nif len(p.read_text()) < 3: sys.exit(3)\ntime.sleep(60)")
    stop = threading.Event()
    child.start()
    thread = child.supervise(stop)
    wait_for("the third start", lambda: _starts(tmp_path) >= 3, timeout=30)
    assert not child.running()  # alive, but nothing listens on port 1
    stop.set()
    thread.join(timeout=5)
    started = time.monotonic()
    child.stop()
    assert time.monotonic() - started < 5  # SIGTERM was enough
    assert _starts(tmp_path) == 3


def test_vgpu_dra_webhook_needs_a_port(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_DRA_")}
    env["KUBECONFIG"] = str(tmp_path / "missing")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver.cli", "webhook", "--webhook-port", "0"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2  # usage error: a port is required
    assert b"--webhook-port: a port to serve on is required" in err


LINKED_CHILD = """
import sys, threading
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.process import _serve_parent
metrics = WebhookMetrics()
metrics.observe("mutate", "patched", 0.001)
metrics.templates_created.inc()
metrics.templates_collected.inc(5)
fd = int(next(a for a in sys.argv if a.startswith("--parent-fd=")).split("=")[1])
stop, orphaned = threading.Event(), threading.Event()
_serve_parent(fd, stop, metrics.exposition, orphaned)
stop.wait()
sys.exit(7 if orphaned.is_set() else 1)
"""


def test_the_controller_serves_the_childs_metrics_and_the_child_ends_with_the_link() -> None:
    args = controller_parser({}).parse_args(["--webhook-port", "1"])
    child = process.ChildWebhook(args, command=[sys.executable, "-c", LINKED_CHILD])
    child.start()
    try:
        local = WebhookMetrics()
        local.templates_collected.inc(2)
        registry = CollectorRegistry()
        registry.register(process.ChildMetrics(child, local.registry, [COLLECTED_FAMILY]))
        wait_for(
            "the child answering",
            lambda: "admission_duration" in generate_latest(registry).decode(),
        )
        text = generate_latest(registry).decode()
        assert (
            'vgpu_dra_webhook_admission_duration_seconds_count{decision="patched",'
            'operation="mutate"} 1.0'
        ) in text
        assert "vgpu_dra_webhook_claim_templates_created_total 1.0" in text
        assert "vgpu_dra_webhook_claim_templates_collected_total 2.0" in text  # the controller's
        assert text.count("# TYPE vgpu_dra_webhook_claim_templates_collected_total") == 1
        # The controller is gone (its end of the link closes): the child stops by itself.
        process_ = child._process
        assert process_ is not None
        link = child._link
        assert link is not None
        link.close()
        assert process_.wait(timeout=30) == 7
    finally:
        child.stop()
