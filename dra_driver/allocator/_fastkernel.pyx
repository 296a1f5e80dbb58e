# cython: boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
"""Cython twin of `dra_driver.allocator.kernel.scan` and `.search` (read that module for the
semantics).

Typed memoryviews over the model's flat arrays, no Python objects in the loops: one pass over each
node's devices per request. Same operations in the same order as the reference, so the floating
point keys are identical and the search makes the same picks (the property tests compare both).
"""

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset


cdef inline int64_t _best_group(
    Py_ssize_t* fit,
    Py_ssize_t nfit,
    const int64_t[::1] numa,
    const int64_t[::1] link,
    const int64_t[::1] link_size,
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
    const int64_t[::1] node_start,
    const int64_t[::1] node_end,
    const signed char[::1] node_ok,
    const int64_t[::1] node_mem_total,
    const int64_t[::1] node_mem_used,
    const int64_t[::1] node_cores_total,
    const int64_t[::1] node_cores_used,
    const int64_t[::1] mem_total,
    const int64_t[::1] cores_total,
    const int64_t[::1] mem_default,
    const int64_t[::1] cores_default,
    const int64_t[::1] mem_used,
    const int64_t[::1] cores_used,
    const int64_t[::1] busy,
    const int64_t[::1] numa,
    const int64_t[::1] link,
    const int64_t[::1] link_size,
    const signed char[:, ::1] masks,
    const int64_t[::1] req_mem,
    const int64_t[::1] req_pct,
    const int64_t[::1] req_cores,
    const int64_t[::1] req_count,
    const int64_t[::1] req_group,
    int topo,
    int strict,
    int binpack,
    double[::1] keys,
    int64_t[::1] closeness,
):
    cdef Py_ssize_t n_nodes = node_start.shape[0]
    cdef Py_ssize_t n_req = req_mem.shape[0]
    cdef Py_ssize_t n, d, r, start, end, nfit
    cdef int64_t mt, mu, ct, cu, want_mem, pct, want_cores, need, matching, have, wm, wc
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
        mt = node_mem_total[n]
        mu = node_mem_used[n]
        ct = node_cores_total[n]
        cu = node_cores_used[n]
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
            pct = req_pct[r]
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
                if want_mem >= 0:
                    wm = want_mem
                elif pct > 0:
                    wm = (pct * mem_total[d] + 99) // 100
                else:
                    wm = mem_default[d]
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
                if forced == topo:
                    forced_count = best_count
                else:
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


# Columns, as in kernel.py.
cdef enum:
    DEV_MULTI = 0
    DEV_ALLOCATED = 1
    DEV_HELD = 2
    DEV_NUMA = 3
    DEV_LINK = 4
    DEV_LINK_SIZE = 5
    DEV_MEM = 6
    DEV_CORES = 7
    ALT_ALL = 0
    ALT_COUNT = 1
    ALT_ADMIN = 2


ctypedef struct Ctx:
    # Inputs (C-contiguous, see kernel.search for their shapes).
    const int64_t* dev
    const int64_t* cap
    const int64_t* used
    const int64_t* reqs
    const int64_t* alts
    const signed char* mask
    const signed char* servable
    const int64_t* amount
    const signed char* applies
    const int64_t* distinct
    const int64_t* cval
    int64_t* chosen_alt
    int64_t* picks
    int64_t* npicks
    Py_ssize_t m, k_dims, n_req, n_slots, n_ids
    int topo, strict, binpack
    int64_t budget, steps, depth
    bint over_budget
    # Scratch.
    int64_t* extra  # [m, K]
    int64_t* taken  # [m]
    int64_t* match  # [S]
    int64_t* match_owner  # [S]
    int64_t* seen  # [S, n_ids]
    Py_ssize_t* cands  # [n_req, m]: each level's ordered candidates
    double* keys  # [m]: the device-order key of each row
    Py_ssize_t* phase  # [n_req, m]: each level's current phase
    int64_t* groups  # [n_req, m]: each level's fitting groups, in phase order
    int64_t* gsize  # [n_req, m]


cdef inline int64_t DEV(Ctx* c, Py_ssize_t j, int field) noexcept:
    return c.dev[j * 8 + field]


cdef bint _fits(Ctx* c, Py_ssize_t a, Py_ssize_t j) noexcept:
    cdef Py_ssize_t k
    cdef int64_t limit
    if not c.servable[a * c.m + j]:
        return False
    if c.alts[a * 3 + ALT_ADMIN]:
        return True
    if not DEV(c, j, DEV_MULTI):
        return not (DEV(c, j, DEV_ALLOCATED) > 0 or c.taken[j] > 0)
    if DEV(c, j, DEV_HELD):
        return False
    for k in range(c.k_dims):
        limit = c.cap[j * c.k_dims + k]
        if limit >= 0 and (
            c.used[j * c.k_dims + k] + c.extra[j * c.k_dims + k]
            + c.amount[(a * c.m + j) * c.k_dims + k] > limit
        ):
            return False
    return True


cdef double _order(Ctx* c, Py_ssize_t j) noexcept:
    cdef double frac = 0.0
    cdef int64_t md = DEV(c, j, DEV_MEM)
    cdef int64_t cd = DEV(c, j, DEV_CORES)
    cdef int64_t total_mem = c.cap[j * c.k_dims + md] if md >= 0 else 0
    cdef int64_t total_cores = c.cap[j * c.k_dims + cd] if cd >= 0 else 0
    if total_mem > 0:
        frac += 0.5 * (
            <double>(c.used[j * c.k_dims + md] + c.extra[j * c.k_dims + md]) / <double>total_mem
        )
    if total_cores > 0:
        frac += 0.5 * (
            <double>(c.used[j * c.k_dims + cd] + c.extra[j * c.k_dims + cd])
            / <double>total_cores
        )
    return -frac if c.binpack else frac


cdef bint _enter(Ctx* c, Py_ssize_t i, Py_ssize_t a, Py_ssize_t j) noexcept:
    cdef Py_ssize_t s, k
    cdef int64_t value
    for s in range(c.n_slots):
        if not c.applies[i * c.n_slots + s]:
            continue
        value = c.cval[s * c.m + j]
        if value < 0:
            return False
        if c.distinct[s]:
            if c.seen[s * c.n_ids + value]:
                return False
        elif c.match[s] >= 0 and c.match[s] != value:
            return False
    for s in range(c.n_slots):
        if not c.applies[i * c.n_slots + s]:
            continue
        value = c.cval[s * c.m + j]
        if c.distinct[s]:
            c.seen[s * c.n_ids + value] += 1
        elif c.match[s] < 0:
            c.match[s] = value
            c.match_owner[s] = c.depth
    for k in range(c.k_dims):
        c.extra[j * c.k_dims + k] += c.amount[(a * c.m + j) * c.k_dims + k]
    c.taken[j] += 1
    c.depth += 1
    return True


cdef void _leave(Ctx* c, Py_ssize_t i, Py_ssize_t a, Py_ssize_t j) noexcept:
    cdef Py_ssize_t s, k
    c.depth -= 1
    for s in range(c.n_slots):
        if not c.applies[i * c.n_slots + s]:
            continue
        if c.distinct[s]:
            c.seen[s * c.n_ids + c.cval[s * c.m + j]] -= 1
        elif c.match_owner[s] == c.depth:
            c.match[s] = -1
            c.match_owner[s] = -1
    for k in range(c.k_dims):
        c.extra[j * c.k_dims + k] -= c.amount[(a * c.m + j) * c.k_dims + k]
    c.taken[j] -= 1


cdef bint _step(
    Ctx* c, Py_ssize_t i, Py_ssize_t a, Py_ssize_t* cands, Py_ssize_t n, int64_t need,
    Py_ssize_t pos,
) noexcept:
    cdef int64_t count = c.npicks[i]
    cdef Py_ssize_t p, j
    if count == need:
        return _solve(c, i + 1)
    for p in range(pos, n - (need - count) + 1):
        c.steps += 1
        if c.steps > c.budget:
            c.over_budget = True
            return False
        j = cands[p]
        if not _enter(c, i, a, j):
            continue
        c.picks[i * c.m + count] = j
        c.npicks[i] = count + 1
        if _step(c, i, a, cands, n, need, p + 1):
            return True
        if c.over_budget:
            return False
        c.npicks[i] = count
        _leave(c, i, a, j)
    return False


cdef void _sort_cands(Ctx* c, Py_ssize_t* cands, Py_ssize_t n) noexcept:
    """Insertion sort by (key, row): the same total order as the reference's sort."""
    cdef Py_ssize_t p, q, row
    cdef double key
    for p in range(n):
        c.keys[cands[p]] = _order(c, cands[p])
    for p in range(1, n):
        row = cands[p]
        key = c.keys[row]
        q = p - 1
        while q >= 0 and (c.keys[cands[q]] > key or (c.keys[cands[q]] == key and cands[q] > row)):
            cands[q + 1] = cands[q]
            q -= 1
        cands[q + 1] = row


cdef inline int64_t _group_of(Ctx* c, Py_ssize_t j) noexcept:
    return DEV(c, j, DEV_NUMA) if c.topo == 1 else DEV(c, j, DEV_LINK)


cdef int64_t _first_link_size(Ctx* c, int64_t group, Py_ssize_t* cands, Py_ssize_t n) noexcept:
    cdef Py_ssize_t p
    for p in range(n):
        if DEV(c, cands[p], DEV_LINK) == group:
            return DEV(c, cands[p], DEV_LINK_SIZE)
    return 0


cdef bint _group_after(
    Ctx* c, int64_t g1, int64_t s1, int64_t g2, int64_t s2, Py_ssize_t* cands, Py_ssize_t n
) noexcept:
    """True when group g1 sorts after g2 (link: by the size of the domain of its first
    candidate, then id; numa: by most members, then id)."""
    cdef int64_t a, b
    if c.topo == 2:
        a = _first_link_size(c, g1, cands, n)
        b = _first_link_size(c, g2, cands, n)
        return a > b or (a == b and g1 > g2)
    return -s1 > -s2 or (s1 == s2 and g1 > g2)


cdef Py_ssize_t _fitting_groups(
    Ctx* c, Py_ssize_t* cands, Py_ssize_t n, int64_t need, int64_t* groups, int64_t* gsize
) noexcept:
    """The groups with `need` candidates, in the reference's phase order; their count."""
    cdef Py_ssize_t p, q, g, ng = 0, nfit = 0
    cdef int64_t group, size
    cdef bint found
    for p in range(n):  # distinct groups in order of first appearance, with member counts
        group = _group_of(c, cands[p])
        if group < 0:
            continue
        found = False
        for g in range(ng):
            if groups[g] == group:
                gsize[g] += 1
                found = True
                break
        if not found:
            groups[ng] = group
            gsize[ng] = 1
            ng += 1
    for g in range(ng):
        if gsize[g] >= need:
            groups[nfit] = groups[g]
            gsize[nfit] = gsize[g]
            nfit += 1
    for p in range(1, nfit):
        group = groups[p]
        size = gsize[p]
        q = p - 1
        while q >= 0 and _group_after(c, groups[q], gsize[q], group, size, cands, n):
            groups[q + 1] = groups[q]
            gsize[q + 1] = gsize[q]
            q -= 1
        groups[q + 1] = group
        gsize[q + 1] = size
    return nfit


cdef bint _solve(Ctx* c, Py_ssize_t i) noexcept:
    cdef Py_ssize_t a, j, n_rows, n, g, nfit, nphase, p
    cdef int64_t need
    cdef Py_ssize_t* cands
    cdef Py_ssize_t* phase
    cdef int64_t* groups
    cdef int64_t* gsize
    if i == c.n_req:
        return True
    cands = c.cands + i * c.m
    phase = c.phase + i * c.m
    groups = c.groups + i * c.m
    gsize = c.gsize + i * c.m
    for a in range(c.reqs[i * 2], c.reqs[i * 2 + 1]):
        n_rows = 0
        n = 0
        for j in range(c.m):
            if c.mask[a * c.m + j]:
                n_rows += 1
                if _fits(c, a, j):
                    cands[n] = j
                    n += 1
        if c.alts[a * 3 + ALT_ALL] and n_rows == 0:
            continue
        need = n_rows if c.alts[a * 3 + ALT_ALL] else c.alts[a * 3 + ALT_COUNT]
        if n < need:
            continue
        _sort_cands(c, cands, n)
        if c.topo:
            nfit = _fitting_groups(c, cands, n, need, groups, gsize)
            for g in range(nfit):
                nphase = 0
                for p in range(n):
                    if _group_of(c, cands[p]) == groups[g]:
                        phase[nphase] = cands[p]
                        nphase += 1
                c.chosen_alt[i] = a
                c.npicks[i] = 0
                if _step(c, i, a, phase, nphase, need, 0):
                    return True
                if c.over_budget:
                    return False
            if c.strict:
                continue
        c.chosen_alt[i] = a
        c.npicks[i] = 0
        if _step(c, i, a, cands, n, need, 0):
            return True
        if c.over_budget:
            return False
    return False


cdef void* _take(
    object obj, Py_buffer* views, int* taken, Py_ssize_t itemsize, int ndim, bint writable,
    const char* name,
) except NULL:
    """The data of one C-contiguous array argument (raw buffer protocol: far cheaper per call
    than typed memoryviews, which matters for a search over 8 devices)."""
    cdef Py_buffer* view = &views[taken[0]]
    cdef int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (PyBUF_WRITABLE if writable else 0)
    PyObject_GetBuffer(obj, view, flags)
    taken[0] += 1
    cdef const char* fmt = view.format
    cdef char code = 0
    if fmt != NULL:
        while fmt[0] != 0:  # the type code is last ("q", "<q", "=l" ...)
            code = fmt[0]
            fmt += 1
    if view.ndim != ndim or view.itemsize != itemsize or not (
        (itemsize == 1 and code == b'b') or (itemsize == 8 and (code == b'q' or code == b'l'))
    ):
        raise ValueError(
            f"search: {name.decode()} must be a C-contiguous {ndim}-d array of "
            f"int{itemsize * 8}"
        )
    return view.buf if view.len else <void*>views  # any non-NULL pointer for empty arrays


def search(
    dev, cap, used, reqs, alts, mask, servable, amount, applies, distinct, cval,
    int topo, int strict, int binpack, int64_t budget, chosen_alt, picks, npicks,
):
    cdef Py_buffer views[14]
    cdef int taken = 0
    cdef Ctx c
    cdef Py_ssize_t p, n_alt
    cdef void* block = NULL
    memset(&c, 0, sizeof(Ctx))
    try:
        c.dev = <const int64_t*>_take(dev, views, &taken, 8, 2, False, b"dev")
        c.cap = <const int64_t*>_take(cap, views, &taken, 8, 2, False, b"cap")
        c.used = <const int64_t*>_take(used, views, &taken, 8, 2, False, b"used")
        c.reqs = <const int64_t*>_take(reqs, views, &taken, 8, 2, False, b"reqs")
        c.alts = <const int64_t*>_take(alts, views, &taken, 8, 2, False, b"alts")
        c.mask = <const signed char*>_take(mask, views, &taken, 1, 2, False, b"mask")
        c.servable = <const signed char*>_take(servable, views, &taken, 1, 2, False, b"servable")
        c.amount = <const int64_t*>_take(amount, views, &taken, 8, 3, False, b"amount")
        c.applies = <const signed char*>_take(applies, views, &taken, 1, 2, False, b"applies")
        c.distinct = <const int64_t*>_take(distinct, views, &taken, 8, 1, False, b"distinct")
        c.cval = <const int64_t*>_take(cval, views, &taken, 8, 2, False, b"cval")
        c.chosen_alt = <int64_t*>_take(chosen_alt, views, &taken, 8, 1, True, b"chosen_alt")
        c.picks = <int64_t*>_take(picks, views, &taken, 8, 2, True, b"picks")
        c.npicks = <int64_t*>_take(npicks, views, &taken, 8, 1, True, b"npicks")
        c.m = views[0].shape[0]
        c.k_dims = views[1].shape[1]
        c.n_req = views[3].shape[0]
        n_alt = views[4].shape[0]
        c.n_slots = views[9].shape[0]
        if not (
            views[0].shape[1] == 8 and views[1].shape[0] == c.m
            and views[2].shape[0] == c.m and views[2].shape[1] == c.k_dims
            and views[3].shape[1] == 2 and views[4].shape[1] == 3
            and views[5].shape[0] == n_alt and views[5].shape[1] == c.m
            and views[6].shape[0] == n_alt and views[6].shape[1] == c.m
            and views[7].shape[0] == n_alt and views[7].shape[1] == c.m
            and views[7].shape[2] == c.k_dims
            and views[8].shape[0] == c.n_req and views[8].shape[1] == c.n_slots
            and views[10].shape[0] == c.n_slots and views[10].shape[1] == c.m
            and views[11].shape[0] == c.n_req
            and views[12].shape[0] == c.n_req and views[12].shape[1] == c.m
            and views[13].shape[0] == c.n_req
        ):
            raise ValueError("search: array shapes do not agree (see kernel.search)")
        # Indices the walk follows must stay inside the arrays.
        for p in range(c.n_req):
            if not 0 <= c.reqs[p * 2] <= c.reqs[p * 2 + 1] <= n_alt:
                raise ValueError("search: reqs names alternatives out of range")
        for p in range(c.m):
            if not (-1 <= DEV(&c, p, DEV_MEM) < c.k_dims and -1 <= DEV(&c, p, DEV_CORES) < c.k_dims):
                raise ValueError("search: dev names capacity columns out of range")
        c.n_ids = 1
        for p in range(c.n_slots * c.m):
            if c.cval[p] >= c.n_ids:
                c.n_ids = c.cval[p] + 1
        c.topo = topo
        c.strict = strict
        c.binpack = binpack
        c.budget = budget
        # One block for all scratch (calloc(0) may return NULL: at least one element each).
        block = calloc(
            (c.m * c.k_dims + 1) + (c.m + 1) + 2 * (c.n_slots + 1) + (c.n_slots * c.n_ids + 1)
            + 3 * (c.n_req * c.m + 1) + (c.n_req * c.m + 1) + (c.m + 1),
            8,
        )
        if block == NULL:
            raise MemoryError()
        c.extra = <int64_t*>block
        c.taken = c.extra + (c.m * c.k_dims + 1)
        c.match = c.taken + (c.m + 1)
        c.match_owner = c.match + (c.n_slots + 1)
        c.seen = c.match_owner + (c.n_slots + 1)
        c.groups = c.seen + (c.n_slots * c.n_ids + 1)
        c.gsize = c.groups + (c.n_req * c.m + 1)
        c.cands = <Py_ssize_t*>(c.gsize + (c.n_req * c.m + 1))
        c.phase = c.cands + (c.n_req * c.m + 1)
        c.keys = <double*>(c.phase + (c.n_req * c.m + 1))
        for p in range(c.n_slots):
            c.match[p] = -1
            c.match_owner[p] = -1
        return 1 if _solve(&c, 0) else 0
    finally:
        free(block)
        for p in range(taken):
            PyBuffer_Release(&views[p])
