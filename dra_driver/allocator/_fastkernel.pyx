# cython: boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
"""Cython twin of `dra_driver.allocator.kernel.scan` (read that module for the semantics).

Typed memoryviews over the model's flat arrays, no Python objects in the loops: one pass over each
node's devices per request. Same operations in the same order as the reference, so the floating
point keys are identical (the property tests compare them exactly).
"""

from libc.stdint cimport int64_t


cdef inline int64_t _best_group(
    Py_ssize_t* fit,
    Py_ssize_t nfit,
    const int64_t[:] numa,
    const int64_t[:] link,
    const int64_t[:] link_size,
    int64_t kind,
    int64_t need,
    int64_t* table,
    int64_t* best_size,
) noexcept:
    """Most fitting devices in one group of `kind`; the smallest NVLink domain holding `need`."""
    cdef Py_ssize_t d, e
    cdef int64_t group, other, count
    cdef int64_t best_count = 0
    best_size[0] = 1 << 30
    # Devices per group: a small table for the usual small ids, a scan otherwise.
    for d in range(nfit):
        group = numa[fit[d]] if kind == 1 else link[fit[d]]
        if 0 <= group < 64:
            table[group] = 0
    for d in range(nfit):
        group = numa[fit[d]] if kind == 1 else link[fit[d]]
        if 0 <= group < 64:
            table[group] += 1
    for d in range(nfit):
        group = numa[fit[d]] if kind == 1 else link[fit[d]]
        if group < 0:
            continue
        if group < 64:
            count = table[group]
        else:
            count = 0
            for e in range(nfit):
                other = numa[fit[e]] if kind == 1 else link[fit[e]]
                if other == group:
                    count += 1
        if count > best_count:
            best_count = count
        if count >= need and kind == 2 and link_size[fit[d]] < best_size[0]:
            best_size[0] = link_size[fit[d]]
    return best_count


def scan(
    const int64_t[:] node_start,
    const int64_t[:] node_end,
    const signed char[:] node_ok,
    const int64_t[:] mem_total,
    const int64_t[:] cores_total,
    const int64_t[:] mem_default,
    const int64_t[:] cores_default,
    const int64_t[:] mem_used,
    const int64_t[:] cores_used,
    const int64_t[:] busy,
    const int64_t[:] numa,
    const int64_t[:] link,
    const int64_t[:] link_size,
    const signed char[:, :] masks,
    const int64_t[:] req_mem,
    const int64_t[:] req_cores,
    const int64_t[:] req_count,
    const int64_t[:] req_group,
    int topo,
    int strict,
    int binpack,
    double[:] keys,
    int64_t[:] closeness,
):
    cdef Py_ssize_t n_nodes = node_start.shape[0]
    cdef Py_ssize_t n_req = req_mem.shape[0]
    cdef Py_ssize_t n, d, r, start, end, nfit
    cdef int64_t mt, mu, ct, cu, want_mem, want_cores, need, matching, have, wm, wc
    cdef int64_t best_count, best_size, widest, least, forced, forced_count, forced_size
    cdef double frac, key
    cdef bint feasible, grouped
    cdef Py_ssize_t fit[256]
    cdef int64_t table[64]
    for n in range(n_nodes):
        keys[n] = -1.0
        closeness[n] = 0
        if not node_ok[n]:
            continue
        start = node_start[n]
        end = node_end[n]
        mt = 0
        mu = 0
        ct = 0
        cu = 0
        for d in range(start, end):
            mt += mem_total[d]
            mu += mem_used[d]
            ct += cores_total[d]
            cu += cores_used[d]
        frac = 0.0
        if mt > 0:
            frac += 0.5 * (<double>mu / <double>mt)
        if ct > 0:
            frac += 0.5 * (<double>cu / <double>ct)
        feasible = True
        grouped = True
        widest = 0
        least = 1 << 30
        for r in range(n_req):
            want_mem = req_mem[r]
            want_cores = req_cores[r]
            need = req_count[r]
            nfit = 0
            matching = 0
            for d in range(start, end):
                if not masks[r, d]:
                    continue
                matching += 1
                if busy[d]:
                    continue
                wm = mem_default[d] if want_mem < 0 else want_mem
                if mem_total[d] - mem_used[d] < wm:
                    continue
                wc = cores_default[d] if want_cores < 0 else want_cores
                if cores_total[d] - cores_used[d] < wc:
                    continue
                if nfit < 256:
                    fit[nfit] = d
                    nfit += 1
            if need < 0:
                need = matching if matching > 0 else 1
            have = nfit
            if topo:
                best_count = _best_group(fit, nfit, numa, link, link_size, topo, need, table, &best_size)
                if best_count >= need:
                    if topo == 2 and best_size > widest:
                        widest = best_size
                else:
                    grouped = False
                if strict:
                    have = best_count
            forced = req_group[r]
            if forced:
                forced_count = _best_group(
                    fit, nfit, numa, link, link_size, forced, need, table, &forced_size
                )
                if forced_count < have:
                    have = forced_count
            if have < need:
                feasible = False
            if have < least:
                least = have
        closeness[n] = least
        if not feasible:
            continue
        key = 0.0
        if topo and grouped:
            key += 1000.0
            if topo == 2:
                key += 10.0 * (64 - (widest if widest < 64 else 64))
        if binpack:
            key += frac
        else:
            key += 1.0 - frac
        keys[n] = key
