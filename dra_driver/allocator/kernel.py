"""The fitting and scoring scan over nodes x devices: pure-Python reference of `_fastkernel`.

For every node that passed node fit, and every request of the pod, count the devices that are
selectable (mask), not exclusively held, and have the requested memory and cores free; group them
by NUMA node or NVLink domain when the topology policy asks, or when the claim has a
matchAttribute on `numaNode` / `nvlinkDomain` for the request (`req_group`: 1 / 2, always
strict); then give the node a key (higher is better, -1 = infeasible) and a closeness count (for
"closest: node-3 (1 GPU)" messages).

This is a necessary-condition screen plus the node score: the exact placement on the chosen node
(capacity rounding, constraints, several requests sharing devices) is decided afterwards by the
shared search in `allocate.py`, so both kernels only have to agree with each other, which the
property tests check on random clusters. docs/scheduling.md defines the key:

    key = 1000 * [every request fits in one topology group]            (topology numa|link)
        +   10 * (64 - size of the largest NVLink domain used)   (topology link, when grouped)
        +        node score in [0, 1] (binpack: used fraction; spread: 1 - used fraction)

The Cython twin must compute the same floating-point operations in the same order.
"""

from __future__ import annotations

from typing import Any

Array = Any  # 1-D / 2-D numpy arrays (int64; masks int8)
MAX_FIT = 256  # devices per node and request the scan counts (a fixed buffer in the Cython twin)


def _best_group(
    fit: list[int], numa: Array, link: Array, link_size: Array, *, kind: int, need: int
) -> tuple[int, int]:
    """(most fitting devices in one NUMA node (kind 1) / NVLink domain (kind 2), size of the
    smallest NVLink domain holding `need` of them, or 2**30)."""
    best_count = 0
    best_size = 1 << 30
    for d in fit:
        group = int(numa[d]) if kind == 1 else int(link[d])
        if group < 0:
            continue
        count = 0
        for e in fit:
            other = int(numa[e]) if kind == 1 else int(link[e])
            if other == group:
                count += 1
        best_count = max(best_count, count)
        if count >= need and kind == 2 and int(link_size[d]) < best_size:
            best_size = int(link_size[d])
    return best_count, best_size


def scan(  # noqa: PLR0915, PLR0917 - mirrors the Cython signature and loop one to one
    node_start: Array,
    node_end: Array,
    node_ok: Array,
    mem_total: Array,
    cores_total: Array,
    mem_default: Array,
    cores_default: Array,
    mem_used: Array,
    cores_used: Array,
    busy: Array,
    numa: Array,
    link: Array,
    link_size: Array,
    masks: Array,
    req_mem: Array,
    req_cores: Array,
    req_count: Array,
    req_group: Array,
    topo: int,
    strict: int,
    binpack: int,
    keys: Array,
    closeness: Array,
) -> None:
    """Fill `keys[n]` and `closeness[n]` for every node n (see the module docstring)."""
    n_nodes = len(node_start)
    n_req = len(req_mem)
    for n in range(n_nodes):
        keys[n] = -1.0
        closeness[n] = 0
        if not node_ok[n]:
            continue
        start = int(node_start[n])
        end = int(node_end[n])
        mt = 0
        mu = 0
        ct = 0
        cu = 0
        for d in range(start, end):
            mt += int(mem_total[d])
            mu += int(mem_used[d])
            ct += int(cores_total[d])
            cu += int(cores_used[d])
        frac = 0.0
        if mt > 0:
            frac += 0.5 * (float(mu) / float(mt))
        if ct > 0:
            frac += 0.5 * (float(cu) / float(ct))
        feasible = True
        grouped = True
        widest = 0
        least = 1 << 30
        for r in range(n_req):
            want_mem = int(req_mem[r])
            want_cores = int(req_cores[r])
            need = int(req_count[r])
            fit: list[int] = []
            matching = 0
            for d in range(start, end):
                if not masks[r, d]:
                    continue
                matching += 1
                if busy[d]:
                    continue
                wm = int(mem_default[d]) if want_mem < 0 else want_mem
                if int(mem_total[d]) - int(mem_used[d]) < wm:
                    continue
                wc = int(cores_default[d]) if want_cores < 0 else want_cores
                if int(cores_total[d]) - int(cores_used[d]) < wc:
                    continue
                if len(fit) < MAX_FIT:
                    fit.append(d)
            if need < 0:  # allocationMode All: every matching device, at least one
                need = matching if matching > 0 else 1
            have = len(fit)
            if topo:
                best_count, best_size = _best_group(
                    fit, numa, link, link_size, kind=topo, need=need
                )
                if best_count >= need:
                    if topo == 2 and best_size > widest:
                        widest = best_size
                else:
                    grouped = False
                if strict:
                    have = best_count
            forced = int(req_group[r])
            if forced:  # a matchAttribute on numaNode / nvlinkDomain: one group, always
                forced_count, _ = _best_group(fit, numa, link, link_size, kind=forced, need=need)
                have = min(have, forced_count)
            if have < need:
                feasible = False
            least = min(least, have)
        closeness[n] = least
        if not feasible:
            continue
        key = 0.0
        if topo and grouped:
            key += 1000.0
            if topo == 2:
                key += 10.0 * (64 - min(widest, 64))
        key += frac if binpack else 1.0 - frac
        keys[n] = key
