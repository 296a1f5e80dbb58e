"""The tests' oracle: `scan` and `search` of `dra_driver.allocator._scan` (read its docstring
for what they compute), written again in plain Python.

The allocator runs only the Cython kernels; this twin is here so that the property tests
(test_scan.py) can require bit-identical keys and identical picks on random inputs and random
clusters: the same operations in the same order, floating point included.
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
    node_mem_total: Array,
    node_mem_used: Array,
    node_cores_total: Array,
    node_cores_used: Array,
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
    req_pct: Array,
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
        mt = int(node_mem_total[n])
        mu = int(node_mem_used[n])
        ct = int(node_cores_total[n])
        cu = int(node_cores_used[n])
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
            pct = int(req_pct[r])
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
                if want_mem >= 0:
                    wm = want_mem
                elif pct > 0:  # unrounded: rounding only adds, so this stays a necessary test
                    wm = -(-pct * int(mem_total[d]) // 100)
                else:
                    wm = int(mem_default[d])
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
                if forced == topo:  # the same count as above
                    forced_count = best_count
                else:
                    forced_count, _ = _best_group(
                        fit, numa, link, link_size, kind=forced, need=need
                    )
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


# Columns of `search`'s per-device matrix and per-alternative matrix.
DEV_MULTI, DEV_ALLOCATED, DEV_HELD, DEV_NUMA, DEV_LINK, DEV_LINK_SIZE, DEV_MEM, DEV_CORES = range(8)
DEV_FIELDS = 8
ALT_ALL, ALT_COUNT, ALT_ADMIN = range(3)
ALT_FIELDS = 3


class _Budget(Exception):
    pass


def search(  # noqa: PLR0915, PLR0917 - mirrors the Cython signature and loops one to one
    dev: Array,
    cap: Array,
    used: Array,
    reqs: Array,
    alts: Array,
    mask: Array,
    servable: Array,
    amount: Array,
    applies: Array,
    distinct: Array,
    cval: Array,
    topo: int,
    strict: int,
    binpack: int,
    budget: int,
    chosen_alt: Array,
    picks: Array,
    npicks: Array,
) -> int:
    """Find devices on one node for every flat request; 1 when found (outputs filled), else 0.

    Inputs, m = the node's devices, K = capacity dimensions, S = constraint slots:
    dev[m, DEV_FIELDS]; cap[m, K] (-1: the device has no such capacity); used[m, K] by other
    allocations; reqs[n_req, 2] = the request's alternatives [start, end); alts[n_alt, ALT_FIELDS];
    mask[n_alt, m] selectable; servable[n_alt, m] the alternative's capacity requests fit the
    device as published; amount[n_alt, m, K] what it consumes of a multi-allocatable device;
    applies[n_req, S]; distinct[S] (else match); cval[S, m] interned attribute value (-1 absent).
    Outputs: chosen_alt[n_req], picks[n_req, m] (node-local rows, in choice order), npicks[n_req].
    """
    m = int(dev.shape[0])
    k_dims = int(cap.shape[1])
    n_req = int(reqs.shape[0])
    n_slots = int(distinct.shape[0])
    dev_l = dev.tolist()
    cap_l = cap.tolist()
    used_l = used.tolist()
    reqs_l = reqs.tolist()
    alts_l = alts.tolist()
    mask_l = mask.tolist()
    servable_l = servable.tolist()
    amount_l = amount.tolist()
    applies_l = applies.tolist()
    distinct_l = distinct.tolist()
    cval_l = cval.tolist()
    extra = [[0] * k_dims for _ in range(m)]
    taken = [0] * m
    match = [-1] * n_slots  # matched value id per slot, -1 unset
    match_owner = [-1] * n_slots  # pick depth that set it
    seen = [[0] * m for _ in range(n_slots)]  # distinct: value id -> devices holding it
    state = {"steps": 0, "depth": 0}

    def fits(a: int, j: int) -> bool:
        if not servable_l[a][j]:
            return False
        if alts_l[a][ALT_ADMIN]:
            return True
        d = dev_l[j]
        if not d[DEV_MULTI]:
            return not (d[DEV_ALLOCATED] > 0 or taken[j] > 0)
        if d[DEV_HELD]:
            return False
        for k in range(k_dims):
            limit = cap_l[j][k]
            if limit >= 0 and used_l[j][k] + extra[j][k] + amount_l[a][j][k] > limit:
                return False
        return True

    def order(j: int) -> tuple[float, int]:
        d = dev_l[j]
        frac = 0.0
        md = d[DEV_MEM]
        cd = d[DEV_CORES]
        total_mem = cap_l[j][md] if md >= 0 else 0
        total_cores = cap_l[j][cd] if cd >= 0 else 0
        if total_mem > 0:
            frac += 0.5 * (float(used_l[j][md] + extra[j][md]) / float(total_mem))
        if total_cores > 0:
            frac += 0.5 * (float(used_l[j][cd] + extra[j][cd]) / float(total_cores))
        return (-frac if binpack else frac, j)

    def phases(cands: list[int], need: int) -> list[list[int]]:
        if not topo:
            return [cands]
        groups: dict[int, list[int]] = {}
        for j in cands:
            group = dev_l[j][DEV_NUMA] if topo == 1 else dev_l[j][DEV_LINK]
            if group >= 0:
                groups.setdefault(group, []).append(j)
        fitting = [(g, members) for g, members in groups.items() if len(members) >= need]
        if topo == 2:  # the smallest NVLink domain that fits, so big islands stay whole
            fitting.sort(key=lambda gm: (dev_l[gm[1][0]][DEV_LINK_SIZE], gm[0]))
        else:
            fitting.sort(key=lambda gm: (-len(gm[1]), gm[0]))
        out = [members for _, members in fitting]
        if not strict:
            out.append(cands)
        return out

    def enter(i: int, a: int, j: int) -> bool:
        for s in range(n_slots):
            if not applies_l[i][s]:
                continue
            value = cval_l[s][j]
            if value < 0:
                return False  # a device without the attribute never satisfies a constraint
            if distinct_l[s]:
                if seen[s][value]:
                    return False
            elif match[s] >= 0 and match[s] != value:
                return False
        depth = state["depth"]
        for s in range(n_slots):
            if not applies_l[i][s]:
                continue
            value = cval_l[s][j]
            if distinct_l[s]:
                seen[s][value] += 1
            elif match[s] < 0:
                match[s] = value
                match_owner[s] = depth
        for k in range(k_dims):
            extra[j][k] += amount_l[a][j][k]
        taken[j] += 1
        state["depth"] = depth + 1
        return True

    def leave(i: int, a: int, j: int) -> None:
        depth = state["depth"] - 1
        state["depth"] = depth
        for s in range(n_slots):
            if not applies_l[i][s]:
                continue
            if distinct_l[s]:
                seen[s][cval_l[s][j]] -= 1
            elif match_owner[s] == depth:
                match[s] = -1
                match_owner[s] = -1
        for k in range(k_dims):
            extra[j][k] -= amount_l[a][j][k]
        taken[j] -= 1

    def step(i: int, a: int, cands: list[int], need: int, pos: int) -> bool:
        count = int(npicks[i])
        if count == need:
            return solve(i + 1)
        for p in range(pos, len(cands) - (need - count) + 1):
            state["steps"] += 1
            if state["steps"] > budget:
                raise _Budget
            j = cands[p]
            if not enter(i, a, j):
                continue
            picks[i, count] = j
            npicks[i] = count + 1
            if step(i, a, cands, need, p + 1):
                return True
            npicks[i] = count
            leave(i, a, j)
        return False

    def solve(i: int) -> bool:
        if i == n_req:
            return True
        for a in range(reqs_l[i][0], reqs_l[i][1]):
            rows = [j for j in range(m) if mask_l[a][j]]
            all_devices = alts_l[a][ALT_ALL]
            if all_devices and not rows:
                continue
            cands = [j for j in rows if fits(a, j)]
            need = len(rows) if all_devices else alts_l[a][ALT_COUNT]
            if len(cands) < need:
                continue
            cands.sort(key=order)
            for phase in phases(cands, need):
                chosen_alt[i] = a
                npicks[i] = 0
                if step(i, a, phase, need, 0):
                    return True
        return False

    try:
        return 1 if solve(0) else 0
    except _Budget:
        return 0
