"""What the API server's ResourceSlice API can store, found out once at start-up.

Why: Kubernetes 1.34 and 1.35 serve consumable capacity (`allowMultipleAllocations` on a device,
`requestPolicy` on a capacity) only behind the alpha gate DRAConsumableCapacity; with the gate off
the API server silently drops both fields on write. The publisher compares what it wants with
what it reads back, so it would see a difference after every write and rewrite the pool forever.

So before publishing, the plugin asks the server itself: a server-side dry-run create of a probe
slice that uses both fields (nothing is stored; it passes the same authorization and admission as
a real write of this node's slice). If the fields come back, slices are published as built.
If they are dropped, the plugin publishes the form the server keeps: every GPU as a whole device
(no `allowMultipleAllocations`, no `requestPolicy`; the capacities stay as plain values), and says
so once in its log. See docs/install.md (version support).
"""

from __future__ import annotations

import copy
import enum
import logging
import threading
from typing import Any

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient, KubeError
from dra_driver.supervision import Loop
from kubelet_plugin.backoff import Backoff

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class SliceForm(enum.Enum):
    """How devices are published."""

    SHARED = "shared"
    """Consumable capacity: a GPU is allocated to many claims, each taking memory and cores."""
    WHOLE = "whole"
    """No consumable capacity on this server: each GPU goes to one claim at a time."""


def probe_slice(driver: str, node_name: str) -> JSON:
    """A slice of this node using every consumable-capacity field the publisher writes."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node_name}-capability-probe-"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "probe",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": "1Gi",
                            "requestPolicy": {
                                "default": "1Gi",
                                "validRange": {"min": "1Mi", "max": "1Gi", "step": "1Mi"},
                            },
                        }
                    },
                }
            ],
        },
    }


def form_from_echo(echo: JSON) -> SliceForm:
    """SHARED when the server kept both consumable-capacity fields of the probe, else WHOLE."""
    devices = (echo.get("spec") or {}).get("devices") or [{}]
    device = devices[0]
    memory = (device.get("capacity") or {}).get("memory") or {}
    kept = bool(device.get("allowMultipleAllocations")) and bool(memory.get("requestPolicy"))
    return SliceForm.SHARED if kept else SliceForm.WHOLE


def probe_form(client: KubeClient, *, driver: str, node_name: str) -> SliceForm:
    """One server-side dry run; raises KubeError when the server cannot be asked."""
    echo = client.request(
        "POST",
        kube.path(RESOURCE_API, "resourceslices"),
        body=probe_slice(driver, node_name),
        query={"dryRun": "All"},
    )
    return form_from_echo(echo)


def wait_for_form(
    client: KubeClient,
    *,
    driver: str,
    node_name: str,
    stop: threading.Event,
    backoff: Backoff | None = None,
    loop: Loop | None = None,
) -> SliceForm | None:
    """Probe until the server answers (None if `stop` is set first); log the outcome once.

    Each attempt beats `loop` (the slice publisher's); one that raised something unexpected (an
    echo of the wrong shape) is logged with its traceback, counted and retried like an API
    error.
    """
    backoff = backoff or Backoff()
    while not stop.is_set():
        try:
            form = probe_form(client, driver=driver, node_name=node_name)
        except KubeError as exc:
            delay = backoff.next_delay()
            log.warning("cannot probe the ResourceSlice API (retry in %.1fs): %s", delay, exc)
            if loop is not None:
                loop.beat()
            stop.wait(delay)
            continue
        except Exception:
            delay = backoff.next_delay()
            log.exception("probing the ResourceSlice API failed (retry in %.1fs)", delay)
            if loop is not None:
                loop.beat(failed=True)
            stop.wait(delay)
            continue
        if loop is not None:
            loop.beat()
        if form is SliceForm.WHOLE:
            log.warning(
                "the API server drops consumable capacity (allowMultipleAllocations, "
                "requestPolicy): Kubernetes < 1.36 without the DRAConsumableCapacity feature "
                "gate. Publishing every GPU as a whole device: claims cannot share a GPU on "
                "this cluster until the gate is on (see docs/install.md)"
            )
        else:
            log.info("the API server stores consumable capacity: GPUs are published shareable")
        return form
    return None


def whole_device_slice(obj: JSON) -> JSON:
    """`obj` without the consumable-capacity fields, as a server without them stores it."""
    result = copy.deepcopy(obj)
    for device in (result.get("spec") or {}).get("devices") or []:
        device.pop("allowMultipleAllocations", None)
        for capacity in (device.get("capacity") or {}).values():
            capacity.pop("requestPolicy", None)
    return result
