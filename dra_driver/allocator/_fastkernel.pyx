# cython: boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
"""Cython twin of `dra_driver.allocator.kernel.scan` and `.search` (read that module for the
semantics), and the fast path's whole decision (`Engine.decide` over a `Plan`: rank, search, the
results and the `Placement`) and commit (`Accountant`), twins of `Allocator._search_node`,
`allocate._share_id` and `ClusterModel.assume` (docs/scheduling.md, "Fast path and reference").

Typed memoryviews over the model's flat arrays, no Python objects in the loops: one pass over each
node's devices per request. Same operations in the same order as the reference, so the floating
point keys are identical and the search makes the same picks (the property tests compare both).
"""

cimport cython

from collections.abc import Mapping, MutableMapping
from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from libc.stdint cimport INT64_MIN, int64_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memset

cdef object _DEBUG = 10  # logging.DEBUG (Shortcut.place)

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL
    object PyUnicode_New(Py_ssize_t, Py_UCS4)
    void* PyUnicode_DATA(object)

from cpython.dict cimport PyDict_GetItemWithError
from cpython.long cimport PyLong_FromVoidPtr
from cpython.object cimport PyObject, PyObject_Hash, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)

cdef extern from "openssl/sha.h":
    ctypedef struct SHA256_CTX:
        pass
    int SHA256_Init(SHA256_CTX*) nogil
    int SHA256_Update(SHA256_CTX*, const void*, size_t) nogil
    int SHA256_Final(unsigned char*, SHA256_CTX*) nogil

cdef extern from *:
    """
    static PyObject* vgpu_alloc_tuple(PyTypeObject* type, Py_ssize_t n) {
        return type->tp_alloc(type, n);
    }
    """
    object vgpu_alloc_tuple(PyTypeObject* type, Py_ssize_t n)

cdef extern from *:
    """
    /* Dictionary reads and writes with the key's hash already known (the Accountant keeps each
       device key's hash: a tuple does not cache its own). CPython 3.11 and 3.12 export these;
       elsewhere the plain calls serve, only slower. */
    static PyObject* vgpu_dict_get(PyObject* d, PyObject* key, Py_hash_t hash) {
    #if PY_VERSION_HEX < 0x030D0000
        return _PyDict_GetItem_KnownHash(d, key, hash);
    #else
        (void)hash;
        return PyDict_GetItemWithError(d, key);
    #endif
    }
    static int vgpu_dict_set(PyObject* d, PyObject* key, PyObject* value, Py_hash_t hash) {
    #if PY_VERSION_HEX < 0x030D0000
        return _PyDict_SetItem_KnownHash(d, key, value, hash);
    #else
        (void)hash;
        return PyDict_SetItem(d, key, value);
    #endif
    }
    """
    PyObject* vgpu_dict_get(object d, object key, Py_hash_t hash)
    int vgpu_dict_set(object d, object key, object value, Py_hash_t hash) except -1


cdef inline PyObject* _dict_get(dict d, object key, Py_hash_t hash) except? NULL:
    """A borrowed reference to d[key] (hash: key's), NULL when absent."""
    return vgpu_dict_get(d, key, hash)


cdef inline int _dict_set(dict d, object key, object value, Py_hash_t hash) except -1:
    return vgpu_dict_set(d, key, value, hash)



cdef inline int64_t _best_group(
    Py_ssize_t* fit,
    Py_ssize_t nfit,
    const int64_t* numa,
    const int64_t* link,
    const int64_t* link_size,
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


ctypedef struct Scan:
    # The layout's columns (see kernel.scan) and one request shape's inputs, as raw pointers.
    const int64_t* node_start
    const int64_t* node_end
    const int64_t* node_mem_total
    const int64_t* node_mem_used
    const int64_t* node_cores_total
    const int64_t* node_cores_used
    const int64_t* mem_total
    const int64_t* cores_total
    const int64_t* mem_default
    const int64_t* cores_default
    const int64_t* mem_used
    const int64_t* cores_used
    const int64_t* busy
    const int64_t* numa
    const int64_t* link
    const int64_t* link_size
    const signed char* masks  # [n_req, n_dev]
    const int64_t* req_mem
    const int64_t* req_pct
    const int64_t* req_cores
    const int64_t* req_count
    const int64_t* req_group
    Py_ssize_t n_dev, n_req
    int topo, strict, binpack


cdef void _scan_node(Scan* s, Py_ssize_t n, double* key_out, int64_t* close_out) noexcept:
    """One node's key and closeness (the body of kernel.scan's node loop, node fit passed)."""
    cdef Py_ssize_t d, r, start, end, nfit
    cdef int64_t mt, mu, ct, cu, want_mem, pct, want_cores, need, matching, have, wm, wc
    cdef int64_t best_count = 0, best_size, widest, least, forced, forced_count, forced_size
    cdef double frac, key
    cdef bint feasible, grouped
    cdef Py_ssize_t fit[256]
    cdef int64_t table[64]
    cdef const signed char* mask
    start = s.node_start[n]
    end = s.node_end[n]
    mt = s.node_mem_total[n]
    mu = s.node_mem_used[n]
    ct = s.node_cores_total[n]
    cu = s.node_cores_used[n]
    frac = 0.0
    if mt > 0:
        frac += 0.5 * (<double>mu / <double>mt)
    if ct > 0:
        frac += 0.5 * (<double>cu / <double>ct)
    feasible = True
    grouped = True
    widest = 0
    least = 1 << 30
    for r in range(s.n_req):
        want_mem = s.req_mem[r]
        pct = s.req_pct[r]
        want_cores = s.req_cores[r]
        need = s.req_count[r]
        mask = s.masks + r * s.n_dev
        nfit = 0
        matching = 0
        for d in range(start, end):
            if not mask[d]:
                continue
            matching += 1
            if s.busy[d]:
                continue
            if want_mem >= 0:
                wm = want_mem
            elif pct > 0:
                wm = (pct * s.mem_total[d] + 99) // 100
            else:
                wm = s.mem_default[d]
            if s.mem_total[d] - s.mem_used[d] < wm:
                continue
            wc = s.cores_default[d] if want_cores < 0 else want_cores
            if s.cores_total[d] - s.cores_used[d] < wc:
                continue
            if nfit < 256:
                fit[nfit] = d
                nfit += 1
        if need < 0:
            need = matching if matching > 0 else 1
        have = nfit
        if s.topo:
            best_count = _best_group(
                fit, nfit, s.numa, s.link, s.link_size, s.topo, need, table, &best_size
            )
            if best_count >= need:
                if s.topo == 2 and best_size > widest:
                    widest = best_size
            else:
                grouped = False
            if s.strict:
                have = best_count
        forced = s.req_group[r]
        if forced:
            if forced == s.topo:
                forced_count = best_count
            else:
                forced_count = _best_group(
                    fit, nfit, s.numa, s.link, s.link_size, forced, need, table, &forced_size
                )
            if forced_count < have:
                have = forced_count
        if have < need:
            feasible = False
        if have < least:
            least = have
    close_out[0] = least
    key_out[0] = -1.0
    if not feasible:
        return
    key = 0.0
    if s.topo and grouped:
        key += 1000.0
        if s.topo == 2:
            key += 10.0 * (64 - (widest if widest < 64 else 64))
    if s.binpack:
        key += frac
    else:
        key += 1.0 - frac
    key_out[0] = key


cdef inline const int64_t* _i64(const int64_t[::1] view) noexcept:
    return &view[0] if view.shape[0] else NULL


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
    cdef Scan s
    cdef Py_ssize_t n
    cdef Py_ssize_t n_nodes = node_start.shape[0]
    cdef Py_ssize_t n_dev = mem_total.shape[0]
    s.n_req = req_mem.shape[0]
    if not (
        node_end.shape[0] == n_nodes and node_ok.shape[0] == n_nodes
        and node_mem_total.shape[0] == n_nodes and node_mem_used.shape[0] == n_nodes
        and node_cores_total.shape[0] == n_nodes and node_cores_used.shape[0] == n_nodes
        and keys.shape[0] == n_nodes and closeness.shape[0] == n_nodes
        and cores_total.shape[0] == n_dev and mem_default.shape[0] == n_dev
        and cores_default.shape[0] == n_dev and mem_used.shape[0] == n_dev
        and cores_used.shape[0] == n_dev and busy.shape[0] == n_dev and numa.shape[0] == n_dev
        and link.shape[0] == n_dev and link_size.shape[0] == n_dev
        and masks.shape[0] == s.n_req and masks.shape[1] == n_dev
        and req_pct.shape[0] == s.n_req and req_cores.shape[0] == s.n_req
        and req_count.shape[0] == s.n_req and req_group.shape[0] == s.n_req
    ):
        raise ValueError("scan: array shapes do not agree (see kernel.scan)")
    for n in range(n_nodes):
        if not 0 <= node_start[n] <= node_end[n] <= n_dev:
            raise ValueError("scan: node_start/node_end out of range")
    s.node_start = _i64(node_start)
    s.node_end = _i64(node_end)
    s.node_mem_total = _i64(node_mem_total)
    s.node_mem_used = _i64(node_mem_used)
    s.node_cores_total = _i64(node_cores_total)
    s.node_cores_used = _i64(node_cores_used)
    s.mem_total = _i64(mem_total)
    s.cores_total = _i64(cores_total)
    s.mem_default = _i64(mem_default)
    s.cores_default = _i64(cores_default)
    s.mem_used = _i64(mem_used)
    s.cores_used = _i64(cores_used)
    s.busy = _i64(busy)
    s.numa = _i64(numa)
    s.link = _i64(link)
    s.link_size = _i64(link_size)
    s.masks = &masks[0, 0] if masks.shape[0] and masks.shape[1] else NULL
    s.req_mem = _i64(req_mem)
    s.req_pct = _i64(req_pct)
    s.req_cores = _i64(req_cores)
    s.req_count = _i64(req_count)
    s.req_group = _i64(req_group)
    s.n_dev = n_dev
    s.topo = topo
    s.strict = strict
    s.binpack = binpack
    for n in range(n_nodes):
        keys[n] = -1.0
        closeness[n] = 0
        if node_ok[n]:
            _scan_node(&s, n, &keys[n], &closeness[n])


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
            if value >= c.n_ids:  # never with the ids the scratch was sized by (memory safety)
                return False
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
            f"{name.decode()} must be a C-contiguous {ndim}-d array of "
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
        for p in range(n_alt):
            if not c.alts[p * 3 + ALT_ALL] and c.alts[p * 3 + ALT_COUNT] < 0:
                raise ValueError("search: a negative device count")
        for p in range(c.m):
            if not (-1 <= DEV(&c, p, DEV_MEM) < c.k_dims and -1 <= DEV(&c, p, DEV_CORES) < c.k_dims):
                raise ValueError("search: dev names capacity columns out of range")
        c.topo = topo
        c.strict = strict
        c.binpack = binpack
        c.budget = budget
        return _run(&c)
    finally:
        for p in range(taken):
            PyBuffer_Release(&views[p])


cdef Py_ssize_t _n_ids(const int64_t* cval, Py_ssize_t count) noexcept:
    """One more than the largest interned attribute value id (at least 1)."""
    cdef Py_ssize_t p, n_ids = 1
    for p in range(count):
        if cval[p] >= n_ids:
            n_ids = cval[p] + 1
    return n_ids


cdef Py_ssize_t _scratch_words(Ctx* c) noexcept:
    """8-byte words of scratch a walk over `c`'s shape needs (each part at least one word)."""
    return (
        (c.m * c.k_dims + 1) + (c.m + 1) + 2 * (c.n_slots + 1) + (c.n_slots * c.n_ids + 1)
        + 3 * (c.n_req * c.m + 1) + (c.n_req * c.m + 1) + (c.m + 1)
    )


cdef void _point_scratch(Ctx* c, int64_t* block) noexcept:
    c.extra = block
    c.taken = c.extra + (c.m * c.k_dims + 1)
    c.match = c.taken + (c.m + 1)
    c.match_owner = c.match + (c.n_slots + 1)
    c.seen = c.match_owner + (c.n_slots + 1)
    c.groups = c.seen + (c.n_slots * c.n_ids + 1)
    c.gsize = c.groups + (c.n_req * c.m + 1)
    c.cands = <Py_ssize_t*>(c.gsize + (c.n_req * c.m + 1))
    c.phase = c.cands + (c.n_req * c.m + 1)
    c.keys = <double*>(c.phase + (c.n_req * c.m + 1))


cdef int _walk(Ctx* c) noexcept:
    """Reset the scratch the walk reads before writing (per-device extra use and holds,
    constraint state), walk: 1 when every request found devices."""
    cdef Py_ssize_t p
    c.steps = 0
    c.depth = 0
    c.over_budget = False
    memset(c.extra, 0, (c.m * c.k_dims + c.m + 1) * 8)  # extra and taken (contiguous)
    memset(c.seen, 0, c.n_slots * c.n_ids * 8)
    for p in range(c.n_slots):
        c.match[p] = -1
        c.match_owner[p] = -1
    return 1 if _solve(c, 0) else 0


cdef int _run(Ctx* c) except -1:
    """Allocate the walk's scratch, walk, free: 1 when every request found devices."""
    cdef void* block = NULL
    c.n_ids = _n_ids(c.cval, c.n_slots * c.m)
    # One block for all scratch (calloc(0) may return NULL: at least one element each).
    block = calloc(_scratch_words(c), 8)
    if block == NULL:
        raise MemoryError()
    try:
        _point_scratch(c, <int64_t*>block)
        return _walk(c)
    finally:
        free(block)


# ---------------------------------------------------------------- whole decisions
#
# The classes below let one decision cross into C once or twice instead of paying for a dozen
# numpy operations and ~30 array arguments per call: the layout's columns are taken as pointers
# once per layout, a request shape's scan inputs and its cached node keys live in a `NodeKeys`,
# and a node's search encoding (plus output buffers) in an `Encoding`. Same `_scan_node` and
# `_solve` as `scan` / `search`, so the answers are those of the reference twins.


cdef class Encoding:
    """One request shape's search inputs on one node (see kernel.search), checked once and
    copied into memory the encoding owns (with the outputs and the walk's scratch), so a later
    write to the caller's arrays cannot reach the walk; `picked()` reads the outputs of the
    last `Engine.search` on it."""

    cdef readonly object arrays  # the inputs as given
    cdef Py_ssize_t m, k_dims, n_req, n_slots, n_alt
    cdef Py_ssize_t start  # the node's first layout row (encodings built by `Plan`)
    # The walk's inputs, outputs and scratch as pointers into `block`, set once:
    # `Engine.search` copies this and adds the node's layout rows and the policy.
    cdef Ctx proto
    cdef char* block

    def __init__(self, reqs, alts, mask, servable, amount, applies, distinct, cval, int k_dims):
        cdef Py_buffer views[8]
        cdef int taken = 0
        cdef Py_ssize_t p, n_alt, size, offset
        cdef Ctx* c = &self.proto
        self.arrays = (reqs, alts, mask, servable, amount, applies, distinct, cval)
        memset(c, 0, sizeof(Ctx))
        try:
            _take(reqs, views, &taken, 8, 2, False, b"reqs")
            _take(alts, views, &taken, 8, 2, False, b"alts")
            _take(mask, views, &taken, 1, 2, False, b"mask")
            _take(servable, views, &taken, 1, 2, False, b"servable")
            _take(amount, views, &taken, 8, 3, False, b"amount")
            _take(applies, views, &taken, 1, 2, False, b"applies")
            _take(distinct, views, &taken, 8, 1, False, b"distinct")
            _take(cval, views, &taken, 8, 2, False, b"cval")
            self.n_req = views[0].shape[0]
            n_alt = views[1].shape[0]
            self.m = views[2].shape[1]
            self.k_dims = k_dims
            self.n_slots = views[6].shape[0]
            self.n_alt = n_alt
            if not (
                views[0].shape[1] == 2 and views[1].shape[1] == 3
                and views[2].shape[0] == n_alt
                and views[3].shape[0] == n_alt and views[3].shape[1] == self.m
                and views[4].shape[0] == n_alt and views[4].shape[1] == self.m
                and views[4].shape[2] == k_dims
                and views[5].shape[0] == self.n_req and views[5].shape[1] == self.n_slots
                and views[7].shape[0] == self.n_slots and views[7].shape[1] == self.m
            ):
                raise ValueError("Encoding: array shapes do not agree (see kernel.search)")
            c.m = self.m
            c.k_dims = self.k_dims
            c.n_req = self.n_req
            c.n_slots = self.n_slots
            c.n_ids = _n_ids(<const int64_t*>views[7].buf, self.n_slots * self.m)
            # One block: the inputs (8-byte aligned each), the outputs, the scratch.
            size = 0
            for p in range(8):
                size += (views[p].len + 7) // 8 * 8
            size += (2 * self.n_req + self.n_req * self.m) * 8 + _scratch_words(c) * 8
            self.block = <char*>calloc(size, 1)
            if self.block == NULL:
                raise MemoryError()
            offset = 0
            for p in range(8):
                memcpy(self.block + offset, views[p].buf, views[p].len)
                offset += (views[p].len + 7) // 8 * 8
        finally:
            for p in range(taken):
                PyBuffer_Release(&views[p])
        offset = 0
        c.reqs = <const int64_t*>(self.block + offset)
        offset += (2 * self.n_req * 8 + 7) // 8 * 8
        c.alts = <const int64_t*>(self.block + offset)
        offset += (3 * n_alt * 8 + 7) // 8 * 8
        c.mask = <const signed char*>(self.block + offset)
        offset += (n_alt * self.m + 7) // 8 * 8
        c.servable = <const signed char*>(self.block + offset)
        offset += (n_alt * self.m + 7) // 8 * 8
        c.amount = <const int64_t*>(self.block + offset)
        offset += (n_alt * self.m * self.k_dims * 8 + 7) // 8 * 8
        c.applies = <const signed char*>(self.block + offset)
        offset += (self.n_req * self.n_slots + 7) // 8 * 8
        c.distinct = <const int64_t*>(self.block + offset)
        offset += (self.n_slots * 8 + 7) // 8 * 8
        c.cval = <const int64_t*>(self.block + offset)
        offset += (self.n_slots * self.m * 8 + 7) // 8 * 8
        c.chosen_alt = <int64_t*>(self.block + offset)
        offset += self.n_req * 8
        c.npicks = <int64_t*>(self.block + offset)
        offset += self.n_req * 8
        c.picks = <int64_t*>(self.block + offset)
        offset += self.n_req * self.m * 8
        _point_scratch(c, <int64_t*>(self.block + offset))
        # Indices the walk follows must stay inside the arrays.
        for p in range(self.n_req):
            if not 0 <= c.reqs[p * 2] <= c.reqs[p * 2 + 1] <= n_alt:
                raise ValueError("Encoding: reqs names alternatives out of range")
        for p in range(n_alt):
            if not c.alts[p * 3 + ALT_ALL] and c.alts[p * 3 + ALT_COUNT] < 0:
                raise ValueError("Encoding: a negative device count")

    def __dealloc__(self):
        free(self.block)

    def picked(self):
        """The last search's picks: (alternative row, node-local device rows) per request."""
        cdef Py_ssize_t i, p
        cdef Ctx* c = &self.proto
        out = []
        for i in range(self.n_req):
            out.append(
                (
                    c.chosen_alt[i],
                    tuple([c.picks[i * self.m + p] for p in range(c.npicks[i])]),
                )
            )
        return out


cdef class NodeKeys:
    """One request shape and policy's scan inputs (see kernel.scan) and every node's key and
    closeness as of model change number `seq`, refreshed by `Engine.rank` for the nodes that
    changed since; `keys` / `closeness` are the figures a full scan would give."""

    cdef readonly object keys
    cdef readonly object closeness
    cdef object inputs  # kept alive
    cdef const signed char[:, ::1] masks
    cdef const int64_t[::1] req_mem, req_pct, req_cores, req_count, req_group
    cdef double[::1] key_view
    cdef int64_t[::1] close_view
    cdef signed char[::1] ok
    # A tournament tree over the nodes (tree[1] = the first node of the highest key, as
    # np.argmax; leaves from `size`), so a decision that changed a few nodes finds the best
    # in O(changed x log nodes) instead of comparing every node's key.
    cdef Py_ssize_t* tree
    cdef Py_ssize_t size, n_nodes
    # Nodes whose search failed in the current decision (Engine.next): they count as -1 until
    # the next rank puts them back.
    cdef signed char* aside
    cdef Py_ssize_t* aside_list
    cdef Py_ssize_t n_aside
    cdef int topo, strict, binpack
    cdef int64_t seq
    # How far `rank` has read the layout's change log, and per node the rank pass that last
    # refreshed it (a node stamped several times since is refreshed once)
    cdef int64_t log_pos, pass_no
    cdef int64_t* mark
    cdef readonly bint filled

    def __init__(
        self, masks, req_mem, req_pct, req_cores, req_count, req_group,
        int topo, int strict, int binpack, Py_ssize_t n_nodes,
    ):
        import numpy

        self.inputs = (masks, req_mem, req_pct, req_cores, req_count, req_group)
        self.masks = masks
        self.req_mem = req_mem
        self.req_pct = req_pct
        self.req_cores = req_cores
        self.req_count = req_count
        self.req_group = req_group
        cdef Py_ssize_t n_req = self.req_mem.shape[0]
        if not (
            self.masks.shape[0] == n_req and self.req_pct.shape[0] == n_req
            and self.req_cores.shape[0] == n_req and self.req_count.shape[0] == n_req
            and self.req_group.shape[0] == n_req
        ):
            raise ValueError("NodeKeys: array shapes do not agree (see kernel.scan)")
        self.topo = topo
        self.strict = strict
        self.binpack = binpack
        self.keys = numpy.full(n_nodes, -1.0, dtype=numpy.float64)
        self.closeness = numpy.zeros(n_nodes, dtype=numpy.int64)
        self.key_view = self.keys
        self.close_view = self.closeness
        self.ok = numpy.zeros(n_nodes, dtype=numpy.int8)
        self.n_nodes = n_nodes
        self.size = 1
        while self.size < n_nodes:
            self.size *= 2
        self.tree = <Py_ssize_t*>calloc(2 * self.size, sizeof(Py_ssize_t))
        self.aside = <signed char*>calloc(n_nodes + 1, 1)
        self.aside_list = <Py_ssize_t*>calloc(n_nodes + 1, sizeof(Py_ssize_t))
        self.mark = <int64_t*>calloc(n_nodes + 1, sizeof(int64_t))
        if self.tree == NULL or self.aside == NULL or self.aside_list == NULL or self.mark == NULL:
            raise MemoryError()
        self.n_aside = 0
        self.filled = False

    def __dealloc__(self):
        free(self.tree)
        free(self.aside)
        free(self.aside_list)
        free(self.mark)

    def key(self, Py_ssize_t node):
        return self.key_view[node]


cdef class Plan:
    """What `Engine.decide` needs of one request shape and policy besides the layout: the node
    keys; the shape's search inputs as layout-wide columns, from which the engine cuts each
    node's `Encoding` when a decision first reaches the node (no Python per node); what the
    results are made of; and the search policy. Encodings are kept per node (None until
    built)."""

    cdef readonly NodeKeys node_keys
    cdef readonly list encodings
    cdef list node_names
    cdef int topo, strict, binpack
    cdef int64_t budget
    cdef type placement_type, result_type, consumption_type
    cdef object columns  # every array the views below read, kept alive
    cdef const int64_t[:, ::1] reqs, alts, cval_all
    cdef const signed char[:, ::1] applies, mask_all, servable_all
    cdef const int64_t[::1] distinct, multi, owners
    cdef const int64_t[:, :, ::1] amount_all
    cdef Py_ssize_t n_req, n_alt, n_slots, n_dev, k_dims
    cdef tuple alt_names, alt_admin, alt_tolerations
    cdef list consumed  # per alternative: per device, its consumedCapacity tuple
    cdef list keys  # per device: (driver, pool, device)
    cdef list consumptions  # per (alternative, device): its model.Consumption, once made

    def __init__(
        self, NodeKeys node_keys not None, list node_names not None, int topo, int strict,
        int binpack, int64_t budget, type placement_type not None, type result_type not None,
        type consumption_type not None,
    ):
        if not (
            issubclass(placement_type, tuple) and issubclass(result_type, tuple)
            and issubclass(consumption_type, tuple)
        ):
            raise ValueError("Plan: placement, result and consumption types must be tuples")
        if len(node_names) != node_keys.n_nodes:
            raise ValueError("Plan: one node name per node")
        self.node_keys = node_keys
        self.encodings = [None] * node_keys.n_nodes
        self.node_names = list(node_names)  # copies the plan owns: read without bounds checks
        self.topo = topo
        self.strict = strict
        self.binpack = binpack
        self.budget = budget
        self.placement_type = placement_type
        self.result_type = result_type
        self.consumption_type = consumption_type

    def set_inputs(
        self, reqs, alts, applies, distinct, owners, mask_all, servable_all, amount_all,
        cval_all, multi, tuple alt_names not None, tuple alt_admin not None,
        tuple alt_tolerations not None, list consumed not None, list keys not None,
    ):
        """The shape's inputs (see kernel.search) with the device axis over the whole layout:
        reqs[n_req, 2], alts[n_alt, 3], applies[n_req, S], distinct[S], owners[n_req] (claim
        index of each flat request); mask_all / servable_all[n_alt, n_dev],
        amount_all[n_alt, n_dev, K], cval_all[S, n_dev] (attribute value ids, -1 absent; any
        ids, each node's encoding renumbers them), multi[n_dev]; per alternative its result
        name, adminAccess and tolerations, and per device what it consumes; per device its
        key."""
        cdef Py_ssize_t i, a
        self.columns = (
            reqs, alts, applies, distinct, owners, mask_all, servable_all, amount_all, cval_all,
            multi,
        )
        self.reqs = reqs
        self.alts = alts
        self.applies = applies
        self.distinct = distinct
        self.owners = owners
        self.mask_all = mask_all
        self.servable_all = servable_all
        self.amount_all = amount_all
        self.cval_all = cval_all
        self.multi = multi
        self.n_req = self.reqs.shape[0]
        self.n_alt = self.alts.shape[0]
        self.n_slots = self.distinct.shape[0]
        self.n_dev = self.multi.shape[0]
        self.k_dims = self.amount_all.shape[2]
        if not (
            self.reqs.shape[1] == 2 and self.alts.shape[1] == 3
            and self.applies.shape[0] == self.n_req and self.applies.shape[1] == self.n_slots
            and self.owners.shape[0] == self.n_req
            and self.mask_all.shape[0] == self.n_alt and self.mask_all.shape[1] == self.n_dev
            and self.servable_all.shape[0] == self.n_alt
            and self.servable_all.shape[1] == self.n_dev
            and self.amount_all.shape[0] == self.n_alt
            and self.amount_all.shape[1] == self.n_dev
            and self.cval_all.shape[0] == self.n_slots and self.cval_all.shape[1] == self.n_dev
            and len(alt_names) == self.n_alt and len(alt_admin) == self.n_alt
            and len(alt_tolerations) == self.n_alt and len(consumed) == self.n_alt
            and len(keys) == self.n_dev
        ):
            raise ValueError("Plan.set_inputs: shapes do not agree (see kernel.search)")
        for i in range(self.n_req):
            if not 0 <= self.reqs[i, 0] <= self.reqs[i, 1] <= self.n_alt or self.owners[i] < 0:
                raise ValueError("Plan.set_inputs: reqs or owners out of range")
        for a in range(self.n_alt):
            if not self.alts[a, ALT_ALL] and self.alts[a, ALT_COUNT] < 0:
                raise ValueError("Plan.set_inputs: a negative device count")
            if len(consumed[a]) != self.n_dev:
                raise ValueError("Plan.set_inputs: one consumed entry per device")
        for i in range(self.n_dev):
            if not (isinstance(keys[i], tuple) and len(keys[i]) == 3):
                raise ValueError("Plan.set_inputs: device keys are (driver, pool, device)")
        self.alt_names = alt_names
        self.alt_admin = alt_admin
        self.alt_tolerations = alt_tolerations
        # Copies the plan owns (read without bounds checks; nobody else can change their length)
        self.consumed = [list(per_device) for per_device in consumed]
        self.keys = list(keys)
        self.consumptions = [None] * (self.n_alt * self.n_dev)


cdef Encoding _cut_encoding(Plan plan, Py_ssize_t start, Py_ssize_t end):
    """The node's `Encoding` (devices start..end) cut from the plan's columns: the same
    inputs `allocate._encoding` builds, with the node's attribute value ids renumbered from
    0 in order of first appearance (the search only compares them)."""
    cdef Encoding enc = Encoding.__new__(Encoding)
    cdef Ctx* c = &enc.proto
    cdef Py_ssize_t m = end - start, n_req = plan.n_req, n_alt = plan.n_alt
    cdef Py_ssize_t n_slots = plan.n_slots, k = plan.k_dims, a, j, s, q, size, offset, n_ids = 1
    cdef int64_t value
    cdef int64_t* cval
    if not 0 <= start <= end <= plan.n_dev:
        raise ValueError("the node's rows are outside the plan's columns")
    memset(c, 0, sizeof(Ctx))
    enc.m = m
    enc.k_dims = k
    enc.n_req = n_req
    enc.n_slots = n_slots
    enc.n_alt = n_alt
    enc.start = start
    enc.arrays = ()
    c.m = m
    c.k_dims = k
    c.n_req = n_req
    c.n_slots = n_slots
    c.n_ids = m + 1  # at most m distinct values per slot on the node
    size = (
        (2 * n_req * 8 + 7) // 8 * 8 + (3 * n_alt * 8 + 7) // 8 * 8
        + 2 * ((n_alt * m + 7) // 8 * 8) + (n_alt * m * k * 8 + 7) // 8 * 8
        + (n_req * n_slots + 7) // 8 * 8 + (n_slots * 8 + 7) // 8 * 8
        + (n_slots * m * 8 + 7) // 8 * 8
        + (2 * n_req + n_req * m) * 8 + _scratch_words(c) * 8
    )
    enc.block = <char*>calloc(size, 1)
    if enc.block == NULL:
        raise MemoryError()
    offset = 0
    c.reqs = <const int64_t*>(enc.block + offset)
    if n_req:
        memcpy(enc.block + offset, &plan.reqs[0, 0], 2 * n_req * 8)
    offset += (2 * n_req * 8 + 7) // 8 * 8
    c.alts = <const int64_t*>(enc.block + offset)
    if n_alt:
        memcpy(enc.block + offset, &plan.alts[0, 0], 3 * n_alt * 8)
    offset += (3 * n_alt * 8 + 7) // 8 * 8
    c.mask = <const signed char*>(enc.block + offset)
    for a in range(n_alt):
        if m:
            memcpy(enc.block + offset + a * m, &plan.mask_all[a, start], m)
    offset += (n_alt * m + 7) // 8 * 8
    c.servable = <const signed char*>(enc.block + offset)
    for a in range(n_alt):
        if m:
            memcpy(enc.block + offset + a * m, &plan.servable_all[a, start], m)
    offset += (n_alt * m + 7) // 8 * 8
    c.amount = <const int64_t*>(enc.block + offset)
    for a in range(n_alt):
        if m and k:
            memcpy(enc.block + offset + a * m * k * 8, &plan.amount_all[a, start, 0], m * k * 8)
    offset += (n_alt * m * k * 8 + 7) // 8 * 8
    c.applies = <const signed char*>(enc.block + offset)
    if n_req and n_slots:
        memcpy(enc.block + offset, &plan.applies[0, 0], n_req * n_slots)
    offset += (n_req * n_slots + 7) // 8 * 8
    c.distinct = <const int64_t*>(enc.block + offset)
    if n_slots:
        memcpy(enc.block + offset, &plan.distinct[0], n_slots * 8)
    offset += (n_slots * 8 + 7) // 8 * 8
    cval = <int64_t*>(enc.block + offset)
    c.cval = cval
    for s in range(n_slots):  # renumber: the first value seen on the node is 0, ...
        for j in range(m):
            value = plan.cval_all[s, start + j]
            cval[s * m + j] = -1
            if value < 0:
                continue
            for q in range(j):
                if plan.cval_all[s, start + q] == value:
                    cval[s * m + j] = cval[s * m + q]
                    break
            if cval[s * m + j] < 0:
                cval[s * m + j] = n_ids - 1
                n_ids += 1
    offset += (n_slots * m * 8 + 7) // 8 * 8
    c.chosen_alt = <int64_t*>(enc.block + offset)
    offset += n_req * 8
    c.npicks = <int64_t*>(enc.block + offset)
    offset += n_req * 8
    c.picks = <int64_t*>(enc.block + offset)
    offset += n_req * m * 8
    _point_scratch(c, <int64_t*>(enc.block + offset))
    return enc


cdef object _plan_results(Plan plan, Encoding enc, tuple claims):
    """The last successful search's picks on `enc` as `Placement.results`: per claim (in
    order) the claim and its DeviceResults, the same fields `Allocator._search_node` gives
    (shareIDs made here)."""
    cdef Py_ssize_t i, p, a, ci, row, q, n_claims = len(claims), count
    cdef Ctx* c = &enc.proto
    cdef object share, result, uid, key, consumed, consumption, name
    cdef bint shared, hashed
    cdef unsigned char base[16]
    cdef list per_claim
    cdef tuple out
    cdef Py_ssize_t* fill
    cdef Py_ssize_t few[17]  # `fill` for up to 8 claims (a pod's usual count): no allocation
    for i in range(plan.n_req):
        if plan.owners[i] >= n_claims:
            raise ValueError("results: a claim index beyond the claims given")
    if n_claims <= 8:
        fill = few
        memset(few, 0, sizeof(few))
    else:
        fill = <Py_ssize_t*>calloc(2 * n_claims + 1, sizeof(Py_ssize_t))
        if fill == NULL:
            raise MemoryError()
    try:
        for i in range(plan.n_req):
            fill[plan.owners[i]] += c.npicks[i]
        per_claim = [PyTuple_New_(fill[ci]) for ci in range(n_claims)]
        for i in range(plan.n_req):
            ci = plan.owners[i]
            uid = (<object>claims[ci]).uid
            a = c.chosen_alt[i]
            name = <object>PyTuple_GET_ITEM(plan.alt_names, a)
            count = c.npicks[i]
            hashed = False
            if count > (<Py_ssize_t>1 << 32):
                raise ValueError("results: more picks than shareID positions")
            for p in range(count):
                row = enc.start + c.picks[i * enc.m + p]
                key = plan.keys[row]
                consumed = (<list>plan.consumed[a])[row]
                shared = plan.multi[row] != 0 and not plan.alts[a, ALT_ADMIN]
                if shared:
                    if not hashed:  # one hash per request, on its first shared device
                        _share_base_c(base, uid, name)
                        hashed = True
                    share = _share_id_at(base, <uint32_t>p)
                else:
                    share = None
                # The same (device, amounts, exclusive) every time this alternative takes
                # this device: made once, kept in the plan
                consumption = plan.consumptions[a * plan.n_dev + row]
                if consumption is None:
                    consumption = vgpu_alloc_tuple(<PyTypeObject*>plan.consumption_type, 3)
                    _put(consumption, 0, key)
                    _put(consumption, 1, consumed)
                    _put(consumption, 2, not shared)
                    plan.consumptions[a * plan.n_dev + row] = consumption
                result = vgpu_alloc_tuple(<PyTypeObject*>plan.result_type, 9)
                for q in range(3):  # driver, pool, device
                    _put(result, q + 1, <object>PyTuple_GET_ITEM(key, q))
                _put(result, 0, name)
                _put(result, 4, consumed)
                _put(result, 5, share)
                _put(result, 6, <object>PyTuple_GET_ITEM(plan.alt_admin, a))
                _put(result, 7, <object>PyTuple_GET_ITEM(plan.alt_tolerations, a))
                _put(result, 8, consumption)
                _put(per_claim[ci], fill[n_claims + ci], result)
                fill[n_claims + ci] += 1
    finally:
        if fill != few:
            free(fill)
    out = PyTuple_New_(n_claims)
    for ci in range(n_claims):
        _put(out, ci, (claims[ci], per_claim[ci]))
    return out


cdef class Engine:
    """The fast path's scan and search over one layout's arrays (which the model updates in
    place; a new layout needs a new Engine)."""

    cdef object arrays  # every array the pointers below point into, kept alive
    cdef Scan base
    cdef Py_ssize_t n_nodes, k_dims
    cdef const int64_t* node_seq
    cdef const int64_t* node_log  # the layout's change log (see Layout.node_log)
    cdef const int64_t* node_log_count
    cdef Py_ssize_t log_size
    cdef const int64_t* dev
    cdef const int64_t* cap
    cdef const int64_t* used
    cdef readonly Py_ssize_t tried  # searches the last `decide` made

    def __init__(self, layout):
        self.arrays = (
            layout.node_start, layout.node_end, layout.node_seq, layout.node_mem_total,
            layout.node_mem_used, layout.node_cores_total, layout.node_cores_used,
            layout.mem_total, layout.cores_total, layout.mem_default, layout.cores_default,
            layout.mem_used, layout.cores_used, layout.busy, layout.numa, layout.link,
            layout.link_size, layout.cap, layout.used_by_dim, layout.dev, layout.node_log,
            layout.node_log_count,
        )
        cdef const int64_t[::1] node_start = layout.node_start
        cdef const int64_t[::1] node_log = layout.node_log
        cdef const int64_t[::1] node_log_count = layout.node_log_count
        cdef const int64_t[::1] node_end = layout.node_end
        cdef const int64_t[::1] node_seq = layout.node_seq
        cdef const int64_t[::1] mem_total = layout.mem_total
        cdef const int64_t[:, ::1] cap = layout.cap
        cdef const int64_t[:, ::1] used = layout.used_by_dim
        cdef const int64_t[:, ::1] dev = layout.dev
        cdef Py_ssize_t n, n_dev = mem_total.shape[0]
        cdef object column
        self.n_nodes = node_start.shape[0]
        self.k_dims = cap.shape[1]
        if not (
            node_end.shape[0] == self.n_nodes and node_seq.shape[0] == self.n_nodes
            and cap.shape[0] == n_dev and used.shape[0] == n_dev and used.shape[1] == self.k_dims
            and dev.shape[0] == n_dev and dev.shape[1] == 8
        ):
            raise ValueError("Engine: layout arrays do not agree")
        for n in range(self.n_nodes):
            if not 0 <= node_start[n] <= node_end[n] <= n_dev:
                raise ValueError("Engine: node_start/node_end out of range")
        for n in range(n_dev):
            if not (-1 <= dev[n, DEV_MEM] < self.k_dims and -1 <= dev[n, DEV_CORES] < self.k_dims):
                raise ValueError("Engine: dev names capacity columns out of range")
        for column in (
            layout.node_mem_total, layout.node_mem_used, layout.node_cores_total,
            layout.node_cores_used,
        ):
            if _length(column) != self.n_nodes:
                raise ValueError("Engine: layout arrays do not agree")
        for column in (
            layout.cores_total, layout.mem_default, layout.cores_default, layout.mem_used,
            layout.cores_used, layout.busy, layout.numa, layout.link, layout.link_size,
        ):
            if _length(column) != n_dev:
                raise ValueError("Engine: layout arrays do not agree")
        memset(&self.base, 0, sizeof(Scan))
        self.base.node_start = _i64(node_start)
        self.base.node_end = _i64(node_end)
        self.base.node_mem_total = _i64(layout.node_mem_total)
        self.base.node_mem_used = _i64(layout.node_mem_used)
        self.base.node_cores_total = _i64(layout.node_cores_total)
        self.base.node_cores_used = _i64(layout.node_cores_used)
        self.base.mem_total = _i64(mem_total)
        self.base.cores_total = _i64(layout.cores_total)
        self.base.mem_default = _i64(layout.mem_default)
        self.base.cores_default = _i64(layout.cores_default)
        self.base.mem_used = _i64(layout.mem_used)
        self.base.cores_used = _i64(layout.cores_used)
        self.base.busy = _i64(layout.busy)
        self.base.numa = _i64(layout.numa)
        self.base.link = _i64(layout.link)
        self.base.link_size = _i64(layout.link_size)
        self.base.n_dev = n_dev
        self.node_seq = _i64(node_seq)
        if node_log.shape[0] < 1 or node_log_count.shape[0] != 1:
            raise ValueError("Engine: the layout's change log is malformed")
        self.node_log = &node_log[0]
        self.node_log_count = &node_log_count[0]
        self.log_size = node_log.shape[0]
        self.dev = &dev[0, 0] if n_dev else NULL
        self.cap = &cap[0, 0] if n_dev and self.k_dims else NULL
        self.used = &used[0, 0] if n_dev and self.k_dims else NULL

    def rank(self, NodeKeys nk, const signed char[::1] node_ok, int64_t seq):
        """Bring `nk` up to date (scan the nodes changed since its last refresh or whose node
        fit changed) and return the best node (first of the highest key), -1 when none."""
        if node_ok.shape[0] != self.n_nodes or nk.key_view.shape[0] != self.n_nodes:
            raise ValueError("rank: node_ok / NodeKeys do not match the layout")
        if nk.masks.shape[1] != self.base.n_dev:
            raise ValueError("rank: masks do not match the layout")
        return self._rank(nk, &node_ok[0] if self.n_nodes else NULL, seq)

    cdef Py_ssize_t _rank(self, NodeKeys nk, const signed char* okp, int64_t seq) noexcept:
        """`rank` after its checks."""
        cdef Scan s = self.base
        cdef Py_ssize_t n
        s.n_req = nk.req_mem.shape[0]
        s.masks = &nk.masks[0, 0] if s.n_req and s.n_dev else NULL
        s.req_mem = _i64(nk.req_mem)
        s.req_pct = _i64(nk.req_pct)
        s.req_cores = _i64(nk.req_cores)
        s.req_count = _i64(nk.req_count)
        s.req_group = _i64(nk.req_group)
        s.topo = nk.topo
        s.strict = nk.strict
        s.binpack = nk.binpack
        # Put back the nodes the last decision set aside, then rescan what changed (raw
        # pointers: most nodes cost one load and compare, the node fit check is one memcmp
        # when it did not change) and fix their paths in the tree.
        cdef const int64_t* seqs = self.node_seq
        cdef signed char* seen_ok = &nk.ok[0] if self.n_nodes else NULL
        cdef int64_t since = nk.seq
        cdef bint all_nodes = not nk.filled
        cdef int64_t count = self.node_log_count[0], k
        cdef bint same_ok = (
            all_nodes or self.n_nodes == 0 or memcmp(okp, seen_ok, self.n_nodes) == 0
        )
        for n in range(nk.n_aside):
            nk.aside[nk.aside_list[n]] = 0
            if not all_nodes:
                _fix(nk, nk.aside_list[n])
        nk.n_aside = 0
        if all_nodes:
            for n in range(self.n_nodes):
                _refresh(&s, nk, okp, n)
        elif same_ok and 0 <= nk.log_pos <= count and count - nk.log_pos <= self.log_size:
            # The usual case: the nodes stamped since the last rank, from the change log (a
            # node stamped several times is refreshed once; an entry Python wrote out of
            # range is skipped, a stamp the log lost is not possible: it holds them all)
            nk.pass_no += 1
            for k in range(nk.log_pos, count):
                n = self.node_log[k % self.log_size]
                if 0 <= n < self.n_nodes and nk.mark[n] != nk.pass_no and seqs[n] > since:
                    nk.mark[n] = nk.pass_no
                    _refresh(&s, nk, okp, n)
                    _fix(nk, n)
        elif same_ok:  # more stamps than the log holds: compare every node's
            for n in range(self.n_nodes):
                if seqs[n] > since:
                    _refresh(&s, nk, okp, n)
                    _fix(nk, n)
        else:
            for n in range(self.n_nodes):
                if seqs[n] > since or okp[n] != seen_ok[n]:
                    _refresh(&s, nk, okp, n)
                    _fix(nk, n)
        if all_nodes:
            _build(nk)
        nk.log_pos = count
        nk.seq = seq
        nk.filled = True
        return _top(nk)

    def next(self, NodeKeys nk, Py_ssize_t failed):
        """The best node after `failed` (whose search found nothing) is set aside; -1: none."""
        if not 0 <= failed < nk.n_nodes or not nk.filled:
            raise ValueError("next: node out of range, or the keys were never ranked")
        return self._next(nk, failed)

    cdef Py_ssize_t _next(self, NodeKeys nk, Py_ssize_t failed) noexcept:
        if not nk.aside[failed]:
            nk.aside[failed] = 1
            nk.aside_list[nk.n_aside] = failed
            nk.n_aside += 1
            _fix(nk, failed)
        return _top(nk)

    def decide(self, Plan plan not None, node_ok, int64_t seq, tuple claims not None):
        """One whole decision's C part for `plan`'s request shape and policy: `rank`, then the
        search on the best node (its encoding cut from the plan's columns the first time),
        the next one while a search fails, and the results of the first that works, as a
        `plan.placement_type` (allocate.Placement: node name, key, results). None when no
        node works (`tried` searches failed)."""
        cdef Py_buffer view
        PyObject_GetBuffer(node_ok, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        try:
            if view.ndim != 1 or view.itemsize != 1:
                raise ValueError("decide: node_ok must be one int8 per node")
            return self._decide_with(plan, <const signed char*>view.buf, view.shape[0], seq, claims)
        finally:
            PyBuffer_Release(&view)

    cdef object _decide_with(
        self, Plan plan, const signed char* okp, Py_ssize_t n_ok, int64_t seq, tuple claims
    ):
        """`decide` with node_ok as a pointer to `n_ok` int8 (checked against the layout)."""
        cdef Py_ssize_t best
        if plan.node_keys.key_view.shape[0] != self.n_nodes or len(plan.encodings) != self.n_nodes:
            raise ValueError("decide: the plan is not for this layout")
        if plan.node_keys.masks.shape[1] != self.base.n_dev:
            raise ValueError("decide: masks do not match the layout")
        if n_ok != self.n_nodes:
            raise ValueError("decide: node_ok must be one int8 per node")
        self.tried = 0
        best = self._rank(plan.node_keys, okp, seq)
        return self._decide(plan, best, claims)

    cdef object _decide(self, Plan plan, Py_ssize_t best, tuple claims):
        cdef object enc_obj, results, placement
        cdef Encoding enc
        cdef NodeKeys nk = plan.node_keys
        if plan.n_dev != self.base.n_dev or plan.k_dims != self.k_dims:
            raise ValueError("decide: the plan's columns are not this layout's")
        while best >= 0:
            if best >= len(plan.encodings):  # a list Python can reach: its length re-checked
                raise ValueError("decide: the plan's encodings do not cover the layout")
            enc_obj = plan.encodings[best]
            if enc_obj is None:
                enc_obj = _cut_encoding(
                    plan, self.base.node_start[best], self.base.node_end[best]
                )
                plan.encodings[best] = enc_obj
            enc = enc_obj  # checked: a wrong object raises TypeError
            self.tried += 1
            if self._search(best, enc, plan.topo, plan.strict, plan.binpack, plan.budget):
                results = _plan_results(plan, enc, claims)
                placement = vgpu_alloc_tuple(<PyTypeObject*>plan.placement_type, 3)
                _put(placement, 0, plan.node_names[best])
                _put(placement, 1, nk.key_view[best])
                _put(placement, 2, results)
                return placement
            best = self._next(nk, best)
        return None

    def search(
        self, Py_ssize_t node, Encoding enc, int topo, int strict, int binpack, int64_t budget
    ):
        """kernel.search on `node`'s devices with `enc`; outputs in enc.chosen_alt/picks/npicks."""
        return self._search(node, enc, topo, strict, binpack, budget)

    cdef int _search(
        self, Py_ssize_t node, Encoding enc, int topo, int strict, int binpack, int64_t budget
    ) except -1:
        cdef Ctx c
        cdef Py_ssize_t start, end
        if not 0 <= node < self.n_nodes:
            raise ValueError("search: node out of range")
        start = self.base.node_start[node]
        end = self.base.node_end[node]
        if enc.m != end - start or enc.k_dims != self.k_dims:
            raise ValueError("search: the encoding is not for this node's devices")
        c = enc.proto
        c.dev = self.dev + start * 8
        c.cap = self.cap + start * self.k_dims if self.cap != NULL else NULL
        c.used = self.used + start * self.k_dims if self.used != NULL else NULL
        c.topo = topo
        c.strict = strict
        c.binpack = binpack
        c.budget = budget
        return _walk(&c)


cdef inline void _refresh(
    Scan* s, NodeKeys nk, const signed char* node_ok, Py_ssize_t n
) noexcept:
    """Node n's key and closeness under its current node fit and rows."""
    nk.ok[n] = node_ok[n]
    if node_ok[n]:
        _scan_node(s, n, &nk.key_view[n], &nk.close_view[n])
    else:
        nk.key_view[n] = -1.0
        nk.close_view[n] = 0


cdef inline double _effective(NodeKeys nk, Py_ssize_t n) noexcept:
    return -1.0 if nk.aside[n] else nk.key_view[n]


cdef inline Py_ssize_t _winner(NodeKeys nk, Py_ssize_t left, Py_ssize_t right) noexcept:
    """Of two subtrees' winners (every node of the left one comes first): the higher key, the
    left one on ties (so the tree's root is np.argmax's first of the highest)."""
    if right < 0:
        return left
    if left < 0:
        return right
    return left if _effective(nk, left) >= _effective(nk, right) else right


cdef void _fix(NodeKeys nk, Py_ssize_t n) noexcept:
    """Node n's key changed: replay its matches up to the root."""
    cdef Py_ssize_t i = (nk.size + n) >> 1
    while i >= 1:
        nk.tree[i] = _winner(nk, nk.tree[2 * i], nk.tree[2 * i + 1])
        i >>= 1


cdef void _build(NodeKeys nk) noexcept:
    cdef Py_ssize_t i
    for i in range(nk.size):
        nk.tree[nk.size + i] = i if i < nk.n_nodes else -1
    for i in range(nk.size - 1, 0, -1):
        nk.tree[i] = _winner(nk, nk.tree[2 * i], nk.tree[2 * i + 1])


cdef Py_ssize_t _top(NodeKeys nk) noexcept:
    """The first node of the highest key, -1 when that key is negative (or no nodes)."""
    cdef Py_ssize_t best
    if nk.n_nodes == 0:
        return -1
    best = nk.tree[1] if nk.size > 1 else nk.tree[nk.size]
    return best if best >= 0 and _effective(nk, best) >= 0 else -1


cdef Py_ssize_t _length(object column) except -1:
    cdef const int64_t[::1] view = column
    return view.shape[0]


cdef class LayoutWriter:
    """Writes one device's consumption into a layout's arrays in one call (model._account does
    a dozen numpy item writes per device otherwise). Keeps the arrays alive; the model never
    replaces a layout's arrays, only writes into them."""

    cdef object arrays
    cdef const int64_t[::1] dev_node
    cdef int64_t[::1] node_seq, node_mem_used, node_cores_used, mem_used, cores_used, busy
    cdef int64_t[::1] node_log, node_log_count
    cdef int64_t[:, ::1] used_by_dim, dev

    def __init__(self, layout):
        self.arrays = (
            layout.dev_node, layout.node_seq, layout.node_mem_used, layout.node_cores_used,
            layout.mem_used, layout.cores_used, layout.busy, layout.used_by_dim, layout.dev,
            layout.node_log, layout.node_log_count,
        )
        self.node_log = layout.node_log
        self.node_log_count = layout.node_log_count
        if self.node_log.shape[0] < 1 or self.node_log_count.shape[0] != 1:
            raise ValueError("LayoutWriter: the layout's change log is malformed")
        self.dev_node = layout.dev_node
        self.node_seq = layout.node_seq
        self.node_mem_used = layout.node_mem_used
        self.node_cores_used = layout.node_cores_used
        self.mem_used = layout.mem_used
        self.cores_used = layout.cores_used
        self.busy = layout.busy
        self.used_by_dim = layout.used_by_dim
        self.dev = layout.dev
        cdef Py_ssize_t n_dev = self.dev_node.shape[0], n_nodes = self.node_seq.shape[0], row
        if not (
            self.node_mem_used.shape[0] == n_nodes and self.node_cores_used.shape[0] == n_nodes
            and self.mem_used.shape[0] == n_dev and self.cores_used.shape[0] == n_dev
            and self.busy.shape[0] == n_dev and self.used_by_dim.shape[0] == n_dev
            and self.dev.shape[0] == n_dev and self.dev.shape[1] == 8
        ):
            raise ValueError("LayoutWriter: layout arrays do not agree")
        for row in range(n_dev):
            if not 0 <= self.dev_node[row] < n_nodes:
                raise ValueError("LayoutWriter: dev_node out of range")

    cdef void _write(
        self, Py_ssize_t row, int64_t seq, int64_t mem, int64_t cores, int64_t held,
        int64_t allocated,
    ) noexcept:
        """`account` without the capacity columns; `row` already checked by the caller."""
        cdef Py_ssize_t node = self.dev_node[row]
        cdef int64_t count = self.node_log_count[0]
        self.node_seq[node] = seq
        if count < 0:  # a count Python wrote wrong: start the log over (rank then scans all)
            count = 0
        self.node_log[count % self.node_log.shape[0]] = node
        self.node_log_count[0] = count + 1
        self.node_mem_used[node] += mem - self.mem_used[row]
        self.node_cores_used[node] += cores - self.cores_used[row]
        self.mem_used[row] = mem
        self.cores_used[row] = cores
        self.busy[row] = held
        self.dev[row, DEV_ALLOCATED] = allocated
        self.dev[row, DEV_HELD] = held

    def account(
        self, Py_ssize_t row, int64_t seq, int64_t mem, int64_t cores, int64_t held,
        int64_t allocated, list columns, list values,
    ):
        """Device `row` now has `mem` / `cores` used (its node's sums follow), the held /
        allocated flags, and values[i] used in capacity column columns[i]; its node is stamped
        `seq` (model.change_seq)."""
        cdef Py_ssize_t i
        if not 0 <= row < self.dev_node.shape[0] or len(columns) != len(values):
            raise ValueError("account: row out of range or columns/values disagree")
        for i in range(len(columns)):
            if not 0 <= <Py_ssize_t>columns[i] < self.used_by_dim.shape[1]:
                raise ValueError("account: capacity column out of range")
        self._write(row, seq, mem, cores, held, allocated)
        for i in range(len(columns)):
            self.used_by_dim[row, <Py_ssize_t>columns[i]] = <int64_t>values[i]


# ---------------------------------------------------------------- results and commit in C
#
# What the fast path used to do in Python after the search (see docs/scheduling.md, "Fast path
# and reference"): the results with their shareIDs, and `commit`'s accounting. The pure-Python
# twins are `allocate._share_id`, `Allocator._search_node` and `ClusterModel.assume`; the tests
# compare both.

cdef const char* _HEX = b"0123456789abcdef"


cdef void _share_base_c(unsigned char* base, object uid, object request) except *:
    """allocate._share_base in C: the first 16 bytes of SHA-256("uid/request")."""
    cdef SHA256_CTX ctx
    cdef unsigned char digest[32]
    cdef Py_ssize_t n
    cdef const char* text
    SHA256_Init(&ctx)
    text = PyUnicode_AsUTF8AndSize(uid, &n)
    SHA256_Update(&ctx, text, n)
    SHA256_Update(&ctx, b"/", 1)
    text = PyUnicode_AsUTF8AndSize(request, &n)
    SHA256_Update(&ctx, text, n)
    SHA256_Final(digest, &ctx)
    memcpy(base, digest, 16)


cdef object _share_id_at(const unsigned char* base, uint32_t position):
    """allocate._share_id in C: `base` with `position` XORed into bytes 12..15 (big-endian),
    formatted as a version-4 UUID (same text as the Python twin)."""
    cdef unsigned char b[16]
    cdef char hexed[32]
    cdef object text = PyUnicode_New(36, 127)  # ASCII, written in place before anyone sees it
    cdef char* out = <char*>PyUnicode_DATA(text)
    cdef Py_ssize_t k
    memcpy(b, base, 16)
    b[12] ^= <unsigned char>(position >> 24)
    b[13] ^= <unsigned char>(position >> 16)
    b[14] ^= <unsigned char>(position >> 8)
    b[15] ^= <unsigned char>position
    for k in range(16):
        hexed[2 * k] = _HEX[b[k] >> 4]
        hexed[2 * k + 1] = _HEX[b[k] & 15]
    # h[:8]-h[8:12]-4h[13:16]-{89ab}[h[16]&3]h[17:20]-h[20:32]
    memcpy(out, hexed, 8)
    out[8] = b'-'
    memcpy(out + 9, hexed + 8, 4)
    out[13] = b'-'
    out[14] = b'4'
    memcpy(out + 15, hexed + 13, 3)
    out[18] = b'-'
    out[19] = b"89ab"[(b[8] >> 4) & 3]
    memcpy(out + 20, hexed + 17, 3)
    out[23] = b'-'
    memcpy(out + 24, hexed + 20, 12)
    return text


def share_id(str uid, str request, Py_ssize_t position):
    """The Cython twin of allocate._share_id(allocate._share_base(uid, request), position)
    (tests compare them)."""
    cdef unsigned char base[16]
    if not 0 <= position < (<Py_ssize_t>1 << 32):
        raise ValueError(f"shareID position {position} out of range")
    _share_base_c(base, uid, request)
    return _share_id_at(base, <uint32_t>position)


cdef inline void _put(object t, Py_ssize_t i, object value):
    Py_INCREF(value)
    PyTuple_SET_ITEM(t, i, value)


cdef inline tuple PyTuple_New_(Py_ssize_t n):
    return PyTuple_New(n)


cdef extern from *:
    """
    static int vgpu_add_i64(int64_t a, int64_t b, int64_t* out) {
        return __builtin_add_overflow(a, b, out);
    }
    """
    int vgpu_add_i64(int64_t a, int64_t b, int64_t* out) noexcept


# Not tracked by the cyclic GC: it refers only to capacity name strings (see _Slot below).
@cython.no_gc
@cython.final
# Not tracked by the cyclic GC: it holds only strings (`_place` checks) and C integers, so it
# can be in no cycle. Tracked (with a list of its names, as it had), every device first used
# under a layout added two objects the next collection walks (a cluster filling up makes
# several per decision).
@cython.no_gc
cdef class DeviceUsage:
    """One device's consumption in `ClusterModel.used`: capacity name -> amount consumed (a
    mutable mapping, as the dictionary it replaces), plus `allocations` (results on the device)
    and `exclusive` (of those, the ones that hold it whole). Amounts are kept as int64 in C,
    names in the order first consumed (a name stays, at 0, once released), so the fast path's
    commit adds to a device without a dictionary operation; equal to any mapping with the same
    items. The model's pure-Python stand-in (extension not built) is `model._PyDeviceUsage`."""

    cdef public Py_ssize_t allocations
    cdef public Py_ssize_t exclusive
    cdef PyObject** names  # owned references to `n` strings; `inline_names` while it has room
    cdef int64_t* totals  # `inline` while it has room, else malloc'ed
    cdef PyObject* inline_names[4]
    cdef int64_t inline[4]
    cdef Py_ssize_t n, room

    def __cinit__(self):
        self.names = self.inline_names
        self.totals = self.inline
        self.room = 4

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.n):
            Py_XDECREF(self.names[i])
        if self.totals != self.inline:
            free(self.totals)
        if self.names != self.inline_names:
            free(self.names)

    cdef Py_ssize_t _find(self, object name) except -2:
        """The name's position, -1 when absent (the model hands out one object per name, so
        the identity check nearly always decides)."""
        cdef Py_ssize_t i
        for i in range(self.n):
            if self.names[i] == <PyObject*>name:
                return i
        for i in range(self.n):
            if <object>self.names[i] == name:
                return i
        return -1

    cdef Py_ssize_t _place(self, object name) except -1:
        """The name's position, appended (at 0) when absent."""
        cdef Py_ssize_t i = self._find(name)
        cdef int64_t* grown
        cdef PyObject** grown_names
        if i >= 0:
            return i
        if not isinstance(name, str):
            raise TypeError("DeviceUsage: capacity names are strings")
        if self.n == self.room:
            grown = <int64_t*>malloc(2 * self.room * sizeof(int64_t))
            grown_names = <PyObject**>malloc(2 * self.room * sizeof(PyObject*))
            if grown == NULL or grown_names == NULL:
                free(grown)
                free(grown_names)
                raise MemoryError()
            memcpy(grown, self.totals, self.n * sizeof(int64_t))
            memcpy(grown_names, self.names, self.n * sizeof(PyObject*))
            if self.totals != self.inline:
                free(self.totals)
            if self.names != self.inline_names:
                free(self.names)
            self.totals = grown
            self.names = grown_names
            self.room = 2 * self.room
        Py_INCREF(name)
        self.names[self.n] = <PyObject*>name
        self.totals[self.n] = 0
        self.n += 1
        return self.n - 1

    cdef int64_t _add(self, Py_ssize_t i, int64_t amount, int sign) except? -1:
        """Add sign x amount at position i; the new total."""
        cdef int64_t total
        if sign < 0:
            if amount == INT64_MIN:
                raise OverflowError("DeviceUsage: amount out of range")
            amount = -amount
        if vgpu_add_i64(self.totals[i], amount, &total):
            raise OverflowError("DeviceUsage: consumption out of range")
        self.totals[i] = total
        return total

    def __getitem__(self, name):
        cdef Py_ssize_t i = self._find(name)
        if i < 0:
            raise KeyError(name)
        return self.totals[i]

    def __setitem__(self, name, int64_t value):
        self.totals[self._place(name)] = value

    def __delitem__(self, name):
        raise TypeError("DeviceUsage: a consumed capacity is never removed, only set to 0")

    def __contains__(self, name):
        return self._find(name) >= 0

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.keys())

    def get(self, name, default=None):
        cdef Py_ssize_t i = self._find(name)
        return default if i < 0 else self.totals[i]

    def keys(self):
        return [<object>self.names[i] for i in range(self.n)]

    def values(self):
        return [self.totals[i] for i in range(self.n)]

    def items(self):
        return [(<object>self.names[i], self.totals[i]) for i in range(self.n)]

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __repr__(self):
        return (
            f"DeviceUsage({dict(self.items())!r}, allocations={self.allocations}, "
            f"exclusive={self.exclusive})"
        )


MutableMapping.register(DeviceUsage)


# Not tracked by the cyclic GC: a slot or a columns record refers only to strings, ints, tuples
# of them and a dictionary of them, so it can be in no cycle; tracked, each new device's slot
# would bring the next collection closer (one in the middle of a decision costs more than the
# decision).
@cython.no_gc
cdef class _Columns:
    """How the Accountant writes one amounts tuple ((capacity name, amount) pairs) under one
    layout: each amount's capacity column (-1: none), and which amounts are the memory / cores
    totals for one driver's names. Every device of one capacity table is handed the same amounts
    tuple by the plan, so one record serves them all (kept per layout, keyed by the tuple's
    identity, which the record keeps alive)."""

    cdef object amounts
    cdef object mem_name  # the driver's memory capacity name it was made for (identity)
    cdef Py_ssize_t n, mem_at, cores_at
    cdef Py_ssize_t* cols

    def __dealloc__(self):
        free(self.cols)


@cython.no_gc
cdef class _Slot:
    """What the Accountant keeps of one device while the model's layout stays the same, so a
    commit finds the device without hashing its key and looks it up in no dictionary: its key
    and the key's hash, its layout row (-1: not laid out), its `DeviceUsage` in `model.used`,
    its memory / cores capacity names, and the columns record of the last amounts it
    accounted."""

    cdef object key
    cdef Py_hash_t hash
    cdef Py_ssize_t row
    cdef DeviceUsage usage
    cdef object mem_name, cores_name
    cdef _Columns columns


cdef inline Py_ssize_t _probe(PyObject** keys, Py_ssize_t size, PyObject* key) noexcept:
    """Where `key` (by address) is in an open-addressing table of `size` (a power of two,
    never more than half full), or the empty place it would go."""
    cdef size_t i = ((<size_t>key >> 4) * <size_t>11400714819323198485ULL) >> 32
    cdef size_t mask = <size_t>size - 1
    i &= mask
    while keys[i] != NULL and keys[i] != key:
        i = (i + 1) & mask
    return <Py_ssize_t>i


cdef class Accountant:
    """`ClusterModel.assume` (with `_set_claim` / `_account`) in C, for the fast path's commit:
    the same consumption records and layout writes in the same order (the tests compare both).
    Holds the model's consumption dictionaries, which the model never replaces, and the
    `DeviceUsage` per device in `model.used`, which the model never replaces either.

    Finding a device's slot without hashing its key: the plan hands out the layout's own key
    objects, so a table keyed by the key object's address (holding a reference to it, so the
    address stays its own) finds the slot of every key seen before under this layout; other
    key objects (equal keys made elsewhere, for instance by `ClusterModel._apply_claim`) fall
    back to `slots`, by value."""

    cdef object model
    cdef dict model_state  # the model's __dict__
    cdef dict claims, used, devices
    cdef dict names  # driver -> (memory capacity name, cores capacity name)
    cdef object last_driver, last_names  # the last entry of `names` read
    cdef object name_of  # driver -> that pair (model.capacity_names)
    cdef object layout, writer  # the model's layout as last seen, and its fields
    cdef dict index, dims
    cdef list laid_out  # the layout's devices
    cdef dict slots  # device key -> _Slot of devices not laid out, for `layout`
    cdef dict column_records  # id(amounts) -> _Columns, for `layout`
    cdef _Columns last_record  # the one `_columns` last gave, for `layout`
    cdef object seq  # model.change_seq during one commit, written back at its end
    cdef PyObject** table_keys  # the address table (owned references), see the docstring
    cdef PyObject** table_slots
    cdef Py_ssize_t table_size
    cdef readonly Py_ssize_t table_count  # entries (read by the tests: one per laid-out device)

    def __init__(self, model, name_of):
        self.model = model
        # The model's plain attributes (_layout, change_seq) read and written in its
        # __dict__: an attribute lookup through the type each time cost more than the dict
        self.model_state = model.__dict__
        self.claims = model._claims
        self.used = model.used
        self.devices = model.devices
        self.names = {}
        self.name_of = name_of
        self.slots = {}
        self.column_records = {}

    def __dealloc__(self):
        self._clear_table()

    cdef void _clear_table(self) noexcept:
        cdef Py_ssize_t i
        if self.table_keys != NULL:
            for i in range(self.table_size):
                if self.table_keys[i] != NULL:
                    Py_XDECREF(self.table_keys[i])
                    Py_XDECREF(self.table_slots[i])
        free(self.table_keys)
        free(self.table_slots)
        self.table_keys = NULL
        self.table_slots = NULL
        self.table_size = self.table_count = 0

    cdef _grow_table(self):
        """Twice the address table's room (64 places at first), its entries moved over."""
        cdef Py_ssize_t size = 2 * self.table_size if self.table_size else 64, i, j
        cdef PyObject** keys = <PyObject**>calloc(size, sizeof(PyObject*))
        cdef PyObject** slots = <PyObject**>calloc(size, sizeof(PyObject*))
        if keys == NULL or slots == NULL:
            free(keys)
            free(slots)
            raise MemoryError()
        for i in range(self.table_size):
            if self.table_keys[i] != NULL:
                j = _probe(keys, size, self.table_keys[i])
                keys[j] = self.table_keys[i]
                slots[j] = self.table_slots[i]
        free(self.table_keys)
        free(self.table_slots)
        self.table_keys = keys
        self.table_slots = slots
        self.table_size = size

    def commit(self, tuple results not None):
        """Record `Placement.results` ((claim, DeviceResults) pairs) as `Allocator.commit`
        does; False (nothing changed) when a result lacks its `consumption`."""
        return self._commit(results)

    cdef bint _commit(self, tuple results) except -1:
        cdef object pair, result, group
        cdef list entries
        cdef Py_ssize_t p, q
        for p in range(PyTuple_GET_SIZE(results)):
            pair = <object>PyTuple_GET_ITEM(results, p)
            if not (isinstance(pair, tuple) and PyTuple_GET_SIZE(pair) == 2):
                raise ValueError("commit: results are (claim, results) pairs")
            group = <object>PyTuple_GET_ITEM(pair, 1)
            if not isinstance(group, tuple):
                raise ValueError("commit: results are (claim, results) pairs")
            for q in range(PyTuple_GET_SIZE(group)):
                result = <object>PyTuple_GET_ITEM(group, q)
                if not (isinstance(result, tuple) and PyTuple_GET_SIZE(result) == 9):
                    raise ValueError("commit: a result is not an allocate.DeviceResult")
                if not <object>PyTuple_GET_ITEM(result, 6) and PyTuple_GET_ITEM(result, 8) == <PyObject*>None:
                    return False
        self._begin()
        try:
            for p in range(PyTuple_GET_SIZE(results)):
                pair = <object>PyTuple_GET_ITEM(results, p)
                group = <object>PyTuple_GET_ITEM(pair, 1)
                entries = []
                # Consumption records only (tuples of strings, ints and tuples): no cycle
                # possible, so kept out of the cyclic GC (one list per claim committed).
                PyObject_GC_UnTrack(entries)
                for q in range(PyTuple_GET_SIZE(group)):
                    result = <object>PyTuple_GET_ITEM(group, q)
                    if not <object>PyTuple_GET_ITEM(result, 6):  # admin access consumes nothing
                        entries.append(<object>PyTuple_GET_ITEM(result, 8))
                self._set_claim((<object>PyTuple_GET_ITEM(pair, 0)).uid, entries)
        finally:
            self._end()
        return True

    def set_claim(self, str uid not None, list consumption not None):
        """ClusterModel._set_claim."""
        self._begin()
        try:
            self._set_claim(uid, consumption)
        finally:
            self._end()

    cdef _begin(self):
        """Before a commit: the model's layout (its fields and the slots when it changed) and
        change_seq, read once for the whole commit (nothing else runs until `_end`)."""
        cdef object layout = self.model_state["_layout"]
        if layout is not self.layout or self.table_keys == NULL:  # (NULL: never committed)
            if layout is not None and layout.writer is None:
                raise ValueError("Accountant: the layout has no LayoutWriter")
            self.slots = {}
            self.column_records = {}
            self.last_record = None
            self.layout = layout
            self.index = layout.index if layout is not None else None
            self.dims = layout.dims if layout is not None else None
            self.laid_out = layout.devices if layout is not None else None
            self.writer = layout.writer if layout is not None else None
            if layout is not None and not isinstance(self.writer, LayoutWriter):
                raise ValueError("Accountant: the layout's writer is not a LayoutWriter")
            self._clear_table()
            self._grow_table()
        self.seq = self.model_state["change_seq"]

    cdef _end(self):
        """After a commit (even a failed one): change_seq as the stamps written made it."""
        if self.seq is not self.model_state["change_seq"]:
            self.model_state["change_seq"] = self.seq

    cdef _set_claim(self, object uid, list consumption):
        cdef object entry
        cdef object old = self.claims.pop(uid, None)
        if old:
            for entry in old:
                self._account(entry, -1)
        if consumption:
            self.claims[uid] = consumption
            for entry in consumption:
                self._account(entry, 1)

    cdef _Slot _find(self, object key):
        """The device's slot: by the key object's address; else, for a laid-out device, by the
        address of the layout's own key object (found through the layout's index); else by
        value in `slots`; else made. Only layout key objects enter the address table, so it
        holds one entry per laid-out device however many equal keys come by."""
        cdef Py_ssize_t i = _probe(self.table_keys, self.table_size, <PyObject*>key)
        cdef Py_ssize_t row = -1
        cdef PyObject* found
        cdef Py_hash_t hash
        cdef object own
        cdef _Slot slot
        cdef LayoutWriter w
        if self.table_keys[i] != NULL:
            return <_Slot>self.table_slots[i]
        if not (isinstance(key, tuple) and PyTuple_GET_SIZE(key) == 3):
            raise ValueError("Accountant: a device key is (driver, pool, device)")
        hash = PyObject_Hash(key)
        if self.layout is not None:
            found = _dict_get(self.index, key, hash)
            if found != NULL:
                row = <object>found
                w = <LayoutWriter>self.writer
                if not 0 <= row < w.dev_node.shape[0] or row >= len(self.laid_out):
                    raise ValueError("Accountant: device row out of range")
                own = (<list>self.laid_out)[row].key  # equal to `key`: the index says so
                i = _probe(self.table_keys, self.table_size, <PyObject*>own)
                if self.table_keys[i] != NULL:
                    return <_Slot>self.table_slots[i]
                slot = self._slot(own, hash, row)
                self._remember(slot)
                return slot
        found = _dict_get(self.slots, key, hash)
        if found != NULL:
            return <_Slot>found
        slot = self._slot(key, hash, -1)
        _dict_set(self.slots, key, slot, hash)
        return slot

    cdef _remember(self, _Slot slot):
        """Put the slot's own key object in the address table."""
        cdef Py_ssize_t i
        if 2 * (self.table_count + 1) > self.table_size:
            self._grow_table()
        i = _probe(self.table_keys, self.table_size, <PyObject*>slot.key)
        if self.table_keys[i] != NULL:
            return
        Py_INCREF(slot.key)
        Py_INCREF(slot)
        self.table_keys[i] = <PyObject*>slot.key
        self.table_slots[i] = <PyObject*>slot
        self.table_count += 1

    cdef _Slot _slot(self, object key, Py_hash_t hash, Py_ssize_t row):
        """A new slot for the device `key` (its hash; its layout row, -1: not laid out)."""
        cdef _Slot slot = _Slot.__new__(_Slot)
        cdef object names, driver = <object>PyTuple_GET_ITEM(key, 0)
        cdef PyObject* found
        cdef DeviceUsage usage
        slot.key = key
        slot.hash = hash
        slot.row = row
        found = _dict_get(self.used, key, hash)
        if found == NULL:
            usage = DeviceUsage.__new__(DeviceUsage)
            _dict_set(self.used, key, usage, hash)
        else:
            usage = <DeviceUsage?>found
        slot.usage = usage
        if driver is self.last_driver:  # the usual case: one driver
            names = self.last_names
        else:
            names = self.names.get(driver)
            if names is None:
                names = self.name_of(driver)
                if not (isinstance(names, tuple) and PyTuple_GET_SIZE(names) == 2):
                    raise ValueError("Accountant: name_of gives (memory name, cores name)")
                self.names[driver] = names
            self.last_driver = driver
            self.last_names = names
        slot.mem_name = <object>PyTuple_GET_ITEM(names, 0)
        slot.cores_name = <object>PyTuple_GET_ITEM(names, 1)
        return slot

    cdef _Columns _columns(self, _Slot slot, object amounts):
        """The columns record of `amounts` (a tuple of (capacity name, amount) pairs) for the
        slot's driver under the current layout, made the first time."""
        cdef Py_ssize_t q, n, col
        cdef object item, name, column, ident
        cdef _Columns record
        cdef PyObject* found
        cdef LayoutWriter w
        record = self.last_record  # the usual case: the record the last new slot took
        if record is not None and record.amounts is amounts and record.mem_name is slot.mem_name:
            return record
        ident = PyLong_FromVoidPtr(<void*>amounts)
        found = PyDict_GetItemWithError(self.column_records, ident)
        if found != NULL:
            record = <_Columns>found
            if record.amounts is amounts and record.mem_name is slot.mem_name:
                self.last_record = record
                return record
        if not isinstance(amounts, tuple):
            raise ValueError("Accountant: a consumption's amounts are a tuple of pairs")
        n = PyTuple_GET_SIZE(amounts)
        record = _Columns.__new__(_Columns)
        record.cols = <Py_ssize_t*>calloc(n + 1, sizeof(Py_ssize_t))
        if record.cols == NULL:
            raise MemoryError()
        record.n = n
        record.mem_at = record.cores_at = -1
        for q in range(n):
            item = <object>PyTuple_GET_ITEM(amounts, q)
            if not (isinstance(item, tuple) and PyTuple_GET_SIZE(item) == 2):
                raise ValueError("Accountant: a consumption's amounts are (name, amount) pairs")
            name = <object>PyTuple_GET_ITEM(item, 0)
            # The last amount of a name is the total the model's memory / cores columns take
            if name == slot.mem_name:
                record.mem_at = q
            elif name == slot.cores_name:
                record.cores_at = q
            record.cols[q] = -1
            if self.dims is not None:
                column = self.dims.get(name)
                if column is not None:
                    col = column
                    w = <LayoutWriter>self.writer
                    if not 0 <= col < w.used_by_dim.shape[1]:
                        raise ValueError("Accountant: capacity column out of range")
                    record.cols[q] = col
        record.amounts = amounts
        record.mem_name = slot.mem_name
        self.column_records[ident] = record
        self.last_record = record
        return record

    cdef _account(self, object entry, int sign):
        """ClusterModel._account (the same records, the same layout writes)."""
        cdef object key, amounts, item
        cdef DeviceUsage usage
        cdef _Slot slot
        cdef _Columns record
        cdef Py_ssize_t row, q, at
        cdef int64_t seq, total, mem = 0, cores = 0, held, allocated
        cdef bint mem_named = False, cores_named = False
        cdef LayoutWriter w
        if not (isinstance(entry, tuple) and PyTuple_GET_SIZE(entry) == 3):
            raise ValueError("Accountant: a consumption is (device, amounts, exclusive)")
        key = <object>PyTuple_GET_ITEM(entry, 0)
        amounts = <object>PyTuple_GET_ITEM(entry, 1)
        slot = self._find(key)
        record = slot.columns
        if record is None or record.amounts is not amounts:
            record = self._columns(slot, amounts)
            slot.columns = record
        usage = slot.usage
        row = slot.row
        for q in range(record.n):
            item = <object>PyTuple_GET_ITEM(amounts, q)
            at = usage._place(<object>PyTuple_GET_ITEM(item, 0))
            total = usage._add(at, <object>PyTuple_GET_ITEM(item, 1), sign)
            if q == record.mem_at:
                mem = total
                mem_named = True
            elif q == record.cores_at:
                cores = total
                cores_named = True
            if row >= 0 and record.cols[q] >= 0:
                w = <LayoutWriter>self.writer
                w.used_by_dim[row, record.cols[q]] = total
        usage.allocations += sign
        if <object>PyTuple_GET_ITEM(entry, 2):
            usage.exclusive += sign
        if row < 0:
            return
        w = <LayoutWriter>self.writer
        self.seq = self.seq + 1
        seq = self.seq
        if not mem_named:
            at = usage._find(slot.mem_name)
            mem = usage.totals[at] if at >= 0 else 0
        if not cores_named:
            at = usage._find(slot.cores_name)
            cores = usage.totals[at] if at >= 0 else 0
        # ClusterModel.is_held: exclusively held, or a device without allowMultipleAllocations
        # (the layout's row says which, as the model's device does) allocated at all
        held = usage.exclusive > 0 or (not w.dev[row, DEV_MULTI] and usage.allocations > 0)
        allocated = usage.allocations > 0
        w._write(row, seq, mem, cores, held, allocated)


cdef class Shortcut:
    """`Allocator.place` and `Allocator.commit` in their usual cases, each one call from Python
    (a fast-path allocator makes these bound methods its own `place` and `commit`; the Python
    frames, logging check and buffer request around a few-microsecond decision were a fifth of
    it). `place`: debug logging off, the allocator's plans current for the model's layout, one
    claim whose request shape and policy have a kept `Plan`, a pod that constrains nothing
    (no selector, affinity, tolerations or resources): the engine decides with the allocator's
    node fit of such pods. `commit`: the `Accountant`. Any other case, and a refusal (for its
    reason), goes to the allocator's own methods (`slow_place`, `slow_commit`), which run the
    same checks in Python and handle every case; so the answers are the same either way."""

    cdef dict state  # the allocator's __dict__: its caches, read as it writes them
    cdef dict model_state  # the model's __dict__ (_layout, change_seq)
    cdef dict log_cache  # the logger's level -> enabled cache (Logger.isEnabledFor's own)
    cdef Accountant accountant
    cdef object slow_place, slow_commit
    cdef object ok_obj  # the node fit array `ok_view` views (kept, so the view stays its own)
    cdef const signed char[::1] ok_view
    cdef tuple last_key  # the plans' key `place` last looked up

    def __init__(self, allocator, logger, slow_place, slow_commit):
        self.state = allocator.__dict__
        self.model_state = allocator.model.__dict__
        # Logger keeps isEnabledFor's answers here and clears it (never replaces it) whenever
        # a level changes; a level not yet asked (or a disabled logger) takes `slow_place`.
        self.log_cache = logger._cache
        self.accountant = allocator._accountant
        self.slow_place = slow_place
        self.slow_commit = slow_commit

    def place(self, pod, claims, policy, pod_resources=(0, 0)):
        cdef dict state = self.state
        cdef object layout, ok, spec, plan, engine, placement, claim, shape, policy_key
        cdef tuple key
        if self.log_cache.get(_DEBUG) is not False:
            return self.slow_place(pod, claims, policy, pod_resources)
        layout = self.model_state.get("_layout")
        if (
            layout is None
            or layout is not state.get("_planned")
            or layout.patch_seq != state.get("_patch_seq")
            or len(claims) != 1
        ):
            return self.slow_place(pod, claims, policy, pod_resources)
        ok = state.get("_plain_ok")
        if ok is None or pod_resources[0] or pod_resources[1]:
            return self.slow_place(pod, claims, policy, pod_resources)
        spec = (<dict>pod).get("spec") if type(pod) is dict else pod.get("spec")
        if spec and (spec.get("nodeSelector") or spec.get("affinity") or spec.get("tolerations")):
            return self.slow_place(pod, claims, policy, pod_resources)
        claim = claims[0]
        # The plans' key (policy key, claim shape) of the last call again when its strings are
        # equal to this call's: each claim brings its own shape string, and comparing two
        # equal strings is cheaper than hashing a new one (a tuple does not cache its hash, a
        # string does: the kept key's hash is its strings' hashes, computed once).
        key = self.last_key
        shape = claim.shape
        policy_key = policy.key
        if key is None or not (key[1] == shape and key[0] == policy_key):
            key = (policy_key, shape)
            self.last_key = key
        plan = (<dict?>state["_plans"]).get(key)
        engine = state.get("_engine")
        if plan is None or not isinstance(engine, Engine):
            return self.slow_place(pod, claims, policy, pod_resources)
        if ok is not self.ok_obj:
            self.ok_view = ok  # checked: one-dimensional contiguous int8
            self.ok_obj = ok
        placement = (<Engine>engine)._decide_with(
            plan,
            &self.ok_view[0] if self.ok_view.shape[0] else NULL,
            self.ok_view.shape[0],
            self.model_state["change_seq"],
            (claim,),
        )
        if placement is None:
            return self.slow_place(pod, claims, policy, pod_resources)
        return placement

    def commit(self, placement):
        if self.accountant is not None and self.accountant._commit(placement.results):
            return None
        return self.slow_commit(placement)
