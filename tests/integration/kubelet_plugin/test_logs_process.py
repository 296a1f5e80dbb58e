"""The plugin process's logs: JSON lines on request, and no secret at debug level.

`vgpu-dra kubelet-plugin --log-level debug --log-format json` runs on simulated GPUs with a
kubeconfig that authenticates with a bearer token (which the real API server refuses). A claim
is prepared through the DRA socket, so the plugin sends requests with that token, gets 401s,
logs the failure and tries to write an Event (refused too), all at debug level.

What this proves: every line the process writes is one JSON object with the common keys, the
prepare failure is there with its reason, and the token appears nowhere in the output.
"""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path
from typing import Any

import yaml

from kubelet_plugin.claims import ClaimRef
from tests.fixtures.claimdata import NODE
from tests.fixtures.simulated import require_simulated_gpus, simulated_node_env
from tests.integration.kubelet_plugin.conftest import (
    plugin_process,
    plugin_process_argv,
    prepare,
    wait_for,
)

TOKEN = "vgpu-test-token.c2VjcmV0LXBheWxvYWQ.bm90LWEtcmVhbC1zaWduYXR1cmU"


def token_kubeconfig(source: Path, target: Path) -> Path:
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    for user in config["users"]:
        user["user"] = {"token": TOKEN}
    target.write_text(yaml.safe_dump(config))
    target.chmod(0o600)
    return target


def test_debug_json_logs_never_show_the_token(cluster: Any) -> None:
    require_simulated_gpus()
    root = Path(tempfile.mkdtemp(prefix="vgpu-log-"))
    gpu_env = simulated_node_env(root)
    kubeconfig = token_kubeconfig(Path(cluster.kubeconfig), root / "token.kubeconfig")
    argv = plugin_process_argv(
        root, kubeconfig, NODE, "--no-nvidia-cdi", "--log-level=debug", "--log-format=json"
    )
    dra = root / "plugins" / "vgpu.dra.dev" / "dra.sock"
    log_path = root / "plugin.log"
    with plugin_process(argv, gpu_env, log_path) as proc:
        wait_for(dra.exists, what="the DRA socket")
        ref = ClaimRef("default", "some-claim", "6f0d7a52-0000-4000-8000-00000000abcd")
        [error] = prepare(dra, [ref]).values()
        assert "401" in error or "Unauthorized" in error, error
        wait_for(lambda: "could not write an Event" in log_path.read_text(), what="event try")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    text = log_path.read_text()
    assert TOKEN not in text
    assert TOKEN.split(".")[1] not in text  # not even a part of it
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert records and all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    assert any(r["level"] == "debug" for r in records)
    assert any("prepare" in r["msg"] and "failed" in r["msg"] for r in records)
