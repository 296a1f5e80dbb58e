"""The NVML seam (`dra_driver.nvml.PyNvml`) against the simulated GPUs, through the real pynvml.

Each case runs in a fresh process started with the simulated node's environment (the loader
reads LD_LIBRARY_PATH at start-up), as the kubelet plugin is started by the test bed.

What this proves:
1. Handles are opaque but comparable: the handle NVML returns for a UUID equals the one for the
   same index, and differs from another GPU's.
2. Errors are typed: a query the GPU does not offer (MIG mode on an A10) raises NvmlNotSupported;
   a query on a lost GPU raises NvmlError with NVML's GPU_IS_LOST code, not NvmlNotSupported.
3. XID events: waiting with nothing pending returns None (NVML's timeout is not an error); an
   injected XID comes back as an XidEvent whose device equals the registered handle.
4. Without a libnvidia-ml.so.1, init raises NvmlUnavailable naming LD_LIBRARY_PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import run_python
from vgpu_testbed.fakegpu import simulator as fakegpu

SCRIPT = textwrap.dedent(
    """
    import json, os
    from dra_driver import nvml
    from dra_driver.nvml import NvmlError, NvmlNotSupported, PyNvml, session
    from vgpu_testbed.fakegpu import simulator as fakegpu

    out = {}
    with session(PyNvml()) as lib:
        first, second = lib.device_by_index(0), lib.device_by_index(1)
        out["uuid_handle_equal"] = lib.device_by_uuid(lib.uuid(first)) == first
        out["distinct"] = first != second
        try:
            lib.mig_mode(first)
            out["mig"] = "supported"
        except NvmlNotSupported as exc:
            out["mig"] = ["not-supported", exc.code, exc.call]
        events = lib.create_event_set()
        lib.register_xid_events(first, events)
        out["idle_wait"] = lib.wait_xid(events, 50)
        fakegpu.inject_xid(dict(os.environ), 0, 48)
        event = lib.wait_xid(events, 5000)
        out["xid"] = None if event is None else [event.xid, event.device == first]
        lib.free_event_set(events)
        fakegpu.set_gpu_lost(dict(os.environ), 1, True)
        try:
            lib.uuid(second)
            out["lost"] = "answered"
        except NvmlNotSupported:
            out["lost"] = "not-supported"
        except NvmlError as exc:
            out["lost"] = ["error", exc.code, exc.code == nvml.GPU_IS_LOST]
    print(json.dumps(out))
    """
)


def test_handles_errors_and_xid_events_on_simulated_gpus(tmp_path: Path) -> None:
    env = fakegpu.prepare_node(fakegpu.load_profile("a10-pcie"), tmp_path / "node.state")
    done = run_python(env, SCRIPT)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["uuid_handle_equal"] is True
    assert out["distinct"] is True
    assert out["mig"] == ["not-supported", 3, "nvmlDeviceGetMigMode"]
    assert out["idle_wait"] is None
    assert out["xid"] == [48, True]
    assert out["lost"] == ["error", 15, True]


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a real NVIDIA driver is present")
def test_without_a_library_init_is_unavailable_with_a_hint() -> None:
    script = textwrap.dedent(
        """
        from dra_driver.nvml import NvmlUnavailable, PyNvml
        try:
            PyNvml().init()
        except NvmlUnavailable as exc:
            print(exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_SIM")}
    env["LD_LIBRARY_PATH"] = ""
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "nvmlInit" in done.stdout and "LD_LIBRARY_PATH" in done.stdout
