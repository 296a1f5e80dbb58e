"""What `vgpu-dra demo` prints, computed from plain API and file data (no I/O here).

The demo's steps (vgpu_testbed.demo.steps) fetch ResourceSlices, claims, pod records, CDI specs
and utilisation samples; this module turns them into rows and text: the devices each node's
plugin published, where each example pod landed and what it consumed, the claim's `vgpu.conf`
and CDI edits, and the statistics of a compute-cap run. Pure so that unit tests
(tests/unit/vgpu_testbed/demo/test_report.py) can check every table against hand-made objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator.quantity import QuantityError, parse_quantity
from dra_driver.names import ATTR_PCIE_ROOT, CAPACITY_CORES, CAPACITY_MEMORY

GIB = 1 << 30
MIB = 1 << 20


def human_bytes(value: int) -> str:
    """`1 GiB`, `79.6 GiB`, `768 MiB`: short enough for a table, exact when it is whole."""
    if value >= GIB:
        return f"{value // GIB} GiB" if value % GIB == 0 else f"{value / GIB:.1f} GiB"
    if value % MIB == 0:
        return f"{value // MIB} MiB"
    return f"{value} B"


def render_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; one string per line, header first."""
    body = [list(map(str, row)) for row in rows]
    widths = [len(h) for h in header]
    for row in body:
        if len(row) != len(header):
            raise ValueError(f"row {row} has {len(row)} cells, the header has {len(header)}")
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [list(header), *body]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return lines


# ---------------------------------------------------------------- step 2: published devices


def attribute(device: Mapping[str, Any], name: str) -> Any:
    """The value of one device attribute (`{"int": 3}` -> 3), None when it is absent."""
    value = (device.get("attributes") or {}).get(name)
    if not value:
        return None
    return next(iter(value.values()))


def capacity_value(device: Mapping[str, Any], name: str) -> int | None:
    return _quantity_or_none(((device.get("capacity") or {}).get(name) or {}).get("value"))


@dataclass(frozen=True, slots=True)
class DeviceRow:
    node: str
    device: str
    product: str
    memory: int | None
    cores: int | None
    numa: Any
    nvlink: Any
    pcie_root: Any


def device_rows(slices: Iterable[Mapping[str, Any]]) -> list[DeviceRow]:
    """One row per published device, by node then device index (gpu-2 before gpu-10)."""
    rows = []
    for obj in slices:
        spec = obj.get("spec") or {}
        for device in spec.get("devices") or []:
            rows.append(
                DeviceRow(
                    node=str(spec.get("nodeName") or spec.get("pool", {}).get("name", "?")),
                    device=str(device.get("name", "?")),
                    product=str(attribute(device, "productName") or "?"),
                    memory=capacity_value(device, CAPACITY_MEMORY),
                    cores=capacity_value(device, CAPACITY_CORES),
                    numa=attribute(device, "numaNode"),
                    nvlink=attribute(device, "nvlinkDomain"),
                    pcie_root=attribute(device, ATTR_PCIE_ROOT),
                )
            )
    return sorted(rows, key=lambda r: (r.node, _device_order(r.device)))


def _device_order(name: str) -> tuple[int, str]:
    tail = name.rsplit("-", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def device_table(rows: Sequence[DeviceRow]) -> list[str]:
    header = ["NODE", "DEVICE", "PRODUCT", "MEMORY", "CORES", "NUMA", "NVLINK", "PCIE ROOT"]
    return render_table(
        header,
        (
            [
                r.node,
                r.device,
                r.product,
                "-" if r.memory is None else human_bytes(r.memory),
                _dash(r.cores),
                _dash(r.numa),
                _dash(r.nvlink),
                _dash(r.pcie_root),
            ]
            for r in rows
        ),
    )


# ---------------------------------------------------------------- step 3: placements


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one example pod's claim was allocated and prepared."""

    pod: str
    node: str
    devices: tuple[str, ...]
    memory: tuple[int | None, ...]
    cores: tuple[int | None, ...]
    share_ids: tuple[str, ...]
    cdi_ids: tuple[str, ...]


def placement(
    pod: Mapping[str, Any], claim: Mapping[str, Any], record: Mapping[str, Any]
) -> Placement:
    """Join a pod, its (single) claim and the kubelet stand-in's prepare record."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    uid = (claim.get("metadata") or {}).get("uid")
    cdi_ids: list[str] = []
    for entry in record.get("claims") or []:
        if entry.get("uid") == uid:
            for device in entry.get("devices") or []:
                cdi_ids += list(device.get("cdiDeviceIDs") or [])
    memory, cores = [], []
    for result in results:
        consumed = result.get("consumedCapacity") or {}
        memory.append(_quantity_or_none(consumed.get(CAPACITY_MEMORY)))
        cores.append(_quantity_or_none(consumed.get(CAPACITY_CORES)))
    return Placement(
        pod=str((pod.get("metadata") or {}).get("name", "?")),
        node=str((pod.get("spec") or {}).get("nodeName") or "-"),
        devices=tuple(str(r.get("device", "?")) for r in results),
        memory=tuple(memory),
        cores=tuple(cores),
        share_ids=tuple(str(r.get("shareID") or "") for r in results),
        cdi_ids=tuple(cdi_ids),
    )


def _quantity_or_none(raw: Any) -> int | None:
    """A Kubernetes quantity as a number; None when absent or not a quantity."""
    if raw is None:
        return None
    try:
        return parse_quantity(str(raw))
    except QuantityError:
        return None


def placement_table(rows: Sequence[Placement]) -> list[str]:
    header = ["POD", "NODE", "DEVICE(S)", "MEMORY", "CORES", "SHARE ID", "CDI DEVICES"]
    cells = []
    for p in rows:
        cells.append(
            [
                p.pod,
                p.node,
                ",".join(p.devices),
                " + ".join("-" if m is None else human_bytes(m) for m in p.memory),
                " + ".join(_dash(c) for c in p.cores),
                ",".join(s[:8] + "…" if len(s) > 8 else (s or "-") for s in p.share_ids),
                str(len(p.cdi_ids)),
            ]
        )
    return render_table(header, cells)


def shared_devices(rows: Sequence[Placement]) -> list[str]:
    """One line per device that more than one pod holds a share of (consumable capacity)."""
    holders: dict[tuple[str, str], list[str]] = {}
    for p in rows:
        for device, memory, cores in zip(p.devices, p.memory, p.cores, strict=True):
            share = "-" if memory is None else human_bytes(memory)
            if cores:
                share += f", {cores} cores"
            holders.setdefault((p.node, device), []).append(f"{p.pod} ({share})")
    return [
        f"{node}/{device} is shared by {' and '.join(pods)}"
        for (node, device), pods in sorted(holders.items())
        if len(pods) > 1
    ]


def remaining_line(device: DeviceRow, rows: Sequence[Placement]) -> str:
    """What is left of one device's capacity after every placement on it, for other claims."""
    used_memory = used_cores = 0
    for p in rows:
        if p.node != device.node:
            continue
        for name, memory, cores in zip(p.devices, p.memory, p.cores, strict=True):
            if name == device.device:
                used_memory += memory or 0
                used_cores += cores or 0
    total_memory, total_cores = device.memory or 0, device.cores or 0
    return (
        f"{device.node}/{device.device}: {human_bytes(used_memory)} and {used_cores} cores "
        f"allocated; {human_bytes(max(0, total_memory - used_memory))} and "
        f"{max(0, total_cores - used_cores)} cores left for other claims"
    )


# ---------------------------------------------------------------- step 4: what prepare wrote


def conf_devices(text: str) -> list[dict[str, str]]:
    """The `device key=value ...` lines of a vgpu.conf, as dicts (other lines skipped)."""
    devices = []
    for line in text.splitlines():
        if line.startswith("device "):
            devices.append(dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok))
    return devices


def cdi_summary(spec: Mapping[str, Any]) -> list[str]:
    """The edits of a claim's CDI spec a reader cares about, one per line."""
    edits = spec.get("containerEdits") or {}
    lines = [f"kind {spec.get('kind')}, cdiVersion {spec.get('cdiVersion')}"]
    lines += [f"env    {entry}" for entry in edits.get("env") or []]
    for mount in edits.get("mounts") or []:
        access = "ro" if "ro" in (mount.get("options") or []) else "rw"
        lines.append(f"mount  {mount.get('hostPath')} -> {mount.get('containerPath')} ({access})")
    nodes = [n.get("path") for n in edits.get("deviceNodes") or []]
    for device in spec.get("devices") or []:
        nodes += [
            n.get("path") for n in (device.get("containerEdits") or {}).get("deviceNodes", [])
        ]
    if nodes:
        lines.append(f"device nodes {', '.join(str(n) for n in nodes)}")
    return lines


def cdi_device_names(kind: str, cdi_ids: Iterable[str]) -> list[str]:
    """Device names of our kind among the IDs prepare returned (`kind=name` -> name)."""
    prefix = f"{kind}="
    return [i[len(prefix) :] for i in cdi_ids if i.startswith(prefix)]


# ---------------------------------------------------------------- step 5: workload outputs


@dataclass(frozen=True, slots=True)
class HoldResult:
    """What `cuda_hold ORD BYTES` reported: allocated, or the CUDA error it failed with."""

    ok: bool
    error: str | None

    @property
    def outcome(self) -> str | None:
        """How the demo reports it: "ok", or the error."""
        return "ok" if self.ok else self.error


def parse_hold(stdout: str, returncode: int) -> HoldResult:
    for line in stdout.splitlines():
        if line.startswith("ready "):
            return HoldResult(ok=returncode == 0, error=None)
        if line.startswith("error "):
            return HoldResult(ok=False, error=line.split()[-1])
    return HoldResult(ok=False, error=f"no result (exit {returncode}): {stdout.strip()[:200]!r}")


@dataclass(frozen=True, slots=True)
class UtilStats:
    """Utilisation samples of one run, after the cap's settling period."""

    mean: float
    low: float
    high: float
    samples: int


def util_stats(samples: Sequence[tuple[float, float]], *, settle_s: float) -> UtilStats:
    """`samples` are (seconds since start, GPU utilisation %); ignore the first `settle_s`."""
    kept = [u for t, u in samples if t >= settle_s]
    if not kept:
        raise ValueError(f"no utilisation samples after {settle_s:.1f}s (got {len(samples)})")
    return UtilStats(mean=sum(kept) / len(kept), low=min(kept), high=max(kept), samples=len(kept))


def spin_rate(stdout: str) -> float | None:
    """Kernel launches per second from cuda_spin's `launches=N seconds=S ...` line (None when
    the line is missing). Its `gpu_ms` is event time on the stream, which a throttled program
    stretches too, so the launch rate is the honest measure of work done."""
    fields = dict(tok.split("=", 1) for tok in stdout.split() if "=" in tok)
    try:
        launches, seconds = int(fields["launches"]), float(fields["seconds"])
    except (KeyError, ValueError):
        return None
    return launches / seconds if seconds > 0 else None


def pod_state(pod: Mapping[str, Any]) -> str:
    """Why a pod is not (yet) prepared, in one line: node, phase and its conditions' reasons."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    parts = [f"pod is on node {spec.get('nodeName') or '(none)'}, phase {status.get('phase')}"]
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            message = cond.get("message") or cond.get("reason") or ""
            parts.append(f"{cond.get('type')}=False: {message}")
    return "; ".join(parts)


# ---------------------------------------------------------------- the policy path


def policy_table(
    pods: Sequence[str],
    runs: Mapping[str, Mapping[str, tuple[str, str]]],
) -> list[str]:
    """One row per pod, one column per policy run: `node/device` the controller chose.

    `runs`: policy name -> pod -> (node, device), e.g. {"binpack": {...}, "spread": {...}}.
    """
    header = ["POD", *(name.upper() for name in runs)]
    rows = [
        [pod, *("/".join(run[pod]) if pod in run else "-" for run in runs.values())] for pod in pods
    ]
    return render_table(header, rows)


def spread_summary(placed: Mapping[str, tuple[str, str]]) -> str:
    """`4 pods on 1 GPU of 1 node`: how far a policy spread the pods."""
    gpus = set(placed.values())
    nodes = {node for node, _ in gpus}
    return (
        f"{len(placed)} pod{'s' * (len(placed) != 1)} on {len(gpus)} GPU{'s' * (len(gpus) != 1)} "
        f"of {len(nodes)} node{'s' * (len(nodes) != 1)}"
    )


def islands(rows: Iterable[DeviceRow], node: str) -> dict[Any, list[str]]:
    """NVLink domain -> the node's devices in it (devices without NVLink left out)."""
    found: dict[Any, list[str]] = {}
    for r in rows:
        if r.node == node and r.nvlink is not None:
            found.setdefault(r.nvlink, []).append(r.device)
    return found


def island_node(rows: Sequence[DeviceRow], size: int) -> str | None:
    """The first node (by name) with more than one NVLink island, one of them at least `size`
    GPUs: where a `size`-GPU claim could fit in one island or be split across two."""
    for node in sorted({r.node for r in rows}):
        domains = islands(rows, node)
        if len(domains) > 1 and max(len(d) for d in domains.values()) >= size:
            return node
    return None
