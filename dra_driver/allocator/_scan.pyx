# cython: boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
"""The allocator's two loops over devices, in C: `scan` (every node: can it hold the requests,
and its policy key) and `search` (one node: which devices, exactly). `allocate.py` lays out the
inputs as int64 / int8 numpy arrays and reads the outputs; nothing here holds state.

`scan`: for every node that passed node fit (`node_ok`) and every screened request, count the
devices that are selectable (`masks`), not held (`busy`) and have the requested memory and cores
free (a request naming no memory needs the device's default, or with a percentage `req_pct`
ceil(pct x its memory / 100), unrounded: rounding only adds, so the screen stays a necessary
condition); with a topology policy (`topo` 1 = NUMA, 2 = NVLink), or a claim matchAttribute on
`numaNode` / `nvlinkDomain` (`req_group`, always strict), count per group. A node where a request
cannot have enough devices gets key -1; the others get (docs/scheduling.md, "Node key")

    key = 1000 * [every request fits in one group]                      (topology on)
        +   10 * (64 - size of the largest NVLink domain needed)        (topology link)
        +        binpack: used fraction of the node; spread: 1 - used fraction

and `closeness` is the fewest devices any request found (for "closest: node-3 (1 GPU)").

`search`: a depth-first walk over the pod's flat requests, each request's alternatives in
firstAvailable order, its candidate devices ordered by the device policy (used fraction, then
row), topology groups first (link: the smallest NVLink domain with enough candidates; numa: the
group with the most), then all candidates unless strict; matchAttribute / distinctAttribute per
constraint slot (a device without the attribute satisfies neither), capacity shared between the
node's requests, count > 1 on distinct devices, and at most `budget` device choices.

Every input's shape is checked against the others before a loop reads it. The tests' oracle,
tests/unit/dra_driver/allocator/reference.py, is the same walk in Python: the property tests
require bit-identical keys and identical picks.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

# Columns of `search`'s per-device matrix (model.DEV_*) and per-alternative matrix (ALT_*).
cdef enum:
    DEV_MULTI = 0
    DEV_ALLOCATED = 1
    DEV_HELD = 2
    DEV_NUMA = 3
    DEV_LINK = 4
    DEV_LINK_SIZE = 5
    DEV_MEM = 6
    DEV_CORES = 7
    DEV_FIELDS = 8
    ALT_ALL = 0
    ALT_COUNT = 1
    ALT_ADMIN = 2
    ALT_FIELDS = 3
    MAX_FIT = 256  # devices per node and request the scan counts


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
    """Fill `keys[n]` and `closeness[n]` for every node n (see the module docstring)."""
    cdef Py_ssize_t n_nodes = node_start.shape[0]
    cdef Py_ssize_t n_dev = mem_total.shape[0]
    cdef Py_ssize_t n_req = req_mem.shape[0]
    cdef Py_ssize_t n, d, r, start, end, nfit
    cdef int64_t mt, mu, ct, cu, want_mem, pct, want_cores, need, matching, have, wm, wc
    cdef int64_t best_count = 0, best_size, widest, least, forced, forced_count, forced_size
    cdef double frac, key
    cdef bint feasible, grouped
    cdef Py_ssize_t fit[MAX_FIT]
    cdef int64_t table[64]
    if not (
        node_end.shape[0] == n_nodes and node_ok.shape[0] == n_nodes
        and node_mem_total.shape[0] == n_nodes and node_mem_used.shape[0] == n_nodes
        and node_cores_total.shape[0] == n_nodes and node_cores_used.shape[0] == n_nodes
        and keys.shape[0] == n_nodes and closeness.shape[0] == n_nodes
        and cores_total.shape[0] == n_dev and mem_default.shape[0] == n_dev
        and cores_default.shape[0] == n_dev and mem_used.shape[0] == n_dev
        and cores_used.shape[0] == n_dev and busy.shape[0] == n_dev and numa.shape[0] == n_dev
        and link.shape[0] == n_dev and link_size.shape[0] == n_dev
        and masks.shape[0] == n_req and masks.shape[1] == n_dev
        and req_pct.shape[0] == n_req and req_cores.shape[0] == n_req
        and req_count.shape[0] == n_req and req_group.shape[0] == n_req
    ):
        raise ValueError("scan: array shapes do not agree")
    for n in range(n_nodes):
        if not 0 <= node_start[n] <= node_end[n] <= n_dev:
            raise ValueError("scan: node_start/node_end out of range")
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
                if nfit < MAX_FIT:
                    fit[nfit] = d
                    nfit += 1
            if need < 0:  # allocationMode All: every matching device, at least one
                need = matching if matching > 0 else 1
            have = nfit
            if topo:
                best_count = _best_group(
                    fit, nfit, numa, link, link_size, topo, need, table, &best_size
                )
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


ctypedef struct Ctx:
    # Inputs (see `search` for their shapes), as raw pointers into the arrays.
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
    int64_t* extra  # [m, K]: what the walk's picks so far add to each device
    int64_t* taken  # [m]
    int64_t* match  # [S]: matched value id per slot, -1 unset
    int64_t* match_owner  # [S]: the pick depth that set it
    int64_t* seen  # [S, n_ids]: distinct: devices holding each value id
    Py_ssize_t* cands  # [n_req, m]: each level's ordered candidates
    double* keys  # [m]: the device-order key of each row
    Py_ssize_t* phase  # [n_req, m]: each level's current phase
    int64_t* groups  # [n_req, m]: each level's fitting groups, in phase order
    int64_t* gsize  # [n_req, m]


cdef inline int64_t DEV(Ctx* c, Py_ssize_t j, int field) noexcept:
    return c.dev[j * DEV_FIELDS + field]


cdef bint _fits(Ctx* c, Py_ssize_t a, Py_ssize_t j) noexcept:
    cdef Py_ssize_t k
    cdef int64_t limit
    if not c.servable[a * c.m + j]:
        return False
    if c.alts[a * ALT_FIELDS + ALT_ADMIN]:
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
    """Insertion sort by (key, row): the same total order as the oracle's sort."""
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
    """The groups with `need` candidates, in phase order; their count."""
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
        if c.alts[a * ALT_FIELDS + ALT_ALL] and n_rows == 0:
            continue
        need = n_rows if c.alts[a * ALT_FIELDS + ALT_ALL] else c.alts[a * ALT_FIELDS + ALT_COUNT]
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


def search(
    const int64_t[:, ::1] dev,
    const int64_t[:, ::1] cap,
    const int64_t[:, ::1] used,
    const int64_t[:, ::1] reqs,
    const int64_t[:, ::1] alts,
    const signed char[:, ::1] mask,
    const signed char[:, ::1] servable,
    const int64_t[:, :, ::1] amount,
    const signed char[:, ::1] applies,
    const int64_t[::1] distinct,
    const int64_t[:, ::1] cval,
    int topo,
    int strict,
    int binpack,
    int64_t budget,
    int64_t[::1] chosen_alt,
    int64_t[:, ::1] picks,
    int64_t[::1] npicks,
):
    """Devices on one node for every flat request: 1 when found (outputs filled), else 0.

    m = the node's devices, K = capacity columns, S = constraint slots: dev[m, DEV_FIELDS];
    cap[m, K] (-1: the device lacks that capacity); used[m, K] by other allocations;
    reqs[n_req, 2] = each request's alternatives [start, end); alts[n_alt, ALT_FIELDS];
    mask[n_alt, m] selectable; servable[n_alt, m] the alternative's requests fit the device as
    published; amount[n_alt, m, K] what it consumes of a multi-allocatable device;
    applies[n_req, S]; distinct[S] (else match); cval[S, m] interned attribute value (-1
    absent). Outputs: chosen_alt[n_req], picks[n_req, m] (node rows in choice order),
    npicks[n_req].
    """
    cdef Ctx c
    cdef Py_ssize_t p, n_alt = alts.shape[0]
    cdef void* block
    memset(&c, 0, sizeof(Ctx))
    c.m = dev.shape[0]
    c.k_dims = cap.shape[1]
    c.n_req = reqs.shape[0]
    c.n_slots = distinct.shape[0]
    if not (
        dev.shape[1] == DEV_FIELDS and cap.shape[0] == c.m
        and used.shape[0] == c.m and used.shape[1] == c.k_dims
        and reqs.shape[1] == 2 and alts.shape[1] == ALT_FIELDS
        and mask.shape[0] == n_alt and mask.shape[1] == c.m
        and servable.shape[0] == n_alt and servable.shape[1] == c.m
        and amount.shape[0] == n_alt and amount.shape[1] == c.m and amount.shape[2] == c.k_dims
        and applies.shape[0] == c.n_req and applies.shape[1] == c.n_slots
        and cval.shape[0] == c.n_slots and cval.shape[1] == c.m
        and chosen_alt.shape[0] == c.n_req
        and picks.shape[0] == c.n_req and picks.shape[1] == c.m
        and npicks.shape[0] == c.n_req
    ):
        raise ValueError("search: array shapes do not agree")
    # Indices the walk follows must stay inside the arrays.
    for p in range(c.n_req):
        if not 0 <= reqs[p, 0] <= reqs[p, 1] <= n_alt:
            raise ValueError("search: reqs names alternatives out of range")
    for p in range(n_alt):
        if not alts[p, ALT_ALL] and alts[p, ALT_COUNT] < 0:
            raise ValueError("search: a negative device count")
    for p in range(c.m):
        if not (-1 <= dev[p, DEV_MEM] < c.k_dims and -1 <= dev[p, DEV_CORES] < c.k_dims):
            raise ValueError("search: dev names capacity columns out of range")
    # Element 0 of an empty array is only ever an address here: no loop reads it.
    c.dev = &dev[0, 0]
    c.cap = &cap[0, 0]
    c.used = &used[0, 0]
    c.reqs = &reqs[0, 0]
    c.alts = &alts[0, 0]
    c.mask = &mask[0, 0]
    c.servable = &servable[0, 0]
    c.amount = &amount[0, 0, 0]
    c.applies = &applies[0, 0]
    c.distinct = &distinct[0]
    c.cval = &cval[0, 0]
    c.chosen_alt = &chosen_alt[0]
    c.picks = &picks[0, 0]
    c.npicks = &npicks[0]
    c.n_ids = 1  # one past the largest attribute value id (sizes `seen`)
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
    try:
        return 1 if _solve(&c, 0) else 0
    finally:
        free(block)
