# cython: boundscheck=False, wraparound=False, cdivision=False, initializedcheck=False
"""Cython twin of `dra_driver.allocator.kernel.scan` and `.search` (read that module for the
semantics).

Typed memoryviews over the model's flat arrays, no Python objects in the loops: one pass over each
node's devices per request. Same operations in the same order as the reference, so the floating
point keys are identical and the search makes the same picks (the property tests compare both).
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free


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


cdef class _Search:
    """One node's search: the inputs as memoryviews and the scratch state as C arrays."""

    cdef const int64_t[:, ::1] dev
    cdef const int64_t[:, ::1] cap
    cdef const int64_t[:, ::1] used
    cdef const int64_t[:, ::1] reqs
    cdef const int64_t[:, ::1] alts
    cdef const signed char[:, ::1] mask
    cdef const signed char[:, ::1] servable
    cdef const int64_t[:, :, ::1] amount
    cdef const signed char[:, ::1] applies
    cdef const int64_t[::1] distinct
    cdef const int64_t[:, ::1] cval
    cdef int64_t[::1] chosen_alt
    cdef int64_t[:, ::1] picks
    cdef int64_t[::1] npicks
    cdef Py_ssize_t m, k_dims, n_req, n_slots
    cdef int topo, strict, binpack
    cdef int64_t budget, steps, depth
    cdef bint over_budget
    cdef int64_t* extra  # [m, K]
    cdef int64_t* taken  # [m]
    cdef int64_t* match  # [S]
    cdef int64_t* match_owner  # [S]
    cdef int64_t* seen  # [S, m]
    cdef Py_ssize_t* cands  # [n_req, m]: each level's ordered candidates
    cdef double* keys  # [m]: the device-order key of each row (this level's sort)
    cdef Py_ssize_t* phase  # [n_req, m]: each level's current phase
    cdef int64_t* groups  # [n_req, m]: each level's fitting groups, in phase order
    cdef int64_t* gsize  # [n_req, m]: members of each group

    def __cinit__(self):
        self.extra = NULL
        self.taken = NULL
        self.match = NULL
        self.match_owner = NULL
        self.seen = NULL
        self.cands = NULL
        self.keys = NULL
        self.phase = NULL
        self.groups = NULL
        self.gsize = NULL

    def __dealloc__(self):
        free(self.extra)
        free(self.taken)
        free(self.match)
        free(self.match_owner)
        free(self.seen)
        free(self.cands)
        free(self.keys)
        free(self.phase)
        free(self.groups)
        free(self.gsize)

    cdef bint fits(self, Py_ssize_t a, Py_ssize_t j) noexcept:
        cdef Py_ssize_t k
        cdef int64_t limit
        if not self.servable[a, j]:
            return False
        if self.alts[a, ALT_ADMIN]:
            return True
        if not self.dev[j, DEV_MULTI]:
            return not (self.dev[j, DEV_ALLOCATED] > 0 or self.taken[j] > 0)
        if self.dev[j, DEV_HELD]:
            return False
        for k in range(self.k_dims):
            limit = self.cap[j, k]
            if limit >= 0 and self.used[j, k] + self.extra[j * self.k_dims + k] + self.amount[a, j, k] > limit:
                return False
        return True

    cdef double order(self, Py_ssize_t j) noexcept:
        cdef double frac = 0.0
        cdef int64_t md = self.dev[j, DEV_MEM]
        cdef int64_t cd = self.dev[j, DEV_CORES]
        cdef int64_t total_mem = self.cap[j, md] if md >= 0 else 0
        cdef int64_t total_cores = self.cap[j, cd] if cd >= 0 else 0
        if total_mem > 0:
            frac += 0.5 * (<double>(self.used[j, md] + self.extra[j * self.k_dims + md]) / <double>total_mem)
        if total_cores > 0:
            frac += 0.5 * (<double>(self.used[j, cd] + self.extra[j * self.k_dims + cd]) / <double>total_cores)
        return -frac if self.binpack else frac

    cdef bint enter(self, Py_ssize_t i, Py_ssize_t a, Py_ssize_t j) noexcept:
        cdef Py_ssize_t s, k
        cdef int64_t value
        for s in range(self.n_slots):
            if not self.applies[i, s]:
                continue
            value = self.cval[s, j]
            if value < 0:
                return False
            if self.distinct[s]:
                if self.seen[s * self.m + value]:
                    return False
            elif self.match[s] >= 0 and self.match[s] != value:
                return False
        for s in range(self.n_slots):
            if not self.applies[i, s]:
                continue
            value = self.cval[s, j]
            if self.distinct[s]:
                self.seen[s * self.m + value] += 1
            elif self.match[s] < 0:
                self.match[s] = value
                self.match_owner[s] = self.depth
        for k in range(self.k_dims):
            self.extra[j * self.k_dims + k] += self.amount[a, j, k]
        self.taken[j] += 1
        self.depth += 1
        return True

    cdef void leave(self, Py_ssize_t i, Py_ssize_t a, Py_ssize_t j) noexcept:
        cdef Py_ssize_t s, k
        self.depth -= 1
        for s in range(self.n_slots):
            if not self.applies[i, s]:
                continue
            if self.distinct[s]:
                self.seen[s * self.m + self.cval[s, j]] -= 1
            elif self.match_owner[s] == self.depth:
                self.match[s] = -1
                self.match_owner[s] = -1
        for k in range(self.k_dims):
            self.extra[j * self.k_dims + k] -= self.amount[a, j, k]
        self.taken[j] -= 1

    cdef bint step(
        self, Py_ssize_t i, Py_ssize_t a, Py_ssize_t* cands, Py_ssize_t n, int64_t need, Py_ssize_t pos
    ) noexcept:
        cdef int64_t count = self.npicks[i]
        cdef Py_ssize_t p, j
        if count == need:
            return self.solve(i + 1)
        for p in range(pos, n - (need - count) + 1):
            self.steps += 1
            if self.steps > self.budget:
                self.over_budget = True
                return False
            j = cands[p]
            if not self.enter(i, a, j):
                continue
            self.picks[i, count] = j
            self.npicks[i] = count + 1
            if self.step(i, a, cands, n, need, p + 1):
                return True
            if self.over_budget:
                return False
            self.npicks[i] = count
            self.leave(i, a, j)
        return False

    cdef void sort_cands(self, Py_ssize_t* cands, Py_ssize_t n) noexcept:
        """Insertion sort by (key, row): the same total order as the reference's sort."""
        cdef Py_ssize_t p, q, row
        cdef double key
        for p in range(n):
            self.keys[cands[p]] = self.order(cands[p])
        for p in range(1, n):
            row = cands[p]
            key = self.keys[row]
            q = p - 1
            while q >= 0 and (
                self.keys[cands[q]] > key or (self.keys[cands[q]] == key and cands[q] > row)
            ):
                cands[q + 1] = cands[q]
                q -= 1
            cands[q + 1] = row

    cdef Py_ssize_t fitting_groups(
        self, Py_ssize_t* cands, Py_ssize_t n, int64_t need, int64_t* groups, int64_t* gsize
    ) noexcept:
        """The groups with `need` candidates, in the reference's phase order; their count."""
        cdef Py_ssize_t p, q, g, ng = 0, nfit = 0
        cdef int64_t group, size, first_size, other_first
        # Distinct groups in order of first appearance, with their member counts.
        for p in range(n):
            group = self.dev[cands[p], DEV_NUMA] if self.topo == 1 else self.dev[cands[p], DEV_LINK]
            if group < 0:
                continue
            for g in range(ng):
                if groups[g] == group:
                    gsize[g] += 1
                    break
            else:
                groups[ng] = group
                gsize[ng] = 1
                ng += 1
        for g in range(ng):
            if gsize[g] >= need:
                groups[nfit] = groups[g]
                gsize[nfit] = gsize[g]
                nfit += 1
        # Insertion sort: link by (size of the domain of its first candidate, id); numa by
        # (-members, id).
        for p in range(1, nfit):
            group = groups[p]
            size = gsize[p]
            q = p - 1
            while q >= 0 and self.group_after(groups[q], gsize[q], group, size, cands, n):
                groups[q + 1] = groups[q]
                gsize[q + 1] = gsize[q]
                q -= 1
            groups[q + 1] = group
            gsize[q + 1] = size
        return nfit

    cdef int64_t first_link_size(self, int64_t group, Py_ssize_t* cands, Py_ssize_t n) noexcept:
        cdef Py_ssize_t p
        for p in range(n):
            if self.dev[cands[p], DEV_LINK] == group:
                return self.dev[cands[p], DEV_LINK_SIZE]
        return 0

    cdef bint group_after(
        self, int64_t g1, int64_t s1, int64_t g2, int64_t s2, Py_ssize_t* cands, Py_ssize_t n
    ) noexcept:
        """True when group g1 sorts after g2."""
        cdef int64_t a, b
        if self.topo == 2:
            a = self.first_link_size(g1, cands, n)
            b = self.first_link_size(g2, cands, n)
            return a > b or (a == b and g1 > g2)
        return -s1 > -s2 or (s1 == s2 and g1 > g2)

    cdef bint solve(self, Py_ssize_t i) noexcept:
        cdef Py_ssize_t a, j, n_rows, n, g, nfit, nphase, p
        cdef int64_t need, group
        cdef Py_ssize_t* cands
        cdef Py_ssize_t* phase
        cdef int64_t* groups
        cdef int64_t* gsize
        if i == self.n_req:
            return True
        cands = self.cands + i * self.m
        phase = self.phase + i * self.m
        groups = self.groups + i * self.m
        gsize = self.gsize + i * self.m
        for a in range(self.reqs[i, 0], self.reqs[i, 1]):
            n_rows = 0
            n = 0
            for j in range(self.m):
                if self.mask[a, j]:
                    n_rows += 1
                    if self.fits(a, j):
                        cands[n] = j
                        n += 1
            if self.alts[a, ALT_ALL] and n_rows == 0:
                continue
            need = n_rows if self.alts[a, ALT_ALL] else self.alts[a, ALT_COUNT]
            if n < need:
                continue
            self.sort_cands(cands, n)
            if self.topo:
                nfit = self.fitting_groups(cands, n, need, groups, gsize)
                for g in range(nfit):
                    nphase = 0
                    for p in range(n):
                        group = self.dev[cands[p], DEV_NUMA] if self.topo == 1 else self.dev[cands[p], DEV_LINK]
                        if group == groups[g]:
                            phase[nphase] = cands[p]
                            nphase += 1
                    self.chosen_alt[i] = a
                    self.npicks[i] = 0
                    if self.step(i, a, phase, nphase, need, 0):
                        return True
                    if self.over_budget:
                        return False
                if self.strict:
                    continue
            self.chosen_alt[i] = a
            self.npicks[i] = 0
            if self.step(i, a, cands, n, need, 0):
                return True
            if self.over_budget:
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
    cdef _Search s = _Search()
    cdef Py_ssize_t p
    cdef Py_ssize_t m = dev.shape[0]
    cdef Py_ssize_t n_req = reqs.shape[0]
    s.dev = dev
    s.cap = cap
    s.used = used
    s.reqs = reqs
    s.alts = alts
    s.mask = mask
    s.servable = servable
    s.amount = amount
    s.applies = applies
    s.distinct = distinct
    s.cval = cval
    s.chosen_alt = chosen_alt
    s.picks = picks
    s.npicks = npicks
    s.m = m
    s.k_dims = cap.shape[1]
    s.n_req = n_req
    s.n_slots = distinct.shape[0]
    s.topo = topo
    s.strict = strict
    s.binpack = binpack
    s.budget = budget
    s.steps = 0
    s.depth = 0
    s.over_budget = False
    # calloc(0) may return NULL: ask for at least one element of each.
    s.extra = <int64_t*>calloc(m * s.k_dims + 1, sizeof(int64_t))
    s.taken = <int64_t*>calloc(m + 1, sizeof(int64_t))
    s.match = <int64_t*>calloc(s.n_slots + 1, sizeof(int64_t))
    s.match_owner = <int64_t*>calloc(s.n_slots + 1, sizeof(int64_t))
    s.seen = <int64_t*>calloc(s.n_slots * m + 1, sizeof(int64_t))
    s.cands = <Py_ssize_t*>calloc(n_req * m + 1, sizeof(Py_ssize_t))
    s.keys = <double*>calloc(m + 1, sizeof(double))
    s.phase = <Py_ssize_t*>calloc(n_req * m + 1, sizeof(Py_ssize_t))
    s.groups = <int64_t*>calloc(n_req * m + 1, sizeof(int64_t))
    s.gsize = <int64_t*>calloc(n_req * m + 1, sizeof(int64_t))
    if (
        s.extra == NULL or s.taken == NULL or s.match == NULL or s.match_owner == NULL
        or s.seen == NULL or s.cands == NULL or s.keys == NULL or s.phase == NULL
        or s.groups == NULL or s.gsize == NULL
    ):
        raise MemoryError()
    for p in range(s.n_slots):
        s.match[p] = -1
        s.match_owner[p] = -1
    return 1 if s.solve(0) else 0
