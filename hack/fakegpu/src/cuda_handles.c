/*
 * cuda_handles.c - the registry of live handles (contexts, streams, events, modules, ...).
 *
 * The real driver rejects a destroyed or foreign handle with an error instead of crashing; the
 * simulator does the same by never dereferencing a handle before finding it here. An
 * open-addressing hash set keyed by pointer, guarded by cu_drv.lock (callers hold it).
 */
#include <stdlib.h>

#include "cuda_internal.h"

struct slot {
    const void *p; /* NULL = empty, TOMBSTONE = deleted */
    enum cu_kind kind;
};

static const char tombstone_mark;
#define TOMBSTONE ((const void *)&tombstone_mark)

static struct slot *slots;
static size_t cap;  /* power of two */
static size_t used; /* live + tombstones */

static size_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static struct slot *lookup(const void *p) {
    if (cap == 0) return NULL;
    for (size_t i = hash_ptr(p) & (cap - 1), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
        if (slots[i].p == NULL) return NULL;
        if (slots[i].p == p) return &slots[i];
    }
    return NULL;
}

static int grow(void) {
    size_t ncap = cap ? cap * 2 : 64;
    struct slot *ns = calloc(ncap, sizeof(*ns));
    if (ns == NULL) return -1;
    size_t live = 0;
    for (size_t i = 0; i < cap; i++) {
        if (slots[i].p == NULL || slots[i].p == TOMBSTONE) continue;
        size_t j = hash_ptr(slots[i].p) & (ncap - 1);
        while (ns[j].p != NULL) j = (j + 1) & (ncap - 1);
        ns[j] = slots[i];
        live++;
    }
    free(slots);
    slots = ns;
    cap = ncap;
    used = live;
    return 0;
}

int cu_handle_add(const void *p, enum cu_kind kind) {
    if ((used + 1) * 2 > cap && grow() != 0) return -1;
    size_t i = hash_ptr(p) & (cap - 1);
    while (slots[i].p != NULL && slots[i].p != TOMBSTONE) i = (i + 1) & (cap - 1);
    if (slots[i].p == NULL) used++;
    slots[i].p = p;
    slots[i].kind = kind;
    return 0;
}

void cu_handle_remove(const void *p) {
    struct slot *s = lookup(p);
    if (s != NULL) s->p = TOMBSTONE;
}

int cu_handle_is(const void *p, enum cu_kind kind) {
    if (p == NULL) return 0;
    const struct slot *s = lookup(p);
    return s != NULL && s->kind == kind;
}
