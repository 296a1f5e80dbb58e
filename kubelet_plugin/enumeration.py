"""`python -m kubelet_plugin.enumeration`: the cheapest child answer to "did the GPUs change?".

Why: the kubelet plugin re-enumerates GPUs in a child process when its in-process check says
they may have changed (hot-plug, `kubelet_plugin.gpu_changes`, `kubelet_plugin.rediscover`): NVML
enumerates only once per process. A full discovery in the child costs about four times the CPU
of this one, mostly importing the typed inventory model; so the plugin runs this first and a full
discovery only when its answer changed. Imports nothing but the NVML seam (`dra_driver.nvml`).
Prints one JSON object: `{"count": <GPUs NVML enumerates>, "uuids": [<readable GPUs' UUIDs>]}`;
exit status 1 with a message on stderr when NVML cannot be used.
"""

from __future__ import annotations

import json
import sys

from dra_driver.nvml import NvmlError, PyNvml, session


def fingerprint() -> dict[str, object]:
    with session(PyNvml()) as nvml:
        count = nvml.device_count()
        uuids = []
        for index in range(count):
            try:
                uuids.append(nvml.uuid(nvml.device_by_index(index)))
            except NvmlError:  # unreadable: counted, not listed
                continue
    return {"count": count, "uuids": sorted(uuids)}


def main() -> int:
    try:
        found = fingerprint()
    except NvmlError as exc:
        print(f"GPU enumeration failed: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
